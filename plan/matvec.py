"""Cycle model of the matrix-vector core (:class:`~onnx2fpga.hw.matvec.MatVecCore`): its
pipeline depth, latency and cycles per inference, in the conventions of
:mod:`onnx2fpga.plan.cost`.
"""

from __future__ import annotations

import numpy as np

from .stage import CoreKind, Stage, spaced, spaced_before

__all__ = [
    "ADDER_LEVELS_PER_STAGE", "matvec_tree_stages", "matvec_stages", "matvec_latency",
    "MatVecTiming",
]


#: Adder levels between two registers of :class:`~onnx2fpga.hw.matvec.MatVecCore`'s adder tree:
#: two levels of 16..24-bit carry chains and their routing fit a 10 ns cycle on ECP5.
ADDER_LEVELS_PER_STAGE = 2


def matvec_tree_stages(simd: int) -> int:
    """Register stages of the adder tree of a :class:`~onnx2fpga.hw.matvec.MatVecCore` that
    sums ``simd`` products: ``ceil(log2(simd))`` adder levels, at most
    :data:`ADDER_LEVELS_PER_STAGE` per stage, at least one stage."""
    levels = (int(simd) - 1).bit_length()
    return max(1, -(-levels // ADDER_LEVELS_PER_STAGE))


def matvec_stages(simd: int, dsp_register: bool = False) -> int:
    """Pipeline registers of a :class:`~onnx2fpga.hw.matvec.MatVecCore` between its memories
    and its accumulator: memory data, operand registers, products, with ``dsp_register`` a
    second register of the products, and the adder tree's :func:`matvec_tree_stages` (4 for
    ``simd <= 4``, 5 up to 16, 6 up to 64, one more with ``dsp_register``)."""
    return 3 + bool(dsp_register) + matvec_tree_stages(simd)


def matvec_latency(folds: int, groups: int, simd: int, dsp_register: bool = False) -> int:
    """Latency of a :class:`~onnx2fpga.hw.matvec.MatVecCore` with ``folds`` input transfers and
    ``groups`` output transfers per vector and ``simd`` products per output and step:
    ``folds + folds * groups + matvec_stages(simd, dsp_register)``."""
    return folds + folds * groups + matvec_stages(simd, dsp_register)


def _stages(stage: Stage) -> int:
    """:func:`matvec_stages` of a matvec stage."""
    return matvec_stages(stage.params["layer"].simd, stage.params.get("dsp_register", False))


def _matvec_figures(stage: Stage) -> tuple[int, int, int]:
    """``(folds, groups, vectors)`` of a matvec stage."""
    layer = stage.params["layer"]
    folds = layer.in_features // layer.simd
    groups = layer.out_features // layer.pe
    return folds, groups, stage.size // layer.out_features


class MatVecTiming(CoreKind):
    """``folds * groups`` cycles per vector; the first output ``folds + 1 + d`` cycles after
    the last input of a lone vector (``d = matvec_stages(simd)``), or ``2 * folds + d`` after
    the first input when vectors follow each other (a convolution's pixels)."""
    kinds = ("matvec",)

    def cycles(self, stage: Stage) -> int:
        folds, groups, vectors = _matvec_figures(stage)
        return max(stage.in_beats, stage.out_beats, vectors * folds * groups)

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        folds, groups, vectors = _matvec_figures(stage)
        d = _stages(stage)
        if vectors == 1:
            first_out = last + folds + 1 + d
        else:
            first_out = first + 2 * folds + d
        return first_out, last + folds * groups + 1 + d

    def trace(self, stage: Stage, ins: list) -> np.ndarray:
        """Vector ``v`` is computed from the cycle after its last input transfer or after
        vector ``v - 1``'s ``folds * groups`` steps, whichever is later (the input buffer is
        double: the next vector loads meanwhile); its group ``g`` leaves
        ``(g + 1) * folds + d`` cycles after that start."""
        folds, groups, vectors = _matvec_figures(stage)
        t = ins[0]
        if len(t) != vectors * folds or stage.out_beats != vectors * groups:
            return super().trace(stage, ins)
        d = _stages(stage)
        g = (np.arange(groups, dtype=np.int64) + 1) * folds + d
        return (_starts(t, folds, groups)[:, None] + g[None, :]).reshape(-1)

    def takes(self, stage: Stage, ins: list, taken=None) -> list:
        """The input buffer is double: vector ``v`` is written into the bank vector ``v - 2``
        was computed from, one transfer per cycle from the cycle after that vector's
        ``folds * groups`` steps (with ``taken``, no earlier than ``d`` cycles before its
        last output is taken: a stalled output stops the steps), no earlier than offered."""
        folds, groups, vectors = _matvec_figures(stage)
        t = np.asarray(ins[0], dtype=np.int64)
        if len(t) != vectors * folds or stage.out_beats != vectors * groups:
            return super().takes(stage, ins, taken)
        done = _starts(t, folds, groups) + folds * groups
        if taken is not None:
            d = _stages(stage)
            done = np.maximum(done, np.asarray(taken)[groups - 1::groups] - d)
        free = np.concatenate([np.full(min(2, vectors), np.iinfo(np.int64).min // 2),
                               done[:-2]])
        k = np.arange(folds, dtype=np.int64)
        return [spaced(np.maximum(t, (free[:, None] + k[None, :]).reshape(-1)))]

    def deadlines(self, stage: Stage, ins: list, late=None) -> list:
        """Vector ``v``'s last transfer the cycle before its computation starts, as late as
        its groups may leave (group ``g`` ``(g + 1) * folds + d`` cycles after the start) and
        the next vector start on time."""
        folds, groups, vectors = _matvec_figures(stage)
        t = np.asarray(ins[0], dtype=np.int64)
        if len(t) != vectors * folds or stage.out_beats != vectors * groups:
            return super().deadlines(stage, ins, late)
        steps = folds * groups
        start = _starts(t, folds, groups)
        if late is not None:
            d = _stages(stage)
            g = (np.arange(groups, dtype=np.int64) + 1) * folds + d
            start = (np.asarray(late).reshape(vectors, groups) - g[None, :]).min(axis=1)
            v = np.arange(vectors, dtype=np.int64) * steps
            start = np.minimum.accumulate((start - v)[::-1])[::-1] + v
        k = np.arange(folds, dtype=np.int64)
        return [spaced_before((start[:, None] - folds + k[None, :]).reshape(-1))]


def _starts(t: np.ndarray, folds: int, groups: int) -> np.ndarray:
    """Cycle at which each vector's computation starts: the cycle after its last input
    transfer ``t`` or after the previous vector's ``folds * groups`` steps, whichever is
    later."""
    steps = folds * groups
    v = np.arange(len(t) // folds, dtype=np.int64) * steps
    return np.maximum.accumulate(t[folds - 1::folds] + 1 - v) + v
