"""Elementwise stages: requantization by multiplier and shift, thresholds, and lookup tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .types import ROUNDINGS, IntType, float32_scales

__all__ = ["RequantStage", "ThresholdStage", "LutStage"]


@dataclass
class RequantStage:
    """One requantization step, per channel ``c``::

        y = clip(round_shift((x - in_zero_point) * multiplier[c] + offset[c], shift)
                 + zero_point, lo, hi)

    ``round_shift(v, s)`` divides by ``2**s`` and rounds to the nearest integer, ties to even
    (``rounding="half_even"``, as ONNX QuantizeLinear) or away from zero (``"half_away"``),
    or rounds the quotient down (``"floor"``), up (``"ceil"``) or towards zero
    (``"to_zero"``): the rounding modes of QONNX Quant and Trunc.

    ``rounding="float32"`` is onnxruntime's requantization of its integer kernels
    (QLinearConv, QGemm, QLinearMatMul: MLAS ``MlasRequantizeOutput``) instead::

        y = clip(rne(f32(f32(x - in_zero_point) * S[c])) + zero_point, lo, hi)

    with ``S[c] = multiplier[c] / 2**shift`` exactly a float32, ``f32`` rounding to the
    nearest float32 (24 significant bits, ties to even; the input only changes beyond
    ``2**24``) and ``rne`` to the nearest integer, ties to even: two roundings of the
    product, as the float32 multiplication and the float-to-integer conversion make them.
    ``offset`` must be 0 and there is no negative side.
    ``multiplier`` and ``offset`` are arrays aligned on the left with the logical tensor (see
    the module docstring): one entry per channel, or a single entry for all. A fused ReLU is
    ``lo = zero_point``.

    With ``neg_multiplier`` (and ``neg_offset``), elements whose product
    ``(x - in_zero_point) * multiplier[c] + offset[c]`` is negative use
    ``(x - in_zero_point) * neg_multiplier[c] + neg_offset[c]`` instead: a fused LeakyRelu
    (``neg_multiplier = alpha * multiplier``, ``neg_offset = alpha * offset``).
    """
    multiplier: np.ndarray
    offset: np.ndarray
    shift: int
    zero_point: int
    lo: int
    hi: int
    out_type: IntType
    in_zero_point: int = 0
    rounding: str = "half_even"
    neg_multiplier: np.ndarray | None = None
    neg_offset: np.ndarray | None = None

    def __post_init__(self):
        self.multiplier = np.atleast_1d(np.asarray(self.multiplier, dtype=np.int64))
        self.offset = np.atleast_1d(np.asarray(self.offset, dtype=np.int64))
        if (self.neg_multiplier is None) != (self.neg_offset is None):
            raise ValueError("neg_multiplier and neg_offset must be given together")
        if self.neg_multiplier is not None:
            self.neg_multiplier = np.atleast_1d(np.asarray(self.neg_multiplier, np.int64))
            self.neg_offset = np.atleast_1d(np.asarray(self.neg_offset, np.int64))
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"Rounding must be one of {', '.join(ROUNDINGS)}, not "
                             f"{self.rounding!r}")
        if not (self.out_type.lo <= self.lo <= self.hi <= self.out_type.hi):
            raise ValueError(f"Clip range [{self.lo}, {self.hi}] must lie within "
                             f"{self.out_type.name}")
        if self.shift < 0:
            raise ValueError(f"Shift must be non-negative, not {self.shift!r}")
        if self.rounding == "float32":
            if np.any(self.offset != 0) or self.neg_multiplier is not None:
                raise ValueError("A float32 requantization has no offset and no negative "
                                 "side")
            float32_scales(self.multiplier, self.shift)

    @property
    def per_element(self) -> bool:
        """True if any parameter has more than one entry."""
        return any(a is not None and a.size > 1 for a in
                   (self.multiplier, self.offset, self.neg_multiplier, self.neg_offset))

    def channel_params(self, channels: int) -> tuple[np.ndarray, np.ndarray]:
        """Multiplier and offset broadcast to ``channels`` entries (1-D parameters)."""
        return (np.broadcast_to(self.multiplier.reshape(-1), (channels,)).copy(),
                np.broadcast_to(self.offset.reshape(-1), (channels,)).copy())


@dataclass
class ThresholdStage:
    """An activation quantized by thresholds (FINN's MultiThreshold on integers), per channel
    ``c``::

        y = base + step * #{i : x >= thresholds[c, i]}

    ``thresholds`` is ``(channels, n)`` (or ``(1, n)`` for all), each row non-decreasing;
    ``out_type`` holds every ``base + step * k`` for ``k`` in ``0..n``. Used where a model
    says so (MultiThreshold) and, in hardware, wherever it computes the same function as a
    :class:`RequantStage` more cheaply (few output levels).
    """
    thresholds: np.ndarray
    base: int
    step: int
    out_type: IntType

    def __post_init__(self):
        t = np.asarray(self.thresholds, dtype=np.int64)
        self.thresholds = t.reshape(1, -1) if t.ndim == 1 else t
        if self.thresholds.ndim != 2:
            raise ValueError(f"Thresholds must be (channels, n), not {t.shape}")
        if np.any(np.diff(self.thresholds, axis=1) < 0):
            raise ValueError("Thresholds must be non-decreasing along each row")
        self.base, self.step = int(self.base), int(self.step)
        n = self.thresholds.shape[1]
        ends = (self.base, self.base + self.step * n)
        if not (self.out_type.lo <= min(ends) and max(ends) <= self.out_type.hi):
            raise ValueError(f"Threshold outputs {min(ends)}..{max(ends)} must lie within "
                             f"{self.out_type.name}")

    @property
    def lo(self) -> int:
        return min(self.base, self.base + self.step * self.thresholds.shape[1])

    @property
    def hi(self) -> int:
        return max(self.base, self.base + self.step * self.thresholds.shape[1])

    @property
    def per_element(self) -> bool:
        return self.thresholds.shape[0] > 1


@dataclass
class LutStage:
    """Any function of one integer by a lookup table, per channel ``c``::

        y = table[c, x - in_lo]

    ``table`` is ``(channels, n)`` (or ``(1, n)`` for all), defined for the inputs
    ``in_lo .. in_lo + n - 1``; ``out_type`` holds every entry. The frontend computes it from
    a quantized activation function (a Sigmoid, a Gelu, ``x * Sigmoid(x)``... between a
    DequantizeLinear and a QuantizeLinear) evaluated on every input code; the planner turns
    a table that is monotonic in every channel, in one direction, into a
    :class:`ThresholdStage`.
    """
    table: np.ndarray
    in_lo: int
    out_type: IntType

    def __post_init__(self):
        t = np.asarray(self.table, dtype=np.int64)
        self.table = t.reshape(1, -1) if t.ndim == 1 else t
        if self.table.ndim != 2 or self.table.shape[1] < 1:
            raise ValueError(f"Table must be (channels, n) with n >= 1, not {t.shape}")
        self.in_lo = int(self.in_lo)
        if self.table.min() < self.out_type.lo or self.table.max() > self.out_type.hi:
            raise ValueError(f"Table entries {int(self.table.min())}..{int(self.table.max())} "
                             f"must lie within {self.out_type.name}")

    @property
    def in_hi(self) -> int:
        """The largest input the table covers."""
        return self.in_lo + self.table.shape[1] - 1

    @property
    def lo(self) -> int:
        return int(self.table.min())

    @property
    def hi(self) -> int:
        return int(self.table.max())

    @property
    def per_element(self) -> bool:
        return self.table.shape[0] > 1
