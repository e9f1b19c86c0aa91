"""A PyTorch model as both torch exporters write it (legacy TorchScript and dynamo), quantized
by onnxruntime's quantize_static (QDQ): every layer in hardware, golden equal to onnxruntime."""

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnx2fpga
from onnx2fpga.sim.model import run_design

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dynamo", [False, True])
def test_torch_export_quantized_by_onnxruntime_runs_in_hardware(tmp_path, dynamo):
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    nn = torch.nn
    torch.manual_seed(0)
    # A MaxPool between two convolutions, then a Linear: onnxruntime quantizes every output.
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 8, 3),
                          nn.ReLU(), nn.Flatten(), nn.Linear(32, 10)).eval()
    fp, q = tmp_path / "float.onnx", str(tmp_path / "qdq.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, torch.randn(1, 1, 10, 10), str(fp), dynamo=dynamo,
                          input_names=["x"], output_names=["y"])
    onnx.save(onnx.load(fp), fp)              # the dynamo exporter's weights inline
    cal = np.random.default_rng(1).standard_normal((32, 1, 1, 10, 10)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"x": c} for c in cal)

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(fp), q, Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    per_channel=True, calibrate_method=CalibrationMethod.MinMax)
    d = onnx2fpga.compile(q, tmp_path / "out", stop_after="lower").design
    assert [ly.kind for ly in d.dataflow.layers] == ["conv", "pool", "conv", "view", "dense"]
    assert [n.op for n in d.tail] == ["DequantizeLinear"]
    x = np.random.default_rng(2).standard_normal((50, 1, 1, 10, 10)).astype(np.float32)
    s = ort.InferenceSession(q)
    want = np.stack([s.run(None, {"x": xi})[0] for xi in x])
    lsb = np.abs(run_design(d, x).reshape(want.shape) - want) / float(d.dataflow.output.scale)
    assert lsb.max() <= 1 + 1e-3 and np.mean(lsb < 1e-3) >= 0.99
