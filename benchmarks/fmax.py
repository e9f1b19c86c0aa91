"""Fmax, resources and cycle figures of compiled example designs on real boards.

Compiles each design with ``onnx2fpga.compile`` and builds it for each board with
``CompiledDesign.build`` (amaranth-boards + YoWASP yosys/nextpnr; the board oscillator as the
clock unless ``--clock-mhz``: nextpnr reports the Fmax it achieved whatever the constraint,
and with a constraint near the target it places for it), one build at a time,
and prints one row per (design, board, seed): achieved Fmax of the design clock, LUT, FF, DSP
and block RAM use, cycles per inference and latency from the manifest, and the start and end
cells of nextpnr's critical path.

    python benchmarks/fmax.py [--designs NAME ...] [--boards BOARD ...] [--seeds N ...]
                              [--clock-mhz F] [--work DIR] [--json]

Designs (``--designs``; default ``digits cnn``):

- ``digits``: ``examples/digits`` (64-32-10 MLP, int8, 8 multiply lanes).
- ``digits32``: the same model folded for 32 lanes (``max_lanes=32``).
- ``cnn``: ``examples/cnn_digits`` (convolutions, residual add, pool, dense).
- ``cnn32``: the CNN folded for 32 lanes.
- ``tiny-ic``, ``tiny-kws``, ``tiny-vww``, ``tiny-ad``: MLPerf Tiny's four architectures as
  ``benchmarks/mlperf_tiny.py`` builds them (random weights, int8 QDQ; needs torch and
  onnxruntime), folded for the ULX3S-85F (``board="ulx3s-85f"``: a design of the whole device,
  which another board refuses). A build takes 20-60 minutes.

Boards (``--boards``; default ``ulx3s-85f icebreaker``): any of ``onnx2fpga boards``. A
design that does not fit a board is reported as such, not as a failure of the script. Each
build takes about 0.5-5 minutes on a 2-core machine. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

import onnx2fpga
from onnx2fpga.boards.build import BuildError
from onnx2fpga.errors import SizeError

__all__ = ["DESIGNS", "compile_design", "build_row", "format_row", "main"]

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: name -> (example folder, compile options)
DESIGNS = {
    "digits": ("digits", {}),
    "digits32": ("digits", {"max_lanes": 32}),
    "cnn": ("cnn_digits", {}),
    "cnn32": ("cnn_digits", {"max_lanes": 32}),
    **{f"tiny-{m}": (None, {"board": "ulx3s-85f"}) for m in ("ic", "kws", "vww", "ad")},
}


def compile_design(name: str, work: str, utilization=None):
    """Compile design ``name`` of :data:`DESIGNS` into ``work/name``; ``utilization``, if
    given, caps the board folding of the designs compiled for a board (the MLPerf Tiny
    ones) at that share of each resource instead of the default."""
    if name not in DESIGNS:
        raise ValueError(f"Design must be one of {', '.join(DESIGNS)}, not {name!r}")
    folder, options = DESIGNS[name]
    if utilization is not None and "board" in options:
        options = {**options, "utilization": utilization}
    if folder is None:          # an MLPerf Tiny model, made by mlperf_tiny.py
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from mlperf_tiny import quantized
        os.makedirs(work, exist_ok=True)
        qdq = quantized(name.removeprefix("tiny-"), work)[1]
        return onnx2fpga.compile(qdq, os.path.join(work, name), force=True, **options)
    example = os.path.join(_ROOT, "examples", folder)
    calibration = np.load(os.path.join(example, "calibration.npy"))
    return onnx2fpga.compile(os.path.join(example, "model.onnx"), os.path.join(work, name),
                             calibration=calibration, force=True, **options)


def build_row(design, name: str, board: str, seed: int, clock_mhz=None,
              pnr_options=None) -> dict:
    """Build ``design`` for ``board`` with placement ``seed`` (and the design clock at
    ``clock_mhz`` from the board's PLL, if given, and more nextpnr options); one row of
    figures."""
    row = {"design": name, "board": board, "seed": seed, "clock_mhz": clock_mhz,
           "cycles_per_inference": design.manifest["cycles_per_inference"],
           "latency_cycles": design.manifest["latency_cycles"]}
    start = time.monotonic()
    try:
        report = design.build(board, seed=seed, progress=False, clock_mhz=clock_mhz,
                              pnr_options=pnr_options)
    except (BuildError, SizeError) as e:       # SizeError: the estimate does not fit the device
        row["error"] = str(e).splitlines()[0]
        return row
    row["fmax_mhz"] = report["fmax_mhz"]
    row["clock_mhz"] = report["clock_mhz"]
    row["timing_met"] = report["timing_met"]
    row["timing_complete"] = report["timing_complete"]
    row.update({k: report["resources"].get(k, {}).get("used")
                for k in ("lut", "ff", "dsp", "bram")})
    paths = [p for p in report["critical_paths"] if p["from"] != "<async>"
             and p["to"] != "<async>"]
    if paths:
        slowest = max(paths, key=lambda p: p["delay_ns"])
        row["critical_path"] = {k: slowest[k] for k in ("start", "end", "delay_ns")}
    row["build_seconds"] = round(time.monotonic() - start, 1)
    return row


def format_row(row: dict) -> str:
    head = f"{row['design']:9s} {row['board']:11s} {row['seed']:4d}"
    if "error" in row:
        return f"{head}  build failed: {row['error']}"
    fmax = "n/a" if row["fmax_mhz"] is None else f"{row['fmax_mhz']:6.1f}"
    mark = "" if row["timing_complete"] else " (timing not verified)"
    path = row.get("critical_path")
    where = f"  {path['start']} -> {path['end']} ({path['delay_ns']:.2f} ns)" if path else ""
    return (f"{head} {fmax:>7s}{mark} {row['lut']:6d} {row['ff']:6d} {row['dsp']:4d} "
            f"{row['bram']:5d} {row['cycles_per_inference']:8d} {row['latency_cycles']:8d}"
            f"{where}")


HEADER = (f"{'design':9s} {'board':11s} {'seed':>4s} {'Fmax':>7s} {'LUT':>6s} {'FF':>6s} "
          f"{'DSP':>4s} {'BRAM':>5s} {'cycles':>8s} {'latency':>8s}  critical path")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--designs", nargs="+", default=["digits", "cnn"], choices=list(DESIGNS))
    ap.add_argument("--boards", nargs="+", default=["ulx3s-85f", "icebreaker"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[1])
    ap.add_argument("--clock-mhz", type=float, help="clock the designs from the board's PLL "
                    "at this frequency (nextpnr then places for it); default: the oscillator")
    ap.add_argument("--work", help="keep the designs and builds here (default: a temporary "
                                   "folder)")
    ap.add_argument("--utilization", type=float, help="cap the board folding of the MLPerf "
                    "Tiny designs at this share of each resource (default: compile's)")
    ap.add_argument("--pnr-options", metavar="'OPTS'", help="more nextpnr options, e.g. "
                    "--pnr-options='--router router2'")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or tmp
        if not args.json:
            print(HEADER, flush=True)
        for name in args.designs:
            design = compile_design(name, work, args.utilization)
            for board in args.boards:
                for seed in args.seeds:
                    row = build_row(design, name, board, seed, args.clock_mhz,
                                    args.pnr_options)
                    rows.append(row)
                    if not args.json:
                        print(format_row(row), flush=True)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
