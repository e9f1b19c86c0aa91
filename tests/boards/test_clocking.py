"""PLL settings (vendor relations and published settings) and clock errors before any tool."""

import re

import numpy as np
import pytest

from onnx2fpga.boards.build import BuildError, build_bitstream
from onnx2fpga.boards.clocking import TOLERANCE, ClockError, plan_pll
from onnx2fpga.boards.loopback import ByteIncrement
from onnx2fpga.cli import main
from onnx2fpga.ir.dataflow import Port
from onnx2fpga.ir.types import IntType

# Settings printed by the vendors' and the open tools' calculators for these frequencies:
# icepll -i 12 -o 48 and ecppll -i 25 -o 100 (the iCEBreaker and ULX3S oscillators).
PUBLISHED = [
    ("ice40", 12.0, 48.0, {"DIVR": 0, "DIVF": 63, "DIVQ": 4, "FILTER_RANGE": 1}),
    ("ecp5", 25.0, 100.0, {"CLKI_DIV": 1, "CLKFB_DIV": 4, "CLKOP_DIV": 6}),
]


@pytest.mark.parametrize("family, ref, want, params", PUBLISHED)
def test_published_settings(family, ref, want, params):
    plan = plan_pll(family, ref, want)
    assert {k: plan.params[k] for k in params} == params
    assert plan.out_mhz == want


def _check_relations(plan):
    """The data-sheet relations between settings and frequencies, and their ranges."""
    p, ref = plan.params, plan.ref_mhz
    if plan.family == "ice40":
        pfd = ref / (p["DIVR"] + 1)
        vco = pfd * (p["DIVF"] + 1)
        out = vco / 2 ** p["DIVQ"]
        assert 10 <= pfd <= 133 and 533 <= vco <= 1066 and 16 <= out <= 275
        assert 0 <= p["DIVR"] < 16 and 0 <= p["DIVF"] < 128 and 1 <= p["DIVQ"] <= 6
        assert p["FILTER_RANGE"] == 1 + sum(pfd >= f for f in (17, 26, 44, 66, 101))
    elif plan.family == "ecp5":
        pfd = ref / p["CLKI_DIV"]
        out = pfd * p["CLKFB_DIV"]
        vco = out * p["CLKOP_DIV"]
        assert 3.125 <= pfd <= 400 and 400 <= vco <= 800
        assert 1 <= p["CLKI_DIV"] <= 128 and 1 <= p["CLKFB_DIV"] <= 80
        assert p["CLKOP_CPHASE"] == p["CLKOP_DIV"] - 1
    else:
        pfd = ref / (p["IDIV_SEL"] + 1)
        out = pfd * (p["FBDIV_SEL"] + 1)
        vco = out * p["ODIV_SEL"]
        assert pfd >= 3 and 400 <= vco <= 1200
        assert p["ODIV_SEL"] in (2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128)
    assert out == pytest.approx(plan.out_mhz) and vco == pytest.approx(plan.vco_mhz)
    assert pfd == pytest.approx(plan.pfd_mhz)


@pytest.mark.parametrize("family, ref", [("ice40", 12.0), ("ecp5", 25.0), ("ecp5", 48.0),
                                         ("gowin", 27.0)])
# 16 MHz, the iCE40 PLL's lowest output, is not reachable from 12 MHz (16.125 is the nearest,
# and above): it is among the impossible frequencies below.
@pytest.mark.parametrize("want", [20.0, 33.3, 40.0, 50.0, 75.0, 100.0, 133.0])
def test_settings_obey_the_data_sheet(family, ref, want):
    plan = plan_pll(family, ref, want)
    _check_relations(plan)
    assert want * (1 - TOLERANCE) <= plan.out_mhz <= want


def test_settings_are_the_fastest_not_above():
    # 12 MHz * (DIVF + 1) / 2**DIVQ: 37 MHz is not exact; 36.75 (DIVF 48, DIVQ 4) is the
    # fastest below it (37.125 is nearer, but above the wanted clock).
    plan = plan_pll("ice40", 12.0, 37.0)
    assert plan.out_mhz == pytest.approx(36.75)
    candidates = [12 * (f + 1) / 2 ** q for q in range(1, 7) for f in range(128)
                  if 533 <= 12 * (f + 1) <= 1066 and 16 <= 12 * (f + 1) / 2 ** q <= 275]
    assert plan.out_mhz == max(c for c in candidates if c <= 37.0)


@pytest.mark.parametrize("family, ref, want, needle", [
    ("ice40", 12.0, 10.0, "cannot make 10 MHz from the 12 MHz oscillator"),
    ("ice40", 12.0, 16.0, "nearest: 16.125 MHz"),
    # 25 * CLKFB_DIV / CLKI_DIV with a phase detector of at least 3.125 MHz (CLKI_DIV <= 8)
    ("ecp5", 25.0, 24.0, "nearest: 21.875 MHz or 25.000 MHz"),
    ("ice40", 12.0, 500.0, "nearest: 270.000 MHz"),
    ("ecp5", 25.0, 1000.0, "cannot make 1000 MHz"),
    ("ice40", 12.0, -3, "positive number"),
    ("ice40", 12.0, float("nan"), "positive number"),
    ("xilinx", 100.0, 200.0, "No PLL support for family 'xilinx'"),
])
def test_impossible_frequencies(family, ref, want, needle):
    with pytest.raises(ClockError, match=needle):
        plan_pll(family, ref, want)


_PORT = Port("x", (4,), IntType(8, False), scale=1.0, zero_point=0, lanes=2)


def test_build_refuses_a_clock_before_running_tools(tmp_path):
    with pytest.raises(ClockError, match="cannot make 10 MHz"):
        build_bitstream(lambda: ByteIncrement(16), _PORT, _PORT, "icebreaker", tmp_path,
                        clock_mhz=10, progress=False)
    assert not (tmp_path / "top.json").exists()


def test_build_refuses_a_baud_rate_the_clock_cannot_make(tmp_path):
    with pytest.raises(BuildError, match="Baud rate 4000000 is too high for a 12000000 Hz"):
        build_bitstream(lambda: ByteIncrement(16), _PORT, _PORT, "icebreaker", tmp_path,
                        baud=4_000_000, progress=False)


@pytest.fixture(scope="module")
def design_dir(tmp_path_factory):
    import onnx2fpga
    from tests.helpers.models import float_mlp
    model = float_mlp((8, 4, 3))
    directory = tmp_path_factory.mktemp("clk") / "d"
    onnx2fpga.compile(model, directory, calibration=np.random.default_rng(1).normal(
        size=(16, 8)).astype(np.float32))
    return directory


@pytest.mark.parametrize("args, needle", [
    (["--clock-mhz", "10"], "cannot make 10 MHz from the 12 MHz oscillator"),
    (["--baud", "4000000"], "Baud rate 4000000 is too high"),
])
def test_cli_build_clock_and_baud_errors(design_dir, capsys, args, needle):
    assert main(["build", str(design_dir), "--board", "icebreaker", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err and "Traceback" not in err


@pytest.mark.synth
@pytest.mark.parametrize("board, mhz, primitive", [("icebreaker", 30.0, "SB_PLL40_PAD"),
                                                   ("ulx3s-85f", 100.0, "EHXPLLL")])
def test_build_with_pll(board, mhz, primitive, tmp_path):
    """A design clocked by the PLL: nextpnr constrains the PLL's output to the wanted clock,
    the UART divisor follows that clock, and the report carries the settings."""
    import json

    from onnx2fpga.boards.targets import get_board
    report = build_bitstream(lambda: ByteIncrement(16), _PORT, _PORT, board, tmp_path,
                             clock_mhz=mhz, seed=1, progress=False)
    target = get_board(board)
    assert report["clock_mhz"] == mhz and report["oscillator_mhz"] == target.clock_mhz
    assert report["pll"]["primitive"] == primitive
    _check_relations(plan_pll(target.family, target.clock_mhz, mhz))
    assert report["uart"]["divisor"] == round(mhz * 1e6 / 115200)
    pnr = json.loads((tmp_path / "report_pnr.json").read_text())
    constraints = [c["constraint"] for c in pnr["fmax"].values()]
    assert constraints and all(c == pytest.approx(mhz, rel=1e-4) for c in constraints)
    assert report["timing_met"] == (report["fmax_mhz"] >= mhz)
    assert "SB_PLL40_PAD" in (tmp_path / "top.il").read_text() if board == "icebreaker" else \
        "EHXPLLL" in (tmp_path / "top.il").read_text()
    if board == "ulx3s-85f":
        # The reset reaches the flip-flops on a global line, not through general routing.
        log = (tmp_path / "top.tim").read_text()
        assert re.search(r"routing clock net \S*rst\S* using global \d", log), log[-2000:]


def test_held_reset_is_registered_and_follows_lock():
    # The reset is a flip-flop behind another. `locked` set before edge 3: the synchronizer
    # has it after edges 3 and 4, the counter runs down from 5 on edges 5-9, `busy` drops on
    # edge 10 and the reset on edge 11 (lock + hold + 3; two edges later than the bare
    # comparison). A loss of lock asserts it again; the same count follows the next lock.
    from amaranth import ClockSignal, Module, Signal
    from amaranth.sim import Simulator

    from onnx2fpga.boards.clocking import _held_reset
    m = Module()
    locked = Signal()
    rst = _held_reset(m, "por", ClockSignal("sync"), locked, 5)
    out = Signal()
    m.d.comb += out.eq(rst)
    seen = []

    async def bench(ctx):
        for cycle in range(40):
            ctx.set(locked, 1 if 3 <= cycle < 25 or cycle >= 30 else 0)
            await ctx.tick("sync")
            seen.append(ctx.get(out))

    sim = Simulator(m)
    sim.add_clock(1e-6, domain="sync")
    sim.add_testbench(bench)
    sim.run()
    rises = [i for i in range(1, 40) if seen[i] and not seen[i - 1]]
    falls = [i for i in range(1, 40) if seen[i - 1] and not seen[i]]
    assert seen[0] == 1 and falls[0] == 3 + 5 + 3
    assert rises and 25 < rises[0] < 30 and falls[1] == 30 + 5 + 3
