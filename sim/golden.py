"""The golden model: integer-exact numpy definitions of what the hardware computes.

One function per operation. The compiler (calibration, accuracy figures), the core tests and the
end-to-end tests all call these; nothing re-derives them. Depends on numpy only.

All integer arithmetic is done in int64 after checking that it cannot overflow (accumulators
are bounded by :func:`onnx2fpga.ir.acc_type_for`; requantization products are checked
per call), or in Python integers where int64 could overflow.
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..ir.dataflow import Dataflow
from ..ir.layers import (
    LAYER_TYPES,
    AddLayer,
    ConcatLayer,
    ConvLayer,
    DenseLayer,
    PadLayer,
    PoolLayer,
    RequantLayer,
    ResizeLayer,
    SliceLayer,
    ViewLayer,
    align_params,
    image_shape,
)
from ..ir.stages import LutStage, RequantStage, ThresholdStage

__all__ = [
    "round_shift", "requant", "requant_stages", "dense", "conv", "max_pool", "window_sum",
    "add", "join", "resize_nearest", "pad", "run_layer", "run_dataflow", "quantize_linear",
    "dequantize_linear", "round_float", "ROUNDINGS", "SHIFT_ROUNDINGS", "threshold", "lookup",
    "trunc", "requant_float32",
    "matmul_integer", "conv_integer", "qlinear_matmul", "qlinear_conv", "requantize_float",
]

#: The roundings of :func:`round_shift` (and so of a RequantStage but ``"float32"``, see
#: :func:`requant`).
SHIFT_ROUNDINGS = ir.SHIFT_ROUNDINGS

_INT64_SAFE = (1 << 62)


def round_shift(v, shift: int, rounding: str = "half_even") -> np.ndarray:
    """``v / 2**shift`` rounded to the nearest integer.

    ``rounding="half_even"``: ties go to the even neighbour (IEEE / ONNX QuantizeLinear).
    ``rounding="half_away"``: ties go away from zero (C ``round``, QONNX ``ROUND`` is half_even).
    ``"floor"``, ``"ceil"``, ``"to_zero"``: the quotient rounded down, up or towards zero
    (QONNX ``FLOOR``, ``CEIL``, ``DOWN``; ``floor`` is a plain arithmetic shift).
    Works on int64 arrays; the hardware implements exactly this with an arithmetic shift.
    """
    v = np.asarray(v, dtype=np.int64)
    if shift == 0:
        return v.copy()
    floor = v >> shift                                 # arithmetic shift: floor division
    rem = v - (floor << shift)                         # 0 <= rem < 2**shift
    if rounding in ("floor", "ceil", "to_zero"):
        up = (rem != 0) & ((rounding == "ceil") | ((rounding == "to_zero") & (v < 0)))
        return floor + up.astype(np.int64)
    half = np.int64(1) << (shift - 1)
    up = rem > half
    tie = rem == half
    if rounding == "half_even":
        up |= tie & ((floor & 1) == 1)
    elif rounding == "half_away":
        up |= tie & (v >= 0)
    else:
        raise ValueError(f"Rounding must be one of {', '.join(SHIFT_ROUNDINGS)}, not "
                         f"{rounding!r}")
    return floor + up.astype(np.int64)


def trunc(x, scale, shift: int, lo: int, hi: int, rounding: str = "floor") -> np.ndarray:
    """QONNX Trunc (opset 1 and 2, zero point 0) on float ``x``: ``t = round_half_even(x /
    scale)`` in float32 (the integer on the input's grid), then its ``shift`` low bits dropped
    with ``rounding`` (:func:`round_shift`) and the result clipped to ``[lo, hi]``. Returns
    int64; the real value is that times the output scale."""
    with np.errstate(over="ignore"):
        t = np.rint(np.asarray(x, np.float32) / np.float32(scale))
    # Saturated on the input grid first (well inside int64, far outside [lo, hi] << shift).
    t = _saturate(t, 0, -(1 << 62), 1 << 62)
    return np.clip(round_shift(t, int(shift), rounding), lo, hi)


def threshold(x, stage: ThresholdStage) -> np.ndarray:
    """One :class:`~onnx2fpga.ir.ThresholdStage` (FINN MultiThreshold on integers):
    ``base + step * #{i : x >= thresholds[c, i]}``, thresholds aligned on the left with the
    logical shape like requantization parameters (``x`` is ``(batch, *shape)``)."""
    x = np.asarray(x, dtype=np.int64)
    ndim = max(x.ndim - 1, 0)
    t = np.asarray(stage.thresholds, dtype=np.int64)
    count = np.zeros(x.shape, dtype=np.int64)
    for i in range(t.shape[1]):
        ti = align_params(t[:, i], ndim)            # one value, or per channel
        count += x >= (ti.reshape((1,) + ti.shape) if ti.ndim else ti)
    return stage.base + stage.step * count


def lookup(x, stage: LutStage) -> np.ndarray:
    """One :class:`~onnx2fpga.ir.LutStage`: ``table[c, x - in_lo]``, the table's rows aligned
    on the left with the logical shape like requantization parameters (``x`` is
    ``(batch, *shape)``). ``ValueError`` for an input the table does not cover."""
    x = np.asarray(x, dtype=np.int64)
    if x.size and (x.min() < stage.in_lo or x.max() > stage.in_hi):
        raise ValueError(f"Lookup input {int(x.min())}..{int(x.max())} outside the table's "
                         f"{stage.in_lo}..{stage.in_hi}")
    ndim = max(x.ndim - 1, 0)
    rows = align_params(np.arange(stage.table.shape[0], dtype=np.int64), ndim)
    rows = rows.reshape((1,) + rows.shape) if rows.ndim else rows
    return stage.table[rows, x - stage.in_lo]


def requant(x, stage: RequantStage) -> np.ndarray:
    """One :class:`~onnx2fpga.ir.RequantStage` applied to integer array ``x``.

    ``x`` is a batch ``(batch, *shape)`` of logical tensors; the stage's parameters are
    aligned on the left with ``shape`` (``(C,)``: per channel / feature, a single entry: for
    all). With ``neg_multiplier``, elements whose product is negative use the negative-side
    parameters (a fused LeakyRelu).
    """
    if isinstance(stage, ThresholdStage):
        return threshold(x, stage)
    if isinstance(stage, LutStage):
        return lookup(x, stage)
    x = np.asarray(x, dtype=np.int64)
    ndim = max(x.ndim - 1, 0)

    def param(a):
        a = align_params(a, ndim)
        return a.reshape((1,) + a.shape) if a.ndim else a

    centred = x - stage.in_zero_point
    if stage.rounding == "float32":
        return requant_float32(centred, param(ir.float32_scales(stage.multiplier, stage.shift)),
                               stage.zero_point, stage.lo, stage.hi)
    pairs = [(param(stage.multiplier), param(stage.offset))]
    if stage.neg_multiplier is not None:
        pairs.append((param(stage.neg_multiplier), param(stage.neg_offset)))
    vals = []
    for m, off in pairs:
        bound = int(np.abs(centred).max(initial=0)) * int(np.abs(m).max(initial=0)) + \
            int(np.abs(off).max(initial=0))
        if bound >= _INT64_SAFE:
            raise OverflowError(f"Requantization product needs more than 62 bits ({bound:#x})")
        vals.append(centred * m + off)
    v = vals[0] if len(vals) == 1 else np.where(vals[0] < 0, vals[1], vals[0])
    y = round_shift(v, stage.shift, stage.rounding) + stage.zero_point
    return np.clip(y, stage.lo, stage.hi)


def requant_float32(x, scale, zero_point: int, lo: int, hi: int) -> np.ndarray:
    """onnxruntime's requantization of an integer kernel's int32 result ``x`` (bias
    included) by the float32 ``scale`` (``x_scale * w_scale / y_scale`` evaluated in float32,
    left to right): ``clip(rne(f32(f32(x) * scale)) + zero_point, lo, hi)``, the float32
    conversion, product and conversion back (half to even) of MLAS
    ``MlasRequantizeOutput`` (onnxruntime/core/mlas/lib/requantize.cpp: ``cvtepi32_ps``,
    ``mul_ps``, clamp, ``cvtps_epi32``). numpy's float32 arithmetic is that IEEE arithmetic.
    Returns int64."""
    with np.errstate(over="ignore"):
        v = np.rint(np.asarray(x, np.int64).astype(np.float32) * np.asarray(scale, np.float32))
    return _saturate(v, zero_point, lo, hi)


def requant_stages(x, stages) -> np.ndarray:
    """Every stage of ``stages`` in order (see :func:`requant`)."""
    x = np.asarray(x, dtype=np.int64)
    for stage in stages:
        x = requant(x, stage)
    return x


def _check_bound(bound: int, what: str) -> None:
    if bound >= _INT64_SAFE:
        raise OverflowError(f"{what} needs more than 62 bits")


def dense(x, weight, bias, in_zero_point: int = 0) -> np.ndarray:
    """``(x - in_zero_point) @ weight.T + bias`` on integers (ONNX MatMulInteger semantics
    with a bias added, as in ONNX QLinearMatMul / Gemm before requantization)."""
    x = np.asarray(x, dtype=np.int64) - in_zero_point
    w = np.asarray(weight, dtype=np.int64)
    _check_bound(int(np.abs(x).max(initial=0)) * int(np.abs(w).sum(axis=1).max(initial=0))
                 + int(np.abs(np.asarray(bias)).max(initial=0)), "Accumulator")
    return x @ w.T + np.asarray(bias, dtype=np.int64)


def _windows(x, kernel, stride, dilation, pads, pad_value):
    """Sliding windows of a batch of images ``(batch, C, H, W)`` padded with ``pad_value``
    by ``pads = (top, left, bottom, right)``: ``(batch, C, OH, OW, kh, kw)``."""
    top, left, bottom, right = pads
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)),
                constant_values=pad_value)
    kh, kw = kernel
    sh, sw = stride
    dh, dw = dilation
    b, c, hp, wp = xp.shape
    oh = (hp - (kh - 1) * dh - 1) // sh + 1
    ow = (wp - (kw - 1) * dw - 1) // sw + 1
    st = xp.strides
    return np.lib.stride_tricks.as_strided(
        xp, (b, c, oh, ow, kh, kw),
        (st[0], st[1], st[2] * sh, st[3] * sw, st[2] * dh, st[3] * dw), writeable=False)


def conv(x, weight, bias, in_zero_point: int = 0, *, stride=(1, 1), dilation=(1, 1),
         pads=(0, 0, 0, 0), group: int = 1) -> np.ndarray:
    """Integer 2-D convolution of a batch ``x`` of ``(C, H, W)`` images (ONNX ConvInteger
    semantics, NCHW, with a bias added as in QLinearConv before requantization)::

        acc[o, y, x] = bias[o] + sum_{c, i, j} (xp[c, y*sh + i*dh, x*sw + j*dw]
                                                - in_zero_point) * weight[o, c, i, j]

    over the channels ``c`` of output channel ``o``'s group; ``xp`` is ``x`` padded with
    ``in_zero_point`` (``pads = (top, left, bottom, right)``). ``weight`` is
    ``(OC, C // group, kh, kw)``. Returns ``(batch, OC, OH, OW)``.
    """
    x = np.asarray(x, dtype=np.int64)
    w = np.asarray(weight, dtype=np.int64)
    oc, cg = w.shape[:2]
    win = _windows(x, w.shape[2:], stride, dilation, pads, in_zero_point) - in_zero_point
    _check_bound(int(np.abs(win).max(initial=0)) *
                 int(np.abs(w).reshape(oc, -1).sum(axis=1).max(initial=0)) +
                 int(np.abs(np.asarray(bias)).max(initial=0)), "Accumulator")
    per = oc // group
    outs = []
    for g in range(group):
        xg = win[:, g * cg:(g + 1) * cg]
        wg = w[g * per:(g + 1) * per]
        outs.append(np.einsum("bcyxij,ocij->boyx", xg, wg))
    acc = np.concatenate(outs, axis=1)
    return acc + np.asarray(bias, dtype=np.int64).reshape(1, -1, 1, 1)


def max_pool(x, *, kernel, stride=(1, 1), dilation=(1, 1), pads=(0, 0, 0, 0),
             pad_value: int) -> np.ndarray:
    """ONNX MaxPool on integer images ``(batch, C, H, W)``: the window maximum, padding
    positions holding ``pad_value`` (the lowest value of the type: they never win)."""
    win = _windows(np.asarray(x, np.int64), kernel, stride, dilation, pads, pad_value)
    return win.max(axis=(4, 5))


def window_sum(x, *, kernel, stride=(1, 1), dilation=(1, 1), pads=(0, 0, 0, 0),
               zero_point: int = 0) -> np.ndarray:
    """The sum over each window of ``x - zero_point`` on integer images ``(batch, C, H, W)``,
    padding positions counting zero (the numerator of ONNX AveragePool)."""
    win = _windows(np.asarray(x, np.int64), kernel, stride, dilation, pads, zero_point)
    return (win - zero_point).sum(axis=(4, 5))


def add(a, b, zero_points, multipliers) -> np.ndarray:
    """``(a - za) * ma + (b - zb) * mb`` on integers; the multipliers are aligned on the left
    with the logical shape of ``a[0]`` (see :func:`requant`)."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    ndim = max(a.ndim - 1, 0)
    out = np.zeros(np.broadcast_shapes(a.shape, b.shape), dtype=np.int64)
    for v, z, m in ((a, zero_points[0], multipliers[0]), (b, zero_points[1], multipliers[1])):
        mm = align_params(np.asarray(m, np.int64), ndim)
        mm = mm.reshape((1,) + mm.shape) if mm.ndim else mm
        _check_bound(int(np.abs(v - z).max(initial=0)) * int(np.abs(mm).max(initial=0)),
                     "Sum")
        out += (v - z) * mm
    return out


def join(a, b, zero_points, multipliers, op: str = "add") -> np.ndarray:
    """An elementwise join of two integer tensors (the value an
    :class:`~onnx2fpga.ir.AddLayer` requantizes): with ``ta = (a - za) * ma`` and
    ``tb = (b - zb) * mb`` (multipliers aligned as in :func:`add`), ``op`` ``"add"`` gives
    :func:`add`, ``"mul"`` ``ta * tb``, ``"min"`` / ``"max"`` the smaller / larger term.
    Requantizing the result follows ONNX's Add, Sub, Mul, Min and Max on the dequantized
    inputs (float, then QuantizeLinear): a product's scale is the product of the scales, and
    a minimum or maximum commutes with the (increasing) requantization."""
    if op == "add":
        return add(a, b, zero_points, multipliers)
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    ndim = max(a.ndim - 1, 0)
    terms = []
    for v, z, m in ((a, zero_points[0], multipliers[0]), (b, zero_points[1], multipliers[1])):
        mm = align_params(np.asarray(m, np.int64), ndim)
        mm = mm.reshape((1,) + mm.shape) if mm.ndim else mm
        _check_bound(int(np.abs(v - z).max(initial=0)) * int(np.abs(mm).max(initial=0)),
                     "Term")
        terms.append((v - z) * mm)
    if op == "mul":
        _check_bound(int(np.abs(terms[0]).max(initial=0)) *
                     int(np.abs(terms[1]).max(initial=0)), "Product")
        return terms[0] * terms[1]
    if op == "min":
        return np.minimum(terms[0], terms[1])
    if op == "max":
        return np.maximum(terms[0], terms[1])
    raise ValueError(f"Join op must be one of add, mul, min, max, not {op!r}")


def resize_nearest(x, rows, cols) -> np.ndarray:
    """``y[b, c, i, j] = x[b, c, rows[i], cols[j]]`` on images ``(batch, C, H, W)``."""
    x = np.asarray(x)
    return x[:, :, np.asarray(rows)][:, :, :, np.asarray(cols)]


def pad(x, pads, value: int) -> np.ndarray:
    """Constant padding of images ``(batch, C, H, W)`` by ``(top, left, bottom, right)``."""
    top, left, bottom, right = pads
    return np.pad(np.asarray(x, np.int64), ((0, 0), (0, 0), (top, bottom), (left, right)),
                  constant_values=value)


def _images(x, shape):
    return np.asarray(x, dtype=np.int64).reshape((len(x),) + image_shape(shape))


def _check_range(layer, x, t) -> None:
    if x.size and (x.min() < t.lo or x.max() > t.hi):
        raise ValueError(f"Input of layer {layer.name!r} is outside {t.name}")


def run_layer(layer, *xs) -> np.ndarray:
    """Run one dataflow layer on batches ``xs`` (one per input, each ``(batch, size)`` or
    ``(batch, *shape)`` in logical C order). Returns ``(batch, *layer.out_shape)``."""
    if not isinstance(layer, LAYER_TYPES):
        raise TypeError(f"Unknown layer type {type(layer).__name__}")
    if len(xs) != len(layer.in_shapes):
        raise ValueError(f"Layer {layer.name!r} takes {len(layer.in_shapes)} inputs, "
                         f"not {len(xs)}")
    ins = []
    for k, (x, shape) in enumerate(zip(xs, layer.in_shapes)):
        x = np.asarray(x, dtype=np.int64)
        size = int(np.prod(shape, dtype=np.int64))
        if x.ndim < 1 or x[0].size != size:
            raise ValueError(f"Layer {layer.name!r} takes (batch, {size}) integers, "
                             f"not {x.shape}")
        t = layer.in_types[k] if hasattr(layer, "in_types") else layer.in_type
        _check_range(layer, x, t)
        ins.append(x.reshape((len(x),) + tuple(shape)))
    for cls in type(layer).__mro__:
        if cls in _LAYERS:
            return _LAYERS[cls](layer, ins, (len(ins[0]),) + tuple(layer.out_shape))
    raise TypeError(f"Unknown layer type {type(layer).__name__}")  # pragma: no cover


# The integer semantics of each layer kind: ``f(layer, inputs, out_shape)`` on inputs shaped
# ``(batch, *in_shape)``, one function per kind, found through :data:`_LAYERS`.

def _dense_layer(layer, ins, out_shape):
    return requant_stages(dense(ins[0], layer.weight, layer.bias, layer.in_zero_point),
                          layer.requant)


def _requant_layer(layer, ins, out_shape):
    return requant_stages(ins[0], layer.requant)


def _conv_layer(layer, ins, out_shape):
    acc = conv(_images(ins[0], layer.in_shape), layer.weight, layer.bias, layer.in_zero_point,
               stride=layer.stride, dilation=layer.dilation, pads=layer.pads,
               group=layer.group)
    return requant_stages(acc.reshape(out_shape), layer.requant)


def _pool_layer(layer, ins, out_shape):
    geometry = dict(kernel=layer.kernel, stride=layer.stride, dilation=layer.dilation,
                    pads=layer.pads)
    img = _images(ins[0], layer.in_shape)
    if layer.op == "max":
        y = max_pool(img, pad_value=layer.in_type.lo, **geometry)
    else:
        y = window_sum(img, zero_point=layer.in_zero_point, **geometry)
    return requant_stages(y.reshape(out_shape), layer.requant)


def _add_layer(layer, ins, out_shape):
    return requant_stages(join(ins[0], ins[1], layer.in_zero_points, layer.multipliers,
                               layer.op), layer.requant)


def _concat_layer(layer, ins, out_shape):
    parts = [requant_stages(v, st) for v, st in zip(ins, layer.requant)]
    y = np.concatenate(parts, axis=layer.axis + 1)
    _check_range(layer, y, layer.out_type)
    return y


def _resize_layer(layer, ins, out_shape):
    y = resize_nearest(_images(ins[0], layer.in_shape), layer.rows, layer.cols)
    return requant_stages(y.reshape(out_shape), layer.requant)


def _pad_layer(layer, ins, out_shape):
    return pad(_images(ins[0], layer.in_shape), layer.pads, layer.value).reshape(out_shape)


def _slice_layer(layer, ins, out_shape):
    return ins[0][:, layer.start:layer.stop].reshape(out_shape)


def _view_layer(layer, ins, out_shape):
    x = ins[0]
    y = x if layer.perm is None else x.transpose((0,) + tuple(a + 1 for a in layer.perm))
    return y.reshape(out_shape)


_LAYERS = {DenseLayer: _dense_layer, RequantLayer: _requant_layer, ConvLayer: _conv_layer,
           PoolLayer: _pool_layer, AddLayer: _add_layer, ConcatLayer: _concat_layer,
           ResizeLayer: _resize_layer, PadLayer: _pad_layer, ViewLayer: _view_layer,
           SliceLayer: _slice_layer}


def run_dataflow(dataflow: Dataflow, x, trace: dict | None = None) -> np.ndarray:
    """Run the whole hardware part on integer input ``x``: ``(batch, input.size)`` in the
    logical C order of the input tensor.

    Returns ``(batch, output.size)`` integers, the output tensor in logical C order (the
    accelerator streams them in the port's stream order, see
    :meth:`~onnx2fpga.ir.Port.to_stream`). With ``trace``, every layer's output is
    stored under the layer's name, ``(batch, *out_shape)``.
    """
    x = np.asarray(x, dtype=np.int64)
    batch = len(x)
    env = {dataflow.input.name: x.reshape(batch, -1)}
    for layer in dataflow.layers:
        missing = [t for t in layer.inputs if t not in env]
        if missing:
            raise ValueError(f"Layer {layer.name!r} reads {missing[0]!r}, which no earlier "
                             f"layer writes")
        y = run_layer(layer, *(env[t] for t in layer.inputs))
        env[layer.output] = y.reshape(batch, -1)
        if trace is not None:
            trace[layer.name] = y
    if dataflow.output.name not in env:
        raise ValueError(f"No layer writes the output tensor {dataflow.output.name!r}")
    return env[dataflow.output.name]


def _along(axis: int, ndim: int, scale, zero_point):
    """Scale (float32) and zero point (int64), reshaped to broadcast along ``axis`` when
    they are per-axis (1-D with more than one entry)."""
    scale = np.asarray(scale, dtype=np.float32)
    zp = np.asarray(zero_point, dtype=np.int64)
    if scale.ndim == 1 and scale.size > 1:
        shape = [1] * ndim
        shape[axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return scale, zp


#: The roundings of :func:`round_float`.
ROUNDINGS = ir.FLOAT_ROUNDINGS


def round_float(v, rounding: str = "half_even") -> np.ndarray:
    """Round float array ``v`` to integers (as float): ``half_even`` (ONNX QuantizeLinear,
    QONNX ``ROUND``), ``half_away`` (C ``round``), ``half_up`` (ties towards +infinity),
    ``floor``, ``ceil``, ``to_zero`` (QONNX ``ROUND_TO_ZERO``)."""
    if rounding == "half_even":
        return np.rint(v)
    if rounding == "half_away":
        return np.sign(v) * np.floor(np.abs(v) + 0.5)
    if rounding == "half_up":
        return np.floor(v + 0.5)
    if rounding == "floor":
        return np.floor(v)
    if rounding == "ceil":
        return np.ceil(v)
    if rounding == "to_zero":
        return np.trunc(v)
    raise ValueError(f"Rounding must be one of {', '.join(ROUNDINGS)}, not {rounding!r}")


def quantize_linear(x, scale, zero_point, lo: int, hi: int, axis: int = 1,
                    rounding: str = "half_even", bipolar: bool = False, thresholds=None,
                    base: int = 0, step: int = 1) -> np.ndarray:
    """ONNX QuantizeLinear (opsets 10-23): ``saturate(round_half_even(x / scale) + zero_point)``
    into ``[lo, hi]`` (the type's range, or narrower: QONNX's narrow range, a QCDQ Clip).

    Computed in float32 like onnxruntime; ``scale``/``zero_point`` are scalars or 1-D along
    ``axis``. ``rounding`` selects another rounding of ``x / scale`` (QONNX Quant's
    ``rounding_mode``, see :func:`round_float`). ``bipolar``: QONNX BipolarQuant, ``+1`` where
    ``x >= 0`` and ``-1`` elsewhere (scale and zero point unused). ``thresholds``: FINN's
    MultiThreshold, ``base + step * #{i : x >= thresholds[c, i]}`` with ``(channels, n)``
    (or ``(1, n)``) float thresholds along ``axis``. Returns int64.
    """
    x = np.asarray(x, dtype=np.float32)
    if bipolar:
        return np.where(x >= 0, 1, -1).astype(np.int64)
    if thresholds is not None:
        t = np.asarray(thresholds, dtype=np.float32)
        count = np.zeros(x.shape, dtype=np.int64)
        for i in range(t.shape[1]):
            ti, _ = _along(axis, x.ndim, t[:, i] if t.shape[0] > 1 else t[0, i], 0)
            count += x >= ti
        return base + step * count
    scale, zp = _along(axis, x.ndim, scale, zero_point)
    with np.errstate(over="ignore"):            # x / scale beyond float32: +-inf, saturated
        v = round_float(x / scale, rounding)
    return _saturate(v, zp, lo, hi)


def _saturate(v, zp, lo: int, hi: int) -> np.ndarray:
    """``clip(v + zp, lo, hi)`` for rounded floats ``v``, clipped while still float so that
    infinities and values beyond int64 saturate (-inf to ``lo``, +inf to ``hi``, as
    onnxruntime's QuantizeLinear does) instead of wrapping in the integer conversion. A NaN
    has no integer: ``ValueError``."""
    v = np.asarray(v, np.float64)
    if np.isnan(v).any():
        raise ValueError("NaN has no quantized value")
    zp = np.asarray(zp, np.int64)
    q = np.clip(v, lo - zp, hi - zp).astype(np.int64) + zp
    return np.clip(q, lo, hi)


def dequantize_linear(q, scale, zero_point, axis: int = 1) -> np.ndarray:
    """ONNX DequantizeLinear: ``(q - zero_point) * scale`` in float32."""
    q = np.asarray(q, dtype=np.int64)
    scale, zp = _along(axis, q.ndim, scale, zero_point)
    return ((q - zp).astype(np.float32) * scale).astype(np.float32)


def matmul_integer(a, b, a_zero_point=0, b_zero_point=0) -> np.ndarray:
    """ONNX MatMulInteger-10: ``(a - a_zero_point) @ (b - b_zero_point)`` on integers, with
    numpy's matmul broadcasting of stacked matrices (int64; ONNX's int32 output holds it
    whenever the reduction is short enough, which :func:`_check_bound` checks here for int64).

    ``a_zero_point`` is a scalar or 1-D along ``a``'s rows (axis -2, the spec's per-row
    form); ``b_zero_point`` a scalar or 1-D along ``b``'s columns (axis -1).
    """
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    za = np.asarray(a_zero_point, dtype=np.int64)
    zb = np.asarray(b_zero_point, dtype=np.int64)
    if za.ndim == 1 and za.size > 1:
        za = za.reshape(-1, 1)                      # one zero point per row of a
    x, w = a - za, b - zb
    k = x.shape[-1]
    _check_bound(int(np.abs(x).max(initial=0)) * int(np.abs(w).max(initial=0)) * k,
                 "Accumulator")
    return np.matmul(x, w)


def conv_integer(x, w, x_zero_point=0, w_zero_point=0, *, stride=(1, 1), dilation=(1, 1),
                 pads=(0, 0, 0, 0), group: int = 1) -> np.ndarray:
    """ONNX ConvInteger-10 on a batch of images ``(batch, C, H, W)``: :func:`conv` of
    ``x - x_zero_point`` (padding holds the zero point, so it adds nothing) with
    ``w - w_zero_point`` (``w_zero_point`` a scalar or one per output channel), no bias.
    Returns int64 ``(batch, OC, OH, OW)``."""
    w = np.asarray(w, dtype=np.int64)
    zw = np.asarray(w_zero_point, dtype=np.int64)
    if zw.ndim == 1:
        zw = zw.reshape((-1,) + (1,) * (w.ndim - 1))
    zx = int(np.asarray(x_zero_point).reshape(-1)[0]) if np.size(x_zero_point) else 0
    return conv(x, w - zw, np.zeros(w.shape[0], np.int64), zx, stride=stride,
                dilation=dilation, pads=pads, group=group)


def requantize_float(acc, ratio, zero_point, lo: int, hi: int) -> np.ndarray:
    """``clip(round_half_even(acc * ratio) + zero_point, lo, hi)`` as onnx.reference's
    QLinearMatMul-10/21 and QLinearConv-10 compute it: ``ratio`` is the float requantization
    scale in the scales' own type (float32 or float16), the product is taken in float64
    (numpy's promotion of an integer array times a float32 scale) and the zero point is
    added before rounding. onnxruntime (MLAS) multiplies ``float32(acc) * ratio`` in float32
    instead; the two agree except where the float64 product lies within float32 rounding of
    a tie (x.5), where they can differ by one step. Returns int64."""
    acc = np.asarray(acc, dtype=np.int64)
    d = acc.astype(np.float64) * np.asarray(ratio).astype(np.float64)
    d = d + np.asarray(zero_point, dtype=np.int64).astype(np.float64)
    return np.clip(np.rint(d), lo, hi).astype(np.int64)


def _ratio(*scales):
    """``s1 * s2 / s3`` evaluated in the scales' own float type (as onnx.reference does)."""
    s1, s2, s3 = (np.asarray(s) for s in scales)
    with np.errstate(over="ignore"):
        return s1 * s2 / s3


def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                   y_zero_point, lo: int, hi: int) -> np.ndarray:
    """ONNX QLinearMatMul-10/21: :func:`matmul_integer` requantized by
    ``a_scale * b_scale / y_scale`` (see :func:`requantize_float` for the float arithmetic,
    which follows onnx.reference) into ``[lo, hi]``, the type of ``y_zero_point``.

    ``b_scale`` / ``b_zero_point`` are scalars or 1-D per column of ``b`` (axis -1);
    ``a_scale`` / ``a_zero_point`` scalars or 1-D per row of ``a``. Returns int64.
    """
    acc = matmul_integer(a, b, a_zero_point, b_zero_point)
    a_scale = np.asarray(a_scale)
    if a_scale.ndim == 1 and a_scale.size > 1:
        a_scale = a_scale.reshape(-1, 1)            # one scale per row of a
    return requantize_float(acc, _ratio(a_scale, b_scale, y_scale), y_zero_point, lo, hi)


def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
                 bias=None, *, lo: int, hi: int, stride=(1, 1), dilation=(1, 1),
                 pads=(0, 0, 0, 0), group: int = 1) -> np.ndarray:
    """ONNX QLinearConv-10 on images ``(batch, C, H, W)``: :func:`conv_integer` plus the
    int32 ``bias`` (on the scale ``x_scale * w_scale``), requantized by
    ``x_scale * w_scale / y_scale`` (``w_scale`` a scalar or one per output channel; see
    :func:`requantize_float`, which follows onnx.reference) into ``[lo, hi]``. Returns int64.
    """
    acc = conv_integer(x, w, x_zero_point, w_zero_point, stride=stride, dilation=dilation,
                       pads=pads, group=group)
    if bias is not None:
        acc = acc + np.asarray(bias, dtype=np.int64).reshape(1, -1, 1, 1)
    ratio = _ratio(x_scale, w_scale, y_scale)
    if np.ndim(ratio) == 1:
        ratio = np.asarray(ratio).reshape(1, -1, 1, 1)
    return requantize_float(acc, ratio, y_zero_point, lo, hi)
