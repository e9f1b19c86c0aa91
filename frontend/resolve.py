"""Resolve the geometry of windowed operators once, for every stage after the import.

:func:`resolve_geometry` gives every Conv, ConvInteger, QLinearConv, MaxPool, AveragePool,
GlobalMaxPool, GlobalAveragePool, Resize, Upsample and Pad node (and every ReduceMean,
ReduceMax and ReduceSum, which must reduce the spatial axes: a global pooling, and every Slice
and Split of an activation, which must cut the channel axis) an attribute ``_geometry``
with the exact geometry :mod:`onnx2fpga.frontend.geometry` derives from its ONNX attributes,
shapes and constant inputs (explicit pads as ``(top, left, bottom, right)``, window counts,
index maps). The host interpreter (calibration, the host parts around the accelerator) and
the lowering both read it, so they cannot disagree. Options no stage supports are reported
for all nodes at once, by node, operator and option, before any hardware work.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import UnsupportedError
from ..sim import host
from . import geometry, slices
from .ir import Graph, Node, TensorInfo

__all__ = ["resolve_geometry", "GEOMETRY_OPS"]

GEOMETRY_OPS = ("Conv", "MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool",
                "Resize", "Upsample", "Pad", "ConvInteger", "QLinearConv", "ReduceMean",
                "ReduceMax", "ReduceSum")
# Operators with a weight matrix: an empty weight (a 0 dimension, which a real exporter
# writes for nn.Linear(n, 0)) or an empty output is refused by name.
_MATRIX_OPS = ("MatMul", "Gemm", "Conv", "MatMulInteger", "ConvInteger", "QLinearMatMul",
               "QLinearConv")


def _const(graph: Graph, node: Node, k: int, what: str):
    name = node.inputs[k] if len(node.inputs) > k else ""
    if not name:
        return None
    if name not in graph.constants:
        raise ValueError(f"{what} ({name!r}) must be a constant")
    return np.asarray(graph.constants[name])


def _attrs(node: Node) -> dict:
    return {k: v for k, v in node.attrs.items() if not k.startswith("_")}


def _geometry_of(graph: Graph, node: Node) -> dict:
    op, version = node.op, node.version
    shape = graph.tensors[node.inputs[0]].shape
    if shape is None or any(not isinstance(d, int) for d in shape):
        raise ValueError("the input shape is unknown after shape inference")
    attrs = _attrs(node)
    if op in ("Conv", "ConvInteger", "QLinearConv"):
        wshape = graph.tensors[node.inputs[3 if op == "QLinearConv" else 1]].shape
        g = geometry.conv_geometry(attrs, shape, wshape, version, op=op)
        return {"kernel": g.kernel, "stride": g.stride, "dilation": g.dilation,
                "pads": g.pads, "group": g.group}
    if op in ("MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"):
        outputs = len([o for o in node.outputs if o])
        g = geometry.pool_geometry(op, attrs, shape, version, outputs=outputs)
        out = {"kernel": g.kernel, "stride": g.stride, "dilation": g.dilation,
               "pads": g.pads}
        if g.counts is not None:
            out["counts"] = np.asarray(g.counts, dtype=np.int64)
        return out
    if op in geometry.REDUCE_AXES_INPUT:
        axes = _const(graph, node, 1, "axes") if version >= geometry.REDUCE_AXES_INPUT[op] \
            else None
        g = geometry.reduce_geometry(op, attrs, shape, version, axes=axes)
        out = {"kernel": g.kernel, "stride": g.stride, "dilation": g.dilation, "pads": g.pads}
        if g.counts is not None:
            out["counts"] = np.asarray(g.counts, dtype=np.int64)
        return out
    if op in ("Resize", "Upsample"):
        if op == "Resize" and version >= 11:
            scales, sizes = _const(graph, node, 2, "scales"), _const(graph, node, 3, "sizes")
        elif op == "Upsample" and version < 9:
            scales, sizes = None, None
        else:
            scales, sizes = _const(graph, node, 1, "scales"), None
        rows, cols = geometry.resize_nearest_maps(op, attrs, shape, version, scales=scales,
                                                  sizes=sizes)
        return {"rows": np.asarray(rows, np.int64), "cols": np.asarray(cols, np.int64)}
    if op == "Pad":
        if version >= 11:
            pads = geometry.pad_geometry(attrs, shape, version,
                                         pads=_const(graph, node, 1, "pads"),
                                         axes=_const(graph, node, 3, "axes"))
            value = _const(graph, node, 2, "constant_value")
        else:
            pads = geometry.pad_geometry(attrs, shape, version)
            value = attrs.get("value", 0.0)
        value = 0.0 if value is None or np.size(value) == 0 else \
            float(np.asarray(value).reshape(-1)[0])
        return {"pads": tuple(int(p) for p in pads), "value": value}
    raise AssertionError(op)  # pragma: no cover


def _channel_ranges(graph: Graph, node: Node) -> list[tuple[int, int]]:
    shape = graph.tensors[node.inputs[0]].shape
    if shape is None or any(not isinstance(d, int) for d in shape):
        raise ValueError("the input shape is unknown after shape inference")
    attrs = _attrs(node)
    if node.op == "Slice":
        if node.version < 10:
            return [slices.slice_channels(attrs, shape, node.version)]
        return [slices.slice_channels(attrs, shape, node.version,
                                      **{k: _const(graph, node, i, k) for i, k in
                                         enumerate(("starts", "ends", "axes", "steps"), 1)})]
    split = _const(graph, node, 1, "split") if node.version >= slices.SPLIT_INPUT_VERSION \
        else None
    return slices.split_channels(attrs, shape, node.version, len(node.outputs), split=split)


def _resolve_channel_ops(graph: Graph, problems: list) -> None:
    """Slices and Splits of an activation (a tensor that is not a constant) get their channel
    range as ``_geometry`` (``start``, ``stop``); a Split becomes one single-output Split per
    output (same name, each with its range), so that every later stage sees one output."""
    nodes = []
    for node in graph.nodes:
        if node.op not in ("Slice", "Split") or node.domain not in ("", "ai.onnx") or \
                "_geometry" in node.attrs or not node.inputs or \
                node.inputs[0] in graph.constants:
            nodes.append(node)
            continue
        try:
            ranges = _channel_ranges(graph, node)
        except (ValueError, TypeError) as e:
            msg = re.sub(rf"^{node.op}-\d+: ", "", str(e))
            problems.append(f"{node.describe()}: {msg}")
            nodes.append(node)
            continue
        for out, (start, stop) in zip(node.outputs, ranges):
            if node.op == "Split" and not out:
                continue
            attrs = dict(node.attrs, _geometry={"start": start, "stop": stop})
            nodes.append(Node(node.op, list(node.inputs), [out], attrs, node.name,
                              node.domain, node.version, node.opset))
    graph.nodes = nodes


def _fold_pad_values(graph: Graph) -> None:
    """A Pad's ``constant_value`` that is a constant through a QuantizeLinear and a
    DequantizeLinear (onnxruntime's quantizer writes one for the value of torch's
    ``nn.ZeroPad2d``) becomes the constant it computes: the Pad reads it, and the two nodes
    go where nothing else reads them."""
    prod, cons = graph.producers(), graph.consumers()
    dead = set()
    for pad in graph.nodes:
        if pad.op != "Pad" or pad.domain not in ("", "ai.onnx") or len(pad.inputs) < 3 or \
                not pad.inputs[2] or pad.inputs[2] in graph.constants:
            continue
        chain, t = [], pad.inputs[2]
        while t in prod and prod[t].op in ("QuantizeLinear", "DequantizeLinear") and \
                len(chain) < 2:
            chain.append(prod[t])
            t = prod[t].inputs[0]
        if not chain or t not in graph.constants:
            continue
        chain.reverse()
        try:
            env = host.run_nodes(chain, {}, graph.constants)
        except host.HostOpError:
            continue                    # resolve_geometry names the value as not constant
        value = np.asarray(env[pad.inputs[2]])
        name = f"{pad.inputs[2]}__folded"
        graph.constants[name] = value
        graph.tensors[name] = TensorInfo(value.dtype.name, tuple(value.shape))
        readers = [m for m in cons.get(pad.inputs[2], []) if m is not pad]
        pad.inputs[2] = name
        if not readers and chain[-1].outputs[0] not in graph.outputs:
            dead.add(id(chain[-1]))
            if len(chain) == 2 and len(cons.get(chain[0].outputs[0], [])) == 1 and \
                    chain[0].outputs[0] not in graph.outputs:
                dead.add(id(chain[0]))
    graph.nodes = [n for n in graph.nodes if id(n) not in dead]


def resolve_geometry(graph: Graph) -> Graph:
    """Add ``_geometry`` to every windowed node of ``graph`` (in place; also returned).

    Raises
    ------
    UnsupportedError
        Listing every node whose options no stage supports (for example a Resize in cubic
        mode, a Pad in reflect mode, a 3-D convolution), with the node, operator and option;
        and every MatMul, Gemm or convolution with an empty weight or output (a 0 dimension).
    """
    problems = []
    _fold_pad_values(graph)
    _resolve_channel_ops(graph, problems)
    for node in graph.nodes:
        if node.op in _MATRIX_OPS and node.domain in ("", "ai.onnx"):
            empty = [f"{t!r} {tuple(graph.tensors[t].shape)}" for t in node.inputs + node.outputs
                     if t and t in graph.tensors and graph.tensors[t].shape is not None
                     and 0 in graph.tensors[t].shape]
            if empty:
                problems.append(f"{node.describe()}: empty tensor {', '.join(empty)}; a layer "
                                f"needs at least one weight, input and output")
                continue
        if node.op not in GEOMETRY_OPS or node.domain not in ("", "ai.onnx") or \
                "_geometry" in node.attrs:
            continue
        try:
            node.attrs["_geometry"] = _geometry_of(graph, node)
        except (ValueError, TypeError) as e:
            # geometry's messages start with the operator and version: the node says that.
            msg = re.sub(rf"^{node.op}-\d+: ", "", str(e))
            problems.append(f"{node.describe()}: {msg}")
    if problems:
        raise UnsupportedError(problems)
    return graph
