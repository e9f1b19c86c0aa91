"""Adder graphs (``multipliers="adders"``, issue 24): every dense layer of a model as one
constant adder graph, one inference per cycle; per layer the weights' signed digits, the
adders with and without the common subexpression search, the adder levels, and the
estimated LUTs and flip-flops on ECP5 and iCE40 at each number of adder levels per register
stage; then the whole design's cycles, latency and compile time.

    python benchmarks/adders.py [MODELS_DIR] [--levels 1,2] [--only jet,digits,...]

MODELS_DIR holds the shared models (``qonnx_model_zoo/``); without it only the digits
example runs. ``jet``: the QKeras jet tagger, its float input calibrated at 16 bits with
power-of-two scales (``pow2_scales``) so that every requantization is a shift; ``jet8``: the
same at 8 bits; ``tfc``: TFC_2W2A; ``unsw``: the UNSW-NB15 MLP (w2a2), its bipolar input
calibrated at 2 bits; ``digits``: the bundled example (int8 calibration).
Figures, not pass/fail; builds are for ``benchmarks/fmax.py`` and ``anchors.py``.
"""

import argparse
import os
import sys
import tempfile
import time
import warnings

import numpy as np

import onnx2fpga
from onnx2fpga.plan.cmvm import cmvm_resources, signed_digits
from onnx2fpga.plan.cmvm_requant import layer_graph
from onnx2fpga.plan.graph import plan_graph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cases(models_dir):
    """name -> (model path, compile options)."""
    rng = np.random.default_rng(0)
    out = {}
    if models_dir:
        zoo = os.path.join(models_dir, "qonnx_model_zoo")
        jet = os.path.join(zoo, "qkeras_jettagging.onnx")
        cal = rng.standard_normal((200, 1, 16)).astype(np.float32)
        for name, bits in (("jet", 16), ("jet8", 8)):
            out[name] = (jet, {"lenient": True, "calibration": cal, "activation_bits": bits,
                               "pow2_scales": True})
        out["tfc"] = (os.path.join(zoo, "TFC_2W2A.onnx"), {"lenient": True})
        # UNSW-NB15's 600 features are bipolar (+-1), mapped to {0, 1} by the graph's
        # Add and Div before its first layer, whose input has no quantizer: calibrated at
        # 2 bits (the least our quantizer makes), both values exact.
        bipolar = rng.choice(np.float32([-1, 1]), (200, 1, 600))
        out["unsw"] = (os.path.join(zoo, "unsw_nb15-mlp-w2a2.onnx"),
                       {"lenient": True, "calibration": bipolar, "activation_bits": 2})
    ex = os.path.join(ROOT, "examples", "digits")
    out["digits"] = (os.path.join(ex, "model.onnx"),
                     {"calibration": np.load(os.path.join(ex, "calibration.npy"))})
    return {k: v for k, v in out.items() if os.path.isfile(v[0])}


def run(name, path, opts, levels, work):
    t = time.monotonic()
    plain = onnx2fpga.compile(path, os.path.join(work, f"{name}-plain"), force=True, **opts)
    fold = {ly.name: {"multipliers": "adders"} for ly in plain.design.dataflow.layers
            if getattr(ly, "multipliers", None) is not None}
    d = onnx2fpga.compile(path, os.path.join(work, name), force=True, folding=fold, **opts)
    seconds = time.monotonic() - t
    print(f"\n{name}: {d.manifest['cycles_per_inference']} cycle(s) per inference, "
          f"latency {d.manifest['latency_cycles']} cycles, both compiles {seconds:.1f} s")
    head = f"{'layer':8} {'shape':>9} {'digits':>7} {'adders':>7} {'unshared':>8} {'depth':>5}"
    for lv in levels:
        head += f" {f'ecp5 L{lv} lut/ff':>18} {f'ice40 L{lv} lut/ff':>18}"
    print(head)
    total = {}
    stages = {st.layer.name: st for st in plan_graph(d.design.dataflow).stages
              if st.kind == "cmvm"}
    for ly in d.design.dataflow.layers:
        st = stages.get(ly.name)
        if st is None:
            continue
        dense = st.params["layer"]
        g, fused = st.params["graph"], st.params["fused"]
        plain_g, _ = layer_graph(dense.weight, dense.bias, dense.in_type.lo, dense.in_type.hi,
                                 dense.in_zero_point, ly.requant if fused else (),
                                 share=False)
        row = (f"{ly.name:8} {'x'.join(map(str, dense.weight.shape)):>9} "
               f"{signed_digits(dense.weight):7} {len(g.adders):7} {len(plain_g.adders):8} "
               f"{g.depth:5}")
        for lv in levels:
            for fam in ("ecp5", "ice40"):
                r = cmvm_resources(g, lv, st.out_type.bits, fam, fused)
                key = (lv, fam)
                total[key] = [a + b for a, b in zip(total.get(key, (0, 0)),
                                                    (r["lut"], r["ff"]), strict=True)]
                row += f" {r['lut']:>8,}/{r['ff']:<9,}"
        print(row)
    row = f"{'total':8} {'':>9} {'':>7} {'':>7} {'':>8} {'':>5}"
    for lv in levels:
        for fam in ("ecp5", "ice40"):
            lut, ff = total.get((lv, fam), (0, 0))
            row += f" {lut:>8,}/{ff:<9,}"
    print(row)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models_dir", nargs="?")
    ap.add_argument("--levels", default="1,2", help="adder levels per stage, comma-separated")
    ap.add_argument("--only", help="comma-separated case names")
    args = ap.parse_args(argv)
    levels = [int(v) for v in args.levels.split(",")]
    todo = cases(args.models_dir)
    if args.only:
        todo = {k: v for k, v in todo.items() if k in args.only.split(",")}
    warnings.simplefilter("ignore")
    print("da4ml 0.5.2 on the jet tagger's layers 1-3 (issue 24): 30.6k logic cells, one "
          "cycle per inference, 91.3 MHz at 2 adder levels per stage")
    with tempfile.TemporaryDirectory() as work:
        for name, (path, opts) in todo.items():
            run(name, path, opts, levels, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
