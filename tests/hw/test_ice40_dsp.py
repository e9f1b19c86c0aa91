"""iCE40 hard products: MatVecCore elaborated for an iCE40 with ``ice40_dsp`` puts every
product in an SB_MAC16 with its input and product registers (two products per DSP in its 8 x 8
mode for operands of at most 8 bits), for the MatVecs in dataflow order whose DSPs fit the
design's budget (``Dataflow.ice40_dsps``). The emitted Verilog (with a
behavioural model of the DSP from Lattice's documentation, tests/data/sb_mac16_model.v) runs
in Verilator under stalls and must equal the golden model, with the cycle figures of the
platform-free design; the resource estimate counts the DSPs exactly."""


import numpy as np
import pytest

from onnx2fpga.boards.targets import get_board
from onnx2fpga.hw.emit import emit_verilog
from onnx2fpga.hw.resources import dataflow_resources
from onnx2fpga.ir.dataflow import Dataflow, Port
from onnx2fpga.ir.layers import DenseLayer
from onnx2fpga.ir.stages import RequantStage
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan.devices import ice40_matvec_dsps, ice40_paired_product, ice40_registered_product
from tests.helpers.hard_products import check_against_plain
from tests.helpers.paths import DATA

MODEL = DATA / "sb_mac16_model.v"


def _dataflow(budget, seed=0):
    """uint8 x int8 (simd 4, pe 2: 8 products, 4 DSPs), int8 x int3 (LUT products),
    uint16 x int6 (simd 2: 2 products of 22 bits; inputs around the zero point 32768, so
    that the DSP's A_SIGNED matters; 2 DSPs in the 16 x 16 mode), and int8 x int8 (simd 3:
    3 products, 2 DSPs, the second half empty) last, whose accumulators are the output, so
    that output stalls reach its DSPs."""
    rng = np.random.default_rng(seed)
    u8, i8, u16 = IntType(8, False), IntType(8, True), IntType(16, False)
    fc1 = DenseLayer("fc1", u8, 3, rng.integers(-128, 128, size=(6, 16)), i8,
                     rng.integers(-999, 999, size=6),
                     [RequantStage(rng.integers(40, 120, size=6), [-900], 15, 0, -128, 127,
                                   i8)], simd=4, pe=2)
    lut = DenseLayer("lut", i8, 0, rng.integers(-4, 4, size=(6, 6)), IntType(3, True),
                     rng.integers(-9, 9, size=6),
                     [RequantStage(rng.integers(40, 120, size=6), [0], 4, 32768, 0, 65535,
                                   u16)], simd=2, pe=1)
    fc2 = DenseLayer("fc2", u16, 32768, rng.integers(-32, 32, size=(6, 6)), IntType(6, True),
                     rng.integers(-99, 99, size=6),
                     [RequantStage(rng.integers(40, 120, size=6), [0], 12, 0, -128, 127,
                                   i8)], simd=2, pe=1)
    fc3 = DenseLayer("fc3", i8, 0, rng.integers(-128, 128, size=(4, 6)), i8,
                     rng.integers(-99, 99, size=4), [], simd=3, pe=1)
    df = Dataflow([fc1, lut, fc2, fc3], Port("x", (16,), u8, 1.0, 3, lanes=4),
                  Port("y", (4,), fc3.acc_type, 1.0, 0, lanes=1), fifo_depths=[2, 2, 2, 2])
    df.ice40_dsps = budget
    return df


def test_which_products_may_go_to_sb_mac16():
    from amaranth import signed, unsigned
    assert ice40_registered_product(unsigned(8), signed(8))
    assert ice40_registered_product(signed(16), unsigned(8))
    assert not ice40_registered_product(signed(16), signed(16))     # a 32-bit product
    assert not ice40_registered_product(signed(17), signed(5))      # wider than the DSP
    assert not ice40_registered_product(signed(16), signed(4))      # a LUT product
    assert ice40_paired_product(unsigned(8), signed(8))
    assert ice40_paired_product(signed(5), signed(6))
    assert not ice40_paired_product(signed(9), signed(8))
    assert ice40_matvec_dsps(4, 2, unsigned(8), signed(8)) == 4
    assert ice40_matvec_dsps(3, 1, signed(8), signed(8)) == 2
    assert ice40_matvec_dsps(3, 1, signed(12), signed(8)) == 3
    assert ice40_matvec_dsps(3, 1, signed(12), signed(3)) == 0


@pytest.mark.parametrize("budget,dsps", [(0, 0), (3, 2), (4, 4), (6, 6), (7, 6), (8, 8),
                                         (100, 8)])
def test_dsps_go_to_the_matvecs_in_order_within_the_budget(budget, dsps):
    # fc1's 8 products of 8 bits take 4 DSPs (two each), fc2's 2 wider ones 2, fc3's 3 of 8
    # bits 2; the LUT layer's take none. A layer takes them if all of its DSPs fit what is
    # left (budget 3: fc2 only; 7: fc1 and fc2, fc3 then does not fit).
    df = _dataflow(budget)
    ice40 = emit_verilog(df, platform=get_board("icebreaker").platform())
    assert ice40.count("SB_MAC16 ") == dsps
    assert "SB_MAC16" not in emit_verilog(df)
    assert "SB_MAC16" not in emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    assert dataflow_resources(df, "ice40")["total"]["dsp"] == dsps
    assert dataflow_resources(df, "ecp5")["total"]["dsp"] == \
        dataflow_resources(_dataflow(0), "ecp5")["total"]["dsp"]


@pytest.mark.rtl
def test_sb_mac16_products_equal_golden_with_the_same_cycles(tmp_path):
    df = _dataflow(8)
    ice40_v = emit_verilog(df, platform=get_board("icebreaker").platform())
    plain_v = emit_verilog(df)
    assert ice40_v.count("SB_MAC16 ") == 8 and ice40_v.count(".MODE_8x8(1'h1)") == 6
    assert "SB_MAC16" not in plain_v
    check_against_plain(tmp_path, df, ice40_v, MODEL.read_text())
