"""The ECP5 netlist pass that leaves a carry chain's unread carry out unconnected
(boards.carry), on netlists yosys 0.70 synthesizes as board builds do, counted by nextpnr."""

import json
import re
import shutil
import subprocess

import pytest
from amaranth import Elaboratable, Module, Signal, signed

from onnx2fpga.boards.build import tool_environment
from onnx2fpga.boards.carry import detach_unused_carry_outs, main

from .test_outreg import _cells, _synthesize

pytestmark = pytest.mark.synth


class _Adders(Elaboratable):
    """``n`` registered sums of two signed inputs (their chains' carry outs unread), and one
    registered unsigned comparison (yosys reads its chain's carry out)."""

    def __init__(self, n, width):
        self.n, self.width = n, width
        self.a = [Signal(signed(width), name=f"a{i}") for i in range(n + 1)]
        self.y = [Signal(signed(width + 1), name=f"y{i}") for i in range(n)]
        self.x, self.z = Signal(width, name="x"), Signal(width, name="z")
        self.lt = Signal(name="lt")

    def elaborate(self, platform):
        m = Module()
        for i in range(self.n):
            m.d.sync += self.y[i].eq(self.a[i] + self.a[i + 1])
        m.d.sync += self.lt.eq(self.x < self.z)
        return m

    def ports(self):
        return [*self.a, *self.y, self.x, self.z, self.lt]


def _packed_comb(env, tmp_path, name):
    """nextpnr-ecp5's TRELLIS_COMB count after packing ``name``.json."""
    run = subprocess.run([env["NEXTPNR_ECP5"], "--85k", "--package", "CABGA381", "--json",
                          f"{name}.json", "--pack-only", "--log", f"{name}.log"],
                         env=env, capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    log = (tmp_path / f"{name}.log").read_text()
    return int(re.search(r"TRELLIS_COMB:\s+(\d+)/", log).group(1))


def _read_bits(netlist):
    module = netlist["modules"]["top"]
    return {b for c in module["cells"].values() for p, bits in c["connections"].items()
            if c["port_directions"][p] == "input" for b in bits} | {
        b for p in module["ports"].values() for b in p["bits"]}


def test_unread_carry_outs_cost_nextpnr_no_cells(tmp_path):
    """Each adder's chain ends in an unread carry out, which nextpnr follows with a pass-out
    CCU2C (two TRELLIS_COMB) unless it is detached; the comparison's carry out is read and
    stays connected."""
    env = tool_environment()
    if not shutil.which(env["NEXTPNR_ECP5"]):
        pytest.skip("needs nextpnr-ecp5")
    n = 6
    netlist = _synthesize(_Adders(n, 9), tmp_path)
    before = json.loads(json.dumps(netlist))
    carries = _cells(netlist, "CCU2C")
    read = _read_bits(netlist)
    read_outs = {name for name, c in carries.items() if c["connections"]["COUT"][0] in read}
    detached = detach_unused_carry_outs(netlist)
    assert detached == n             # each sum's chain; the comparison reads its carry
    for name, cell in _cells(netlist, "CCU2C").items():
        assert (cell["connections"]["COUT"] == ["x"]) == (name not in read_outs), name
    assert any(c["connections"]["COUT"] != ["x"] for c in _cells(netlist, "CCU2C").values())
    (tmp_path / "before.json").write_text(json.dumps(before))
    (tmp_path / "after.json").write_text(json.dumps(netlist))
    comb = {name: _packed_comb(env, tmp_path, name) for name in ("before", "after")}
    assert comb["before"] - comb["after"] == 2 * detached, (comb, detached)


def test_main_rewrites_the_file_in_place(tmp_path, capsys):
    netlist = {"modules": {"top": {"ports": {"o": {"direction": "output", "bits": [3]}},
                                   "cells": {
        "c0": {"type": "CCU2C", "port_directions": {"CIN": "input", "COUT": "output",
                                                    "S0": "output"},
               "connections": {"CIN": ["0"], "COUT": [2], "S0": [3]}},
        "c1": {"type": "CCU2C", "port_directions": {"CIN": "input", "COUT": "output",
                                                    "S0": "output"},
               "connections": {"CIN": [2], "COUT": [4], "S0": [5]}}}}}}
    path = tmp_path / "top.json"
    path.write_text(json.dumps(netlist))
    main([str(path)])
    cells = json.loads(path.read_text())["modules"]["top"]["cells"]
    assert cells["c0"]["connections"]["COUT"] == [2]        # read by c1's carry in
    assert cells["c1"]["connections"]["COUT"] == ["x"]
    assert "1 unread carry out(s)" in capsys.readouterr().out
