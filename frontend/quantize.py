"""Our own post-training quantization of float models, from calibration data.

The float graph is run on the calibration batch by the numpy host interpreter; the ranges
seen at every activation boundary (the input of each MatMul/Gemm chain and the output of each
layer, after its bias and activation) set asymmetric activation quantizers of
``activation_bits`` bits (min-max, zero included); weights are quantized symmetrically per
output channel (or per tensor) to ``weight_bits`` bits in the narrow range ``[-(2^(b-1)-1),
2^(b-1)-1]``; biases to int32 on the accumulator's scale. The result is a QDQ graph in our IR,
lowered by :mod:`onnx2fpga.frontend.lower` exactly like a model quantized by onnxruntime.
"""

from __future__ import annotations

import numpy as np

from ..dataflow import IntType
from ..errors import CalibrationError, UnsupportedError
from ..sim import host
from .ir import Graph, Node

__all__ = ["quantize_graph", "is_quantized", "calibrate"]

_PASS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


def is_quantized(graph: Graph) -> bool:
    return any(n.op in ("QuantizeLinear", "DequantizeLinear") and n.domain in ("", "ai.onnx")
               for n in graph.nodes)


def _sole_consumer(graph: Graph, cons, t):
    c = cons.get(t, [])
    return c[0] if len(c) == 1 and t not in graph.outputs else None


def _is_dense_core(graph: Graph, n: Node) -> bool:
    """MatMul or Gemm (without transA) with a constant 2-D weight as second input."""
    return n.op in ("MatMul", "Gemm") and len(n.inputs) > 1 and \
        n.inputs[1] in graph.constants and graph.constants[n.inputs[1]].ndim == 2 and \
        not (n.op == "Gemm" and n.attrs.get("transA", 0))


def _find_chain(graph: Graph):
    """Boundary tensors and the layer groups between them: [(core, bias_node, nodes)]."""
    cons = graph.consumers()
    start = None
    for n in graph.nodes:
        if _is_dense_core(graph, n):
            start = n
            break
    if start is None:
        raise UnsupportedError([f"Graph {graph.name!r}: no MatMul or Gemm with a constant "
                                f"weight; nothing to quantize for hardware"])
    t = start.inputs[0]
    boundaries, groups = [t], []
    while True:
        n = _sole_consumer(graph, cons, t)
        if n is None:
            break
        if n.op in _PASS:
            t = n.outputs[0]
            continue
        if _is_dense_core(graph, n) and n.inputs[0] == t:
            core, bias, t = n, None, n.outputs[0]
            stage = "bias"
            while True:
                m = _sole_consumer(graph, cons, t)
                if m is None:
                    break
                if m.op in _PASS:
                    t = m.outputs[0]
                elif stage == "bias" and m.op == "Add" and core.op == "MatMul" and \
                        any(i in graph.constants for i in m.inputs):
                    bias, t, stage = m, m.outputs[0], "act"
                elif m.op in ("Relu", "Clip") and all(
                        (not i) or i in graph.constants for i in m.inputs[1:]):
                    t, stage = m.outputs[0], "act"
                else:
                    break
            boundaries.append(t)
            groups.append((core, bias))
            continue
        break
    return boundaries, groups


def calibrate(graph: Graph, samples: np.ndarray, tensors) -> dict[str, tuple[float, float]]:
    """Min and max of each of ``tensors`` over the float model run on every sample."""
    problems = [f"{n.describe()}: cannot run on the host for calibration"
                for n in graph.nodes if not host.supported(n.op, n.domain)]
    if problems:
        raise UnsupportedError(problems)
    ranges = {t: (np.inf, -np.inf) for t in tensors}
    name = graph.inputs[0]
    for k, x in enumerate(samples):
        try:
            env = host.run_nodes(graph.nodes, {name: x}, graph.constants)
        except host.HostOpError as e:
            raise CalibrationError(f"Calibration sample {k}: {e}") from None
        for t in tensors:
            v = np.asarray(env[t], dtype=np.float64)
            if not np.all(np.isfinite(v)):
                raise CalibrationError(f"Calibration sample {k}: tensor {t!r} is not finite "
                                       f"(NaN or infinity in the float model)")
            lo, hi = ranges[t]
            ranges[t] = (min(lo, float(v.min())), max(hi, float(v.max())))
    return ranges


def _act_params(lo: float, hi: float, bits: int):
    qt = IntType(bits, True)
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / (qt.hi - qt.lo)
    if scale <= 0 or not np.isfinite(scale):
        scale = 1.0
    zp = int(np.clip(np.rint(qt.lo - lo / scale), qt.lo, qt.hi))
    return np.float32(scale), zp, qt


def _store_dtype(qt: IntType):
    for dt in (np.int8, np.int16, np.int32, np.int64):
        if np.iinfo(dt).bits >= qt.bits:
            return dt
    raise ValueError(qt)


def quantize_graph(graph: Graph, samples, *, weight_bits: int = 8, activation_bits: int = 8,
                   per_channel: bool = True) -> Graph:
    """Insert quantize/dequantize nodes into a float ``graph`` (in place; also returned).

    ``samples`` is a batch of model inputs, ``(batch, *input_shape)``.
    """
    for what, bits in (("weight_bits", weight_bits), ("activation_bits", activation_bits)):
        if not isinstance(bits, int) or not 2 <= bits <= 16:
            raise ValueError(f"{what} must be an integer from 2 to 16, not {bits!r}")
    if len(graph.inputs) != 1:
        raise UnsupportedError([f"Graph {graph.name!r}: {len(graph.inputs)} inputs; "
                                f"calibration supports one"])
    boundaries, groups = _find_chain(graph)
    ranges = calibrate(graph, samples, boundaries)
    prod = graph.producers()
    new_nodes: dict[int, list[Node]] = {}   # insert after node index (-1: at the start)
    index = {id(n): k for k, n in enumerate(graph.nodes)}
    act = {}
    for t in boundaries:
        scale, zp, qt = _act_params(*ranges[t], activation_bits)
        act[t] = scale
        attrs = {"scale": np.asarray(scale, np.float32), "zero_point": np.asarray(zp, np.int64),
                 "qtype": qt, "axis": 1}
        q = Node("QuantizeLinear", [t], [f"{t}__q"], dict(attrs), f"{t}__quant", "", 13, 13)
        dq = Node("DequantizeLinear", [f"{t}__q"], [f"{t}__dq"], dict(attrs), f"{t}__dequant",
                  "", 13, 13)
        for c in graph.consumers().get(t, []):
            c.inputs = [f"{t}__dq" if i == t else i for i in c.inputs]
        if t in graph.outputs:
            graph.outputs = [f"{t}__dq" if o == t else o for o in graph.outputs]
            graph.tensors[f"{t}__dq"] = graph.tensors[t]
        at = index[id(prod[t])] if t in prod else -1
        new_nodes.setdefault(at, []).extend([q, dq])
        shape = graph.tensors[t].shape
        graph.tensors[f"{t}__q"] = _info(qt, shape)
    wq = IntType(weight_bits, True)
    qmax = wq.hi
    for k, (core, bias) in enumerate(groups):
        w = np.asarray(graph.constants[core.inputs[1]], dtype=np.float64)
        trans = core.op == "Gemm" and bool(core.attrs.get("transB", 0))
        axis = 0 if trans else 1
        absmax = np.abs(w).max(axis=1 - axis) if per_channel else np.abs(w).max(keepdims=True)
        ws = np.where(absmax > 0, absmax / qmax, 1.0).astype(np.float32)
        shape = [1, 1]
        shape[axis] = -1
        wint = np.clip(np.rint(w / ws.astype(np.float64).reshape(shape) if ws.size > 1
                               else w / float(ws[0])), -qmax, qmax)
        wname = f"{core.inputs[1]}__wq{k}"
        graph.constants[wname] = wint.astype(_store_dtype(wq))
        graph.tensors[wname] = _info(wq, wint.shape)
        wattrs = {"scale": ws if per_channel else np.asarray(ws[0], np.float32),
                  "zero_point": np.zeros(ws.shape if per_channel else (), np.int64),
                  "qtype": wq, "axis": axis}
        wdq = Node("DequantizeLinear", [wname], [f"{wname}__dq"], wattrs, f"{wname}__dequant",
                   "", 13, 13)
        in_t = _boundary_before(core, graph)
        s_in = float(act[in_t])
        alpha = float(core.attrs.get("alpha", 1.0)) if core.op == "Gemm" else 1.0
        acc_scale = alpha * s_in * ws.astype(np.float64)
        new = [wdq]
        core.inputs = [core.inputs[0], f"{wname}__dq"] + core.inputs[2:]
        if core.op == "Gemm" and len(core.inputs) > 2 and core.inputs[2]:
            beta = float(core.attrs.get("beta", 1.0))
            new += _quantize_bias(graph, core, 2, acc_scale / beta, k)
        if bias is not None:
            pos = 1 if bias.inputs[1] in graph.constants else 0
            new += _quantize_bias(graph, bias, pos, acc_scale, k)
        new_nodes.setdefault(index[id(core)] - 1, []).extend(new)
    out = list(new_nodes.get(-1, []))
    for k, n in enumerate(graph.nodes):
        out.extend(new_nodes.get(k - 1, []) if k > 0 else [])
        out.append(n)
    out.extend(new_nodes.get(len(graph.nodes) - 1, []))
    graph.nodes = _toposorted(out, graph)
    graph.metadata = dict(graph.metadata, quantization={
        "method": "onnx2fpga post-training min-max", "weight_bits": weight_bits,
        "activation_bits": activation_bits, "per_channel": per_channel,
        "calibration_samples": int(len(samples))})
    return graph


def _boundary_before(core: Node, graph: Graph) -> str:
    name = core.inputs[0]
    prod = graph.producers()
    while name.endswith("__dq") is False and name in prod:
        name = prod[name].inputs[0]
    return name[:-len("__dq")]


def _quantize_bias(graph: Graph, node: Node, pos: int, scale: np.ndarray, k: int):
    b = np.asarray(graph.constants[node.inputs[pos]], dtype=np.float64).reshape(-1)
    scale = np.broadcast_to(np.asarray(scale, np.float64), (max(b.size, scale.size),))
    b = np.broadcast_to(b, scale.shape)
    q = np.clip(np.rint(b / scale), -(2 ** 31), 2 ** 31 - 1).astype(np.int32)
    name = f"{node.inputs[pos]}__bq{k}"
    graph.constants[name] = q
    graph.tensors[name] = _info(IntType(32, True), q.shape)
    attrs = {"scale": scale.astype(np.float32), "zero_point": np.zeros(q.shape, np.int64),
             "qtype": IntType(32, True), "axis": 0}
    dq = Node("DequantizeLinear", [name], [f"{name}__dq"], attrs, f"{name}__dequant", "",
              13, 13)
    node.inputs = list(node.inputs)
    node.inputs[pos] = f"{name}__dq"
    return [dq]


def _info(qt: IntType, shape):
    from .ir import TensorInfo
    return TensorInfo(qt.name, tuple(shape) if shape is not None else None)


def _toposorted(nodes, graph: Graph):
    known = set(graph.inputs) | set(graph.constants)
    out, pending = [], list(nodes)
    while pending:
        rest = []
        for n in pending:
            if all((not i) or i in known for i in n.inputs):
                out.append(n)
                known.update(n.outputs)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            raise CalibrationError("Internal error: quantized graph has a cycle")
        pending = rest
    return out
