"""Models as exporters write them: which compile, how many layers run in hardware, and how
close the golden model is to the framework that made the model.

    python benchmarks/exporters.py [--only SUBSTRING] [--samples N]

Every row is one (exporter, pattern): a small network trained for a few steps on
scikit-learn's digits (8x8 images, 64 features), exported by

* ``legacy`` / ``dynamo``: torch 2.13's ``torch.onnx.export`` with ``dynamo=False`` / ``True``,
  then either quantized by onnxruntime's ``quantize_static`` (QDQ, per-channel int8 weights;
  the reference is onnxruntime on the QDQ model) or compiled as a float model with our own
  calibration (``+calib``; the reference is onnxruntime on the float model);
* ``brevitas-qonnx`` / ``brevitas-qcdq``: Brevitas' ``export_qonnx`` / ``export_onnx_qcdq`` of
  the same network with Brevitas' default quantizers (the reference is Brevitas' own torch
  output);
* ``skl2onnx``: an sklearn MLPClassifier converted by skl2onnx (reference: onnxruntime).

Columns: compiles (or the first line of the error), compute nodes in hardware / compute
nodes in the model (Conv, Gemm, MatMul and their integer forms), what runs on the host, and
the agreement: for QDQ references the share of exactly equal outputs and the largest
difference in output quantization steps (LSB); for float references the top-1 agreement and
the largest absolute difference.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
import tempfile
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

COMPUTE = ("Conv", "Gemm", "MatMul", "MatMulInteger", "ConvInteger", "QLinearMatMul",
           "QLinearConv")


def digits():
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    return x, d.target.astype(np.int64)


# -- torch networks ------------------------------------------------------------------------

def torch_patterns():
    import torch
    from torch import nn

    class SE(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(c, c // 2), nn.Linear(c // 2, c)

        def forward(self, x):
            s = x.mean((2, 3))
            s = torch.sigmoid(self.fc2(torch.relu(self.fc1(s))))
            return x * s[:, :, None, None]

    class TwoOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

        def forward(self, x):
            y = self.body(x)
            return y, torch.softmax(y, -1)

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(64, 32), nn.ReLU())
            self.cls, self.aux = nn.Linear(32, 10), nn.Linear(32, 4)

        def forward(self, x):
            h = self.body(x)
            return self.cls(h), self.aux(h)

    def mlp(act):
        return nn.Sequential(nn.Linear(64, 32), act, nn.Linear(32, 10))

    def cnn(pool):
        return nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 8, 3, padding=1),
                             nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                             nn.ReLU(), pool, nn.Flatten(), nn.Linear(16, 10))

    return {
        "mlp-relu": lambda: mlp(nn.ReLU()),
        "mlp-sigmoid": lambda: mlp(nn.Sigmoid()),
        "mlp-tanh": lambda: mlp(nn.Tanh()),
        "mlp-gelu": lambda: mlp(nn.GELU()),
        "mlp-hardswish": lambda: mlp(nn.Hardswish()),
        "mlp-silu": lambda: mlp(nn.SiLU()),
        "cnn-gap": lambda: cnn(nn.AdaptiveAvgPool2d(1)),
        "cnn-se": lambda: nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), SE(8),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)),
        "two-outputs": TwoOut,
        "two-heads": TwoHeads,
    }


def train(net, x, y, steps=60):
    import torch
    torch.manual_seed(0)
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(steps):
        opt.zero_grad()
        out = net(xt)
        out = out[0] if isinstance(out, tuple) else out
        torch.nn.functional.cross_entropy(out, yt).backward()
        opt.step()
    return net.eval()


def export_torch(net, path, dynamo: bool):
    import torch
    names = {"TwoOut": ["logits", "probs"], "TwoHeads": ["logits", "aux"]}.get(
        type(net).__name__, ["y"])
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        kw = {"dynamo": dynamo, "input_names": ["x"], "output_names": names}
        if not dynamo:
            kw["opset_version"] = 17
        torch.onnx.export(net, (torch.zeros(1, 64),), path, **kw)


def ort_quantize(src, dst, calib):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, \
        quantize_static

    import onnx
    name = onnx.load(str(src)).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{name: calib[i:i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)


# -- measuring ------------------------------------------------------------------------------

def ort_run(path, x):
    """onnxruntime on a model exported with batch 1: one sample at a time, outputs stacked."""
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path))
    name = sess.get_inputs()[0].name
    outs = [sess.run(None, {name: x[i:i + 1]}) for i in range(len(x))]
    return [np.concatenate([o[k] for o in outs]) for k in range(len(outs[0]))]


def compute_nodes(path) -> int:
    import onnx
    m = onnx.load(str(path))
    return sum(n.op_type in COMPUTE for n in m.graph.node)


def run_case(model_path, x, reference, *, calibration=None, qdq: bool, out_scale=None,
             output=None):
    """Compile, run the golden model on ``x`` and compare its first output (or the output
    named ``output`` of a model with several) with ``reference``."""
    import onnx2fpga
    from onnx2fpga.errors import Onnx2FpgaError
    total = compute_nodes(model_path)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            design = onnx2fpga.compile(str(model_path), os.path.join(tmp, "d"),
                                       calibration=calibration)
        except Onnx2FpgaError as e:
            return {"compiles": "no: " + " ".join(str(e).split())[:300], "hw": f"-/{total}"}
        d = design.design
        host = [n.op for n in d.head + d.tail
                if n.op not in ("Identity", "QuantizeLinear", "DequantizeLinear")]
        host_compute = sum(op in COMPUTE for op in host)
        got = design.simulate(x, engine="golden")
    row = {"compiles": "yes", "hw": f"{total - host_compute}/{total}",
           "host": ",".join(sorted(set(host))) or "-"}
    if isinstance(got, dict):
        got = [got[output]] if output else list(got.values())
    got = got if isinstance(got, (list, tuple)) else [got]
    ref = reference if isinstance(reference, (list, tuple)) else [reference]
    g, r = np.asarray(got[0], np.float64), np.asarray(ref[0], np.float64)
    if g.shape != r.shape:
        g = g.reshape(r.shape)
    if qdq and out_scale:
        lsb = np.abs(g - r) / out_scale
        row["agreement"] = f"{np.mean(lsb < 0.5) * 100:.1f} % exact, max {lsb.max():.0f} LSB"
    else:
        top1 = np.mean(g.argmax(-1) == r.argmax(-1)) * 100 if g.ndim > 1 else float("nan")
        row["agreement"] = f"top-1 {top1:.1f} %, max |diff| {np.abs(g - r).max():.3g}"
    return row


def output_scale(qdq_path):
    """The scale of the QuantizeLinear that feeds the graph output through DequantizeLinear
    (None if the output is not a dequantized tensor)."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(str(qdq_path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    prod = {o: n for n in m.graph.node for o in n.output}
    n = prod.get(m.graph.output[0].name)
    while n is not None and n.op_type not in ("DequantizeLinear",):
        n = prod.get(n.input[0])
    if n is None or n.input[1] not in inits:
        return None
    return float(np.asarray(inits[n.input[1]]).reshape(-1)[0])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run rows whose name contains this")
    ap.add_argument("--samples", type=int, default=200)
    args = ap.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)      # quantize_static's pre-processing advice
    logging.getLogger("torch").setLevel(logging.ERROR)   # "torchvision is not installed"
    warnings.filterwarnings("ignore")
    x_all, y_all = digits()
    x, y = x_all[:1000], y_all[:1000]
    test = x_all[-args.samples:]
    calib = x[:200]
    rows = []
    work = tempfile.mkdtemp(prefix="exporters-")

    def report(name, row, t0):
        row["name"], row["s"] = name, time.monotonic() - t0
        rows.append(row)
        print(f"{name:34s} {row['compiles'][:60]:60s} {row.get('hw', ''):6s} "
              f"{row.get('host', ''):24s} {row.get('agreement', '')}  ({row['s']:.1f} s)",
              flush=True)
        if row["compiles"] != "yes" and len(row["compiles"]) > 60:
            print(f"    {row['compiles']}", flush=True)

    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
        print("torch is not installed: torch and Brevitas rows skipped")
    if have_torch:
        for pname, make in torch_patterns().items():
            net = train(make(), x, y)
            for exporter in ("legacy", "dynamo"):
                base = f"{exporter}/{pname}"
                if args.only not in base + "+calib" and args.only not in base + "+ortqdq":
                    continue
                t0 = time.monotonic()
                fpath = os.path.join(work, f"{exporter}-{pname}.onnx")
                try:
                    export_torch(net, fpath, exporter == "dynamo")
                except Exception as e:          # noqa: BLE001 - an exporter's failure is data
                    report(base, {"compiles": f"export failed: {type(e).__name__}"}, t0)
                    continue
                ref = ort_run(fpath, test)
                if args.only in base + "+calib":
                    report(base + "+calib", run_case(fpath, test, ref, calibration=calib,
                                                     qdq=False), t0)
                if args.only in base + "+ortqdq":
                    t0 = time.monotonic()
                    qpath = fpath.replace(".onnx", "-qdq.onnx")
                    try:
                        ort_quantize(fpath, qpath, calib[:100])
                    except Exception as e:      # noqa: BLE001
                        report(base + "+ortqdq", {"compiles": f"quantize_static failed: "
                                                              f"{type(e).__name__}"}, t0)
                        continue
                    qref = ort_run(qpath, test)
                    report(base + "+ortqdq", run_case(qpath, test, qref, qdq=True,
                                                      out_scale=output_scale(qpath)), t0)
        for row in brevitas_rows(x, y, test, work, args.only):
            report(*row)
    for row in sklearn_rows(x, y, test, calib, work, args.only):
        report(*row)
    ok = sum(r["compiles"] == "yes" for r in rows)
    print(f"{ok}/{len(rows)} compile")


def brevitas_rows(x, y, test, work, only):
    try:
        import brevitas.nn as qnn
        import torch
        from brevitas.export import export_onnx_qcdq, export_qonnx
        from torch import nn
    except ImportError:
        print("brevitas is not installed: Brevitas rows skipped")
        return
    nets = {
        "mlp": lambda: nn.Sequential(qnn.QuantIdentity(return_quant_tensor=True),
                                     qnn.QuantLinear(64, 32, bias=True),
                                     qnn.QuantReLU(return_quant_tensor=True),
                                     qnn.QuantLinear(32, 10, bias=True)),
        "cnn-maxpool": lambda: nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)), qnn.QuantIdentity(return_quant_tensor=True),
            qnn.QuantConv2d(1, 8, 3, padding=1, bias=True),
            qnn.QuantReLU(return_quant_tensor=True), nn.MaxPool2d(2),
            qnn.QuantConv2d(8, 16, 3, padding=1, bias=True),
            qnn.QuantReLU(return_quant_tensor=True), nn.Flatten(),
            qnn.QuantLinear(16 * 16, 10, bias=True)),
        "mlp-sigmoid": lambda: nn.Sequential(qnn.QuantIdentity(return_quant_tensor=True),
                                             qnn.QuantLinear(64, 32, bias=True),
                                             qnn.QuantSigmoid(return_quant_tensor=True),
                                             qnn.QuantLinear(32, 10, bias=True)),
    }
    for pname, make in nets.items():
        torch.manual_seed(0)
        net = train(make(), x, y, steps=30)
        with torch.no_grad():
            ref = net(torch.from_numpy(test))
            ref = (ref.value if hasattr(ref, "value") else ref).numpy()
        for exporter, fn in (("brevitas-qonnx", export_qonnx), ("brevitas-qcdq",
                                                                export_onnx_qcdq)):
            name = f"{exporter}/{pname}"
            if only not in name:
                continue
            t0 = time.monotonic()
            path = os.path.join(work, f"{exporter}-{pname}.onnx")
            try:
                with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                    warnings.simplefilter("ignore")
                    fn(net, torch.zeros(1, 64), export_path=path)
            except Exception as e:              # noqa: BLE001
                yield name, {"compiles": f"export failed: {type(e).__name__}: {e}"[:80]}, t0
                continue
            yield name, run_case(path, test, ref, qdq=False), t0


def sklearn_rows(x, y, test, calib, work, only):
    name = "skl2onnx/mlp-classifier"
    if only not in name + "+calib" and only not in name + "+ortqdq":
        return
    try:
        from skl2onnx import to_onnx
        from sklearn.neural_network import MLPClassifier
    except ImportError:
        print("skl2onnx is not installed: its rows skipped")
        return
    t0 = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = MLPClassifier((32,), max_iter=50, random_state=0).fit(x, y)
    path = os.path.join(work, "skl2onnx-mlp.onnx")
    onx = to_onnx(clf, x[:1], options={"zipmap": False}, target_opset=17)
    with open(path, "wb") as f:
        f.write(onx.SerializeToString())
    ref = ort_run(path, test)
    # The probabilities (second output) are what can be compared in float.
    yield name + "+calib", run_case(path, test, ref[1], calibration=calib, qdq=False,
                                    output="probabilities"), t0
    t0 = time.monotonic()
    qpath = path.replace(".onnx", "-qdq.onnx")
    ort_quantize(path, qpath, calib[:100])
    qref = ort_run(qpath, test)
    yield name + "+ortqdq", run_case(qpath, test, qref[1], qdq=False,
                                     output="probabilities"), t0


if __name__ == "__main__":
    main()
