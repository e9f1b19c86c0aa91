"""MLPerf Tiny's four closed-division architectures, rebuilt here with random weights and
quantized as the reference files are (int8 QDQ, per-channel weights, onnxruntime's
``quantize_static``), compiled per board; the measuring instrument of issue 23.

    python benchmarks/mlperf_tiny.py [--boards ulx3s-85f,icebreaker|none] [--only ic,kws,vww,ad]
                                     [--samples 20] [--requant onnxruntime|exact] [--rtl N]
                                     [--json]

The project cannot download the trained files, so the weights are random (kaiming, as torch
initializes them) and batch normalization is left out, as if folded; the shapes, operators and
quantization are those of the files:

* ``ic``: ResNet-8 on 32x32x3 (NHWC input, then a Transpose), conv 3x3 16, three residual
  stacks 16/32/64 with stride 2 and 1x1 projection shortcuts, average pool, dense 10, Softmax.
* ``kws``: DS-CNN, input [1, 490] reshaped to 49x10x1, conv 10x4 stride 2 64 ch,
  4 x (depthwise 3x3 + pointwise 1x1), average pool over the whole map, dense 12, Softmax;
  with TensorFlow's SAME padding as the reference file has it (pads 4, 1, 5, 1: a 25x5 map;
  torch writes symmetric pads, so the exported Conv's pads and the pool's kernel are
  rewritten before quantizing, ``tests.helpers.torch_models.tf_same``).
* ``vww``: MobileNetV1 alpha 0.25 on 96x96x3 (NHWC), 13 depthwise-separable blocks with
  ReLU6, average pool, dense 2, Softmax.
* ``ad``: the autoencoder 640-128-128-128-128-8-128-128-128-128-640 with ReLU.

Per model and board it prints whether ``compile --board`` takes it (else its one-line error),
the compile's wall and CPU time and the process's peak memory so far, cycles per inference
(II) and latency in cycles, both in ms at 100 MHz (the II's is MLPerf Tiny's figure, one
over the throughput of back-to-back inferences), the estimated resources, the multiply
limit (MACs / the ECP5-85F's 156 MULT18X18D: one int8 x int8 product each, since
nextpnr-ecp5 places MULT18X18D only, not the 9x9 halves, and two products share one only for
unsigned inputs times weights of at most 5 bits; the issue's figure assumed two) and the share
of it reached, and the published figures beside them; on the ULX3S-85F also the place and
route measured at ad8452e (:data:`MEASURED`: Fmax, resources, and the II in ms at that
Fmax, for the ``--utilization`` given there, which the compile here does not use);
then the golden model against onnxruntime on ``--samples`` random inputs (argmax agreement and
the largest difference of the outputs) and on the quantized logits (the QuantizeLinear before
the Softmax, or the last one: share of identical integers and the largest difference in LSB,
against onnxruntime as it runs by default and with its integer kernels for int8 activations,
``session.qdqisint8allowed``), with the compile's requantization (``--requant``, by default
its own choice: onnxruntime's for these models). ``--boards none`` compiles without a
board's folding (faster). Figures, not pass/fail.
"""

import argparse
import contextlib
import io
import json
import logging
import os
import resource
import sys
import tempfile
import time
import warnings

import numpy as np

import onnx2fpga

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from exporters import ort_quantize, ort_run  # noqa: E402

from tests.helpers.torch_models import tf_same  # noqa: E402

#: Best published latency of one inference (MLPerf Tiny, closed division), in ms.
PUBLISHED = {"ic": (0.411, "fpgaConvNet, ZedBoard, 211 DSPs at 143 MHz; 0.147 ms on a ZC706"),
             "kws": (0.324, "fpgaConvNet, ZedBoard"),
             "vww": (0.720, "fpgaConvNet, ZC706"),
             "ad": (0.0187, "hls4ml AD08 (a smaller model), Pynq-Z2")}

#: Place and route on the ULX3S-85F at 100 MHz (``benchmarks/fmax.py --designs tiny-NAME
#: --boards ulx3s-85f --clock-mhz 100 --utilization U --seeds S``), measured at ad8452e:
#: (``--utilization``, seed, Fmax in MHz, LUT, FF, MULT18X18D, DP16KD, cycles per inference).
MEASURED_AT = "ad8452e"
MEASURED = {"ic": (0.7, 1, 106.8, 52289, 33806, 105, 118, 36864),
            "kws": (0.75, 1, 110.7, 45012, 37092, 117, 59, 16000),
            "vww": (0.75, 2, 107.0, 52709, 38432, 117, 207, 41472),
            "ad": (0.75, 1, 111.5, 30287, 24123, 117, 145, 1024)}

#: The ECP5-85F's hard multipliers (one int8 product each) for the multiply limit.
ECP5_85F_DSPS = 156


def _nets():
    import torch
    from torch import nn

    torch.manual_seed(0)        # the weights: the same figures on every run
    class NHWC(nn.Module):
        def __init__(self, body):
            super().__init__()
            self.body = body

        def forward(self, x):
            return torch.softmax(self.body(x.permute(0, 3, 1, 2)), dim=1)

    def conv(cin, cout, k, s=1, groups=1, act=nn.ReLU):
        return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, groups=groups), act())

    class Stack(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.a = conv(cin, cout, 3, stride)
            self.b = nn.Conv2d(cout, cout, 3, 1, 1)
            self.short = nn.Conv2d(cin, cout, 1, stride) if stride != 1 else nn.Identity()

        def forward(self, x):
            return torch.relu(self.b(self.a(x)) + self.short(x))

    resnet8 = NHWC(nn.Sequential(conv(3, 16, 3), Stack(16, 16, 1), Stack(16, 32, 2),
                                 Stack(32, 64, 2), nn.AvgPool2d(8), nn.Flatten(),
                                 nn.Linear(64, 10)))

    class DSCNN(nn.Module):
        def __init__(self):
            super().__init__()
            layers = [nn.Conv2d(1, 64, (10, 4), 2, (4, 1)), nn.ReLU()]
            for _ in range(4):
                layers += [conv(64, 64, 3, groups=64), conv(64, 64, 1)]
            self.body = nn.Sequential(*layers, nn.AvgPool2d((24, 5)), nn.Flatten(),
                                      nn.Linear(64, 12))

        def forward(self, x):
            return torch.softmax(self.body(x.reshape(-1, 1, 49, 10)), dim=1)

    blocks, cin = [conv(3, 8, 3, 2, act=nn.ReLU6)], 8
    for cout, stride in ((16, 1), (32, 2), (32, 1), (64, 2), (64, 1), (128, 2), (128, 1),
                         (128, 1), (128, 1), (128, 1), (128, 1), (256, 2), (256, 1)):
        blocks += [conv(cin, cin, 3, stride, groups=cin, act=nn.ReLU6),
                   conv(cin, cout, 1, act=nn.ReLU6)]
        cin = cout
    mobilenet = NHWC(nn.Sequential(*blocks, nn.AvgPool2d(3), nn.Flatten(), nn.Linear(256, 2)))

    sizes = (640, 128, 128, 128, 128, 8, 128, 128, 128, 128, 640)
    ae = []
    for k in range(len(sizes) - 1):
        ae += [nn.Linear(sizes[k], sizes[k + 1])] + ([nn.ReLU()] if k < len(sizes) - 2 else [])
    return {"ic": (resnet8, (1, 32, 32, 3)), "kws": (DSCNN(), (1, 490)),
            "vww": (mobilenet, (1, 96, 96, 3)), "ad": (nn.Sequential(*ae), (1, 640))}


def _export(net, shape, path):
    import torch
    torch.manual_seed(0)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(net.eval(), (torch.zeros(shape),), path, dynamo=False,
                          opset_version=17, input_names=["x"], output_names=["y"])


def quantized(name, work):
    """Model ``name``'s float file and its int8 QDQ file in folder ``work`` (calibrated on 64
    normal inputs); ``(float path, QDQ path, input shape, rng)``, the generator past the
    calibration draw (the test inputs come next)."""
    net, shape = _nets()[name]
    fpath, qpath = (os.path.join(work, f"{name}{s}.onnx") for s in ("_fp32", "_qdq"))
    _export(net, shape, fpath)
    if name == "kws":
        tf_same(fpath)
    rng = np.random.default_rng(0)
    cal = rng.standard_normal((64, *shape[1:])).astype(np.float32)
    ort_quantize(fpath, qpath, cal)
    return fpath, qpath, shape, rng


def macs(path) -> int:
    """Multiply-accumulates of one inference: Conv, Gemm and MatMul nodes."""
    import onnx
    from onnx import numpy_helper, shape_inference
    m = shape_inference.infer_shapes(onnx.load(path))
    g = m.graph
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*g.value_info, *g.input, *g.output]}
    inits = {t.name: numpy_helper.to_array(t).shape for t in g.initializer}
    total = 0
    for n in g.node:
        if n.op_type == "Conv":
            w = inits.get(n.input[1]) or shapes.get(n.input[1])
            out = shapes.get(n.output[0])
            if w and out:
                total += int(np.prod(out[1:])) * int(np.prod(w[1:]))
        elif n.op_type in ("Gemm", "MatMul"):
            w = inits.get(n.input[1]) or shapes.get(n.input[1])
            if w:
                total += int(np.prod(w))
    return total


def logits_tensor(path) -> str:
    """The quantized logits: the QuantizeLinear output whose DequantizeLinear feeds the
    Softmax, or the graph's last QuantizeLinear output without one."""
    import onnx
    g = onnx.load(str(path)).graph
    prod = {o: n for n in g.node for o in n.output}
    for n in g.node:
        if n.op_type == "Softmax" and n.input[0] in prod and \
                prod[n.input[0]].op_type == "DequantizeLinear":
            return prod[n.input[0]].input[0]
    return [n.output[0] for n in g.node if n.op_type == "QuantizeLinear"][-1]


def ort_tensor(path, x, name, integer_kernels=False) -> np.ndarray:
    """onnxruntime's value of tensor ``name`` (made a graph output) per sample, int64
    ``(samples, size)``; ``integer_kernels``: with ``session.qdqisint8allowed``, so that the
    int8-activation Convs run in onnxruntime's integer kernels on x86 too (by default they run
    as DequantizeLinear, a float Conv, QuantizeLinear there, whose float sums decide a few
    ties per million outputs differently)."""
    import onnx
    import onnxruntime as ort
    from onnx import helper
    m = onnx.load(str(path))
    q = next(n for n in m.graph.node if n.output[0] == name)
    zp = next(i for i in m.graph.initializer if i.name == q.input[2])
    m.graph.output.append(helper.make_tensor_value_info(name, zp.data_type, None))
    so = ort.SessionOptions()
    so.log_severity_level = 3           # the quantizer's unused initializers
    if integer_kernels:
        so.add_session_config_entry("session.qdqisint8allowed", "1")
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    iname = sess.get_inputs()[0].name
    return np.stack([sess.run([name], {iname: x[i:i + 1]})[0].reshape(-1)
                     for i in range(len(x))]).astype(np.int64)


def golden_tensor(d, x, name):
    """The golden model's integers of ONNX tensor ``name`` (a hardware layer's output), from
    the model's float inputs; None if no layer writes it."""
    from onnx2fpga.sim import golden
    from onnx2fpga.sim.model import run_head, stack_inputs
    df = d.design.dataflow
    env = {df.input.name: run_head(d.design, stack_inputs(d.design, x)[0])}
    for layer in df.layers:
        env[layer.output] = golden.run_layer(layer, *(env[t] for t in layer.inputs)).reshape(
            len(x), -1)
    return env.get(name)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timing(row, start, cpu) -> None:
    """Wall and CPU seconds of the compile (CPU time is the steadier figure on a machine
    shared with other jobs) and the process's peak resident memory so far, in MB (Linux
    reports ``ru_maxrss`` in kB; the largest compile of the run sets it)."""
    row["compile_s"] = round(time.monotonic() - start, 1)
    row["compile_cpu_s"] = round(_cpu_s() - cpu, 1)
    row["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _rtl(d, x, golden, row) -> None:
    """Verilator on ``x`` with random stalls on both sides (30 %): whether it equals the
    golden model, and its cycles per inference and latency (one inference, no stalls) beside
    the manifest's."""
    got = d.simulate(x, engine="rtl", stall_in=0.3, stall_out=0.3)
    row["rtl_equals_golden"] = bool(np.array_equal(np.asarray(got), np.asarray(golden)))
    d.simulate(x[:1], engine="rtl", stall_in=0, stall_out=0)
    row["rtl_ii_cycles"] = d.last_run["cycles_per_inference"]
    row["rtl_latency_cycles"] = d.last_run["latency_cycles"]


def _row(name, board, qdq, x, requant=None, rtl=0) -> dict:
    row = {"model": name, "board": board}
    start, cpu = time.monotonic(), _cpu_s()
    try:
        with tempfile.TemporaryDirectory(prefix=f"mlperf-{name}-") as out:
            d = onnx2fpga.compile(qdq, os.path.join(out, "d"), force=True, requant=requant,
                                  board=None if board == "none" else board)
            row["requant"] = d.manifest["quantization"].get("requant")
            row["architecture"] = d.manifest.get("architecture")
            _timing(row, start, cpu)
            man = d.manifest
            row["ii_cycles"] = man["cycles_per_inference"]
            row["latency_cycles"] = man.get("latency_cycles")
            row["latency_ms_100mhz"] = round(row["latency_cycles"] / 1e5, 4) \
                if row["latency_cycles"] else None
            # MLPerf Tiny's figure: 1 / throughput of back-to-back inferences, the II here.
            row["ii_ms_100mhz"] = round(row["ii_cycles"] / 1e5, 4)
            row["resources"] = man.get("resources")
            golden = d.simulate(x, engine="golden")
            if rtl:
                _rtl(d, x[:rtl], golden[:rtl], row)
            ref = ort_run(qdq, x)[0]
            got = np.asarray(golden if not isinstance(golden, dict) else
                             next(iter(golden.values()))).reshape(ref.shape)
            row["argmax_agreement"] = float(np.mean(got.argmax(1) == ref.argmax(1))) \
                if ref.ndim == 2 and ref.shape[1] > 1 else None
            row["max_abs_diff_vs_ort"] = float(np.max(np.abs(got - ref)))
            t = logits_tensor(qdq)
            mine = golden_tensor(d, x, t)
            if mine is not None:
                diff = np.abs(mine - ort_tensor(qdq, x, t))
                row["logits_exact"] = round(float(np.mean(diff == 0)), 4)
                row["logits_worst_lsb"] = int(diff.max())
                diff = np.abs(mine - ort_tensor(qdq, x, t, integer_kernels=True))
                row["logits_exact_int_kernels"] = round(float(np.mean(diff == 0)), 4)
                row["logits_worst_lsb_int_kernels"] = int(diff.max())
    except onnx2fpga.Onnx2FpgaError as e:
        _timing(row, start, cpu)
        row["error"] = str(e).splitlines()[0]
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--boards", default="ulx3s-85f",
                    help="comma-separated board names ('none': no board's folding)")
    ap.add_argument("--only", default="ic,kws,vww,ad", help="comma-separated subset")
    ap.add_argument("--samples", type=int, default=20, help="inputs for golden vs onnxruntime")
    ap.add_argument("--requant", choices=("onnxruntime", "exact"), default=None,
                    help="the compile's requantization (default: its own choice)")
    ap.add_argument("--rtl", type=int, default=0, metavar="N",
                    help="also run N inputs in Verilator under stalls (RTL against golden, "
                         "measured cycles)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)      # quantize_static's pre-processing advice
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlperf-tiny-") as work:
        for name in args.only.split(","):
            fpath, qpath, shape, rng = quantized(name, work)
            x = rng.standard_normal((args.samples, *shape[1:])).astype(np.float32)
            n_macs = macs(fpath)
            limit = n_macs / ECP5_85F_DSPS
            for board in args.boards.split(","):
                row = _row(name, board, qpath, x, args.requant, args.rtl)
                row["macs"] = n_macs
                row["ecp5_85f_multiply_limit_cycles"] = round(limit)
                if "ii_cycles" in row:
                    row["share_of_limit"] = round(limit / row["ii_cycles"], 3)
                row["published_ms"], row["published"] = PUBLISHED[name]
                if board == "ulx3s-85f":
                    u, seed, fmax, *res, cycles = MEASURED[name]
                    row["measured"] = {"utilization": u, "seed": seed, "fmax_mhz": fmax,
                                       "resources": dict(zip(("lut", "ff", "dsp", "bram"),
                                                             res)),
                                       "cycles": cycles, "ms_at_fmax": round(
                                           cycles / (fmax * 1e3), 4)}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'model':<5} {'board':<11} {'compile':>8} {'cpu':>7} {'MB':>5} {'II':>9} "
          f"{'II ms':>7} {'latency':>9} {'ms@100':>7} {'limit':>7} {'share':>6} {'pub. ms':>8}  "
          f"agreement / error")
    for r in rows:
        tail = r.get("error") or (f"argmax {r['argmax_agreement']}, max diff "
                                  f"{r['max_abs_diff_vs_ort']:.3g}; quantized logits "
                                  f"({r['requant']}): {r.get('logits_exact', '-')} exact, "
                                  f"worst {r.get('logits_worst_lsb', '-')} LSB; against "
                                  f"onnxruntime's integer kernels "
                                  f"{r.get('logits_exact_int_kernels', '-')} exact, worst "
                                  f"{r.get('logits_worst_lsb_int_kernels', '-')} LSB")
        if r.get("architecture") == "layer engine":
            tail = "layer engine; " + tail
        if "measured" in r:
            me = r["measured"]
            tail += (f"; built at {MEASURED_AT} (--utilization {me['utilization']}, seed "
                     f"{me['seed']}): {me['fmax_mhz']} MHz, {me['cycles']} cycles = "
                     f"{me['ms_at_fmax']} ms at Fmax, " + "/".join(
                         str(v) for v in me["resources"].values()) + " LUT/FF/DSP/BRAM")
        if "rtl_equals_golden" in r:
            tail += (f"; RTL under stalls equals golden: {r['rtl_equals_golden']}, "
                     f"II {r['rtl_ii_cycles']}, latency {r['rtl_latency_cycles']}")
        print(f"{r['model']:<5} {r['board']:<11} {r['compile_s']:>7}s {r['compile_cpu_s']:>6}s"
              f" {r['peak_rss_mb']:>5} {r.get('ii_cycles', '-'):>9} {r.get('ii_ms_100mhz', '-'):>7}"
              f" {r.get('latency_cycles', '-') or '-':>9} {r.get('latency_ms_100mhz', '-'):>7}"
              f" {r['ecp5_85f_multiply_limit_cycles']:>7} {r.get('share_of_limit', '-'):>6}"
              f" {r['published_ms']:>8}  {tail}")


if __name__ == "__main__":
    main()
