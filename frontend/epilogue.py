"""A group's epilogue and quantizer as an integer requantization stage.

:func:`match_epilogue` turns a group's epilogue (constant Add / Sub / Mul / Div,
BatchNormalization, Relu / Clip / LeakyRelu) into one per-channel affine map and an activation
(:class:`Epilogue`); :func:`requant_stage` turns real multipliers and offsets, that map and the
group's quantizer into the stage a layer ends with: a :class:`~onnx2fpga.ir.RequantStage`
(``y = clip(round(v * M + O) + z)``, ``M`` an integer of ``multiplier_bits`` significant bits
and a common right shift) or, for a quantizer by thresholds or a bipolar one, a
:class:`~onnx2fpga.ir.ThresholdStage`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from ..errors import UnsupportedError
from ..ir import IntType, RequantStage, ThresholdStage
from ..sim import golden
from .groups import VIEW_OPS, Group, QdqGraph

__all__ = ["Epilogue", "QuantInfo", "RequantOptions", "match_epilogue", "requant_stage",
           "acc_stage", "bipolar_flips", "is_identity", "out_quant", "out_info",
           "out_rounding", "output_bounds", "requant_params", "f32_ratio", "compact",
           "compact_axes", "float32_params", "float32_stage", "integer_bias",
           "THRESHOLD_LIMIT_BITS"]

#: Thresholds of a bipolar quantizer that no input reaches (a channel whose multiplier is 0)
#: sit at -+2**THRESHOLD_LIMIT_BITS: always or never.
THRESHOLD_LIMIT_BITS = 40


@dataclass
class QuantInfo:
    """An integer activation tensor: its type, scale and zero point."""
    type: IntType
    scale: float
    zero_point: int


@dataclass(frozen=True)
class RequantOptions:
    """How requantization stages are built: ``multiplier_bits`` significant bits of a
    multiplier, the rounding of a round-half-to-even quantizer, and the requantization
    after an accumulator (one of :data:`onnx2fpga.ir.REQUANT_MODES`)."""
    multiplier_bits: int
    rounding: str
    requant: str = "exact"


@dataclass
class Epilogue:
    """``y = a * v + b`` per channel, then the activation (clip bounds ``lo``/``hi``, the
    LeakyRelu slope ``alpha``), in real units; ``a`` and ``b`` broadcast over the channel
    axis. ``activated``: an activation was seen."""
    a: np.ndarray = field(default_factory=lambda: np.ones(1))
    b: np.ndarray = field(default_factory=lambda: np.zeros(1))
    lo: float = -math.inf
    hi: float = math.inf
    alpha: float | None = None
    activated: bool = False


def requant_params(scale: np.ndarray, multiplier_bits: int):
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


def float32_params(scale) -> tuple[np.ndarray, int]:
    """Integer multipliers and one common shift with ``m / 2**shift`` exactly the float32
    ``scale`` in every channel: each mantissa (24 bits) shifted left by the difference of
    its exponent from the smallest one, common trailing zeros dropped (a stage whose
    ``rounding`` is ``"float32"``)."""
    shape = np.shape(scale)
    s = np.asarray(scale, np.float32).astype(np.float64).reshape(-1)
    frac, exp = np.frexp(s)                       # s = frac * 2**exp, 0.5 <= |frac| < 1
    mant = np.rint(frac * (1 << 24)).astype(np.int64)
    own = 24 - exp.astype(np.int64)               # s = mant / 2**own
    live = mant != 0
    if not live.any():
        return np.zeros(shape, np.int64), 0
    shift = int(own[live].max())
    m = np.where(live, mant << np.maximum(shift - own, 0), 0).astype(np.int64)
    if shift < 0:
        m, shift = m << -shift, 0
    while shift > 0 and np.all(m % 2 == 0):
        m, shift = m // 2, shift - 1
    return m.reshape(shape), shift


def f32_ratio(num, den) -> np.ndarray:
    """``num / den`` evaluated in float32, as onnxruntime's integer kernels compute their
    requantization scale (``a_scale * b_scale / y_scale``); matching it keeps the golden
    model's rounding decisions equal to onnxruntime's except at float32 product ties."""
    return (np.asarray(num, np.float32) / np.float32(den)).astype(np.float32)


def compact(a: np.ndarray) -> np.ndarray:
    """One entry if every entry is equal."""
    a = np.asarray(a)
    return a.reshape(-1)[:1] if a.size and np.all(a == a.reshape(-1)[0]) else a


def compact_axes(a: np.ndarray) -> np.ndarray:
    """Drop the leading channel axis of per-pixel parameters that do not vary along it, and
    reduce parameters equal everywhere to one entry."""
    a = np.asarray(a)
    if a.size and np.all(a == a.reshape(-1)[0]):
        return a.reshape(-1)[:1]
    if a.ndim == 3 and a.shape[0] > 1 and np.all(a == a[:1]):
        return a[:1]
    return a


# -- the epilogue ---------------------------------------------------------------------------

def match_epilogue(qg: QdqGraph, grp: Group, channel_shape) -> Epilogue:
    """The epilogue of ``grp`` as one per-channel affine map and an activation.

    Parameters
    ----------
    qg : QdqGraph
        The graph the group is in.
    grp : Group
        A group of a QDQ graph.
    channel_shape : tuple of int
        The core's output shape with the batch: constants must be per-channel on axis 1
        (or per-tensor).

    Raises
    ------
    UnsupportedError
        An operand that is not a constant or not per channel, an operator after an
        activation, a division by an activation.
    """
    aff = Epilogue()
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
                lo, hi = _clip_bounds(qg, n)
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
                v, _ = qg.float_constant(i)
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
        v = _per_channel(qg, other, channel_shape, where)
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


def _per_channel(qg: QdqGraph, name, channel_shape, where) -> np.ndarray:
    """A constant operand as a per-channel vector (axis 1 of ``channel_shape``)."""
    val, _ = qg.float_constant(name)
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


def _clip_bounds(qg: QdqGraph, n):
    """A Clip's bounds (attributes before opset 11, constant inputs after);
    ``(None, None)`` if an input bound is not a constant scalar."""
    if n.version < 11:
        return float(n.attrs.get("min", -math.inf)), float(n.attrs.get("max", math.inf))
    vals = []
    for k, default in ((1, -math.inf), (2, math.inf)):
        name = n.inputs[k] if len(n.inputs) > k else ""
        if not name:
            vals.append(default)
            continue
        v, _ = qg.float_constant(name)
        if v is None or v.size != 1:
            return None, None
        vals.append(float(v.reshape(())))
    return vals[0], vals[1]


# -- the quantizer --------------------------------------------------------------------------

def out_quant(grp: Group):
    """Type, scale and zero point the requantization rounds onto: the quantizer's, or
    for a QONNX Trunc the grid of its input (the shift follows, see :func:`requant_stage`)."""
    qa = grp.quant.attrs
    if np.asarray(qa["scale"]).size != 1:
        raise UnsupportedError([f"{grp.quant.describe()}: per-axis activation "
                                f"quantization is not supported"])
    scale = qa["trunc_scale"] if "trunc_shift" in qa else qa["scale"]
    return (qa["qtype"], float(np.asarray(scale).reshape(())),
            int(np.asarray(qa["zero_point"]).reshape(())))


def out_info(grp: Group) -> QuantInfo:
    """The quantized tensor a group produces."""
    qa = grp.quant.attrs
    return QuantInfo(qa["qtype"], float(np.asarray(qa["scale"]).reshape(())),
                     int(np.asarray(qa["zero_point"]).reshape(())))


def out_rounding(grp: Group, rounding: str) -> str:
    """The requantization's rounding: the quantizer's (QONNX ``rounding_mode``); the
    lowering's default ``rounding`` for round half to even."""
    r = grp.quant.attrs.get("rounding", "half_even")
    if r == "half_even":
        return rounding
    if r not in golden.SHIFT_ROUNDINGS:
        raise UnsupportedError([f"{grp.quant.describe()}: rounding {r!r} is not supported "
                                f"by the requantization (supported: "
                                f"{', '.join(golden.SHIFT_ROUNDINGS)})"])
    return r


def output_bounds(aff: Epilogue, grp: Group) -> tuple[int, int]:
    """The output clip range: the type's (or the quantizer's narrower ``lo``/``hi``),
    narrowed by the activation's real bounds."""
    qtype, s_out, z_out = out_quant(grp)
    lo = int(grp.quant.attrs.get("lo", qtype.lo))
    hi = int(grp.quant.attrs.get("hi", qtype.hi))
    if aff.lo > -math.inf:
        lo = max(lo, int(golden.quantize_linear(np.float32(aff.lo), s_out, z_out, lo, hi)))
    if aff.hi < math.inf:
        hi = min(hi, int(golden.quantize_linear(np.float32(aff.hi), s_out, z_out,
                                                qtype.lo, hi)))
    return lo, max(hi, lo)


def is_identity(qi: QuantInfo, grp: Group, aff: Epilogue) -> bool:
    """The group's requantization would change nothing: same type, scale and zero
    point, no affine map and no activation that clips inside the type."""
    qtype, s_out, z_out = out_quant(grp)
    if (qtype, np.float32(s_out), z_out) != (qi.type, np.float32(qi.scale), qi.zero_point):
        return False
    if grp.quant.attrs.get("trunc_shift", 0) or grp.quant.attrs.get("bipolar") or \
            "thresholds" in grp.quant.attrs:
        return False    # a shift; int2 values a bipolar output maps; a count
    if np.any(aff.a != 1) or np.any(aff.b != 0) or aff.alpha is not None:
        return False
    lo, hi = output_bounds(aff, grp)
    return lo <= qtype.lo and hi >= qtype.hi


def requant_stage(mult_real, off_real, aff: Epilogue, grp: Group, opts: RequantOptions, *,
                  in_zero_point=0, value_range=None):
    """The requantization stage ``y = clip(round(v * M + O) + z)`` for real multipliers
    ``mult_real`` and offsets ``off_real`` (already divided by the output scale).

    A quantizer by thresholds (FINN MultiThreshold) gives the :class:`ThresholdStage`
    counting the same thresholds on ``v`` (``value_range``: the integers ``v`` can take,
    see :func:`_threshold_stage`), a bipolar quantizer one with a single threshold (see
    :func:`_bipolar_stage`); a QONNX Trunc a stage that shifts the integer on its input's
    grid right by ``trunc_shift`` bits.

    Raises
    ------
    UnsupportedError
        What the stage cannot compute exactly (see the messages).
    """
    qa = grp.quant.attrs
    if "thresholds" in qa:
        return _threshold_stage(mult_real, off_real, aff, grp, in_zero_point, value_range)
    if qa.get("bipolar"):
        return _bipolar_stage(mult_real, off_real, aff, grp, in_zero_point)
    qtype, _, z_out = out_quant(grp)
    lo, hi = output_bounds(aff, grp)
    rounding = out_rounding(grp, opts.rounding)
    m, shift = requant_params(mult_real, opts.multiplier_bits)
    off = np.rint(np.asarray(off_real, np.float64) * 2.0 ** shift).astype(np.int64)
    neg_m = neg_off = None
    if aff.alpha is not None:
        neg_m = compact(np.rint(np.asarray(mult_real) * aff.alpha * 2.0 ** shift)
                        .astype(np.int64))
        neg_off = compact(np.rint(np.asarray(off_real) * aff.alpha * 2.0 ** shift)
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
    return RequantStage(compact(m), compact(off), shift, z_out, lo, hi, qtype,
                        in_zero_point=in_zero_point, rounding=rounding,
                        neg_multiplier=neg_m, neg_offset=neg_off)


def _threshold_stage(mult_real, off_real, aff, grp, in_zero_point, value_range):
    """Thresholds on the integer ``v`` equal to the quantizer's float thresholds ``T`` on
    ``y = M[c] * (v - in_zero_point) + O[c]``: ``y >= T`` where ``v >= ceil((T - O) / M)
    + in_zero_point`` for ``M > 0``, computed in exact rational arithmetic. Channels with
    ``M < 0`` count the other way: all channels must agree (a convolution or dense layer
    negates its channels first, see :func:`bipolar_flips`)."""
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


def _bipolar_stage(mult_real, off_real, aff: Epilogue, grp: Group,
                   in_zero_point: int) -> ThresholdStage:
    """QONNX BipolarQuant: ``+1`` where the real value ``(x - in_zero_point) * M + O`` is
    non-negative, ``-1`` elsewhere, as one threshold per channel (base -1, step 2).

    A negative ``M`` would need a falling step; dense and convolution layers negate
    such channels' weights first (:func:`bipolar_flips`), other layers refuse them."""
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
    thresholds = compact(t.astype(np.int64) + in_zero_point).reshape(-1, 1)
    return ThresholdStage(thresholds, -1, 2, IntType(2, True))


def bipolar_flips(grp: Group, acc_scale, aff: Epilogue, channels: int):
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


def acc_stage(acc_scale, bias_real, aff: Epilogue, grp: Group, opts: RequantOptions,
              channels: int, flip=None, value_range=None):
    """The stage after an accumulator whose unit is worth ``acc_scale[c]``; ``flip``
    marks channels whose accumulator is negated (see :func:`bipolar_flips`)."""
    _, s_out, _ = out_quant(grp)
    a = np.broadcast_to(aff.a, (channels,))
    mult = f32_ratio(np.asarray(acc_scale, np.float32) * a.astype(np.float32),
                     s_out).astype(np.float64)
    if flip is not None:
        mult = np.where(flip, -mult, mult)
    off = (a * np.broadcast_to(bias_real, (channels,)) +
           np.broadcast_to(aff.b, (channels,))) / s_out
    st = float32_stage(mult, off, aff, grp, opts)
    if st is not None:
        return st
    return requant_stage(mult, off, aff, grp, opts, value_range=value_range)


def integer_bias(qg: QdqGraph, grp: Group, acc_scale, aff: Epilogue, channels: int):
    """The integer bias of an epilogue that is one Add of a quantized constant on the
    accumulator's scale (a MatMul and its bias Add, which onnxruntime fuses into a Gemm, then
    QGemm), and the epilogue without it; None if the epilogue is anything else."""
    ops = [n for n in grp.after if n.op not in VIEW_OPS and
           n.op not in ("Relu", "Clip")]
    if len(ops) != 1 or ops[0].op != "Add" or np.any(np.asarray(aff.a) != 1):
        return None
    n = ops[0]
    for name in n.inputs:
        dq = qg.dq_constant(name)
        if dq is None:
            continue
        q, s, z, _, _, _ = dq
        if q.size not in (1, channels) or np.asarray(s).size not in (1, channels):
            return None
        sb = np.broadcast_to(np.asarray(s, np.float64).reshape(-1), (channels,))
        if not np.allclose(sb, np.asarray(acc_scale, np.float64), rtol=1e-6, atol=0):
            return None
        bias = np.broadcast_to((q - np.asarray(z, np.int64)).reshape(-1), (channels,))
        return bias.astype(np.int64), Epilogue(aff.a, np.zeros(1), aff.lo, aff.hi,
                                               aff.alpha, aff.activated)
    return None


def float32_stage(mult, off, aff: Epilogue, grp: Group, opts: RequantOptions):
    """onnxruntime's requantization of QLinearConv / QGemm / QLinearMatMul, and its float32
    average of QLinearAveragePool (a stage rounding ``"float32"``; ``mult`` per channel, or
    per pixel ``(C or 1, OH, OW)``) where the options ask for it and the group is one such:
    a plain quantizer rounding half to even, no offset (the bias is on the accumulator's
    scale), no LeakyRelu, positive scales; None otherwise."""
    qa = grp.quant.attrs
    if opts.requant != "onnxruntime" or "thresholds" in qa or qa.get("bipolar") or \
            "trunc_shift" in qa or qa.get("rounding", "half_even") != "half_even" or \
            aff.alpha is not None or np.any(np.asarray(off) != 0) or \
            np.any(np.asarray(mult) < 0):
        return None
    qtype, _, z_out = out_quant(grp)
    lo, hi = output_bounds(aff, grp)
    m, shift = float32_params(mult)
    return RequantStage(compact_axes(m), [0], shift, z_out, lo, hi, qtype, rounding="float32")
