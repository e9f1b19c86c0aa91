"""Core tests: every hw core in amaranth.sim against the golden model, under random stalls."""

import dataclasses

import numpy as np
import pytest
from amaranth import C, Module, Shape, Signal, signed, unsigned
from amaranth.hdl import Elaboratable, Fragment

from onnx2fpga.hw import arith, memory
from onnx2fpga.hw.matvec import MatVecCore
from onnx2fpga.hw.plumbing import StreamFIFO, WidthConverter
from onnx2fpga.hw.requant import RequantCore
from onnx2fpga.hw.testing import (
    random_values,
    run_stream,
    run_timed,
    shape_range,
    simulate,
    stream_send,
    timed_receiver,
    to_transfers,
)
from onnx2fpga.ir.layers import DenseLayer
from onnx2fpga.ir.stages import RequantStage
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan import cost
from onnx2fpga.plan import requant as requant_timing
from onnx2fpga.plan.cores import core_kind
from onnx2fpga.plan.stage import Stage
from onnx2fpga.plan.thresholds import sign_split
from onnx2fpga.sim import golden


def random_ints(rng, t: IntType, shape):
    return rng.integers(t.lo, t.hi, size=shape, endpoint=True)


# ---------------------------------------------------------------------------------------------
# MatVecCore

def make_dense(seed, in_type, in_zp, w_bits, in_features, out_features, simd, pe):
    rng = np.random.default_rng(seed)
    wt = IntType(w_bits, True)
    weight = random_ints(rng, wt, (out_features, in_features))
    weight[0, 0] = wt.lo            # the extremes of the weight type occur
    weight[-1, -1] = wt.hi
    bias = rng.integers(-(1 << (w_bits + in_type.bits)), 1 << (w_bits + in_type.bits),
                        size=out_features)
    return DenseLayer("fc", in_type, in_zp, weight, wt, bias, [], simd=simd, pe=pe)


def matvec_depth(simd):
    """MatVecCore's pipeline registers as its docstring states them: memory data, operand
    registers, products, then one adder-tree stage per two adder levels (ceil(log2(simd)))."""
    if simd <= 4:           # 0..2 levels: one tree stage
        return 4
    if simd <= 16:          # 3..4 levels: two
        return 5
    return 6                # 5..6 levels: three (up to 64)


# (in_type, in_zero_point, weight bits, in_features, out_features, simd, pe)
MATVEC_CASES = [
    (IntType(8, False), 0, 8, 8, 4, 2, 2),
    (IntType(8, True), -3, 4, 6, 6, 3, 2),
    (IntType(4, False), 7, 2, 4, 3, 1, 1),
    (IntType(2, True), 0, 16, 4, 4, 4, 4),        # one fold, one group: fully parallel
    (IntType(1, False), 0, 3, 5, 2, 5, 1),        # binary input, simd = in_features
    (IntType(16, True), 100, 5, 6, 4, 2, 4),      # pe = out_features
    (IntType(3, True), 1, 8, 9, 6, 3, 3),
    (IntType(5, False), 12, 12, 8, 2, 1, 2),      # eight folds of one element
    (IntType(8, True), 5, 8, 18, 4, 9, 2),        # two adder-tree stages, odd term count
    (IntType(8, False), 0, 8, 40, 3, 20, 3),      # three adder-tree stages
    (IntType(8, True), 3, 6, 16, 24, 8, 2),       # 12 groups: stalls reach two enable shares
]


@pytest.mark.parametrize("seed,case", list(enumerate(MATVEC_CASES)))
def test_matvec_matches_golden(seed, case):
    layer = make_dense(seed, *case)
    dut = MatVecCore(layer)
    rng = np.random.default_rng([seed, 0])
    vectors = 5
    x = random_ints(rng, layer.in_type, (vectors, layer.in_features))
    x[0, :] = layer.in_type.lo
    x[1, :] = layer.in_type.hi
    expected = golden.run_layer(layer, x)        # no requant stages: the accumulators
    got = run_stream(dut, to_transfers(x, layer.simd), vectors * layer.out_features // layer.pe,
                     seed)
    np.testing.assert_array_equal(np.array(got).reshape(vectors, -1), expected)


@pytest.mark.parametrize("case", [MATVEC_CASES[0], MATVEC_CASES[2], MATVEC_CASES[3],
                                  MATVEC_CASES[5], MATVEC_CASES[8], MATVEC_CASES[9]])
def test_matvec_timing(case):
    layer = make_dense(0, *case)
    dut = MatVecCore(layer)
    folds = layer.in_features // layer.simd
    groups = layer.out_features // layer.pe
    vectors = 4
    x = random_ints(np.random.default_rng(0), layer.in_type, (vectors, layer.in_features))
    times = run_timed(dut, to_transfers(x, layer.simd), vectors * groups)
    np.testing.assert_array_equal(np.array(times["out_items"]).reshape(vectors, -1),
                                  golden.run_layer(layer, x))
    t_in = np.array(times["in"]).reshape(vectors, folds)
    t_out = np.array(times["out"]).reshape(vectors, groups)
    latency = t_out[0, -1] - t_in[0, 0]
    assert latency == folds + folds * groups + matvec_depth(layer.simd)
    assert cost.layer_latency(layer) == latency == dut.latency
    # Steady state: one vector every folds*groups cycles, no bubbles between vectors.
    np.testing.assert_array_equal(np.diff(t_out[:, -1]), folds * groups)
    assert cost.layer_cycles(layer) == layer.cycles == folds * groups


@pytest.mark.parametrize("case, idle", [(MATVEC_CASES[0], 0.7), (MATVEC_CASES[3], 0.5),
                                        (MATVEC_CASES[8], 0.9), (MATVEC_CASES[9], 0.3),
                                        (MATVEC_CASES[10], 0.5)])
def test_matvec_follows_a_paced_input(case, idle):
    """Vectors at an irregular pace (a convolution's pixels from a window fed by a slower
    core): every output transfer leaves in the cycle the latency model's trace says."""
    layer = make_dense(0, *case)
    dut = MatVecCore(layer)
    vectors, groups = 6, layer.out_features // layer.pe
    x = random_ints(np.random.default_rng(1), layer.in_type, (vectors, layer.in_features))
    times = {}

    async def send(ctx):
        times["in"] = await stream_send(ctx, dut.i_stream, to_transfers(x, layer.simd),
                                        rng=np.random.default_rng(2), idle=idle)

    simulate(dut, send, timed_receiver(dut.o_stream, vectors * groups, times, "out"))
    np.testing.assert_array_equal(np.array(times["out_items"]).reshape(vectors, -1),
                                  golden.run_layer(layer, x))
    stage = Stage("matvec", "fc", layer.in_type, layer.in_type, layer.simd, layer.pe,
                  vectors * layer.out_features, params={"layer": layer},
                  in_size=vectors * layer.in_features)
    trace = core_kind(stage).trace(stage, [np.array(times["in"])])
    np.testing.assert_array_equal(times["out"], trace)


# (in_type, in_zero_point, weight type, in_features, out_features, simd, pe): weights of 4 or
# more bits, signed (even and odd widths: a two- or one-bit signed top digit) and unsigned.
MATVEC_ICE40_CASES = [
    (IntType(8, True), 0, IntType(8, True), 16, 4, 4, 1),
    (IntType(8, False), 3, IntType(5, True), 6, 6, 3, 2),
    (IntType(4, True), -1, IntType(4, True), 4, 4, 2, 2),
    (IntType(12, True), 0, IntType(7, False), 4, 2, 2, 1),
    (IntType(2, False), 0, IntType(16, True), 4, 4, 4, 4),
]


@pytest.mark.parametrize("seed,case", list(enumerate(MATVEC_ICE40_CASES)))
def test_matvec_on_ice40_is_cycle_identical(seed, case):
    # For iCE40 the products are sums of multiples of x picked by the weights' radix-4 digits
    # (LUT multipliers): the same values on the same cycles as the emitted Verilog's.
    from amaranth_boards.icebreaker import ICEBreakerPlatform
    in_type, in_zp, wt, in_features, out_features, simd, pe = case
    rng = np.random.default_rng(seed)
    weight = random_ints(rng, wt, (out_features, in_features))
    weight[0, :2] = [wt.lo, wt.hi]           # the extremes of the weight type occur
    bias = rng.integers(-1000, 1000, size=out_features)
    layer = DenseLayer("fc", in_type, in_zp, weight, wt, bias, [], simd=simd, pe=pe)
    vectors = 4
    x = random_ints(rng, in_type, (vectors, in_features))
    x[0, :] = in_type.lo
    x[1, :] = in_type.hi
    expected = golden.run_layer(layer, x)
    timed = []
    for platform in (None, ICEBreakerPlatform()):
        dut = MatVecCore(layer)
        times = run_timed(_ElaboratedFor(dut, platform), to_transfers(x, simd),
                          vectors * out_features // pe)
        np.testing.assert_array_equal(np.array(times["out_items"]).reshape(vectors, -1),
                                      expected)
        timed.append((times["in"], times["out"]))
    assert timed[0] == timed[1]


@pytest.mark.parametrize("seed,case", list(enumerate(MATVEC_ICE40_CASES)))
def test_matvec_lut_multipliers_take_no_dsp_and_the_same_cycles(seed, case):
    # multipliers="lut": the products are built in LUTs on every platform (the emitted
    # Verilog, which the ECP5 build synthesizes, included): the same values on the same
    # cycles as the hard multipliers', and not one MULT18X18D in yosys' reading of it.
    from onnx2fpga.hw.resources import netlist_features
    in_type, in_zp, wt, in_features, out_features, simd, pe = case
    rng = np.random.default_rng([seed, 7])
    weight = random_ints(rng, wt, (out_features, in_features))
    weight[0, :2] = [wt.lo, wt.hi]
    bias = rng.integers(-1000, 1000, size=out_features)
    x = random_ints(rng, in_type, (4, in_features))
    x[0, :], x[1, :] = in_type.lo, in_type.hi
    timed, dsps = [], []
    for mult in ("dsp", "lut"):
        layer = DenseLayer("fc", in_type, in_zp, weight, wt, bias, [], simd=simd, pe=pe,
                           multipliers=mult)
        times = run_timed(MatVecCore(layer), to_transfers(x, simd), 4 * out_features // pe)
        np.testing.assert_array_equal(np.array(times["out_items"]).reshape(4, -1),
                                      golden.run_layer(layer, x))
        timed.append((times["in"], times["out"]))
        dsps.append(netlist_features(MatVecCore(layer), "ecp5")["dsp"])
    assert timed[0] == timed[1]
    wide = min(in_type.bits, wt.bits) > arith.LUT_PRODUCT_MAX_BITS
    assert dsps == ([simd * pe, 0] if wide else [0, 0])


# (in_type, in_zero_point, weight bits, in_features, out_features, simd, pe, platform): weight
# ROMs of 256 (4 banks of 64), 320 (5 of 64: the last one holding 64 words) and 130 words (3
# banks of 64, the last one holding 2 words); the iCE40 case reads digit terms from the banks.
MATVEC_BANKED_CASES = [
    (IntType(8, True), 0, 3, 16, 16, 1, 1, None),
    (IntType(4, False), 5, 2, 20, 32, 1, 2, None),
    (IntType(8, True), -2, 6, 10, 26, 1, 2, "ice40"),
]


def _same_values_and_cycles(layer, platform, x, seed, make):
    """Cores ``make(False)`` (the reference) and ``make(True)``, elaborated for ``platform``,
    both give golden's values for the vectors ``x``, without stalls and under stalls, and
    take and give their transfers on the same cycles."""
    vectors = len(x)
    expected = golden.run_layer(layer, x)
    outputs = vectors * layer.out_features // layer.pe
    timed = []
    for flag in (False, True):
        times = run_timed(_ElaboratedFor(make(flag), platform), to_transfers(x, layer.simd),
                          outputs)
        np.testing.assert_array_equal(np.array(times["out_items"]).reshape(vectors, -1),
                                      expected)
        timed.append((times["in"], times["out"]))
        got = run_stream(_ElaboratedFor(make(flag), platform), to_transfers(x, layer.simd),
                         outputs, seed)
        np.testing.assert_array_equal(np.array(got).reshape(vectors, -1), expected)
    assert timed[0] == timed[1]


@pytest.mark.parametrize("seed,case", list(enumerate(MATVEC_BANKED_CASES)))
def test_matvec_banked_weight_rom_is_cycle_identical(seed, case):
    # Weights in soft logic (w_logic) are read in two steps from banks: the same values on the
    # same cycles as one memory, under stalls too, and the banks as logic_rom_banks says.
    from amaranth_boards.icebreaker import ICEBreakerPlatform
    *dense, platform = case
    layer = make_dense(seed, *dense)
    platform = ICEBreakerPlatform() if platform else None
    depth = layer.in_features // layer.simd * layer.out_features // layer.pe
    for w_logic in (False, True):
        assert MatVecCore(layer, w_logic=w_logic).w_banks == \
            ({256: 4, 320: 5, 130: 3}[depth] if w_logic else 1)
    x = random_ints(np.random.default_rng([seed, 3]), layer.in_type, (3, layer.in_features))
    _same_values_and_cycles(layer, platform, x, seed,
                            lambda w_logic: MatVecCore(layer, w_logic=w_logic))


# (dense layer, platform, weights in banks too): 40 folds of one 8-bit element; 20 folds of
# two 4-bit elements; one fold; 34 folds of 2-bit elements with 4-bit weights on iCE40 (the
# buffer holds the digit multiples too), the weights banked as well.
MATVEC_X_LOGIC_CASES = [
    (IntType(8, True), 3, 5, 40, 3, 1, 1, None, False),
    (IntType(4, False), 0, 3, 40, 4, 2, 2, None, False),
    (IntType(3, True), -1, 4, 6, 4, 6, 2, None, False),
    (IntType(2, True), 0, 4, 68, 4, 2, 1, "ice40", True),
]


@pytest.mark.parametrize("seed,case", list(enumerate(MATVEC_X_LOGIC_CASES)))
def test_matvec_shift_register_input_buffer_is_cycle_identical(seed, case):
    # An input buffer in soft logic (x_logic) is a pair of shift registers, no memory: the
    # same values on the same cycles as the memory, under stalls too.
    from amaranth.hdl import Fragment, _nir
    from amaranth.hdl._ir import build_netlist
    from amaranth_boards.icebreaker import ICEBreakerPlatform
    *dense, platform, w_logic = case
    layer = make_dense(seed, *dense)
    platform = ICEBreakerPlatform() if platform else None
    for x_logic in (False, True):
        dut = MatVecCore(layer, w_logic=w_logic, x_logic=x_logic)
        netlist = build_netlist(Fragment.get(dut, platform), name="top")
        memories = [c.name for c in netlist.cells if isinstance(c, _nir.Memory)]
        assert ("x_mem" in memories) != x_logic, memories
    x = random_ints(np.random.default_rng([seed, 4]), layer.in_type, (4, layer.in_features))
    _same_values_and_cycles(layer, platform, x, seed,
                            lambda x_logic: MatVecCore(layer, w_logic=w_logic,
                                                       x_logic=x_logic))


@pytest.mark.parametrize("platform", [None, "ice40"])
@pytest.mark.parametrize("simd,pe,zero_columns", [(8, 2, [0, 5]), (4, 1, list(range(8)))])
def test_matvec_leaves_out_products_of_inputs_no_output_uses(simd, pe, zero_columns, platform):
    # Weight columns that are 0 for every output (TFC_2W2A: 231 of its 784 input pixels) take
    # no product and no adder (8 x 2: two lanes; 4 x 1 over two folds: every lane, so the
    # tree sums nothing). The same values, under stalls too, and cycles as with those
    # weights 1, and fewer adder bits in the netlist.
    from amaranth_boards.icebreaker import ICEBreakerPlatform

    from onnx2fpga.hw.resources import netlist_features
    layer = make_dense(3, IntType(4, False), 2, 2, 8, 4, simd, pe)
    layer.weight[:, zero_columns] = 0
    ones = dataclasses.replace(layer, weight=np.where(layer.weight == 0, 1, layer.weight))
    plat = ICEBreakerPlatform() if platform else None
    x = random_ints(np.random.default_rng(4), layer.in_type, (5, layer.in_features))
    outputs = 5 * layer.out_features // pe
    timed = []
    for ly in (layer, ones):
        times = run_timed(_ElaboratedFor(MatVecCore(ly), plat), to_transfers(x, simd), outputs)
        np.testing.assert_array_equal(np.array(times["out_items"]).reshape(5, -1),
                                      golden.run_layer(ly, x))
        timed.append((times["in"], times["out"]))
    assert timed[0] == timed[1]
    got = run_stream(_ElaboratedFor(MatVecCore(layer), plat), to_transfers(x, simd), outputs, 4)
    np.testing.assert_array_equal(np.array(got).reshape(5, -1), golden.run_layer(layer, x))
    fam = "ice40" if platform else "ecp5"
    assert netlist_features(MatVecCore(layer), fam)["add"] < \
        netlist_features(MatVecCore(ones), fam)["add"]


def test_logic_rom_banks():
    # Banks of 64 words, none empty; one step up to 128 words.
    for depth in range(129, 70000, 37):
        banks = memory.logic_rom_banks(depth)
        assert (banks - 1) * 64 < depth <= banks * 64
    assert [memory.logic_rom_banks(d) for d in (1, 2, 100, 128)] == [1, 1, 1, 1]


def test_matvec_errors():
    layer = make_dense(0, IntType(4, False), 0, 4, 6, 4, 4, 2)
    with pytest.raises(ValueError, match=r"^SIMD of layer 'fc' must divide in_features=6, "
                                         r"not 4$"):
        MatVecCore(layer)
    layer = make_dense(0, IntType(4, False), 0, 4, 6, 4, 3, 3)
    with pytest.raises(ValueError, match=r"^PE of layer 'fc' must divide out_features=4, not 3$"):
        MatVecCore(layer)
    layer = make_dense(0, IntType(4, False), 0, 4, 6, 4, 3, 2)
    layer.weight[0, 0] = 8
    with pytest.raises(ValueError, match=r"^Weights of layer 'fc' must lie within int4, "
                                         r"not \[-8, 8\]$"):
        MatVecCore(layer)
    with pytest.raises(TypeError, match=r"^Layer must be a DenseLayer, not 3$"):
        MatVecCore(3)


# ---------------------------------------------------------------------------------------------
# RequantCore

def make_stage(rng, x_range, channels, *, per_channel_m, per_channel_off, shift, rounding,
               out_type, relu=False, in_zp=0):
    """A random stage that maps ``x_range`` onto about 1.5 times its clip range, so that most
    outputs are not clipped and some are; multipliers of both signs, offsets of both signs."""
    x_lo, x_hi = x_range
    zero_point = int(rng.integers(out_type.lo, out_type.hi, endpoint=True)) // 2
    lo = zero_point if relu else out_type.lo
    hi = out_type.hi
    if not relu and out_type.bits > 2:
        lo, hi = lo + 1, hi - 1                  # a clip range inside the type
    n_m = channels if per_channel_m else 1
    n_off = channels if per_channel_off else 1
    target = 1.5 * (hi - lo + 1) * 2 ** shift / (x_hi - x_lo + 1)
    multiplier = np.round(target * rng.uniform(0.5, 1.5, size=n_m)).astype(np.int64)
    multiplier = np.maximum(multiplier, 1) * rng.choice([-1, 1], size=n_m)
    centre = (x_lo + x_hi) / 2 - in_zp
    m_for_off = np.resize(multiplier, n_off)
    noise = rng.uniform(-0.125, 0.125, size=n_off) * (hi - lo) * 2 ** shift
    offset = ((lo + hi) / 2 - zero_point) * 2 ** shift - centre * m_for_off + noise
    return RequantStage(multiplier, np.round(offset).astype(np.int64), shift, zero_point, lo, hi,
                        out_type, in_zero_point=in_zp, rounding=rounding)


# (in_shape, channels, lanes, stages: tuples of make_stage keywords)
REQUANT_CASES = [
    (signed(16), 4, 2, [dict(per_channel_m=True, per_channel_off=True, shift=14,
                             rounding="half_even", out_type=IntType(8, True))]),
    (signed(12), 6, 3, [dict(per_channel_m=False, per_channel_off=False, shift=9,
                             rounding="half_away", out_type=IntType(4, False), relu=True)]),
    (unsigned(8), 3, 2, [dict(per_channel_m=True, per_channel_off=True, shift=8,
                              rounding="half_even", out_type=IntType(8, True), in_zp=5),
                         dict(per_channel_m=False, per_channel_off=True, shift=9,
                              rounding="half_away", out_type=IntType(4, False), in_zp=-3)]),
    (signed(12), 8, 1, [dict(per_channel_m=True, per_channel_off=False, shift=0,
                             rounding="half_even", out_type=IntType(16, True))]),
    (signed(6), 1, 4, [dict(per_channel_m=False, per_channel_off=False, shift=2,
                            rounding="half_away", out_type=IntType(6, True)),
                       dict(per_channel_m=False, per_channel_off=False, shift=3,
                            rounding="half_even", out_type=IntType(5, True),
                            in_zp=2),
                       dict(per_channel_m=False, per_channel_off=False, shift=1,
                            rounding="half_away", out_type=IntType(2, False))]),
    (unsigned(1), 2, 2, [dict(per_channel_m=True, per_channel_off=True, shift=2,
                              rounding="half_even", out_type=IntType(3, True))]),
    (signed(24), 5, 5, [dict(per_channel_m=True, per_channel_off=True, shift=20,
                             rounding="half_away", out_type=IntType(8, False), relu=True,
                             in_zp=-7)]),
    (signed(10), 4, 8, [dict(per_channel_m=True, per_channel_off=False, shift=5,
                             rounding="half_even", out_type=IntType(7, False), in_zp=1)]),
    # QONNX rounding modes: down, up, towards zero (a chain of all three, and one per-channel).
    (signed(12), 3, 3, [dict(per_channel_m=True, per_channel_off=True, shift=7,
                             rounding="floor", out_type=IntType(8, True)),
                        dict(per_channel_m=False, per_channel_off=False, shift=2,
                             rounding="ceil", out_type=IntType(6, True), in_zp=-1),
                        dict(per_channel_m=False, per_channel_off=True, shift=1,
                             rounding="to_zero", out_type=IntType(5, True), in_zp=1)]),
    (unsigned(9), 4, 2, [dict(per_channel_m=True, per_channel_off=True, shift=6,
                              rounding="to_zero", out_type=IntType(4, False), relu=True)]),
    # Operands wider than one 16-bit partial-product chunk: 2 x 2, 3 x 2 and constant.
    (unsigned(20), 3, 2, [dict(per_channel_m=True, per_channel_off=True, shift=30,
                               rounding="half_even", out_type=IntType(8, True))]),
    (signed(33), 2, 1, [dict(per_channel_m=True, per_channel_off=False, shift=40,
                             rounding="half_away", out_type=IntType(8, True), in_zp=-5)]),
    (signed(20), 4, 4, [dict(per_channel_m=False, per_channel_off=True, shift=28,
                             rounding="half_even", out_type=IntType(8, False), relu=True)]),
]


def build_stages(seed, in_shape, channels, specs):
    rng = np.random.default_rng(seed)
    shape = Shape.cast(in_shape)
    lo = -(1 << (shape.width - 1)) if shape.signed else 0
    hi = (1 << (shape.width - 1)) - 1 if shape.signed else (1 << shape.width) - 1
    stages = []
    for spec in specs:
        stage = make_stage(rng, (lo, hi), channels, **spec)
        stages.append(stage)
        lo, hi = stage.lo, stage.hi
    return stages


@pytest.mark.parametrize("seed,case", list(enumerate(REQUANT_CASES)))
def test_requant_matches_golden(seed, case):
    in_shape, channels, lanes, specs = case
    stages = build_stages(seed, in_shape, channels, specs)
    dut = RequantCore(stages, channels, lanes, in_shape)
    rng = np.random.default_rng([seed, 0])
    # Whole periods of the channel pattern, several times over.
    period = np.lcm(channels, lanes)
    n = int(period * max(2, 48 // period))
    shape = Shape.cast(in_shape)
    lo = -(1 << (shape.width - 1)) if shape.signed else 0
    hi = (1 << (shape.width - 1)) - 1 if shape.signed else (1 << shape.width) - 1
    x = rng.integers(lo, hi, size=n, endpoint=True)
    x[:2] = [lo, hi]
    expected = golden.requant_stages(x.reshape(-1, channels), stages).reshape(-1)
    got = run_stream(dut, to_transfers(x, lanes), n // lanes, seed)
    np.testing.assert_array_equal(np.array(got).reshape(-1), expected)


@pytest.mark.parametrize("mult", [14607848, -(1 << 23) + 5, (1 << 20) + 3, 1 << 17, 65535, -3])
def test_requant_wide_constant_multiplier_in_pieces(mult):
    # One multiplier for every channel (a constant): cut into pieces like the input
    # (zero pieces left out, the top one signed), each piece a product of its own; the values
    # stay the golden model's and every ECP5 hard multiplier is at most 18 x 18 bits.
    from onnx2fpga.hw.resources import netlist_features
    t = IntType(24, True)
    stage = RequantStage([mult], [12345], 30, 3, -128, 127, IntType(8, True))
    dut = RequantCore([stage], 4, 2, t)
    rng = np.random.default_rng(abs(mult) % 1000)
    x = rng.integers(t.lo, t.hi, size=64, endpoint=True)
    x[:4] = [t.lo, t.hi, 0, -1]
    expected = golden.requant_stages(x.reshape(-1, 4), [stage]).reshape(-1)
    got = run_stream(dut, to_transfers(x, 2), len(x) // 2, 3)
    np.testing.assert_array_equal(np.array(got).reshape(-1), expected)
    muls = netlist_features(RequantCore([stage], 4, 2, t), "ecp5")["multipliers"]
    assert all(a <= 18 and b <= 18 for a, b, _ in muls), muls


@pytest.mark.parametrize("rounding", ["half_even", "half_away", "floor", "ceil", "to_zero"])
def test_requant_rounding_ties_exhaustive(rounding):
    # Multiplier 1 and shift 2 over every int7: a quarter of the inputs are exact ties, on both
    # sides of zero; a second stage with shift 1 rounds ties again.
    t = IntType(7, True)
    stages = [RequantStage([1], [0], 2, 0, -16, 15, IntType(5, True), rounding=rounding),
              RequantStage([3], [-1], 1, 1, -16, 15, IntType(5, True), rounding=rounding,
                           in_zero_point=-1)]
    dut = RequantCore(stages, 1, 2, t)
    x = np.arange(t.lo, t.hi + 1)
    expected = golden.requant_stages(x.reshape(-1, 1), stages).reshape(-1)
    got = run_stream(dut, to_transfers(x, 2), len(x) // 2, 7)
    np.testing.assert_array_equal(np.array(got).reshape(-1), expected)


@pytest.mark.parametrize("rounding", ["half_even", "half_away", "floor", "ceil", "to_zero"])
@pytest.mark.parametrize("multiplier, shift, zero_point", [(1, 2, 3), (3, 3, -2), (5, 0, 1)])
def test_requant_clip_boundaries_exhaustive(rounding, multiplier, shift, zero_point):
    """Every int9 through one stage whose output clips on both sides: the core decides the
    clip from the value before rounding (whether the rounded value will be above ``hi`` or
    below ``lo``), which must agree with the golden model at every tie next to the bounds,
    on both sides of zero."""
    t = IntType(9, True)
    stage = RequantStage([multiplier], [-1], shift, zero_point, -20, 17, IntType(6, True),
                         rounding=rounding)
    dut = RequantCore([stage], 1, 2, t)
    x = np.arange(t.lo, t.hi + 1)
    expected = golden.requant_stages(x.reshape(-1, 1), [stage]).reshape(-1)
    assert expected.min() == -20 and expected.max() == 17
    got = run_stream(dut, to_transfers(x, 2), len(x) // 2, 7)
    np.testing.assert_array_equal(np.array(got).reshape(-1), expected)


def test_requant_timing():
    in_shape, channels, lanes, specs = REQUANT_CASES[2]
    stages = build_stages(2, in_shape, channels, specs)
    dut = RequantCore(stages, channels, lanes, in_shape)
    x = np.random.default_rng(0).integers(0, 256, size=24)
    times = run_timed(dut, to_transfers(x, lanes), 12)
    assert dut.latency == 2 + 5 * len(stages) == 12
    np.testing.assert_array_equal(np.array(times["out"]) - np.array(times["in"]), 12)
    np.testing.assert_array_equal(np.diff(times["out"]), 1)


class _ElaboratedFor(Elaboratable):
    """``core`` as elaborated for ``platform`` (a board build), with the core's ports."""

    def __init__(self, core, platform):
        self.core, self.platform = core, platform
        self.i_stream, self.o_stream = core.i_stream, core.o_stream

    def elaborate(self, platform):
        return Fragment.get(self.core, self.platform)


@pytest.mark.parametrize("case", [REQUANT_CASES[0], REQUANT_CASES[2], REQUANT_CASES[6],
                                  REQUANT_CASES[8], REQUANT_CASES[9], REQUANT_CASES[10]])
def test_requant_on_ice40_is_cycle_identical(case):
    # For iCE40 the products are cut differently (LUT multipliers: in the first stage, sums
    # of 0, x, 2x, 3x picked by 4-bit chunks of the multiplier; in later stages the whole
    # input times 8 multiplier bits) and summed in carry-save form: the same values on the
    # same cycles as the emitted Verilog's.
    from amaranth_boards.icebreaker import ICEBreakerPlatform
    in_shape, channels, lanes, specs = case
    stages = build_stages(3, in_shape, channels, specs)
    shape = Shape.cast(in_shape)
    lo, hi = shape_range(shape)
    n = int(np.lcm(channels, lanes)) * 4
    x = np.random.default_rng(3).integers(lo, hi, size=n, endpoint=True)
    expected = golden.requant_stages(x.reshape(-1, channels), stages).reshape(-1)
    timed = []
    for platform in (None, ICEBreakerPlatform()):
        dut = RequantCore(stages, channels, lanes, in_shape)
        times = run_timed(_ElaboratedFor(dut, platform), to_transfers(x, lanes), n // lanes)
        np.testing.assert_array_equal(np.array(times["out_items"]).reshape(-1), expected)
        timed.append((times["in"], times["out"]))
    assert timed[0] == timed[1]


def with_leaky(stage, alpha):
    """``stage`` with a fused LeakyRelu of slope ``alpha`` (a number, or one per channel) on
    its negative side: ``neg_multiplier = round(alpha * multiplier)``, likewise the offset."""
    alpha = np.asarray(alpha, dtype=np.float64)
    return dataclasses.replace(
        stage, neg_multiplier=np.round(alpha * stage.multiplier).astype(np.int64),
        neg_offset=np.round(alpha * stage.offset).astype(np.int64))


# (in_shape, channels, lanes, [(make_stage keywords, alpha or None)])
LEAKY_CASES = [
    # alpha in (0, 1), per-channel parameters, several lanes
    (signed(16), 4, 2, [(dict(per_channel_m=True, per_channel_off=True, shift=14,
                              rounding="half_even", out_type=IntType(8, True)), 0.125)]),
    # alpha > 1, per-tensor
    (signed(12), 3, 3, [(dict(per_channel_m=False, per_channel_off=False, shift=9,
                              rounding="half_away", out_type=IntType(8, True)), 1.75)]),
    # alpha < 0 with an input zero point, per-channel, lanes not dividing the channels
    (unsigned(8), 4, 3, [(dict(per_channel_m=True, per_channel_off=True, shift=8,
                               rounding="half_even", out_type=IntType(6, True), in_zp=100),
                          -0.5)]),
    # one alpha per channel (PRelu-like) on per-tensor positive parameters, one lane
    (signed(10), 5, 1, [(dict(per_channel_m=False, per_channel_off=False, shift=6,
                              rounding="half_away", out_type=IntType(8, True)),
                         [0.1, 0.5, 2.0, -1.0, 0.0])]),
    # no shift, then a plain stage, then a LeakyRelu stage again
    (signed(8), 2, 4, [(dict(per_channel_m=True, per_channel_off=False, shift=0,
                             rounding="half_even", out_type=IntType(12, True)), 0.25),
                       (dict(per_channel_m=False, per_channel_off=False, shift=3,
                             rounding="half_away", out_type=IntType(8, True), in_zp=-2), None),
                       (dict(per_channel_m=False, per_channel_off=True, shift=2,
                             rounding="half_even", out_type=IntType(4, False)), 3.0)]),
]


def build_leaky_stages(seed, in_shape, channels, specs):
    rng = np.random.default_rng(seed)
    lo, hi = shape_range(in_shape)
    stages = []
    for spec, alpha in specs:
        stage = make_stage(rng, (lo, hi), channels, **spec)
        stages.append(stage if alpha is None else with_leaky(stage, alpha))
        lo, hi = stage.lo, stage.hi
    return stages


@pytest.mark.parametrize("seed,case", list(enumerate(LEAKY_CASES)))
def test_requant_leaky_matches_golden(seed, case):
    in_shape, channels, lanes, specs = case
    stages = build_leaky_stages(seed, in_shape, channels, specs)
    dut = RequantCore(stages, channels, lanes, in_shape)
    rng = np.random.default_rng([seed, 0])
    lo, hi = shape_range(in_shape)
    batch = int(np.lcm(channels, lanes) * max(2, 64 // np.lcm(channels, lanes))) // channels
    x = rng.integers(lo, hi, size=(batch, channels), endpoint=True)
    x[0], x[1] = lo, hi
    expected = golden.requant_stages(x, stages)
    # Both sides of the first stage are taken (the test would not test the LeakyRelu if not).
    first = stages[0]
    v = (x - first.in_zero_point) * first.multiplier + first.offset
    assert (v < 0).any() and (v >= 0).any()
    got = run_stream(dut, to_transfers(x, lanes), x.size // lanes, seed)
    np.testing.assert_array_equal(np.array(got).reshape(batch, channels), expected)


@pytest.mark.parametrize("in_shape,multiplier,offset,alpha,signs", [
    (signed(8), [37, -53, 11], [-900, 1500, 0], [0.3, 1.5, -0.75], {-1, 1}),  # both sides
    (unsigned(6), [5, 9, 1], [5, 12, 7], [0.5, 0.5, 0.5], {1}),              # never negative
    (unsigned(6), [-5, -9, -1], [-6, -10, -700], [0.5, 2.0, -1.0], {-1}),    # always negative
    (signed(5), [0, 7, -7], [-3, 0, 0], [2.0, 0.5, 0.5], {-1, 1}),           # zero multiplier
])
def test_requant_leaky_exhaustive(in_shape, multiplier, offset, alpha, signs):
    # Every input value on every channel: the product's sign boundary and the extremes of
    # both sides all occur, so a value range computed too narrow would wrap somewhere.
    channels = 3
    lo, hi = shape_range(in_shape)
    stage = with_leaky(RequantStage(multiplier, offset, 4, -3, -128, 127, IntType(8, True),
                                    in_zero_point=1), alpha)
    x = np.stack([np.roll(np.arange(lo, hi + 1), 7 * c) for c in range(channels)], axis=1)
    v = (x - 1) * np.array(multiplier) + np.array(offset)
    assert set(np.unique(np.where(v < 0, -1, 1))) == signs
    dut = RequantCore([stage], channels, 3, in_shape)
    expected = golden.requant_stages(x, [stage])
    got = run_stream(dut, to_transfers(x, 3), len(x), 11)
    np.testing.assert_array_equal(np.array(got).reshape(-1, channels), expected)


def test_sign_split_brute_force():
    # The split of the input range by the sign of x * m + off, which sizes the LeakyRelu
    # product register, against counting every x.
    for m in range(-4, 5):
        for off in range(-13, 14):
            for lo, hi in ((-6, 5), (0, 7), (3, 3), (-9, -2)):
                xs = np.arange(lo, hi + 1)
                neg, pos = xs[xs * m + off < 0], xs[xs * m + off >= 0]
                expect = tuple((int(p.min()), int(p.max())) if p.size else None
                               for p in (neg, pos))
                assert sign_split(m, off, lo, hi) == expect, (m, off, lo, hi)


def test_requant_leaky_timing():
    # The LeakyRelu selection lives inside the offset step: the latency stays 2 + 5 * stages.
    in_shape, channels, lanes, specs = LEAKY_CASES[4]
    stages = build_leaky_stages(4, in_shape, channels, specs)
    dut = RequantCore(stages, channels, lanes, in_shape)
    x = np.random.default_rng(0).integers(-128, 128, size=(16, channels))
    times = run_timed(dut, to_transfers(x, lanes), x.size // lanes)
    np.testing.assert_array_equal(np.array(times["out_items"]).reshape(-1, channels),
                                  golden.requant_stages(x, stages))
    assert dut.latency == requant_timing.requant_latency(3) == 17
    np.testing.assert_array_equal(np.array(times["out"]) - np.array(times["in"]), 17)
    np.testing.assert_array_equal(np.diff(times["out"]), 1)


def test_requant_errors():
    stage = RequantStage([1, 2], [0], 0, 0, 0, 3, IntType(2, False))
    with pytest.raises(ValueError, match=r"^Stage 0 multiplier must have 1 or 3 entries, "
                                         r"not 2$"):
        RequantCore([stage], 3, 1, signed(8))
    with pytest.raises(ValueError, match=r"^Stages must be a non-empty list of RequantStage, "
                                         r"not \[\]$"):
        RequantCore([], 3, 1, signed(8))
    with pytest.raises(TypeError, match=r"^Stage 0 must be a RequantStage, not 'x'$"):
        RequantCore(["x"], 3, 1, signed(8))
    with pytest.raises(ValueError, match=r"^Lanes must be at least 1, not 0$"):
        RequantCore([stage], 2, 0, signed(8))
    with pytest.raises(TypeError, match=r"^Element shape must be an IntType or an integer "
                                        r"shape, not 'int8'$"):
        RequantCore([stage], 2, 1, "int8")
    leaky = RequantStage([1], [0], 0, 0, 0, 3, IntType(2, False), neg_multiplier=[1, 2],
                         neg_offset=[0])
    with pytest.raises(ValueError, match=r"^Stage 0 neg_multiplier must have 1 or 3 entries, "
                                         r"not 2$"):
        RequantCore([leaky], 3, 1, signed(8))
    leaky = RequantStage([1], [0], 0, 0, 0, 3, IntType(2, False), neg_multiplier=[1],
                         neg_offset=[0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"^Stage 0 neg_offset must have 1 or 3 entries, "
                                         r"not 4$"):
        RequantCore([leaky], 3, 1, signed(8))


# ---------------------------------------------------------------------------------------------
# StreamFIFO and WidthConverter

FIFO_CASES = [
    (signed(5), 2, 1),
    (unsigned(8), 1, 2),
    (signed(3), 3, 4),
    (IntType(7, False), 2, 5),
    (signed(16), 1, 9),
]


@pytest.mark.parametrize("seed,case", list(enumerate(FIFO_CASES)))
def test_fifo_keeps_order(seed, case):
    shape, lanes, depth = case
    dut = StreamFIFO(shape, lanes, depth)
    x = random_values(np.random.default_rng(seed), shape, 40 * lanes)
    got = run_stream(dut, to_transfers(x, lanes), 40, seed)
    np.testing.assert_array_equal(np.array(got).reshape(-1), x)
    # Full rate: a transfer per cycle on both sides, `latency` cycles through.
    times = run_timed(dut, to_transfers(x, lanes), 40)
    np.testing.assert_array_equal(np.array(times["out"]) - np.array(times["in"]),
                                  1 if depth <= 4 else 2)
    assert dut.latency == (1 if depth <= 4 else 2)


@pytest.mark.parametrize("seed", [0, 1])
def test_fifo_with_out_register_keeps_order(seed):
    # A queue in block RAM with the register behind it (ECP5 boards): two cycles through
    # the queue, one through the register, and its storage in column slices.
    shape, lanes = signed(6), 2
    dut = StreamFIFO(shape, lanes, 7, out_register=True)
    x = random_values(np.random.default_rng(seed), shape, 40 * lanes)
    got = run_stream(dut, to_transfers(x, lanes), 40, seed)
    np.testing.assert_array_equal(np.array(got).reshape(-1), x)
    times = run_timed(dut, to_transfers(x, lanes), 40)
    np.testing.assert_array_equal(np.array(times["out"]) - np.array(times["in"]), 3)
    assert dut.latency == 3


def test_slice_bits_fit_one_dp16kd_column():
    from onnx2fpga.hw.plumbing import slice_bits
    # (width, rows) -> bits per slice: 8 bits x 10,239 rows as eight 16,384 x 1 blocks
    # (five 2,048 x 9 blocks chained in depth were ResNet-8's skip queue).
    assert [slice_bits(w, d) for w, d in [(8, 10239), (8, 2047), (8, 2049), (40, 511),
                                          (40, 513), (16, 3000), (8, 20000), (3, 100)]] == \
        [1, 8, 4, 36, 18, 4, 8, 3]


@pytest.mark.parametrize("bits", [3, 8])
def test_sliced_queue_moves_as_sync_fifo_buffered(bits):
    """The sliced queue behind a block-RAM StreamFIFO's register: under random valid and
    ready, on every cycle the same ready, valid and data as amaranth's SyncFIFOBuffered of the
    same depth, in three slices (3, 3 and 2 bits) or one; never reading the row it writes
    (its memories carry NO_RW_CHECK, which ``simulate`` checks)."""
    from amaranth.lib import fifo

    from onnx2fpga.hw.plumbing import _SlicedQueue

    class Pair(Elaboratable):
        def __init__(self):
            self.valid, self.ready, self.data = Signal(), Signal(), Signal(8)

        def elaborate(self, platform):
            m = Module()
            m.submodules.dut = self.dut = dut = _SlicedQueue(8, 6, bits)
            m.submodules.ref = self.ref = ref = fifo.SyncFIFOBuffered(width=8, depth=6)
            for q in (dut, ref):
                m.d.comb += [q.w_en.eq(self.valid), q.w_data.eq(self.data),
                             q.r_en.eq(self.ready)]
            return m

    pair = Pair()
    rng = np.random.default_rng(bits)
    counts = {"moved": 0, "full": 0}

    async def bench(ctx):
        for cycle in range(600):
            # Phases of mostly writing and mostly reading, so the queue fills and drains.
            write_p = 0.8 if (cycle // 100) % 2 == 0 else 0.3
            ctx.set(pair.valid, int(rng.random() < write_p))
            ctx.set(pair.ready, int(rng.random() < 1.1 - write_p))
            ctx.set(pair.data, int(rng.integers(256)))
            dut, ref = pair.dut, pair.ref
            got = (ctx.get(dut.w_rdy), ctx.get(dut.r_rdy))
            assert got == (ctx.get(ref.w_rdy), ctx.get(ref.r_rdy)), cycle
            if got[1]:
                assert ctx.get(dut.r_data) == ctx.get(ref.r_data), cycle
                counts["moved"] += ctx.get(pair.ready)
            counts["full"] += not got[0]
            await ctx.tick()

    simulate(pair, bench)
    assert counts["moved"] > 150 and counts["full"] > 20    # data moved, the queue filled


@pytest.mark.parametrize("in_register", [False, True])
def test_skid_fifo_moves_as_a_two_deep_sync_fifo(in_register):
    """Depth 2 is a skid buffer (ready and output from registers), or with ``in_register``
    two registers written straight from the input: under random valid and ready, on every
    cycle the same ready, valid and data as amaranth's SyncFIFO of depth 2 (whose ready also
    comes from a register)."""
    from amaranth.lib import fifo
    from amaranth.sim import Simulator

    class Pair(Elaboratable):
        def __init__(self):
            self.valid, self.ready, self.data = Signal(), Signal(), Signal(8)

        def elaborate(self, platform):
            m = Module()
            m.submodules.skid = self.skid = skid = StreamFIFO(unsigned(8), 1, 2,
                                                              in_register=in_register)
            m.submodules.ref = self.ref = ref = fifo.SyncFIFO(width=8, depth=2)
            m.d.comb += [skid.i_stream.valid.eq(self.valid), skid.i_stream.payload.eq(self.data),
                         skid.o_stream.ready.eq(self.ready), ref.w_en.eq(self.valid),
                         ref.w_data.eq(self.data), ref.r_en.eq(self.ready)]
            return m

    dut = Pair()
    rng = np.random.default_rng(7)
    seen = []

    async def bench(ctx):
        for cycle in range(400):
            ctx.set(dut.valid, int(rng.random() < 0.6))
            ctx.set(dut.ready, int(rng.random() < 0.5))
            ctx.set(dut.data, cycle % 256)
            skid, ref = dut.skid, dut.ref
            got = (ctx.get(skid.i_stream.ready), ctx.get(skid.o_stream.valid))
            assert got == (ctx.get(ref.w_rdy), ctx.get(ref.r_rdy)), cycle
            if got[1]:
                assert ctx.get(skid.o_stream.payload[0]) == ctx.get(ref.r_data), cycle
                seen.append((ctx.get(ref.r_data) if ctx.get(dut.ready) else None, got[0]))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    moved, full = sum(v is not None for v, _ in seen), sum(not r for _, r in seen)
    assert moved > 100 and full > 20        # data moved, and the buffer filled up


CONVERTER_CASES = [
    (signed(4), 1, 4),
    (unsigned(3), 4, 1),
    (signed(8), 2, 6),
    (IntType(5, False), 6, 2),
    (signed(2), 3, 3),
]


@pytest.mark.parametrize("seed,case", list(enumerate(CONVERTER_CASES)))
def test_width_converter_keeps_order(seed, case):
    shape, n_in, n_out = case
    dut = WidthConverter(shape, n_in, n_out)
    n = 12 * max(n_in, n_out)
    x = random_values(np.random.default_rng(seed), shape, n)
    got = run_stream(dut, to_transfers(x, n_in), n // n_out, seed)
    np.testing.assert_array_equal(np.array(got).reshape(-1), x)
    # Full rate: the narrow side moves a transfer every cycle.
    times = run_timed(dut, to_transfers(x, n_in), n // n_out)
    narrow = times["in"] if n_in <= n_out else times["out"]
    np.testing.assert_array_equal(np.diff(narrow), 1)
    if n_in < n_out:        # gathering: out one cycle after the last piece
        k = n_out // n_in
        np.testing.assert_array_equal(np.array(times["out"]) - times["in"][k - 1::k], 1)
    elif n_in > n_out:      # splitting: pieces in the k cycles after the input
        k = n_in // n_out
        np.testing.assert_array_equal(np.array(times["out"][k - 1::k]) - times["in"], k)


def test_plumbing_errors():
    with pytest.raises(ValueError, match=r"^One lane count must divide the other, "
                                         r"not in_lanes=4 and out_lanes=6$"):
        WidthConverter(signed(4), 4, 6)
    with pytest.raises(ValueError, match=r"^FIFO depth must be at least 1, not 0$"):
        StreamFIFO(signed(4), 1, 0)
    with pytest.raises(TypeError, match=r"^Lanes must be an integer, not 2.0$"):
        StreamFIFO(signed(4), 2.0, 2)


@pytest.mark.parametrize("sa,sb", [
    (unsigned(1), signed(5)), (signed(2), signed(3)), (signed(3), unsigned(6)),
    (unsigned(4), signed(4)), (signed(4), signed(8)), (unsigned(2), unsigned(3)),
    (signed(8), signed(8)), (unsigned(8), signed(7)), (signed(6), signed(1)),
])
def test_lut_products_equal_the_product_for_every_operand_pair(sa, sb):
    """The shift-and-add product of narrow operands (kept out of hard multipliers) and the
    carry-chain product (hw.chains, platform-free: the values its ECP5 cells compute) against
    Python's integer product, exhaustively, in both operand orders."""
    from amaranth.sim import Simulator

    from onnx2fpga.hw.arith import lut_product
    from onnx2fpga.hw.chains import chain_product

    a, b = Signal(sa), Signal(sb)
    m = Module()
    values = [lut_product(a, b), lut_product(b, a), chain_product(m, None, a, b, "ab"),
              chain_product(m, None, b, a, "ba")]
    outs = [Signal((a * b).shape(), name=f"p{k}") for k in range(len(values))]
    m.d.comb += [o.eq(v) for o, v in zip(outs, values)]
    assert all(v.shape() == (a * b).shape() for v in values)

    def operands(s):
        return range(-(1 << (s.width - 1)), 1 << (s.width - 1)) if s.signed \
            else range(1 << s.width)

    wrong = []

    async def bench(ctx):
        for x in operands(sa):
            for y in operands(sb):
                ctx.set(a, x)
                ctx.set(b, y)
                got = [ctx.get(o) for o in outs]
                if got != [x * y] * len(outs):
                    wrong.append((x, y, got))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert wrong == []


@pytest.mark.parametrize("shape", [signed(8), unsigned(8), signed(5), unsigned(3), signed(1)])
@pytest.mark.parametrize("const", [4979832, -14841989, 3, 1 << 20, -1])
def test_table_products_equal_the_product_for_every_input(shape, const):
    """hw.arith.table_product (an AddCore's constant products of narrow inputs) against
    Python's integer product, for every input value."""
    from amaranth.sim import Simulator

    from onnx2fpga.hw.arith import table_product

    x = Signal(shape)
    out = Signal((x * C(const)).shape())
    m = Module()
    m.d.comb += out.eq(table_product(x, const))
    lo, hi = (-(1 << (shape.width - 1)), 1 << (shape.width - 1)) if shape.signed \
        else (0, 1 << shape.width)
    wrong = []

    async def bench(ctx):
        for v in range(lo, hi):
            ctx.set(x, v)
            if ctx.get(out) != v * const:
                wrong.append((v, ctx.get(out)))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert wrong == []
