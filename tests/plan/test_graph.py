"""Accelerators for layer graphs (convolutions, pools, views, joins) at the AXI4-Stream ports:
simulated with amaranth.sim under random stalls and compared with the golden model."""

import numpy as np
import pytest

from onnx2fpga.hw.top import Accelerator
from onnx2fpga.ir.dataflow import Dataflow, Port
from onnx2fpga.ir.layers import ConvLayer, DenseLayer, PadLayer, PoolLayer, ViewLayer
from onnx2fpga.ir.stages import RequantStage
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan import cost
from onnx2fpga.plan.builder import hwc_order, stream_stages
from onnx2fpga.plan.graph import isolate, plan_graph, tensor_orders
from onnx2fpga.plan.layers import KINDS
from onnx2fpga.sim import golden
from tests.hw.test_top import pack, run_axi, unpack

U4, I8 = IntType(4, False), IntType(8, True)


def fit_stage(rng, values, out_type, *, shift=10, relu=False):
    """A per-channel requant stage mapping observed ``values`` (batch, C, ...) onto
    ``out_type`` (channel = axis 1)."""
    v = np.moveaxis(np.asarray(values, np.float64), 1, -1).reshape(-1, values.shape[1])
    zero_point = out_type.lo + (out_type.hi - out_type.lo) // 3
    spread = np.maximum(v.std(axis=0), 1.0)
    m = np.maximum(np.round((out_type.hi - out_type.lo) / (4 * spread) * 2 ** shift
                            * rng.uniform(0.7, 1.3, v.shape[1])), 1).astype(np.int64)
    off = np.round(-v.mean(axis=0) * m).astype(np.int64)
    lo = zero_point if relu else out_type.lo
    return RequantStage(m, off, shift, zero_point, lo, out_type.hi, out_type)


def cnn_dataflow(*, conv_lanes=1, simd=2, pe=2, pool_lanes=2, fc_simd=4, seed=0):
    """input (2, 6, 6) uint4 -> conv 3x3 pad 1 (4 ch) -> max pool 2x2 -> flatten -> dense 5."""
    rng = np.random.default_rng(seed)
    probe = rng.integers(0, 16, size=(32, 2, 6, 6))
    w = rng.integers(-7, 8, size=(4, 2, 3, 3))
    conv = ConvLayer("conv0", U4, 3, (2, 6, 6), w, IntType(4, True),
                     rng.integers(-20, 20, 4), [], pads=(1, 1, 1, 1), lanes=conv_lanes,
                     simd=simd, pe=pe, inputs=["x"], output="c0")
    conv.requant.append(fit_stage(rng, golden.run_layer(conv, probe), U4, relu=True))
    h = golden.run_layer(conv, probe)
    pool = PoolLayer("pool0", "max", U4, (4, 6, 6), (2, 2), (2, 2), lanes=pool_lanes,
                     inputs=["c0"], output="p0")
    h = golden.run_layer(pool, h)
    flat = ViewLayer("flat", U4, (4, 3, 3), (36,), inputs=["p0"], output="f0")
    h = golden.run_layer(flat, h)
    fc = DenseLayer("fc", U4, 2, rng.integers(-7, 8, size=(5, 36)), IntType(4, True),
                    rng.integers(-30, 30, 5), [], simd=fc_simd, pe=1, inputs=["f0"], output="y")
    fc.requant.append(fit_stage(rng, golden.run_layer(fc, h), I8))
    df = Dataflow([conv, pool, flat, fc], Port("x", (1, 2, 6, 6), U4, 0.1, 3, lanes=conv_lanes),
                  Port("y", (1, 5), I8, 0.1, 0, lanes=1), fifo_depths=[2, 2, 0, 2])
    orders, _ = tensor_orders(df)
    df.input.order = orders["x"]
    return df


def pad_pool_dataflow(seed=1):
    """input (3, 5, 4) uint4 -> pad (1, 0, 2, 1) -> average pool 3x3 stride 2 with padding ->
    conv 1x1 (depthwise-free) -> output image (channels-last on the port)."""
    rng = np.random.default_rng(seed)
    probe = rng.integers(0, 16, size=(16, 3, 5, 4))
    pad = PadLayer("pad0", U4, (3, 5, 4), (1, 0, 2, 1), 5, lanes=3, inputs=["x"], output="a")
    h = golden.run_layer(pad, probe)
    counts = np.array([[4, 6, 4], [6, 9, 6], [6, 9, 6], [6, 9, 6]])     # valid positions, 4x3
    m = np.round(2 ** 12 / counts).astype(np.int64).reshape(1, 4, 3)
    avg = PoolLayer("avg0", "avg", U4, (3, 8, 5), (3, 3), (2, 2), pads=(1, 1, 1, 1),
                    in_zero_point=5, lanes=1, inputs=["a"], output="b",
                    requant=[RequantStage(m, [0], 12, 5, 0, 15, U4)])
    h = golden.run_layer(avg, h)
    conv = ConvLayer("conv1", U4, 5, (3, 4, 3), rng.integers(-7, 8, size=(6, 3, 1, 1)),
                     IntType(4, True), rng.integers(-9, 9, 6), [], lanes=3, simd=3, pe=3,
                     inputs=["b"], output="y")
    conv.requant.append(fit_stage(rng, golden.run_layer(conv, h), I8))
    df = Dataflow([pad, avg, conv], Port("x", (1, 3, 5, 4), U4, 0.1, 5, lanes=3),
                  Port("y", (1, 6, 4, 3), I8, 0.1, 0, lanes=3), fifo_depths=[2, 2, 2])
    orders, _ = tensor_orders(df)
    df.input.order, df.output.order = orders["x"], orders["y"]
    return df


def transpose_dataflow(seed=2):
    """conv (2, 6, 5) -> transpose H and W -> conv: the second convolution needs its input
    channels-last in the transposed layout, a real reordering (a reorder core)."""
    rng = np.random.default_rng(seed)
    probe = rng.integers(0, 16, size=(16, 2, 6, 5))
    c0 = ConvLayer("conv0", U4, 3, (2, 6, 5), rng.integers(-7, 8, size=(3, 2, 3, 3)),
                   IntType(4, True), rng.integers(-9, 9, 3), [], pads=(1, 1, 1, 1), lanes=2,
                   simd=2, pe=3, inputs=["x"], output="a")
    c0.requant.append(fit_stage(rng, golden.run_layer(c0, probe), U4, relu=True))
    h = golden.run_layer(c0, probe)
    t = ViewLayer("swap", U4, (3, 6, 5), (3, 5, 6), perm=(0, 2, 1), inputs=["a"], output="b")
    h = golden.run_layer(t, h)
    c1 = ConvLayer("conv1", U4, 0, (3, 5, 6), rng.integers(-7, 8, size=(2, 3, 2, 2)),
                   IntType(4, True), rng.integers(-9, 9, 2), [], stride=(2, 2), lanes=3,
                   simd=3, pe=2, inputs=["b"], output="y")
    c1.requant.append(fit_stage(rng, golden.run_layer(c1, h), I8))
    df = Dataflow([c0, t, c1], Port("x", (1, 2, 6, 5), U4, 0.1, 3, lanes=2),
                  Port("y", (1, 2, 2, 3), I8, 0.1, 0, lanes=2), fifo_depths=[2, 0, 2])
    orders, _ = tensor_orders(df)
    df.input.order, df.output.order = orders["x"], orders["y"]
    return df


def grouped_dataflow(seed=3):
    """A grouped convolution (2 groups, dilation 2, stride 2, asymmetric pads) and a
    depthwise one with a channel multiplier (each input channel feeds 2 outputs), both on
    the matrix unit with block-diagonal weights, then a true depthwise 3x3."""
    rng = np.random.default_rng(seed)
    probe = rng.integers(0, 16, size=(16, 4, 9, 8))
    g = ConvLayer("grouped", U4, 5, (4, 9, 8), rng.integers(-7, 8, size=(6, 2, 3, 3)),
                  IntType(4, True), rng.integers(-9, 9, 6), [], stride=(2, 2),
                  dilation=(2, 2), pads=(2, 1, 1, 2), group=2, lanes=2, simd=4, pe=3,
                  inputs=["x"], output="a")
    g.requant.append(fit_stage(rng, golden.run_layer(g, probe), U4, relu=True))
    h = golden.run_layer(g, probe)
    m = ConvLayer("multiplier", U4, 0, (6, 4, 4), rng.integers(-7, 8, size=(12, 1, 2, 2)),
                  IntType(4, True), rng.integers(-9, 9, 12), [], group=6, lanes=3, simd=6,
                  pe=4, inputs=["a"], output="b")
    m.requant.append(fit_stage(rng, golden.run_layer(m, h), U4, relu=True))
    h = golden.run_layer(m, h)
    dw = ConvLayer("depthwise", U4, 2, (12, 3, 3), rng.integers(-7, 8, size=(12, 1, 3, 3)),
                   IntType(4, True), rng.integers(-9, 9, 12), [], pads=(1, 1, 1, 1),
                   group=12, lanes=4, inputs=["b"], output="y")
    assert dw.depthwise and not m.depthwise
    dw.requant.append(fit_stage(rng, golden.run_layer(dw, h), I8))
    df = Dataflow([g, m, dw], Port("x", (1, 4, 9, 8), U4, 0.1, 5, lanes=2),
                  Port("y", (1, 12, 3, 3), I8, 0.1, 0, lanes=4), fifo_depths=[2, 2, 2])
    orders, _ = tensor_orders(df)
    df.input.order, df.output.order = orders["x"], orders["y"]
    return df


def residual_dataflow(seed=4):
    """conv -> (conv -> conv) + skip -> add: the skip FIFO from the layers' needs must keep
    the join from deadlocking and the pipeline at the rate of its slowest layer."""
    from onnx2fpga.ir.layers import AddLayer
    rng = np.random.default_rng(seed)
    probe = rng.integers(0, 16, size=(16, 2, 8, 7))
    layers, h = [], probe
    for k, (src, cin) in enumerate([("x", 2), ("a", 4), ("b", 4)]):
        c = ConvLayer(f"conv{k}", U4, 0, (cin, 8, 7), rng.integers(-7, 8, size=(4, cin, 3, 3)),
                      IntType(4, True), rng.integers(-9, 9, 4), [], pads=(1, 1, 1, 1),
                      lanes=1 if k == 0 else 2, simd=2, pe=2, inputs=[src], output="abc"[k])
        c.requant.append(fit_stage(rng, golden.run_layer(c, h), U4, relu=True))
        h = golden.run_layer(c, h)
        layers.append(c)
    a = golden.run_layer(layers[0], probe)
    add = AddLayer("add", [U4, U4], [0, 0], (4, 8, 7), [3, 2],
                   [RequantStage([1], [0], 2, 0, 0, 15, U4)], lanes=2, inputs=["c", "a"],
                   output="y")
    assert golden.run_layer(add, h, a).max() <= 15
    df = Dataflow(layers + [add], Port("x", (1, 2, 8, 7), U4, 0.1, 0, lanes=1),
                  Port("y", (1, 4, 8, 7), U4, 0.1, 0, lanes=2), fifo_depths=[2, 2, 2, 2])
    orders, _ = tensor_orders(df)
    df.input.order, df.output.order = orders["x"], orders["y"]
    df.edge_fifos = cost.edge_fifo_depths(df)
    return df


DATAFLOWS = {
    "cnn": cnn_dataflow,
    "cnn_wide": lambda: cnn_dataflow(conv_lanes=2, simd=6, pe=4, pool_lanes=4, fc_simd=9),
    "pad_pool": pad_pool_dataflow,
    "transpose": transpose_dataflow,
    "grouped": grouped_dataflow,
    "residual": residual_dataflow,
}


def run(df, x, *, seed=0, idle=0.0, stall=0.0):
    dut = Accelerator(df)
    inp, out = df.input, df.output
    words = pack(inp.to_stream(x), inp.type, inp.lanes)
    res = run_axi(dut, words, len(x) * out.beats, seed=seed, idle=idle, stall=stall)
    y = unpack([d for d, _, _ in res["out"]], out.type, out.lanes).reshape(len(x), -1)
    return out.from_stream(y), res


@pytest.mark.parametrize("name, seed, idle, stall", [
    ("cnn", 1, 0.3, 0.3), ("cnn", 2, 0.0, 0.6), ("cnn_wide", 3, 0.2, 0.4),
    ("pad_pool", 4, 0.3, 0.3), ("pad_pool", 5, 0.0, 0.0), ("transpose", 6, 0.3, 0.3),
    ("grouped", 7, 0.3, 0.3), ("grouped", 8, 0.5, 0.1), ("residual", 9, 0.3, 0.3),
    ("residual", 10, 0.0, 0.7),
])
def test_graph_matches_golden(name, seed, idle, stall):
    df = DATAFLOWS[name]()
    x = np.random.default_rng(seed).integers(0, 16, size=(3, df.input.size))
    y, _ = run(df, x, seed=seed, idle=idle, stall=stall)
    np.testing.assert_array_equal(y, golden.run_dataflow(df, x))


@pytest.mark.parametrize("name", ["cnn", "cnn_wide", "pad_pool", "transpose", "grouped",
                                  "residual"])
def test_graph_cycles(name):
    """Back-to-back inferences leave the accelerator ``cycles_per_inference`` apart (within
    5 %), and the modelled latency is the simulated one."""
    df = DATAFLOWS[name]()
    x = np.random.default_rng(0).integers(0, 16, size=(5, df.input.size))
    y, res = run(df, x)
    np.testing.assert_array_equal(y, golden.run_dataflow(df, x))
    last_out = [c for _, t, c in res["out"] if t]
    figures = cost.dataflow_cycles(df)
    steady = float(np.mean(np.diff(last_out[1:])))
    assert abs(steady - figures["cycles_per_inference"]) <= 0.05 * figures["cycles_per_inference"]
    latency = last_out[0] - res["in"][0]
    # The latency follows every transfer through the cores' models (cost.plan_traces): exact.
    assert latency == figures["latency_cycles"]


def test_image_orders():
    df = cnn_dataflow()
    orders, wanted = tensor_orders(df)
    np.testing.assert_array_equal(orders["x"], hwc_order((2, 6, 6)))
    np.testing.assert_array_equal(orders["c0"], hwc_order((4, 6, 6)))
    # The flatten keeps the pooled image's channels-last sequence: position p of the stream
    # holds NCHW-flat element c*9 + h*3 + w of pixel p // 4, channel p % 4.
    np.testing.assert_array_equal(orders["f0"], hwc_order((4, 3, 3)))
    assert orders["y"] is None and wanted[("fc", 0)] is orders["f0"]
    # The dense layer's weight columns are permuted to the stream, not the data.
    matvec = [s for s in plan_graph(df).stages if s.kind == "matvec" and s.layer.name == "fc"]
    np.testing.assert_array_equal(matvec[0].params["layer"].weight,
                                  df.layers[3].weight[:, orders["f0"]])


def test_stream_stages_period():
    st = RequantStage(np.arange(1, 5), [7], 3, 0, -8, 7, IntType(4, True))
    out, period = stream_stages([st], (4, 3, 2), hwc_order((4, 3, 2)))
    assert period == 4
    np.testing.assert_array_equal(out[0].multiplier, [1, 2, 3, 4])
    np.testing.assert_array_equal(out[0].offset, [7])
    out, period = stream_stages([st], (4, 3, 2), None)
    assert period == 24 and out[0].multiplier.tolist() == [1] * 6 + [2] * 6 + [3] * 6 + [4] * 6
    per_pixel = RequantStage(np.arange(6).reshape(1, 3, 2), [0], 3, 0, -8, 7, IntType(4, True))
    out, period = stream_stages([per_pixel], (4, 3, 2), hwc_order((4, 3, 2)))
    assert period == 24 and out[0].multiplier.tolist() == np.repeat(np.arange(6), 4).tolist()


def test_reorder_only_where_needed():
    """A flatten into a dense layer costs nothing; a transpose in front of a convolution
    gets one reorder core, which permutes the stream into the transposed image's order."""
    assert not [s for s in plan_graph(cnn_dataflow()).stages if s.kind == "reorder"]
    df = transpose_dataflow()
    reorders = [s for s in plan_graph(df).stages if s.kind == "reorder"]
    assert len(reorders) == 1
    # Output position p (channels-last in the (3, 5, 6) layout) takes input position
    # order[p] (channels-last in the (3, 6, 5) layout): pixel (h, w) of the new layout is
    # pixel (w, h) of the old.
    order = reorders[0].params["order"].reshape(5, 6, 3)
    for h, w, c in [(0, 0, 0), (1, 2, 1), (4, 5, 2)]:
        assert order[h, w, c] == (w * 5 + h) * 3 + c


@pytest.mark.parametrize("name", ["cnn", "pad_pool", "transpose", "grouped"])
def test_isolated_layer_cycles(name):
    """Every layer alone, fed at full rate: its simulated cycles per inference are the
    per-layer figure of the whole design's manifest (within 5 %)."""
    df = DATAFLOWS[name]()
    figures = {f["name"]: f["cycles"] for f in cost.dataflow_cycles(df)["layers"]}
    for layer in df.layers:
        if isinstance(layer, ViewLayer):
            continue
        sub = isolate(df, layer.name)
        t = sub.input.type
        x = np.random.default_rng(0).integers(t.lo, t.hi, size=(4, sub.input.size),
                                              endpoint=True)
        y, res = run(sub, x)
        np.testing.assert_array_equal(y, golden.run_dataflow(sub, x))
        last_out = [c for _, t_, c in res["out"] if t_]
        steady = float(np.mean(np.diff(last_out[1:])))
        assert abs(steady - figures[layer.name]) <= 0.05 * figures[layer.name], layer.name


def test_skip_fifo_keeps_the_rate(monkeypatch):
    """With the computed skip FIFO the residual pipeline runs at its slowest layer's rate;
    with only the deadlock bound's worth it does not (the fork waits on the skip)."""
    df = residual_dataflow()
    assert list(df.edge_fifos) == ["a->add"]
    for kind in KINDS.values():         # the deadlock bound alone: no rows in flight
        monkeypatch.setattr(kind, "row_delay", lambda layer: 0)
    bound = cost.edge_fifo_depths(df)["a->add"]
    assert bound < df.edge_fifos["a->add"]
    x = np.random.default_rng(0).integers(0, 16, size=(5, df.input.size))
    rates = {}
    for name, depth in (("computed", df.edge_fifos["a->add"]), ("bound", bound)):
        df.edge_fifos = {"a->add": depth}
        y, res = run(df, x)
        np.testing.assert_array_equal(y, golden.run_dataflow(df, x))
        last_out = [c for _, t_, c in res["out"] if t_]
        rates[name] = float(np.mean(np.diff(last_out[1:])))
    target = cost.dataflow_cycles(df)["cycles_per_inference"]
    assert abs(rates["computed"] - target) <= 0.05 * target
    assert rates["bound"] > 1.1 * target
