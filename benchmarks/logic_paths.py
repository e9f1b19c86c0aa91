"""Rank the register-to-register paths of a synthesized ECP5 netlist before place and route.

    python benchmarks/logic_paths.py BUILD_DIR/top.json [--top N]

A board build (``onnx2fpga build``, ``benchmarks/fmax.py``) writes yosys' netlist as
``top.json`` in its build directory minutes before nextpnr, whose routing of a large design
takes most of an hour and reports one critical path. This script reads that netlist and
prints the ``N`` slowest paths under a fixed delay model, one per pair of source and sink
cores, with the nets along each: candidates for the next critical path, found in minutes.

The model is crude. Each cell has a fixed delay (LUT4 0.24 ns, PFUMX and L6MUX21 0.26-0.3,
CCU2C 0.45 from an input and 0.06 along the carry chain, a LUT RAM's read 0.6), a source its
clock-to-out (flip-flop 0.52, a block RAM's output 5.8, a DSP's 1.2) and every net a route of
``0.75 + 0.25 * log2(fanout + 1)`` ns, 1.5 ns more from a block RAM. Placement is unknown, so
a route across the die (3 ns) looks like any other: the figures rank paths, they do not
predict Fmax, and rank them loosely. Against two MLPerf Tiny builds at 100 MHz (ECP5 85F,
seed 1): the DS-CNN's critical path in nextpnr (a pool's partial sums in LUT RAM, 10.3 ns)
ranks first here (15.6 ns); MobileNetV1's (the wrapper's input buffer through the
multiplexer of its block RAMs, 12.3 ns, 3.1 of it one route across the die) ranks 29th
(14.9 ns), behind requantization paths of nine logic levels never seen critical.
"""

import argparse
import json
import math
import sys
from collections import defaultdict

# Delays in ns.
LUT, MUX, MUX_SELECT = 0.24, 0.26, 0.3
CARRY_IN, CARRY_ALONG, CARRY_OUT = 0.45, 0.06, 0.35
LUTRAM_READ = 0.6
CLK_TO_Q = {"TRELLIS_FF": 0.52, "DP16KD": 5.8, "MULT18X18D": 1.2, "ALU54B": 1.2}
SETUP = {"DI": 0.0, "CE": 0.25, "LSR": 0.3}
HARD_SETUP = 0.25
ROUTE, ROUTE_PER_FANOUT_BIT, ROUTE_FROM_BRAM = 0.75, 0.25, 1.5


def _graph(module):
    """``(edges, sources, sinks, names)`` of a flattened yosys module: ``edges[bit]`` lists
    ``(input bit, delay, routed)`` through the combinational cell driving ``bit`` (``routed``
    false for the carry chain's dedicated wire), ``sources[bit]`` the clock-to-out of a
    sequential output, ``sinks`` ``(bit, setup, cell, port)`` of sequential inputs."""
    edges, sources, sinks = defaultdict(list), {}, []
    for cell_name, cell in module["cells"].items():
        kind, con = cell["type"], cell["connections"]

        def bit(port):
            value = con.get(port, [None])[0]
            return value if isinstance(value, int) else None

        if kind == "LUT4":
            edges[bit("Z")] += [(bit(p), LUT, True) for p in "ABCD" if bit(p) is not None]
        elif kind in ("PFUMX", "L6MUX21"):
            ins = ("ALUT", "BLUT", "C0") if kind == "PFUMX" else ("D0", "D1", "SD")
            edges[bit("Z")] += [(bit(p), MUX if p != ins[2] else MUX_SELECT, True)
                                for p in ins if bit(p) is not None]
        elif kind == "CCU2C":
            for k in "01":
                for p in "ABCD":
                    if bit(p + k) is not None:
                        edges[bit("S" + k)].append((bit(p + k), CARRY_IN, True))
                        if bit("COUT") is not None:
                            edges[bit("COUT")].append((bit(p + k), CARRY_IN, True))
            if bit("CIN") is not None:
                for out in ("S0", "S1"):
                    if bit(out) is not None:
                        edges[bit(out)].append((bit("CIN"), CARRY_OUT, False))
                if bit("COUT") is not None:
                    edges[bit("COUT")].append((bit("CIN"), CARRY_ALONG, False))
        elif kind == "TRELLIS_DPR16X4":
            for out in con["DO"]:
                edges[out] += [(b, LUTRAM_READ, True) for b in con["RAD"]
                               if isinstance(b, int)]
            sinks += [(b, HARD_SETUP, cell_name, p) for p in ("DI", "WAD", "WRE")
                      for b in con[p] if isinstance(b, int)]
        elif kind == "TRELLIS_FF":
            sources[bit("Q")] = CLK_TO_Q[kind]
            sinks += [(bit(p), setup, cell_name, p) for p, setup in SETUP.items()
                      if bit(p) is not None]
        elif kind in ("DP16KD", "MULT18X18D", "ALU54B"):
            for port, bits in con.items():
                direction = cell["port_directions"][port]
                for b in bits:
                    if not isinstance(b, int):
                        continue
                    if direction == "output":
                        sources[b] = CLK_TO_Q[kind]
                    elif not port.startswith("CLK"):
                        sinks.append((b, HARD_SETUP, cell_name, port))
    names = {}
    for name, net in module["netnames"].items():
        for b in net["bits"]:
            if isinstance(b, int) and (b not in names or len(name) < len(names[b])):
                names[b] = name
    return edges, sources, sinks, names


def slowest_paths(netlist: dict, top: int = 20) -> list:
    """The ``top`` slowest register-to-register paths of a yosys JSON netlist (``netlist``,
    as loaded), one per pair of source and sink cores: a list of ``(ns, [net names from
    source to sink], sink cell, sink port)``."""
    module = next(m for m in netlist["modules"].values()
                  if m.get("attributes", {}).get("top"))
    edges, sources, sinks, names = _graph(module)
    fanout = defaultdict(int)
    for cell in module["cells"].values():
        for port, bits in cell["connections"].items():
            if cell["port_directions"].get(port) == "input":
                for b in bits:
                    if isinstance(b, int):
                        fanout[b] += 1
    bram_out = {b for b, t in sources.items() if t == CLK_TO_Q["DP16KD"]}

    def route(b):
        return (ROUTE + ROUTE_PER_FANOUT_BIT * math.log2(fanout[b] + 1)
                + (ROUTE_FROM_BRAM if b in bram_out else 0.0))

    arrival = {b: (t, None) for b, t in sources.items()}     # bit -> (time, predecessor)

    def settle(b):
        best = (0.0, None)
        for i, delay, routed in edges.get(b, ()):
            before = arrival.get(i, (0.0, None))[0]     # an input on a loop counts as 0
            t = before + delay + (route(i) if routed else 0.0)
            if t > best[0]:
                best = (t, i)
        arrival[b] = best

    visiting = set()
    for start in [s[0] for s in sinks]:
        if start in arrival:
            continue
        # Depth first without recursion (carry chains are thousands of cells long).
        stack = [(start, iter(edges.get(start, ())))]
        visiting.add(start)
        while stack:
            b, inputs = stack[-1]
            for i, _, _ in inputs:
                if i not in arrival and i not in visiting:
                    visiting.add(i)
                    stack.append((i, iter(edges.get(i, ()))))
                    break
            else:
                stack.pop()
                settle(b)
    ends = sorted(((arrival[b][0] + route(b) + setup, b, cell, port)
                   for b, setup, cell, port in sinks), reverse=True)
    out, seen = [], set()

    def core(name):
        return ".".join(name.split(".")[:3])

    for t, b, cell, port in ends:
        chain = [b]
        while arrival[chain[-1]][1] is not None:
            chain.append(arrival[chain[-1]][1])
        path = [names.get(x, str(x)) for x in reversed(chain)]
        key = (core(path[0]), core(cell))
        if key in seen:
            continue
        seen.add(key)
        out.append((round(t, 2), path, cell, port))
        if len(out) == top:
            break
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("netlist", help="yosys JSON netlist of a board build (top.json)")
    parser.add_argument("--top", type=int, default=20, help="paths to print (default 20)")
    args = parser.parse_args(argv)
    with open(args.netlist) as f:
        netlist = json.load(f)
    for t, path, cell, port in slowest_paths(netlist, args.top):
        print(f"{t:6.2f} ns  {len(path) - 1:2d} cells  {path[0]} -> {cell}.{port}")
        for name in path[1:]:
            print(f"{'':20}{name[:120]}")


if __name__ == "__main__":
    sys.exit(main())
