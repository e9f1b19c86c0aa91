"""Two products per ECP5 MULT18X18D: a MatVec with one input transfer per vector whose input
is unsigned and whose operands fit (input bits + 2 x weight bits <= 18) computes the products
of PEs 2i and 2i+1 for one input lane in one DSP, then corrects their sums for the weights'
bias. The emitted Verilog (with the behavioural DSP model of tests/data/mult18x18d_model.v)
runs in Verilator under stalls and must equal the golden model with the cycle figures of the
platform-free design."""


import numpy as np
import pytest
from amaranth import signed, unsigned

from onnx2fpga.boards.targets import get_board
from onnx2fpga.hw.arith import ecp5_packed_products
from onnx2fpga.hw.emit import emit_verilog
from onnx2fpga.hw.matvec import MatVecCore
from onnx2fpga.hw.resources import netlist_features
from onnx2fpga.ir.dataflow import Dataflow, Port
from onnx2fpga.ir.layers import DenseLayer
from onnx2fpga.ir.stages import RequantStage
from onnx2fpga.ir.types import IntType
from tests.helpers.hard_products import check_against_plain
from tests.helpers.paths import DATA

MODEL = DATA / "mult18x18d_model.v"


def _dataflow(seed=0):
    """fc0 (uint8 x int3, LUT products) requantized to uint6 feeds three packed layers:
    fc1, int6 weights, simd 16 (one fold), pe 3 (a pair and a PE with a DSP of its own),
    2 groups (the bias from a memory); fc2, int6 weights with both extremes, pe 4 in one
    group (a constant bias); fc3, unsigned 6-bit weights (no correction), whose accumulators
    are the output so that output stalls reach its DSPs."""
    rng = np.random.default_rng(seed)
    u6, u8 = IntType(6, False), IntType(8, False)
    i6 = IntType(6, True)

    def requant(n):
        return [RequantStage(rng.integers(20, 60, size=n), [0], 12, 0, 0, 63, u6)]

    fc0 = DenseLayer("fc0", u8, 0, rng.integers(-4, 4, size=(16, 16)), IntType(3, True),
                     rng.integers(-99, 99, size=16), requant(16), simd=8, pe=4)
    w1 = rng.integers(-32, 32, size=(6, 16))
    w1[0, :4] = -32
    w1[1, :4] = -32
    fc1 = DenseLayer("fc1", u6, 0, w1, i6, rng.integers(-999, 999, size=6), requant(6),
                     simd=16, pe=3)
    w2 = rng.integers(-32, 32, size=(4, 6))
    w2[:, 0] = [-32, 31, -32, 31]
    fc2 = DenseLayer("fc2", u6, 0, w2, i6, rng.integers(-999, 999, size=4), requant(4),
                     simd=6, pe=4)
    fc3 = DenseLayer("fc3", u6, 0, rng.integers(0, 64, size=(2, 4)), u6,
                     rng.integers(-99, 99, size=2), [], simd=4, pe=2)
    return Dataflow([fc0, fc1, fc2, fc3], Port("x", (16,), u8, 1.0, 0, lanes=8),
                    Port("y", (2,), fc3.acc_type, 1.0, 0, lanes=2), fifo_depths=[2] * 4)


def test_which_products_pack():
    ecp5 = get_board("ulx3s-85f").platform()
    assert ecp5_packed_products(ecp5, unsigned(6), signed(6))
    assert ecp5_packed_products(ecp5, unsigned(8), signed(5))
    assert not ecp5_packed_products(ecp5, unsigned(7), signed(6))    # 19 bits
    assert not ecp5_packed_products(ecp5, signed(6), signed(6))      # signed input
    assert not ecp5_packed_products(ecp5, unsigned(8), signed(4))    # LUT products
    assert not ecp5_packed_products(get_board("icebreaker").platform(), unsigned(6),
                                    signed(6))
    assert not ecp5_packed_products(None, unsigned(6), signed(6))


def test_packed_layers_take_half_the_dsps():
    df = _dataflow()
    fc0, fc1, fc2, fc3 = df.layers
    for layer, products in ((fc1, 16 * 2), (fc2, 6 * 2), (fc3, 4 * 1)):
        got = netlist_features(MatVecCore(layer), "ecp5")["dsp"]
        assert got == products, layer.name
    # More than one fold: one product per DSP.
    folded = DenseLayer("f", IntType(6, False), 0, np.arange(32).reshape(4, 8) - 16,
                        IntType(6, True),
                        np.zeros(4, int), [], simd=4, pe=2)
    assert netlist_features(MatVecCore(folded), "ecp5")["dsp"] == 8


@pytest.mark.rtl
@pytest.mark.parametrize("dsp_registers", [False, True])
def test_packed_products_equal_golden_with_the_same_cycles(tmp_path, dsp_registers):
    """With ``ecp5_dsp_registers`` too: the packed products' correction (the inputs' sum)
    takes the stage the fabric registers behind the DSPs add."""
    df = _dataflow()
    df.ecp5_dsp_registers = dsp_registers
    ecp5_v = emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    assert emit_verilog(df, platform=get_board("ulx3s-85f").platform()) == ecp5_v
    check_against_plain(tmp_path, df, ecp5_v, MODEL.read_text())
