"""Where the hardware part of a QDQ graph starts and ends: host head | hardware | host tail.

* :func:`find_entries`: per model input the first quantized activation, which the **head**
  (host) computes from it, ending with its ``QuantizeLinear``;
* :func:`extend_accumulator_tail`: a last MatMul / Gemm / Conv without a quantizer after it
  runs in hardware up to its integer accumulator;
* :func:`partition`: the hardware part's outputs (the results the host reads: several are
  multiplexed onto the one output stream by :func:`~onnx2fpga.frontend.lower.assemble_design`),
  and the **tail** (host): everything after them (a float Softmax, scaling, an ArgMax and a
  class label lookup...), which computes every graph output; layers whose results reach none
  of them are dropped;
* :func:`host_compute`: the compute operators (Conv, Gemm, MatMul and their integer forms) the
  host would run, each with the reason it is not in hardware: never silently, the lowering
  refuses them unless asked to run them on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedError
from ..ir import ViewLayer
from ..sim import host
from .build import HardwarePart, add_views, conv_layer, dense_layer
from .epilogue import Epilogue, QuantInfo
from .groups import HW_OPS, QDQ, VIEW_OPS, Group, QdqGraph, onnx_domain
from .ir import Node, TensorInfo

__all__ = ["Partition", "find_entry", "find_entries", "extend_accumulator_tail", "partition",
           "host_compute", "COMPUTE_OPS"]

#: The operators that compute (a product with a weight): on the host only when asked to.
COMPUTE_OPS = ("Conv", "Gemm", "MatMul", "ConvInteger", "MatMulInteger", "QLinearConv",
               "QLinearMatMul")


@dataclass
class Partition:
    """The host's share of a graph: the nodes before the hardware part (``head``) and after
    it (``tail``), in graph order, and the ONNX tensors the hardware part outputs (in the
    order the tail reads them)."""
    head: list
    tail: list
    outputs: list

    @property
    def output(self) -> str:
        """The first (usually the one) tensor the hardware part outputs."""
        return self.outputs[0]


def find_entry(qg: QdqGraph) -> Node:
    """The QuantizeLinear of the hardware part's input (a graph of one input); see
    :func:`find_entries`."""
    return find_entries(qg)[0]


def find_entries(qg: QdqGraph) -> list[Node]:
    """The QuantizeLinear of the hardware part's input for each graph input, in the graph's
    input order: the first one of a non-constant tensor (with several inputs: of a tensor
    computed from that input alone), or one standing for a graph input that is already
    quantized (see :func:`_integer_entry`). Several inputs are multiplexed onto the one
    input stream (:func:`~onnx2fpga.frontend.lower.multiplex_inputs`).

    Raises
    ------
    UnsupportedError
        No graph input; an input with no quantized activation; a per-axis quantized input;
        inputs quantized to different integer types.
    """
    g = qg.graph
    if not g.inputs:
        raise UnsupportedError([f"Graph {g.name!r}: no input"])
    deps = {i: {i} for i in g.inputs}
    for n in g.nodes:
        d = set().union(*(deps.get(i, set()) for i in n.inputs))
        for o in n.outputs:
            deps[o] = d
    entries = []
    for name in g.inputs:
        entry = _integer_entry(qg, name)
        if entry is None:
            entry = next((n for n in g.nodes if n.op == "QuantizeLinear" and onnx_domain(n)
                          and n.inputs[0] not in g.constants and
                          (len(g.inputs) == 1 or deps.get(n.inputs[0]) == {name})), None)
        if entry is None:
            what = f"input {name!r}" if len(g.inputs) > 1 else "no quantized activation"
            raise UnsupportedError([f"Graph {g.name!r}: {what} found; quantize the model or "
                                    f"pass calibration data"] if len(g.inputs) == 1 else
                                   [f"Graph {g.name!r}: {what} reaches no quantized "
                                    f"activation of its own (QuantizeLinear); each of "
                                    f"several inputs must be quantized to enter the "
                                    f"hardware part"])
        if np.asarray(entry.attrs["scale"]).size != 1:
            raise UnsupportedError([f"{entry.describe()}: per-axis activation quantization "
                                    f"is not supported"])
        entries.append(entry)
    types = {e.attrs["qtype"] for e in entries}
    if len(types) > 1:
        kinds = ", ".join(e.attrs["qtype"].name for e in entries)
        raise UnsupportedError([f"Graph {g.name!r}: inputs {', '.join(map(repr, g.inputs))} "
                                f"are quantized to {kinds}; several inputs share one input "
                                f"stream and must have one integer type"])
    return entries


def _integer_entry(qg: QdqGraph, name: str) -> Node | None:
    """The graph input, if it is already quantized: an integer tensor read only by
    DequantizeLinear nodes with the same per-tensor parameters (the input of a QLinear
    operator, say). Returned as a QuantizeLinear node outside the graph that stands for
    the quantization done before the model; None otherwise."""
    info = qg.graph.tensors.get(name)
    readers = qg.cons.get(name, [])
    if info is None or not info.dtype.startswith(("int", "uint")) or not readers or \
            any(r.op != "DequantizeLinear" or not onnx_domain(r) for r in readers):
        return None
    first = readers[0].attrs
    params = [(np.asarray(r.attrs["scale"]).tolist(), np.asarray(r.attrs["zero_point"])
               .tolist(), r.attrs["qtype"]) for r in readers]
    if np.asarray(first["scale"]).size != 1 or any(p != params[0] for p in params):
        return None
    return Node("QuantizeLinear", [], [name], dict(first), name, "", 13, 13)


def extend_accumulator_tail(hw: HardwarePart, head: list) -> None:
    """A MatMul / Gemm / Conv with a quantized weight on a quantized activation but no
    quantizer after it (a model's last layer: TFC's, a classifier's logits) runs in
    hardware up to its exact integer accumulator; the host dequantizes that per output
    channel (``acc * s_in * s_w[c]``, a DequantizeLinear) and adds a float bias, then
    runs what follows. Taken only when it is the one such node, reading the hardware
    part's last result.

    In place: the layer joins ``hw``, and the graph gets the host's DequantizeLinear (and
    bias Add) after the node. Nothing changes if there is no such node or its layer cannot
    be built (it stays on the host, in float).
    """
    qg = hw.graph
    g = qg.graph
    used = {id(n) for n in head} | hw.used
    found = []
    for n in g.nodes:
        if id(n) in used or not onnx_domain(n) or n.op not in ("MatMul", "Gemm", "Conv") \
                or qg.dq_constant(n.inputs[1]) is None:
            continue
        pre = qg.pre_chain(n.inputs[0], n.op == "Conv", hw.qinfo)
        if pre is not None and all(qg.internal(o, [n] + pre[0]) for m in pre[0]
                                   for o in m.outputs):
            found.append((n, *pre))
    if len(found) != 1:
        return
    n, chain, dq = found[0]
    readers = [ly for ly in hw.layers for t in ly.inputs
               if t == hw.name(dq.inputs[0])]
    if readers:
        return                              # its input also feeds hardware layers
    grp = Group(quant=None, core=n, pre=[chain], dqs=[dq])
    qi = hw.qinfo[dq.inputs[0]]
    names = [dq.name or dq.outputs[0]]
    try:
        src = add_views(hw, chain, hw.name(dq.inputs[0]), qi, names)
        acc_t = f"{n.outputs[0]}__acc"
        hw.accumulator = None
        layer = dense_layer(hw, grp, src, qi, Epilogue(), acc_t) if n.op != "Conv" else \
            conv_layer(hw, grp, src, qi, Epilogue(), acc_t)
    except UnsupportedError:
        return                              # it stays on the host, in float
    acc_scale, bias_real = hw.accumulator
    layer.nodes = names + [n.name or n.outputs[0]]
    hw.layers.append(layer)
    shape = qg.shape(n.outputs[0])
    acc_type = layer.acc_type
    g.tensors[acc_t] = TensorInfo(acc_type.name, shape)
    hw.qinfo[acc_t] = QuantInfo(acc_type, 1.0, 0)
    out = n.outputs[0]
    has_bias = bool(np.any(bias_real))
    deq_out = f"{out}__unbiased" if has_bias else out
    attrs = {"scale": np.asarray(acc_scale, np.float32).reshape(-1),
             "zero_point": np.zeros(len(acc_scale), np.int64), "qtype": acc_type,
             "axis": 1}
    new = [Node("DequantizeLinear", [acc_t], [deq_out], attrs,
                f"{n.name or out}__dequantize_accumulator", "", 13, 13)]
    if has_bias:
        bias = np.asarray(bias_real, np.float32).reshape(
            (-1,) + (1,) * (len(shape) - 2))
        g.constants[f"{out}__bias"] = bias
        new.append(Node("Add", [deq_out, f"{out}__bias"], [out], {},
                        f"{n.name or out}__bias", "", 14, 14))
    k = g.nodes.index(n)
    g.nodes[k + 1:k + 1] = new
    for m in new:           # the partition asks who reads the host's DequantizeLinear
        for t in m.inputs:
            qg.cons.setdefault(t, []).append(m)
        for t in m.outputs:
            qg.prod[t] = m
    hw.used.update(id(m) for m in [n] + chain)


def partition(hw: HardwarePart, entry: Node, head: list) -> Partition:
    """Split off the host's tail and find the hardware part's outputs.

    DequantizeLinear nodes (of activations, weights, biases) read only by hardware layers
    join the hardware part; every other node after the head is the tail's. Layers whose
    results do not reach the output are dropped from ``hw`` (in place).

    Raises
    ------
    UnsupportedError
        No layer that computes; a tail node the host cannot run; the tail reading a tensor
        from inside the hardware part that is not an integer result; a layer whose result
        leaves the hardware part other than through the outputs.
    """
    g = hw.graph.graph
    if not [ly for ly in hw.layers if not isinstance(ly, ViewLayer)]:
        raise UnsupportedError(_unsupported_report(g, entry.outputs[0]))
    used = {id(n) for n in head} | hw.used
    for n in g.nodes:
        if n.op == "DequantizeLinear" and onnx_domain(n) and \
                (n.inputs[0] in hw.qinfo or n.inputs[0] in g.constants) and \
                id(n) not in used and n.outputs[0] not in g.outputs and \
                all(id(c) in used for c in hw.graph.cons.get(n.outputs[0], [])):
            used.add(id(n))
            hw.used.add(id(n))
    tail = [n for n in g.nodes if id(n) not in used]
    hw_outs = _check_tail(hw, tail)
    _prune(hw, {hw.name(t) for t in hw_outs})
    return Partition(head, tail, hw_outs)


def host_compute(hw: HardwarePart, part: Partition) -> list[str]:
    """One line per compute operator (:data:`COMPUTE_OPS`) in the host's head or tail: the
    node, where it is, and why it is not in hardware."""
    qg = hw.graph
    lines = []
    for where, nodes in (("head", part.head), ("tail", part.tail)):
        for n in nodes:
            if n.op in COMPUTE_OPS and onnx_domain(n):
                lines.append(f"{n.describe()}: a compute operator on the host ({where}), in "
                             f"float: {_host_reason(qg, hw, n, where)}")
    return lines


def _host_reason(qg: QdqGraph, hw: HardwarePart, n: Node, where: str) -> str:
    if id(n) in hw.host_reasons:
        return hw.host_reasons[id(n)]
    if where == "head":
        return ("it reads the model's float input before the first quantized activation "
                "(quantize its input: calibration data quantizes the float inputs of a "
                "quantized model)")
    if n.op not in ("MatMul", "Gemm", "Conv"):
        return (f"{n.op} is not lowered to hardware (supported: MatMul, Gemm, Conv between "
                f"DequantizeLinear and QuantizeLinear)")
    m = qg.prod.get(n.inputs[0])
    while m is not None and onnx_domain(m) and (m.op in QDQ or m.op in VIEW_OPS) and \
            m.inputs and m.inputs[0] not in hw.qinfo:
        m = qg.prod.get(m.inputs[0])
    if m is not None and id(m) in hw.host_reasons:
        return f"its input comes from {m.describe()}, which does not run in hardware: " + \
            hw.host_reasons[id(m)]
    if m is not None and m.op not in QDQ and m.op not in VIEW_OPS and \
            id(m) not in hw.used:
        return (f"its input comes from {m.describe()}, which does not run in hardware (the "
                f"hardware runs {', '.join(HW_OPS)} between DequantizeLinear and "
                f"QuantizeLinear)")
    if len(n.inputs) < 2 or not qg.is_const(n.inputs[1]):
        return "its weight is not a constant"
    if qg.dq_constant(n.inputs[1]) is None:
        return "its weight is not quantized (no DequantizeLinear of an integer constant)"
    return ("its result has no quantizer after it and it is not the hardware part's last "
            "layer (only the last layer may end in its accumulator)")


def _check_tail(hw: HardwarePart, tail) -> list[str]:
    """The integer tensors the tail reads from the hardware part, in the order it reads them."""
    g = hw.graph.graph
    problems = []
    for n in tail:
        if not host.supported(n.op, n.domain):
            problems.append(f"{n.describe()}: not supported on the host and not part of a "
                            f"quantized segment the hardware can run (hardware ops: "
                            f"{', '.join(HW_OPS)} between DequantizeLinear and "
                            f"QuantizeLinear)")
    produced = {o for n in tail for o in n.outputs}
    reads = {}                          # ordered, and a set for the membership tests
    for n in tail:
        for i in n.inputs:
            if i and i not in produced and i not in g.constants:
                reads.setdefault(i)
    for t in g.outputs:
        if t not in produced:
            reads.setdefault(t)
    hw_reads = [t for t in reads if t in hw.qinfo]
    other = [t for t in reads if t not in hw.qinfo]
    for t in other:
        if t in g.inputs:
            problems.append(f"Tensor {t!r}: the graph input is read after the accelerator "
                            f"(a graph output or a tail node); only the accelerator's one "
                            f"output stream reaches the host part after it")
            continue
        problems.append(f"Tensor {t!r}: the host part after the accelerator reads it from "
                        f"inside the hardware part; only one stream leaves the "
                        f"accelerator")
    if problems:
        raise UnsupportedError(problems)
    if not hw_reads:
        raise UnsupportedError([f"Graph {g.name!r}: the hardware part's result is "
                                f"not used"])
    return hw_reads


def _prune(hw: HardwarePart, outs: set) -> None:
    """Drop layers whose results never reach an output (refuse if any computes)."""
    need, keep = set(outs), []
    for layer in reversed(hw.layers):
        if layer.output in need:
            keep.append(layer)
            need.update(layer.inputs)
    kept = {id(ly) for ly in keep}      # by identity: `in keep` compared dataclasses, O(n^2)
    dead = [ly for ly in hw.layers if id(ly) not in kept and not isinstance(ly, ViewLayer)]
    if dead:
        raise UnsupportedError([f"Layer {ly.name!r} (nodes {', '.join(ly.nodes)}): its "
                                f"result leaves the hardware part other than through its "
                                f"outputs (a result the host reads)"
                                for ly in dead])
    hw.layers = list(reversed(keep))


def _unsupported_report(g, cur) -> list[str]:
    problems = []
    for n in g.nodes:
        if n.op in QDQ or host.supported(n.op, n.domain) and n.op in HW_OPS:
            continue
        problems.append(f"{n.describe()}: not supported in hardware (supported: "
                        f"{', '.join(HW_OPS)} between DequantizeLinear and QuantizeLinear)")
    if not problems:
        problems.append(f"Graph {g.name!r}: no layer after tensor {cur!r} maps to "
                        f"hardware (expected DequantizeLinear -> MatMul/Gemm/Conv with a "
                        f"quantized constant weight, a pool, an add... -> QuantizeLinear)")
    return problems
