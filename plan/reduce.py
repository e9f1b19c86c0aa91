"""Geometry and cycle model of the window reduction core
(:class:`~onnx2fpga.hw.reduce.WindowReduceCore`): the reductions it knows, where it keeps its
partial results, and its cycles and latency in the conventions of :mod:`onnx2fpga.plan.cost`.
"""

from __future__ import annotations

import numpy as np

from .checks import check_count, check_lanes
from .stage import CoreKind, Stage, spaced

__all__ = ["REGISTER_FOLDS_MAX", "REDUCE_OPS", "reduce_cycles", "reduce_latency", "ReduceTiming"]


#: Up to this many channel folds the partial results live in registers; beyond, in a memory.
#: At least 1: the memory path relies on two folds or more (read-after-write spacing).
REGISTER_FOLDS_MAX = 16


REDUCE_OPS = ("max", "sum")


def check_geometry(channels, window, lanes) -> tuple[int, int, int]:
    """Validated ``(channels, window, lanes)``; ``lanes`` must divide ``channels``."""
    channels = check_count("Channels", channels)
    window = check_count("Window", window)
    lanes = check_lanes(lanes, channels)
    return channels, window, lanes


def fold_storage(window: int, folds: int, registers_max: int) -> str:
    """Where a reduction over ``window`` positions keeps the partial results of its ``folds``
    folds: ``"none"`` for ``window == 1`` (nothing to keep), ``"registers"`` up to
    ``registers_max`` folds, ``"memory"`` beyond."""
    if window == 1:
        return "none"
    return "registers" if folds <= registers_max else "memory"


def reduce_cycles(channels: int, window: int, lanes: int = 1) -> int:
    """Steady-state cycles per output pixel of a :class:`WindowReduceCore`.

    ``window * (channels // lanes)``: the core takes one input transfer per cycle and its
    outputs never hold up the next window, so a group costs exactly its input transfers (when
    the output is not stalled).

    Raises
    ------
    TypeError, ValueError
        If a count is not a positive integer or ``lanes`` does not divide ``channels``.
    """
    channels, window, lanes = check_geometry(channels, window, lanes)
    return window * (channels // lanes)


def reduce_latency(channels: int, window: int, lanes: int = 1) -> int:
    """Cycles from the first input transfer of a group to its last output transfer.

    ``window * (channels // lanes) + 1`` with the input at one transfer per cycle, the output
    never stalled and the core idle before: the last input transfer comes
    ``window * folds - 1`` cycles after the first, then the input register and the output
    register take one cycle each.

    Raises
    ------
    TypeError, ValueError
        If a count is not a positive integer or ``lanes`` does not divide ``channels``.
    """
    return reduce_cycles(channels, window, lanes) + 1


class ReduceTiming(CoreKind):
    """A :class:`~onnx2fpga.hw.reduce.WindowReduceCore`: one input transfer per cycle; a
    group's last output 2 cycles after its last input."""
    kinds = ("reduce",)
    extra = 0

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        window, folds = stage.params["window"], stage.params["channels"] // stage.in_lanes
        return (first + (window - 1) * folds + 2 + self.extra, last + 2 + self.extra)

    def trace(self, stage: Stage, ins: list) -> np.ndarray:
        """Fold ``f`` of a group leaves 2 cycles (:class:`DepthwiseTiming`: 3) after the
        group's last window position of that fold came in."""
        window, folds = stage.params["window"], stage.params["channels"] // stage.in_lanes
        t = ins[0]
        if len(t) % (window * folds) or stage.out_beats * window != len(t) or \
                stage.in_lanes != stage.out_lanes:
            return super().trace(stage, ins)
        last_pos = t.reshape(-1, window * folds)[:, (window - 1) * folds:]
        return spaced(last_pos.reshape(-1) + 2 + self.extra)
