"""What a finished build says: the synthesized netlist's cells and the nextpnr report read into
resources used and available, clocks and whether they meet their targets, critical paths,
and the text a build prints; and the nextpnr options a user may add (:func:`pnr_argv`).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

from .targets import BoardTarget

__all__ = [
    "netlist_top", "cell_counts", "ice40_dsp_timing_gaps", "used_cells", "device_resources",
    "clocks_met", "usb_clocks", "clock_report", "critical_paths", "format_report",
    "critical_path", "pnr_argv", "STATIC_PLACER_SHARE", "adder_luts", "default_placer",
]


def netlist_top(netlist_path: Path, name: str = "top") -> dict:
    """The top module of the synthesized (flattened) yosys netlist (by its ``top`` attribute,
    else the module called ``name``)."""
    with open(netlist_path) as f:
        modules = json.load(f).get("modules", {})
    # yosys writes attribute values as binary strings: "top": "00...01".
    for module in modules.values():
        if int(str(module.get("attributes", {}).get("top", "0")), 2):
            return module
    return modules.get(name, {})


def rewrite_netlist_file(path, rewrite, top: str = "top") -> int:
    """Run a netlist pass ``rewrite(netlist, top) -> count`` (:mod:`.outreg`, :mod:`.carry`)
    on yosys' JSON netlist file ``path``, rewritten in place only if the pass changed
    something (``count`` > 0); returns ``count``."""
    path = Path(path)
    with open(path) as f:
        netlist = json.load(f)
    count = rewrite(netlist, top)
    if count:
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(netlist, f)
        tmp.replace(path)
    return count


def netlist_pass_main(argv, rewrite, what: str) -> None:
    """The command line of a netlist pass (the build script's step): each netlist file named
    (``top.json`` by default), rewritten in place, and how many ``what`` changed."""
    for arg in (sys.argv[1:] if argv is None else argv) or ["top.json"]:
        print(f"{arg}: {rewrite_netlist_file(arg, rewrite)} {what}")


def cell_counts(top: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for cell in top.get("cells", {}).values():
        counts[cell["type"]] = counts.get(cell["type"], 0) + 1
    return counts


def ice40_dsp_timing_gaps(top: dict) -> list[str]:
    """SB_MAC16 cells whose paths nextpnr-ice40 does not time.

    nextpnr 0.11 (``ice40/arch.cc``, ``getPortTimingClass``) treats every SB_MAC16 data port as
    a register input or output clocked by the cell's CLK pin, whatever the ``*_REG`` and output
    select parameters say. A DSP used combinationally therefore cuts the path in two at the DSP
    (with CLK tied low, nextpnr even times it against a ``$PACKER_GND_NET`` "clock"), and the
    Fmax it reports ignores the logic between the surrounding flip-flops. Only a DSP whose used
    inputs and used outputs are registered inside it is timed correctly at its boundary.
    """
    cells = top.get("cells", {})
    readers = set()  # bits read by some cell or leaving the module
    for cell in cells.values():
        directions = cell.get("port_directions", {})
        for port, bits in cell.get("connections", {}).items():
            if directions.get(port) == "input":
                readers.update(b for b in bits if isinstance(b, int))
    for port in top.get("ports", {}).values():
        if port.get("direction") == "output":
            readers.update(b for b in port.get("bits", []) if isinstance(b, int))

    gaps = []
    for name, cell in sorted(cells.items()):
        if cell["type"] != "SB_MAC16":
            continue
        params, conns = cell.get("parameters", {}), cell.get("connections", {})

        def param(key, params=params):
            return int(str(params.get(key, "0")), 2)

        def driven(port, conns=conns):
            return any(isinstance(b, int) for b in conns.get(port, []))

        reasons = []
        if not driven("CLK"):
            reasons.append("no clock")
        for port in ("A", "B", "C", "D"):
            if driven(port) and not param(f"{port}_REG"):
                reasons.append(f"{port} not registered")
        out = conns.get("O", [])
        for half, bits, prefix in (("bottom", out[:16], "BOT"), ("top", out[16:], "TOP")):
            if not any(b in readers for b in bits if isinstance(b, int)):
                continue
            select = param(f"{prefix}OUTPUT_SELECT")
            registered = (select == 1 or (select == 2 and param(f"{prefix}_8x8_MULT_REG"))
                          or (select == 3 and param("PIPELINE_16x16_MULT_REG2")))
            if not registered:
                reasons.append(f"{half} output not registered")
        if reasons:
            gaps.append(f"{name}: {', '.join(reasons)}")
    return gaps


def used_cells(util, cell):
    return int(util.get(cell, {}).get("used", 0))


def device_resources(target: BoardTarget, util: dict, cells: dict[str, int]) -> tuple[dict, dict]:
    """Map nextpnr cell types (and netlist cells where nextpnr cannot say) to resources."""
    limits = target.limits
    notes = {}
    if target.family == "ice40":
        # nextpnr packs a LUT4 and a flip-flop into one ICESTORM_LC and reports only LCs; the
        # LUT and FF counts come from the synthesized netlist (SB_LUT4, SB_DFF*). nextpnr may
        # add pass-through LUTs for carry chains, so `logic_cells` can exceed both.
        lut = cells.get("SB_LUT4", 0)
        ff = sum(n for t, n in cells.items() if t.startswith("SB_DFF"))
        notes["lut"] = "SB_LUT4 cells in the synthesized netlist"
        notes["ff"] = "SB_DFF* cells in the synthesized netlist"
        notes["logic_cells"] = "nextpnr ICESTORM_LC (one LUT4 + one FF + carry each)"
        resources = {
            "lut": lut, "ff": ff,
            "dsp": used_cells(util, "ICESTORM_DSP"),
            "bram": used_cells(util, "ICESTORM_RAM"),
            "spram": used_cells(util, "ICESTORM_SPRAM"),
            "logic_cells": used_cells(util, "ICESTORM_LC"),
        }
        available = {**limits.as_dict(), "logic_cells": limits.lut}
    elif target.family == "gowin":
        # nextpnr-himbaechel (gowin) reports LUT4 and DFF cells directly. A multiplier block
        # is counted in 18x18 units: two MULT9X9 share one, a MULT36X36 takes four.
        notes["lut"] = "nextpnr LUT4 (wide functions also use MUX2_LUT5..8, not counted)"
        notes["ff"] = "nextpnr DFF"
        notes["dsp"] = ("MULT18X18 + MULTALU18X18 + 2 x MULTADDALU18X18 + MULT9X9 / 2 "
                        "+ 4 x MULT36X36")
        dsp = (used_cells(util, "MULT18X18") + used_cells(util, "MULTALU18X18")
               + 2 * used_cells(util, "MULTADDALU18X18") + (used_cells(util, "MULT9X9") + 1) // 2
               + 4 * used_cells(util, "MULT36X36"))
        resources = {"lut": used_cells(util, "LUT4"), "ff": used_cells(util, "DFF"), "dsp": dsp,
                     "bram": used_cells(util, "BSRAM"), "spram": 0}
        available = limits.as_dict()
    else:
        if "TRELLIS_COMB" in util:
            lut, ff = used_cells(util, "TRELLIS_COMB"), used_cells(util, "TRELLIS_FF")
            notes["lut"] = ("nextpnr TRELLIS_COMB (LUT4s, including those in carry chains and "
                           "distributed RAM)")
            notes["ff"] = "nextpnr TRELLIS_FF"
        else:  # older nextpnr: TRELLIS_SLICE holds two LUT4s and two FFs
            slices = used_cells(util, "TRELLIS_SLICE")
            lut = ff = 2 * slices
            notes["lut"] = notes["ff"] = "2 x nextpnr TRELLIS_SLICE (upper bound)"
        resources = {
            "lut": lut, "ff": ff,
            "dsp": used_cells(util, "MULT18X18D"),
            "bram": used_cells(util, "DP16KD"),
            "spram": 0,
        }
        available = limits.as_dict()
    return ({k: {"used": v, "available": available[k]} for k, v in resources.items()}, notes)


def clocks_met(clocks: dict) -> bool:
    """Every clock nextpnr timed (but its constant nets) reaches its constraint."""
    return all(c["achieved_mhz"] >= c["constraint_mhz"] * (1 - 1e-6)
               for name, c in clocks.items() if not name.startswith("$PACKER_"))


def usb_clocks(clocks: dict) -> dict:
    """The USB clock nets (``usb_io`` at 48 MHz, ``usb`` at 12 MHz) by domain."""
    out = {}
    for name, c in clocks.items():
        lower = name.lower()
        if "usb_io" in lower:
            out["usb_io"] = {"net": name, **c}
        elif "usb" in lower and "por" not in lower:
            out["usb"] = {"net": name, **c}
    return out


def clock_report(pnr: dict, clock_mhz: float):
    """All clocks nextpnr timed, and the Fmax of the main one.

    The main clock is every net constrained at ``clock_mhz`` (Amaranth constrains the board
    clock; nextpnr-ice40 also times unconstrained clocks at a default 12 MHz) except nextpnr's
    constant nets (``$PACKER_GND_NET``, seen on the clock pins of combinational DSPs). If
    several nets qualify, the slowest one counts, so a failure is never hidden.
    """
    clocks = {name: {"achieved_mhz": float(v["achieved"]), "constraint_mhz": float(v["constraint"])}
              for name, v in pnr.get("fmax", {}).items()}
    real = {name: c for name, c in clocks.items() if not name.startswith("$PACKER_")}
    # The USB link's clocks (one of them at 48 MHz, like the OrangeCrab's oscillator) are
    # reported apart (`usb`), never as the design's clock.
    usb_nets = {c["net"] for c in usb_clocks(real).values()}
    real = {name: c for name, c in real.items() if name not in usb_nets}
    main = [c for c in real.values()
            if abs(c["constraint_mhz"] - clock_mhz) <= 1e-4 * clock_mhz]
    candidates = main or list(real.values())
    if not candidates:
        return clocks, None
    return clocks, min(c["achieved_mhz"] for c in candidates)


def critical_paths(pnr: dict) -> list[dict]:
    paths = []
    for path in pnr.get("critical_paths", []):
        steps = path.get("path", [])
        delay = sum(float(s.get("delay", 0.0)) for s in steps)
        paths.append({"from": path.get("from"), "to": path.get("to"),
                      "delay_ns": round(delay, 3),
                      "start": steps[0].get("from", {}).get("cell") if steps else None,
                      "end": steps[-1].get("to", {}).get("cell") if steps else None})
    return paths


def format_report(report: dict) -> str:
    """A few lines for a terminal: timing verdict first, then resources, then the critical
    path (:func:`critical_path`: where the cells limiting Fmax are)."""
    fmax = report["fmax_mhz"]
    if report["timing_met"]:
        verdict = "timing met"
    elif report.get("timing_complete", True):
        verdict = "TIMING NOT MET"
    else:
        verdict = "TIMING NOT VERIFIED"
    lines = [f"{report['board']} ({report['device']}): {verdict}: Fmax "
             f"{'n/a' if fmax is None else f'{fmax:.1f}'} MHz for a {report['clock_mhz']:g} MHz "
             f"clock (seed {report['seed']}), {report['wall_seconds']:.1f} s, "
             f"bitstream {report['bitstream']}"]
    parts = []
    for name, r in report["resources"].items():
        share = f" ({100 * r['used'] / r['available']:.0f}%)" if r["available"] else ""
        parts.append(f"{name} {r['used']}/{r['available']}{share}")
    lines.append(", ".join(parts))
    usb = report.get("usb")
    if usb:
        lines.append("USB CDC-ACM link " + usb["vid_pid"] + ": " + ", ".join(
            f"{domain} Fmax {c['achieved_mhz']:.1f} MHz for {c['constraint_mhz']:g} MHz"
            for domain, c in sorted(usb["clocks"].items())))
    if report.get("seed_sweep"):
        lines.append("seeds: " + ", ".join(
            f"{r['seed']}: " + ("failed" if r["fmax_mhz"] is None else f"{r['fmax_mhz']:.1f} MHz")
            for r in sorted(report["seed_sweep"], key=lambda r: r["seed"]))
            + f" (seed {report['seed']} kept)")
    path = critical_path(report)
    if path is not None:
        lines.append(f"critical path: {path['start']} -> {path['end']} "
                     f"({path['delay_ns']:.2f} ns)")
    lines.extend(f"warning: {w}" for w in report.get("timing_warnings", []))
    return "\n".join(lines)


def critical_path(report: dict) -> dict | None:
    """The slowest register-to-register path of ``report["critical_paths"]`` (paths from or
    to ``<async>`` ports are left out: they are I/O, not the design's clock), or None."""
    paths = [p for p in report.get("critical_paths") or []
             if "<async>" not in (p.get("from"), p.get("to")) and p.get("start")]
    return max(paths, key=lambda p: p["delay_ns"]) if paths else None


#: nextpnr options a build sets itself (outputs, device, constraints, seed, log): refused in
#: ``pnr_options``, whose runs would otherwise write elsewhere, place another device or
#: report a seed they did not use.
_PNR_RESERVED = frozenset({
    "--seed", "--report", "--log", "--json", "--lpf", "--pcf", "--textcfg", "--asc",
    "--write", "--package", "--speed", "--device", "--vopt", "--freq", "--quiet", "--verbose",
    "--debug", "--gui", "--test", "--run", "--pre-pack", "--pre-place", "--pre-route",
    "--post-route", "--timing-allow-fail", "--no-tmdriv", "--sdf", "--cstrfile",
})
_PNR_DEVICE = re.compile(r"--(?:\d+k|um5?g?-\d+k|(?:lp|hx|up|u)\d+k?)$")


def pnr_argv(options) -> list[str]:
    """``options`` for nextpnr (a string, split as a shell would, or a list of words) as a
    list of words, checked: every option a ``--name`` (its value, if any, the next word),
    none that the build sets itself (``--seed``, ``--report``, the device and files, ...).
    ``--router router2`` and ``--placer-heap-*`` or ``--tmg-ripup`` are what it is for.
    Raises ``ValueError`` naming the word."""
    if options is None:
        return []
    if isinstance(options, str):
        try:
            words = shlex.split(options)
        except ValueError as e:
            raise ValueError(f"nextpnr options {options!r}: {e}") from None
    elif isinstance(options, (list, tuple)) and all(isinstance(w, str) for w in options):
        words = list(options)
    else:
        raise ValueError(f"nextpnr options must be a string or a list of strings, not "
                         f"{options!r}")
    if words and not words[0].startswith("--"):
        raise ValueError(f"nextpnr options must start with an option (--name), not "
                         f"{words[0]!r}")
    for w in words:
        name = w.split("=", 1)[0]
        if name in _PNR_RESERVED or _PNR_DEVICE.match(name):
            raise ValueError(f"nextpnr option {name} is set by the build (outputs, device, "
                             f"constraints, seed: use --seed); not allowed in the nextpnr "
                             f"options")
    return words


#: The share of an ECP5 device's LUTs that a design's adder graphs (layers with
#: ``multipliers == "adders"``, as estimated) must reach for the build to place it with
#: nextpnr's analytic ``static`` placer instead of its default HeAP. Measured at 133b9c9,
#: seed 1, on the ULX3S-85F: the whole jet tagger at one cycle per inference (adder graphs
#: of 47 % of the LUTs, 122k arcs) routed after static placement in 16 minutes, while
#: router1 on HeAP's placement of the same netlist still had 111k arcs left after 28,000
#: iterations; the UNSW-NB15 MLP (21 %) met 100 MHz either way, at 118.6 MHz in 13 minutes
#: after HeAP and 106.2 MHz in 24 after static placement.
STATIC_PLACER_SHARE = 0.35


def adder_luts(manifest: dict, family: str) -> int:
    """The estimated LUTs on ``family`` of the design's adder-graph layers (the manifest's
    ``layers``)."""
    return sum(((ly.get("resources") or {}).get(family) or {}).get("lut", 0)
               for ly in manifest.get("layers", []) if ly.get("multipliers") == "adders")


def default_placer(words: list[str], family: str, manifest: dict,
                   device_luts: int) -> list[str]:
    """``words`` (from :func:`pnr_argv`) with ``--placer static`` added for an ECP5 design
    whose adder graphs take at least :data:`STATIC_PLACER_SHARE` of the device's
    ``device_luts``, unless ``words`` choose a placer."""
    if family != "ecp5" or any(w.split("=", 1)[0] == "--placer" for w in words):
        return words
    if adder_luts(manifest, family) < STATIC_PLACER_SHARE * device_luts:
        return words
    return [*words, "--placer", "static"]
