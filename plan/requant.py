"""Cycle model of the requantization core (:class:`~onnx2fpga.hw.requant.RequantCore`), in the
conventions of :mod:`onnx2fpga.plan.cost`.
"""

from __future__ import annotations

from .stage import CoreKind, Stage

__all__ = ["requant_latency", "RequantTiming"]


def requant_latency(stages: int) -> int:
    """Latency of a :class:`~onnx2fpga.hw.requant.RequantCore` of ``stages`` stages
    (``2 + 5 * stages``; 0 for no stage, when no core is built)."""
    return 2 + 5 * stages if stages else 0


class RequantTiming(CoreKind):
    """One transfer per cycle, every element :func:`requant_latency` cycles through."""
    kinds = ("requant",)

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        d = requant_latency(len(stage.params["stages"]))
        return first + d, last + d
