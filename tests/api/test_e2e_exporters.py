"""End to end for models as exporters write them, one RTL run each (Brevitas, onnxruntime's
quantizer on onnx.helper models, and calibrated float models have theirs in
test_e2e_brevitas, test_e2e_activations and test_e2e_ops): torch's legacy and dynamo
exporters quantized by onnxruntime, and skl2onnx's MLPClassifier quantized by onnxruntime.
Verilator under random stalls equals the golden model, which equals onnxruntime."""

import numpy as np
import pytest

import onnx2fpga

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from tests.helpers.models import skl2onnx_mlp  # noqa: E402
from tests.helpers.torch_models import SHAPE, torch_qdq  # noqa: E402

COMPUTE = ("Conv", "Gemm", "MatMul")


def _ort(path, x):
    sess = ort.InferenceSession(str(path))
    name = sess.get_inputs()[0].name
    rank = len(sess.get_inputs()[0].shape)
    outs = [sess.run(None, {name: x[i].reshape((1,) + x.shape[-(rank - 1):])})
            for i in range(len(x))]
    return [np.concatenate([o[k] for o in outs]) for k in range(len(outs[0]))]


@pytest.mark.rtl
@pytest.mark.parametrize("pattern, dynamo", [("adaptive", True), ("se", False)])
def test_torch_export_quantized_by_onnxruntime_rtl_equals_golden(tmp_path, pattern, dynamo):
    _, qdq, _ = torch_qdq(tmp_path, pattern, dynamo=dynamo)
    d = onnx2fpga.compile(qdq, tmp_path / "d")
    assert not [n.op for n in d.design.head + d.design.tail if n.op in COMPUTE]
    x = np.random.default_rng(5).standard_normal((8, 1) + SHAPE).astype(np.float32)
    golden = d.simulate(x, engine="golden")
    want = _ort(qdq, x)[0]
    assert np.mean(np.isclose(golden.reshape(want.shape), want, atol=1e-6)) >= 0.99
    rtl = d.simulate(x, engine="rtl", seed=2, stall_in=0.4, stall_out=0.4)
    np.testing.assert_array_equal(rtl, golden)


@pytest.mark.rtl
def test_skl2onnx_classifier_quantized_by_onnxruntime_rtl_equals_golden(tmp_path):
    path, x = skl2onnx_mlp(tmp_path, hidden=8)
    d = onnx2fpga.compile(path, tmp_path / "d")
    assert not [n.op for n in d.design.head + d.design.tail if n.op in COMPUTE]
    x = x[:10]
    golden = d.simulate(x, engine="golden")
    label, _ = _ort(path, x)
    np.testing.assert_array_equal(golden["label"], label)
    rtl = d.simulate(x, engine="rtl", seed=4, stall_in=0.4, stall_out=0.4)
    assert set(rtl) == set(golden)
    for name in golden:
        np.testing.assert_array_equal(rtl[name], golden[name])
