"""Lower a quantized IR graph (QDQ form) into a :class:`~onnx2fpga.ir.Design`.

The graph is partitioned into three parts:

* **head** (host): everything that computes the first quantized activation from the model
  input, ending with its ``QuantizeLinear``;
* **hardware**: a graph of integer layers. Every activation ``QuantizeLinear`` ends a *group*:
  the float nodes between it and the ``DequantizeLinear`` nodes of earlier quantized
  activations. A group is ``[views] core [epilogue] [views]``: the core is MatMul / Gemm /
  Conv with a quantized constant weight, MaxPool, AveragePool, GlobalAveragePool,
  GlobalMaxPool, Resize / Upsample (nearest), Pad, Add of two activations, Concat, or nothing
  (an elementwise layer); the epilogue is any of constant Add / Sub / Mul / Div,
  BatchNormalization (folded into the requantization), then Relu / Clip / LeakyRelu; views
  (Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Identity) become
  :class:`~onnx2fpga.ir.ViewLayer` layers, which cost nothing in hardware.
* **tail** (host): everything after the hardware part's output (a float Softmax, scaling...).

Float scales become exact integer requantization: ``M = s_in * s_w[c] / s_out`` (times the
epilogue's per-channel factors) is turned into a multiplier of ``multiplier_bits``
significant bits and a common right shift; float biases that are not on the accumulator's
scale become a per-channel offset on the same scale.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import UnsupportedError
from ..ir import (
    AddLayer,
    ConcatLayer,
    ConvLayer,
    Dataflow,
    DenseLayer,
    Design,
    HostNode,
    IntType,
    PadLayer,
    PoolLayer,
    Port,
    RequantLayer,
    RequantStage,
    ResizeLayer,
    ThresholdStage,
    ViewLayer,
)
from ..sim import golden, host
from .ir import Graph, Node, TensorInfo

__all__ = ["lower", "HW_OPS", "MAX_KERNEL", "ADD_MULTIPLIER_BITS"]

VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose")
EPILOGUE_OPS = ("Add", "Sub", "Mul", "Div", "BatchNormalization", "Relu", "Clip",
                "LeakyRelu")
CORE_OPS = ("MatMul", "Gemm", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool",
            "GlobalMaxPool", "Resize", "Upsample", "Pad", "Add", "Concat")
HW_OPS = tuple(sorted(set(VIEW_OPS + EPILOGUE_OPS + CORE_OPS)))
QDQ = ("QuantizeLinear", "DequantizeLinear")
#: The largest kernel extent (height or width) of a convolution or pool in hardware. The
#: window's line buffer holds ``kernel + stride`` rows and a matrix unit ``k * k * C``
#: weights per output channel; beyond 8x8 both grow past what the target devices hold for
#: realistic channel counts.
MAX_KERNEL = 8
#: Significant bits of the two multipliers of an add of activations (see ``_Lowerer.add``).
ADD_MULTIPLIER_BITS = 12
#: Thresholds of a bipolar quantizer that no input reaches (a channel whose multiplier is 0)
#: sit at -+2**THRESHOLD_LIMIT_BITS: always or never.
THRESHOLD_LIMIT_BITS = 40


def _onnx_domain(n: Node) -> bool:
    return n.domain in ("", "ai.onnx")


def _requant_params(scale: np.ndarray, multiplier_bits: int):
    """Multipliers and a common shift with ``m = round(scale * 2**shift)``, the largest
    multiplier magnitude having exactly ``multiplier_bits`` significant bits."""
    scale = np.asarray(scale, dtype=np.float64)
    top = float(np.abs(scale).max()) if scale.size else 0.0
    if top <= 0 or not np.isfinite(top):
        return np.zeros(scale.shape, np.int64), 0
    shift = multiplier_bits - 1 - math.floor(math.log2(top))
    shift = max(0, min(shift, 48))
    m = np.rint(scale * 2.0 ** shift).astype(np.int64)
    if np.abs(m).max() >= (1 << multiplier_bits) and shift > 0:  # rounding made a new bit
        shift -= 1
        m = np.rint(scale * 2.0 ** shift).astype(np.int64)
    return m, shift


def _f32_ratio(num, den) -> np.ndarray:
    """``num / den`` evaluated in float32, as onnxruntime's integer kernels compute their
    requantization scale (``a_scale * b_scale / y_scale``); matching it keeps the golden
    model's rounding decisions equal to onnxruntime's except at float32 product ties."""
    return (np.asarray(num, np.float32) / np.float32(den)).astype(np.float32)


def _compact(a: np.ndarray) -> np.ndarray:
    """One entry if every entry is equal."""
    a = np.asarray(a)
    return a.reshape(-1)[:1] if a.size and np.all(a == a.reshape(-1)[0]) else a


def _logical(shape) -> tuple:
    """The logical shape of a tensor: without its batch dimension (bound to 1)."""
    shape = tuple(int(d) for d in shape)
    return shape[1:] if len(shape) >= 2 and shape[0] == 1 else shape


@dataclass
class _QInfo:
    """An integer activation tensor: its type, scale and zero point."""
    type: IntType
    scale: float
    zero_point: int


@dataclass
class _Group:
    """The float nodes between DequantizeLinear nodes and one QuantizeLinear."""
    quant: Node
    core: Node | None = None
    after: list = field(default_factory=list)        # epilogue nodes, in order
    post: list = field(default_factory=list)         # views after the epilogue
    pre: list = field(default_factory=list)          # per core input: [views / Pad], in order
    dqs: list = field(default_factory=list)          # per core input: its DequantizeLinear

    @property
    def nodes(self) -> list:
        out = [n for chain in self.pre for n in chain]
        out += ([self.core] if self.core is not None else []) + self.after + self.post
        return out + [self.quant]


class _Affine:
    """``y = a * v + b`` per channel, then the activation (clip bounds, LeakyRelu slope), in
    real units; ``a`` and ``b`` broadcast over the channel axis."""

    def __init__(self):
        self.a = np.ones(1)
        self.b = np.zeros(1)
        self.lo = -math.inf
        self.hi = math.inf
        self.alpha = None
        self.activated = False


class _Lowerer:
    def __init__(self, graph: Graph, multiplier_bits: int, rounding: str):
        # Measured on onnxruntime's QDQ MLPs (benchmarks/ort_agreement.py): 16 bits give
        # 99.875 % exact outputs and at most 2 LSB; 24 bits 99.993 % and at most 1 LSB.
        self.g = graph
        self.mbits = multiplier_bits
        self.rounding = rounding
        self.prod = graph.producers()
        self.cons = graph.consumers()
        self.layers: list = []
        self.qinfo: dict[str, _QInfo] = {}
        self.alias: dict[str, str] = {}
        self.count = 0
        self.problems: list[str] = []

    # -- helpers ---------------------------------------------------------------------------
    def shape(self, t) -> tuple:
        info = self.g.tensors.get(t)
        if info is None or info.shape is None or any(not isinstance(d, int)
                                                     for d in info.shape):
            raise UnsupportedError([f"Tensor {t!r}: shape unknown after inference"])
        return tuple(int(d) for d in info.shape)

    def size(self, t) -> int:
        return int(np.prod(self.shape(t), dtype=np.int64))

    def name(self, t) -> str:
        return self.alias.get(t, t)

    def is_const(self, t) -> bool:
        return not t or t in self.g.constants or self.dq_constant(t) is not None

    def dq_constant(self, name):
        """``(int array, scale, zero_point, axis, qtype, node)`` if ``name`` is
        DequantizeLinear of a constant."""
        n = self.prod.get(name)
        if n is None or n.op != "DequantizeLinear" or not _onnx_domain(n) or \
                n.inputs[0] not in self.g.constants:
            return None
        a = n.attrs
        return (np.asarray(self.g.constants[n.inputs[0]]).astype(np.int64), a["scale"],
                a["zero_point"], a["axis"], a["qtype"], n)

    def float_constant(self, name):
        """A constant's float value (a plain initializer or DequantizeLinear of one)."""
        if not name:
            return None, None
        if name in self.g.constants:
            return np.asarray(self.g.constants[name], dtype=np.float64), None
        dq = self.dq_constant(name)
        if dq is not None:
            q, s, z, axis, _, node = dq
            axis = axis if axis >= 0 else axis + max(q.ndim, 1)
            return golden.dequantize_linear(q, s, z, axis if q.ndim > 1 else 0).astype(
                np.float64), node
        return None, None

    def internal(self, t: str, group_nodes) -> bool:
        """``t`` is read only by ``group_nodes`` and is no graph output."""
        ids = {id(n) for n in group_nodes}
        return t not in self.g.outputs and all(id(c) in ids for c in self.cons.get(t, []))

    def next_name(self, kind: str) -> str:
        name = f"{kind}{self.count}"
        self.count += 1
        return name

    # -- matching --------------------------------------------------------------------------
    def activation_input(self, n: Node):
        """The one non-constant input of an epilogue node, or None."""
        acts = [i for i in n.inputs if i and not self.is_const(i)]
        return acts[0] if len(acts) == 1 else None

    def match(self, q: Node) -> _Group | None:
        """The group ending at QuantizeLinear ``q``, or None."""
        grp = _Group(q)
        t = q.inputs[0]
        n = self.prod.get(t)
        members = [q]
        while n is not None and _onnx_domain(n) and n.op in VIEW_OPS and \
                self.activation_input(n) == n.inputs[0]:
            grp.post.insert(0, n)
            members.append(n)
            t = n.inputs[0]
            n = self.prod.get(t)
        while n is not None and _onnx_domain(n) and self.activation_input(n) is not None \
                and (n.op in EPILOGUE_OPS or (n.op in VIEW_OPS and self.channel_view(n))):
            grp.after.insert(0, n)
            members.append(n)
            t = self.activation_input(n)
            n = self.prod.get(t)
        if n is None or not _onnx_domain(n):
            return None
        if n.op == "DequantizeLinear":
            ins = [t]
        elif n.op in CORE_OPS:
            grp.core = n
            members.append(n)
            if n.op in ("Add", "Concat"):
                ins = [i for i in n.inputs if i]
            else:
                ins = [n.inputs[0]]
        else:
            return None
        for t in ins:
            found = self.pre_chain(t, grp.core is not None and grp.core.op == "Conv")
            if found is None:
                return None
            chain, m = found
            members.extend(chain)
            grp.pre.append(chain)
            grp.dqs.append(m)
        for node in members:
            if node is not q and not all(self.internal(o, members) for o in node.outputs):
                return None
        return grp

    def pre_chain(self, t: str, pad_ok: bool):
        """Views (and a Pad in front of a convolution) back from tensor ``t`` to the
        DequantizeLinear of a quantized activation: ``(chain, dq)`` or None."""
        chain = []
        m = self.prod.get(t)
        while m is not None and _onnx_domain(m) and (
                m.op in VIEW_OPS or (m.op == "Pad" and pad_ok)) and \
                self.activation_input(m) == m.inputs[0]:
            chain.insert(0, m)
            t = m.inputs[0]
            m = self.prod.get(t)
        if m is None or m.op != "DequantizeLinear" or not _onnx_domain(m) or \
                m.inputs[0] not in self.qinfo:
            return None
        return chain, m

    # -- building layers -------------------------------------------------------------------
    def epilogue(self, grp: _Group, channel_shape) -> _Affine:
        """The epilogue of ``grp`` as one per-channel affine map and an activation.

        ``channel_shape`` is the core's output shape with the batch: constants must be
        per-channel on axis 1 (or per-tensor)."""
        aff = _Affine()
        t = grp.core.outputs[0] if grp.core is not None else grp.dqs[0].outputs[0]
        for n in grp.after:
            where = n.describe()
            act_first = n.inputs[0] == t
            t = n.outputs[0]
            if n.op in VIEW_OPS:              # keeps every channel's elements in place
                continue
            if n.op in ("Relu", "Clip", "LeakyRelu"):
                if n.op == "Relu":
                    aff.lo = max(aff.lo, 0.0)
                elif n.op == "Clip":
                    lo, hi = self.clip_bounds(n)
                    if lo is None:
                        raise UnsupportedError([f"{where}: bounds must be constant scalars"])
                    aff.lo, aff.hi = max(aff.lo, lo), min(aff.hi, hi)
                else:
                    if aff.activated:
                        raise UnsupportedError([f"{where}: LeakyRelu after another "
                                                f"activation is not supported"])
                    aff.alpha = float(n.attrs.get("alpha", 0.01))
                aff.activated = True
                continue
            if aff.activated:
                raise UnsupportedError([f"{where}: {n.op} after an activation in one "
                                        f"quantized segment is not supported (quantize "
                                        f"between them)"])
            if n.op == "BatchNormalization":
                vals = []
                for i in n.inputs[1:5]:
                    v, _ = self.float_constant(i)
                    if v is None or v.ndim != 1:
                        raise UnsupportedError([f"{where}: operand {i!r} is not a constant "
                                                f"vector"])
                    vals.append(v)
                scale, bias, mean, var = vals
                eps = float(n.attrs.get("epsilon", 1e-5))
                k = scale / np.sqrt(var + eps)
                aff.a, aff.b = aff.a * k, (aff.b - mean) * k + bias
                continue
            other = n.inputs[1] if act_first else n.inputs[0]
            v = self.per_channel(other, channel_shape, where)
            if n.op == "Add":
                aff.b = aff.b + v
            elif n.op == "Sub":
                if act_first:
                    aff.b = aff.b - v
                else:
                    aff.a, aff.b = -aff.a, v - aff.b
            elif n.op == "Mul":
                aff.a, aff.b = aff.a * v, aff.b * v
            elif n.op == "Div":
                if not act_first:
                    raise UnsupportedError([f"{where}: division by an activation is not "
                                            f"supported"])
                aff.a, aff.b = aff.a / v, aff.b / v
        return aff

    def channel_view(self, n: Node) -> bool:
        """A view inside an epilogue that only adds or drops unit axes after the channel
        axis (FINN's Unsqueeze -> BatchNormalization -> Squeeze), so per-channel constants
        keep their meaning."""
        try:
            a, b = self.shape(n.inputs[0]), self.shape(n.outputs[0])
        except UnsupportedError:
            return False
        if n.op == "Transpose" or len(a) < 2 or len(b) < 2 or a[:2] != b[:2]:
            return False
        return [d for d in a[2:] if d != 1] == [d for d in b[2:] if d != 1]

    def per_channel(self, name, channel_shape, where) -> np.ndarray:
        """A constant operand as a per-channel vector (axis 1 of ``channel_shape``)."""
        val, _ = self.float_constant(name)
        if val is None:
            raise UnsupportedError([f"{where}: operand {name!r} is not a constant"])
        shape = tuple(channel_shape)
        try:
            full = np.broadcast_to(val, np.broadcast_shapes(val.shape, shape))
        except ValueError:
            raise UnsupportedError([f"{where}: operand {name!r} of shape {val.shape} does "
                                    f"not broadcast to {shape}"]) from None
        if full.shape != shape:
            raise UnsupportedError([f"{where}: operand {name!r} changes the shape {shape}"])
        axis = 1 if len(shape) > 1 else 0
        if val.size == 1:
            return val.reshape(1)
        moved = np.moveaxis(full, axis, 0).reshape(shape[axis], -1)
        if not np.all(moved == moved[:, :1]):
            raise UnsupportedError([f"{where}: operand {name!r} varies along more than the "
                                    f"channel axis"])
        return moved[:, 0].astype(np.float64)

    def clip_bounds(self, n):
        if n.version < 11:
            return float(n.attrs.get("min", -math.inf)), float(n.attrs.get("max", math.inf))
        vals = []
        for k, default in ((1, -math.inf), (2, math.inf)):
            name = n.inputs[k] if len(n.inputs) > k else ""
            if not name:
                vals.append(default)
                continue
            v, _ = self.float_constant(name)
            if v is None or v.size != 1:
                return None, None
            vals.append(float(v.reshape(())))
        return vals[0], vals[1]

    def out_quant(self, grp: _Group):
        """Type, scale and zero point the requantization rounds onto: the quantizer's, or
        for a QONNX Trunc the grid of its input (the shift follows, see :meth:`stage`)."""
        qa = grp.quant.attrs
        if np.asarray(qa["scale"]).size != 1:
            raise UnsupportedError([f"{grp.quant.describe()}: per-axis activation "
                                    f"quantization is not supported"])
        scale = qa["trunc_scale"] if "trunc_shift" in qa else qa["scale"]
        return (qa["qtype"], float(np.asarray(scale).reshape(())),
                int(np.asarray(qa["zero_point"]).reshape(())))

    def out_info(self, grp: _Group) -> _QInfo:
        """The quantized tensor a group produces."""
        qa = grp.quant.attrs
        return _QInfo(qa["qtype"], float(np.asarray(qa["scale"]).reshape(())),
                      int(np.asarray(qa["zero_point"]).reshape(())))

    def out_rounding(self, grp: _Group) -> str:
        """The requantization's rounding: the quantizer's (QONNX ``rounding_mode``); the
        lowering's default for round half to even."""
        r = grp.quant.attrs.get("rounding", "half_even")
        if r == "half_even":
            return self.rounding
        if r not in golden.SHIFT_ROUNDINGS:
            raise UnsupportedError([f"{grp.quant.describe()}: rounding {r!r} is not supported "
                                    f"by the requantization (supported: "
                                    f"{', '.join(golden.SHIFT_ROUNDINGS)})"])
        return r

    def bounds(self, aff: _Affine, grp: _Group) -> tuple[int, int]:
        """The output clip range: the type's (or the quantizer's narrower ``lo``/``hi``),
        narrowed by the activation's real bounds."""
        qtype, s_out, z_out = self.out_quant(grp)
        lo = int(grp.quant.attrs.get("lo", qtype.lo))
        hi = int(grp.quant.attrs.get("hi", qtype.hi))
        if aff.lo > -math.inf:
            lo = max(lo, int(golden.quantize_linear(np.float32(aff.lo), s_out, z_out, lo, hi)))
        if aff.hi < math.inf:
            hi = min(hi, int(golden.quantize_linear(np.float32(aff.hi), s_out, z_out,
                                                    qtype.lo, hi)))
        return lo, max(hi, lo)

    def stage(self, mult_real, off_real, aff: _Affine, grp: _Group, *, in_zero_point=0,
              value_range=None):
        """The requantization stage ``y = clip(round(v * M + O) + z)`` for real multipliers
        ``mult_real`` and offsets ``off_real`` (already divided by the output scale).

        A quantizer by thresholds (FINN MultiThreshold) gives the :class:`ThresholdStage`
        counting the same thresholds on ``v`` (``value_range``: the integers ``v`` can take,
        see :meth:`threshold_stage`), a bipolar quantizer one with a single threshold (see
        :meth:`bipolar_stage`); a QONNX Trunc a stage that shifts the integer on its input's
        grid right by ``trunc_shift`` bits."""
        qa = grp.quant.attrs
        if "thresholds" in qa:
            return self.threshold_stage(mult_real, off_real, aff, grp, in_zero_point,
                                        value_range)
        if qa.get("bipolar"):
            return self.bipolar_stage(mult_real, off_real, aff, grp, in_zero_point)
        qtype, _, z_out = self.out_quant(grp)
        lo, hi = self.bounds(aff, grp)
        rounding = self.out_rounding(grp)
        m, shift = _requant_params(mult_real, self.mbits)
        off = np.rint(np.asarray(off_real, np.float64) * 2.0 ** shift).astype(np.int64)
        neg_m = neg_off = None
        if aff.alpha is not None:
            neg_m = _compact(np.rint(np.asarray(mult_real) * aff.alpha * 2.0 ** shift)
                             .astype(np.int64))
            neg_off = _compact(np.rint(np.asarray(off_real) * aff.alpha * 2.0 ** shift)
                               .astype(np.int64))
        if "trunc_shift" in qa:
            # QONNX Trunc rounds its input onto the grid of `trunc_scale` (half to even)
            # before dropping bits: exact here only if the input already lies on that grid.
            if aff.activated or neg_m is not None or np.any(m != (1 << shift)) or \
                    np.any(off != 0):
                raise UnsupportedError([f"{grp.quant.describe()}: the input of a Trunc must "
                                        f"lie on the grid of its scale (the same scale as "
                                        f"the quantized input, no offset or activation)"])
            return RequantStage([1], [0], int(qa["trunc_shift"]), z_out, lo, hi, qtype,
                                in_zero_point=in_zero_point, rounding=rounding)
        return RequantStage(_compact(m), _compact(off), shift, z_out, lo, hi, qtype,
                            in_zero_point=in_zero_point, rounding=rounding,
                            neg_multiplier=neg_m, neg_offset=neg_off)

    def threshold_stage(self, mult_real, off_real, aff, grp, in_zero_point, value_range):
        """Thresholds on the integer ``v`` equal to the quantizer's float thresholds ``T`` on
        ``y = M[c] * (v - in_zero_point) + O[c]``: ``y >= T`` where ``v >= ceil((T - O) / M)
        + in_zero_point`` for ``M > 0``, computed in exact rational arithmetic. Channels with
        ``M < 0`` count the other way: all channels must agree (a convolution or dense layer
        negates its channels first, see :meth:`finish_core`)."""
        from fractions import Fraction

        a = grp.quant.attrs
        where = grp.quant.describe()
        if aff.alpha is not None:
            raise UnsupportedError([f"{where}: thresholds after a LeakyRelu are not "
                                    f"supported"])
        t = np.asarray(a["thresholds"], dtype=np.float64)
        base, step = int(a["base"]), int(a["step"])
        m = np.asarray(mult_real, dtype=np.float64).reshape(-1)
        off = np.asarray(off_real, dtype=np.float64).reshape(-1)
        channels = max(m.size, off.size, t.shape[0])
        m, off = np.broadcast_to(m, (channels,)), np.broadcast_to(off, (channels,))
        tt = np.broadcast_to(t, (channels, t.shape[1]))
        lo_v, hi_v = value_range if value_range is not None else (-(1 << 62), 1 << 62)
        never, always = hi_v + 1, lo_v           # thresholds nothing / everything reaches
        signs = {int(np.sign(x)) for x in m if x != 0}
        if len(signs) > 1:
            raise UnsupportedError([f"{where}: thresholds on channels of opposite signs"])
        negative = signs == {-1}
        out = np.empty((channels, t.shape[1]), dtype=np.int64)
        for c in range(channels):
            for i in range(t.shape[1]):
                T = tt[c, i]
                if T <= aff.lo:                   # the activation clips below: reached
                    out[c, i] = always
                    continue
                if T > aff.hi:
                    out[c, i] = never
                    continue
                if m[c] == 0:
                    out[c, i] = always if off[c] >= T else never
                    continue
                bound = (Fraction(float(T)) - Fraction(float(off[c]))) / Fraction(float(m[c]))
                if not negative:                  # v >= bound
                    k = -((-bound.numerator) // bound.denominator)
                else:                             # v <= bound: count v >= floor(bound) + 1
                    k = bound.numerator // bound.denominator + 1
                out[c, i] = min(max(k + in_zero_point, lo_v), hi_v + 1)
        n = t.shape[1]
        if negative:       # y >= T where v < k: count = n - #{v >= k}, thresholds reversed
            out, base, step = out[:, ::-1], base + step * n, -step
        out = np.sort(out, axis=1)
        if np.all(out == out[:1]):
            out = out[:1]
        return ThresholdStage(out, base, step, a["qtype"])

    def bipolar_stage(self, mult_real, off_real, aff: _Affine, grp: _Group,
                      in_zero_point: int) -> ThresholdStage:
        """QONNX BipolarQuant: ``+1`` where the real value ``(x - in_zero_point) * M + O`` is
        non-negative, ``-1`` elsewhere, as one threshold per channel (base -1, step 2).

        A negative ``M`` would need a falling step; dense and convolution layers negate
        such channels' weights first (:meth:`bipolar_flips`), other layers refuse them."""
        where = grp.quant.describe()
        if aff.activated:
            raise UnsupportedError([f"{where}: an activation before a bipolar quantizer is "
                                    f"not supported"])
        m = np.asarray(mult_real, np.float64)
        o = np.asarray(off_real, np.float64)
        if m.ndim > 1 and m.size > 1 or o.ndim > 1 and o.size > 1:
            raise UnsupportedError([f"{where}: per-pixel parameters before a bipolar "
                                    f"quantizer are not supported"])
        m, o = np.broadcast_arrays(m.reshape(-1), o.reshape(-1))
        if np.any(m < 0):
            raise UnsupportedError([f"{where}: a negative scale before a bipolar quantizer "
                                    f"is supported after a MatMul, Gemm or Conv only"])
        limit = 1 << THRESHOLD_LIMIT_BITS
        pos = m > 0
        safe = np.where(pos, m, 1.0)
        t = np.where(pos, np.ceil(-o / safe), 0.0)
        for _ in range(2):   # float64 rounding of -o / m: settle on the exact first integer
            t = np.where(pos & ((t - 1) * m + o >= 0), t - 1, t)
            t = np.where(pos & (t * m + o < 0), t + 1, t)
        t = np.where(pos, np.clip(t, -limit, limit), np.where(o >= 0, -limit, limit))
        thresholds = _compact(t.astype(np.int64) + in_zero_point).reshape(-1, 1)
        return ThresholdStage(thresholds, -1, 2, IntType(2, True))

    def bipolar_flips(self, grp: _Group, acc_scale, aff: _Affine, channels: int):
        """Channels whose accumulator falls as the real value rises (a negative
        BatchNormalization scale, alpha) before a bipolar quantizer: their weights and bias
        are negated so that one rising threshold decides. None if there are none."""
        if grp.quant is None or not (grp.quant.attrs.get("bipolar") or
                                     "thresholds" in grp.quant.attrs):
            return None
        sign = np.broadcast_to(np.asarray(acc_scale, np.float64).reshape(-1), (channels,)) * \
            np.broadcast_to(np.asarray(aff.a, np.float64).reshape(-1), (channels,))
        flip = sign < 0
        return flip if flip.any() else None

    def in_info(self, dq: Node) -> _QInfo:
        return self.qinfo[dq.inputs[0]]

    def views(self, chain, src: str, qi: _QInfo, names: list) -> str:
        """ViewLayers for ``chain`` (views on the integer tensor ``src``); returns the
        tensor after them. A Pad in the chain is returned to the caller via ``self.pad``."""
        self.pad = None
        for n in chain:
            if n.op == "Pad":
                self.pad = n
                continue
            src = self.view(n, src, qi, names)
        return src

    def view(self, n: Node, src: str, qi: _QInfo, names: list) -> str:
        in_shape, out_shape = self.shape(n.inputs[0]), self.shape(n.outputs[0])
        perm = None
        if n.op == "Transpose":
            perm = tuple(int(p) for p in n.attrs.get("perm", range(len(in_shape))[::-1]))
            if perm == tuple(range(len(in_shape))):
                perm = None
        lin, lout = _logical(in_shape), _logical(out_shape)
        if perm is not None and perm[0] == 0 and len(in_shape) >= 2 and in_shape[0] == 1:
            perm = tuple(p - 1 for p in perm[1:])
        elif perm is not None:
            lin = in_shape
        out = n.outputs[0]
        if perm is None and (lin == lout or (len(lin) <= 1 and len(lout) <= 1)):
            self.alias[out] = src                       # a vector stays a vector: wires
        else:
            layer = ViewLayer(self.next_name("view"), qi.type, lin, lout, perm,
                              nodes=[n.name or out], inputs=[src], output=out)
            self.layers.append(layer)
            src = out
        self.qinfo[out] = qi
        names.append(n.name or out)
        return src

    def build(self, grp: _Group) -> None:
        core = grp.core
        names = []
        srcs, infos = [], []
        for chain, dq in zip(grp.pre, grp.dqs):
            qi = self.in_info(dq)
            names.append(dq.name or dq.outputs[0])
            src = self.views(chain, self.name(dq.inputs[0]), qi, names)
            srcs.append(src)
            infos.append(qi)
        pad = self.pad if len(grp.pre) == 1 else None
        out = grp.quant.outputs[0]
        op = core.op if core is not None else None
        if "trunc_shift" in grp.quant.attrs and op not in (None, "AveragePool",
                                                           "GlobalAveragePool"):
            raise UnsupportedError([f"{grp.quant.describe()}: a Trunc after {op} is not "
                                    f"supported (only after an average pool or on its own)"])
        if core is not None and "_geometry" in core.attrs and "kernel" in core.attrs[
                "_geometry"] and op not in ("GlobalAveragePool", "GlobalMaxPool"):
            kh, kw = core.attrs["_geometry"]["kernel"]
            if max(kh, kw) > MAX_KERNEL:
                raise UnsupportedError([f"{core.describe()}: kernel {kh}x{kw} is unsupported; "
                                        f"kernels up to {MAX_KERNEL}x{MAX_KERNEL}"])
        core_shape = self.shape(core.outputs[0]) if core is not None else \
            self.shape(grp.dqs[0].outputs[0])
        aff = self.epilogue(grp, core_shape)
        tail_views = grp.post
        final = out if not tail_views else f"{out}__pre_view"
        nodes = names + [n.name or n.outputs[0] for n in
                         ([core] if core else []) + grp.after]
        if op in ("MatMul", "Gemm"):
            layer = self.dense(grp, srcs[0], infos[0], aff, final)
        elif op == "Conv":
            layer = self.conv(grp, srcs[0], infos[0], aff, final, pad)
        elif op in ("MaxPool", "GlobalMaxPool", "AveragePool", "GlobalAveragePool"):
            layer = self.pool(grp, srcs[0], infos[0], aff, final)
        elif op == "Add":
            layer = self.add(grp, srcs, infos, aff, final)
        elif op == "Concat":
            layer = self.concat(grp, srcs, infos, aff, final)
        elif op in ("Resize", "Upsample"):
            layer = self.resize(grp, srcs[0], infos[0], aff, final)
        elif op == "Pad":
            layer = self.padding(grp, srcs[0], infos[0], aff, final)
        else:
            layer = self.eltwise(grp, srcs[0], infos[0], aff, final)
        if layer is None:
            self.alias[final] = srcs[0]
        else:
            layer.nodes = nodes + [grp.quant.name or out]
            self.layers.append(layer)
        qi = self.out_info(grp)
        self.qinfo[final] = qi
        src = self.name(final)
        for n in tail_views:
            src = self.view(n, src, qi, [])
        if src != out:
            self.alias[out] = src
        self.qinfo[out] = qi

    def _identity(self, qi: _QInfo, grp: _Group, aff: _Affine) -> bool:
        """The group's requantization would change nothing: same type, scale and zero
        point, no affine map and no activation that clips inside the type."""
        qtype, s_out, z_out = self.out_quant(grp)
        if (qtype, np.float32(s_out), z_out) != (qi.type, np.float32(qi.scale), qi.zero_point):
            return False
        if grp.quant.attrs.get("trunc_shift", 0) or grp.quant.attrs.get("bipolar") or \
                "thresholds" in grp.quant.attrs:
            return False    # a shift; int2 values a bipolar output maps; a count
        if np.any(aff.a != 1) or np.any(aff.b != 0) or aff.alpha is not None:
            return False
        lo, hi = self.bounds(aff, grp)
        return lo <= qtype.lo and hi >= qtype.hi

    def dense(self, grp, src, qi, aff, out):
        core = grp.core
        where = core.describe()
        dq = self.dq_constant(core.inputs[1])
        if dq is None:
            raise UnsupportedError([f"{where}: the weight is not a quantized constant "
                                    f"(DequantizeLinear of an initializer)"])
        q, s, z, axis, _, _ = dq
        if q.ndim != 2:
            raise UnsupportedError([f"{where}: weight of rank {q.ndim}; only 2-D weights"])
        alpha, trans = 1.0, False
        if core.op == "Gemm":
            if core.attrs.get("transA", 0):
                raise UnsupportedError([f"{where}: transA=1 is not supported"])
            trans = bool(core.attrs.get("transB", 0))
            alpha = float(core.attrs.get("alpha", 1.0))
        in_shape = _logical(self.shape(core.inputs[0]))
        if len(in_shape) != 1:
            raise UnsupportedError([f"{where}: input of shape {self.shape(core.inputs[0])}; "
                                    f"only a batch of vectors"])
        out_axis = 0 if trans else 1
        w = q.T if not trans else q                     # (out, in)
        axis = axis if axis >= 0 else axis + 2
        s = np.asarray(s, np.float64).reshape(-1)
        zz = np.asarray(z, np.int64).reshape(-1)
        n_out = w.shape[0]
        if s.size == 1:
            s_w, z_w = np.full(n_out, s[0]), np.full(n_out, zz[0])
        elif axis == out_axis and s.size == n_out:
            s_w, z_w = s, zz
        else:
            raise UnsupportedError([f"{where}: weight scales along the reduction axis "
                                    f"cannot be factored out"])
        weight = w - z_w[:, None]
        bias_int, bias_real = self.bias(core, 2 if core.op == "Gemm" else None, n_out,
                                        alpha * qi.scale * s_w,
                                        float(core.attrs.get("beta", 1.0)))
        acc_scale = _f32_ratio(np.float32(alpha) * np.float32(qi.scale) *
                               s_w.astype(np.float32), 1.0).astype(np.float64)
        flip = self.bipolar_flips(grp, acc_scale, aff, n_out)
        if flip is not None:
            weight = np.where(flip[:, None], -weight, weight)
            bias_int = np.where(flip, -bias_int, bias_int)
        layer = DenseLayer(self.next_name("dense"), qi.type, qi.zero_point, weight,
                           _weight_type(weight), bias_int, [], inputs=[src], output=out)
        return self.finish_core(layer, acc_scale, bias_real, aff, grp, n_out, flip)

    def finish_core(self, layer, acc_scale, bias_real, aff, grp, channels, flip=None):
        """The requantization after an accumulator; without a quantizer after the core (a
        model's last layer), the accumulator itself leaves the hardware and ``self.acc``
        keeps its real scale and float bias for the host."""
        if grp.quant is None:
            self.acc = (acc_scale, bias_real)
            return layer
        layer.requant = [self.acc_stage(acc_scale, bias_real, aff, grp, channels, flip,
                                        value_range=(layer.acc_type.lo, layer.acc_type.hi))]
        return layer

    def acc_stage(self, acc_scale, bias_real, aff, grp, channels, flip=None,
                  value_range=None):
        """The stage after an accumulator whose unit is worth ``acc_scale[c]``; ``flip``
        marks channels whose accumulator is negated (see :meth:`bipolar_flips`)."""
        _, s_out, _ = self.out_quant(grp)
        a = np.broadcast_to(aff.a, (channels,))
        mult = _f32_ratio(np.asarray(acc_scale, np.float32) * a.astype(np.float32),
                          s_out).astype(np.float64)
        if flip is not None:
            mult = np.where(flip, -mult, mult)
        off = (a * np.broadcast_to(bias_real, (channels,)) +
               np.broadcast_to(aff.b, (channels,))) / s_out
        return self.stage(mult, off, aff, grp, value_range=value_range)

    def bias(self, core, index, n_out, acc_scale, beta=1.0):
        """An integer bias on the accumulator's scale and the real bias left over."""
        bias_int = np.zeros(n_out, np.int64)
        bias_real = np.zeros(n_out)
        if index is None or len(core.inputs) <= index or not core.inputs[index]:
            return bias_int, bias_real
        name = core.inputs[index]
        dq = self.dq_constant(name)
        if dq is not None and beta == 1.0:
            q, s, z, _, _, _ = dq
            sb = np.broadcast_to(np.asarray(s, np.float64).reshape(-1), (n_out,))
            if np.allclose(sb, acc_scale, rtol=1e-6, atol=0):
                return np.broadcast_to((q - z).reshape(-1), (n_out,)).astype(np.int64), \
                    bias_real
        val, _ = self.float_constant(name)
        if val is None:
            raise UnsupportedError([f"{core.describe()}: bias {name!r} is not a constant"])
        if val.size not in (1, n_out):
            raise UnsupportedError([f"{core.describe()}: bias of shape {val.shape} for "
                                    f"{n_out} outputs"])
        return bias_int, np.broadcast_to(val.reshape(-1) * beta, (n_out,)).copy()

    def conv(self, grp, src, qi, aff, out, pad):
        core = grp.core
        where = core.describe()
        dq = self.dq_constant(core.inputs[1])
        if dq is None:
            raise UnsupportedError([f"{where}: the weight is not a quantized constant "
                                    f"(DequantizeLinear of an initializer)"])
        q, s, z, axis, _, _ = dq
        geo = core.attrs["_geometry"]
        n_out = q.shape[0]
        s = np.asarray(s, np.float64).reshape(-1)
        zz = np.asarray(z, np.int64).reshape(-1)
        axis = axis if axis >= 0 else axis + q.ndim
        if s.size == 1:
            s_w, z_w = np.full(n_out, s[0]), np.full(n_out, zz[0])
        elif axis == 0 and s.size == n_out:
            s_w, z_w = s, zz
        else:
            raise UnsupportedError([f"{where}: weight scales must be per tensor or per "
                                    f"output channel (axis 0)"])
        weight = q - z_w.reshape((-1,) + (1,) * (q.ndim - 1))
        if weight.ndim == 3:
            weight = weight[:, :, None, :]
        pads = tuple(geo["pads"])
        in_shape = _logical(self.shape(core.inputs[0]))
        if pad is not None:
            pgeo = pad.attrs["_geometry"]
            value = float(pgeo["value"])
            if value != 0.0:
                raise UnsupportedError([f"{pad.describe()}: a constant pad of {value} before "
                                        f"a convolution (only zero merges into it)"])
            pads = tuple(a + b for a, b in zip(pads, pgeo["pads"]))
            in_shape = _logical(self.shape(pad.inputs[0]))
        bias_int, bias_real = self.bias(core, 2, n_out, qi.scale * s_w)
        acc_scale = _f32_ratio(np.float32(qi.scale) * s_w.astype(np.float32), 1.0)
        flip = self.bipolar_flips(grp, acc_scale, aff, n_out)
        if flip is not None:
            weight = np.where(flip.reshape((-1,) + (1,) * (weight.ndim - 1)), -weight, weight)
            bias_int = np.where(flip, -bias_int, bias_int)
        layer = ConvLayer(self.next_name("conv"), qi.type, qi.zero_point, in_shape, weight,
                          _weight_type(weight), bias_int, [], stride=tuple(geo["stride"]),
                          dilation=tuple(geo["dilation"]), pads=pads, group=int(geo["group"]),
                          inputs=[src], output=out)
        return self.finish_core(layer, acc_scale.astype(np.float64), bias_real, aff, grp,
                                n_out, flip)

    def pool(self, grp, src, qi, aff, out):
        core = grp.core
        geo = core.attrs["_geometry"]
        in_shape = _logical(self.shape(core.inputs[0]))
        _, s_out, _ = self.out_quant(grp)
        is_max = core.op in ("MaxPool", "GlobalMaxPool")
        common = dict(kernel=tuple(geo["kernel"]), stride=tuple(geo["stride"]),
                      dilation=tuple(geo["dilation"]), pads=tuple(geo["pads"]),
                      inputs=[src], output=out)
        if is_max:
            if np.any(np.asarray(aff.a) <= 0):
                raise UnsupportedError([f"{core.describe()}: a negative scale after a max "
                                        f"pool does not commute with it"])
            requant = [] if self._identity(qi, grp, aff) else [
                self.stage(_f32_ratio(np.float32(qi.scale) * np.asarray(aff.a, np.float32),
                                      s_out), aff.b / s_out, aff, grp,
                           in_zero_point=qi.zero_point)]
            return PoolLayer(self.next_name("pool"), "max", qi.type, in_shape,
                             in_zero_point=qi.zero_point, requant=requant, **common)
        counts = np.asarray(geo["counts"], np.float64)
        c = in_shape[0]
        a = np.broadcast_to(np.asarray(aff.a, np.float64), (c,)).reshape(c, 1, 1)
        mult = _f32_ratio(np.float32(qi.scale) * a.astype(np.float32) /
                          counts.astype(np.float32)[None], s_out).astype(np.float64)
        mult = _compact_axes(mult)
        off = np.broadcast_to(np.asarray(aff.b, np.float64), (c,)) / s_out
        st = self.stage(mult, off, aff, grp)
        return PoolLayer(self.next_name("pool"), "avg", qi.type, in_shape,
                         in_zero_point=qi.zero_point, requant=[st], **common)

    def add(self, grp, srcs, infos, aff, out):
        core = grp.core
        if len(srcs) != 2:
            raise UnsupportedError([f"{core.describe()}: an add of {len(srcs)} inputs"])
        shapes = [_logical(self.shape(i)) for i in core.inputs]
        if shapes[0] != shapes[1]:
            raise UnsupportedError([f"{core.describe()}: broadcasting {shapes[0]} and "
                                    f"{shapes[1]} is not supported; only equal shapes"])
        a = np.asarray(aff.a).reshape(-1)
        if a.size != 1:
            raise UnsupportedError([f"{core.describe()}: a per-channel scale after an add "
                                    f"is not supported"])
        if grp.quant.attrs.get("bipolar") or "trunc_shift" in grp.quant.attrs:
            raise UnsupportedError([f"{grp.quant.describe()}: a bipolar quantizer or a Trunc "
                                    f"after an add of activations is not supported"])
        qtype, s_out, z_out = self.out_quant(grp)
        reals = [float(_f32_ratio(np.float32(qi.scale) * np.float32(a[0]), s_out)[()])
                 for qi in infos]
        # The add core multiplies by constants in logic: 12 significant bits keep each term
        # within 1/16 LSB over an 8-bit input range at a fraction of the 16-24 bit cost.
        ms, shift = _requant_params(np.array(reals), min(self.mbits, ADD_MULTIPLIER_BITS))
        # v = (a - za) * ma + (b - zb) * mb is the output on a scale of 2**shift; the stage
        # adds the offset, rounds, shifts and clips. A LeakyRelu slope rides on the stage's
        # own multiplier as a k-bit fixed-point number.
        k = 0 if aff.alpha is None else 12
        off = np.asarray(aff.b, np.float64).reshape(-1) / s_out * 2.0 ** (shift + k)
        lo, hi = self.bounds(aff, grp)
        neg_m = neg_off = None
        if aff.alpha is not None:
            neg_m = np.array([round(aff.alpha * (1 << k))])
            neg_off = _compact(np.rint(off * aff.alpha).astype(np.int64))
        st = RequantStage(np.array([1 << k]), _compact(np.rint(off).astype(np.int64)),
                          shift + k, z_out, lo, hi, qtype, rounding=self.out_rounding(grp),
                          neg_multiplier=neg_m, neg_offset=neg_off)
        return AddLayer(self.next_name("add"), [qi.type for qi in infos],
                        [qi.zero_point for qi in infos], shapes[0],
                        [int(ms[0]), int(ms[1])], [st], inputs=srcs, output=out)

    def concat(self, grp, srcs, infos, aff, out):
        core = grp.core
        rank = len(self.shape(core.outputs[0]))
        axis = int(core.attrs.get("axis", 1))
        axis = axis + rank if axis < 0 else axis
        shapes = [self.shape(i) for i in core.inputs]
        if axis == 0 or shapes[0][0] != 1:
            raise UnsupportedError([f"{core.describe()}: concatenation along the batch axis "
                                    f"is not supported"])
        qtype, s_out, z_out = self.out_quant(grp)
        stages = []
        for qi in infos:
            if self._identity(qi, grp, aff):
                stages.append([])
            else:
                a = np.asarray(aff.a).reshape(-1)
                if a.size != 1:
                    raise UnsupportedError([f"{core.describe()}: a per-channel scale after "
                                            f"a concatenation is not supported"])
                stages.append([self.stage(_f32_ratio(np.float32(qi.scale) * np.float32(a[0]),
                                                     s_out), np.asarray(aff.b) / s_out, aff,
                                          grp, in_zero_point=qi.zero_point)])
        return ConcatLayer(self.next_name("concat"), [qi.type for qi in infos],
                           [_logical(s) for s in shapes], axis - 1, qtype, stages,
                           inputs=srcs, output=out)

    def resize(self, grp, src, qi, aff, out):
        core = grp.core
        geo = core.attrs["_geometry"]
        _, s_out, _ = self.out_quant(grp)
        requant = [] if self._identity(qi, grp, aff) else [
            self.stage(_f32_ratio(np.float32(qi.scale) * np.asarray(aff.a, np.float32), s_out),
                       np.asarray(aff.b) / s_out, aff, grp, in_zero_point=qi.zero_point)]
        return ResizeLayer(self.next_name("resize"), qi.type,
                           _logical(self.shape(core.inputs[0])), geo["rows"], geo["cols"],
                           requant, inputs=[src], output=out)

    def padding(self, grp, src, qi, aff, out):
        core = grp.core
        geo = core.attrs["_geometry"]
        if not self._identity(qi, grp, aff):
            raise UnsupportedError([f"{core.describe()}: a pad that also requantizes is not "
                                    f"supported (the same scale and zero point before and "
                                    f"after)"])
        value = int(golden.quantize_linear(np.float32(geo["value"]), qi.scale, qi.zero_point,
                                           qi.type.lo, qi.type.hi))
        return PadLayer(self.next_name("pad"), qi.type, _logical(self.shape(core.inputs[0])),
                        tuple(geo["pads"]), value, inputs=[src], output=out)

    def eltwise(self, grp, src, qi, aff, out):
        if self._identity(qi, grp, aff):
            return None
        shape = _logical(self.shape(grp.dqs[0].outputs[0]))
        c = shape[0] if shape else 1
        _, s_out, _ = self.out_quant(grp)
        a = np.asarray(aff.a, np.float64).reshape(-1)
        mult = _f32_ratio(np.float32(qi.scale) * a.astype(np.float32), s_out)
        st = self.stage(mult.astype(np.float64), np.asarray(aff.b).reshape(-1) / s_out, aff,
                        grp, in_zero_point=qi.zero_point, value_range=(qi.type.lo, qi.type.hi))
        params = (st.thresholds[:, 0],) if isinstance(st, ThresholdStage) else \
            (st.multiplier, st.offset)
        for arr in params:
            if arr.size not in (1, c):
                raise UnsupportedError([f"{grp.quant.describe()}: parameters of {arr.size} "
                                        f"entries for {c} channels"])
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        return RequantLayer(self.next_name("eltwise"), qi.type, n, [st], inputs=[src],
                            output=out, shape=shape or (1,))

    # -- integer-domain operators (no DequantizeLinear in front) ---------------------------
    def integer_op(self, n: Node) -> bool:
        """Views and max pooling straight on a quantized tensor keep its parameters."""
        if not _onnx_domain(n) or not n.inputs or n.inputs[0] not in self.qinfo:
            return False
        if any(i and not self.is_const(i) for i in n.inputs[1:]):
            return False
        qi = self.qinfo[n.inputs[0]]
        src = self.name(n.inputs[0])
        if n.op in VIEW_OPS:
            self.view(n, src, qi, [])
            return True
        if n.op in ("MaxPool", "GlobalMaxPool") and "_geometry" in n.attrs and \
                len([o for o in n.outputs if o]) == 1:
            geo = n.attrs["_geometry"]
            layer = PoolLayer(self.next_name("pool"), "max", qi.type,
                              _logical(self.shape(n.inputs[0])), tuple(geo["kernel"]),
                              tuple(geo["stride"]), tuple(geo["dilation"]),
                              tuple(geo["pads"]), qi.zero_point, [],
                              nodes=[n.name or n.outputs[0]], inputs=[src],
                              output=n.outputs[0])
            self.layers.append(layer)
            self.qinfo[n.outputs[0]] = qi
            return True
        return False

    # -- the whole graph -------------------------------------------------------------------
    def run(self) -> Design:
        g = self.g
        if len(g.inputs) != 1 or len(g.outputs) != 1:
            raise UnsupportedError([f"Graph {g.name!r}: {len(g.inputs)} inputs and "
                                    f"{len(g.outputs)} outputs; exactly one of each is "
                                    f"supported"])
        entry = self.integer_entry()
        if entry is None:
            entry = next((n for n in g.nodes if n.op == "QuantizeLinear" and _onnx_domain(n)
                          and n.inputs[0] not in g.constants), None)
        if entry is None:
            raise UnsupportedError([f"Graph {g.name!r}: no quantized activation found; "
                                    f"quantize the model or pass calibration data"])
        qa = entry.attrs
        if np.asarray(qa["scale"]).size != 1:
            raise UnsupportedError([f"{entry.describe()}: per-axis activation quantization "
                                    f"is not supported"])
        head = self.ancestors(entry)
        used = {id(n) for n in head}
        self.qinfo[entry.outputs[0]] = _QInfo(qa["qtype"],
                                              float(np.asarray(qa["scale"]).reshape(())),
                                              int(np.asarray(qa["zero_point"]).reshape(())))
        for n in g.nodes:
            if id(n) in used:
                continue
            if n.op == "QuantizeLinear" and _onnx_domain(n) and \
                    n.inputs[0] not in g.constants:
                grp = self.match(n)
                if grp is None:
                    continue
                try:
                    self.build(grp)
                except UnsupportedError as e:
                    self.problems.extend(e.problems)
                    continue
                used.update(id(m) for m in grp.nodes)
            elif n.op not in QDQ and self.integer_op(n):
                used.add(id(n))
        if self.problems:
            raise UnsupportedError(self.problems)
        self.accumulator_tail(used)
        if not [ly for ly in self.layers if not isinstance(ly, ViewLayer)]:
            raise UnsupportedError(self.unsupported_report(entry.outputs[0]))
        # DequantizeLinear nodes (of activations, weights, biases) read only by hardware
        # layers belong to the hardware.
        for n in g.nodes:
            if n.op == "DequantizeLinear" and _onnx_domain(n) and \
                    (n.inputs[0] in self.qinfo or n.inputs[0] in g.constants) and \
                    id(n) not in used and n.outputs[0] not in g.outputs and \
                    all(id(c) in used for c in self.cons.get(n.outputs[0], [])):
                used.add(id(n))
        tail = [n for n in g.nodes if id(n) not in used]
        hw_out = self.check_tail(tail, entry.outputs[0])
        self.prune(self.name(hw_out))
        return self.design(entry, head, tail, hw_out)

    def accumulator_tail(self, used: set) -> None:
        """A MatMul / Gemm / Conv with a quantized weight on a quantized activation but no
        quantizer after it (a model's last layer: TFC's, a classifier's logits) runs in
        hardware up to its exact integer accumulator; the host dequantizes that per output
        channel (``acc * s_in * s_w[c]``, a DequantizeLinear) and adds a float bias, then
        runs what follows. Taken only when it is the one such node, reading the hardware
        part's last result."""
        g = self.g
        found = []
        for n in g.nodes:
            if id(n) in used or not _onnx_domain(n) or n.op not in ("MatMul", "Gemm", "Conv") \
                    or self.dq_constant(n.inputs[1]) is None:
                continue
            pre = self.pre_chain(n.inputs[0], n.op == "Conv")
            if pre is not None and all(self.internal(o, [n] + pre[0]) for m in pre[0]
                                       for o in m.outputs):
                found.append((n, *pre))
        if len(found) != 1:
            return
        n, chain, dq = found[0]
        readers = [ly for ly in self.layers for t in ly.inputs
                   if t == self.name(dq.inputs[0])]
        if readers:
            return                              # its input also feeds hardware layers
        grp = _Group(quant=None, core=n, pre=[chain], dqs=[dq])
        qi = self.in_info(dq)
        names = [dq.name or dq.outputs[0]]
        try:
            src = self.views(chain, self.name(dq.inputs[0]), qi, names)
            acc_t = f"{n.outputs[0]}__acc"
            self.acc = None
            layer = self.dense(grp, src, qi, _Affine(), acc_t) if n.op != "Conv" else \
                self.conv(grp, src, qi, _Affine(), acc_t, self.pad)
        except UnsupportedError:
            return                              # it stays on the host, in float
        acc_scale, bias_real = self.acc
        layer.nodes = names + [n.name or n.outputs[0]]
        self.layers.append(layer)
        shape = self.shape(n.outputs[0])
        acc_type = layer.acc_type
        g.tensors[acc_t] = TensorInfo(acc_type.name, shape)
        self.qinfo[acc_t] = _QInfo(acc_type, 1.0, 0)
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
        used.update(id(m) for m in [n] + chain)

    def integer_entry(self) -> Node | None:
        """The graph input, if it is already quantized: an integer tensor read only by
        DequantizeLinear nodes with the same per-tensor parameters (the input of a QLinear
        operator, say). Returned as a QuantizeLinear node outside the graph that stands for
        the quantization done before the model; None otherwise."""
        name = self.g.inputs[0]
        info = self.g.tensors.get(name)
        readers = self.cons.get(name, [])
        if info is None or not info.dtype.startswith(("int", "uint")) or not readers or \
                any(r.op != "DequantizeLinear" or not _onnx_domain(r) for r in readers):
            return None
        first = readers[0].attrs
        params = [(np.asarray(r.attrs["scale"]).tolist(), np.asarray(r.attrs["zero_point"])
                   .tolist(), r.attrs["qtype"]) for r in readers]
        if np.asarray(first["scale"]).size != 1 or any(p != params[0] for p in params):
            return None
        return Node("QuantizeLinear", [], [name], dict(first), name, "", 13, 13)

    def design(self, entry, head, tail, hw_out) -> Design:
        g = self.g
        layers = _fuse(self.layers)
        qi_in = self.qinfo[entry.outputs[0]]
        in_port = Port(entry.outputs[0], self.shape(entry.outputs[0]), qi_in.type,
                       qi_in.scale, qi_in.zero_point)
        qi_out = self.qinfo[hw_out]
        out_t = self.name(hw_out)
        out_type = next(ly.out_type for ly in layers if ly.output == out_t) \
            if out_t != entry.outputs[0] else qi_in.type
        out_port = Port(out_t, self.shape(hw_out), out_type, qi_out.scale, qi_out.zero_point)
        if out_t != hw_out:
            # The tail reads the tensor under its ONNX name: the host gives it that name.
            tail = [HostNode("Identity", [out_t], [hw_out], {}, f"{hw_out}__alias")] + \
                [_host(n) for n in tail]
        else:
            tail = [_host(n) for n in tail]
        needed = {i for n in head + tail for i in n.inputs if i in g.constants}
        return Design(
            dataflow=Dataflow(layers, in_port, out_port),
            head=[_host(n) for n in head],
            tail=tail,
            constants={k: np.asarray(g.constants[k]) for k in sorted(needed)},
            inputs=[self.io(g.inputs[0])],
            outputs=[self.io(g.outputs[0])],
            metadata=dict(g.metadata, graph_name=g.name),
        )

    def prune(self, out: str) -> None:
        """Drop layers whose results never reach the output (refuse if any computes)."""
        need, keep = {out}, []
        for layer in reversed(self.layers):
            if layer.output in need:
                keep.append(layer)
                need.update(layer.inputs)
        dead = [ly for ly in self.layers if ly not in keep and not isinstance(ly, ViewLayer)]
        if dead:
            raise UnsupportedError([f"Layer {ly.name!r} (nodes {', '.join(ly.nodes)}): its "
                                    f"result leaves the hardware part other than through its "
                                    f"one output; only one stream leaves the accelerator"
                                    for ly in dead])
        self.layers = list(reversed(keep))

    def io(self, name):
        info = self.g.tensors[name]
        return {"name": name, "dtype": info.dtype, "shape": [int(d) for d in info.shape]}

    def ancestors(self, node: Node) -> list[Node]:
        need, stack = set(), [node]
        while stack:
            n = stack.pop()
            if id(n) in need:
                continue
            need.add(id(n))
            stack.extend(self.prod[i] for i in n.inputs if i in self.prod)
        return [n for n in self.g.nodes if id(n) in need]

    def check_tail(self, tail, entry_t) -> str:
        """The one integer tensor the tail reads from the hardware part."""
        problems = []
        for n in tail:
            if not host.supported(n.op, n.domain):
                problems.append(f"{n.describe()}: not supported on the host and not part of a "
                                f"quantized segment the hardware can run (hardware ops: "
                                f"{', '.join(HW_OPS)} between DequantizeLinear and "
                                f"QuantizeLinear)")
        produced = {o for n in tail for o in n.outputs}
        reads = []
        for n in tail:
            for i in n.inputs:
                if i and i not in produced and i not in self.g.constants and i not in reads:
                    reads.append(i)
        for t in self.g.outputs:
            if t not in produced and t not in reads:
                reads.append(t)
        hw_reads = [t for t in reads if t in self.qinfo]
        other = [t for t in reads if t not in self.qinfo]
        for t in other:
            problems.append(f"Tensor {t!r}: the host part after the accelerator reads it from "
                            f"inside the hardware part; only one stream leaves the "
                            f"accelerator")
        if len(hw_reads) > 1:
            problems.append(f"Tensors {', '.join(map(repr, hw_reads))}: the host part reads "
                            f"{len(hw_reads)} results of the hardware part; only one stream "
                            f"leaves the accelerator")
        if problems:
            raise UnsupportedError(problems)
        if not hw_reads:
            raise UnsupportedError([f"Graph {self.g.name!r}: the hardware part's result is "
                                    f"not used"])
        return hw_reads[0]

    def unsupported_report(self, cur) -> list[str]:
        problems = []
        for n in self.g.nodes:
            if n.op in QDQ or host.supported(n.op, n.domain) and n.op in HW_OPS:
                continue
            problems.append(f"{n.describe()}: not supported in hardware (supported: "
                            f"{', '.join(HW_OPS)} between DequantizeLinear and QuantizeLinear)")
        if not problems:
            problems.append(f"Graph {self.g.name!r}: no layer after tensor {cur!r} maps to "
                            f"hardware (expected DequantizeLinear -> MatMul/Gemm/Conv with a "
                            f"quantized constant weight, a pool, an add... -> QuantizeLinear)")
        return problems


def _compact_axes(a: np.ndarray) -> np.ndarray:
    """Drop the leading channel axis of per-pixel parameters that do not vary along it, and
    reduce parameters equal everywhere to one entry."""
    a = np.asarray(a)
    if a.size and np.all(a == a.reshape(-1)[0]):
        return a.reshape(-1)[:1]
    if a.ndim == 3 and a.shape[0] > 1 and np.all(a == a[:1]):
        return a[:1]
    return a


def _weight_type(weight: np.ndarray) -> IntType:
    wtype = IntType.for_range(min(int(weight.min()), 0), max(int(weight.max()), 0))
    return wtype if wtype.signed else IntType(wtype.bits + 1, True)


def _host(n: Node) -> HostNode:
    return HostNode(n.op, list(n.inputs), list(n.outputs), dict(n.attrs), n.name, n.domain,
                    n.version)


def _fuse(layers):
    """Append an elementwise layer to the layer before it when that layer feeds only it."""
    readers: dict[str, int] = {}
    for layer in layers:
        for t in layer.inputs:
            readers[t] = readers.get(t, 0) + 1
    by_output = {}
    out = []
    for layer in layers:
        if isinstance(layer, RequantLayer) and readers.get(layer.inputs[0]) == 1:
            prev = by_output.get(layer.inputs[0])
            if prev is not None and not isinstance(prev, (ViewLayer, PadLayer)) and \
                    getattr(prev, "requant", None) and prev.out_size == layer.in_size and \
                    not isinstance(prev, ConcatLayer) and \
                    tuple(prev.out_shape) == tuple(layer.shape):
                prev.requant = list(prev.requant) + list(layer.requant)
                prev.nodes = list(prev.nodes) + list(layer.nodes)
                del by_output[prev.output]
                prev.output = layer.output
                by_output[prev.output] = prev
                continue
        out.append(layer)
        by_output[layer.output] = layer
    return out


def absorb_multiplier_signs(layer) -> bool:
    """Make every multiplier of ``layer``'s first requantization non-negative by negating
    the weights and bias of the output channels whose multiplier is negative (in place).

    A channel with a negative multiplier (a batch normalization with a negative scale, a
    quantizer after a negated weight) makes the activation decreasing in that channel's
    accumulator, and a threshold core needs all channels to go the same way
    (:func:`onnx2fpga.hw.threshold.requant_as_thresholds`); without it, a low-bit activation
    falls back to a multiplier per lane. Negating the channel's accumulator and its
    multiplier computes the same value before rounding: with ``x' = -x`` and ``m' = -m``,
    ``(x' - z) * m' + off'`` equals ``(x - z) * m + off`` for ``off' = off - 2 * z * m``
    (likewise on a fused LeakyRelu's negative side, whose selection depends only on that
    value), so the layer's outputs are exactly the same. As FINN's streamlining does, this
    happens only where the negated weights stay within the weight type (a narrow-range
    type such as ``{-1, 0, 1}`` always; else no change).

    Returns True if anything changed.
    """
    if not isinstance(layer, (DenseLayer, ConvLayer)) or not layer.requant:
        return False
    stage = layer.requant[0]
    if not isinstance(stage, RequantStage):
        return False
    channels = layer.out_features if isinstance(layer, DenseLayer) else layer.out_channels
    m = np.asarray(stage.multiplier, np.int64).reshape(-1)
    if m.size != channels or not np.any(m < 0):
        return False
    flip = m < 0
    w = layer.weight.reshape(channels, -1)
    neg_w = -w[flip]
    if neg_w.size and (neg_w.min() < layer.weight_type.lo or neg_w.max() > layer.weight_type.hi):
        return False
    if stage.neg_multiplier is not None and stage.neg_multiplier.size not in (1, channels):
        return False
    sign = np.where(flip, -1, 1)
    z = int(stage.in_zero_point)

    def flipped(mult, off):
        mult = np.broadcast_to(np.asarray(mult, np.int64).reshape(-1), (channels,))
        off = np.broadcast_to(np.asarray(off, np.int64).reshape(-1), (channels,))
        return mult * sign, np.where(flip, off - 2 * z * mult, off)

    mult, off = flipped(stage.multiplier, stage.offset)
    kw = {"multiplier": mult, "offset": off}
    if stage.neg_multiplier is not None:
        kw["neg_multiplier"], kw["neg_offset"] = flipped(stage.neg_multiplier,
                                                         stage.neg_offset)
    layer.requant[0] = dataclasses.replace(stage, **kw)
    layer.weight = (w * sign[:, None]).reshape(layer.weight.shape)
    layer.bias = layer.bias * sign
    return True


def lower(graph: Graph, *, multiplier_bits: int = 16, rounding: str = "half_even") -> Design:
    """Partition and lower a normalized QDQ graph; see the module docstring.

    Convolution, pooling, resize and pad nodes must carry the ``_geometry`` attribute that
    :func:`onnx2fpga.frontend.resolve.resolve_geometry` adds. Negative requantization
    multipliers are absorbed into the weights (:func:`absorb_multiplier_signs`).
    """
    if not isinstance(multiplier_bits, int) or not 2 <= multiplier_bits <= 32:
        raise ValueError(f"multiplier_bits must be an integer from 2 to 32, not "
                         f"{multiplier_bits!r}")
    design = _Lowerer(graph, multiplier_bits, rounding).run()
    for layer in design.dataflow.layers:
        absorb_multiplier_signs(layer)
    return design
