"""The ``onnx2fpga`` command line: compile, simulate, build, explore, boards, report, run,
flash, conformance.

Every command exits with status 0 on success, 1 when a build misses timing or a check
fails, and 2 with a one-line ``error:`` message on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import warnings

from .errors import Onnx2FpgaError
from .log import remove_handler, terminal_handler

__all__ = ["main"]


def _folding(text):
    """``layer:simd:pe[:lanes][,...]``, ``layer:lanes=L`` (a layer without a matrix unit) or
    ``layer:multipliers=lut|dsp|adders``; items naming the same layer add up."""
    from .ir.layers import MULTIPLIERS
    out = {}
    for item in text.split(","):
        try:
            name, *values = item.split(":")
            if len(values) == 1 and values[0].startswith("lanes="):
                out.setdefault(name, {})["lanes"] = int(values[0][len("lanes="):])
                continue
            if len(values) == 1 and values[0].startswith("multipliers="):
                mult = values[0][len("multipliers="):]
                if mult not in MULTIPLIERS:
                    raise ValueError(item)
                out.setdefault(name, {})["multipliers"] = mult
                continue
            if len(values) not in (2, 3):
                raise ValueError(item)
            out.setdefault(name, {}).update(zip(("simd", "pe", "lanes"), map(int, values)))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"folding must be NAME:SIMD:PE[:LANES], NAME:lanes=L or "
                f"NAME:multipliers=lut|dsp|adders, comma-separated, not {item!r}") from None
    return out


def _parser():
    from .steps import STEPS

    p = argparse.ArgumentParser(prog="onnx2fpga", description=(
        "Compile ONNX models into streaming FPGA accelerators, simulate them bit-exactly and "
        "build bitstreams with open toolchains."))
    p.add_argument("--version", action="version", version="%(prog)s " + _version())
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("compile", help="compile an ONNX model into a design directory",
                       description="Load, check and quantize MODEL, partition it into host and "
                       "hardware parts, and write DIR/NAME.v (the accelerator, top module "
                       "NAME), its filelist DIR/NAME.f and FuseSoC core DIR/NAME.core, "
                       "DIR/manifest.json and the design data.")
    c.add_argument("model", metavar="MODEL", help="ONNX model file")
    c.add_argument("-o", "--output", required=True, metavar="DIR", help="design directory")
    c.add_argument("--calibration", metavar="X.npy|X.npz", help="batch of real inputs, stacked "
                   "along axis 0 (a .npz: under the input's name), for post-training "
                   "quantization of a float model")
    c.add_argument("--lenient", action="store_true", help="accept common deviations from the "
                   "ONNX spec (missing default opset, undeclared custom domains, ...)")
    c.add_argument("--allow-host-compute", action="store_true",
                   help="let a Conv, Gemm or MatMul that cannot go to hardware run on the "
                   "host in float, with a warning naming it (by default that is an error)")
    c.add_argument("--force", action="store_true", help="replace DIR if it is a design "
                   "folder holding nothing but what onnx2fpga writes (anything else is "
                   "refused, nothing deleted)")
    c.add_argument("--weight-bits", type=int, default=8, metavar="N",
                   help="weight width for float models (default 8)")
    c.add_argument("--activation-bits", type=int, default=8, metavar="N",
                   help="activation width for float models (default 8)")
    c.add_argument("--per-tensor", action="store_true",
                   help="one weight scale per tensor instead of per output channel")
    c.add_argument("--pow2-scales", action="store_true",
                   help="power-of-two scales for the quantizers calibration adds (fixed "
                   "point, as hls4ml's ap_fixed): requantizations become shifts")
    c.add_argument("--max-lanes", type=int, default=None, metavar="N",
                   help="multiply lanes (sum of simd*pe) for automatic folding (default 8, "
                   "which fits an iCE40 UP5K with LUT multipliers; no budget with --board or "
                   "--target-fps)")
    c.add_argument("--optimize", choices=("throughput", "latency"), default="throughput",
                   help="what the folding optimizes at its rate: 'throughput' (default; every "
                   "layer at its cheapest folding for the rate) or 'latency' (the budget left "
                   "at that rate folds layers faster while the latency shrinks)")
    c.add_argument("--architecture", choices=("auto", "dataflow", "engine"), default="auto",
                   help="'auto' (default): a core per layer, folded to fit --board; when no "
                   "folding fits, the layer engine if it does (one multiply-accumulate unit "
                   "running the layers in turn: small, far slower; a warning says so). "
                   "'dataflow' never the engine, 'engine' always")
    c.add_argument("--weights", choices=("auto", "rom", "spram"), default="auto",
                   help="on a board with SPRAMs (iCE40 UP5K): 'auto' (default) moves the "
                   "largest layers' weights into SPRAM when block RAM runs out, 'spram' "
                   "always, 'rom' never; weights in SPRAM load from the board's flash at "
                   "start-up (weights.bin, written by 'flash')")
    c.add_argument("--board", default=None, metavar="NAME",
                   help="fold for this board: the fastest design whose estimated resources "
                   "fit its device (see 'onnx2fpga boards')")
    c.add_argument("--target-fps", type=float, default=None, metavar="F",
                   help="fold for a rate: the cheapest design reaching F inferences per "
                   "second at --clock")
    c.add_argument("--clock", type=float, default=None, metavar="MHZ",
                   help="clock frequency for --target-fps")
    c.add_argument("--utilization", type=float, default=None, metavar="U",
                   help="share of the device's LUTs, flip-flops and hard multipliers --board "
                   "may fill (default 0.75 on ECP5 boards, 0.8 on others)")
    c.add_argument("--adder-levels", type=int, default=None, metavar="N",
                   help="adder levels between registers in adder-graph layers (multipliers="
                   "adders; default: what the board's clock allows by the delay model, 1 "
                   "without --board)")
    c.add_argument("--multiplier-bits", type=int, default=None, metavar="N",
                   help="significant bits of requantization multipliers (default: 24 for "
                   "models quantized elsewhere, which keeps every output within one LSB of "
                   "onnxruntime; 16 for our own calibration, which costs less hardware)")
    c.add_argument("--requant", choices=("onnxruntime", "exact"), default=None,
                   help="requantization after a Conv, Gemm or MatMul: 'onnxruntime' "
                   "reproduces onnxruntime's integer kernels (float32 product, rounded twice), "
                   "'exact' rounds the exact product once (cheaper); default: onnxruntime for "
                   "models onnxruntime quantized, exact for the others")
    c.add_argument("--folding", type=_folding, metavar="NAME:SIMD:PE[:LANES],...",
                   help="override the parallelism of named layers (LANES: channels per "
                   "transfer into a convolution's window; NAME:lanes=L for pools and "
                   "elementwise layers; NAME:multipliers=lut|dsp|adders: a layer's products "
                   "in LUTs, in hard multipliers, or its weights as constants of one adder "
                   "graph computing the whole matrix per cycle)")
    c.add_argument("--name", default="top", metavar="NAME",
                   help="the Verilog top module's name (default top), a Verilog identifier; "
                   "every submodule carries it (NAME.matvec_0, ...) and the files are named "
                   "after it")
    c.add_argument("--stop-after", default="emit", metavar="STEP", choices=STEPS,
                   help="stop after this step of the compile and write what it produced "
                   "(load, quantize: graph.json; lower, fold, evaluate: design.json + "
                   "design.npz; emit, the default: the whole design)")

    s = sub.add_parser("simulate", help="run a compiled design on inputs",
                       description="Run the design in DIR on the inputs in X.npy (stacked along "
                       "axis 0, in the model's input dtype and shape) and write the model's "
                       "outputs to Y.npy, stacked the same way. X.npz and Y.npz hold one "
                       "array per graph input and output name (Y.npz is needed for a model "
                       "with several outputs).")
    s.add_argument("dir", metavar="DIR")
    s.add_argument("--inputs", required=True, metavar="X.npy|X.npz")
    s.add_argument("--outputs", required=True, metavar="Y.npy|Y.npz")
    s.add_argument("--engine", choices=("rtl", "golden"), default="rtl",
                   help="rtl: Verilator with random AXI-Stream stalls (default); golden: "
                   "the integer numpy model")
    s.add_argument("--stall-in", type=float, default=0.3, metavar="P",
                   help="with --engine rtl: probability in [0, 1) that the testbench holds "
                   "back the input stream (tvalid low) in a cycle (default 0.3)")
    s.add_argument("--stall-out", type=float, default=0.3, metavar="P",
                   help="with --engine rtl: probability in [0, 1) that the testbench does not "
                   "take the output stream (tready low) in a cycle (default 0.3)")
    s.add_argument("--seed", type=int, default=0, metavar="N",
                   help="with --engine rtl: seed of the stall pattern (default 0)")
    s.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="with --engine rtl, split the inputs over N simulator processes "
                   "(default: one per core, but at most one per 256 inputs)")
    s.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT|local",
                   help="with --engine rtl, split the inputs over the workers of this Dask "
                   "cluster (at least 64 inputs per worker; 'local': a local cluster) and "
                   "join the outputs in order")
    s.add_argument("--check", action="store_true", help="with --engine rtl, also run the "
                   "golden model and fail unless every output is identical")
    s.add_argument("--json", action="store_true", help="print the figures as JSON")
    s.add_argument("--force", action="store_true", help="overwrite an existing Y.npy")

    b = sub.add_parser("build", help="build a bitstream for a board",
                       description="Synthesize, place and route the design in DIR for NAME with "
                       "yosys and nextpnr; write the bitstream and DIR/build/NAME/report.json.")
    b.add_argument("dir", metavar="DIR")
    b.add_argument("--board", required=True, metavar="NAME", help="see 'onnx2fpga boards'")
    b.add_argument("--seed", type=_seeds, default=None, metavar="N[,N...]",
                   help="nextpnr placement seed; several (1,2,3): place and route once per "
                   "seed, as many at a time as there are CPUs, and keep the best run "
                   "(default 1)")
    b.add_argument("--clock-mhz", type=float, default=None, metavar="F",
                   help="clock the design at F MHz, generated by the board's PLL "
                   "(default: the board oscillator)")
    b.add_argument("--baud", type=int, default=115200,
                   help="bit rate of the UART link (default 115200; not used on USB)")
    b.add_argument("--link", choices=("uart", "usb"), default=None,
                   help="host link: the board's UART, or its own USB port as a CDC-ACM serial "
                   "device (default: the board's; USB on the OrangeCrab)")
    b.add_argument("--pnr-options", default=None, metavar="'OPTS'",
                   help="more nextpnr options, quoted as one argument, e.g. "
                   "--pnr-options='--router router2' (router1, the default, can stall on a "
                   "congested placement)")
    b.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT|local",
                   help="run each seed's build as a job on this Dask cluster ('local': a "
                   "local one) and keep the best run")
    b.add_argument("--no-fit-check", action="store_true",
                   help="build even if the design's estimated resources exceed the board's "
                   "device (for when the estimate is wrong)")
    b.add_argument("--json", action="store_true", help="print the report as JSON")

    e = sub.add_parser("explore", help="compile and build many foldings, seeds and clocks "
                       "on a Dask cluster; report the Pareto front",
                       description="Compile MODEL at each folding (and rate target), build "
                       "each for NAME at each seed and clock, on a Dask cluster (--scheduler) "
                       "or a local one, and write DIR/explore.json (one row per run), "
                       "DIR/explore.html (inferences/s at Fmax against LUTs and DSPs, the "
                       "Pareto fronts) and DIR/best/ (the chosen run's design and "
                       "bitstream). Run it again on DIR to resume: finished runs are kept.")
    e.add_argument("model", metavar="MODEL", help="ONNX model file")
    e.add_argument("-o", "--output", required=True, metavar="DIR", help="the sweep's folder")
    e.add_argument("--board", required=True, metavar="NAME", help="see 'onnx2fpga boards'")
    e.add_argument("--seeds", type=_numbers(int), default=None, metavar="N[,N...]",
                   help="nextpnr placement seeds (default 1)")
    e.add_argument("--foldings", type=_foldings, default=None, metavar="F[,F...]",
                   help="candidates: 'board' (the fastest folding whose estimate fits the "
                   "board), a number of multiply lanes (8: at most 8 lanes, folded to fit), "
                   "or @FILE.json (a per-layer folding, as compile's --folding); default "
                   "'board' unless --targets is given")
    e.add_argument("--targets", type=_numbers(float), default=None, metavar="FPS[,FPS...]",
                   help="candidates reaching so many inferences per second at each clock")
    e.add_argument("--clock-mhz", type=_numbers(float), default=None, metavar="F[,F...]",
                   help="clocks to build at, from the board's PLL (default: the oscillator)")
    e.add_argument("--pnr-options", default=None, metavar="'OPTS'",
                   help="more nextpnr options for every build (see 'build')")
    e.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                   help="a running Dask scheduler to run on (default: a local cluster)")
    e.add_argument("--workers", type=int, default=None, metavar="N",
                   help="without --scheduler: worker processes (default: one per core)")
    e.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="a compile or build that takes longer is stopped and its run failed")
    e.add_argument("--retry-failed", action="store_true",
                   help="on resume, run the failed runs again too")
    e.add_argument("--calibration", metavar="X.npy|X.npz", help="inputs for post-training "
                   "quantization of a float model (see 'compile')")
    e.add_argument("--lenient", action="store_true", help="see 'compile'")
    e.add_argument("--weight-bits", type=int, default=None, metavar="N", help="see 'compile'")
    e.add_argument("--activation-bits", type=int, default=None, metavar="N",
                   help="see 'compile'")
    e.add_argument("--pow2-scales", action="store_true", help="see 'compile'")
    e.add_argument("--adder-levels", type=int, default=None, metavar="N",
                   help="see 'compile'")
    e.add_argument("--utilization", type=float, default=None, metavar="U",
                   help="see 'compile'")
    e.add_argument("--json", action="store_true", help="print explore.json's rows as JSON")

    sub.add_parser("boards", help="list the supported boards")

    rp = sub.add_parser("report", help="write the design's report.html and report.md",
                        description="Write DIR/report.html (dataflow graph, cycles per layer, "
                        "resources, builds, quantization error, ports) and its markdown twin "
                        "DIR/report.md from DIR/manifest.json and every DIR/build/*/report.json."
                        " compile and build write them too.")
    rp.add_argument("dir", metavar="DIR")

    r = sub.add_parser("run", help="run inference on a board or a simulated board",
                       description="Send the inputs in X.npy (stacked along axis 0, in the "
                       "model's input dtype and shape) to the board running the design in DIR "
                       "and write the model's outputs to Y.npy. The board must answer HELLO "
                       "with this design's hash. --sim runs the board wrapper and NAME.v in "
                       "Verilator behind the same serial protocol.")
    r.add_argument("dir", metavar="DIR")
    where = r.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", metavar="PORT", help="serial port of the board "
                       "(/dev/ttyUSB1, COM4, or a pyserial URL)")
    where.add_argument("--sim", action="store_true", help="use a simulated board")
    r.add_argument("--inputs", required=True, metavar="X.npy|X.npz")
    r.add_argument("--outputs", required=True, metavar="Y.npy|Y.npz")
    r.add_argument("--baud", type=int, default=None, help="UART bit rate (default: from the "
                   "build report, else 115200)")
    r.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="wait this long for each reply before retrying")
    r.add_argument("--retries", type=int, default=5, help="attempts after a CRC error, an "
                   "ERROR reply or a timeout (default 5)")
    r.add_argument("--flip-probability", type=float, default=0.0, metavar="P",
                   help="with --sim: flip a random bit of each byte on the line with "
                   "probability P (tests the retries)")
    r.add_argument("--seed", type=int, default=0, help="with --sim: seed of the bit flips")
    r.add_argument("--force", action="store_true", help="overwrite an existing Y.npy")
    r.add_argument("--json", action="store_true", help="print the figures as JSON")

    f = sub.add_parser("flash", help="write a built bitstream to a board",
                       description="Run the board's programmer (iceprog, icesprog, "
                       "openFPGALoader or dfu-util) on the bitstream built for NAME in "
                       "DIR/build/NAME, after checking it was built for that board and for "
                       "the design in DIR; then, for weights in SPRAM, the weight image "
                       "DIR/weights.bin at byte 0x100000 of the flash (iceprog -o).")
    f.add_argument("dir", metavar="DIR")
    f.add_argument("--board", required=True, metavar="NAME", help="see 'onnx2fpga boards'")
    f.add_argument("--dry-run", action="store_true", help="print the command, do not run it")

    k = sub.add_parser("conformance", help="run the ONNX backend node tests",
                       description="Run the ONNX backend node tests of the claimed operators "
                       "(or of --op NAME ...) through the golden model, and through Verilator "
                       "where a test compiles to hardware; print one row per test. Exit "
                       "status 1 if any test fails (unsupported types and options, refused "
                       "by name, do not fail).")
    k.add_argument("--op", nargs="+", action="extend", metavar="NAME",
                   help="operators to test, spelled as ONNX does (default: the quantization "
                   "operators and the float operators of the hardware layers)")
    k.add_argument("--golden-only", action="store_true",
                   help="do not compile and simulate the tests that map to hardware")
    k.add_argument("--json", action="store_true", help="print the results as JSON")
    for command in sub.choices.values():
        talk = command.add_mutually_exclusive_group()
        talk.add_argument("-v", "--verbose", action="count", default=0,
                          help="also print debug messages (each tool's progress, the figures "
                          "of checks)")
        talk.add_argument("-q", "--quiet", action="store_true",
                          help="print warnings and errors only, no progress")
    return p


def _version():
    from .version import __version__
    return __version__


def _compile(args):
    from .api import compile as compile_
    from .report import folding_text
    d = compile_(args.model, args.output, calibration=args.calibration, lenient=args.lenient,
                 allow_host_compute=args.allow_host_compute, force=args.force,
                 weight_bits=args.weight_bits, activation_bits=args.activation_bits,
                 per_channel=not args.per_tensor, pow2_scales=args.pow2_scales,
                 max_lanes=args.max_lanes, folding=args.folding,
                 multiplier_bits=args.multiplier_bits, requant=args.requant, board=args.board,
                 target_fps=args.target_fps, clock_mhz=args.clock,
                 utilization=args.utilization, optimize=args.optimize, verbose=True,
                 stop_after=args.stop_after,
                 name=args.name, weights=args.weights, architecture=args.architecture,
                 adder_levels=args.adder_levels)
    if args.stop_after != "emit":
        print(f"stopped after {args.stop_after}; wrote {os.path.abspath(args.output)}")
        return 0
    m = d.manifest
    print(f"wrote {d.directory}: module {m['top']['module']} ({m['top']['file']}, "
          f"{m['top']['filelist']}, {m['top']['core']}), {len(m['layers'])} hardware layers, "
          f"{m['cycles_per_inference']} cycles per inference, latency {m['latency_cycles']} "
          f"cycles")
    f = m["folding"]
    if f.get("limited_by"):
        print(f"  folding limited by: {f['limited_by']}")
    for ly in m["layers"]:
        par = folding_text(ly)
        if ly.get("multipliers") == "lut" and ly.get("weight_type"):
            par += " lut-mul"
        mark = "  <- bottleneck" if ly["bottleneck"] else ""
        print(f"  {ly['name']:<10} {ly['kind']:<8} {ly['in_size']:>5} -> {ly['out_size']:<5} "
              f"{ly['in_type']:>6} -> {ly['out_type']:<6} {par:<22} {ly['cycles']} "
              f"cycles{mark}")
    q = m["quantization"]
    if "calibration_max_abs_error" in q:
        extra = (f", argmax agreement {q['calibration_argmax_agreement'] * 100:.1f} %"
                 if "calibration_argmax_agreement" in q else "")
        print(f"  quantization vs float on the calibration data: max |error| "
              f"{q['calibration_max_abs_error']:.4g}{extra}")
    return 0


def _read_inputs(args, design):
    """``args.inputs`` as an array (from ``.npy``, or from ``.npz`` by input name; a dict
    of them for a model of several inputs), after
    refusing to overwrite an existing ``args.outputs`` without ``--force``, to write into a
    folder that cannot take it, or to write a model's several outputs into one ``.npy``
    (checked first, so nothing runs before the refusal)."""
    from .arrays import read_arrays
    from .designdir import output_path
    from .errors import InputError
    from .sim.model import stack_inputs

    args.outputs = output_path(args.outputs, args.force)     # Y -> Y.npy, as np.save names it
    names = [o["name"] for o in design.design.outputs]
    if len(names) > 1 and not args.outputs.endswith(".npz"):
        raise InputError(f"{args.outputs}: the model has {len(names)} outputs "
                         f"({', '.join(map(repr, names))}); write them to a .npz file (one "
                         f"array per output name)")
    x = read_arrays(args.inputs, "inputs", InputError)
    if isinstance(x, dict):
        stack_inputs(design.design, x)          # the names checked
        if len(design.design.inputs) == 1:
            x = x[design.design.inputs[0]["name"]]
    return x


def _save_outputs(path: str, design, y) -> None:
    """``y`` (one array, or a dict by output name) into ``path``: ``.npz`` by output name,
    ``.npy`` for one output."""
    from .designdir import save_array

    if path.endswith(".npz") and not isinstance(y, dict):
        y = {design.design.outputs[0]["name"]: y}
    save_array(path, y)


def _batch(x) -> int:
    """The number of samples in ``x`` (an array, or a dict of arrays by input name)."""
    return int(len(next(iter(x.values())) if isinstance(x, dict) else x))


def _shapes(y) -> str:
    if isinstance(y, dict):
        return ", ".join(f"{k} {tuple(v.shape)}" for k, v in y.items())
    return str(tuple(y.shape))


def _shape_fields(y) -> dict:
    if isinstance(y, dict):
        return {"outputs": {k: {"shape": list(v.shape), "dtype": v.dtype.name}
                            for k, v in y.items()}}
    return {"output_shape": list(y.shape), "output_dtype": y.dtype.name}


def _simulate(args):
    import numpy as np

    from .api import load
    from .sim.model import run_design

    d = load(args.dir)
    x = _read_inputs(args, d)
    try:
        y = d.simulate(x, engine=args.engine, stall_in=args.stall_in,
                       stall_out=args.stall_out, seed=args.seed, progress=True, jobs=args.jobs,
                       scheduler=args.scheduler if args.engine == "rtl" else None)
    except ValueError as e:
        raise Onnx2FpgaError(str(e)) from None
    result = {"engine": args.engine, "inferences": _batch(x), **_shape_fields(y)}
    status = 0
    if args.engine == "rtl":
        result.update(d.last_run)
        result.update(stall_in=args.stall_in, stall_out=args.stall_out, seed=args.seed)
        result["manifest_cycles_per_inference"] = d.manifest["cycles_per_inference"]
        result["manifest_latency_cycles"] = d.manifest["latency_cycles"]
        if args.check:
            g = run_design(d.design, x)
            gs, ys = (g, y) if isinstance(y, dict) else ({"": g}, {"": y})
            same = np.ones(_batch(x), bool)
            for k in ys:
                same &= np.all((gs[k] == ys[k]).reshape(_batch(x), -1), axis=1)
            exact = int(np.sum(same))
            result["golden_match"] = f"{exact}/{_batch(x)}"
            status = 0 if exact == _batch(x) else 1
    _save_outputs(args.outputs, d, y)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        line = f"{args.engine}: {_batch(x)} inferences -> {args.outputs} {_shapes(y)}"
        if args.engine == "rtl":
            line += (f"; {result['cycles_per_inference']} cycles per inference, latency "
                     f"{result['latency_cycles']} cycles; {result['total_cycles']} cycles "
                     f"simulated in {result['sim_seconds']:g} s")
            if args.check:
                line += f"; golden match {result['golden_match']}"
        print(line)
    return status


def _seeds(text: str):
    """``--seed``: one integer, or several separated by commas."""
    try:
        seeds = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or integers separated by "
                                         f"commas, not {text!r}") from None
    return seeds[0] if len(seeds) == 1 else seeds


def _numbers(kind):
    """A comma-separated list of ``kind`` values."""
    def parse(text):
        try:
            return [kind(t) for t in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__} values separated by "
                                             f"commas, not {text!r}") from None
    parse.__name__ = f"{kind.__name__} list"
    return parse


def _foldings(text):
    """``--foldings``: ``board``, lane budgets and ``@FILE.json`` per-layer foldings."""
    out = []
    for item in text.split(","):
        if item == "board":
            out.append(item)
        elif item.startswith("@"):
            try:
                with open(item[1:], encoding="utf-8") as f:
                    out.append(json.load(f))
            except (OSError, ValueError) as e:
                raise argparse.ArgumentTypeError(f"{item[1:]}: cannot read a folding ({e})") \
                    from None
        else:
            try:
                out.append(int(item))
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"a folding is 'board', a number of lanes or @FILE.json, not "
                    f"{item!r}") from None
    return out


def _explore(args):
    from .dse import explore

    opts = {k: getattr(args, k) for k in ("weight_bits", "activation_bits", "adder_levels",
                                          "utilization") if getattr(args, k) is not None}
    opts.update({k: True for k in ("lenient", "pow2_scales") if getattr(args, k)})
    doc = explore(args.model, args.output, args.board, seeds=args.seeds,
                  foldings=args.foldings, targets=args.targets, clock_mhz=args.clock_mhz,
                  pnr_options=args.pnr_options, scheduler=args.scheduler,
                  workers=args.workers, calibration=args.calibration, compile_options=opts,
                  timeout=args.timeout, retry_failed=args.retry_failed)
    rows = doc["rows"]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'run':<28} {'cycles':>7} {'Fmax':>7} {'met':>4} {'LUT':>7} {'DSP':>4} "
              f"{'inf/s at Fmax':>14} {'front':>6}  worker")
        for r in rows:
            if r["status"] != "ok":
                print(f"{r['run']:<28} failed: {r['error']}")
                continue
            front = "/".join(c for c in ("lut", "dsp") if r.get(f"pareto_{c}")) or "-"
            print(f"{r['run']:<28} {r['cycles_per_inference']:>7} {r['fmax_mhz']:>7.1f} "
                  f"{'yes' if r['timing_met'] else 'no':>4} {r['lut']:>7} {r['dsp']:>4} "
                  f"{r['inferences_per_second']:>14,.0f} {front:>6}  {r['worker']}")
        where = os.path.join(args.output, "best")
        print(f"chosen: {doc['best'] or 'none (no run met timing)'}"
              f"{f' (copied to {where})' if doc['best'] else ''}; "
              f"{os.path.join(args.output, 'explore.html')}")
    return 0 if doc["best"] else 1


def _build(args):
    from .api import load
    d = load(args.dir)
    report = d.build(args.board, seed=args.seed, clock_mhz=args.clock_mhz, baud=args.baud,
                     link=args.link, fit_check=not args.no_fit_check,
                     pnr_options=args.pnr_options, scheduler=args.scheduler)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        r = report["resources"]
        used = ", ".join(f"{k.upper()} {v['used']}/{v['available']}" for k, v in r.items())
        verdict = "timing met" if report["timing_met"] else "TIMING NOT MET"
        pll = report.get("pll")
        source = (f" from the {pll['primitive']} PLL" if pll else "")
        serial = (f"USB CDC-ACM serial {report['usb']['vid_pid']}" if report.get("usb")
                  else f"serial {report['uart']['baud']} baud")
        print(f"{args.board}: {report['bitstream']}; Fmax {report['fmax_mhz']:.1f} MHz at "
              f"{report['clock_mhz']:.1f} MHz clock{source} ({verdict}); {used}; {serial}")
    return 0 if report["timing_met"] else 1


def _report(args):
    from .report import write_report
    path = write_report(args.dir)
    print(f"wrote {path} and {os.path.join(os.path.dirname(path), 'report.md')}")
    return 0


def _boards(args):
    from .boards.targets import get_board, list_boards
    for name in list_boards():
        t = get_board(name)
        print(f"{t.name:<16} {t.device:<18} {t.clock_mhz:g} MHz  {t.description}")
    return 0


def _run(args):
    import time

    from .api import load
    from .runtime import connect
    from .sim.model import stack_inputs

    design = load(args.dir)
    x = _read_inputs(args, design)
    stack_inputs(design.design, x)     # bad inputs refused before a board is opened
    if args.flip_probability and not args.sim:
        raise Onnx2FpgaError("--flip-probability needs --sim")
    sim_options = {"flip_probability": args.flip_probability, "seed": args.seed,
                   "progress": True} if args.sim else None
    try:
        board = connect(design, args.port, baud=args.baud, sim=args.sim,
                        timeout=args.timeout, retries=args.retries, sim_options=sim_options)
    except ValueError as e:
        raise Onnx2FpgaError(str(e)) from None
    with board:
        start = time.monotonic()
        try:
            y = board.infer(x)
        except ValueError as e:
            raise Onnx2FpgaError(str(e)) from None
        seconds = time.monotonic() - start
    _save_outputs(args.outputs, design, y)
    stats = board.link.stats
    result = {"board": "simulated" if args.sim else args.port, "inferences": _batch(x),
              **_shape_fields(y),
              "design_id": board.info.design_id.hex(), "seconds": round(seconds, 3),
              "inferences_per_second": round(_batch(x) / seconds, 2) if seconds > 0 else None,
              "retries": stats["retries"], "crc_errors": stats["crc_errors"],
              "error_replies": stats["error_replies"], "timeouts": stats["timeouts"]}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['board']}: {_batch(x)} inferences -> {args.outputs} {_shapes(y)} in "
              f"{seconds:.2f} s; {stats['retries']} retries ({stats['crc_errors']} bad CRC, "
              f"{sum(stats['error_replies'].values())} ERROR replies, {stats['timeouts']} "
              f"timeouts)")
    return 0


def _flash(args):
    import shlex

    from .boards.flash import flash_plans, run_flash
    plans = flash_plans(args.dir, args.board)
    if args.dry_run:
        for argv in plans:
            print(shlex.join(argv))
        return 0
    for argv in plans:
        print(f"$ {shlex.join(argv)}", file=sys.stderr, flush=True)
        run_flash(argv)
    return 0


def _conformance(args):
    from .conformance import format_table, run_conformance

    def say(msg):
        print(msg, file=sys.stderr, flush=True)
    try:
        results = run_conformance(args.op, rtl=not args.golden_only,
                                  progress=None if args.json else say)
    except ValueError as e:
        raise Onnx2FpgaError(str(e)) from None
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        print(format_table(results))
    return 0 if all(r.passed or r.result == "unsupported" for r in results) else 1


_SIGNALS = []


def _on_signal(signum, frame):
    """Ctrl-C and SIGTERM: unwind as KeyboardInterrupt, so that temporary folders go away."""
    from .designdir import INTERRUPTED
    INTERRUPTED.set()
    _SIGNALS.append(signum)
    raise KeyboardInterrupt


def _unraisable(hook):
    """``sys.unraisablehook`` that stays quiet about a Ctrl-C swallowed in a ``__del__``
    (:data:`onnx2fpga.designdir.INTERRUPTED` still says it came)."""
    def quiet(u):
        if not isinstance(u.exc_value, KeyboardInterrupt):
            hook(u)
    return quiet


def main(argv=None) -> int:
    import signal

    _SIGNALS.clear()
    old_hook, old_handlers = sys.unraisablehook, {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old_handlers[sig] = signal.signal(sig, _on_signal)
        sys.unraisablehook = _unraisable(old_hook)

    def show(message, category, filename, lineno, file=None, line=None):
        print(f"warning: {message}", file=sys.stderr)
    warnings.showwarning = show
    handler = None
    try:
        from .designdir import INTERRUPTED
        INTERRUPTED.clear()
        args = _parser().parse_args(argv)
        handler = terminal_handler(-1 if args.quiet else args.verbose)
        return {"compile": _compile, "simulate": _simulate, "build": _build,
                "explore": _explore,
                "boards": _boards, "report": _report, "run": _run, "flash": _flash,
                "conformance": _conformance}[args.command](args)
    except KeyboardInterrupt:
        terminated = signal.SIGTERM in _SIGNALS
        print(f"error: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    except Onnx2FpgaError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if handler is not None:
            remove_handler(handler)
        for sig, old in old_handlers.items():
            signal.signal(sig, old)
        sys.unraisablehook = old_hook


if __name__ == "__main__":
    sys.exit(main())
