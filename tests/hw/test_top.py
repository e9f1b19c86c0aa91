"""Whole-accelerator tests at the AXI4-Stream ports: packing, tlast, golden agreement, cycles."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from onnx2fpga.hw.top import Accelerator
from onnx2fpga.ir.dataflow import Dataflow, Port
from onnx2fpga.ir.layers import DenseLayer, RequantLayer
from onnx2fpga.ir.stages import RequantStage
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan import cost
from onnx2fpga.plan.graph import plan_graph
from onnx2fpga.sim import golden


def spread_stage(rng, values, out_type, *, shift, rounding, relu=False, per_channel=True):
    """A requant stage mapping the observed ``values`` (batch, channels) onto ``out_type``."""
    channels = values.shape[1]
    lo = out_type.lo
    zero_point = lo + (out_type.hi - out_type.lo) // 3
    if relu:
        lo = zero_point
    spread = max(1.0, float(values.std()))
    n = channels if per_channel else 1
    target = (out_type.hi - out_type.lo) / (4 * spread) * 2 ** shift
    multiplier = np.round(target * rng.uniform(0.5, 1.5, size=n)).astype(np.int64)
    multiplier = np.maximum(multiplier, 1)
    mean = values.mean(axis=0) if per_channel else values.mean(keepdims=True)
    offset = np.round(-mean * multiplier + rng.normal(0, 2 ** shift, size=n)).astype(np.int64)
    return RequantStage(multiplier, offset, shift, zero_point, lo, out_type.hi, out_type,
                        rounding=rounding)


def dense(rng, name, in_type, in_zp, w_type, in_f, out_f, simd, pe, requant_types, probe):
    """A DenseLayer with random weights whose requant stages fit the data ``probe``."""
    weight = rng.integers(w_type.lo, w_type.hi, size=(out_f, in_f), endpoint=True)
    bias = rng.integers(-50, 50, size=out_f)
    layer = DenseLayer(name, in_type, in_zp, weight, w_type, bias, [], simd=simd, pe=pe)
    values = golden.run_layer(layer, probe)
    for k, (out_type, rounding) in enumerate(requant_types):
        stage = spread_stage(rng, values, out_type, shift=8 + k, rounding=rounding,
                             relu=not out_type.signed, per_channel=k == 0)
        layer.requant.append(stage)
        values = golden.requant(values, stage)
    return layer


def dataflow_a():
    """fc0 (uint4, simd 3, pe 2) -> gather 2:4 -> fc1 (simd 4, pe 1) -> int8."""
    rng = np.random.default_rng(10)
    u4, i8 = IntType(4, False), IntType(8, True)
    probe = rng.integers(0, 16, size=(64, 12))
    fc0 = dense(rng, "fc0", u4, 8, IntType(3, True), 12, 8, 3, 2, [(u4, "half_even")], probe)
    h = golden.run_layer(fc0, probe)
    fc1 = dense(rng, "fc1", u4, 0, IntType(4, True), 8, 4, 4, 1, [(i8, "half_away")], h)
    return Dataflow([fc0, fc1], Port("x", (1, 12), u4, 0.1, 8, lanes=3),
                    Port("y", (1, 4), i8, 0.05, 0, lanes=1), fifo_depths=[2, 0])


def dataflow_b():
    """int7 port cast to int8 -> fc0 (simd 2, pe 3, two stages) -> FIFO 5 -> split 3:1 ->
    relu6-like RequantLayer -> FIFO 1 -> gather 1:3 -> fc2 (pe 3, no requant) -> FIFO 3."""
    rng = np.random.default_rng(11)
    i7, i8, i16, u5 = IntType(7, True), IntType(8, True), IntType(16, True), IntType(5, False)
    probe = rng.integers(-64, 64, size=(64, 8))
    fc0 = dense(rng, "fc0", i8, -2, i8, 8, 6, 2, 3,
                [(i16, "half_away"), (u5, "half_even")], probe)
    h = golden.run_layer(fc0, probe)
    act = RequantLayer("act", u5, 6, [spread_stage(rng, h, IntType(6, True), shift=3,
                                                   rounding="half_away")], lanes=1)
    h = golden.run_layer(act, h)
    fc2 = dense(rng, "fc2", IntType(6, True), 0, IntType(2, True), 6, 3, 3, 3, [], h)
    out_type = fc2.acc_type
    return Dataflow([fc0, act, fc2], Port("x", (8,), i7, 0.1, 0, lanes=2),
                    Port("y", (3,), out_type, 1.0, 0, lanes=3), fifo_depths=[5, 1, 3])


def dataflow_c():
    """dataflow_b with the RequantLayer on 2 lanes between fc0's 3: lane counts that do not
    divide one another meet through a converter to their common divisor (3 -> 1 -> 2)."""
    df = dataflow_b()
    df.layers[1].lanes = 2
    return df


DATAFLOWS = {"a": dataflow_a, "b": dataflow_b, "c": dataflow_c}


def pack(values, t: IntType, lanes: int) -> list[int]:
    """Elements -> tdata words: element j of a transfer at bits [j*bits, (j+1)*bits)."""
    mask = (1 << t.bits) - 1
    words = []
    for row in np.asarray(values).reshape(-1, lanes):
        words.append(sum((int(v) & mask) << (j * t.bits) for j, v in enumerate(row)))
    return words


def unpack(words, t: IntType, lanes: int) -> np.ndarray:
    mask = (1 << t.bits) - 1
    out = []
    for word in words:
        for j in range(lanes):
            v = (word >> (j * t.bits)) & mask
            if t.signed and v >> (t.bits - 1):
                v -= 1 << t.bits
            out.append(v)
    return np.array(out, dtype=np.int64)


def run_axi(dut, words, n_out, *, seed=None, idle=0.0, stall=0.0):
    """Drive s_axis with ``words`` (garbage in the unused tdata bits and in tlast) and collect
    ``n_out`` m_axis transfers. Returns (tdata, tlast, cycle) of each output and the cycles of
    the inputs."""
    rng = np.random.default_rng(seed)
    inp = dut.dataflow.input
    spare = dut.s_axis_tdata.shape().width - inp.lanes * inp.type.bits
    result = {}

    async def producer(ctx):
        times, cycle = [], 0
        for word in words:
            while idle and rng.random() < idle:
                ctx.set(dut.s_axis_tvalid, 0)
                await ctx.tick()
                cycle += 1
            junk = int(rng.integers(0, 1 << spare)) if spare else 0
            ctx.set(dut.s_axis_tdata, word | (junk << (inp.lanes * inp.type.bits)))
            ctx.set(dut.s_axis_tlast, int(rng.integers(0, 2)))
            ctx.set(dut.s_axis_tvalid, 1)
            while True:
                _, _, ready = await ctx.tick().sample(dut.s_axis_tready)
                cycle += 1
                if ready:
                    break
            times.append(cycle - 1)
        ctx.set(dut.s_axis_tvalid, 0)
        result["in"] = times

    async def consumer(ctx):
        out, cycle, pending = [], 0, None
        while len(out) < n_out:
            assert cycle < 20_000, "timeout"
            ready = not (stall and rng.random() < stall)
            ctx.set(dut.m_axis_tready, int(ready))
            _, _, valid, data, last = await ctx.tick().sample(
                dut.m_axis_tvalid, dut.m_axis_tdata, dut.m_axis_tlast)
            if pending is not None:          # AXI-Stream: no change while waiting for ready
                assert valid and (data, last) == pending
            if valid and ready:
                out.append((data, last, cycle))
                pending = None
            elif valid:
                pending = (data, last)
            cycle += 1
        result["out"] = out

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return result


@pytest.mark.parametrize("name,seed,idle,stall", [
    ("a", 1, 0.3, 0.3),
    ("a", 2, 0.0, 0.7),
    ("b", 3, 0.5, 0.2),
    ("b", 4, 0.1, 0.6),
    ("c", 5, 0.3, 0.3),
])
def test_accelerator_matches_golden(name, seed, idle, stall):
    df = DATAFLOWS[name]()
    dut = Accelerator(df)
    inp, out = df.input, df.output
    batch = 4
    x = np.random.default_rng(seed).integers(inp.type.lo, inp.type.hi, size=(batch, inp.size),
                                             endpoint=True)
    expected = golden.run_dataflow(df, x)
    res = run_axi(dut, pack(x, inp.type, inp.lanes), batch * out.beats, seed=seed, idle=idle,
                  stall=stall)
    tdata = [d for d, _, _ in res["out"]]
    tlast = [t for _, t, _ in res["out"]]
    np.testing.assert_array_equal(unpack(tdata, out.type, out.lanes).reshape(batch, -1),
                                  expected)
    assert tlast == ([0] * (out.beats - 1) + [1]) * batch
    used = out.lanes * out.type.bits
    assert all(d >> used == 0 for d in tdata)        # the padding bits are zero


@pytest.mark.parametrize("name", ["a", "b"])
def test_accelerator_cycles(name):
    df = DATAFLOWS[name]()
    dut = Accelerator(df)
    inp, out = df.input, df.output
    batch = 6
    x = np.random.default_rng(0).integers(inp.type.lo, inp.type.hi, size=(batch, inp.size),
                                          endpoint=True)
    res = run_axi(dut, pack(x, inp.type, inp.lanes), batch * out.beats)
    np.testing.assert_array_equal(
        unpack([d for d, _, _ in res["out"]], out.type, out.lanes).reshape(batch, -1),
        golden.run_dataflow(df, x))
    last_out = [c for _, t, c in res["out"] if t]
    figures = cost.dataflow_cycles(df)
    # Latency of the first inference in the idle accelerator, fed at full rate.
    assert last_out[0] - res["in"][0] == figures["latency_cycles"]
    # Steady state: one inference every cycles_per_inference cycles.
    np.testing.assert_array_equal(np.diff(last_out[2:]), figures["cycles_per_inference"])


def test_lanes_meet_through_common_divisor():
    kinds = [(s.kind, s.in_lanes, s.out_lanes) for s in plan_graph(dataflow_c()).stages]
    assert ("convert", 3, 1) in kinds and ("convert", 1, 2) in kinds


def test_cycle_figures_by_hand():
    df = dataflow_a()
    fc0, fc1 = df.layers
    # fc0: 4 folds x 4 groups; fc1: 2 folds x 4 groups; ports: 4 and 4 beats.
    assert cost.layer_cycles(fc0) == 16 and cost.layer_cycles(fc1) == 8
    # fc0 (pe 2, 4 folds) requantizes one lane at a time, to uint4: 15 thresholds compared
    # in parallel are cheaper than the multiplier. Last accumulators out at 4 + 16 + 4 = 24
    # (4 pipeline registers: memory data, operands, products, one adder-tree stage for
    # simd 3), serialized +2, thresholds +4 (input register, the per-channel table's
    # register, compare, count), gathered +1.
    assert cost.layer_latency(fc0) == 24 + 2 + 4 + 1
    # fc1 (simd 4): 2 + 8 + 4, then requant +7 (two input registers; partial products,
    # their sum, offset, rounding, clip).
    assert cost.layer_latency(fc1) == 2 + 8 + 4 + 7
    figures = cost.dataflow_cycles(df)
    assert figures["cycles_per_inference"] == 16
    # fc0 done at 31; FIFO +1 = 32; gather 2:4 +1 = 33; fc1 last output 33 + 8 + 5 = 46;
    # requant (int8 output: a multiplier) +7 = 53.
    assert figures["latency_cycles"] == 53
    assert [entry["name"] for entry in figures["layers"]] == ["fc0", "fc1"]
    kinds = [(s.kind, s.in_lanes, s.out_lanes) for s in plan_graph(df).stages]
    assert kinds == [("matvec", 3, 2), ("convert", 2, 1), ("threshold", 1, 1), ("convert", 1, 2),
                     ("fifo", 2, 2), ("convert", 2, 4), ("matvec", 4, 1), ("requant", 1, 1)]


def test_accelerator_errors():
    df = dataflow_a()
    df.input.lanes = 2
    with pytest.raises(ValueError, match=r"^Input port 'x' must have the lanes of the first "
                                         r"layer 'fc0' \(3\), not 2$"):
        Accelerator(df)
    df = dataflow_a()
    df.output.lanes = 2
    with pytest.raises(ValueError, match=r"^Output port 'y' must have the lanes of the last "
                                         r"layer 'fc1' \(1\), not 2$"):
        Accelerator(df)
    df = dataflow_b()
    df.layers[1].lanes = 4
    with pytest.raises(ValueError, match=r"^Lanes of layer 'act' must divide channels=6, "
                                         r"not 4$"):
        Accelerator(df)
    df = dataflow_a()
    df.layers[1].simd = 3
    with pytest.raises(ValueError, match=r"^SIMD of layer 'fc1' must divide in_features=8, "
                                         r"not 3$"):
        Accelerator(df)
    df = dataflow_a()
    df.output.type = IntType(4, True)
    with pytest.raises(ValueError, match=r"^Last layer 'fc1' feeding output port 'y': int8 "
                                         r"values do not all fit int4$"):
        Accelerator(df)
    df = dataflow_a()
    df.layers = []
    df.fifo_depths = []
    with pytest.raises(ValueError, match=r"^Dataflow must have at least one layer, not none$"):
        Accelerator(df)
    with pytest.raises(TypeError, match=r"^Dataflow must be a Dataflow, not 'x'$"):
        Accelerator("x")
