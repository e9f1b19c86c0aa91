"""Shape computations as torch's legacy exporter writes them fold into constants, so the
layers after them have static shapes (``nn.Unflatten`` becomes ``Shape -> Slice / Mod / Add ->
Concat -> Reshape``, which ONNX's data propagation does not follow through ``Mod``)."""

import io
import warnings

import numpy as np
import pytest

import onnx2fpga

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")


def _unflatten_cnn_bytes():
    from torch import nn
    torch.manual_seed(0)
    net = nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(),
                        nn.Flatten(), nn.Linear(4 * 64, 5)).eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.zeros(1, 64),), buf, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"])
    return buf.getvalue()


def test_unflatten_of_torch_legacy_export_compiles_with_every_layer_in_hardware(tmp_path):
    import onnx
    data = _unflatten_cnn_bytes()
    ops = [n.op_type for n in onnx.load_from_string(data).graph.node]
    assert "Mod" in ops and "Shape" in ops        # the exporter's shape arithmetic is there
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    x = np.random.default_rng(0).random((40, 64), dtype=np.float32)
    design = onnx2fpga.compile(str(path), tmp_path / "d", calibration=x[:20])
    hosts = {n.op for n in design.design.head + design.design.tail}
    assert not hosts & {"Conv", "Gemm", "MatMul"}
    got = design.simulate(x, engine="golden")
    sess = ort.InferenceSession(data)
    want = np.concatenate([sess.run(None, {"x": x[i:i + 1]})[0] for i in range(len(x))])
    # Own 8-bit calibration against the float model: close, not equal.
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()
