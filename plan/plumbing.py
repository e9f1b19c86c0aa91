"""Cycle models of the stream plumbing (:mod:`onnx2fpga.hw.plumbing`: FIFOs and width
converters) and of casts (wires), in the conventions of :mod:`onnx2fpga.plan.cost`.
"""

from __future__ import annotations

import numpy as np

from .stage import CoreKind, Stage, spaced

__all__ = ["FLOP_FIFO_DEPTH", "fifo_latency", "FifoTiming", "ConvertTiming", "CastTiming"]

#: The deepest :class:`~onnx2fpga.hw.plumbing.StreamFIFO` kept in flip-flops (1 cycle through);
#: deeper queues are in block RAM.
FLOP_FIFO_DEPTH = 4


def fifo_latency(depth: int, out_register: bool = False) -> int:
    """Cycles from a write into a :class:`~onnx2fpga.hw.plumbing.StreamFIFO` of ``depth`` to the
    earliest read (0 for depth 0, which is a plain connection); one more for a queue in block
    RAM with ``out_register``."""
    if depth <= 0:
        return 0
    return 1 if depth <= FLOP_FIFO_DEPTH else 2 + bool(out_register)


class FifoTiming(CoreKind):
    """A :class:`~onnx2fpga.hw.plumbing.StreamFIFO`: :func:`fifo_latency` cycles through. A
    queue between layers takes what it is offered (:mod:`onnx2fpga.plan.fifos` sizes it); a
    pipeline register (params ``pipeline``, depth 1) takes transfer ``k`` once transfer
    ``k - 1`` leaves, in the same cycle; a skid buffer (``pipeline``, depth 2) once
    transfer ``k - 2`` has left, a cycle later (its ready is a register)."""
    kinds = ("fifo",)
    paced = False
    plumbing = True

    def takes(self, stage: Stage, ins: list, taken=None) -> list:
        ins = [np.asarray(t, dtype=np.int64) for t in ins]
        if taken is None or not stage.params.get("pipeline") or len(taken) != len(ins[0]):
            return super().takes(stage, ins, taken)
        lag, taken = stage.params["depth"], np.asarray(taken, dtype=np.int64)
        before = np.full(len(taken), np.iinfo(np.int64).min // 4)
        before[lag:] = taken[:len(taken) - lag] + (lag - 1)
        return [spaced(np.maximum(ins[0], before))]

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        d = fifo_latency(stage.params["depth"], stage.params.get("out_register", False))
        return first + d, last + d

    def trace(self, stage: Stage, ins: list) -> np.ndarray:
        return ins[0] + fifo_latency(stage.params["depth"],
                                     stage.params.get("out_register", False))


class ConvertTiming(CoreKind):
    """A :class:`~onnx2fpga.hw.plumbing.WidthConverter`: gathering ``k`` transfers, the output
    1 cycle after the last; splitting into ``k``, the last piece ``k`` cycles after the
    input transfer."""
    kinds = ("convert",)
    paced = False
    plumbing = True

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        if stage.out_lanes > stage.in_lanes:
            k = stage.out_lanes // stage.in_lanes
            return first + k, last + 1
        if stage.out_lanes < stage.in_lanes:
            k = stage.in_lanes // stage.out_lanes
            return first + 1, last + k
        return first, last

    def trace(self, stage: Stage, ins: list) -> np.ndarray:
        t = ins[0]
        if stage.out_lanes > stage.in_lanes:
            k = stage.out_lanes // stage.in_lanes
            return t[k - 1::k] + 1
        if stage.out_lanes < stage.in_lanes:
            k = stage.in_lanes // stage.out_lanes
            return spaced(np.repeat(t, k) + 1 + np.tile(np.arange(k), len(t)))
        return t


class CastTiming(CoreKind):
    """A value-preserving change of element type: wires."""
    kinds = ("cast",)
    paced = False
    plumbing = True

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        return first, last

    def trace(self, stage: Stage, ins: list) -> np.ndarray:
        return ins[0]
