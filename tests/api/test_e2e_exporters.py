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
from tests.helpers.torch_models import (  # noqa: E402
    DS_CNN_SHAPE,
    SHAPE,
    ds_cnn_qdq,
    output_step,
    torch_qdq,
)

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
def test_space_to_depth_views_rtl_equals_golden(tmp_path):
    """Space-to-depth written as Reshape to 6-D, Transpose, Reshape between two convolutions
    (it crashed in the manifest, whose stream-order labels took every tensor for an image):
    the views' tensors are labelled, the RTL under stalls equals golden, which equals
    onnxruntime."""
    _, qdq, _ = torch_qdq(tmp_path, "s2d", dynamo=False)
    d = onnx2fpga.compile(qdq, tmp_path / "d")
    views = [ly for ly in d.manifest["layers"] if ly["kind"] == "view"]
    # The 8x6x6 map as (C, H/2, 2, W/2, 2), transposed, as 32x3x3 (shapes without the batch):
    # none travels in C order or channels-last.
    assert [ly["out_shape"] for ly in views] == [[8, 3, 2, 3, 2], [2, 2, 8, 3, 3], [32, 3, 3]]
    assert [d.manifest["streams"][ly["output"]]["order"] for ly in views] == ["permuted"] * 3
    x = np.random.default_rng(5).standard_normal((6, 1) + SHAPE).astype(np.float32)
    golden = d.simulate(x, engine="golden")
    want = _ort(qdq, x)[0]
    np.testing.assert_allclose(golden.reshape(want.shape), want, atol=1e-6)
    rtl = d.simulate(x, engine="rtl", seed=3, stall_in=0.4, stall_out=0.4)
    np.testing.assert_array_equal(rtl, golden)


@pytest.mark.rtl
@pytest.mark.parametrize("padding", ["pads", "ZeroPad2d"])
def test_ds_cnn_with_tensorflow_padding_rtl_equals_golden(tmp_path, padding):
    """The keyword-spotting DS-CNN in small (10x4 stride-2 convolution with TensorFlow's
    asymmetric SAME pads, on the Conv or as torch's ZeroPad2d in front of it, depthwise and
    pointwise, average pool over the whole map): golden within one output step of
    onnxruntime, Verilator under stalls equal to golden, the manifest's cycles what the RTL
    does."""
    _, qdq, _ = ds_cnn_qdq(tmp_path, padding=padding)
    d = onnx2fpga.compile(qdq, tmp_path / "d")
    assert not [n.op for n in d.design.head + d.design.tail if n.op in COMPUTE]
    assert d.design.dataflow.layers[0].pads == (4, 1, 5, 1)
    pool = d.manifest["layers"][-3]
    assert pool["kernel"] == [25, 5] and pool["global"] is True    # no window, the reduce core
    x = np.random.default_rng(6).standard_normal((4, 1) + DS_CNN_SHAPE).astype(np.float32)
    golden = d.simulate(x, engine="golden")
    want = _ort(qdq, x)[0]
    assert np.abs(golden.reshape(want.shape) - want).max() <= output_step(qdq) * (1 + 1e-6)
    for seed, stall in ((1, 0.3), (2, 0.6)):
        rtl = d.simulate(x, engine="rtl", seed=seed, stall_in=stall, stall_out=stall)
        np.testing.assert_array_equal(rtl, golden)
    assert d.last_run["cycles_per_inference"] == pytest.approx(
        d.manifest["cycles_per_inference"], rel=0.05)


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
