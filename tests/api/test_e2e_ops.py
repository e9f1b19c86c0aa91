"""End to end for the operators exporters write around convolutions: a float model with a
channel Split, a Mul of its two halves, a squeeze-and-excitation Mul (a per-channel scale
broadcast over the image) and a ReduceMean over the spatial axes, calibrated by us ->
design -> Verilator with random stalls on both AXI-Stream sides == golden model, and the
manifest's cycles are what the RTL does."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx2fpga
from tests.helpers.models import block_model

SHAPE = (2, 5, 5)


def split_mul_mean_model():
    """Conv(2 -> 6, 3x3, pads 1), Relu, Split into 3 + 3 channels, Mul of the halves ``m``,
    ``m * Relu(Conv1x1(GlobalAveragePool(m)))`` (squeeze and excitation), ReduceMean over
    (2, 3) with keepdims 0 (what torch's dynamo exporter writes for ``x.mean((2, 3))``,
    opset 18: axes as an input), Gemm (3 -> 4)."""
    rng = np.random.default_rng(0)
    c = lambda name, a: numpy_helper.from_array(np.asarray(a), name)  # noqa: E731
    inits = [c("w", (rng.standard_normal((6, 2, 3, 3)) / 3).astype(np.float32)),
             c("b", (rng.standard_normal(6) * 0.1).astype(np.float32)),
             c("sizes", np.array([3, 3], np.int64)), c("axes", np.array([2, 3], np.int64)),
             c("sw", (rng.standard_normal((3, 3, 1, 1)) / 2).astype(np.float32)),
             c("sb", np.full(3, 0.5, np.float32)),
             c("fw", rng.standard_normal((3, 4)).astype(np.float32)),
             c("fb", (rng.standard_normal(4) * 0.1).astype(np.float32))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["h"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Split", ["r", "sizes"], ["p", "q"], name="split", axis=1),
             helper.make_node("Mul", ["p", "q"], ["m"], name="mul"),
             helper.make_node("GlobalAveragePool", ["m"], ["gp"], name="squeeze"),
             helper.make_node("Conv", ["gp", "sw", "sb"], ["sc"], name="excite"),
             helper.make_node("Relu", ["sc"], ["sr"], name="excite_relu"),
             helper.make_node("Mul", ["m", "sr"], ["e"], name="scale"),
             helper.make_node("ReduceMean", ["e", "axes"], ["g"], name="mean", keepdims=0),
             helper.make_node("Gemm", ["g", "fw", "fb"], ["y"], name="fc")]
    graph = helper.make_graph(
        nodes, "split_mul_mean",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, *SHAPE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.rtl
def test_split_mul_mean_rtl_equals_golden_under_backpressure(tmp_path):
    cal = np.random.default_rng(1).standard_normal((64, 1, *SHAPE)).astype(np.float32)
    d = onnx2fpga.compile(split_mul_mean_model(), tmp_path / "d", calibration=cal)
    kinds = [ly.kind for ly in d.design.dataflow.layers]
    assert kinds == ["conv", "slice", "slice", "add", "pool", "conv", "resize", "add", "pool",
                     "dense"]
    assert [ly.op for ly in d.design.dataflow.layers if ly.kind == "add"] == ["mul", "mul"]
    x = np.random.default_rng(7).standard_normal((10, 1, *SHAPE)).astype(np.float32)
    golden = d.simulate(x, engine="golden")
    for seed, stall in ((1, 0.3), (2, 0.6)):
        rtl = d.simulate(x, engine="rtl", seed=seed, stall_in=stall, stall_out=stall)
        np.testing.assert_array_equal(rtl, golden)
    assert d.last_run["cycles_per_inference"] == pytest.approx(
        d.manifest["cycles_per_inference"], rel=0.05)


@pytest.mark.rtl
@pytest.mark.parametrize("op, attrs", [("SpaceToDepth", {}), ("DepthToSpace", {"mode": "DCR"})])
def test_block_views_rtl_equals_golden_under_backpressure(tmp_path, op, attrs):
    """SpaceToDepth / DepthToSpace between two convolutions: two views and the reorder
    buffer the next convolution reads through; Verilator under stalls equals golden."""
    shape = (3, 6, 6)
    cal = np.random.default_rng(1).standard_normal((32, 1, *shape)).astype(np.float32)
    d = onnx2fpga.compile(block_model(op, 2, shape=shape, **attrs), tmp_path / "d",
                          calibration=cal)
    assert [ly.kind for ly in d.design.dataflow.layers] == ["conv", "view", "view", "conv"]
    x = np.random.default_rng(7).standard_normal((6, 1, *shape)).astype(np.float32)
    golden = d.simulate(x, engine="golden")
    rtl = d.simulate(x, engine="rtl", seed=4, stall_in=0.4, stall_out=0.4)
    np.testing.assert_array_equal(rtl, golden)
    assert d.last_run["cycles_per_inference"] == pytest.approx(
        d.manifest["cycles_per_inference"], rel=0.05)
