"""The manifest's latency and cycles per inference against the RTL simulation's, on small
models as exporters write them.

    python benchmarks/latency_model.py [--only NAME ...] [--mlperf] [--keep DIR] [--json]

Each model is compiled, simulated in Verilator (``design.simulate(x, engine="rtl")``: the
testbench's latency phase feeds one inference with no stall on either side and counts from the
first input transfer to the last output transfer, the conventions of
:mod:`onnx2fpga.plan.cost`), and the manifest's ``latency_cycles`` and
``cycles_per_inference`` are printed beside the measured ones with the error in per cent
(positive: the model is above the RTL). Figures, not pass/fail.
"""

import argparse
import json
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import onnx2fpga  # noqa: E402
from tests.helpers.models import CNN_KINDS, float_cnn, ort_qdq_cnn, ort_qdq_mlp  # noqa: E402


def _cnn(kind):
    def build(tmp):
        path, _ = ort_qdq_cnn(tmp, kind=kind, per_channel=True)
        return onnx2fpga.compile(path, tmp / "d"), (1,) + CNN_KINDS[kind]
    return build


def _float_cnn(kind, **options):
    def build(tmp):
        cal = np.random.default_rng(1).standard_normal(
            (64, 1) + CNN_KINDS[kind]).astype(np.float32)
        return (onnx2fpga.compile(float_cnn(kind), tmp / "d", calibration=cal,
                                  **options), (1,) + CNN_KINDS[kind])
    return build


def _mlp(tmp):
    path, _ = ort_qdq_mlp(tmp, sizes=(32, 24, 10))
    return onnx2fpga.compile(path, tmp / "d"), (32,)


def _ds_cnn(tmp):
    from tests.helpers.torch_models import DS_CNN_SHAPE, ds_cnn_qdq
    _, qdq, _ = ds_cnn_qdq(tmp)
    return onnx2fpga.compile(qdq, tmp / "d"), (1,) + DS_CNN_SHAPE


def _paced(kind, size=16):
    def build(tmp):
        from tests.helpers.torch_models import paced_net_qdq
        qdq, shape = paced_net_qdq(tmp, kind, size=size)
        return onnx2fpga.compile(qdq, tmp / "d"), (1,) + shape
    return build


def _mlperf(name):
    def build(tmp):
        # MLPerf Tiny's networks as benchmarks/mlperf_tiny.py builds them, folded for the ECP5
        # board it measures them on; a few minutes each.
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import mlperf_tiny
        from exporters import ort_quantize

        net, shape = mlperf_tiny._nets()[name]
        fp, qdq = str(tmp / f"{name}_fp.onnx"), str(tmp / f"{name}_qdq.onnx")
        mlperf_tiny._export(net, shape, fp)
        if name == "kws":
            from tests.helpers.torch_models import tf_same
            tf_same(fp)                 # TensorFlow's SAME pads, as mlperf_tiny.py measures it
        cal = np.random.default_rng(0).standard_normal((64,) + shape[1:]).astype(np.float32)
        ort_quantize(fp, qdq, cal)
        return onnx2fpga.compile(qdq, tmp / "d", board="ulx3s-85f"), shape[1:]
    return build


#: name -> function(tmp) -> (design, input shape of one inference)
MODELS = {
    "mlp": _mlp,
    "cnn_basic": _cnn("basic"),
    "cnn_residual": _cnn("residual"),
    "cnn_depthwise": _cnn("depthwise"),
    "cnn_avgpool": _cnn("avgpool"),
    "cnn_concat": _float_cnn("concat", max_lanes=6),
    "conv1d": _cnn("conv1d"),
    "conv1d_lanes": _float_cnn("conv1d", max_lanes=6),
    "ds_cnn": _ds_cnn,
    "resnet_small": _paced("resnet"),
    "conv1d_net": _paced("conv1d"),
}

#: Larger models, run with --mlperf.
MLPERF = {"ic": _mlperf("ic"), "kws": _mlperf("kws")}


def measure(name: str, tmp: str) -> dict:
    design, shape = {**MODELS, **MLPERF}[name](tmp)
    x = np.random.default_rng(0).standard_normal((2,) + shape).astype(np.float32)
    design.simulate(x, engine="rtl", stall_in=0.0, stall_out=0.0)
    est, run = design.manifest, design.last_run
    row = {"model": name, "latency_est": est["latency_cycles"],
           "latency_rtl": run["latency_cycles"], "cycles_est": est["cycles_per_inference"],
           "cycles_rtl": run["cycles_per_inference"]}
    row["latency_err"] = 100.0 * (row["latency_est"] / row["latency_rtl"] - 1)
    row["cycles_err"] = 100.0 * (row["cycles_est"] / row["cycles_rtl"] - 1)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=sorted(MODELS) + sorted(MLPERF),
                    help="models to run")
    ap.add_argument("--mlperf", action="store_true",
                    help="also MLPerf Tiny's ResNet-8 and DS-CNN (ic, kws; minutes each)")
    ap.add_argument("--keep", help="compile into this folder (kept) instead of a temporary one")
    ap.add_argument("--json", action="store_true", help="print one JSON object per model")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or scratch
        if not args.json:
            print(f"{'model':<15}{'latency est':>12}{'rtl':>9}{'err %':>8}"
                  f"{'cycles est':>12}{'rtl':>9}{'err %':>8}")
        for name in args.only or [*MODELS, *(MLPERF if args.mlperf else ())]:
            tmp = Path(root) / name
            os.makedirs(tmp, exist_ok=True)
            row = measure(name, tmp)
            rows.append(row)
            if args.json:
                print(json.dumps(row))
            else:
                print(f"{name:<15}{row['latency_est']:>12}{row['latency_rtl']:>9}"
                      f"{row['latency_err']:>8.1f}{row['cycles_est']:>12}"
                      f"{row['cycles_rtl']:>9.0f}{row['cycles_err']:>8.1f}", flush=True)
    worst = max(abs(r["latency_err"]) for r in rows)
    if not args.json:
        print(f"worst latency error {worst:.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
