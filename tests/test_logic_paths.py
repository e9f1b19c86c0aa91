"""benchmarks/logic_paths.py on a hand-written yosys netlist: the slowest register-to-register
path is found, with its nets in order, and a carry chain costs no route per cell."""

import sys

from tests.helpers.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from logic_paths import slowest_paths  # noqa: E402


def _cell(kind, **ports):
    out = {"Z", "Q", "S0", "S1", "COUT"}
    return {"type": kind, "parameters": {},
            "port_directions": {p: "output" if p in out else "input" for p in ports},
            "connections": {p: [b] for p, b in ports.items()}}


def _netlist():
    # Bits: 1 clock. ff_a (Q 2) -> lut x (Z 3) -> lut y (Z 4) -> ff_b (DI); ff_c (Q 5) ->
    # ff_d (DI) directly; ff_e (Q 6) -> a carry chain of three CCU2C (COUT 7, 8, 9 through
    # CIN) -> ff_f (DI) from the last S0 (10).
    cells = {
        "ff_a": _cell("TRELLIS_FF", CLK=1, DI=20, Q=2),
        "x": _cell("LUT4", A=2, Z=3),
        "y": _cell("LUT4", A=3, B=2, Z=4),
        "ff_b": _cell("TRELLIS_FF", CLK=1, DI=4, Q=21),
        "ff_c": _cell("TRELLIS_FF", CLK=1, DI=22, Q=5),
        "ff_d": _cell("TRELLIS_FF", CLK=1, DI=5, Q=23),
        "ff_e": _cell("TRELLIS_FF", CLK=1, DI=24, Q=6),
        "c0": _cell("CCU2C", A0=6, COUT=7),
        "c1": _cell("CCU2C", CIN=7, COUT=8),
        "c2": _cell("CCU2C", CIN=8, COUT=9),
        "c3": _cell("CCU2C", CIN=9, S0=10),
        "ff_f": _cell("TRELLIS_FF", CLK=1, DI=10, Q=25),
    }
    names = {"a": 2, "x": 3, "y": 4, "c": 5, "e": 6, "k7": 7, "k8": 8, "k9": 9, "s": 10}
    return {"modules": {"top": {"attributes": {"top": 1}, "cells": cells,
                                "netnames": {n: {"bits": [b]} for n, b in names.items()}}}}


def test_slowest_path_first_with_its_nets():
    paths = slowest_paths(_netlist(), top=10)
    # Two LUTs with three routes beat a carry chain of four cells with two routes (one into
    # its first cell, one out of its last), which beats a lone route.
    assert [(p[1], p[2]) for p in paths][:3] == [
        (["a", "x", "y"], "ff_b"), (["e", "k7", "k8", "k9", "s"], "ff_f"), (["c"], "ff_d")]
    t = [p[0] for p in paths]
    assert t == sorted(t, reverse=True)
