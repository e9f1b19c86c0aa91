"""Integer element types and rounding modes of the IR."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["IntType", "ROUNDINGS", "FLOAT_ROUNDINGS", "acc_type_for"]

#: Rounding modes of an integer right shift (a RequantStage): ties to even (ONNX
#: QuantizeLinear), ties away from zero (C ``round``), toward minus infinity, toward plus
#: infinity, toward zero. The one list of them: the IR's checks, the golden model, the
#: frontend and the cores take it from here.
ROUNDINGS = ("half_even", "half_away", "floor", "ceil", "to_zero")

#: Rounding modes of a float quantizer: the shift's, and ties toward plus infinity.
FLOAT_ROUNDINGS = ROUNDINGS[:2] + ("half_up",) + ROUNDINGS[2:]


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
    """Narrowest type holding ``x @ weight.T + bias`` for every ``x`` in ``in_type``'s range."""
    w = np.asarray(weight, dtype=object)
    lo_terms = np.minimum(w * in_type.lo, w * in_type.hi)
    hi_terms = np.maximum(w * in_type.lo, w * in_type.hi)
    b = np.asarray(bias, dtype=object)
    lo = int(min(lo_terms.sum(axis=1) + b)) if w.size else int(min(b))
    hi = int(max(hi_terms.sum(axis=1) + b)) if w.size else int(max(b))
    lo, hi = min(lo, 0), max(hi, 0)
    t = IntType.for_range(lo, hi)
    return t if t.signed else IntType(t.bits + 1, True)
