"""Quantize/dequantize nodes in our IR: resolve their parameters into attributes.

After :func:`normalize_qdq`, every ``QuantizeLinear`` / ``DequantizeLinear`` node has a single
input (the data) and the attributes ``scale`` (float32, 0-D or 1-D), ``zero_point`` (int64,
same shape), ``qtype`` (:class:`~onnx2fpga.ir.IntType`) and ``axis``. Scale and zero
point must be constants. Every opset is read (QuantizeLinear / DequantizeLinear 10, 13, 19,
21, 23, 24, 25, 28): per-tensor and per-axis parameters, ``output_dtype`` (the type when there is
no zero point), ``saturate`` (it only concerns float8 outputs, which are refused
by type), ``precision`` (only float32, the arithmetic of the golden model) and blocked
quantization (``block_size``) where it reduces to per-axis: parameters that vary along at
most one axis (a block covering its whole axis). Blocks that split an axis are refused: in
a weight they split the reduction, and a scale that changes inside the sum cannot be
factored out of the accumulator. Float8, float4 and other non-integer types are refused by
name.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from ..ir import IntType
from .ir import Graph, Node, TensorInfo

__all__ = ["normalize_qdq", "qtype_of_dtype", "integer_max_pools", "exact_average_pools",
           "QDQ_OPS"]

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")

# ONNX TensorProto element type numbers for Q/DQ's `output_dtype` attribute (opset 21+).
_ONNX_INT_TYPES = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 21: "uint4",
                   22: "int4", 25: "uint2", 26: "int2"}


def qtype_of_dtype(dtype: str) -> IntType | None:
    """The integer type of a numpy/ONNX dtype name (``int8``, ``uint4``, ...), else None."""
    name = str(dtype)
    for prefix, signed in (("uint", False), ("int", True)):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return IntType(int(name[len(prefix):]), signed)
    return None


def normalize_qdq(graph: Graph) -> None:
    """Fold constant scale / zero-point inputs of every Q/DQ node into attributes (in place).

    Raises UnsupportedError listing every Q/DQ node whose parameters are not constant or
    whose type or block size we cannot handle.
    """
    problems = []
    for node in graph.nodes:
        if node.op not in QDQ_OPS or node.domain not in ("", "ai.onnx"):
            continue
        if "qtype" in node.attrs:
            continue  # already normalized (inserted by our own quantizer)
        where = node.describe()
        try:
            _normalize(node, graph)
        except ValueError as e:
            problems.append(f"{where}: {e}")
    if problems:
        raise UnsupportedError(problems)


def _unblock(scale, zarr, block: int, axis: int, shape) -> tuple[np.ndarray, np.ndarray, int]:
    """Blocked parameters (``block`` elements per scale along ``axis``) as per-tensor or
    per-axis ones, if they vary along at most one axis; else ValueError."""
    if shape is None or any(not isinstance(d, int) for d in shape):
        raise ValueError(f"blocked quantization (block_size={block}) needs the input's shape")
    rank = len(shape)
    if scale.ndim != rank or not -rank <= axis < rank:
        raise ValueError(f"blocked quantization (block_size={block}): scale of shape "
                         f"{list(scale.shape)} does not fit the input shape {list(shape)} "
                         f"along axis {axis}")
    axis %= rank
    full_s = np.repeat(scale, block, axis=axis).take(range(shape[axis]), axis=axis)
    full_z = np.repeat(np.asarray(zarr).astype(np.int64).reshape(scale.shape), block,
                       axis=axis).take(range(shape[axis]), axis=axis)
    if full_s.shape != tuple(shape):
        raise ValueError(f"blocked quantization (block_size={block}): scale of shape "
                         f"{list(scale.shape)} does not fit the input shape {list(shape)}")
    varying = [a for a in range(rank)
               if not (np.all(full_s == full_s.take([0], axis=a)) and
                       np.all(full_z == full_z.take([0], axis=a)))]
    if not varying:
        return full_s.reshape(-1)[:1].reshape(()), full_z.reshape(-1)[:1].reshape(()), 1
    if len(varying) == 1:
        v = varying[0]
        index = tuple(slice(None) if a == v else 0 for a in range(rank))
        return full_s[index], full_z[index], v
    raise ValueError(f"blocked quantization (block_size={block} along axis {axis} of "
                     f"{list(shape)}) with parameters varying along axes {varying} is not "
                     f"supported: blocks that split an axis split a weight's reduction, and "
                     f"a scale that changes inside the sum cannot be factored out of the "
                     f"accumulator (only blocks covering the whole axis, i.e. per-axis "
                     f"quantization)")


def _normalize(node, graph: Graph) -> None:
    ins = node.inputs + [""] * (3 - len(node.inputs))
    x, s, z = ins[:3]
    if s not in graph.constants:
        raise ValueError("scale is not a constant")
    scale = np.asarray(graph.constants[s], dtype=np.float32)
    if z and z not in graph.constants:
        raise ValueError("zero point is not a constant")
    precision = int(node.attrs.get("precision", 0) or 0)
    if precision not in (0, 1):
        raise ValueError(f"precision={precision} is not supported (only float32, 1: the "
                         f"golden model divides in float32)")
    # output_dtype that disagrees with a zero point is refused by shape inference already.
    out_dtype = int(node.attrs.get("output_dtype", 0) or 0)
    if z:
        zarr = graph.constants[z]
        dtype = zarr.dtype.name
    elif node.op == "QuantizeLinear":
        dtype = _ONNX_INT_TYPES.get(out_dtype or 2, f"ONNX type {out_dtype}")
        zarr = np.zeros(scale.shape, dtype=np.int64)
    else:
        info = graph.tensors.get(x)
        dtype = info.dtype if info else "?"
        zarr = np.zeros(scale.shape, dtype=np.int64)
    if node.op == "DequantizeLinear" and x in graph.constants:
        dtype = graph.constants[x].dtype.name
    qtype = qtype_of_dtype(dtype)
    if qtype is None:
        raise ValueError(f"element type {dtype} is not supported (integer types only)")
    axis = int(node.attrs.get("axis", 1))
    block = int(node.attrs.get("block_size", 0) or 0)
    if block < 0:
        raise ValueError(f"block_size={block} must not be negative")
    if block:
        info = graph.tensors.get(x)
        shape = graph.constants[x].shape if x in graph.constants else \
            (info.shape if info else None)
        scale, zarr, axis = _unblock(scale, zarr, block, axis, shape)
    if scale.ndim > 1:
        raise ValueError(f"scale of shape {scale.shape} is not supported (scalar or 1-D)")
    if np.any(~np.isfinite(scale)) or np.any(scale <= 0):
        raise ValueError("scale must be finite and positive")
    zp = np.asarray(zarr).astype(np.int64).reshape(scale.shape)
    node.attrs = {"scale": scale, "zero_point": zp, "qtype": qtype, "axis": axis}
    node.inputs = [x]


#: What may read a max pool that :func:`integer_max_pools` moves: a layer that dequantizes
#: its input (or a view in front of one); a QuantizeLinear or an epilogue after the pool
#: makes the pool part of a group already.
_POOL_READERS = ("MatMul", "Gemm", "Conv", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
                 "Identity", "Transpose")


def integer_max_pools(graph: Graph) -> list[Node]:
    """Move a max pool of a dequantized activation in front of its DequantizeLinear (in
    place): ``DQ(q) -> MaxPool -> y`` becomes ``MaxPool(q) -> DQ -> y``.

    Brevitas writes ``QuantReLU -> MaxPool2d -> QuantConv2d`` so, with no quantizer after
    the pool: the pool of a quantized tensor keeps its grid, and a DequantizeLinear with a
    positive scale (:func:`normalize_qdq` refuses any other) is increasing, so the maximum
    of the dequantized values is the dequantized maximum of the integers, exactly. Taken
    for a MaxPool / GlobalMaxPool (one output, no Indices) of the default domain whose
    readers are all MatMul / Gemm / Conv or views, reading a DequantizeLinear of an
    activation per tensor or per channel (axis 1); the DequantizeLinear stays for its
    other readers.

    Returns
    -------
    list of Node
        The max pools moved.
    """
    prod, cons = graph.producers(), graph.consumers()
    moved, new_nodes, old = [], [], set()
    for n in graph.nodes:
        new_nodes.append(n)
        if n.op not in ("MaxPool", "GlobalMaxPool") or n.domain not in ("", "ai.onnx") or \
                len(n.inputs) != 1 or len([o for o in n.outputs if o]) != 1 or \
                len(n.outputs) != 1:
            continue
        dq = prod.get(n.inputs[0])
        y = n.outputs[0]
        readers = cons.get(y, [])
        if dq is None or dq.op != "DequantizeLinear" or dq.domain not in ("", "ai.onnx") or \
                "qtype" not in dq.attrs or dq.inputs[0] in graph.constants or \
                y in graph.outputs or not readers or \
                any(r.op not in _POOL_READERS or r.inputs[0] != y for r in readers):
            continue
        scale = np.asarray(dq.attrs["scale"])
        if scale.size != 1 and dq.attrs["axis"] not in (1, -3, -4):
            continue
        q, info = dq.inputs[0], graph.tensors.get(y)
        if info is None or graph.tensors.get(q) is None:
            continue
        pooled = f"{y}__int"
        n.inputs, n.outputs = [q], [pooled]
        graph.tensors[pooled] = TensorInfo(graph.tensors[q].dtype, info.shape)
        new_nodes.append(Node("DequantizeLinear", [pooled], [y], dict(dq.attrs),
                              f"{n.name or y}__dequantize", dq.domain, dq.version,
                              dq.opset))
        moved.append(n)
        old.add(id(dq))
    graph.nodes = new_nodes
    if moved:                   # a DequantizeLinear the pools read, left without readers, goes
        readers = graph.consumers()
        graph.nodes = [n for n in graph.nodes if id(n) not in old or
                       n.outputs[0] in readers or n.outputs[0] in graph.outputs]
    return moved


def _whole_map(n: Node, graph: Graph) -> bool:
    """An AveragePool whose one window is the whole unpadded map (as TFLite converters
    write a global average pool)."""
    geo = n.attrs.get("_geometry")
    shape = graph.tensors[n.inputs[0]].shape if n.inputs[0] in graph.tensors else None
    if geo is None or shape is None or any(not isinstance(d, int) for d in shape):
        return False
    spatial = tuple(shape[2:]) if len(shape) == 4 else (1,) + tuple(shape[2:])
    return tuple(geo["kernel"]) == spatial and not any(geo["pads"])


def exact_average_pools(graph: Graph) -> list[Node]:
    """Give a global average pool of a dequantized activation, with no quantizer after it, a
    quantizer that keeps its result exact (in place): ``DQ(q; s, z) -> GlobalAveragePool ->
    y`` becomes ``... -> GlobalAveragePool -> QuantizeLinear(s / N, N * z) ->
    DequantizeLinear -> y`` over ``N`` positions; likewise an AveragePool whose window is
    the whole map.

    Brevitas writes ``QuantReLU -> AdaptiveAvgPool2d(1) -> Flatten -> QuantLinear`` so: the
    mean of ``N`` values on the grid ``s`` lies on the grid ``s / N`` (its integer is the sum
    of the integers), so the quantizer loses nothing and the pool runs in hardware as the
    sum of its window, in a type as wide as that sum needs. Taken where the readers are all
    MatMul / Gemm / Conv or views and the DequantizeLinear is per tensor.

    Returns
    -------
    list of Node
        The pools given a quantizer.
    """
    prod, cons = graph.producers(), graph.consumers()
    done, new_nodes = [], []
    for n in graph.nodes:
        new_nodes.append(n)
        if n.op not in ("GlobalAveragePool", "AveragePool") or \
                n.domain not in ("", "ai.onnx") or len(n.inputs) != 1 or \
                len([o for o in n.outputs if o]) != 1 or \
                (n.op == "AveragePool" and not _whole_map(n, graph)):
            continue
        dq = prod.get(n.inputs[0])
        y = n.outputs[0]
        readers = cons.get(y, [])
        info, in_info = graph.tensors.get(y), graph.tensors.get(n.inputs[0])
        if dq is None or dq.op != "DequantizeLinear" or dq.domain not in ("", "ai.onnx") or \
                "qtype" not in dq.attrs or dq.inputs[0] in graph.constants or \
                np.asarray(dq.attrs["scale"]).size != 1 or "lo" in dq.attrs or \
                y in graph.outputs or not readers or info is None or in_info is None or \
                in_info.shape is None or any(not isinstance(d, int) for d in in_info.shape) \
                or any(r.op not in _POOL_READERS or r.inputs[0] != y for r in readers):
            continue
        count = int(np.prod(in_info.shape[2:]))
        qtype, z = dq.attrs["qtype"], int(np.asarray(dq.attrs["zero_point"]).reshape(()))
        sum_type = IntType.for_range(count * qtype.lo, count * qtype.hi)
        if sum_type.bits > 16:
            continue
        attrs = {"scale": np.asarray(np.float32(np.asarray(dq.attrs["scale"]).reshape(()))
                                     / np.float32(count), np.float32),
                 "zero_point": np.asarray(count * z, np.int64), "qtype": sum_type, "axis": 1}
        mean, total = f"{y}__mean", f"{y}__sum"
        n.outputs = [mean]
        graph.tensors[mean] = TensorInfo(info.dtype, info.shape)
        graph.tensors[total] = TensorInfo(f"{'' if sum_type.signed else 'u'}int"
                                          f"{8 if sum_type.bits <= 8 else 16}", info.shape)
        label = n.name or y
        new_nodes += [Node("QuantizeLinear", [mean], [total], dict(attrs),
                           f"{label}__quantize_sum", "", dq.version, dq.opset),
                      Node("DequantizeLinear", [total], [y], dict(attrs),
                           f"{label}__dequantize_sum", "", dq.version, dq.opset)]
        done.append(n)
    graph.nodes = new_nodes
    return done
