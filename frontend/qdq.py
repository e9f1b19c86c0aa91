"""Quantize/dequantize nodes in our IR: resolve their parameters into attributes.

After :func:`normalize_qdq`, every ``QuantizeLinear`` / ``DequantizeLinear`` node has a single
input (the data) and the attributes ``scale`` (float32, 0-D or 1-D), ``zero_point`` (int64,
same shape), ``qtype`` (:class:`~onnx2fpga.dataflow.IntType`) and ``axis``. Scale and zero
point must be constants; blocked quantization and float8 types are refused by name.
"""

from __future__ import annotations

import numpy as np

from ..dataflow import IntType
from ..errors import UnsupportedError
from .ir import Graph

__all__ = ["normalize_qdq", "qtype_of_dtype", "QDQ_OPS"]

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


def _normalize(node, graph: Graph) -> None:
    ins = node.inputs + [""] * (3 - len(node.inputs))
    x, s, z = ins[:3]
    if s not in graph.constants:
        raise ValueError("scale is not a constant")
    scale = np.asarray(graph.constants[s], dtype=np.float32)
    if z and z not in graph.constants:
        raise ValueError("zero point is not a constant")
    if node.attrs.get("block_size", 0):
        raise ValueError(f"blocked quantization (block_size={node.attrs['block_size']}) is "
                         f"not supported")
    if z:
        zarr = graph.constants[z]
        dtype = zarr.dtype.name
    elif node.op == "QuantizeLinear":
        dtype = _ONNX_INT_TYPES.get(int(node.attrs.get("output_dtype", 2)), "?")
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
    if scale.ndim > 1:
        raise ValueError(f"scale of shape {scale.shape} is not supported (scalar or 1-D)")
    if np.any(~np.isfinite(scale)) or np.any(scale <= 0):
        raise ValueError("scale must be finite and positive")
    zp = np.asarray(zarr).astype(np.int64).reshape(scale.shape)
    node.attrs = {"scale": scale, "zero_point": zp, "qtype": qtype,
                  "axis": int(node.attrs.get("axis", 1))}
    node.inputs = [x]
