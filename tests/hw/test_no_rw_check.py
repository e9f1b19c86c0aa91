"""Memories that promise yosys no read-write collision (``NO_RW_CHECK``): yosys then builds no
read-before-write logic behind a block RAM, the estimate follows yosys' changed choice, and
every simulation through ``hw.testing.simulate`` checks the promise on each clock edge."""

import shutil
import subprocess

import pytest
from amaranth import Elaboratable, Module, Signal, signed
from amaranth.back import verilog
from amaranth.lib.memory import Memory

from onnx2fpga.boards.build import tool_environment
from onnx2fpga.hw import reduce
from onnx2fpga.hw.reduce import WindowReduceCore
from onnx2fpga.hw.testing import MemoryCollisionError, simulate
from onnx2fpga.plan.devices import NO_RW_CHECK, memory_mapping


class _Ram(Elaboratable):
    """A RAM of 8 words whose ports the testbench drives."""

    def __init__(self, attrs):
        self.attrs = attrs
        self.r_addr, self.r_en = Signal(3), Signal()
        self.w_addr, self.w_en, self.w_data = Signal(3), Signal(), Signal(8)
        self.r_data = Signal(8)

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = Memory(shape=8, depth=8, init=[], attrs=self.attrs)
        rd, wr = mem.read_port(), mem.write_port()
        m.d.comb += [rd.addr.eq(self.r_addr), rd.en.eq(self.r_en), self.r_data.eq(rd.data),
                     wr.addr.eq(self.w_addr), wr.en.eq(self.w_en), wr.data.eq(self.w_data)]
        return m


def _drive(dut, cycles):
    """A testbench that sets (read address, read enable, write address, write enable) for
    each of ``cycles`` clock edges."""
    async def tb(ctx):
        for r_addr, r_en, w_addr, w_en in cycles:
            ctx.set(dut.r_addr, r_addr)
            ctx.set(dut.r_en, r_en)
            ctx.set(dut.w_addr, w_addr)
            ctx.set(dut.w_en, w_en)
            await ctx.tick()
    return tb


@pytest.mark.parametrize("attrs, cycles, collides", [
    (NO_RW_CHECK, [(1, 1, 2, 1), (3, 1, 3, 1)], True),       # the second edge collides
    (NO_RW_CHECK, [(1, 1, 2, 1), (3, 0, 3, 1), (3, 1, 3, 0)], False),   # one port idle
    (None, [(3, 1, 3, 1)], False),                           # no promise: read-before-write
])
def test_simulate_checks_the_promise(attrs, cycles, collides):
    dut = _Ram(attrs)
    if collides:
        with pytest.raises(MemoryCollisionError, match=r"memory top\.dut\.mem: cycle 1 reads "
                                                       r"address 3 while writing it"):
            simulate(dut, _drive(dut, cycles))
    else:
        simulate(dut, _drive(dut, cycles))


# Measured: synth_ecp5 of one RAM (a write port and a synchronous read port) with
# (* no_rw_check *), where yosys 0.70 switches between distributed and block RAM. Without the
# attribute the same RAMs switch at 25 bits (64 words) and 12 bits (128 words).
@pytest.mark.parametrize("width, depth, kind, cells", [
    (20, 64, "distributed", 20), (21, 64, "block", 1), (44, 64, "distributed", 44),
    (45, 64, "block", 2), (8, 128, "distributed", 16), (9, 128, "block", 1),
    (4, 256, "distributed", 16), (5, 256, "block", 1),
])
def test_ecp5_mapping_without_rw_check_measured(width, depth, kind, cells):
    mm = memory_mapping(width, depth, "ecp5", rom=False, rw_check=False)
    assert (mm.kind, mm.cells) == (kind, cells)


def _libmap_log(core, tmp_path):
    """yosys 0.70's memory_libmap report (``debug``) of ``core``'s memories on ECP5."""
    env = tool_environment()
    if not shutil.which(env["YOSYS"]):
        pytest.skip("needs yosys")
    path = tmp_path / "core.v"
    path.write_text(verilog.convert(core, name="core"))
    script = ("read_verilog core.v; synth_ecp5 -top core -run :map_ram; "
              "debug memory_libmap -lib +/lattice/lutrams_trellis.txt "
              "-lib +/lattice/brams_16kd.txt")
    run = subprocess.run([env["YOSYS"], "-p", script], env=env, capture_output=True,
                         text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return run.stdout


@pytest.mark.synth
@pytest.mark.parametrize("promise", [True, False])
def test_partial_sums_have_no_read_before_write_logic(monkeypatch, tmp_path, promise):
    # 128 folds of two sums of 9 int8 values (24 bits): a block RAM either way. The memory
    # reads ahead of the write, so it promises no collision and yosys emulates nothing;
    # without the promise yosys builds the read-before-write bypass behind the block RAM.
    if not promise:
        monkeypatch.setattr(reduce, "NO_RW_CHECK", {})
    core = WindowReduceCore(signed(8), 256, 9, 2, "sum")
    assert core.storage == "memory" and core.folds == 128
    assert memory_mapping(24, 128, "ecp5", rom=False, rw_check=not promise).kind == "block"
    log = _libmap_log(core, tmp_path)
    assert "mapping memory core.acc_mem via $__PDPW16KD_" in log
    assert ("emulate read-first behavior" in log) == (not promise)


@pytest.mark.synth
@pytest.mark.parametrize("script", [True, False])
def test_builds_keep_the_promise_in_rtlil(tmp_path, script):
    # Board builds read Amaranth's RTLIL, whose read ports are synchronous already: yosys reads
    # no_rw_check only where memory_dff merges a flip-flop into a read port, so without the
    # build's NO_RW_CHECK_SCRIPT it emulates read-first behind the block RAM anyway.
    from amaranth.back import rtlil

    from onnx2fpga.boards.build import NO_RW_CHECK_SCRIPT
    env = tool_environment()
    if not shutil.which(env["YOSYS"]):
        pytest.skip("needs yosys")
    core = WindowReduceCore(signed(8), 256, 9, 2, "sum")
    (tmp_path / "core.il").write_text(rtlil.convert(core, name="core"))
    steps = ["read_rtlil core.il", *(NO_RW_CHECK_SCRIPT.splitlines() if script else []),
             "synth_ecp5 -top core -run :map_ram",
             "debug memory_libmap -lib +/lattice/lutrams_trellis.txt "
             "-lib +/lattice/brams_16kd.txt"]
    run = subprocess.run([env["YOSYS"], "-p", "; ".join(steps)], env=env, capture_output=True,
                         text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "mapping memory core.acc_mem via $__PDPW16KD_" in run.stdout
    assert ("emulate read-first behavior" in run.stdout) == (not script)
