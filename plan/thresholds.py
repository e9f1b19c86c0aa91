"""Threshold stages: a requantization rewritten as exact thresholds where it is monotonic, and
what a threshold core costs against a multiplier (LUTs and latency), which decides between the
two (:func:`onnx2fpga.plan.graph.stage_cores`).
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.stages import RequantStage, ThresholdStage
from ..ir.types import IntType
from ..sim import golden
from .checks import check_count
from .stage import CoreKind, Stage, value_key

__all__ = [
    "requant_as_thresholds", "affine_range", "sign_split", "THRESHOLD_PARALLEL_MAX",
    "threshold_search", "threshold_stage_latency", "threshold_table", "threshold_latency",
    "requant_luts", "threshold_luts", "threshold_is_cheaper", "ThresholdTiming",
]


def _as_channels(arr, channels: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(arr, np.int64).reshape(-1), (channels,)).copy()


def _direction(stage: RequantStage, channels: int, in_lo: int, in_hi: int) -> np.ndarray:
    """Per channel: +1 if the stage is non-decreasing over ``[in_lo, in_hi]``, -1 if
    non-increasing, 0 if constant, 2 if neither.

    The value before rounding, ``v = (x - in_zero_point) * m + off`` (or the negative side's
    parameters where that is negative), is affine on at most two intervals of ``x`` (see
    :func:`onnx2fpga.hw.requant.sign_split`); rounding, the zero point and clipping are
    non-decreasing functions of ``v``. So the stage is monotonic on each interval, and the
    sign of the difference of its values at the interval's ends is its direction there
    (exact: no sampling); the two pieces then have to agree and join in order.
    """
    izp = int(stage.in_zero_point)
    m = _as_channels(stage.multiplier, channels)
    off = _as_channels(stage.offset, channels)

    def f(c, x):
        xs = np.zeros((1, channels), np.int64)
        xs[0, c] = x
        return int(golden.requant(xs, stage)[0, c])

    out = np.zeros(channels, np.int64)
    for c in range(channels):
        if stage.neg_multiplier is None:
            pieces = [(in_lo, in_hi)]
        else:
            # x * m + (off - izp * m) < 0 selects the negative side.
            neg, pos = sign_split(int(m[c]), int(off[c]) - izp * int(m[c]), in_lo, in_hi)
            pieces = sorted(p for p in (neg, pos) if p is not None)
        dirs, ends = [], []
        for a, b in pieces:
            fa, fb = f(c, a), f(c, b)
            dirs.append(int(np.sign(fb - fa)))
            ends.append((fa, fb))
        d = 0
        for k, dk in enumerate(dirs):
            if k:       # the join between the pieces: the last value before, the first after
                dj = int(np.sign(ends[k][0] - ends[k - 1][1]))
                if dj:
                    d = dj if d in (0, dj) else 2
            if dk:
                d = dk if d in (0, dk) else 2
        out[c] = d
    return out


def requant_as_thresholds(stage: RequantStage, in_lo: int, in_hi: int,
                          channels: int) -> ThresholdStage | None:
    """The thresholds that compute ``stage`` exactly on every integer of ``[in_lo, in_hi]``.

    The stage is monotonic per channel when it is non-decreasing (multiplier positive) or
    non-increasing (multiplier negative) over the input range, a fused LeakyRelu's negative
    side included (its slope must have the same sign and its values must join in order); all
    channels must go the same way (a channel that is constant goes either way), because a
    :class:`~onnx2fpga.ir.ThresholdStage` has one ``base`` and ``step``.

    A non-decreasing stage gives ``base = min_c f_c(in_lo)``, ``step = 1`` and, for every
    output level ``v`` above the base up to ``max_c f_c(in_hi)``, the threshold
    ``min {x in [in_lo, in_hi] : f_c(x) >= v}`` (``in_hi + 1`` where no input reaches ``v``);
    a non-increasing one ``base = max_c f_c(in_lo)``, ``step = -1`` and
    ``min {x : f_c(x) <= v}``. Each threshold is found by a binary search over the integers
    evaluating :func:`onnx2fpga.sim.golden.requant` itself, so rounding ties, clipping and
    the LeakyRelu branch are exactly those of the golden model (no float division).

    Parameters
    ----------
    stage : RequantStage
        ``multiplier`` and ``offset`` (and the negative side's) with one entry or
        ``channels`` (1-D, as :class:`~onnx2fpga.hw.requant.RequantCore` takes them).
    in_lo, in_hi : int
        The input range, ``in_lo <= in_hi``.
    channels : int
        Number of channels the parameters cycle through.

    Returns
    -------
    ThresholdStage or None
        ``thresholds`` of shape ``(channels, n)`` (``(1, n)`` when every channel has the same
        ones), ``out_type`` that of ``stage``; None if the stage is not monotonic.

    Raises
    ------
    TypeError
        If ``stage`` is not a RequantStage or a bound or ``channels`` is not an integer.
    ValueError
        If ``in_lo > in_hi``, ``channels < 1`` or a parameter has neither 1 nor ``channels``
        entries.
    """
    if not isinstance(stage, RequantStage):
        raise TypeError(f"Stage must be a RequantStage, not {stage!r}")
    for name, v in (("in_lo", in_lo), ("in_hi", in_hi)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise TypeError(f"{name} must be an integer, not {v!r}")
    in_lo, in_hi = int(in_lo), int(in_hi)
    if in_lo > in_hi:
        raise ValueError(f"in_lo must not exceed in_hi, not [{in_lo}, {in_hi}]")
    channels = check_count("Channels", channels)
    for name in ("multiplier", "offset", "neg_multiplier", "neg_offset"):
        arr = getattr(stage, name)
        if arr is not None and arr.size not in (1, channels):
            raise ValueError(f"Stage {name} must have 1 or {channels} entries, not {arr.size}")
    # The planner asks again for every plan board folding tries (a second per convolution
    # of MobileNetV1): the answers are kept, by value.
    key = (value_key(stage), in_lo, in_hi, channels)
    if key not in _THRESHOLDS:
        if len(_THRESHOLDS) >= 4096:
            del _THRESHOLDS[next(iter(_THRESHOLDS))]
        _THRESHOLDS[key] = _requant_as_thresholds(stage, in_lo, in_hi, channels)
    th = _THRESHOLDS[key]
    return None if th is None else ThresholdStage(th.thresholds.copy(), th.base, th.step,
                                                  th.out_type)


_THRESHOLDS: dict = {}


def _requant_as_thresholds(stage, in_lo, in_hi, channels):
    dirs = _direction(stage, channels, in_lo, in_hi)
    if np.any(dirs == 2) or (np.any(dirs == 1) and np.any(dirs == -1)):
        return None
    up = not np.any(dirs == -1)

    def f(x):                                    # x: (channels, k) -> f_c(x[c, i])
        return golden.requant(x.T, stage).T

    ends = f(np.array([[in_lo, in_hi]] * channels, np.int64))
    if up:
        base, top = int(ends[:, 0].min()), int(ends[:, 1].max())
        levels = np.arange(base + 1, top + 1, dtype=np.int64)
    else:
        base, top = int(ends[:, 0].max()), int(ends[:, 1].min())
        levels = np.arange(base - 1, top - 1, -1, dtype=np.int64)
    n = len(levels)
    # Binary search for the first x reaching each level: the answer lies in [a, b], where
    # b = in_hi + 1 stands for "never".
    a = np.full((channels, n), in_lo, np.int64)
    b = np.full((channels, n), in_hi + 1, np.int64)
    v = np.broadcast_to(levels, (channels, n))
    while np.any(a < b):
        mid = (a + b) // 2                       # floor: a <= mid < b <= in_hi + 1
        fm = f(np.minimum(mid, in_hi))
        reached = (fm >= v) if up else (fm <= v)
        reached &= a < b
        b = np.where(reached, mid, b)
        a = np.where(~reached & (a < b), mid + 1, a)
    thresholds = a
    if channels > 1 and np.all(thresholds == thresholds[:1]):
        thresholds = thresholds[:1]
    return ThresholdStage(thresholds, base, 1 if up else -1, stage.out_type)


def affine_range(m: int, off: int, lo: int, hi: int) -> tuple[int, int]:
    """The range of ``x * m + off`` for ``x`` in ``[lo, hi]``."""
    return min(lo * m, hi * m) + off, max(lo * m, hi * m) + off


def sign_split(m: int, off: int, lo: int, hi: int):
    """The parts of ``[lo, hi]`` where ``x * m + off`` is negative and where it is not:
    ``(negative, non_negative)``, each an interval ``(lo, hi)`` or None if empty."""
    if m > 0:
        t = (-off - 1) // m             # the largest x with x * m + off < 0
        neg, pos = (lo, min(hi, t)), (max(lo, t + 1), hi)
    elif m < 0:
        t = off // -m                   # the largest x with x * m + off >= 0
        neg, pos = (max(lo, t + 1), hi), (lo, min(hi, t))
    else:
        neg, pos = ((lo, hi), (1, 0)) if off < 0 else ((1, 0), (lo, hi))
    return (neg if neg[0] <= neg[1] else None), (pos if pos[0] <= pos[1] else None)


#: The most thresholds per stage that :class:`~onnx2fpga.hw.threshold.ThresholdCore` compares
#: in parallel (a 4-bit output); more are searched in binary.
THRESHOLD_PARALLEL_MAX = 15


def threshold_search(n: int) -> str:
    """How a :class:`~onnx2fpga.hw.threshold.ThresholdCore` computes a stage of ``n``
    thresholds: ``"parallel"`` (``n`` comparators per lane) up to
    :data:`THRESHOLD_PARALLEL_MAX`, else ``"binary"`` (``n.bit_length()`` comparators, each
    choosing among ``2**L`` thresholds: past 16 levels the comparator bank grows faster
    than the search's multiplexers)."""
    return "parallel" if n <= THRESHOLD_PARALLEL_MAX else "binary"


def threshold_stage_latency(n: int, search: str | None = None, table: bool = False) -> int:
    """Cycles one threshold stage of ``n`` thresholds adds: 2 in parallel (compare, then
    count), plus 1 when the thresholds differ between channels (``table``: they come from a
    ROM, block RAM on most devices, whose output is registered before the comparators: a
    block RAM's clock-to-output delay plus a wide comparator missed 100 MHz on the ECP5);
    ``k = max(1, n.bit_length())`` levels of a binary search, ``3k - 1`` with a ``table``:
    the same register behind each level's table (a MobileNetV1 build closed at 87.7 MHz on
    a level's block RAM, 5.6 ns clock-to-output, through the comparator into the next
    level's block RAM address), and one before each later level's table, whose address is
    then registered (with the first register only, MobileNetV1 closed at 91.1 MHz on the
    table register, the comparator and the next level's address)."""
    search = search or threshold_search(n)
    if search == "parallel":
        return 3 if table and n else 2
    levels = max(1, int(n).bit_length())
    return 3 * levels - 1 if table else levels


def threshold_table(stage, channels: int, lanes: int) -> bool:
    """Whether a :class:`~onnx2fpga.hw.threshold.ThresholdCore` reads ``stage``'s
    thresholds from a table: they differ between channels (more than one row) and a lane
    sees more than one channel (``channels`` is not a divisor of ``lanes``)."""
    return stage.thresholds.shape[0] > 1 and channels // math.gcd(channels, lanes) > 1


def threshold_latency(stages, channels: int = 1, lanes: int = 1) -> int:
    """Latency of a :class:`~onnx2fpga.hw.threshold.ThresholdCore` of ``stages``
    (ThresholdStages, with the automatic choice of search) over ``channels`` in ``lanes``:
    an input register plus every stage's :func:`threshold_stage_latency`."""
    return 1 + sum(threshold_stage_latency(st.thresholds.shape[1],
                                           table=threshold_table(st, channels, lanes))
                   for st in stages)


def _bits(lo: int, hi: int) -> int:
    return IntType.for_range(min(int(lo), 0), max(int(hi), 0)).bits


# Resource estimates (LUT4 per lane) that decide between requantization and thresholds.
# A LUT-built multiplier costs about 3 LUT4 per partial-product bit (DESIGN.md: 206 LUT4 for
# 8x8, 60 for 4x4 on iCE40); a constant multiplier one adder per set bit after the first; a
# comparator or an adder one LUT4 per bit (with the carry chain); a 2:1 multiplexer one per
# bit; a bit of a per-channel table 1/16 of a LUT4 (a LUT4 holds 16 bits; yosys 0.70 leaves
# these small ROMs in LUTs). DSP blocks are not counted: on a device with spare multipliers
# the requantization is cheaper than this (benchmarks/lowbit_resources.py measures both).


def requant_luts(stage, in_bits: int, channels: int) -> float:
    """Estimated LUT4 of one lane of one :class:`~onnx2fpga.ir.RequantStage` on
    ``in_bits``-wide inputs, its parameters cycling through ``channels``: the multiplier
    (none for a constant multiplier of 0 or 1), the offset and rounding adders (a float32
    stage's rounding to 24 bits too), the clip comparators and multiplexers, and the
    per-channel parameter table (see the comment above)."""
    luts, table = 0.0, 0
    sides = [(stage.multiplier, stage.offset)]
    if stage.neg_multiplier is not None:
        sides.append((stage.neg_multiplier, stage.neg_offset))
        luts += in_bits                                  # choosing a side
    v_bits = in_bits
    for mult, off in sides:
        m_bits = _bits(mult.min(), mult.max())
        if mult.size > 1:
            luts += 3 * in_bits * m_bits
        else:                                            # shift and add per set bit
            ones = bin(abs(int(mult[0]))).count("1")
            luts += max(ones - 1, 0) * (in_bits + m_bits)
        v_bits = max(v_bits, in_bits + m_bits, _bits(off.min(), off.max()) + 1)
        luts += v_bits                                   # + offset
        for arr in (mult, off):
            if arr.size > 1:
                table += channels * _bits(arr.min(), arr.max())
    if stage.rounding == "float32":
        # The mask of the bits beyond 24 significant ones (a suffix OR, about one LUT4 per
        # bit) and the rounding adder, on the product; on the input too where it can exceed
        # 2**24 (see plan.requant.stage_latency).
        luts += 2 * v_bits + (2 * in_bits if in_bits > 25 else 0)
    r_bits = max(v_bits - int(stage.shift), stage.out_type.bits)
    luts += v_bits + 4 * r_bits                          # rounding; clip compare and mux
    return luts + table / 16


def threshold_luts(n: int, in_bits: int, channels: int, per_channel: bool) -> float:
    """Estimated LUT4 of one lane of a threshold stage of ``n`` thresholds on
    ``in_bits``-wide inputs (comparators ``in_bits + 1`` wide, see
    :class:`~onnx2fpga.hw.threshold.ThresholdCore`), the thresholds per channel
    (``per_channel``, a table of ``channels`` rows) or constants."""
    w = in_bits + 1
    table = channels * n * w if per_channel else 0
    if threshold_search(n) == "parallel":
        return n * w + n + table / 16                    # comparators, count
    levels = max(1, int(n).bit_length())
    luts = levels * w
    if not per_channel:                                  # constant multiplexers per level
        luts += w * sum(-(-(1 << level) // 16) for level in range(1, levels))
    return luts + table / 16


def threshold_is_cheaper(stage, thresholds, in_bits: int, channels: int) -> bool:
    """True if ``thresholds`` (the ThresholdStage computing ``stage`` exactly, from
    :func:`onnx2fpga.hw.threshold.requant_as_thresholds`) is estimated to cost no more
    LUT4 than the requantization ``stage`` (:func:`threshold_luts` against
    :func:`requant_luts`)."""
    t = thresholds.thresholds
    return threshold_luts(t.shape[1], in_bits, channels, t.shape[0] > 1) <= \
        requant_luts(stage, in_bits, channels)


class ThresholdTiming(CoreKind):
    """A :class:`~onnx2fpga.hw.threshold.ThresholdCore`: one transfer per cycle,
    :func:`threshold_latency` cycles through."""
    kinds = ("threshold",)

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        d = threshold_latency(stage.params["stages"], stage.params["channels"],
                              stage.in_lanes)
        return first + d, last + d
