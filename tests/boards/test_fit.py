"""``build --board`` refuses, before any tool runs, a design whose estimate exceeds the
board's device, in one line; a design that fits goes on to synthesis (here a fake yosys that
records its arguments and fails fast: the ``YOSYS`` variable is honoured too)."""

import json
import sys

import numpy as np
import pytest

import onnx2fpga
from onnx2fpga.boards.fit import check_fit, overflows
from onnx2fpga.boards.targets import get_board
from onnx2fpga.errors import SizeError
from tests.helpers.cli import run_cli
from tests.helpers.paths import EXAMPLES

UP5K_CELLS = 5280       # iCE40 UP5K logic cells (Lattice DS FPGA-DS-02008, DESIGN.md's table)


@pytest.fixture(scope="module")
def designs(tmp_path_factory):
    """The digits MLP as compile makes it without --board (fits the iCEBreaker), and with its
    first layer folded wider (8 multipliers instead of 4: estimated just over the UP5K)."""
    ex = EXAMPLES / "digits"
    cal = np.load(ex / "calibration.npy")[:32]
    root = tmp_path_factory.mktemp("fit")
    small = onnx2fpga.compile(ex / "model.onnx", root / "small", calibration=cal)
    big = onnx2fpga.compile(ex / "model.onnx", root / "big", calibration=cal, max_lanes=64,
                            folding={"dense0": {"simd": 8, "pe": 1}})
    return small, big


@pytest.fixture
def fake_yosys(tmp_path, monkeypatch):
    """``YOSYS`` names a script that writes its arguments to ``argv.json`` and fails."""
    calls = tmp_path / "argv.json"
    script = tmp_path / "my-yosys"
    script.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"json.dump(sys.argv[1:], open({str(calls)!r}, 'w'))\n"
                      "print('ERROR: fake yosys'); sys.exit(1)\n")
    script.chmod(0o755)
    monkeypatch.setenv("YOSYS", str(script))
    return calls


def _cells(manifest):
    board = manifest["resources"]["ice40"]["board"]
    return board["lut"] + board["ff"] // 2, board["ff"]


def test_too_big_stops_before_synthesis(designs, fake_yosys, capsys):
    _, big = designs
    cells, ff = _cells(big.manifest)
    assert cells > UP5K_CELLS
    code, out, err = run_cli(capsys, "build", big.directory, "--board", "icebreaker")
    assert code == 2 and out == ""
    assert err == (f"error: Design does not fit the icebreaker (iCE40UP5K-SG48): estimated "
                   f"{cells:,} logic cells > 5,280 available; compile with --board icebreaker "
                   f"to fold it for this device (build --no-fit-check tries anyway)\n")
    assert not fake_yosys.exists()          # no synthesis started


def test_fit_check_can_be_skipped(designs, fake_yosys, capsys):
    _, big = designs
    code, _, err = run_cli(capsys, "build", big.directory, "--board", "icebreaker",
                           "--no-fit-check")
    assert code == 2 and err.startswith("error: synthesis failed: ")
    assert "ERROR: fake yosys" in err
    assert json.loads(fake_yosys.read_text()) == ["-q", "-l", "top.rpt", "top.ys"]


def test_a_design_that_fits_goes_to_synthesis(designs, fake_yosys):
    small, _ = designs
    assert _cells(small.manifest)[0] <= UP5K_CELLS
    with pytest.raises(onnx2fpga.boards.build.BuildError, match="^synthesis failed: "):
        small.build("icebreaker", progress=False)
    assert fake_yosys.exists()


def test_full_capacity_not_the_utilization_target():
    # 95 % of the UP5K's cells fits (compile's --utilization 0.8 is a folding goal only);
    # one cell over does not.
    target = get_board("icebreaker")
    assert overflows({"lut": 5016, "ff": 0, "dsp": 0, "bram": 30}, target) == []
    assert overflows({"lut": 4000, "ff": 2562, "dsp": 8, "bram": 31}, target) == [
        ("logic cells", 5281, 5280), ("bram", 31, 30)]
    ecp5 = {"ecp5": {"board": {"lut": 30000, "ff": 100, "dsp": 0, "bram": 0}}}
    with pytest.raises(SizeError, match=r"^Design does not fit the ulx3s-25f "
                       r"\(LFE5U-25F-BG381\): estimated 30,000 LUTs > 24,288 available; "
                       r"compile with --board ulx3s-25f to fold it for this device, or build "
                       r"for a larger board \(ulx3s-45f, orangecrab-85f would fit\) "):
        check_fit(ecp5, "ulx3s-25f")
    with pytest.raises(SizeError, match=r"; it was compiled for it: fold it slower \(compile "
                       r"--folding or --target-fps\), or build for a larger board"):
        check_fit(ecp5, "ulx3s-25f", folded_for="ulx3s-25f")
    check_fit({}, "tangnano9k")     # no Gowin estimate: nothing to check


def test_sprams_count_against_the_device():
    """Weights in SPRAM: the manifest's estimate names the SPRAMs; more than the UP5K's 4
    (a hand-edited manifest) is refused like any other resource; an ECP5 has none."""
    target = get_board("icebreaker")
    fine = {"lut": 4000, "ff": 100, "dsp": 0, "bram": 10, "spram": 4}
    assert overflows(fine, target) == []
    assert overflows({**fine, "spram": 5}, target) == [("spram", 5, 4)]
    with pytest.raises(SizeError, match=r"^Design does not fit the icebreaker "
                       r"\(iCE40UP5K-SG48\): estimated 5 SPRAMs > 4 available; "):
        check_fit({"ice40": {"board": {**fine, "spram": 5}}}, "icebreaker")
    check_fit({"ice40": {"board": fine}}, "icebreaker")
    assert overflows({"lut": 100, "ff": 100, "dsp": 0, "bram": 0, "spram": 1},
                     get_board("ulx3s-85f")) == [("spram", 1, 0)]
