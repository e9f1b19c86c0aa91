"""Cycle model of the requantization core (:class:`~onnx2fpga.hw.requant.RequantCore`), in the
conventions of :mod:`onnx2fpga.plan.cost`, and the integer arithmetic both share for a stage
rounding ``"float32"`` (onnxruntime's requantization: see :class:`~onnx2fpga.ir.RequantStage`).
"""

from __future__ import annotations

import numpy as np

from ..ir.stages import RequantStage
from ..ir.types import IntType
from ..sim.golden import requant_stages
from .devices import LUT_PRODUCT_MAX_BITS, operand_pieces
from .stage import CoreKind, Stage

__all__ = ["requant_latency", "stage_latency", "RequantTiming", "round_significant",
           "FLOAT32_BITS", "float32_input_rounds", "shift_rounding", "saturation_bounds",
           "clamp_bounds"]

#: Significant bits of a float32.
FLOAT32_BITS = 24


def round_significant(v: int, bits: int = FLOAT32_BITS) -> int:
    """``v`` rounded to ``bits`` significant bits, ties to even (as a conversion to float32
    for ``bits = 24``, without the exponent's range)."""
    v = int(v)
    a = abs(v)
    q = a.bit_length() - bits
    if q <= 0:
        return v
    floor, rem, half = a >> q, a & ((1 << q) - 1), 1 << (q - 1)
    up = rem > half or (rem == half and floor & 1)
    r = (floor + up) << q
    return r if v >= 0 else -r


def float32_input_rounds(lo: int, hi: int) -> bool:
    """The conversion of an integer in ``[lo, hi]`` to float32 can round (beyond 2**24)."""
    return max(-int(lo), int(hi)) > 1 << FLOAT32_BITS


def shift_rounding(rounding: str, shift: int, zero_point: int) -> tuple[int, str]:
    """``round_shift(v, shift, rounding) + zero_point`` (:func:`onnx2fpga.sim.golden.round_shift`)
    as one adder: ``(v + const + carry) >> shift``, returns ``(const, carry)``. ``carry`` is
    ``"bit"`` for half to even (bit ``shift`` of ``v``), ``"sign"`` for half away from zero
    (1 when ``v >= 0``), else ``"none"``: ``2**(shift-1) - 1 + zp * 2**shift`` for the
    halves, ``zp * 2**shift`` for floor, ``2**shift - 1`` more for ceil. For ``"to_zero"``
    the constant is floor's; the caller adds ``2**shift - 1`` to negative ``v``."""
    s, zp = int(shift), int(zero_point)
    if s == 0:
        return zp, "none"
    if rounding in ("half_even", "half_away"):
        return (1 << (s - 1)) - 1 + (zp << s), "bit" if rounding == "half_even" else "sign"
    return (zp << s) + ((1 << s) - 1 if rounding == "ceil" else 0), "none"


def stage_latency(stage, lo: int, hi: int) -> int:
    """Cycles of one stage of the core on inputs in ``[lo, hi]``: 5 (partial products, their
    sum, the offset, rounding and zero point, clip); a ``"float32"`` stage 2 more (the mask
    of the product's bits beyond 24 significant ones, the rounding to them) and 2 more again
    where its input can exceed 2**24 (the same rounding of the input)."""
    if stage.rounding != "float32":
        return 5
    return 7 + (2 if float32_input_rounds(lo, hi) else 0)


#: :func:`saturation_bounds` already computed, by the stages' values and the input range.
_BOUNDS: dict = {}
_BOUNDS_SIZE = 4096


def _monotone(stages) -> bool:
    """Every stage a :class:`~onnx2fpga.ir.RequantStage` without a negative side and with
    multipliers of one sign (non-negative): then the whole chain is a non-decreasing
    function of its input, channel by channel."""
    return bool(stages) and all(
        isinstance(st, RequantStage) and st.neg_multiplier is None
        and bool((np.asarray(st.multiplier) >= 0).all()) for st in stages)


def _key(stages, lo, hi):
    return (lo, hi) + tuple(
        (st.rounding, int(st.shift), int(st.zero_point), int(st.in_zero_point), int(st.lo),
         int(st.hi), np.asarray(st.multiplier).tobytes(), np.asarray(st.offset).tobytes())
        for st in stages)


def saturation_bounds(stages, lo: int, hi: int) -> tuple[int, int]:
    """The narrowest input range ``[s_lo, s_hi]`` within ``[lo, hi]`` such that clamping an
    input to it changes no output of ``stages`` (a layer's requantization chain, per channel):
    ``s_hi`` is the largest over the channels of the smallest input whose output is already
    the output at ``hi`` (the top of the clip), ``s_lo`` likewise from below. Exact because
    each such chain is non-decreasing in its input (a float32 conversion, a product by a
    non-negative scale, roundings and a clip all are); a chain that is not known to be
    (a negative side, a threshold or table stage, a negative multiplier) keeps ``[lo, hi]``.

    The requantization core clamps its input so where that saves hardware
    (:func:`clamp_bounds`): an accumulator of 22 bits whose outputs clip beyond 2**17
    multiplies 18 bits, one hard multiplier's operand instead of two."""
    lo, hi = int(lo), int(hi)
    if hi <= lo or not _monotone(stages):
        return lo, hi
    key = _key(stages, lo, hi)
    got = _BOUNDS.get(key)
    if got is not None:
        return got
    channels = max(max(np.asarray(st.multiplier).size, np.asarray(st.offset).size)
                   for st in stages)

    def f(x):
        return requant_stages(np.asarray(x, np.int64).reshape(1, channels), stages)[0]

    def edge(inside: int, outside: int) -> np.ndarray:
        """Per channel, the input nearest ``outside`` whose output is still the output at
        ``inside`` (an end of the range), bisected: ``b`` has that output, ``a`` not (``a``
        starts one beyond the range)."""
        value = f(np.full(channels, inside))
        a, b = np.full(channels, outside, np.int64), np.full(channels, inside, np.int64)
        while (np.abs(b - a) > 1).any():
            open_ = np.abs(b - a) > 1
            mid = (a + b) // 2
            same = f(np.clip(mid, lo, hi)) == value
            b, a = np.where(same & open_, mid, b), np.where(~same & open_, mid, a)
        return b

    s_hi = int(max(edge(hi, lo - 1).max(), lo))
    s_lo = int(min(edge(lo, hi + 1).min(), hi))
    got = (min(s_lo, s_hi), max(s_lo, s_hi))
    if len(_BOUNDS) >= _BOUNDS_SIZE:
        _BOUNDS.clear()
    _BOUNDS[key] = got
    return got


def clamp_bounds(stages, lo: int, hi: int) -> tuple[int, int]:
    """The range the requantization core clamps its input to: :func:`saturation_bounds`
    where that cuts the multiplier's operand into fewer pieces wider than
    :data:`~onnx2fpga.plan.devices.LUT_PRODUCT_MAX_BITS` (hard multipliers: of 18 bits, an
    ECP5 ``MULT18X18D``'s operand, or of 16, an iCE40 ``SB_MAC16``'s; or as many, but fewer
    narrow ones, each a LUT product dearer than the clamp) or spares a float32 stage
    its input's rounding to 24 significant bits (two pipeline steps); otherwise ``[lo, hi]``
    (a clamp that saves nothing costs two comparators)."""
    lo, hi = int(lo), int(hi)
    s_lo, s_hi = saturation_bounds(stages, lo, hi)
    if (s_lo, s_hi) == (lo, hi):
        return lo, hi
    full, sat = IntType.for_range(lo, hi).bits, IntType.for_range(s_lo, s_hi).bits
    m = np.unique(np.asarray(stages[0].multiplier))
    product = not (m.size == 1 and int(m[0]) & (int(m[0]) - 1) == 0)   # not 0, 1, 2**k

    def pieces(bits, size):             # (hard multipliers, LUT products: narrow pieces)
        widths = operand_pieces(bits, size)
        return sum(w > LUT_PRODUCT_MAX_BITS for w in widths), len(widths)
    fewer = product and any(pieces(sat, c) < pieces(full, c) for c in (16, 18))
    rounding = stages[0].rounding == "float32" and float32_input_rounds(lo, hi) and \
        not float32_input_rounds(s_lo, s_hi)
    return (s_lo, s_hi) if fewer or rounding else (lo, hi)


def requant_latency(stages, in_type=None) -> int:
    """Latency of a :class:`~onnx2fpga.hw.requant.RequantCore` of ``stages`` on inputs of
    ``in_type`` (``2 + 5 * n`` for ``n`` stages rounding a shift; see :func:`stage_latency`;
    0 for no stage, when no core is built). ``stages`` may be the count of such stages."""
    if isinstance(stages, int):
        return 2 + 5 * stages if stages else 0
    if not stages:
        return 0
    lo, hi = clamp_bounds(stages, in_type.lo, in_type.hi)
    total = 2
    for st in stages:
        total += stage_latency(st, lo, hi)
        lo, hi = st.lo, st.hi
    return total


class RequantTiming(CoreKind):
    """One transfer per cycle, every element :func:`requant_latency` cycles through."""
    kinds = ("requant",)

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        d = requant_latency(stage.params["stages"], stage.in_type)
        return first + d, last + d
