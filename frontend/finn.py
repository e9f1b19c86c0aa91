"""Streamlined FINN graphs: MultiThreshold activations on integer-valued float tensors.

FINN's streamlining leaves a graph whose weights are integer-valued float constants (bipolar
or small integers, annotated with FINN data types) and whose activations are quantized by
``MultiThreshold`` nodes (domain ``finn.custom_op.general`` or ``qonnx.custom_op.general``)::

    y = out_bias + out_scale * #{i : x >= thresholds[c, i]}

:func:`normalize_finn` turns that into our QDQ form: every MultiThreshold becomes a
QuantizeLinear that counts thresholds (attributes ``thresholds``, ``base``, ``step``; see
:func:`onnx2fpga.sim.golden.quantize_linear`) followed by a DequantizeLinear, and every
integer-valued float weight of a MatMul / Gemm / Conv that reads such a quantized activation
becomes an integer constant behind a DequantizeLinear of scale 1. The lowering then maps each
MultiThreshold onto a :class:`~onnx2fpga.ir.ThresholdStage` on the accumulator (the
float epilogue between them, a BatchNormalization for example, folded into the thresholds).
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from ..ir import IntType
from .ir import Graph, Node, TensorInfo

__all__ = ["normalize_finn", "FINN_DOMAINS", "finn_type"]

FINN_DOMAINS = ("finn.custom_op.general", "qonnx.custom_op.general")


def finn_type(name: str) -> IntType:
    """Our integer type of a FINN/QONNX data type name: ``BIPOLAR`` (values -1 and +1) as a
    2-bit signed type, ``INTn``, ``UINTn``, ``BINARY``."""
    name = name.decode() if isinstance(name, bytes) else str(name)
    if name == "BIPOLAR":
        return IntType(2, True)
    if name == "BINARY":
        return IntType(1, False)
    for prefix, signed in (("UINT", False), ("INT", True)):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            bits = int(name[len(prefix):])
            if 1 <= bits <= 32:
                return IntType(bits, signed)
    raise ValueError(f"data type {name!r} is not an integer type (supported: BIPOLAR, "
                     f"BINARY, INTn, UINTn)")


def _threshold_q(n: Node, graph: Graph) -> tuple[Node, Node]:
    where = n.describe()
    if len(n.inputs) != 2 or n.inputs[1] not in graph.constants:
        raise UnsupportedError([f"{where}: the thresholds must be a constant"])
    t = np.asarray(graph.constants[n.inputs[1]], dtype=np.float64)
    if t.ndim != 2:
        raise UnsupportedError([f"{where}: thresholds of shape {t.shape}; expected "
                                f"(channels, n)"])
    t = np.sort(t, axis=1)
    a = n.attrs
    if a.get("data_layout", "NCHW") not in ("NCHW", b"NCHW", "NC", b"NC"):
        raise UnsupportedError([f"{where}: data_layout={a['data_layout']!r} is unsupported; "
                                f"only NCHW"])
    try:
        qtype = finn_type(a.get("out_dtype", "INT32"))
    except ValueError as e:
        raise UnsupportedError([f"{where}: out_dtype: {e}"]) from None
    scale, bias = float(a.get("out_scale", 1.0)), float(a.get("out_bias", 0.0))
    if scale != int(scale) or bias != int(bias) or scale == 0:
        raise UnsupportedError([f"{where}: out_scale={scale} and out_bias={bias} must be "
                                f"non-zero integer and integer"])
    base, step = int(bias), int(scale)
    levels = [base, base + step * t.shape[1]]
    if min(levels) < qtype.lo or max(levels) > qtype.hi:
        qtype = IntType.for_range(min(levels), max(levels))
    if qtype == IntType(2, True) and a.get("out_dtype") in ("BIPOLAR", b"BIPOLAR") and \
            {base, base + step * t.shape[1]} != {-1, 1}:
        raise UnsupportedError([f"{where}: a BIPOLAR output with {t.shape[1]} thresholds, "
                                f"out_scale={scale}, out_bias={bias} is not -1/+1"])
    q_out = f"{n.outputs[0]}__mt_q"
    attrs = {"scale": np.asarray(1.0, np.float32), "zero_point": np.asarray(0, np.int64),
             "qtype": qtype, "axis": 1, "thresholds": t.astype(np.float32), "base": base,
             "step": step}
    q = Node("QuantizeLinear", [n.inputs[0]], [q_out], dict(attrs), f"{n.name}__threshold",
             "", 13, 13)
    dq_attrs = {k: attrs[k] for k in ("scale", "zero_point", "qtype", "axis")}
    dq = Node("DequantizeLinear", [q_out], [n.outputs[0]], dq_attrs, f"{n.name}__dequant",
              "", 13, 13)
    info = graph.tensors.get(n.outputs[0])
    graph.tensors[q_out] = TensorInfo(qtype.name, info.shape if info else None)
    return q, dq


def normalize_finn(graph: Graph) -> Graph:
    """See the module docstring (in place; also returned).

    Raises
    ------
    UnsupportedError
        Listing every MultiThreshold whose options we cannot take.
    """
    problems, out = [], []
    found = False
    for n in graph.nodes:
        if n.op == "MultiThreshold" and n.domain in FINN_DOMAINS:
            try:
                out.extend(_threshold_q(n, graph))
                found = True
            except UnsupportedError as e:
                problems.extend(e.problems)
            continue
        out.append(n)
    if problems:
        raise UnsupportedError(problems)
    graph.nodes = out
    if not found:
        return graph
    # Integer-valued float weights read by layers on thresholded activations: integers with a
    # DequantizeLinear of scale 1 (FINN annotates them BIPOLAR, INTn; the values say it too).
    prod = graph.producers()
    new = []
    for n in graph.nodes:
        if n.op in ("MatMul", "Gemm", "Conv") and n.domain in ("", "ai.onnx") and \
                len(n.inputs) > 1 and n.inputs[1] in graph.constants:
            src = prod.get(n.inputs[0])
            w = np.asarray(graph.constants[n.inputs[1]])
            if src is not None and src.op == "DequantizeLinear" and "thresholds" in \
                    (prod.get(src.inputs[0]).attrs if src.inputs[0] in prod else {}) and \
                    np.issubdtype(w.dtype, np.floating) and np.all(w == np.rint(w)):
                wi = w.astype(np.int64)
                wt = IntType.for_range(min(int(wi.min()), 0), max(int(wi.max()), 0))
                name = f"{n.inputs[1]}__int"
                graph.constants[name] = wi
                graph.tensors[name] = TensorInfo("int64", tuple(wi.shape))
                attrs = {"scale": np.asarray(1.0, np.float32),
                         "zero_point": np.asarray(0, np.int64), "qtype": wt, "axis": 1}
                dq = Node("DequantizeLinear", [name], [f"{name}__dq"], attrs,
                          f"{name}__dequant", "", 13, 13)
                graph.tensors[f"{name}__dq"] = graph.tensors.get(n.inputs[1])
                new.append(dq)
                n.inputs = [n.inputs[0], f"{name}__dq"] + list(n.inputs[2:])
        new.append(n)
    graph.nodes = new
    return graph
