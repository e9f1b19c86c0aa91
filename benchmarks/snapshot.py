"""sha256 of every file a compile writes, for a fixed set of models and options.

    python benchmarks/snapshot.py MODELS_DIR [--out snapshot.json] [--only NAME,...]
                                  [--boards none,icebreaker,ulx3s-85f]

A refactoring that must not change the hardware (the restructure of the package layout, say)
runs this before and after and compares the two files: ``top.v``, ``manifest.json``,
``design.json`` and ``design.npz`` must be byte-identical, and a compile that was refused
must be refused with the same message. MODELS_DIR holds the shared models; the two bundled
examples are always included. Calibration data is fixed (seeded), so that every run of the
same code writes the same files. Prints one line per model and option set.
"""

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
import warnings

import numpy as np

import onnx2fpga
from onnx2fpga.errors import Onnx2FpgaError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ("top.v", "manifest.json", "design.json", "design.npz")


def _cases(models_dir):
    """name -> (model path, compile options)."""
    cases = {}
    for ex in ("digits", "cnn_digits"):
        here = os.path.join(ROOT, "examples", ex)
        cases[ex] = (os.path.join(here, "model.onnx"),
                     {"calibration": np.load(os.path.join(here, "calibration.npy"))})
    if models_dir is None:
        return cases
    rng = np.random.default_rng(0)
    zoo = os.path.join(models_dir, "qonnx_model_zoo")
    for name in ("TFC_1W1A", "TFC_1W2A", "TFC_2W2A", "kwsmlp_w3a3", "unsw_nb15-mlp-w2a2"):
        cases[name] = (os.path.join(zoo, name + ".onnx"), {"lenient": True})
    cases["qkeras_jettagging"] = (
        os.path.join(zoo, "qkeras_jettagging.onnx"),
        {"lenient": True, "activation_bits": 16,
         "calibration": rng.standard_normal((200, 1, 16)).astype(np.float32)})
    for name in ("TFC_2W2A_qcdq", "kwsmlp_w3a3_qcdq", "qkeras_jettagging_qcdq"):
        cases[name] = (os.path.join(models_dir, "derived_qcdq", name + ".onnx"),
                       {"lenient": True})
    repo = os.path.join(models_dir, "qonnx_repo")
    cases["mnist-8"] = (os.path.join(repo, "mnist-conv", "model.onnx"),
                        {"calibration": rng.random((64, 1, 28, 28), np.float32)})
    cases["residual_block"] = (os.path.join(repo, "residual_block_clean.onnx"),
                               {"calibration": rng.random((16, 1, 200, 200), np.float32)})
    ort = os.path.join(models_dir, "generated_ortquant")
    if os.path.isdir(ort):
        for f in sorted(os.listdir(ort)):
            if f.endswith(".onnx") and not f.endswith("_fp32.onnx"):
                cases["ort_" + f[:-5]] = (os.path.join(ort, f), {})
    return {k: v for k, v in cases.items() if os.path.isfile(v[0])}


def snapshot(path, opts, board, work):
    """``{file: sha256}`` of a compile, or ``{"error": message}`` if it was refused."""
    out = os.path.join(work, "d")
    t = time.monotonic()
    try:
        onnx2fpga.compile(path, out, force=True, board=board, **opts)
    except Onnx2FpgaError as e:
        return {"error": f"{type(e).__name__}: {e}", "seconds": round(time.monotonic() - t, 1)}
    row = {}
    for f in FILES:
        with open(os.path.join(out, f), "rb") as fh:
            row[f] = hashlib.sha256(fh.read()).hexdigest()
    row["seconds"] = round(time.monotonic() - t, 1)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models_dir", nargs="?")
    ap.add_argument("--out", default="snapshot.json")
    ap.add_argument("--only", default=None, help="comma-separated model names")
    ap.add_argument("--boards", default="none,icebreaker,ulx3s-85f")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    cases = _cases(args.models_dir)
    if args.only:
        cases = {k: v for k, v in cases.items() if k in args.only.split(",")}
    boards = [None if b == "none" else b for b in args.boards.split(",")]
    result = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            result = json.load(f)
    with tempfile.TemporaryDirectory() as work:
        for name, (path, opts) in cases.items():
            for board in boards:
                key = f"{name}@{board or 'default'}"
                row = snapshot(path, opts, board, work)
                result[key] = row
                short = row.get("error") or " ".join(
                    f"{f}={row[f][:12]}" for f in FILES)
                print(f"{key:45s} {row['seconds']:7.1f}s {short}", flush=True)
                with open(args.out, "w") as f:
                    json.dump(result, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
