"""Lookup-table stages: a table turned into exact thresholds where it is monotonic, the
stages after a table folded into it, and the cycle model of the table core
(:class:`~onnx2fpga.hw.lut.LutCore`), in the conventions of :mod:`onnx2fpga.plan.cost`.
"""

from __future__ import annotations

import numpy as np

from ..ir.stages import LutStage, ThresholdStage
from ..sim import golden
from .stage import CoreKind, Stage

__all__ = ["LUT_MAX_INPUT_BITS", "lut_as_thresholds", "lut_then", "lut_window",
           "lut_latency", "LUT_THRESHOLDS_MAX", "prefer_thresholds", "LutTiming"]

#: The widest input a table is built for: ``2**12`` entries per channel.
LUT_MAX_INPUT_BITS = 12


def lut_as_thresholds(stage: LutStage) -> ThresholdStage | None:
    """The thresholds computing ``stage`` exactly on every input it covers, or None if a
    channel's table is not monotonic or the channels do not all go the same way.

    A non-decreasing table gives ``base = min_c table[c, 0]``, ``step = 1`` and, for every
    level ``v`` above the base up to the largest entry, the threshold ``in_lo + #{i :
    table[c, i] < v}`` (the first input reaching ``v``; past the table's end where none
    does); a level several entries jump over is a repeated threshold. A non-increasing one
    counts downwards (``step = -1``) the same way.
    """
    t = stage.table
    d = np.diff(t, axis=1)
    up = bool(np.all(d >= 0))
    if not up and not np.all(d <= 0):
        return None
    if up:
        base, top = int(t[:, 0].min()), int(t[:, -1].max())
        levels = np.arange(base + 1, top + 1, dtype=np.int64)
        counts = (t[:, :, None] < levels[None, None, :]).sum(axis=1)
    else:
        base, top = int(t[:, 0].max()), int(t[:, -1].min())
        levels = np.arange(base - 1, top - 1, -1, dtype=np.int64)
        counts = (t[:, :, None] > levels[None, None, :]).sum(axis=1)
    thresholds = stage.in_lo + counts.reshape(t.shape[0], len(levels))
    if len(thresholds) > 1 and np.all(thresholds == thresholds[:1]):
        thresholds = thresholds[:1]
    return ThresholdStage(thresholds, base, 1 if up else -1, stage.out_type)


def lut_then(stage: LutStage, after, channels: int) -> LutStage:
    """``stage`` followed by the elementwise stage ``after`` (a RequantStage,
    ThresholdStage or LutStage with 1 or ``channels`` entries, in stream form), as one table:
    :func:`onnx2fpga.sim.golden.requant` of ``after`` applied to every entry."""
    t = np.broadcast_to(stage.table, (channels, stage.table.shape[1]))
    after_t = golden.requant(t.T, after).T
    if len(after_t) > 1 and np.all(after_t == after_t[:1]):
        after_t = after_t[:1]
    return LutStage(after_t, stage.in_lo, after.out_type)


def lut_window(stage: LutStage, lo: int, hi: int) -> LutStage:
    """``stage`` cut to the inputs ``[lo, hi]`` that can reach it (the entries outside are
    never read), within the inputs it covers."""
    lo, hi = max(int(lo), stage.in_lo), min(int(hi), stage.in_hi)
    if lo > hi:
        lo = hi = stage.in_lo
    t = stage.table[:, lo - stage.in_lo:hi - stage.in_lo + 1]
    if len(t) > 1 and np.all(t == t[:1]):
        t = t[:1]
    return LutStage(t, lo, stage.out_type)


#: The most thresholds a monotonic table becomes (an 8-bit output); a table with more
#: levels is looked up.
LUT_THRESHOLDS_MAX = 255


def prefer_thresholds(stage: LutStage, th: ThresholdStage) -> bool:
    """True if the thresholds ``th`` computing the table ``stage`` are taken instead of it:
    at most :data:`LUT_THRESHOLDS_MAX` of them. Measured with :mod:`onnx2fpga.hw.resources`
    on an 8-bit Sigmoid (256 entries, 246 thresholds): on an ECP5 the table 308 LUT4 in soft
    logic and the thresholds 306; on an iCE40 the table one of the 30 block RAMs of an UP5K
    (and 15 LUT4), the thresholds 247 LUT4 and no memory, leaving the block RAMs to the
    weights. Past 8-bit outputs the binary search's constant multiplexers grow faster than
    the table (a 12-bit ramp: 5,202 LUT4 on an iCE40 against 12 block RAMs)."""
    return th.thresholds.shape[1] <= LUT_THRESHOLDS_MAX


def lut_latency() -> int:
    """Latency of a :class:`~onnx2fpga.hw.lut.LutCore`: the table's read register and an
    output register (2 cycles)."""
    return 2


class LutTiming(CoreKind):
    """A :class:`~onnx2fpga.hw.lut.LutCore`: one transfer per cycle, :func:`lut_latency`
    cycles through."""
    kinds = ("lut",)

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        d = lut_latency()
        return first + d, last + d
