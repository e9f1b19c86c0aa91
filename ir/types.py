"""Integer element types and rounding modes of the IR."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["IntType", "ROUNDINGS", "SHIFT_ROUNDINGS", "FLOAT_ROUNDINGS", "REQUANT_MODES",
           "acc_type_for", "float32_scales"]

#: Rounding modes of a RequantStage. The first five round an integer right shift: ties to
#: even (ONNX QuantizeLinear), ties away from zero (C ``round``), toward minus infinity,
#: toward plus infinity, toward zero. ``"float32"`` is onnxruntime's requantization of an
#: integer kernel (MLAS ``MlasRequantizeOutput``): the input converted to float32, times a
#: float32 scale in float32, rounded half to even (see :class:`~onnx2fpga.ir.RequantStage`).
#: The one list of them: the IR's checks, the golden model, the frontend and the cores take
#: it from here.
ROUNDINGS = ("half_even", "half_away", "floor", "ceil", "to_zero", "float32")

#: The requantizations a compile can choose after a Conv, Gemm or MatMul (``requant=``):
#: ``"onnxruntime"`` reproduces onnxruntime's integer kernels (a stage rounding
#: ``"float32"``; the default for models onnxruntime quantized), ``"exact"`` rounds the exact
#: product once by a multiplier of ``multiplier_bits`` bits (QONNX, Brevitas, FINN and our
#: own quantizer).
REQUANT_MODES = ("onnxruntime", "exact")

#: The roundings of an integer right shift (all of :data:`ROUNDINGS` but ``"float32"``).
SHIFT_ROUNDINGS = ROUNDINGS[:5]

#: Rounding modes of a float quantizer: the shift's, and ties toward plus infinity.
FLOAT_ROUNDINGS = SHIFT_ROUNDINGS[:2] + ("half_up",) + SHIFT_ROUNDINGS[2:]


def float32_scales(multiplier, shift: int) -> np.ndarray:
    """``multiplier * 2**-shift`` as float32; ``ValueError`` unless every entry is exactly a
    float32 (at most 24 significant bits, within the normal exponent range)."""
    m = np.asarray(multiplier, dtype=np.int64)
    exact = np.ldexp(m.astype(np.float64), -int(shift))
    if np.any(np.abs(m) >= 1 << 53):
        raise ValueError("Float32 scale multipliers must be below 2**53")
    s = exact.astype(np.float32)
    tiny = (s != 0) & (np.abs(s) < np.finfo(np.float32).tiny)
    if np.any(s.astype(np.float64) != exact) or np.any(tiny):
        bad = m.reshape(-1)[(s.astype(np.float64) != exact).reshape(-1) | tiny.reshape(-1)][0]
        raise ValueError(f"Multiplier {int(bad)} / 2**{shift} is not a normal float32")
    return s


@dataclass(frozen=True)
class IntType:
    """A fixed-width integer type.

    Parameters
    ----------
    bits : int
        Width in bits, 1..64.
    signed : bool
        Two's complement if true.
    """
    bits: int
    signed: bool

    def __post_init__(self):
        if not isinstance(self.bits, int) or isinstance(self.bits, bool) or \
                not 1 <= self.bits <= 64:
            raise ValueError(f"Integer width must be an integer from 1 to 64, not {self.bits!r}")

    @property
    def lo(self) -> int:
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def hi(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    @property
    def name(self) -> str:
        return f"{'int' if self.signed else 'uint'}{self.bits}"

    @classmethod
    def for_range(cls, lo: int, hi: int) -> IntType:
        """The narrowest type holding every integer in ``[lo, hi]``."""
        lo, hi = int(lo), int(hi)
        if lo > hi:
            raise ValueError(f"Empty range [{lo}, {hi}]")
        if lo >= 0:
            return cls(max(1, hi.bit_length()), False)
        bits = max((-lo - 1).bit_length(), hi.bit_length()) + 1
        return cls(bits, True)

    def to_json(self):
        return self.name

    @classmethod
    def parse(cls, text: str) -> IntType:
        if text.startswith("uint"):
            return cls(int(text[4:]), False)
        if text.startswith("int"):
            return cls(int(text[3:]), True)
        raise ValueError(f"Integer type must be 'intN' or 'uintN', not {text!r}")


def acc_type_for(weight: np.ndarray, bias: np.ndarray, in_type: IntType) -> IntType:
    """Narrowest type holding ``x @ weight.T + bias`` for every ``x`` in ``in_type``'s range.

    Row ``i``'s extremes are ``lo * P_i + hi * N_i`` and ``hi * P_i + lo * N_i``, with ``P_i``
    and ``N_i`` the sums of its positive and of its negative weights (each term ``w * x``
    is least at ``x = lo`` for ``w >= 0`` and at ``x = hi`` for ``w < 0``): two sums over the
    weights in machine integers, the rest in Python integers per row, exact at any size (a
    4096 x 4096 layer took 15 s and 2.6 GB as a sum of Python integers per weight)."""
    w = np.asarray(weight)
    b = np.asarray(bias, dtype=object).reshape(-1)
    if w.size == 0:
        lo = hi = None
    else:
        w = w.reshape(w.shape[0], -1)
        b = np.broadcast_to(b, (w.shape[0],)) if b.size == 1 else b
        big = max(abs(int(w.min())), abs(int(w.max()))) * w.shape[1] >= 1 << 62
        if w.dtype.kind not in "iub" or big:
            w = w.astype(object)        # sums that might not fit an int64
        else:
            w = w.astype(np.int64, copy=False)
        pos = np.where(w > 0, w, 0).sum(axis=1)
        neg = np.where(w < 0, w, 0).sum(axis=1)
        sums_lo = [in_type.lo * int(p) + in_type.hi * int(n) for p, n in zip(pos, neg)]
        sums_hi = [in_type.hi * int(p) + in_type.lo * int(n) for p, n in zip(pos, neg)]
        lo = min(s + int(v) for s, v in zip(sums_lo, b))
        hi = max(s + int(v) for s, v in zip(sums_hi, b))
    if lo is None:
        lo, hi = int(min(b)), int(max(b))
    lo, hi = min(lo, 0), max(hi, 0)
    t = IntType.for_range(lo, hi)
    return t if t.signed else IntType(t.bits + 1, True)
