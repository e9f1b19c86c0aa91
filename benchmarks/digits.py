"""Figures for the bundled digits example: accuracy (float, golden, RTL), cycles, latency,
resources and Fmax on both first boards, and the wall time of each step.

    python benchmarks/digits.py [--out DIR] [--rtl-samples N] [--boards icebreaker,ulx3s-85f]

Prints a table; figures, not pass/fail.
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

import onnx2fpga

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "digits")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="design directory (default: a temporary one)")
    p.add_argument("--rtl-samples", type=int, default=450)
    p.add_argument("--boards", default="icebreaker,ulx3s-85f")
    p.add_argument("--max-lanes", type=int, default=8)
    args = p.parse_args(argv)
    out = args.out or os.path.join(tempfile.mkdtemp(prefix="digits-bench-"), "design")
    x = np.load(os.path.join(HERE, "test_x.npy"))
    y = np.load(os.path.join(HERE, "test_y.npy"))
    cal = np.load(os.path.join(HERE, "calibration.npy"))
    model = os.path.join(HERE, "model.onnx")

    import onnxruntime as ort
    sess = ort.InferenceSession(model)
    acc_float = np.mean(np.argmax(sess.run(None, {"x": x})[0], 1) == y)

    t = time.monotonic()
    d = onnx2fpga.compile(model, out, calibration=cal, force=True, max_lanes=args.max_lanes)
    t_compile = time.monotonic() - t
    t = time.monotonic()
    g = d.simulate(x, engine="golden")
    t_golden = time.monotonic() - t
    acc_golden = np.mean(np.argmax(g, 1) == y)
    n = min(args.rtl_samples, len(x))
    t = time.monotonic()
    r = d.simulate(x[:n], engine="rtl", progress=True)
    t_rtl = time.monotonic() - t
    acc_rtl = np.mean(np.argmax(r, 1) == y[:n])
    exact = int(np.sum(np.all(r == g[:n], axis=1)))

    print(f"digits MLP 64-32-10, int8 (our calibration on {len(cal)} images), "
          f"{len(y)} test digits")
    print(f"  accuracy: float (onnxruntime) {acc_float * 100:.2f} %, golden "
          f"{acc_golden * 100:.2f} %, RTL {acc_rtl * 100:.2f} % on {n} "
          f"(RTL == golden on {exact}/{n})")
    run = d.last_run
    print(f"  cycles per inference: manifest {d.manifest['cycles_per_inference']}, RTL "
          f"{run['cycles_per_inference']}; latency: manifest {d.manifest['latency_cycles']}, "
          f"RTL {run['latency_cycles']}")
    for ly in d.manifest["layers"]:
        print(f"    {ly['name']}: {ly['in_size']}->{ly['out_size']} simd={ly.get('simd')} "
              f"pe={ly.get('pe')} {ly['cycles']} cycles, acc {ly.get('acc_type')}")
    print(f"  wall: compile {t_compile:.1f} s, golden {t_golden:.2f} s, RTL {t_rtl:.1f} s "
          f"(build included)")
    rows = []
    for board in filter(None, args.boards.split(",")):
        t = time.monotonic()
        rep = d.build(board, progress=True)
        dt = time.monotonic() - t
        res = rep["resources"]
        rows.append((board, rep["clock_mhz"], rep["fmax_mhz"], rep["timing_met"],
                     *(f"{res[k]['used']}/{res[k]['available']}" for k in
                       ("lut", "ff", "dsp", "bram", "spram")), dt))
    if rows:
        print(f"  {'board':<12} {'clock':>6} {'Fmax':>7} {'met':>5} {'LUT':>12} {'FF':>12} "
              f"{'DSP':>7} {'BRAM':>7} {'SPRAM':>6} {'build s':>8}")
        for row in rows:
            print(f"  {row[0]:<12} {row[1]:>6.1f} {row[2]:>7.1f} {str(row[3]):>5} "
                  f"{row[4]:>12} {row[5]:>12} {row[6]:>7} {row[7]:>7} {row[8]:>6} "
                  f"{row[9]:>8.1f}")
        cpi = d.manifest["cycles_per_inference"]
        for row in rows:
            print(f"  {row[0]}: {row[2] * 1e6 / cpi:,.0f} inferences/s at Fmax "
                  f"({row[1] * 1e6 / cpi:,.0f} at the board clock)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
