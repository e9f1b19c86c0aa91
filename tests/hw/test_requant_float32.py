"""The requantization core's float32 stage (onnxruntime's requantization) against the golden
model, on random inputs and on inputs next to the ties of both roundings, under stalls."""

import numpy as np
import pytest
from amaranth import signed

from onnx2fpga.frontend.epilogue import float32_params
from onnx2fpga.hw.requant import RequantCore
from onnx2fpga.hw.testing import run_stream, run_timed, to_transfers
from onnx2fpga.ir.stages import RequantStage
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan import requant as requant_timing
from onnx2fpga.sim import golden


def _stage(rng, channels, *, spread, exp=8, out=IntType(8, True), zp=3):
    # float32 scales a few binades apart (per-channel scales of a quantized Conv).
    scales = (rng.uniform(0.5, 1.0, channels) * 2.0 ** -rng.integers(exp, exp + spread + 1,
                                                                     channels))
    m, shift = float32_params(scales.astype(np.float32))
    return RequantStage(m, [0], shift, zp, out.lo, out.hi, out, rounding="float32")


def _near_ties(stage, channels, t: IntType, rng, n):
    """Per channel, inputs whose product with the channel's float32 scale lies next to a
    half-integer (the integer rounding's ties), and inputs with more than 24 significant bits
    next to the float32 conversion's ties."""
    scales = np.broadcast_to(stage.multiplier * 2.0 ** -stage.shift, (channels,))
    rows = []
    for _ in range(n):
        k = rng.integers(-140, 140, channels) + 0.5
        x = np.rint(k / scales) + rng.integers(-1, 2, channels)
        rows.append(x)
    if t.bits > 26:
        # 2**(bits-3) + low has bits-2 significant bits: the conversion drops q of them.
        base = np.int64(1) << (t.bits - 3)
        half = 1 << (t.bits - 2 - 24 - 1)
        for low in (half - 1, half, half + 1, 3 * half - 1, 3 * half, 3 * half + 1):
            rows.append(np.full(channels, base + low))
            rows.append(np.full(channels, -(base + low)))
    x = np.clip(np.array(rows, np.int64), t.lo, t.hi)
    return x


@pytest.mark.parametrize("bits, channels, lanes, spread, exp", [
    (20, 4, 2, 3, 8), (24, 6, 3, 8, 8), (32, 3, 1, 2, 8), (30, 5, 5, 0, 8),
    (32, 3, 3, 1, 24)])
def test_float32_stage_matches_golden(bits, channels, lanes, spread, exp):
    # exp 24: inputs beyond 2**24 reach the output range, so the input's conversion to
    # float32 (rounded to 24 bits) decides too.
    rng = np.random.default_rng(bits * 100 + channels)
    t = IntType(bits, True)
    stage = _stage(rng, channels, spread=spread, exp=exp)
    dut = RequantCore([stage], channels, lanes, signed(bits))
    ties = _near_ties(stage, channels, t, rng, 24)
    rand = rng.integers(t.lo, t.hi, size=(24, channels), endpoint=True)
    x = np.concatenate([ties, rand, [[t.lo] * channels, [t.hi] * channels]])
    x = x[: len(x) // lanes * lanes] if channels % lanes else x
    expected = golden.requant_stages(x, [stage]).reshape(-1)
    assert len(np.unique(expected)) > 50            # not all saturated
    if exp == 24:   # some output depends on the input's rounding to float32
        scales = stage.multiplier * 2.0 ** -stage.shift
        unrounded = np.rint((x * scales).astype(np.float32)) + stage.zero_point
        assert np.any(np.clip(unrounded, -128, 127).reshape(-1) != expected)
    got = run_stream(dut, to_transfers(x.reshape(-1), lanes), x.size // lanes, bits)
    np.testing.assert_array_equal(np.array(got).reshape(-1), expected)


def test_float32_stage_differs_from_one_rounding():
    # The stage really rounds twice: on near ties the golden model's float32 stage and the
    # exact product rounded once disagree, and the core follows the float32 stage.
    rng = np.random.default_rng(5)
    t = IntType(24, True)
    stage = _stage(rng, 4, spread=2)
    x = _near_ties(stage, 4, t, rng, 400)
    once = RequantStage(stage.multiplier, [0], stage.shift, stage.zero_point, stage.lo,
                        stage.hi, stage.out_type)
    twice = golden.requant_stages(x, [stage])
    assert np.any(twice != golden.requant_stages(x, [once]))
    dut = RequantCore([stage], 4, 2, signed(24))
    got = run_stream(dut, to_transfers(x.reshape(-1), 2), x.size // 2, 1)
    np.testing.assert_array_equal(np.array(got).reshape(-1), twice.reshape(-1))


@pytest.mark.parametrize("bits", [24, 32])
def test_float32_stage_timing(bits):
    rng = np.random.default_rng(bits)
    t = IntType(bits, True)
    # exp 24: outputs still change beyond 2**24, so the input's rounding stays (with scales
    # near 2**-8 every input beyond 2**16 clips, and the core clamps it first).
    stage = _stage(rng, 2, spread=1, exp=8 if bits <= 25 else 24)
    dut = RequantCore([stage], 2, 2, signed(bits))
    x = rng.integers(-1000, 1000, size=(12, 2))
    times = run_timed(dut, to_transfers(x.reshape(-1), 2), 12)
    latency = requant_timing.requant_latency([stage], t)
    assert dut.latency == latency == (9 if bits <= 25 else 11)
    np.testing.assert_array_equal(np.array(times["out"]) - np.array(times["in"]), latency)
    np.testing.assert_array_equal(np.array(times["out_items"]).reshape(-1, 2),
                                  golden.requant_stages(x, [stage]))


def _exact_stage(rng, channels, *, relu):
    m = rng.integers(1 << 14, 1 << 15, channels)
    off = rng.integers(-(1 << 20), 1 << 20, channels)
    out = IntType(8, True)
    return RequantStage(m, off, 24, -128 if relu else 5, -128 if relu else out.lo, out.hi,
                        out, rounding="half_even")


@pytest.mark.parametrize("kind", ["float32", "float32_wide", "exact", "exact_relu"])
def test_saturation_bounds_change_no_output(kind):
    """Clamping the input to ``saturation_bounds`` changes no output of any channel, and the
    bounds are tight: one step inside either of them, some channel's output changes."""
    rng = np.random.default_rng(len(kind))
    t = IntType(24, True)
    if kind.startswith("float32"):
        stage = _stage(rng, 5, spread=3, exp=8 if kind == "float32" else 17)
    else:
        stage = _exact_stage(rng, 5, relu=kind == "exact_relu")
    lo, hi = requant_timing.saturation_bounds([stage], t.lo, t.hi)
    assert t.lo < lo < hi < t.hi
    x = np.concatenate([rng.integers(t.lo, t.hi, (2000, 5), endpoint=True),
                        rng.integers(lo - 300, lo + 300, (300, 5)),
                        rng.integers(hi - 300, hi + 300, (300, 5)),
                        [[t.lo] * 5, [t.hi] * 5, [lo] * 5, [hi] * 5]])
    x = np.clip(x, t.lo, t.hi)
    np.testing.assert_array_equal(golden.requant_stages(np.clip(x, lo, hi), [stage]),
                                  golden.requant_stages(x, [stage]))
    for inner, edge in ((hi - 1, t.hi), (lo + 1, t.lo)):
        assert np.any(golden.requant_stages(np.full((1, 5), inner), [stage])
                      != golden.requant_stages(np.full((1, 5), edge), [stage]))


def test_saturation_bounds_keep_a_negative_side():
    """A fused LeakyRelu's stage is left alone (not known to be monotone)."""
    rng = np.random.default_rng(7)
    st = _exact_stage(rng, 3, relu=False)
    leaky = RequantStage(st.multiplier, st.offset, st.shift, st.zero_point, st.lo, st.hi,
                         st.out_type, neg_multiplier=st.multiplier // 8,
                         neg_offset=st.offset // 8)
    assert requant_timing.saturation_bounds([leaky], -(1 << 23), (1 << 23) - 1) == \
        (-(1 << 23), (1 << 23) - 1)


def test_saturated_core_matches_golden_on_every_range():
    """The clamped core (a multiplier operand narrower than its 24-bit input) equals the
    golden model on inputs across the whole input range, under stalls."""
    rng = np.random.default_rng(11)
    t = IntType(24, True)
    stage = _stage(rng, 4, spread=2, exp=10)
    dut = RequantCore([stage], 4, 2, signed(24))
    lo, hi = requant_timing.saturation_bounds([stage], t.lo, t.hi)
    assert dut._sat == (lo, hi) == requant_timing.clamp_bounds([stage], t.lo, t.hi)
    assert t.lo < lo and hi < t.hi
    x = np.concatenate([rng.integers(t.lo, t.hi, (40, 4), endpoint=True),
                        rng.integers(lo - 4, lo + 4, (8, 4)), rng.integers(hi - 4, hi + 4, (8, 4)),
                        [[t.lo] * 4, [t.hi] * 4]])
    got = run_stream(dut, to_transfers(x.reshape(-1), 2), x.size // 2, 1)
    np.testing.assert_array_equal(np.array(got).reshape(-1),
                                  golden.requant_stages(x, [stage]).reshape(-1))
