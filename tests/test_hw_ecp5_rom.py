"""ECP5 weight ROMs in column slices: a MatVecCore weight ROM that yosys would put in more than
``ROM_SLICE_BLOCKS`` block RAMs is built, when elaborated for an ECP5, from column slices read
with their own enables. The emitted Verilog runs in Verilator under stalls and must equal the
golden model, with the cycle figures of the platform-free design (one ROM)."""

import re

import numpy as np
import pytest
from hard_products import check_against_plain

from onnx2fpga.boards.targets import get_board
from onnx2fpga.dataflow import Dataflow, DenseLayer, IntType, Port
from onnx2fpga.hw.cores import ROM_SLICE_BLOCKS, _rom_columns
from onnx2fpga.hw.emit import emit_verilog
from onnx2fpga.hw.resources import dataflow_resources, memory_mapping


def _dataflow(seed=0):
    """uint8 (zero point 128) x int3 products (LUTs on an ECP5), 128 -> 64 at simd 32, pe 2: a
    weight ROM of 128 words of 192 bits (6 DP16KD: slices of 144 and 48 bits). The
    accumulators are the output, so that output stalls reach the ROM's read enables."""
    rng = np.random.default_rng(seed)
    u8, i3 = IntType(8, False), IntType(3, True)
    fc = DenseLayer("fc", u8, 128, rng.integers(-4, 4, size=(64, 128)), i3,
                    rng.integers(-99, 99, size=64), [], simd=32, pe=2)
    return Dataflow([fc], Port("x", (128,), u8, 1.0, 128, lanes=32),
                    Port("y", (64,), fc.acc_type, 1.0, 0, lanes=2), fifo_depths=[2])


def test_which_weight_roms_are_sliced():
    ecp5 = get_board("ulx3s-85f").platform()
    ice40 = get_board("icebreaker").platform()
    # 768 x 256 (kwsmlp_w3a3's last hidden layers): 22 DP16KD of 36 bits.
    assert memory_mapping(768, 256, "ecp5", rom=True).cells == 22
    cols = _rom_columns(ecp5, 768, 256)
    assert cols[0] == (0, 4 * 36) and cols[-1] == (720, 768) and len(cols) == 6
    assert all(hi == lo2 for (_, hi), (lo2, _) in zip(cols, cols[1:]))
    assert _rom_columns(ice40, 768, 256) == [(0, 768)]
    assert _rom_columns(None, 768, 256) == [(0, 768)]
    # Within ROM_SLICE_BLOCKS block RAMs, or in logic: one ROM.
    assert memory_mapping(4 * 36, 256, "ecp5", rom=True).cells == ROM_SLICE_BLOCKS
    assert _rom_columns(ecp5, 4 * 36, 256) == [(0, 144)]
    assert _rom_columns(ecp5, 768, 4) == [(0, 768)]


@pytest.mark.rtl
def test_sliced_weight_rom_equals_golden_with_the_same_cycles(tmp_path):
    df = _dataflow()
    ecp5 = get_board("ulx3s-85f").platform()
    ecp5_v = emit_verilog(df, platform=ecp5)
    assert sorted(set(re.findall(r"w_mem_col\d+", ecp5_v))) == ["w_mem_col0", "w_mem_col1"]
    assert "w_mem_col" not in emit_verilog(df)
    # The slices take the block RAMs of the whole ROM.
    assert memory_mapping(192, 128, "ecp5", rom=True).cells == 6
    assert dataflow_resources(df, "ecp5")["layers"][0]["bram"] == 6
    check_against_plain(tmp_path, df, ecp5_v, "")


def test_a_slice_moved_into_soft_logic_frees_its_block_rams():
    """Board folding may move one slice into soft logic (it picks block memories by name):
    the estimate then counts the other slice's block RAMs only, and the build script selects
    that slice's memory."""
    from onnx2fpga.boards.build import logic_memory_script
    from onnx2fpga.hw.cores import MatVecCore
    from onnx2fpga.hw.resources import netlist_features

    layer = _dataflow().layers[0]
    whole = netlist_features(MatVecCore(layer), "ecp5")
    assert [n for n in whole["memory_names"] if n.startswith("w_mem")] == \
        ["w_mem_col0", "w_mem_col1"]
    assert whole["bram"] == 6 and whole["logic_memory_lut"] == 0
    moved = netlist_features(MatVecCore(layer), "ecp5", logic=frozenset({"w_mem_col1"}))
    assert moved["bram"] == 4 and moved["logic_memory_lut"] > 0
    assert "*.accelerator.matvec_0/m:w_mem_col1" in logic_memory_script(["matvec_0/w_mem_col1"])
