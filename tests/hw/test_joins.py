"""BroadcastCore, AddCore and ConcatCore in amaranth.sim: against numpy and the golden model
under random idles and stalls on every port, the exact cycle figures at full rate, and through
the Verilog backend."""

import numpy as np
import pytest
from amaranth import Fragment, Module, Shape, signed, unsigned
from amaranth.back import verilog
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from onnx2fpga.hw.joins import AddCore, BroadcastCore, ConcatCore
from onnx2fpga.hw.testing import (
    IDLE_PHASES,
    STALL_PHASES,
    random_values,
    receiver,
    rotated,
    sender,
    shape_range,
    simulate,
    stream_send,
    timed_receiver,
    timed_sender,
    to_transfers,
)
from onnx2fpga.ir.layers import ConcatLayer
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan.joins import (
    ADD_LATENCY,
    BROADCAST_LATENCY,
    CONCAT_LATENCY,
    add_cycles,
    add_latency,
    broadcast_cycles,
    broadcast_latency,
    concat_cycles,
    concat_latency,
)
from onnx2fpga.sim import golden

# Traffic: every port walks through all the phases of hw.testing (IDLE_PHASES, STALL_PHASES),
# each port with its own random source and the phases rotated per port, so that ports stall
# at different times.


def channels_last(x):
    """``(batch, C, H, W)`` logical images -> ``(batch, H*W*C)`` in stream order."""
    return np.asarray(x).transpose(0, 2, 3, 1).reshape(len(x), -1)


def narrowest(lo, hi):
    """The narrowest integer shape holding ``lo`` and ``hi``, by trying every width."""
    for width in range(1, 80):
        for shape in (unsigned(width), signed(width)):
            s_lo, s_hi = shape_range(shape)
            if s_lo <= lo and hi <= s_hi:
                return shape
    raise AssertionError("no shape")


# ---------------------------------------------------------------------------------------------
# BroadcastCore

# (shape, lanes, outputs)
BROADCAST_CASES = [
    (signed(8), 1, 2),
    (unsigned(4), 3, 3),
    (IntType(1, False), 2, 4),
    (signed(16), 4, 2),
    (IntType(5, True), 1, 5),
]


@pytest.mark.parametrize("seed,case", list(enumerate(BROADCAST_CASES)))
def test_broadcast_delivers_every_transfer(seed, case):
    shape, lanes, outputs = case
    dut = BroadcastCore(shape, lanes, outputs)
    x = random_values(np.random.default_rng(seed), shape, (60, lanes))
    items = to_transfers(x, lanes)
    results = [[] for _ in range(outputs)]
    benches = [sender(dut.i_stream, items, np.random.default_rng([seed, 0]), IDLE_PHASES)]
    for k in range(outputs):
        benches.append(receiver(dut.o_stream[k], len(items), np.random.default_rng([seed, 1, k]),
                                rotated(STALL_PHASES, k), results[k]))
    simulate(dut, *benches)
    for got in results:
        np.testing.assert_array_equal(np.array(got), x)


@pytest.mark.parametrize("case", BROADCAST_CASES)
def test_broadcast_timing(case):
    shape, lanes, outputs = case
    dut = BroadcastCore(shape, lanes, outputs)
    n = 20
    x = random_values(np.random.default_rng(1), shape, (n, lanes))
    times = {}
    benches = [timed_sender(dut.i_stream, to_transfers(x, lanes), times, "in")]
    benches += [timed_receiver(dut.o_stream[k], n, times, f"out{k}") for k in range(outputs)]
    simulate(dut, *benches)
    np.testing.assert_array_equal(times["in"], np.arange(n))        # never held up
    for k in range(outputs):
        np.testing.assert_array_equal(times[f"out{k}_items"], x)
        np.testing.assert_array_equal(np.array(times[f"out{k}"]) - times["in"], 1)
        assert times[f"out{k}"][-1] - times["in"][0] == broadcast_latency(n) == n
    assert dut.latency == BROADCAST_LATENCY == 1
    assert dut.cycles == 1
    assert broadcast_cycles(n) == n


@pytest.mark.parametrize("outputs,late", [(2, 1), (3, 0), (4, 2)])
def test_broadcast_waits_for_a_stalled_output(outputs, late):
    # One output not ready for a while: the input is taken once, the other outputs get that
    # one transfer and nothing more until the late output takes its copy; then all of them
    # run at full rate again, in step.
    dut = BroadcastCore(signed(8), 2, outputs)
    n, delay = 12, 15
    x = random_values(np.random.default_rng(2), signed(8), (n, 2))
    times = {}
    benches = [timed_sender(dut.i_stream, to_transfers(x, 2), times, "in")]
    benches += [timed_receiver(dut.o_stream[k], n, times, f"out{k}",
                               delay=delay if k == late else 0) for k in range(outputs)]
    simulate(dut, *benches)
    assert sum(t < delay for t in times["in"]) == 1
    for k in range(outputs):
        np.testing.assert_array_equal(times[f"out{k}_items"], x)
        if k != late:
            assert sum(t < delay for t in times[f"out{k}"]) == 1
    # The late output takes its first copy in cycle `delay`; the next input comes in then.
    assert times["in"][1] == delay
    np.testing.assert_array_equal(np.diff(times["in"][1:]), 1)


# ---------------------------------------------------------------------------------------------
# AddCore

# (a_shape, b_shape, lanes, zero_points, multipliers, image (C, H, W))
ADD_CASES = [
    (IntType(8, True), IntType(8, True), 2, (3, -5), (23170, 11585), (4, 3, 2)),
    (IntType(8, False), IntType(8, False), 1, (128, 100), (1, 1), (3, 2, 2)),
    (IntType(4, True), IntType(8, False), 3, (0, 7), (-3, 2), (6, 2, 1)),
    (IntType(1, False), IntType(2, True), 4, (0, 0), (1, -1), (8, 1, 3)),
    (IntType(16, True), IntType(16, True), 2, (-7, 9), (1 << 15, -(1 << 15) + 1), (2, 2, 2)),
    (IntType(8, True), IntType(8, True), 2, (0, 4), (0, 5), (2, 3, 3)),
    (unsigned(4), unsigned(4), 1, (0, 0), (2, 3), (5, 1, 2)),     # unsigned sum
    (signed(3), unsigned(3), 2, (-4, 7), (-1, -1), (2, 4, 1)),
]


def corner_values(t):
    lo, hi = shape_range(t)
    return np.array([lo, lo, hi, hi]), np.array([lo, hi, lo, hi])


def add_inputs(rng, a_type, b_type, image, batch):
    """Random images, the first of them holding every pair of extremes (lo/hi of a and b)."""
    a = random_values(rng, a_type, (batch,) + image)
    b = random_values(rng, b_type, (batch,) + image)
    ca, _ = corner_values(a_type)
    _, cb = corner_values(b_type)
    a.reshape(batch, -1)[0, :4] = ca
    b.reshape(batch, -1)[0, :4] = cb
    return a, b


@pytest.mark.parametrize("seed,case", list(enumerate(ADD_CASES)))
def test_add_matches_golden(seed, case):
    a_type, b_type, lanes, zps, mults, image = case
    dut = AddCore(a_type, b_type, lanes, zero_points=zps, multipliers=mults)
    a, b = add_inputs(np.random.default_rng(seed), a_type, b_type, image, 4)
    expected = channels_last(golden.add(a, b, zps, mults))
    items_a = to_transfers(channels_last(a), lanes)
    items_b = to_transfers(channels_last(b), lanes)
    n = len(items_a)
    got, t_a, t_b = [], [], []
    simulate(dut,
             sender(dut.i_a, items_a, np.random.default_rng([seed, 1]), IDLE_PHASES, t_a),
             sender(dut.i_b, items_b, np.random.default_rng([seed, 2]),
                    rotated(IDLE_PHASES, 2), t_b),
             receiver(dut.o_stream, n, np.random.default_rng([seed, 3]), STALL_PHASES, got))
    np.testing.assert_array_equal(np.array(got).reshape(expected.shape), expected)
    # A transfer takes both inputs in the same cycle, whatever their idle patterns.
    np.testing.assert_array_equal(np.concatenate(t_a), np.concatenate(t_b))


@pytest.mark.parametrize("case", ADD_CASES)
def test_add_out_shape(case):
    a_type, b_type, lanes, zps, mults, _ = case
    dut = AddCore(a_type, b_type, lanes, zero_points=zps, multipliers=mults)
    ca, cb = corner_values(a_type)[0], corner_values(b_type)[1]
    v = golden.add(ca.reshape(4, 1), cb.reshape(4, 1), zps, mults)
    assert dut.out_range == (v.min(), v.max())
    assert dut.out_shape == narrowest(v.min(), v.max())
    assert dut.signature.members["o_stream"].signature == stream.Signature(
        data.ArrayLayout(dut.out_shape, lanes))
    Fragment.get(dut, None)               # elaborates at this width (and counts as used)


# (op, case): products, minima and maxima of the terms, through the same three stages.
JOIN_CASES = [("mul", ADD_CASES[1]), ("mul", ADD_CASES[2]), ("min", ADD_CASES[0]),
              ("max", ADD_CASES[2]), ("max", ADD_CASES[7]), ("min", ADD_CASES[3])]


@pytest.mark.parametrize("seed,op,case", [(s, op, c) for s, (op, c) in enumerate(JOIN_CASES)])
def test_join_matches_golden(seed, op, case):
    a_type, b_type, lanes, zps, mults, image = case
    dut = AddCore(a_type, b_type, lanes, zero_points=zps, multipliers=mults, op=op)
    a, b = add_inputs(np.random.default_rng(seed), a_type, b_type, image, 3)
    expected = channels_last(golden.join(a, b, zps, mults, op))
    got = []
    simulate(dut,
             sender(dut.i_a, to_transfers(channels_last(a), lanes),
                    np.random.default_rng([seed, 1]), IDLE_PHASES, []),
             sender(dut.i_b, to_transfers(channels_last(b), lanes),
                    np.random.default_rng([seed, 2]), rotated(IDLE_PHASES, 2), []),
             receiver(dut.o_stream, expected.size // lanes, np.random.default_rng([seed, 3]),
                      STALL_PHASES, got))
    np.testing.assert_array_equal(np.array(got).reshape(expected.shape), expected)
    # The output range is the exact one over every pair of input values.
    lo_a, hi_a = shape_range(a_type)
    lo_b, hi_b = shape_range(b_type)
    va, vb = np.meshgrid(np.arange(lo_a, hi_a + 1), np.arange(lo_b, hi_b + 1))
    v = golden.join(va.reshape(-1, 1), vb.reshape(-1, 1), zps, mults, op)
    assert dut.out_range == (v.min(), v.max())
    assert dut.out_shape == narrowest(v.min(), v.max())


@pytest.mark.parametrize("case", ADD_CASES[:4])
def test_add_timing(case):
    a_type, b_type, lanes, zps, mults, image = case
    dut = AddCore(a_type, b_type, lanes, zero_points=zps, multipliers=mults)
    a, b = add_inputs(np.random.default_rng(5), a_type, b_type, image, 2)
    items_a = to_transfers(channels_last(a), lanes)
    items_b = to_transfers(channels_last(b), lanes)
    n = len(items_a)
    times = {}
    simulate(dut, timed_sender(dut.i_a, items_a, times, "a"),
             timed_sender(dut.i_b, items_b, times, "b"),
             timed_receiver(dut.o_stream, n, times, "out"))
    expected = channels_last(golden.add(a, b, zps, mults))
    np.testing.assert_array_equal(np.array(times["out_items"]).reshape(expected.shape),
                                  expected)
    np.testing.assert_array_equal(times["a"], np.arange(n))
    np.testing.assert_array_equal(times["b"], np.arange(n))
    # Input registers, products, output register.
    np.testing.assert_array_equal(np.array(times["out"]) - times["a"], 3)
    assert times["out"][-1] - times["a"][0] == add_latency(n) == n + 2
    assert dut.latency == ADD_LATENCY == 3
    assert dut.cycles == 1
    assert add_cycles(n) == n


def test_add_waits_for_both_inputs():
    # Input b starts late: nothing is taken from a before b is valid.
    dut = AddCore(signed(8), signed(8), 1, zero_points=(1, 2), multipliers=(3, 4))
    x = random_values(np.random.default_rng(6), signed(8), (2, 8))
    times = {}
    late = 9

    async def late_b(ctx):
        await ctx.tick().repeat(late)
        times["b"] = [t + late for t in await stream_send(ctx, dut.i_b, to_transfers(x[1], 1))]

    simulate(dut, timed_sender(dut.i_a, to_transfers(x[0], 1), times, "a"), late_b,
             timed_receiver(dut.o_stream, 8, times, "out"))
    np.testing.assert_array_equal(times["a"], late + np.arange(8))
    np.testing.assert_array_equal(times["a"], times["b"])
    np.testing.assert_array_equal(np.array(times["out_items"]).reshape(-1),
                                  golden.add(x[:1], x[1:], (1, 2), (3, 4)).reshape(-1))


# ---------------------------------------------------------------------------------------------
# ConcatCore

# Channel concatenation of images: (shape, lanes, channels per input, H, W)
CONCAT_IMAGE_CASES = [
    (IntType(8, True), 2, [4, 2], 3, 3),
    (IntType(4, False), 1, [1, 3, 2], 2, 3),
    (IntType(6, True), 4, [8, 4, 4], 2, 2),
    (IntType(1, False), 3, [3, 6], 1, 4),
    (IntType(16, True), 2, [2, 2, 2, 2], 2, 1),
]


def run_concat(dut, streams, n_out, seed):
    got = []
    benches = [sender(dut.i_stream[k], s, np.random.default_rng([seed, 1, k]),
                      rotated(IDLE_PHASES, k))
               for k, s in enumerate(streams)]
    benches.append(receiver(dut.o_stream, n_out, np.random.default_rng([seed, 2]),
                            STALL_PHASES, got))
    simulate(dut, *benches)
    return np.array(got)


@pytest.mark.parametrize("seed,case", list(enumerate(CONCAT_IMAGE_CASES)))
def test_concat_images(seed, case):
    t, lanes, channels, h, w = case
    rng = np.random.default_rng(seed)
    batch = 3
    xs = [random_values(rng, t, (batch, c, h, w)) for c in channels]
    dut = ConcatCore(t, lanes, [c // lanes for c in channels])
    got = run_concat(dut, [to_transfers(channels_last(x), lanes) for x in xs],
                     batch * sum(channels) * h * w // lanes, seed)
    expected = channels_last(np.concatenate(xs, axis=1))
    np.testing.assert_array_equal(got.reshape(expected.shape), expected)
    layer = ConcatLayer("cat", [t] * len(xs), [(c, h, w) for c in channels], 0, t,
                        [[] for _ in xs], lanes=lanes)
    np.testing.assert_array_equal(got.reshape(expected.shape),
                                  channels_last(golden.run_layer(layer, *xs)))


# Concatenation of flat vectors: (shape, lanes, size per input)
CONCAT_VECTOR_CASES = [
    (signed(8), 2, [6, 4]),
    (unsigned(3), 1, [5, 1, 2]),
    (signed(5), 4, [4, 12]),
]


@pytest.mark.parametrize("seed,case", list(enumerate(CONCAT_VECTOR_CASES)))
def test_concat_vectors(seed, case):
    shape, lanes, sizes = case
    rng = np.random.default_rng(seed + 10)
    batch = 5
    xs = [random_values(rng, shape, (batch, s)) for s in sizes]
    dut = ConcatCore(shape, lanes, [s // lanes for s in sizes])
    got = run_concat(dut, [to_transfers(x, lanes) for x in xs], batch * sum(sizes) // lanes,
                     seed + 10)
    expected = np.concatenate(xs, axis=1)
    np.testing.assert_array_equal(got.reshape(expected.shape), expected)
    t = IntType(Shape.cast(shape).width, Shape.cast(shape).signed)
    layer = ConcatLayer("cat", [t] * len(xs), [(s,) for s in sizes], 0, t, [[] for _ in xs],
                        lanes=lanes)
    np.testing.assert_array_equal(got.reshape(expected.shape), golden.run_layer(layer, *xs))


@pytest.mark.parametrize("chunks", [[1, 1], [2, 1], [1, 3, 2], [4, 4, 1, 2]])
def test_concat_timing(chunks):
    # Every input valid in every cycle: input k is taken only in its turn, the output runs at
    # one transfer per cycle, each transfer one cycle after it was taken.
    dut = ConcatCore(signed(8), 2, chunks)
    rounds = 3
    total = sum(chunks)
    rng = np.random.default_rng(7)
    xs = [random_values(rng, signed(8), (rounds * c, 2)) for c in chunks]
    times = {}
    benches = [timed_sender(dut.i_stream[k], to_transfers(x, 2), times, f"in{k}")
               for k, x in enumerate(xs)]
    benches.append(timed_receiver(dut.o_stream, rounds * total, times, "out"))
    simulate(dut, *benches)
    expected = np.concatenate([x.reshape(rounds, c, 2) for x, c in zip(xs, chunks)], axis=1)
    np.testing.assert_array_equal(times["out_items"], expected.reshape(-1, 2))
    np.testing.assert_array_equal(times["out"], 1 + np.arange(rounds * total))
    start = np.cumsum([0] + chunks[:-1])
    for k, c in enumerate(chunks):
        turn = (np.arange(rounds)[:, None] * total + start[k] + np.arange(c)).reshape(-1)
        np.testing.assert_array_equal(times[f"in{k}"], turn)
    assert times["out"][-1] - times["in0"][0] == concat_latency(chunks, rounds) == rounds * total
    assert concat_cycles(chunks, rounds) == rounds * total
    assert dut.cycles == total
    assert dut.latency == total
    assert CONCAT_LATENCY == 1


def test_concat_stalls_on_the_input_in_turn():
    # Input 1 starts late: the output stops after input 0's chunk, input 0 is not taken
    # further, and everything resumes when input 1 comes.
    dut = ConcatCore(unsigned(4), 1, [2, 1])
    x0, x1 = np.arange(6).reshape(6, 1), np.arange(10, 13).reshape(3, 1)
    times = {}
    late = 8

    async def late_1(ctx):
        await ctx.tick().repeat(late)
        times["in1"] = [t + late for t in await stream_send(ctx, dut.i_stream[1],
                                                            to_transfers(x1, 1))]

    simulate(dut, timed_sender(dut.i_stream[0], to_transfers(x0, 1), times, "in0"), late_1,
             timed_receiver(dut.o_stream, 9, times, "out"))
    np.testing.assert_array_equal(np.array(times["out_items"]).reshape(-1),
                                  [0, 1, 10, 2, 3, 11, 4, 5, 12])
    assert times["in0"][:3] == [0, 1, late + 1]
    assert times["in1"] == [late, late + 3, late + 6]


# ---------------------------------------------------------------------------------------------
# Composition, Verilog, errors


def test_residual_join_composes():
    # A fork feeding both inputs of an add (x + x, the degenerate residual block) through
    # wiring.connect: the array member element is an ordinary stream interface.
    class Fork(wiring.Component):
        def __init__(self):
            super().__init__({
                "i_stream": In(stream.Signature(data.ArrayLayout(signed(6), 2))),
                "o_stream": Out(stream.Signature(data.ArrayLayout(signed(9), 2))),
            })

        def elaborate(self, platform):
            m = Module()
            m.submodules.bc = bc = BroadcastCore(signed(6), 2, 2)
            m.submodules.add = add = AddCore(signed(6), signed(6), 2, (1, -2), (3, 1))
            wiring.connect(m, wiring.flipped(self.i_stream), bc.i_stream)
            wiring.connect(m, bc.o_stream[0], add.i_a)
            wiring.connect(m, bc.o_stream[1], add.i_b)
            wiring.connect(m, add.o_stream, wiring.flipped(self.o_stream))
            return m

    # signed(9): the output port of Fork; wiring.connect checks it against the AddCore's.
    dut = Fork()
    x = random_values(np.random.default_rng(8), signed(6), (40, 2))
    got = []
    simulate(dut, sender(dut.i_stream, to_transfers(x, 2), np.random.default_rng(9),
                         IDLE_PHASES),
             receiver(dut.o_stream, 40, np.random.default_rng(10), STALL_PHASES, got))
    np.testing.assert_array_equal(np.array(got), golden.add(x, x, (1, -2), (3, 1)))


@pytest.mark.parametrize("dut,ports", [
    (lambda: BroadcastCore(signed(8), 2, 3),
     ["input [15:0] i_stream__payload", "output [15:0] o_stream__2__payload",
      "output o_stream__0__valid", "input o_stream__1__ready"]),
    (lambda: AddCore(IntType(8, True), IntType(4, False), 2, (1, 3), (5, -2)),
     ["input [15:0] i_a__payload", "input [7:0] i_b__payload",
      "output [21:0] o_stream__payload"]),
    (lambda: ConcatCore(unsigned(3), 2, [1, 3, 2]),
     ["input [5:0] i_stream__0__payload", "output i_stream__2__ready",
      "output [5:0] o_stream__payload"]),
])
def test_verilog(dut, ports):
    text = verilog.convert(dut(), name="joins")
    assert "module joins(" in text
    for port in ports:
        assert f"{port};" in text


def test_join_errors():
    with pytest.raises(ValueError, match=r"^Outputs must be at least 2, not 1$"):
        BroadcastCore(signed(8), 1, 1)
    with pytest.raises(TypeError, match=r"^Outputs must be an integer, not 2.0$"):
        BroadcastCore(signed(8), 1, 2.0)
    with pytest.raises(ValueError, match=r"^Lanes must be at least 1, not 0$"):
        BroadcastCore(signed(8), 0, 2)
    with pytest.raises(TypeError, match=r"^Element shape must be an IntType or an integer "
                                        r"shape, not 'int8'$"):
        BroadcastCore("int8", 1, 2)
    with pytest.raises(TypeError, match=r"^Zero points must be a pair of integers, "
                                        r"not \(1, 2, 3\)$"):
        AddCore(signed(8), signed(8), 1, zero_points=(1, 2, 3))
    with pytest.raises(TypeError, match=r"^Multipliers must be a pair of integers, "
                                        r"not \(1, 0.5\)$"):
        AddCore(signed(8), signed(8), 1, multipliers=(1, 0.5))
    with pytest.raises(TypeError, match=r"^Multipliers must be a pair of integers, not 3$"):
        AddCore(signed(8), signed(8), 1, multipliers=3)
    with pytest.raises(ValueError, match=r"^Lanes must be at least 1, not -1$"):
        AddCore(signed(8), signed(8), -1)
    with pytest.raises(TypeError, match=r"^Element shape must be an IntType or an integer "
                                        r"shape, not None$"):
        AddCore(signed(8), None, 1)
    with pytest.raises(ValueError, match=r"^Op must be one of add, mul, min, max, not 'sub'$"):
        AddCore(signed(8), signed(8), 1, op="sub")
    with pytest.raises(ValueError, match=r"^Chunks must have at least 2 entries, not \[3\]$"):
        ConcatCore(signed(8), 1, [3])
    with pytest.raises(TypeError, match=r"^Chunks must be a list of integers, not 3$"):
        ConcatCore(signed(8), 1, 3)
    with pytest.raises(ValueError, match=r"^Chunk 1 must be at least 1, not 0$"):
        ConcatCore(signed(8), 1, [2, 0])
    with pytest.raises(TypeError, match=r"^Chunk 0 must be an integer, not '2'$"):
        ConcatCore(signed(8), 1, ["2", 1])
    with pytest.raises(ValueError, match=r"^Transfers must be at least 1, not 0$"):
        broadcast_latency(0)
    with pytest.raises(TypeError, match=r"^Transfers must be an integer, not 1.5$"):
        add_cycles(1.5)
    with pytest.raises(ValueError, match=r"^Rounds must be at least 1, not 0$"):
        concat_latency([1, 2], 0)
    with pytest.raises(ValueError, match=r"^Chunks must have at least 2 entries, not \(\)$"):
        concat_cycles(())
