"""Per-layer and whole-model cycles of a compiled design: the manifest's figures against RTL
simulation (Verilator, no stalls).

    python benchmarks/layer_cycles.py DESIGN_DIR [--inferences N] [--json]

Every layer is built alone (``onnx2fpga.plan.graph.isolate``: the layer between ports of its
own input and output, fed at one transfer per cycle, the output never stalled) and simulated for N
back-to-back inferences; the whole design likewise. Prints, per layer, the manifest's cycles
(the slowest core of the layer), the isolated layer's modelled cycles, the measured ones and
the error. Figures, not pass/fail.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

import onnx2fpga
from onnx2fpga.hw.emit import emit_verilog
from onnx2fpga.ir.layers import ViewLayer
from onnx2fpga.plan import cost
from onnx2fpga.plan.graph import isolate
from onnx2fpga.sim.rtl import simulate_rtl


def _measure(df, work: str, inferences: int, seed: int) -> tuple[float, int, float]:
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "top.v")
    with open(path, "w") as f:
        f.write(emit_verilog(df, name="top"))
    t = df.input.type
    x = np.random.default_rng(seed).integers(t.lo, t.hi, size=(2, df.input.size),
                                             endpoint=True)
    model = cost.dataflow_cycles(df)
    t0 = time.monotonic()
    res = simulate_rtl(path, df.input, df.output, x, build_dir=os.path.join(work, "sim"),
                       stall_prob_in=0.0, stall_prob_out=0.0, timing_runs=inferences,
                       max_cycles_per_inference=10_000 + 4 * model["latency_cycles"]
                       + 4 * model["cycles_per_inference"], progress=False)
    return res.cycles_per_inference, res.latency_cycles, time.monotonic() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("design", metavar="DESIGN_DIR")
    p.add_argument("--inferences", type=int, default=6, help="back-to-back inferences")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    d = onnx2fpga.load(args.design)
    df = d.design.dataflow
    work = tempfile.mkdtemp(prefix="layer-cycles-")
    rows = []
    for k, layer in enumerate(df.layers):
        if isinstance(layer, ViewLayer):
            continue
        entry = next(e for e in d.manifest["layers"] if e["name"] == layer.name)
        try:
            sub = isolate(df, layer.name)
        except ValueError as e:
            rows.append({"layer": layer.name, "skipped": str(e)})
            continue
        model = cost.dataflow_cycles(sub)["cycles_per_inference"]
        print(f"[layer_cycles] {layer.name}: simulating ...", file=sys.stderr, flush=True)
        measured, latency, secs = _measure(sub, os.path.join(work, layer.name),
                                           args.inferences, k)
        rows.append({"layer": layer.name, "kind": layer.kind, "manifest": entry["cycles"],
                     "model_isolated": model, "rtl": measured,
                     "error_pct": round(100 * (entry["cycles"] - measured) / measured, 2),
                     "rtl_latency": latency, "seconds": round(secs, 1)})
    print("[layer_cycles] whole design: simulating ...", file=sys.stderr, flush=True)
    measured, latency, secs = _measure(df, os.path.join(work, "all"), args.inferences, 99)
    whole = {"manifest": d.manifest["cycles_per_inference"], "rtl": measured,
             "error_pct": round(100 * (d.manifest["cycles_per_inference"] - measured)
                                / measured, 2),
             "manifest_latency": d.manifest["latency_cycles"], "rtl_latency": latency,
             "seconds": round(secs, 1)}
    if args.json:
        print(json.dumps({"layers": rows, "whole": whole}, indent=2))
        return 0
    print(f"{'layer':<10} {'kind':<7} {'manifest':>9} {'isolated':>9} {'RTL':>10} "
          f"{'error':>7} {'RTL latency':>11}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['layer']:<10} skipped: {r['skipped']}")
            continue
        print(f"{r['layer']:<10} {r['kind']:<7} {r['manifest']:>9} {r['model_isolated']:>9} "
              f"{r['rtl']:>10.1f} {r['error_pct']:>6.2f}% {r['rtl_latency']:>11}")
    print(f"{'whole':<10} {'':<7} {whole['manifest']:>9} {'':>9} {whole['rtl']:>10.1f} "
          f"{whole['error_pct']:>6.2f}%  latency {whole['rtl_latency']} (model "
          f"{whole['manifest_latency']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
