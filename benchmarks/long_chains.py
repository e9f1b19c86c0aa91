"""Time of each compile step on long chains of elementwise operators, to show how it grows.

    python benchmarks/long_chains.py [--sizes 10000,20000,40000] [--op Relu] [--until lower]
                                     [--form float|qdq]

The model: a 16x16 MatMul followed by N ``op`` nodes in a chain (the shape a long epilogue
takes after an exporter's unrolled activations); ``float``: a float model quantized from four
calibration samples, ``qdq``: int8 with a QuantizeLinear/DequantizeLinear pair after every
node, as onnxruntime's quantizer writes it (each op its own group, fused into one layer).

Prints, per N, the seconds each step took (``load``, ``quantize``, ``lower``, ...) and the
ratio to the previous N: a step that is linear in the chain's length doubles its time when N
doubles; a quadratic one quadruples it. Figures, not pass/fail. Before the fixes,
lowering was quadratic: 20,000 Relu took 112 s (float: the group's membership check rebuilt
a set of the whole group per node), 8,000 QDQ Relu 71 s (partition's pruning compared
layers with ``in`` on a list, the requantization fusion copied the growing stage list).
"""

import argparse
import time
import warnings

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnx2fpga.steps import STEPS, Compilation, fold_options, run_steps


def chain_model(n: int, op: str = "Relu", form: str = "float"):
    """MatMul then ``n`` nodes of ``op`` in a chain, on a (1, 16) float input; ``form="qdq"``:
    int8 weights, and a QuantizeLinear/DequantizeLinear pair after the input and every
    node."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W")]
    nodes = []

    def qdq(t):
        if form != "qdq":
            return t
        nodes.append(helper.make_node("QuantizeLinear", [t, "s", "z"], [f"{t}_q"]))
        nodes.append(helper.make_node("DequantizeLinear", [f"{t}_q", "s", "z"], [f"{t}_dq"]))
        return f"{t}_dq"
    if form == "qdq":
        inits = [numpy_helper.from_array(rng.integers(-64, 64, (16, 16)).astype(np.int8), "Wq"),
                 numpy_helper.from_array(np.float32(0.05), "s"),
                 numpy_helper.from_array(np.int8(0), "z")]
        nodes.append(helper.make_node("DequantizeLinear", ["Wq", "s", "z"], ["W"]))
    nodes.append(helper.make_node("MatMul", [qdq("x"), "W"], ["m"], name="mm"))
    t = qdq("m")
    for k in range(n):
        nodes.append(helper.make_node(op, [t], [f"r{k}"], name=f"{op.lower()}{k}"))
        t = qdq(f"r{k}")
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def step_times(model, until: str, form: str = "float") -> dict:
    """Seconds per step of one compile of ``model`` up to ``until``."""
    cal = np.random.default_rng(1).standard_normal((4, 1, 16)).astype(np.float32) \
        if form == "float" else None
    c = Compilation(model, {
        "lenient": False, "calibration": cal, "weight_bits": 8, "activation_bits": 8,
        "per_channel": True, "multiplier_bits": None, "board": None, "target_fps": None,
        "clock_mhz": None, "utilization": 0.8, "folding": None,
        "fold_options": fold_options(None, None, None, 0.8, None)})
    times = {}
    for step in STEPS[:STEPS.index(until) + 1]:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_steps(c, step)
        times[step] = time.perf_counter() - t0
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,20000,40000")
    p.add_argument("--op", default="Relu")
    p.add_argument("--until", default="lower", choices=STEPS)
    p.add_argument("--form", default="float", choices=("float", "qdq"))
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    steps = STEPS[:STEPS.index(args.until) + 1]
    print(f"{'nodes':>8} " + " ".join(f"{s:>10}" for s in steps) + f" {'total':>10}")
    prev = None
    for n in sizes:
        t = step_times(chain_model(n, args.op, args.form), args.until, args.form)
        total = sum(t.values())
        line = f"{n:>8} " + " ".join(f"{t[s]:>9.2f}s" for s in steps) + f" {total:>9.2f}s"
        if prev is not None:
            line += f"   x{total / prev:.2f} for x{n / sizes[sizes.index(n) - 1]:.0f} nodes"
        print(line, flush=True)
        prev = total


if __name__ == "__main__":
    main()
