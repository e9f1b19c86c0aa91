"""ECP5 LUT products on carry chains (hw.chains): each pair of a weight's bits is one CCU2C
chain whose LUTs also pick the rows, the pairs and the adder tree are carry-chain adders.
The platform-free values against every operand pair are checked in test_cores
(test_lut_products_equal_the_product_for_every_operand_pair); here the ECP5 Verilog (with a
behavioural model of CCU2C written from Lattice's data sheet, tests/helpers/data) runs in
Verilator under stalls against the golden model, with the platform-free design's cycles."""

import numpy as np
import pytest

from onnx2fpga.boards.targets import get_board
from onnx2fpga.hw.emit import emit_verilog
from onnx2fpga.ir.dataflow import Dataflow, Port
from onnx2fpga.ir.layers import DenseLayer
from onnx2fpga.ir.stages import RequantStage
from onnx2fpga.ir.types import IntType
from tests.helpers.hard_products import check_against_plain, ds_block
from tests.helpers.paths import DATA

MODELS = (DATA / "ccu2c_model.v").read_text() + "\n" + (DATA / "mult18x18d_model.v").read_text()


def _dataflow(seed=0):
    """Three LUT-product layers: uint8 x int8 (simd 8, pe 2: a two-stage adder tree, three
    folds; memories in LUTs, read in step), int8 x int5 (an odd weight width: the top bit a row
    of its own) and int16 x uint3, requantized between them."""
    rng = np.random.default_rng(seed)
    u8, i8, i16 = IntType(8, False), IntType(8, True), IntType(16, True)
    fc1 = DenseLayer("fc1", u8, 3, rng.integers(-128, 128, size=(6, 24)), i8,
                     rng.integers(-999, 999, size=6),
                     [RequantStage(rng.integers(40, 120, size=6), [-900], 15, 0, -128, 127, i8)],
                     simd=8, pe=2, multipliers="lut")
    fc2 = DenseLayer("fc2", i8, 0, rng.integers(-16, 16, size=(6, 6)), IntType(5, True),
                     rng.integers(-9, 9, size=6),
                     [RequantStage(rng.integers(40, 120, size=6), [0], 4, 0, -32768, 32767,
                                   i16)], simd=3, pe=1, multipliers="lut")
    fc3 = DenseLayer("fc3", i16, 0, rng.integers(0, 8, size=(4, 6)), IntType(3, False),
                     rng.integers(-99, 99, size=4), [], simd=2, pe=2, multipliers="lut")
    return Dataflow([fc1, fc2, fc3], Port("x", (24,), u8, 1.0, 3, lanes=8),
                    Port("y", (4,), fc3.acc_type, 1.0, 0, lanes=2), fifo_depths=[2, 2, 2])


@pytest.mark.rtl
def test_carry_chain_products_equal_golden_with_the_same_cycles(tmp_path):
    df = _dataflow()
    ecp5_v = emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    assert "CCU2C" in ecp5_v and "CCU2C" not in emit_verilog(df)
    # Memories this small are LUTs, read in step (no read-ahead registers).
    assert "w_read" not in ecp5_v and "x_read" not in ecp5_v
    check_against_plain(tmp_path, df, ecp5_v, MODELS)


@pytest.mark.rtl
def test_carry_chain_convolutions_equal_golden_with_the_same_cycles(tmp_path):
    """DS-CNN's block, depthwise 3x3 (uint8 input, int8 weights) then pointwise 1x1 (int8),
    both with LUT products: the depthwise core's products are carry-chain products too."""
    df = ds_block({"lanes": 2, "multipliers": "lut"},
                  {"simd": 3, "pe": 2, "multipliers": "lut"})
    ecp5_v = emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    assert "mul_0_r0_cc0" in ecp5_v and "CCU2C" not in emit_verilog(df)
    assert "w_cur" in ecp5_v and "rows_0_0" in ecp5_v       # read ahead, rows registered
    check_against_plain(tmp_path, df, ecp5_v, MODELS)


def test_the_estimate_counts_the_cells_it_does_not_build():
    """The resource estimate elaborates no CCU2C (tens of thousands of instances took most of
    a ResNet-8 compile's time): it counts them, as many as the ECP5 Verilog instantiates."""
    from onnx2fpga.hw.matvec import MatVecCore
    from onnx2fpga.hw.resources import netlist_features
    df = _dataflow()
    counted = sum(netlist_features(MatVecCore(layer), "ecp5")["ccu2c"] for layer in df.layers)
    ecp5_v = emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    assert counted == ecp5_v.count("CCU2C #(") > 100
