"""ECP5 weight ROMs in column slices: a MatVecCore weight ROM that yosys would put in more than
``ROM_SLICE_BLOCKS`` block RAMs is built, when elaborated for an ECP5, from column slices read
with their own enables. The emitted Verilog runs in Verilator under stalls and must equal the
golden model, with the cycle figures of the platform-free design (one ROM)."""

import re

import numpy as np
import pytest

from onnx2fpga.boards.targets import get_board
from onnx2fpga.hw.emit import emit_verilog
from onnx2fpga.hw.memory import ROM_SLICE_BLOCKS, rom_columns
from onnx2fpga.hw.resources import dataflow_resources
from onnx2fpga.ir.dataflow import Dataflow, Port
from onnx2fpga.ir.layers import DenseLayer
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan.devices import memory_mapping
from tests.helpers.hard_products import check_against_plain, lut_dense
from tests.helpers.paths import DATA


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


def _words(rng, width, depth, constant=()):
    """``depth`` random words of ``width`` bits, the bits ``constant`` 0 in all of them."""
    mask = (1 << width) - 1
    for bit in constant:
        mask &= ~(1 << int(bit))
    return [int.from_bytes(rng.bytes(-(-width // 8)), "little") & mask for _ in range(depth)]


def test_which_weight_roms_are_sliced():
    ecp5 = get_board("ulx3s-85f").platform()
    ice40 = get_board("icebreaker").platform()
    rng = np.random.default_rng(0)
    # 768 x 256 (kwsmlp_w3a3's last hidden layers): 22 DP16KD of 36 bits, in 5 slices of
    # 4 and one of 2.
    words = _words(rng, 768, 256)
    assert memory_mapping(768, 256, "ecp5", rom=True).cells == 22
    cols = rom_columns(ecp5, words, 768)
    assert cols == [(lo, lo + 144) for lo in range(0, 720, 144)] + [(720, 768)]
    assert rom_columns(ice40, words, 768) == [(0, 768)]
    assert rom_columns(None, words, 768) == [(0, 768)]
    # Within ROM_SLICE_BLOCKS block RAMs, or in logic: one ROM.
    assert memory_mapping(4 * 36, 256, "ecp5", rom=True).cells == ROM_SLICE_BLOCKS
    assert rom_columns(ecp5, _words(rng, 144, 256), 144) == [(0, 144)]
    assert rom_columns(ecp5, _words(rng, 768, 4), 768) == [(0, 768)]
    # 64 words: a slice of 144 bits takes 4 blocks, but the rest (48 bits, joined to the
    # slice before: 192) would go to LUTs, so the ROM stays whole.
    assert memory_mapping(192, 64, "ecp5", rom=True).kind == "logic"
    assert rom_columns(ecp5, _words(rng, 768, 64), 768) == [(0, 768)]
    # Slices count the columns that vary: TFC_2W2A's first layer, 1568 x 64 with a third of
    # its columns constant (31 DP16KD).
    constant = rng.choice(1568, 473, replace=False)
    words = _words(rng, 1568, 64, constant)
    cols = rom_columns(ecp5, words, 1568)
    varying = [sum(1 for b in range(lo, hi) if b not in set(constant)) for lo, hi in cols]
    assert varying[:-1] == [144] * (len(cols) - 1) and sum(varying) == 1568 - 473
    assert cols[0][0] == 0 and cols[-1][1] == 1568
    assert all(hi == lo2 for (_, hi), (lo2, _) in zip(cols, cols[1:]))
    assert sum(memory_mapping(v, 64, "ecp5", rom=True).cells for v in varying) <= 31


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


@pytest.mark.rtl
def test_sliced_weight_rom_read_ahead_equals_golden(tmp_path):
    """int8 weights with LUT products (carry chains on an ECP5): the sliced ROM (128 words of
    512 bits) is read a cycle ahead, each slice's address picked with its own replica of
    the stall state. The input is slower than the 128 cycles a vector takes (32 transfers,
    stalled 85 %), so that the reader waits for a full bank with the pipeline advancing,
    where reading ahead must not move."""
    df = lut_dense(np.random.default_rng(3), 128, 64, simd=4, pe=16, zero_point=128, bias=99)
    ecp5_v = emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    assert len(set(re.findall(r"w_mem_col\d+", ecp5_v))) >= 2
    assert "waddr_nx" in ecp5_v
    check_against_plain(tmp_path, df, ecp5_v, (DATA / "ccu2c_model.v").read_text(),
                        stall_in=0.85)


def test_a_slice_moved_into_soft_logic_frees_its_block_rams():
    """Board folding may move one slice into soft logic (it picks block memories by name):
    the estimate then counts the other slice's block RAMs only, and the build script selects
    that slice's memory."""
    from onnx2fpga.boards.build import logic_memory_script
    from onnx2fpga.hw.matvec import MatVecCore
    from onnx2fpga.hw.resources import netlist_features

    layer = _dataflow().layers[0]
    whole = netlist_features(MatVecCore(layer), "ecp5")
    assert [n for n in whole["memory_names"] if n.startswith("w_mem")] == \
        ["w_mem_col0", "w_mem_col1"]
    assert whole["bram"] == 6 and whole["logic_memory_lut"] == 0
    moved = netlist_features(MatVecCore(layer), "ecp5", logic=frozenset({"w_mem_col1"}))
    assert moved["bram"] == 4 and moved["logic_memory_lut"] > 0
    assert "*.accelerator.matvec_0/m:w_mem_col1" in logic_memory_script(["matvec_0/w_mem_col1"])


@pytest.mark.rtl
def test_slices_yosys_would_split_by_depth_are_banked(tmp_path, monkeypatch):
    """256 -> 256 at simd 4, pe 4: a weight ROM of 4096 words of 128 bits, in slices of 36
    bits that yosys would build as 2048 x 9 blocks two deep with a multiplexer behind them.
    Each such slice is two banks of 2048 words instead, each read into a register of its
    own (the block RAM's output register on an ECP5) with the multiplexer behind: the same
    block RAMs, values equal to golden under stalls, the platform-free design's cycles."""
    from onnx2fpga.hw.matvec import MatVecCore
    from onnx2fpga.hw.memory import rom_bank_depth
    from onnx2fpga.hw.resources import netlist_features

    df = lut_dense(np.random.default_rng(5), 256, 256, simd=4, pe=4, zero_point=128, bias=99)
    assert memory_mapping(36, 4096, "ecp5", rom=True).depth == 2048
    assert rom_bank_depth(36, 4096) == 2048 and rom_bank_depth(28, 4096) == 0
    ecp5_v = emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    banks = sorted(set(re.findall(r"w_mem_col\d+_bank\d+", ecp5_v)))
    assert banks and all(b.endswith(("_bank0", "_bank1")) for b in banks)
    assert re.search(r"w_mem_col\d+_bank1_read", ecp5_v)
    features = netlist_features(MatVecCore(df.layers[0]), "ecp5")
    assert [n for n in features["memory_names"] if n.startswith("w_mem")] == [
        *banks, "w_mem_col3"]
    # The same block RAMs as the slices yosys splits itself.
    monkeypatch.setattr("onnx2fpga.hw.matvec.rom_bank_depth", lambda *a, **k: 0)
    unbanked = netlist_features(MatVecCore(df.layers[0]), "ecp5")
    assert [n for n in unbanked["memory_names"] if n.startswith("w_mem")] == [
        f"w_mem_col{k}" for k in range(4)]
    assert features["bram"] == unbanked["bram"]
    monkeypatch.undo()
    check_against_plain(tmp_path, df, ecp5_v, (DATA / "ccu2c_model.v").read_text())
