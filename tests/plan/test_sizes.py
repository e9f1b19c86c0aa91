"""The sizes the compile checks before its expensive steps, from the weights alone: the bits a
layer's weights take in memory at the slowest folding (``plan.checks.weight_rom_bits``, the
weight ROM the MatVec core builds at one product a cycle) and the accumulator type
(``ir.acc_type_for``, from two sums per row instead of a Python integer per weight)."""

import numpy as np
import pytest

from onnx2fpga.hw.matvec import MatVecCore
from onnx2fpga.hw.resources import netlist_features
from onnx2fpga.ir.layers import ConvLayer, DenseLayer
from onnx2fpga.ir.types import IntType, acc_type_for
from onnx2fpga.plan.checks import weight_capacity_bits, weight_rom_bits
from onnx2fpga.plan.layers import kind_of


def _dense(w, bits=8, simd=1, pe=1):
    return DenseLayer("fc", IntType(8, True), 0, w, IntType(bits, True),
                      np.zeros(w.shape[0], np.int64), [], simd=simd, pe=pe)


def _rom_bits(layer, family):
    """Bits of the weight ROM in the MatVec core's netlist: varying columns times words, as
    the estimate (and yosys) count them."""
    f = netlist_features(MatVecCore(layer), family)
    return sum(w * d for n, (w, d, rom, _) in zip(f["memory_names"], f["memories"])
               if n.startswith("w_mem"))


@pytest.mark.parametrize("case, bits, varying", [
    ("int8", 8, 8), ("narrow", 8, 2), ("bipolar", 2, 1), ("int3", 3, 3)])
def test_weight_bits_are_the_slowest_foldings_rom(case, bits, varying):
    """Against the ROM of the MatVec core at simd = pe = 1, on iCE40 and ECP5: a word per
    weight, of the bits that vary (2 of 8 for weights 0..3; the sign of -1/+1 weights)."""
    rng = np.random.default_rng(5)
    w = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), size=(12, 20))
    if case == "narrow":
        w = rng.integers(0, 4, size=(12, 20))
    elif case == "bipolar":
        w = rng.choice([-1, 1], size=(12, 20))
    w[0, :2] = [1, -1] if case == "bipolar" else [1, 3]     # no input or output all 0
    layer = _dense(w, bits)
    assert weight_rom_bits(w, bits) == varying * 12 * 20
    for family in ("ice40", "ecp5"):
        assert weight_rom_bits(w, bits) == _rom_bits(layer, family)
    assert kind_of(layer).weight_bits(layer) == weight_rom_bits(w, bits)


def test_weight_bits_leave_out_inputs_and_outputs_without_weights():
    """Inputs and outputs whose weights are all 0 are left out: a folding that reads every
    input at once (simd = 20) stores no column of them, one that computes every output at
    once (pe = 12) no row; the bits are at most either ROM."""
    rng = np.random.default_rng(6)
    w = rng.integers(-128, 128, size=(12, 20))
    w[:, 3:7] = 0
    w[5] = 0
    assert weight_rom_bits(w, 8) == 8 * 11 * 16
    for simd, pe in ((20, 1), (1, 12), (1, 1)):
        assert weight_rom_bits(w, 8) <= _rom_bits(_dense(w, 8, simd, pe), "ecp5")


def test_weight_bits_of_convolutions():
    rng = np.random.default_rng(6)
    i8 = IntType(8, True)
    conv = ConvLayer("c", i8, 0, (4, 8, 8), rng.integers(-100, 100, size=(6, 4, 3, 3)), i8,
                     np.zeros(6, np.int64), [])
    assert kind_of(conv).weight_bits(conv) == 8 * 6 * 36
    # A grouped convolution's matrix holds zeros outside each output's group; every input
    # and output still has weights. Weights 1..99: 7 bits vary.
    grouped = ConvLayer("g", i8, 0, (4, 8, 8), rng.integers(1, 100, size=(6, 2, 3, 3)), i8,
                        np.zeros(6, np.int64), [], group=2)
    assert kind_of(grouped).weight_bits(grouped) == 7 * 6 * 36


def test_weight_capacity():
    # The UP5K: 30 x 4 kbit, and 4,224 LUTs at 0.131 LUT a bit.
    assert weight_capacity_bits(30, 4096, 4224) == 30 * 4096 + int(4224 / 0.131)


def _acc_type_per_weight(weight, bias, in_type):
    """The formula before: every product's extremes in Python integers."""
    w = np.asarray(weight, dtype=object)
    lo_terms = np.minimum(w * in_type.lo, w * in_type.hi)
    hi_terms = np.maximum(w * in_type.lo, w * in_type.hi)
    b = np.asarray(bias, dtype=object)
    lo = int(min(lo_terms.sum(axis=1) + b)) if w.size else int(min(b))
    hi = int(max(hi_terms.sum(axis=1) + b)) if w.size else int(max(b))
    lo, hi = min(lo, 0), max(hi, 0)
    t = IntType.for_range(lo, hi)
    return t if t.signed else IntType(t.bits + 1, True)


def test_acc_type_equals_the_per_weight_formula():
    rng = np.random.default_rng(7)
    for _ in range(500):
        o, i = rng.integers(1, 6, 2)
        wb = int(rng.integers(1, 24))
        w = rng.integers(-(1 << (wb - 1)), 1 << (wb - 1), (o, i))
        if rng.random() < 0.2:
            w = np.abs(w).astype(np.uint32)
        t = IntType(int(rng.integers(1, 20)), bool(rng.integers(0, 2)))
        bias = rng.integers(-10**6, 10**6, o)
        assert acc_type_for(w, bias, t) == _acc_type_per_weight(w, bias, t)
    # Row sums that might not fit an int64 (summed as Python integers), Python-integer
    # weights, no weights, a scalar bias.
    u1 = IntType(1, False)
    w = np.full((2, 4), 2**60, np.int64)
    assert acc_type_for(w, [5, 0], u1) == _acc_type_per_weight(w, [5, 0], u1) == \
        IntType(64, True)
    w = np.array([[2**40, -2**41]], dtype=object)
    assert acc_type_for(w, [5], IntType(8, True)) == _acc_type_per_weight(w, [5],
                                                                         IntType(8, True))
    w = np.zeros((3, 0), np.int64)
    assert acc_type_for(w, np.array([1, -4, 2]), IntType(8, True)) == \
        _acc_type_per_weight(w, np.array([1, -4, 2]), IntType(8, True))
    w = np.array([[3, -2], [1, 1]])
    assert acc_type_for(w, np.int64(7), IntType(4, False)) == \
        _acc_type_per_weight(w, np.int64(7), IntType(4, False))
