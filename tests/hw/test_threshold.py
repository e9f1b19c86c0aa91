"""ThresholdCore under random stalls against the golden model, and the exact conversion of
requantization stages into thresholds (exhaustive over small input ranges)."""

import dataclasses

import numpy as np
import pytest
from amaranth import Shape, signed, unsigned

from onnx2fpga.hw.threshold import ThresholdCore
from onnx2fpga.ir.stages import RequantStage, ThresholdStage
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan import thresholds
from onnx2fpga.plan.builder import stage_cores, stream_stages
from onnx2fpga.plan.thresholds import requant_as_thresholds
from onnx2fpga.sim import golden
from tests.hw.test_cores import random_ints, run_stream, run_timed, to_transfers


def shape_range(shape):
    shape = Shape.cast(shape)
    if shape.signed:
        return -(1 << (shape.width - 1)), (1 << (shape.width - 1)) - 1
    return 0, (1 << shape.width) - 1


def make_thresholds(rng, x_lo, x_hi, rows, n, base, step, out_type):
    """Sorted random thresholds, some below and some above the input range (always and never
    passed), with repeats (several levels at once)."""
    span = x_hi - x_lo
    t = rng.integers(x_lo - span // 8 - 1, x_hi + span // 8 + 2, size=(rows, n))
    if n >= 4:
        t[:, 1] = t[:, 2]                           # a repeated threshold
    return ThresholdStage(np.sort(t, axis=1), base, step, out_type)


# (in_shape, channels, lanes, [(n, per_channel, base, step, out_type)], search)
CASES = [
    (signed(12), 4, 2, [(1, True, -1, 2, IntType(2, True))], "auto"),          # bipolar out
    (signed(10), 6, 3, [(3, True, 0, 1, IntType(2, False))], "auto"),
    (unsigned(8), 5, 1, [(15, True, -8, 1, IntType(4, True))], "auto"),
    (signed(16), 3, 4, [(15, False, 15, -1, IntType(4, False))], "auto"),      # decreasing
    (signed(9), 4, 2, [(40, True, 0, 1, IntType(6, False))], "auto"),           # binary, ROM
    (unsigned(8), 1, 2, [(255, False, -128, 1, IntType(8, True))], "auto"),     # binary, consts
    (signed(8), 7, 1, [(20, True, 0, 1, IntType(5, False))], "parallel"),
    (signed(11), 2, 2, [(3, True, 0, 1, IntType(2, False))], "binary"),
    (signed(10), 3, 3, [(7, True, 0, 1, IntType(3, False)),                    # two stages
                        (2, True, -1, 1, IntType(2, True))], "auto"),
    (signed(6), 2, 1, [(0, False, 3, 1, IntType(3, False))], "auto"),           # constant
    (signed(14), 5, 5, [(31, True, 0, 1, IntType(5, False))], "auto"),
]


def build(seed, in_shape, channels, specs):
    rng = np.random.default_rng(seed)
    lo, hi = shape_range(in_shape)
    stages = []
    for n, per_channel, base, step, out_type in specs:
        st = make_thresholds(rng, lo, hi, channels if per_channel else 1, n, base, step,
                             out_type)
        stages.append(st)
        lo, hi = st.lo, st.hi
    return stages


@pytest.mark.parametrize("seed,case", list(enumerate(CASES)))
def test_threshold_matches_golden(seed, case):
    in_shape, channels, lanes, specs, search = case
    stages = build(seed, in_shape, channels, specs)
    dut = ThresholdCore(stages, channels, lanes, in_shape, search=search)
    if search != "auto":
        assert dut.searches == [search] * len(stages)
    rng = np.random.default_rng([seed, 0])
    period = int(np.lcm(channels, lanes))
    n = period * max(2, 60 // period)
    lo, hi = shape_range(in_shape)
    x = rng.integers(lo, hi, size=n, endpoint=True)
    x[:2] = [lo, hi]
    # Values on and next to thresholds, where an off-by-one would show.
    t = stages[0].thresholds
    for i in range(2, n, 3):
        c = i % channels
        row = t[c if len(t) > 1 else 0]
        if row.size:
            x[i] = np.clip(row[rng.integers(row.size)] + rng.integers(-1, 2), lo, hi)
    expected = golden.requant_stages(x.reshape(-1, channels), stages).reshape(-1)
    got = run_stream(dut, to_transfers(x, lanes), n // lanes, seed)
    np.testing.assert_array_equal(np.array(got).reshape(-1), expected)


@pytest.mark.parametrize("case", [CASES[1], CASES[4], CASES[5], CASES[8]])
def test_threshold_timing(case):
    in_shape, channels, lanes, specs, search = case
    stages = build(0, in_shape, channels, specs)
    dut = ThresholdCore(stages, channels, lanes, in_shape, search=search)
    lo, hi = shape_range(in_shape)
    x = np.random.default_rng(0).integers(lo, hi, size=12 * lanes, endpoint=True)
    times = run_timed(dut, to_transfers(x, lanes), 12)
    np.testing.assert_array_equal(np.array(times["out_items"]).reshape(-1),
                                  golden.requant_stages(x.reshape(-1, channels),
                                                        stages).reshape(-1))
    # Parallel: 2 cycles a stage, 3 with a table of thresholds per channel (case 1: 6
    # channels over 3 lanes), 2 when each lane has one channel (case 8: 3 over 3); binary:
    # one per level (8 for 255 constant thresholds), two with a table and one more before
    # every level's table but the first (17 for 40 thresholds per channel in 6 levels, 4
    # channels over 2 lanes).
    by_hand = {1: 1 + 3, 4: 1 + 17, 5: 1 + 8, 8: 1 + 2 + 2}[CASES.index(case)]
    assert dut.latency == thresholds.threshold_latency(stages, channels, lanes) == by_hand
    np.testing.assert_array_equal(np.array(times["out"]) - np.array(times["in"]), by_hand)
    np.testing.assert_array_equal(np.diff(times["out"]), 1)


def test_threshold_errors():
    st = ThresholdStage([[1, 2], [3, 4]], 0, 1, IntType(2, False))
    with pytest.raises(ValueError, match=r"^Stage 0 thresholds must have 1 or 3 rows, not 2$"):
        ThresholdCore([st], 3, 1, signed(8))
    with pytest.raises(ValueError, match=r"^Stages must be a non-empty list of ThresholdStage, "
                                         r"not \[\]$"):
        ThresholdCore([], 2, 1, signed(8))
    rq = RequantStage([1], [0], 0, 0, 0, 3, IntType(2, False))
    with pytest.raises(TypeError, match=r"^Stage 0 must be a ThresholdStage, not "
                                        r"RequantStage\(.*\)$"):
        ThresholdCore([rq], 2, 1, signed(8))
    with pytest.raises(ValueError, match=r"^Lanes must be at least 1, not 0$"):
        ThresholdCore([st], 2, 0, signed(8))
    with pytest.raises(ValueError, match=r"^Search must be 'auto', 'parallel' or 'binary', "
                                         r"not 'linear'$"):
        ThresholdCore([st], 2, 1, signed(8), search="linear")


# ---------------------------------------------------------------------------------------------
# requant_as_thresholds


def per_channel_eval(stage, xs, channels):
    """golden.requant of every x in ``xs`` on every channel: (len(xs), channels)."""
    return golden.requant(np.repeat(np.asarray(xs, np.int64)[:, None], channels, axis=1), stage)


def random_requant(rng, in_lo, in_hi, channels, *, sign, out_type, shift, rounding,
                   leaky=None, per_channel=True):
    """A stage mapping [in_lo, in_hi] over about 1.5 times out_type's range, multipliers of
    the given sign (+1, -1, or 0 for mixed)."""
    n = channels if per_channel else 1
    gain = 1.5 * (out_type.hi - out_type.lo + 1) * 2 ** shift / (in_hi - in_lo + 1)
    m = np.maximum(np.round(gain * rng.uniform(0.3, 3.0, n)), 1).astype(np.int64)
    m = m * (rng.choice([-1, 1], n) if sign == 0 else sign)
    centre = (in_lo + in_hi) / 2
    off = np.round(-centre * m + rng.normal(0, 0.2, n) * gain * (in_hi - in_lo)
                   ).astype(np.int64)
    zp = (out_type.lo + out_type.hi) // 2
    st = RequantStage(m, off, shift, zp, out_type.lo, out_type.hi, out_type,
                      in_zero_point=int(rng.integers(-3, 4)), rounding=rounding)
    if leaky is not None:
        st = dataclasses.replace(st, neg_multiplier=np.round(leaky * m).astype(np.int64),
                                 neg_offset=np.round(leaky * off).astype(np.int64))
    return st


# (in_lo, in_hi, channels, keywords of random_requant)
CONVERT_CASES = [
    (-512, 511, 4, dict(sign=1, out_type=IntType(4, False), shift=10, rounding="half_even")),
    (-512, 511, 3, dict(sign=-1, out_type=IntType(4, True), shift=8, rounding="half_away")),
    (0, 255, 5, dict(sign=1, out_type=IntType(2, True), shift=6, rounding="half_even")),
    (-1000, 1000, 2, dict(sign=1, out_type=IntType(8, True), shift=4, rounding="half_away",
                          per_channel=False)),
    (-300, 300, 4, dict(sign=1, out_type=IntType(4, True), shift=9, rounding="half_even",
                        leaky=0.25)),                   # LeakyRelu, same slope sign
    (-300, 300, 3, dict(sign=-1, out_type=IntType(3, True), shift=5, rounding="half_away",
                        leaky=1.5)),
    (-64, 63, 3, dict(sign=1, out_type=IntType(8, True), shift=0, rounding="half_even")),
    (-2048, 2047, 6, dict(sign=1, out_type=IntType(1, False), shift=12,
                          rounding="half_even")),       # a single threshold (a step)
]


@pytest.mark.parametrize("seed,case", list(enumerate(CONVERT_CASES)))
def test_requant_as_thresholds_exhaustive(seed, case):
    in_lo, in_hi, channels, kw = case
    stage = random_requant(np.random.default_rng(seed), in_lo, in_hi, channels, **kw)
    th = requant_as_thresholds(stage, in_lo, in_hi, channels)
    assert th is not None
    assert th.out_type == stage.out_type and th.step == (1 if kw["sign"] > 0 else -1)
    xs = np.arange(in_lo, in_hi + 1)
    np.testing.assert_array_equal(
        golden.threshold(np.repeat(xs[:, None], channels, axis=1), th),
        per_channel_eval(stage, xs, channels))
    # As few thresholds as output levels the input range reaches.
    reached = per_channel_eval(stage, xs, channels)
    assert th.thresholds.shape[1] == reached.max() - reached.min()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_requant_as_thresholds_wide_inputs(seed):
    # A 28-bit accumulator range: random inputs plus every threshold and its neighbours.
    rng = np.random.default_rng(seed)
    in_lo, in_hi, channels = -(1 << 27), (1 << 27) - 1, 8
    stage = random_requant(rng, in_lo, in_hi, channels, sign=[1, -1, 1][seed],
                           out_type=IntType(4, False), shift=30,
                           rounding=["half_even", "half_away", "half_even"][seed],
                           leaky=[None, None, 0.125][seed])
    th = requant_as_thresholds(stage, in_lo, in_hi, channels)
    xs = np.concatenate([rng.integers(in_lo, in_hi, 20000, endpoint=True),
                         np.clip(np.unique(th.thresholds)[:, None] + np.arange(-2, 3),
                                 in_lo, in_hi).reshape(-1), [in_lo, in_hi]])
    np.testing.assert_array_equal(
        golden.threshold(np.repeat(xs[:, None], channels, axis=1), th),
        per_channel_eval(stage, xs, channels))


def test_requant_as_thresholds_is_kept_by_value():
    """The planner asks again for every plan board folding tries; an equal stage (another
    object) gets the same thresholds, in an array of its own, and a stage that differs in
    one multiplier gets its own."""
    in_lo, in_hi, channels, kw = CONVERT_CASES[0]
    stage = random_requant(np.random.default_rng(0), in_lo, in_hi, channels, **kw)
    first = requant_as_thresholds(stage, in_lo, in_hi, channels)
    again = requant_as_thresholds(dataclasses.replace(stage), in_lo, in_hi, channels)
    np.testing.assert_array_equal(first.thresholds, again.thresholds)
    assert (first.base, first.step, first.out_type) == (again.base, again.step, again.out_type)
    again.thresholds[...] = 0
    np.testing.assert_array_equal(
        requant_as_thresholds(stage, in_lo, in_hi, channels).thresholds, first.thresholds)
    m = np.array(stage.multiplier, copy=True).reshape(-1)
    m[0] += 1 if m[0] > 0 else -1
    other = dataclasses.replace(stage, multiplier=m.reshape(np.shape(stage.multiplier)))
    xs = np.arange(in_lo, in_hi + 1)
    np.testing.assert_array_equal(
        golden.threshold(np.repeat(xs[:, None], channels, axis=1),
                         requant_as_thresholds(other, in_lo, in_hi, channels)),
        per_channel_eval(other, xs, channels))


def is_monotone(values):
    d = np.diff(values, axis=0)
    return np.all(d >= 0) or np.all(d <= 0)


def test_requant_as_thresholds_not_monotonic():
    xs = np.arange(-200, 201)
    u4 = IntType(4, True)
    cases = {
        # multipliers of both signs across channels
        "mixed": RequantStage([3, -3], [0], 4, 0, u4.lo, u4.hi, u4),
        # LeakyRelu with a negative slope on the negative side
        "slope": RequantStage([5], [0], 4, 0, u4.lo, u4.hi, u4, neg_multiplier=[-2],
                              neg_offset=[0]),
        # the negative side jumps above the positive side at the join
        "jump": RequantStage([5], [0], 4, 0, u4.lo, u4.hi, u4, neg_multiplier=[5],
                             neg_offset=[160]),
    }
    for name, stage in cases.items():
        channels = stage.multiplier.size
        assert requant_as_thresholds(stage, -200, 200, channels) is None, name
        values = per_channel_eval(stage, xs, channels)
        if name == "mixed":
            assert is_monotone(values[:, :1]) and is_monotone(values[:, 1:])
        else:
            assert not is_monotone(values), name
    # The same jump outside the input range: monotonic there, converted exactly.
    stage = cases["jump"]
    th = requant_as_thresholds(stage, 0, 200, 1)
    xs = np.arange(0, 201)
    np.testing.assert_array_equal(golden.threshold(xs[:, None], th),
                                  per_channel_eval(stage, xs, 1))


def test_requant_as_thresholds_errors():
    st = RequantStage([1, 2], [0], 0, 0, 0, 3, IntType(2, False))
    with pytest.raises(ValueError, match=r"^Stage multiplier must have 1 or 3 entries, not 2$"):
        requant_as_thresholds(st, 0, 10, 3)
    with pytest.raises(ValueError, match=r"^in_lo must not exceed in_hi, not \[5, 4\]$"):
        requant_as_thresholds(st, 5, 4, 2)
    with pytest.raises(TypeError, match=r"^in_lo must be an integer, not 0.5$"):
        requant_as_thresholds(st, 0.5, 4, 2)
    with pytest.raises(TypeError, match=r"^Stage must be a RequantStage, not 3$"):
        requant_as_thresholds(3, 0, 4, 2)


# ---------------------------------------------------------------------------------------------
# Planner choice


def test_stage_cores_choice():
    rng = np.random.default_rng(5)
    acc = IntType(16, True)
    # A 14-bit multiplier (scale about 0.37 with a 24-bit shift) onto uint4.
    u4 = random_requant(rng, acc.lo, acc.hi, 4, sign=1, out_type=IntType(4, False), shift=24,
                        rounding="half_even")
    assert np.abs(u4.multiplier).max() >= 1 << 12
    i8 = random_requant(rng, acc.lo, acc.hi, 4, sign=1, out_type=IntType(8, True), shift=24,
                        rounding="half_even")
    bipolar = ThresholdStage([[8], [7], [9], [3]], -1, 2, IntType(2, True))
    mixed = random_requant(rng, acc.lo, acc.hi, 4, sign=0, out_type=IntType(4, False),
                           shift=24, rounding="half_even")
    mixed.multiplier[:2] = [5000, -5000]
    many = make_thresholds(rng, -128, 127, 4, 200, 0, 1, IntType(8, False))
    cases = [
        # uint4: 15 comparators of 17 bits beat a 16 x 14-bit multiplier.
        ([u4], ["threshold"]),
        # int8 from the accumulator: 255 levels stay on the multiplier.
        ([i8], ["requant"]),
        # Consecutive threshold stages share one core.
        ([u4, bipolar], ["threshold"]),
        # a ThresholdStage is always a threshold core, however many thresholds.
        ([i8, many], ["requant", "threshold"]),
        # not monotonic.
        ([mixed], ["requant"]),
    ]
    x = random_ints(rng, acc, (2000, 4))
    x[0], x[1] = acc.lo, acc.hi
    for stages, kinds in cases:
        runs = stage_cores(stages, acc, 4)
        assert [k for k, _ in runs] == kinds
        chosen = [s for _, run in runs for s in run]
        assert len(chosen) == len(stages)
        for (kind, run) in runs:
            want = ThresholdStage if kind == "threshold" else RequantStage
            assert all(isinstance(s, want) for s in run)
        # The chosen stages compute what the given ones do.
        np.testing.assert_array_equal(golden.requant_stages(x, chosen),
                                      golden.requant_stages(x, stages))


def test_stream_stages_thresholds():
    # Per-channel thresholds of a (2, 3, 2) image, streamed channels-last: the period is the
    # 2 channels; per-pixel thresholds need the whole image.
    st = ThresholdStage([[0, 5], [1, 7]], 0, 1, IntType(2, False))
    from onnx2fpga.plan.builder import hwc_order
    out, period = stream_stages([st], (2, 3, 2), hwc_order((2, 3, 2)))
    assert period == 2
    np.testing.assert_array_equal(out[0].thresholds, [[0, 5], [1, 7]])
    out, period = stream_stages([st], (2, 3, 2), None)
    assert period == 12
    np.testing.assert_array_equal(out[0].thresholds, [[0, 5]] * 6 + [[1, 7]] * 6)
    same = ThresholdStage([[4, 9]], 0, 1, IntType(2, False))
    out, period = stream_stages([same], (2, 3, 2), None)
    assert period == 1
    np.testing.assert_array_equal(out[0].thresholds, [[4, 9]])


@pytest.mark.parametrize("seed,conv,leaky,in_zp", [(0, False, False, 0), (1, False, True, 3),
                                                   (2, True, False, -2), (3, True, True, 0)])
def test_negative_multipliers_absorbed_into_the_weights(seed, conv, leaky, in_zp):
    """Channels with negative multipliers get negated weights, bias and multiplier: every
    output of the layer is the same (golden model, extremes included), all multipliers are
    non-negative, and the activation now becomes thresholds (one direction)."""
    import copy

    from onnx2fpga.frontend.lower import absorb_multiplier_signs
    from onnx2fpga.ir.layers import ConvLayer, DenseLayer
    from onnx2fpga.ir.stages import RequantStage
    from onnx2fpga.plan.builder import stage_cores

    rng = np.random.default_rng(seed)
    wt, in_type, oc = IntType(2, True), IntType(4, False), 6
    mult = rng.integers(200, 900, size=oc) * np.where(np.arange(oc) % 3 == 1, -1, 1)
    off = rng.integers(-3000, 3000, size=oc)
    kw = {}
    if leaky:
        kw = {"neg_multiplier": mult // 4, "neg_offset": off // 4}
    stage = RequantStage(mult, off, 10, 1, 0, 3, IntType(2, False), in_zero_point=in_zp, **kw)
    if conv:
        weight = rng.integers(-1, 2, size=(oc, 2, 3, 3))
        layer = ConvLayer("c", in_type, 5, (2, 5, 5), weight, wt, rng.integers(-9, 9, oc),
                          [stage], pads=(1, 1, 1, 1))
        x = rng.integers(0, 16, size=(40, 2, 5, 5))
    else:
        weight = rng.integers(-1, 2, size=(oc, 9))
        layer = DenseLayer("d", in_type, 5, weight, wt, rng.integers(-9, 9, oc), [stage])
        x = rng.integers(0, 16, size=(40, 9))
    x[0], x[1] = 0, 15
    before = copy.deepcopy(layer)
    assert absorb_multiplier_signs(layer)
    np.testing.assert_array_equal(golden.run_layer(layer, x), golden.run_layer(before, x))
    assert np.all(layer.requant[0].multiplier >= 0)
    flip = mult < 0
    np.testing.assert_array_equal(layer.weight[flip], -before.weight[flip])
    np.testing.assert_array_equal(layer.weight[~flip], before.weight[~flip])
    acc = layer.acc_type
    assert [k for k, _ in stage_cores(layer.requant, acc, oc)] == ["threshold"]
    assert [k for k, _ in stage_cores(before.requant, before.acc_type, oc)] == ["requant"]
    # Nothing to do, or weights that would leave their type: unchanged.
    assert not absorb_multiplier_signs(layer)
    wide = copy.deepcopy(before)
    wide.weight[flip.nonzero()[0][0]].flat[0] = -2
    assert not absorb_multiplier_signs(wide)
