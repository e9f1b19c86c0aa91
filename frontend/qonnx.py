"""QONNX quantizers and the QCDQ pattern, normalized into our IR's QDQ form.

:func:`normalize_qonnx` runs after :func:`~onnx2fpga.frontend.qdq.normalize_qdq` and turns
every QONNX quantizer (``Quant``/``IntQuant``, ``BipolarQuant``, ``Trunc`` under any of the
domains in :data:`~onnx2fpga.frontend.load.QONNX_DOMAINS`) into normalized
``QuantizeLinear`` / ``DequantizeLinear`` nodes (attributes ``scale``, ``zero_point``,
``qtype``, ``axis``; see :mod:`onnx2fpga.frontend.qdq`), so that the lowering compiles QONNX
models like onnxruntime's QDQ models. Semantics follow the QONNX operator definitions
(``docs/qonnx-custom-ops`` of the QONNX repository, version 1.0):

* ``Quant(x, scale, zeropt, bitwidth; signed, narrow, rounding_mode)``:
  ``q = clip(round(x / scale + zeropt), min, max)``, ``y = (q - zeropt) * scale`` with
  ``[min, max]`` the ``bitwidth``-bit signed or unsigned range, one less at the bottom
  (signed) or the top (unsigned) when ``narrow``; a 1-bit signed Quant is bipolar. On a
  constant it is evaluated into an integer constant read by a ``DequantizeLinear``; on an
  activation it becomes ``QuantizeLinear`` (with ``lo``/``hi`` for a narrow range and
  ``rounding`` for a mode other than ``ROUND``) followed by ``DequantizeLinear``.
* ``BipolarQuant(x, scale)``: ``+scale`` where ``x >= 0``, ``-scale`` elsewhere; integer
  values in {-1, +1} (``int2``), the activation form a ``QuantizeLinear`` with ``bipolar``.
* ``Trunc`` (opset 1: ``x, scale, zeropt, in_bits, out_bits``; opset 2 adds ``out_scale``
  before ``out_bits`` and the attributes ``signed``/``narrow``): the integer
  ``t = round_half_even(x / scale)`` loses its ``k`` low bits with ``rounding_mode``
  (``FLOOR`` by default); ``k = in_bits - out_bits`` (opset 1) or
  ``round(log2(out_scale / scale))`` (opset 2, whose result is clipped to the ``out_bits``
  range). The result is worth ``scale`` (opset 1) or ``out_scale`` (opset 2) per step. It
  becomes a ``QuantizeLinear`` with ``trunc_shift`` = k and ``trunc_scale`` = scale
  (:func:`onnx2fpga.sim.golden.trunc`), then a ``DequantizeLinear``.

QCDQ (``QuantizeLinear -> Clip -> DequantizeLinear`` with constant integer bounds, as
QONNX's ``QuantToQCDQ`` writes it): the Clip becomes the quantizer's ``lo``/``hi`` and its
type the narrowest one holding them; a ``QuantizeLinear`` of a constant is evaluated into an
integer constant. A ``DequantizeLinear`` of a constant followed by views (a transposed or
reshaped weight) becomes a ``DequantizeLinear`` of the viewed constant, its axis moved.

Refused by name: parameters that are not constants, bit widths that are not integers from 1
to 16, non-integer zero points, scales that vary along more than one axis, the rounding modes
``UP`` and ``HALF_DOWN``, and a non-zero zero point with a sign-dependent rounding
(``HALF_UP``, ``DOWN``) on an activation: QONNX rounds ``x / scale + zeropt``, ONNX's
QuantizeLinear (and so the requantization) ``x / scale``. The two agree for ``FLOOR`` and
``CEIL``, and for ``ROUND`` except at exact ties with an odd zero point (constants are
evaluated with QONNX's formula, so they are exact).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import UnsupportedError
from ..ir import IntType
from ..sim import golden, host
from .ir import Graph, Node, TensorInfo
from .load import QONNX_DOMAINS, QONNX_OPS
from .quantize import fold_constants

__all__ = ["normalize_qonnx", "fold_qcdq", "fold_constant_views", "ROUNDING_MODES",
           "MAX_BITS"]

#: QONNX ``rounding_mode`` names and the rounding of :func:`onnx2fpga.sim.golden.round_float`
#: they are (QONNX's ``HALF_UP`` rounds ties away from zero, ``DOWN`` towards zero).
ROUNDING_MODES = {"ROUND": "half_even", "HALF_EVEN": "half_even", "HALF_UP": "half_away",
                  "FLOOR": "floor", "CEIL": "ceil", "DOWN": "to_zero"}
#: The widest integer a QONNX quantizer may produce (the hardware's limit for activations and
#: weights, see DESIGN.md "Numerics").
MAX_BITS = 16
_VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose")


def _container(qtype: IntType) -> str:
    """The numpy dtype an integer tensor of ``qtype`` is kept in."""
    bits = 8 if qtype.bits <= 8 else 16 if qtype.bits <= 16 else 32
    return f"{'' if qtype.signed else 'u'}int{bits}"


def _fresh(graph: Graph, base: str) -> str:
    name, k = base, 0
    while name in graph.tensors or name in graph.constants:
        k += 1
        name = f"{base}{k}"
    return name


def _version(graph: Graph) -> tuple[int, int]:
    opset = int(graph.opsets.get("", 13))
    return (13 if opset >= 13 else 10), opset


def _constant(graph: Graph, node: Node, k: int, what: str) -> np.ndarray:
    name = node.inputs[k] if len(node.inputs) > k else ""
    if not name:
        raise ValueError(f"{what} is missing")
    if name not in graph.constants:
        raise ValueError(f"{what} {name!r} is not a constant")
    return np.asarray(graph.constants[name])


def _bits(graph: Graph, node: Node, k: int, what: str) -> int:
    b = _constant(graph, node, k, what).astype(np.float64)
    if b.size != 1 or not np.isfinite(b).all() or b.reshape(()) != np.round(b.reshape(())):
        raise ValueError(f"{what} {b.reshape(-1).tolist()} is not an integer")
    return int(b.reshape(()))


def _scale_zero_point(graph: Graph, node: Node, data_rank: int, zp_index: int | None):
    """Scale (float32, 0-D or 1-D), zero point (int64, same shape) and axis from the
    broadcast shapes of the scale and zero point against the data."""
    scale = _constant(graph, node, 1, "scale").astype(np.float32)
    zp = np.zeros((), np.float64) if zp_index is None else \
        _constant(graph, node, zp_index, "zero point").astype(np.float64)
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise ValueError(f"scale must be finite and positive, not {scale.reshape(-1)[:4]}")
    if not np.all(np.isfinite(zp)) or np.any(zp != np.round(zp)):
        raise ValueError(f"zero point {zp.reshape(-1)[:4].tolist()} is not an integer")
    try:
        full = np.broadcast_shapes(scale.shape, zp.shape)
    except ValueError:
        raise ValueError(f"scale of shape {list(scale.shape)} and zero point of shape "
                         f"{list(zp.shape)} do not broadcast") from None
    if len(full) > data_rank:
        raise ValueError(f"scale of shape {list(scale.shape)} has more axes than the data "
                         f"({data_rank})")
    varying = [a for a, d in enumerate(full) if d != 1]
    if len(varying) > 1:
        raise ValueError(f"scale or zero point of shape {list(full)} varies along more than "
                         f"one axis")
    sb = np.broadcast_to(scale, full).reshape(-1)
    zb = np.broadcast_to(zp, full).reshape(-1).astype(np.int64)
    if not varying:
        return sb.reshape(()).copy(), zb.reshape(()).copy(), 1
    return sb.copy(), zb.copy(), data_rank - len(full) + varying[0]


def _data_rank(graph: Graph, name: str) -> int:
    if name in graph.constants:
        return np.ndim(graph.constants[name])
    info = graph.tensors.get(name)
    if info is None or info.shape is None:
        raise ValueError(f"the shape of {name!r} is unknown")
    return len(info.shape)


def _rounding(node: Node) -> str:
    mode = str(node.attrs.get("rounding_mode", "FLOOR" if node.op == "Trunc" else "ROUND"))
    rounding = ROUNDING_MODES.get(mode.upper())
    if rounding is None:
        raise ValueError(f"rounding_mode {mode!r} is not supported (supported: "
                         f"{', '.join(ROUNDING_MODES)})")
    return rounding


def _evaluate(x, scale, zp, axis, lo, hi, rounding, bipolar) -> np.ndarray:
    """QONNX's integer of a constant: ``clip(round(x / scale + zeropt), lo, hi)`` in float32
    (bipolar: the sign of ``x / scale + zeropt``), the zero point inside the rounding."""
    scale, zp = np.asarray(scale, np.float32), np.asarray(zp, np.float32)
    if scale.ndim == 1:
        shape = [1] * x.ndim
        shape[axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    y = (x / scale + zp).astype(np.float32)
    if bipolar:
        return np.where(y >= 0, 1, -1).astype(np.int64)
    return np.clip(golden.round_float(y, rounding), lo, hi).astype(np.int64)


def _int_range(bits: int, signed: bool, narrow: bool) -> tuple[int, int]:
    """QONNX's integer range of a ``bits``-bit quantizer."""
    if signed:
        return -(1 << (bits - 1)) + int(narrow), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1 - int(narrow)


class _Converter:
    def __init__(self, graph: Graph):
        self.g = graph
        self.version, self.opset = _version(graph)

    def dq(self, src: str, out: str, scale, zp, qtype: IntType, axis: int, name: str) -> Node:
        return Node("DequantizeLinear", [src], [out],
                    {"scale": scale, "zero_point": zp, "qtype": qtype, "axis": axis},
                    name, "", self.version, self.opset)

    def quantizer(self, node: Node, scale, zp, qtype: IntType, axis: int, lo: int, hi: int,
                  rounding: str, bipolar: bool = False, extra: dict | None = None,
                  dq_scale=None) -> list[Node]:
        """The QDQ nodes replacing ``node``: a constant evaluated, or Q then DQ."""
        g = self.g
        x, out = node.inputs[0], node.outputs[0]
        attrs = {"scale": scale, "zero_point": zp, "qtype": qtype, "axis": axis}
        if (lo, hi) != (qtype.lo, qtype.hi):
            attrs.update(lo=lo, hi=hi)
        if rounding != "half_even":
            attrs["rounding"] = rounding
        if bipolar:
            attrs["bipolar"] = True
        attrs.update(extra or {})
        dq_scale = scale if dq_scale is None else dq_scale
        if x in g.constants and not extra:
            q = _evaluate(np.asarray(g.constants[x], np.float32), scale, zp, axis, lo, hi,
                          rounding, bipolar).astype(_container(qtype))
            cname = _fresh(g, f"{out}__int")
            g.constants[cname] = q
            g.tensors[cname] = TensorInfo(q.dtype.name, tuple(q.shape))
            return [self.dq(cname, out, dq_scale, zp, qtype, axis, node.name)]
        qname = _fresh(g, f"{out}__int")
        info = g.tensors.get(x)
        g.tensors[qname] = TensorInfo(_container(qtype), info.shape if info else None)
        q = Node("QuantizeLinear", [x], [qname], attrs, node.name, "", self.version,
                 self.opset)
        return [q, self.dq(qname, out, dq_scale, zp, qtype, axis,
                           f"{node.name}__dq" if node.name else "")]

    def convert(self, node: Node) -> list[Node]:
        if len(node.outputs) != 1:
            raise ValueError(f"{len(node.outputs)} outputs; one is expected")
        if not node.inputs or not node.inputs[0]:
            raise ValueError("the data input is missing")
        rank = _data_rank(self.g, node.inputs[0])
        if node.op in ("Quant", "IntQuant"):
            return self.quant(node, rank)
        if node.op == "BipolarQuant":
            scale, zp, axis = _scale_zero_point(self.g, node, rank, None)
            return self.quantizer(node, scale, zp, IntType(2, True), axis, -1, 1, "half_even",
                                  bipolar=True)
        return self.trunc(node, rank)

    def quant(self, node: Node, rank: int) -> list[Node]:
        if len(node.inputs) != 4:
            raise ValueError(f"{len(node.inputs)} inputs; Quant takes x, scale, zeropt and "
                             f"bitwidth")
        scale, zp, axis = _scale_zero_point(self.g, node, rank, 2)
        bits = _bits(self.g, node, 3, "bit width")
        # A constant (a bias: Brevitas' Int32Bias, on the accumulator's grid) may take up to
        # 32 bits, as onnxruntime's int32 biases do: it is folded into the layer, never a
        # stream.
        widest = 32 if node.inputs[0] in self.g.constants else MAX_BITS
        if not 1 <= bits <= widest:
            raise ValueError(f"bit width {bits} is not supported (integers 1 to {MAX_BITS}; "
                             f"up to 32 for a constant)")
        signed = bool(node.attrs.get("signed", 1))
        narrow = bool(node.attrs.get("narrow", 0))
        rounding = _rounding(node)
        if bits == 1 and signed:
            # QONNX: a 1-bit signed Quant is bipolar, +1 where x / scale + zeropt >= 0.
            if np.any(zp != 0):
                raise ValueError("a 1-bit signed (bipolar) Quant with a non-zero zero point "
                                 "is not supported")
            return self.quantizer(node, scale, zp, IntType(2, True), axis, -1, 1,
                                  "half_even", bipolar=True)
        if np.any(zp != 0) and rounding in ("half_away", "to_zero"):
            raise ValueError(f"rounding_mode {node.attrs.get('rounding_mode')!r} with a "
                             f"non-zero zero point is not supported (the rounding would see "
                             f"the zero point)")
        lo, hi = _int_range(bits, signed, narrow)
        qtype = IntType(bits, signed)
        if np.any(zp < qtype.lo) or np.any(zp > qtype.hi):
            qtype = IntType.for_range(min(lo, int(zp.min())), max(hi, int(zp.max())))
        return self.quantizer(node, scale, zp, qtype, axis, lo, hi, rounding)

    def trunc(self, node: Node, rank: int) -> list[Node]:
        if len(node.inputs) not in (5, 6):
            raise ValueError(f"{len(node.inputs)} inputs; Trunc takes x, scale, zeropt, "
                             f"in_bitwidth, [out_scale,] out_bitwidth")
        scale, zp, _ = _scale_zero_point(self.g, node, rank, 2)
        if scale.size != 1:
            raise ValueError("a per-channel scale is not supported (per tensor only)")
        if np.any(zp != 0):
            raise ValueError(f"zero point {zp.reshape(-1)[:4].tolist()} is not supported "
                             f"(Trunc with zero point 0 only)")
        in_bits = _bits(self.g, node, 3, "input bit width")
        out_bits = _bits(self.g, node, len(node.inputs) - 1, "output bit width")
        if not 1 <= out_bits <= MAX_BITS:
            raise ValueError(f"output bit width {out_bits} is not supported (integers 1 to "
                             f"{MAX_BITS})")
        rounding = _rounding(node)
        if len(node.inputs) == 5:
            # Opset 1: the input's k low bits go, nothing is clipped, the step stays `scale`.
            shift = in_bits - out_bits
            out_scale = scale
            qtype = IntType(out_bits + 2, True)     # |t| < 2**in_bits gives |y| <= 2**out_bits
            lo, hi = qtype.lo, qtype.hi
        else:
            out_scale = _constant(self.g, node, 4, "output scale").astype(np.float32)
            if out_scale.size != 1 or not np.isfinite(out_scale).all() or \
                    float(out_scale.reshape(())) <= 0:
                raise ValueError(f"output scale {out_scale.reshape(-1)[:4].tolist()} is not "
                                 f"one positive number")
            out_scale = out_scale.reshape(())
            shift = int(np.round(np.log2(float(out_scale) / float(scale))))
            signed = bool(node.attrs.get("signed", 1))
            narrow = bool(node.attrs.get("narrow", 0))
            lo, hi = _int_range(out_bits, signed, narrow)
            qtype = IntType(out_bits, signed)
        if shift < 0:
            raise ValueError(f"a truncation by {shift} bits (an output finer than the input) "
                             f"is not supported")
        extra = {"trunc_shift": shift, "trunc_scale": np.float32(scale),
                 "qonnx_op": "Trunc"}
        return self.quantizer(node, np.asarray(out_scale, np.float32), zp, qtype, 1, lo, hi,
                              rounding, extra=extra)


def normalize_qonnx(graph: Graph) -> Graph:
    """Turn QONNX quantizers into normalized QDQ nodes, fold QCDQ Clips and evaluate
    quantizers of constants (in place; also returned). See the module docstring.

    Raises
    ------
    UnsupportedError
        Listing every QONNX quantizer that cannot be expressed, by node.
    """
    _fold_static_shapes(graph)
    conv = _Converter(graph)
    problems, nodes = [], []
    for node in graph.nodes:
        if node.domain in QONNX_DOMAINS and node.op in QONNX_OPS:
            try:
                nodes.extend(conv.convert(node))
            except ValueError as e:
                problems.append(f"{node.describe()}: {e}")
        else:
            nodes.append(node)
    if problems:
        raise UnsupportedError(problems)
    graph.nodes = nodes
    fold_qcdq(graph)
    fold_constant_views(graph)
    return graph


def _normalized_q(n: Node | None) -> bool:
    return n is not None and n.op == "QuantizeLinear" and n.domain in ("", "ai.onnx") and \
        "qtype" in n.attrs


def _clip_bounds(graph: Graph, clip: Node):
    """Constant scalar bounds of a Clip (attributes before opset 11), else None."""
    if clip.version and clip.version < 11:
        return float(clip.attrs.get("min", -math.inf)), float(clip.attrs.get("max", math.inf))
    out = []
    for k, default in ((1, -math.inf), (2, math.inf)):
        name = clip.inputs[k] if len(clip.inputs) > k else ""
        if not name:
            out.append(default)
        elif name in graph.constants and np.asarray(graph.constants[name]).size == 1:
            out.append(float(np.asarray(graph.constants[name]).reshape(())))
        else:
            return None
    return tuple(out)


def fold_qcdq(graph: Graph) -> Graph:
    """QCDQ: fold a Clip on the integer output of a normalized QuantizeLinear into its
    ``lo``/``hi`` (narrowing ``qtype`` to the Clip's range), then evaluate every
    QuantizeLinear of a constant into an integer constant (in place; also returned). A Clip
    of an integer constant (Brevitas 0.13 writes a weight so: int8 initializer -> Clip ->
    DequantizeLinear) becomes a constant here, so that :func:`fold_constant_views` sees the
    weight's DequantizeLinear read a constant (a bias-free QuantLinear's Transpose)."""
    for clip in graph.nodes:
        if clip.op == "Clip" and clip.domain in ("", "ai.onnx") and \
                clip.inputs[0] in graph.constants and \
                np.asarray(graph.constants[clip.inputs[0]]).dtype.kind in "iu" and \
                clip.outputs[0] not in graph.outputs and _clip_bounds(graph, clip) is not None:
            value = np.asarray(graph.constants[clip.inputs[0]])
            lo, hi = _clip_bounds(graph, clip)
            graph.constants[clip.outputs[0]] = np.clip(value, lo, hi).astype(value.dtype)
            graph.tensors[clip.outputs[0]] = TensorInfo(value.dtype.name, tuple(value.shape))
    graph.nodes = [n for n in graph.nodes if not (n.op == "Clip" and
                                                  n.outputs[0] in graph.constants)]
    prod, cons = graph.producers(), graph.consumers()
    drop, problems = set(), []
    for clip in graph.nodes:
        if clip.op != "Clip" or clip.domain not in ("", "ai.onnx"):
            continue
        q = prod.get(clip.inputs[0])
        if not _normalized_q(q) or len(cons.get(q.outputs[0], [])) != 1 or \
                q.outputs[0] in graph.outputs:
            continue
        bounds = _clip_bounds(graph, clip)
        if bounds is None:
            continue
        qa = q.attrs
        lo = max(int(qa.get("lo", qa["qtype"].lo)), math.ceil(bounds[0]))
        hi = min(int(qa.get("hi", qa["qtype"].hi)), math.floor(bounds[1]))
        if lo > hi:
            problems.append(f"{clip.describe()}: clip range [{bounds[0]}, {bounds[1]}] leaves "
                            f"no value of {q.describe()}")
            continue
        zp = np.asarray(qa["zero_point"])
        qtype = IntType.for_range(min(lo, int(zp.min())), max(hi, int(zp.max())))
        qa["qtype"] = qtype
        qa.pop("lo", None)
        qa.pop("hi", None)
        if (lo, hi) != (qtype.lo, qtype.hi):
            qa.update(lo=lo, hi=hi)
        q.outputs = list(clip.outputs)
        info = graph.tensors.get(clip.outputs[0])
        graph.tensors[clip.outputs[0]] = TensorInfo(_container(qtype) if qtype.bits <= 16 else
                                                    "int32", info.shape if info else None)
        for d in cons.get(clip.outputs[0], []):
            if d.op == "DequantizeLinear" and "qtype" in d.attrs:
                d.attrs["qtype"] = qtype
        drop.add(id(clip))
    if problems:
        raise UnsupportedError(problems)
    graph.nodes = [n for n in graph.nodes if id(n) not in drop]
    keep = []
    for q in graph.nodes:
        if _normalized_q(q) and q.inputs[0] in graph.constants and \
                q.outputs[0] not in graph.outputs:
            value = np.asarray(graph.constants[q.inputs[0]], np.float32)
            qtype = q.attrs["qtype"]
            arr = host.quantize_linear(value, **q.attrs)
            arr = arr.astype(_container(qtype) if qtype.bits <= 16 else "int32")
            graph.constants[q.outputs[0]] = arr
            graph.tensors[q.outputs[0]] = TensorInfo(arr.dtype.name, tuple(arr.shape))
            continue
        keep.append(q)
    graph.nodes = keep
    return graph


def _moved_axis(view, shape, axis: int, channels: int) -> int | None:
    """Where axis ``axis`` (of ``channels`` entries) of an array of ``shape`` ends up after
    ``view``; None if the view merges or splits it."""
    marker = np.broadcast_to(np.arange(channels).reshape(
        [channels if a == axis else 1 for a in range(len(shape))]), shape)
    moved = view(marker)
    for a, d in enumerate(moved.shape):
        if d == channels:
            want = np.broadcast_to(np.arange(channels).reshape(
                [channels if b == a else 1 for b in range(moved.ndim)]), moved.shape)
            if np.array_equal(moved, want):
                return a
    return None


def fold_constant_views(graph: Graph) -> Graph:
    """A view (Transpose, Reshape, ...) of ``DequantizeLinear(constant)`` becomes a
    ``DequantizeLinear`` of the viewed constant, its per-axis parameters following their axis
    (in place; also returned). Views that merge or split that axis are left alone."""
    prod = graph.producers()
    out = []
    for n in graph.nodes:
        d = prod.get(n.inputs[0]) if n.inputs else None
        if n.op in _VIEW_OPS and n.domain in ("", "ai.onnx") and len(n.outputs) == 1 and \
                d is not None and d.op == "DequantizeLinear" and "qtype" in d.attrs and \
                d.inputs[0] in graph.constants and \
                all(not i or i in graph.constants for i in n.inputs[1:]):
            args = [graph.constants[i] if i else None for i in n.inputs[1:]]
            while args and args[-1] is None:
                args.pop()

            def view(a, n=n, args=args):
                return np.asarray(host.HOST_OPS[n.op](a, *args, version=n.version or 13,
                                                      **n.attrs))
            q = np.asarray(graph.constants[d.inputs[0]])
            scale = np.asarray(d.attrs["scale"])
            axis = int(d.attrs["axis"])
            if scale.size > 1:
                axis = _moved_axis(view, q.shape, axis % q.ndim, scale.size)
                if axis is None:
                    out.append(n)
                    continue
            try:
                value = view(q)
            except (ValueError, TypeError, IndexError):
                out.append(n)
                continue
            cname = _fresh(graph, f"{n.outputs[0]}__int")
            graph.constants[cname] = value
            graph.tensors[cname] = TensorInfo(value.dtype.name, tuple(value.shape))
            new = Node("DequantizeLinear", [cname], list(n.outputs),
                       dict(d.attrs, axis=axis), n.name, "", d.version, d.opset)
            prod[n.outputs[0]] = new
            out.append(new)
            continue
        out.append(n)
    cons: dict[str, int] = {}
    for n in out:
        for i in n.inputs:
            cons[i] = cons.get(i, 0) + 1
    graph.nodes = [n for n in out if not (
        n.op == "DequantizeLinear" and n.inputs[0] in graph.constants and
        not cons.get(n.outputs[0]) and n.outputs[0] not in graph.outputs)]
    return graph


def _fold_static_shapes(graph: Graph) -> None:
    """``Shape`` of a tensor whose shape is known, and ``Gather`` and the host's operators on
    the constants that follow (the ``x.view(x.size(0), -1)`` of PyTorch exports such as the
    FINN TFC models), become constants."""
    folded = False
    keep = []
    for n in graph.nodes:
        ins = [i for i in n.inputs if i]
        if n.domain not in ("", "ai.onnx") or len(n.outputs) != 1 or \
                n.outputs[0] in graph.outputs:
            keep.append(n)
            continue
        value = None
        if n.op == "Shape" and ins:
            info = graph.tensors.get(ins[0])
            if info is not None and info.shape is not None and \
                    all(isinstance(d, int) for d in info.shape):
                dims = np.asarray(info.shape, np.int64)
                start, end = n.attrs.get("start", 0), n.attrs.get("end", None)
                value = dims[start:end]
        elif n.op == "Gather" and len(ins) == 2 and all(i in graph.constants for i in ins):
            value = np.take(graph.constants[ins[0]], graph.constants[ins[1]],
                            axis=int(n.attrs.get("axis", 0)))
        if value is None:
            keep.append(n)
            continue
        value = np.asarray(value)
        graph.constants[n.outputs[0]] = value
        graph.tensors[n.outputs[0]] = TensorInfo(value.dtype.name, tuple(value.shape))
        folded = True
    graph.nodes = keep
    if folded:
        fold_constants(graph)
