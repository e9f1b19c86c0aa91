"""Parameter checks shared by the planning models and the cores: a positive count, a lane count
dividing the channels. A wrong value raises ``TypeError`` or ``ValueError`` naming it.

And the sizes the compile checks before its expensive steps (:func:`onnx2fpga.steps.check_sizes`):
the bits a layer's weights take in memory (:func:`weight_rom_bits`) and what a device's memory
can hold of them (:func:`weight_capacity_bits`).
"""

from __future__ import annotations

import numpy as np

from .devices import LOGIC_ROM_LUTS_PER_BIT

__all__ = ["check_count", "check_lanes", "weight_rom_bits", "weight_capacity_bits"]


def check_count(name: str, value, minimum: int = 1) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {value!r}")
    return int(value)


def check_lanes(lanes, channels: int) -> int:
    """``lanes`` checked as a count that divides ``channels`` (already checked)."""
    lanes = check_count("Lanes", lanes)
    if channels % lanes:
        raise ValueError(f"Lanes must divide channels={channels}, not {lanes}")
    return lanes


def weight_rom_bits(weight, bits: int) -> int:
    """Bits the weight ROM of a matrix ``weight`` (a row per output, a column per input) of
    ``bits``-bit weights takes at the slowest folding (a weight a word; weights that are all
    -1 or +1 take one bit, their sign): the bits of a word that are not the same in every
    weight (yosys drops a ROM's constant columns) times the weights, leaving out the
    inputs and the outputs whose weights are all 0 (a folding that reads every input, or
    computes every output, at once stores none of those, and a MatVec drops their
    products). Numpy over the weights; no hardware is built."""
    w = np.asarray(weight)
    if w.size == 0:
        return 0
    w = w.reshape(w.shape[0], -1).astype(np.int64)
    nonzero = w != 0
    if np.all(np.abs(w) == 1):
        w, bits = (w > 0).astype(np.int64), 1
    u = w & ((1 << bits) - 1)
    varying = int(np.bitwise_or.reduce(u ^ u.flat[0], axis=None)).bit_count()
    return varying * int(nonzero.any(axis=1).sum()) * int(nonzero.any(axis=0).sum())


def weight_capacity_bits(block_rams: int, block_ram_bits: int, luts: int) -> int:
    """The most weight bits a device can hold: its ``block_rams`` block RAMs of
    ``block_ram_bits`` bits, and ``luts`` LUTs holding nothing but ROM in soft logic
    (:data:`~onnx2fpga.plan.devices.LOGIC_ROM_LUTS_PER_BIT`). An upper bound: the rest of a
    design takes LUTs too, and a block RAM holds fewer bits at some widths."""
    return int(block_rams * block_ram_bits + luts / LOGIC_ROM_LUTS_PER_BIT)
