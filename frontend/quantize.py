"""Our own post-training quantization of float models, from calibration data.

The float graph is split into the same *groups* the lowering maps onto hardware layers
(:class:`~onnx2fpga.frontend.groups.Group`, found by
:func:`~onnx2fpga.frontend.groups.float_groups`): a core (MatMul / Gemm / Conv with a constant
weight, a pool, a resize, a pad, an add of two activations, a concatenation), or nothing,
followed by its epilogue (constant bias / scale / BatchNormalization, then Relu / Clip /
LeakyRelu), or a function group (a Sigmoid, Tanh, Gelu, ``x * Sigmoid(x)``..., quantized
before and after so that it becomes a table); a constant-zero Pad in front of a convolution joins the convolution's group; views
pass through. The float graph is run on the calibration batch by the numpy host interpreter; the
ranges seen at every group's input and output set asymmetric activation quantizers of
``activation_bits`` bits (min-max, zero included). Max pools, resizes and pads keep their
input's quantizer (their outputs lie in their input's range), so they never requantize.
Weights are quantized symmetrically per output channel (or per tensor) to ``weight_bits`` bits
in the narrow range ``[-(2^(b-1)-1), 2^(b-1)-1]``; biases to int32 on the accumulator's scale.
The result is a QDQ graph in our IR, lowered exactly like a model quantized by onnxruntime.
"""

from __future__ import annotations

import numpy as np

from ..errors import CalibrationError, OptionError, UnsupportedError
from ..ir import IntType
from ..sim import host
from .groups import VIEW_OPS, Group, float_groups
from .ir import Graph, Node, TensorInfo
from .load import QONNX_DOMAINS, QONNX_OPS

__all__ = ["quantize_graph", "is_quantized", "calibrate", "fold_constants",
           "quantize_float_inputs"]

_SAME_RANGE = ("MaxPool", "GlobalMaxPool", "ReduceMax", "Resize", "Upsample", "Pad", "Slice",
               "Split")


def is_quantized(graph: Graph) -> bool:
    """The graph holds ONNX Q/DQ nodes or QONNX quantizers (before or after
    :func:`~onnx2fpga.frontend.qonnx.normalize_qonnx`)."""
    return any(n.op in ("QuantizeLinear", "DequantizeLinear") and n.domain in ("", "ai.onnx")
               or n.domain in QONNX_DOMAINS and n.op in QONNX_OPS for n in graph.nodes)


def fold_constants(graph: Graph) -> Graph:
    """Evaluate every node whose inputs are all constants (a reshaped weight, a computed
    shape) on the host and keep its result as a constant (in place; also returned)."""
    keep = []
    for n in graph.nodes:
        ins = [i for i in n.inputs if i]
        if ins and all(i in graph.constants for i in ins) and n.domain in ("", "ai.onnx") \
                and host.supported(n.op, n.domain) and len(n.outputs) == 1 and \
                n.op not in ("QuantizeLinear", "DequantizeLinear") and \
                n.outputs[0] not in graph.outputs:
            try:
                env = host.run_nodes([n], {}, graph.constants)
            except host.HostOpError:
                keep.append(n)
                continue
            value = np.asarray(env[n.outputs[0]])
            graph.constants[n.outputs[0]] = value
            graph.tensors[n.outputs[0]] = TensorInfo(value.dtype.name, tuple(value.shape))
            continue
        keep.append(n)
    graph.nodes = keep
    return graph


def calibrate(graph: Graph, samples: np.ndarray, tensors) -> dict[str, tuple[float, float]]:
    """Min and max of each of ``tensors`` over the float model run on every sample."""
    supported = ", ".join(sorted(host.HOST_OPS))
    problems = [f"{n.describe()}: {n.op} is not supported (every operator of a float model "
                f"runs in numpy to calibrate it; supported: {supported})"
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


def _pow2_ceil(v):
    """The smallest power of two at least ``v`` (elementwise; ``v > 0``)."""
    return np.exp2(np.ceil(np.log2(v)))


def _act_params(lo: float, hi: float, bits: int, pow2: bool = False):
    qt = IntType(bits, True)
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / (qt.hi - qt.lo)
    if scale <= 0 or not np.isfinite(scale):
        scale = 1.0
    if pow2:
        scale = float(_pow2_ceil(scale))
    zp = int(np.clip(np.rint(qt.lo - lo / scale), qt.lo, qt.hi))
    return np.float32(scale), zp, qt


def _store_dtype(qt: IntType):
    for dt in (np.int8, np.int16, np.int32, np.int64):
        if np.iinfo(dt).bits >= qt.bits:
            return dt
    raise ValueError(qt)


def _through_views(graph: Graph, t: str) -> str:
    """The tensor ``t`` is a view of (back through view operators)."""
    prod = graph.producers()
    while t in prod and prod[t].op in VIEW_OPS and prod[t].domain in ("", "ai.onnx"):
        t = prod[t].inputs[0]
    return t


def quantize_graph(graph: Graph, samples, *, weight_bits: int = 8, activation_bits: int = 8,
                   per_channel: bool = True, pow2_scales: bool = False) -> Graph:
    """Insert quantize/dequantize nodes into a float ``graph`` (in place; also returned).

    ``samples`` is a batch of model inputs, ``(batch, *input_shape)``. Windowed nodes must
    carry ``_geometry`` (:func:`onnx2fpga.frontend.resolve.resolve_geometry`).
    ``pow2_scales``: every scale a power of two (the smallest covering the range), so that
    each requantization is a shift (fixed point, as hls4ml's ``ap_fixed``).
    """
    for what, bits in (("weight_bits", weight_bits), ("activation_bits", activation_bits)):
        if not isinstance(bits, int) or not 2 <= bits <= 16:
            raise OptionError(f"{what} must be an integer from 2 to 16, not {bits!r}")
    if len(graph.inputs) != 1:
        raise UnsupportedError([f"Graph {graph.name!r}: {len(graph.inputs)} inputs; "
                                f"calibration supports one"])
    fold_constants(graph)
    groups = float_groups(graph)
    if not any(g.core is not None and g.core.op in ("MatMul", "Gemm", "Conv")
               for g in groups):
        raise UnsupportedError([f"Graph {graph.name!r}: no MatMul, Gemm or Conv with a "
                                f"constant weight; nothing to quantize for hardware"])
    # The hardware part: groups whose inputs are quantized (the first group's input is).
    first = next(g for g in groups)
    entry = first.inputs(graph)[0]
    quantized = {entry}
    hw, source = [], {}
    for grp in groups:
        srcs = [t if t in quantized else _through_views(graph, t) for t in grp.inputs(graph)]
        if all(t in quantized for t in srcs):
            hw.append(grp)
            source[id(grp)] = srcs[0]          # the boundary its (first) input comes from
            quantized.add(grp.output)
    boundaries = [entry] + [g.output for g in hw]
    ranges = calibrate(graph, samples, boundaries)
    # Max pools, resizes and pads keep their input's quantizer.
    share = {}
    for grp in hw:
        if grp.core is not None and grp.core.op in _SAME_RANGE and not grp.after:
            src = source[id(grp)]
            share[grp.output] = share.get(src, src)
    params = {}
    for t in boundaries:
        params[t] = params[share[t]] if t in share else _act_params(*ranges[t],
                                                                     activation_bits,
                                                                     pow2_scales)
    prod = graph.producers()
    index = {id(n): k for k, n in enumerate(graph.nodes)}
    new_nodes: dict[int, list[Node]] = {}   # insert after node index (-1: at the start)
    for t in boundaries:
        scale, zp, qt = params[t]
        attrs = {"scale": np.asarray(scale, np.float32), "zero_point": np.asarray(zp, np.int64),
                 "qtype": qt, "axis": 1}
        q = Node("QuantizeLinear", [t], [f"{t}__q"], dict(attrs), f"{t}__quant", "", 13, 13)
        dq = Node("DequantizeLinear", [f"{t}__q"], [f"{t}__dq"], dict(attrs), f"{t}__dequant",
                  "", 13, 13)
        for c in graph.consumers().get(t, []):
            c.inputs = [f"{t}__dq" if i == t else i for i in c.inputs]
        if t in graph.outputs:
            graph.outputs = [f"{t}__dq" if o == t else o for o in graph.outputs]
            graph.output_names[f"{t}__dq"] = graph.output_names.pop(t, t)
            graph.tensors[f"{t}__dq"] = graph.tensors[t]
        at = index[id(prod[t])] if t in prod else -1
        new_nodes.setdefault(at, []).extend([q, dq])
        graph.tensors[f"{t}__q"] = _info(qt, graph.tensors[t].shape)
        graph.tensors[f"{t}__dq"] = graph.tensors[t]
    wq = IntType(weight_bits, True)
    for k, grp in enumerate(hw):
        core = grp.core
        if core is None or core.op not in ("MatMul", "Gemm", "Conv"):
            continue
        s_in = float(params[source[id(grp)]][0])
        new = _quantize_weights(graph, grp, k, wq, s_in, per_channel, pow2_scales)
        new_nodes.setdefault(index[id(grp.pad or core)] - 1, []).extend(new)
    out = list(new_nodes.get(-1, []))
    for k, n in enumerate(graph.nodes):
        out.extend(new_nodes.get(k - 1, []) if k > 0 else [])
        out.append(n)
    out.extend(new_nodes.get(len(graph.nodes) - 1, []))
    graph.nodes = _toposorted(out, graph)
    graph.metadata = dict(graph.metadata, quantization={
        "method": "onnx2fpga post-training min-max", "weight_bits": weight_bits,
        "activation_bits": activation_bits, "per_channel": per_channel,
        "pow2_scales": bool(pow2_scales), "calibration_samples": int(len(samples))})
    return graph


def _quantize_weights(graph: Graph, grp: Group, k: int, wq: IntType, s_in: float,
                      per_channel: bool, pow2: bool = False) -> list[Node]:
    """DequantizeLinear of the quantized weight (and bias) of a MatMul / Gemm / Conv."""
    core = grp.core
    qmax = wq.hi
    w = np.asarray(graph.constants[core.inputs[1]], dtype=np.float64)
    if core.op == "Conv":
        axis = 0
    else:
        trans = core.op == "Gemm" and bool(core.attrs.get("transB", 0))
        axis = 0 if trans else 1
    other = tuple(a for a in range(w.ndim) if a != axis)
    absmax = np.abs(w).max(axis=other) if per_channel else np.abs(w).max(keepdims=True)
    absmax = absmax.reshape(-1)
    ws = np.where(absmax > 0, absmax / qmax, 1.0)
    ws = (_pow2_ceil(ws) if pow2 else ws).astype(np.float32)
    shape = [1] * w.ndim
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
    graph.tensors[f"{wname}__dq"] = TensorInfo("float32", tuple(wint.shape))
    alpha = float(core.attrs.get("alpha", 1.0)) if core.op == "Gemm" else 1.0
    acc_scale = alpha * s_in * ws.astype(np.float64)
    new = [wdq]
    core.inputs = [core.inputs[0], f"{wname}__dq"] + core.inputs[2:]
    if core.op in ("Gemm", "Conv") and len(core.inputs) > 2 and core.inputs[2]:
        beta = float(core.attrs.get("beta", 1.0)) if core.op == "Gemm" else 1.0
        new += _quantize_bias(graph, core, 2, acc_scale / beta, k)
    elif core.op == "MatMul" and grp.after and grp.after[0].op == "Add":
        bias = grp.after[0]
        pos = 1 if bias.inputs[1] in graph.constants else 0
        val = np.asarray(graph.constants[bias.inputs[pos]])
        if val.size in (1, acc_scale.size) or val.ndim <= 1:
            new += _quantize_bias(graph, bias, pos, acc_scale, k)
    return new


def _quantize_bias(graph: Graph, node: Node, pos: int, scale: np.ndarray, k: int):
    """An int32 bias on the accumulator's scale, or nothing (the float bias stays and the
    lowering adds it after the accumulator) when a value would not fit int32 (wide weights
    and activations make the accumulator's unit tiny)."""
    b = np.asarray(graph.constants[node.inputs[pos]], dtype=np.float64).reshape(-1)
    scale = np.broadcast_to(np.asarray(scale, np.float64), (max(b.size, scale.size),))
    b = np.broadcast_to(b, scale.shape)
    ratio = np.rint(b / scale)
    if np.abs(ratio).max(initial=0) > 2 ** 31 - 1:
        return []
    q = ratio.astype(np.int32)
    name = f"{node.inputs[pos]}__bq{k}"
    graph.constants[name] = q
    graph.tensors[name] = _info(IntType(32, True), q.shape)
    attrs = {"scale": scale.astype(np.float32), "zero_point": np.zeros(q.shape, np.int64),
             "qtype": IntType(32, True), "axis": 0}
    dq = Node("DequantizeLinear", [name], [f"{name}__dq"], attrs, f"{name}__dequant", "",
              13, 13)
    graph.tensors[f"{name}__dq"] = TensorInfo("float32", tuple(q.shape))
    node.inputs = list(node.inputs)
    node.inputs[pos] = f"{name}__dq"
    return [dq]


def _info(qt: IntType, shape):
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


def quantize_float_inputs(graph: Graph, samples, *, activation_bits: int = 8,
                          pow2_scales: bool = False) -> list[str]:
    """In a model that is already quantized, quantize the float activations that feed a
    MatMul / Gemm / Conv with a quantized weight (QKeras and Brevitas exports leave the
    first layer's input in float: it would stay on the host): a QuantizeLinear +
    DequantizeLinear pair of ``activation_bits`` bits from the calibration ``samples``' range
    (min-max, zero included; with ``pow2_scales`` the scale the smallest power of two
    covering it, as the fixed-point inputs of QKeras and hls4ml), so that the layer runs in
    hardware. Returns the tensors quantized (in place)."""
    if not isinstance(activation_bits, int) or not 2 <= activation_bits <= 16:
        raise OptionError(f"activation_bits must be an integer from 2 to 16, not "
                         f"{activation_bits!r}")
    prod = graph.producers()
    targets = []
    for n in graph.nodes:
        if n.op not in ("MatMul", "Gemm", "Conv") or n.domain not in ("", "ai.onnx") or \
                len(n.inputs) < 2:
            continue
        w = prod.get(n.inputs[1])
        if w is None or w.op != "DequantizeLinear" or w.inputs[0] not in graph.constants:
            continue                                   # a float weight: not a quantized layer
        t = n.inputs[0]
        while t in prod and prod[t].op in VIEW_OPS:
            t = prod[t].inputs[0]
        src = prod.get(t)
        if src is not None and src.op == "DequantizeLinear":
            continue                                   # already quantized
        if t in graph.constants or t in targets:
            continue
        # Only activations computed from the model input by host-runnable float operations.
        if not all(host.supported(m.op, m.domain) for m in _ancestors(graph, t)):
            continue
        targets.append(t)
    if not targets:
        return []
    ranges = calibrate(graph, samples, targets)
    index = {id(n): k for k, n in enumerate(graph.nodes)}
    inserts: dict[int, list[Node]] = {}
    for t in targets:
        scale, zp, qt = _act_params(*ranges[t], activation_bits, pow2_scales)
        attrs = {"scale": np.asarray(scale, np.float32), "zero_point": np.asarray(zp, np.int64),
                 "qtype": qt, "axis": 1}
        q = Node("QuantizeLinear", [t], [f"{t}__q"], dict(attrs), f"{t}__quant", "", 13, 13)
        dq = Node("DequantizeLinear", [f"{t}__q"], [f"{t}__dq"], dict(attrs),
                  f"{t}__dequant", "", 13, 13)
        for c in graph.consumers().get(t, []):
            c.inputs = [f"{t}__dq" if i == t else i for i in c.inputs]
        graph.tensors[f"{t}__q"] = _info(qt, graph.tensors[t].shape)
        graph.tensors[f"{t}__dq"] = graph.tensors[t]
        at = index[id(prod[t])] if t in prod else -1
        inserts.setdefault(at, []).extend([q, dq])
    out = list(inserts.get(-1, []))
    for k, n in enumerate(graph.nodes):
        out.append(n)
        out.extend(inserts.get(k, []))
    graph.nodes = out
    return targets


def _ancestors(graph: Graph, t: str) -> list[Node]:
    prod = graph.producers()
    seen, stack, out = set(), [t], []
    while stack:
        name = stack.pop()
        n = prod.get(name)
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        out.append(n)
        stack.extend(i for i in n.inputs if i and i not in graph.constants)
    return out
