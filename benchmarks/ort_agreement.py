"""Golden model vs onnxruntime on onnxruntime's own QDQ MLPs: exact matches and the largest
difference, in output quantization steps (LSB), for each multiplier width.

    python benchmarks/ort_agreement.py [--samples N] [--models DIR] [--joins]

With --joins, the pools, adds and concatenations of small QDQ CNNs instead, each layer on
onnxruntime's own inputs (its default path and its integer kernels): outputs that differ.

Without --models, MLPs are built and quantized here (Gemm and MatMul+Add, opsets 13 and 21,
int8/uint8 activations, per-tensor and per-channel weights). With --models, every
``*qdq*.onnx`` in DIR whose input is a float vector is measured too (e.g.
shared/models/generated_ortquant).
"""

import argparse
import glob
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from onnx2fpga.errors import Onnx2FpgaError  # noqa: E402
from onnx2fpga.frontend.load import load_model  # noqa: E402
from onnx2fpga.frontend.lower import lower  # noqa: E402
from onnx2fpga.frontend.qdq import normalize_qdq  # noqa: E402
from onnx2fpga.sim.model import run_design  # noqa: E402
from tests.helpers.models import ort_qdq_mlp  # noqa: E402

CONFIGS = [(k, o, a, pc) for k in ("gemm", "matmul") for o in (13, 21)
           for a in ("int8", "uint8") for pc in (False, True)]


def measure(path, x, bits):
    g = load_model(path)
    normalize_qdq(g)
    d = lower(g, multiplier_bits=bits)
    got = run_design(d, x)
    sess = ort.InferenceSession(str(path))
    name = sess.get_inputs()[0].name
    want = np.stack([sess.run(None, {name: xi})[0] for xi in x])
    lsb = np.abs(got.astype(np.float64) - want) / d.dataflow.output.scale
    return int(np.sum(lsb < 1e-3)), lsb.size, float(lsb.max())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--models", default=None)
    p.add_argument("--bits", default="16,24")
    p.add_argument("--joins", action="store_true",
                   help="pools, adds and concatenations of QDQ CNNs, layer by layer")
    args = p.parse_args(argv)
    if args.joins:
        return joins(args.samples)
    bits = [int(b) for b in args.bits.split(",")]
    tmp = Path(tempfile.mkdtemp())
    rows = []
    for kind, opset, act, pc in CONFIGS:
        path, _ = ort_qdq_mlp(tmp, kind=kind, opset=opset, activation=act, per_channel=pc,
                              sizes=(16, 24, 12, 6))
        x = np.random.default_rng(7).standard_normal((args.samples, 1, 16)).astype(np.float32)
        rows.append((f"{kind} op{opset} {act} {'per-channel' if pc else 'per-tensor'}",
                     [measure(path, x, b) for b in bits]))
    if args.models:
        for path in sorted(glob.glob(os.path.join(args.models, "*qdq*.onnx"))):
            if path.endswith("_fp32.onnx"):
                continue
            sess = ort.InferenceSession(path)
            shape = [d if isinstance(d, int) else 1 for d in sess.get_inputs()[0].shape]
            x = np.random.default_rng(7).standard_normal((args.samples, *shape)).astype(
                np.float32)
            try:
                rows.append((os.path.basename(path), [measure(path, x, b) for b in bits]))
            except Onnx2FpgaError as e:
                rows.append((os.path.basename(path), str(e)[:90]))
    head = "".join(f"  {b:>2}-bit: exact / total, max LSB" for b in bits)
    print(f"{'model':<44}{head}")
    tot = {b: [0, 0, 0.0] for b in bits}
    for name, res in rows:
        if isinstance(res, str):
            print(f"{name:<44}  not compiled: {res}")
            continue
        cells = ""
        for b, (ex, n, mx) in zip(bits, res):
            cells += f"  {ex:>7}/{n:<7} {ex / n * 100:6.2f} %  {mx:.0f}"
            tot[b][0] += ex
            tot[b][1] += n
            tot[b][2] = max(tot[b][2], mx)
        print(f"{name:<44}{cells}")
    for b in bits:
        ex, n, mx = tot[b]
        print(f"all, {b}-bit multipliers: {ex}/{n} exact ({ex / n * 100:.3f} %), largest "
              f"difference {mx:.0f} LSB")


def joins(samples: int) -> None:
    """Each pool, add and concat layer of :func:`~tests.helpers.models.ort_qdq_cnn`'s CNNs
    that have one, run by the golden model on onnxruntime's own input tensors."""
    import onnx2fpga
    from onnx2fpga.sim import golden
    from tests.helpers.models import CNN_KINDS, ort_qdq_cnn, ort_quantized_tensors

    tmp = Path(tempfile.mkdtemp())
    print(f"{'model':<18}{'kernels':<9}{'layer':<16}{'outputs':>9}{'differ':>8}{'%':>8}  max LSB")
    for kind in ("avgpool", "residual", "concat"):
        for act in ("int8", "uint8"):
            path, _ = ort_qdq_cnn(tmp, kind=kind, activation=act)
            x = np.random.default_rng(6).standard_normal(
                (samples, 1) + CNN_KINDS[kind]).astype(np.float32) * 2
            df = onnx2fpga.compile(path, stop_after="lower").design.dataflow
            for integer in (False, True):
                ref = ort_quantized_tensors(path, x, integer_kernels=integer)
                for ly in df.layers:
                    if ly.kind not in ("pool", "add", "concat") or \
                            not all(t in ref for t in (*ly.inputs, ly.output)):
                        continue
                    got = golden.run_layer(ly, *(ref[t] for t in ly.inputs))
                    d = np.abs(got.reshape(samples, -1) - ref[ly.output].reshape(samples, -1))
                    n = int((d != 0).sum())
                    print(f"{kind + ' ' + act:<18}{'integer' if integer else 'default':<9}"
                          f"{ly.name + ' (' + ly.kind + ')':<16}{d.size:>9}{n:>8}"
                          f"{100 * n / d.size:>8.3f}  {int(d.max())}")


if __name__ == "__main__":
    sys.exit(main())
