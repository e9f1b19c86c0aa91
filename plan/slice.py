"""Cycle model of the slice core (:class:`onnx2fpga.hw.slice.SliceCore`: a channel range of
a channels-last stream), in the conventions of :mod:`onnx2fpga.plan.cost`.
"""

from __future__ import annotations

from .checks import check_count
from .stage import CoreKind, Stage

__all__ = ["SLICE_LATENCY", "check_slice", "SliceTiming"]

#: Cycles from a kept input transfer to its output transfer.
SLICE_LATENCY = 1


def check_slice(period, start, stop) -> tuple[int, int, int]:
    """``(period, start, stop)`` checked: ``0 <= start < stop <= period``, in transfers.

    Raises
    ------
    TypeError, ValueError
        If they are not integers in that order.
    """
    period = check_count("Period", period)
    start = check_count("Start", start, 0)
    stop = check_count("Stop", stop)
    if not start < stop <= period:
        raise ValueError(f"Slice must satisfy 0 <= start < stop <= period, not start={start}, "
                         f"stop={stop}, period={period}")
    return period, start, stop


class SliceTiming(CoreKind):
    """A slice: every input transfer is taken one per cycle; a kept one leaves
    :data:`SLICE_LATENCY` cycle later. The first output comes ``start`` transfers after the
    first input, the last ``period - stop`` transfers before the last input is taken."""
    kinds = ("slice",)

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        p = stage.params
        return (first + p["start"] + SLICE_LATENCY,
                last - (p["period"] - p["stop"]) + SLICE_LATENCY)
