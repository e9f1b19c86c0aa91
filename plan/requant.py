"""Cycle model of the requantization core (:class:`~onnx2fpga.hw.requant.RequantCore`), in the
conventions of :mod:`onnx2fpga.plan.cost`, and the integer arithmetic both share for a stage
rounding ``"float32"`` (onnxruntime's requantization: see :class:`~onnx2fpga.ir.RequantStage`).
"""

from __future__ import annotations

from .stage import CoreKind, Stage

__all__ = ["requant_latency", "stage_latency", "RequantTiming", "round_significant",
           "FLOAT32_BITS", "float32_input_rounds"]

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


def stage_latency(stage, lo: int, hi: int) -> int:
    """Cycles of one stage of the core on inputs in ``[lo, hi]``: 5 (partial products, their
    sum, the offset, rounding and zero point, clip); a ``"float32"`` stage 2 more (the mask
    of the product's bits beyond 24 significant ones, the rounding to them) and 2 more again
    where its input can exceed 2**24 (the same rounding of the input)."""
    if stage.rounding != "float32":
        return 5
    return 7 + (2 if float32_input_rounds(lo, hi) else 0)


def requant_latency(stages, in_type=None) -> int:
    """Latency of a :class:`~onnx2fpga.hw.requant.RequantCore` of ``stages`` on inputs of
    ``in_type`` (``2 + 5 * n`` for ``n`` stages rounding a shift; see :func:`stage_latency`;
    0 for no stage, when no core is built). ``stages`` may be the count of such stages."""
    if isinstance(stages, int):
        return 2 + 5 * stages if stages else 0
    if not stages:
        return 0
    total, lo, hi = 2, in_type.lo, in_type.hi
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
