"""Host-side operators: the float (and quantize/dequantize) ops that run in numpy around the
accelerator, and the float interpreter the compiler uses for calibration.

One function per ONNX operator, attributes as keyword arguments, following the ONNX operator
specification of the versions named in each docstring. Depends on numpy only. Quantize and
dequantize nodes carry their parameters as attributes (``scale``, ``zero_point``, ``qtype``,
``axis``), resolved by the frontend from the ONNX inputs.
"""

from __future__ import annotations

import math

import numpy as np

from . import golden

__all__ = ["HOST_OPS", "ML_HOST_OPS", "ML_DOMAIN", "ACTIVATIONS", "HostOpError", "run_nodes",
           "supported", "block_view"]


class HostOpError(ValueError):
    """A host operator failed on its inputs; the message names the node and operator."""


def _softmax_like(x, axis, version, log):
    x = np.asarray(x, dtype=np.float32)
    if version < 13:  # opset 1-11: coerce to 2-D at `axis` and normalize the inner block
        axis = axis if axis >= 0 else axis + x.ndim
        shape = x.shape
        x2 = x.reshape(int(np.prod(shape[:axis])), -1)
        return _softmax_like(x2, 1, 13, log).reshape(shape)
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return ((x - m) - np.log(s) if log else e / s).astype(np.float32)


def softmax(x, *, axis=None, version=13):
    """ONNX Softmax-1/11/13 (default axis 1 before opset 13, -1 from 13)."""
    return _softmax_like(x, (1 if version < 13 else -1) if axis is None else axis, version,
                         False)


def log_softmax(x, *, axis=None, version=13):
    """ONNX LogSoftmax-1/11/13."""
    return _softmax_like(x, (1 if version < 13 else -1) if axis is None else axis, version,
                         True)


def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, version=13):
    """ONNX Gemm-7/9/11/13: ``alpha * A' @ B' + beta * C``."""
    a = a.T if transA else a
    b = b.T if transB else b
    y = np.float32(alpha) * (a @ b)
    if c is not None:
        y = y + np.float32(beta) * c
    return y.astype(np.result_type(a, b))


def reshape(x, shape, *, allowzero=0, version=14):
    """ONNX Reshape-5/13/14/19/21: 0 copies the input dimension unless ``allowzero``."""
    shape = [int(s) for s in np.asarray(shape).reshape(-1)]
    if not allowzero:
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return np.reshape(x, shape)


def block_view(op: str, shape, blocksize: int, mode: str = "DCR"):
    """ONNX DepthToSpace-1/11/13 and SpaceToDepth-1/13 of an ``(N, C, H, W)`` ``shape`` as the
    spec writes them: ``(blocks, perm, out)``, the input reshaped to ``blocks``, transposed
    by ``perm``, reshaped to ``out``. ``mode`` (DepthToSpace only): ``"DCR"`` (depth, column,
    row) or ``"CRD"``. Raises ``ValueError`` naming what does not fit."""
    if len(shape) != 4:
        raise ValueError(f"an input of rank {len(shape)}; only (N, C, H, W)")
    n, c, h, w = (int(d) for d in shape)
    b = int(blocksize)
    if b < 1:
        raise ValueError(f"blocksize={b}; it must be at least 1")
    if op == "SpaceToDepth":
        if h % b or w % b:
            raise ValueError(f"blocksize={b} does not divide the height {h} and width {w}")
        return (n, c, h // b, b, w // b, b), (0, 3, 5, 1, 2, 4), (n, c * b * b, h // b, w // b)
    if c % (b * b):
        raise ValueError(f"blocksize={b}: {b * b} does not divide the {c} channels")
    if mode == "DCR":
        return (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2), (n, c // (b * b), h * b, w * b)
    if mode == "CRD":
        return (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3), (n, c // (b * b), h * b, w * b)
    raise ValueError(f"mode={mode!r} is unsupported; 'DCR' or 'CRD'")


def _block_op(op):
    def run(x, *, blocksize, mode="DCR", version=13):
        blocks, perm, out = block_view(op, x.shape, blocksize, mode)
        return np.reshape(np.transpose(np.reshape(x, blocks), perm), out)
    run.__name__ = op
    return run


def flatten(x, *, axis=1, version=13):
    """ONNX Flatten-1/9/11/13/21."""
    axis = axis if axis >= 0 else axis + x.ndim
    return np.reshape(x, (int(np.prod(x.shape[:axis])), -1))


def clip(x, lo=None, hi=None, *, min=None, max=None, version=13):  # noqa: A002
    """ONNX Clip-6 (attributes) and Clip-11/12/13 (optional inputs)."""
    lo = min if lo is None else lo
    hi = max if hi is None else hi
    y = x
    if lo is not None:
        y = np.maximum(y, np.asarray(lo, dtype=x.dtype))
    if hi is not None:
        y = np.minimum(y, np.asarray(hi, dtype=x.dtype))
    return y


def quantize_linear(x, *, scale, zero_point, qtype, axis=1, version=13, lo=None, hi=None,
                    rounding="half_even", bipolar=False, thresholds=None, base=0, step=1,
                    trunc_shift=None, trunc_scale=None, **_):
    """ONNX QuantizeLinear-10/13/19/21 with resolved parameters; round half to even. The
    frontend's optional ``lo``/``hi`` (a narrower range: QONNX narrow range, a QCDQ Clip),
    ``rounding`` and ``bipolar`` (QONNX Quant / BipolarQuant) and ``thresholds``, ``base``,
    ``step`` (FINN MultiThreshold) follow :func:`onnx2fpga.sim.golden.quantize_linear`; with
    ``trunc_shift`` the node is a QONNX Trunc (:func:`onnx2fpga.sim.golden.trunc` on the grid
    ``trunc_scale``)."""
    lo = qtype.lo if lo is None else lo
    hi = qtype.hi if hi is None else hi
    if trunc_shift is not None:
        return golden.trunc(x, trunc_scale, trunc_shift, lo, hi, rounding)
    axis = axis if axis >= 0 else axis + np.ndim(x)
    return golden.quantize_linear(x, scale, zero_point, lo, hi, axis, rounding, bipolar,
                                  thresholds, base, step)


def dequantize_linear(x, *, scale, zero_point, qtype=None, axis=1, version=13, **_):
    """ONNX DequantizeLinear-10/13/19/21 with resolved parameters."""
    axis = axis if axis >= 0 else axis + np.ndim(x)
    return golden.dequantize_linear(x, scale, zero_point, axis)


def _unsqueeze(x, axes=None, *, version=13, **attrs):
    axes = attrs.get("axes") if axes is None else axes
    axes = sorted(int(a) % (x.ndim + len(axes)) for a in np.asarray(axes).reshape(-1))
    for a in axes:
        x = np.expand_dims(x, a)
    return x


def _squeeze(x, axes=None, *, version=13, **attrs):
    axes = attrs.get("axes") if axes is None else axes
    if axes is None:
        return np.squeeze(x)
    return np.squeeze(x, tuple(int(a) % x.ndim for a in np.asarray(axes).reshape(-1)))


def _argmax(x, *, axis=0, keepdims=1, select_last_index=0, version=13):
    if select_last_index:
        y = x.shape[axis] - 1 - np.argmax(np.flip(x, axis), axis=axis)
    else:
        y = np.argmax(x, axis=axis)
    return (np.expand_dims(y, axis) if keepdims else y).astype(np.int64)


def _topk(x, k, *, axis=-1, largest=1, sorted=1, version=11):  # noqa: A002
    """ONNX TopK-10/11: the ``k`` largest (or smallest) values along ``axis`` and their
    indices; ties go to the lower index, as the operator specifies."""
    x = np.asarray(x)
    k = int(np.asarray(k).reshape(-1)[0])
    axis = axis if axis >= 0 else axis + x.ndim
    key = -x if largest else x
    idx = np.argsort(key, axis=axis, kind="stable")
    idx = np.take(idx, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


def _cast(x, *, to, saturate=1, round_mode="up", version=13):
    from_onnx = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16,
                 6: np.int32, 7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64,
                 12: np.uint32, 13: np.uint64}
    if to not in from_onnx:
        raise ValueError(f"Cast to ONNX type {to} is not supported on the host")
    return x.astype(from_onnx[to])


def _f32(fn):
    return lambda x, *, version=13, **kw: fn(np.asarray(x)).astype(np.asarray(x).dtype)


def _binary(fn):
    return lambda a, b, *, version=13, **kw: fn(a, b)


def _as_images(x):
    """``(N, C, H, W)`` view of an NCHW or NCW array, and a function undoing it."""
    x = np.asarray(x)
    if x.ndim == 4:
        return x, lambda y: y
    if x.ndim == 3:
        return x[:, :, None, :], lambda y: y[:, :, 0, :]
    raise ValueError(f"expected an NCW or NCHW tensor, not shape {x.shape}")


def _geometry(attrs, what):
    geo = attrs.get("_geometry")
    if geo is None:
        raise ValueError(f"{what}: geometry not resolved by the frontend")
    return (tuple(geo["kernel"]), tuple(geo["stride"]), tuple(geo["dilation"]),
            tuple(geo["pads"]))


def conv(x, w, b=None, *, version=11, **attrs):
    """ONNX Conv-1/11 (2-D and 1-D) in float32, with the geometry the frontend resolved
    (``_geometry``: ``kernel``, ``stride``, ``dilation``, ``pads`` as (top, left, bottom,
    right), ``group``)."""
    kernel, stride, dilation, pads = _geometry(attrs, "Conv")
    group = int(attrs["_geometry"]["group"])
    xi, back = _as_images(np.asarray(x, np.float32))
    w = np.asarray(w, np.float32)
    w4 = w if w.ndim == 4 else w[:, :, None, :]
    win = golden._windows(xi, kernel, stride, dilation, pads, np.float32(0))
    oc, cg = w4.shape[:2]
    per = oc // group
    outs = [np.einsum("bcyxij,ocij->boyx", win[:, g * cg:(g + 1) * cg],
                      w4[g * per:(g + 1) * per], optimize=True) for g in range(group)]
    y = np.concatenate(outs, axis=1).astype(np.float32)
    if b is not None:
        y = y + np.asarray(b, np.float32).reshape(1, -1, 1, 1)
    return back(y.astype(np.float32))


def max_pool(x, *, version=12, **attrs):
    """ONNX MaxPool-1..22 (one output) with the resolved geometry; padding never wins."""
    kernel, stride, dilation, pads = _geometry(attrs, "MaxPool")
    xi, back = _as_images(np.asarray(x))
    lowest = -np.inf if np.issubdtype(xi.dtype, np.floating) else np.iinfo(xi.dtype).min
    win = golden._windows(xi, kernel, stride, dilation, pads, lowest)
    return back(win.max(axis=(4, 5)).astype(xi.dtype))


def average_pool(x, *, version=11, **attrs):
    """ONNX AveragePool-1..22 with the resolved geometry and the per-pixel divisors
    ``counts`` (count_include_pad and ceil_mode already folded in by the frontend)."""
    kernel, stride, dilation, pads = _geometry(attrs, "AveragePool")
    xi, back = _as_images(np.asarray(x, np.float32))
    win = golden._windows(xi, kernel, stride, dilation, pads, np.float32(0))
    counts = np.asarray(attrs["_geometry"]["counts"], np.float32)
    return back((win.sum(axis=(4, 5)) / counts).astype(np.float32))


def _global(fn):
    def op(x, *, version=1, **attrs):
        x = np.asarray(x)
        axes = tuple(range(2, x.ndim))
        return fn(x, axis=axes, keepdims=True).astype(x.dtype)
    return op


def _spatial_reduce(fn):
    """ONNX ReduceMean / ReduceMax / ReduceSum over the spatial axes, the only ones the
    frontend lets through (:func:`onnx2fpga.frontend.geometry.reduce_geometry`)."""
    def op(x, axes=None, *, keepdims=1, version=13, **attrs):
        x = np.asarray(x)
        return fn(x, axis=tuple(range(2, x.ndim)), keepdims=bool(keepdims)).astype(x.dtype)
    return op


def _channel_slice(x, *args, version=13, **attrs):
    """ONNX Slice or one output of a Split of an activation along the channel axis, the
    range the frontend resolved (``_geometry``: ``start``, ``stop``); a Slice of constants
    (a shape computation) on any axes, steps included."""
    x = np.asarray(x)
    geo = attrs.get("_geometry")
    if geo is not None:
        return x[:, geo["start"]:geo["stop"]]
    if version < 10:
        starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
    else:
        starts, ends = args[0], args[1]
        axes = args[2] if len(args) > 2 else None
        steps = args[3] if len(args) > 3 else None
    starts = np.asarray(starts).reshape(-1).tolist()
    ends = np.asarray(ends).reshape(-1).tolist()
    axes = list(range(len(starts))) if axes is None else np.asarray(axes).reshape(-1).tolist()
    steps = [1] * len(starts) if steps is None else np.asarray(steps).reshape(-1).tolist()
    index = [slice(None)] * x.ndim
    for b, e, a, s in zip(starts, ends, axes, steps):
        index[int(a)] = slice(int(b), int(e), int(s))
    return x[tuple(index)]


def batch_normalization(x, scale, bias, mean, var, *, epsilon=1e-5, version=15, **_):
    """ONNX BatchNormalization-9/14/15 in inference mode."""
    x = np.asarray(x, np.float32)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    a = np.asarray(scale, np.float32) / np.sqrt(np.asarray(var, np.float32) +
                                                np.float32(epsilon))
    return ((x - np.asarray(mean, np.float32).reshape(shape)) * a.reshape(shape) +
            np.asarray(bias, np.float32).reshape(shape)).astype(np.float32)


def leaky_relu(x, *, alpha=0.01, version=16, **_):
    """ONNX LeakyRelu-6/16."""
    x = np.asarray(x)
    return np.where(x >= 0, x, x * np.asarray(alpha, x.dtype)).astype(x.dtype)


def concat(*xs, axis, version=13, **_):
    """ONNX Concat-4/11/13."""
    return np.concatenate([np.asarray(v) for v in xs], axis=axis)


def pad(x, *args, version=13, **attrs):
    """ONNX Pad (constant mode) with the spatial pads and value the frontend resolved
    (``_geometry``: ``pads`` as (top, left, bottom, right), ``value``)."""
    xi, back = _as_images(np.asarray(x))
    geo = attrs["_geometry"]
    top, left, bottom, right = geo["pads"]
    y = np.pad(xi, ((0, 0), (0, 0), (top, bottom), (left, right)),
               constant_values=np.asarray(geo["value"], xi.dtype))
    return back(y)


def resize(x, *args, version=13, **attrs):
    """ONNX Resize / Upsample in nearest mode with the index maps the frontend resolved
    (``_geometry``: ``rows``, ``cols``)."""
    xi, back = _as_images(np.asarray(x))
    geo = attrs["_geometry"]
    return back(golden.resize_nearest(xi, geo["rows"], geo["cols"]).astype(xi.dtype))


def _int_range(zero_point, default=np.uint8):
    """The output dtype of a QLinear operator (its zero point's type) and its range."""
    dtype = np.asarray(zero_point).dtype if zero_point is not None else np.dtype(default)
    info = np.iinfo(dtype)
    return dtype, int(info.min), int(info.max)


def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                   y_zero_point=None, *, version=21, **_):
    """ONNX QLinearMatMul-10/21 (:func:`onnx2fpga.sim.golden.qlinear_matmul`)."""
    dtype, lo, hi = _int_range(y_zero_point, np.asarray(a).dtype)
    y = golden.qlinear_matmul(a, a_scale, _zp(a_zero_point), b, b_scale, _zp(b_zero_point),
                              y_scale, _zp(y_zero_point), lo, hi)
    return y.astype(dtype)


def _zp(z):
    return 0 if z is None else np.asarray(z).astype(np.int64)


def matmul_integer(a, b, a_zero_point=None, b_zero_point=None, *, version=10, **_):
    """ONNX MatMulInteger-10 (:func:`onnx2fpga.sim.golden.matmul_integer`), int32 out."""
    return golden.matmul_integer(a, b, _zp(a_zero_point), _zp(b_zero_point)).astype(np.int32)


def _conv_geometry(attrs, what):
    kernel, stride, dilation, pads = _geometry(attrs, what)
    return dict(stride=stride, dilation=dilation, pads=pads,
                group=int(attrs["_geometry"]["group"]))


def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, version=10, **attrs):
    """ONNX ConvInteger-10 (2-D and 1-D) with the resolved geometry
    (:func:`onnx2fpga.sim.golden.conv_integer`), int32 out."""
    xi, back = _as_images(np.asarray(x))
    w = np.asarray(w)
    w4 = w if w.ndim == 4 else w[:, :, None, :]
    y = golden.conv_integer(xi, w4, _zp(x_zero_point), _zp(w_zero_point),
                            **_conv_geometry(attrs, "ConvInteger"))
    return back(y.astype(np.int32))


def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                 y_zero_point=None, b=None, *, version=10, **attrs):
    """ONNX QLinearConv-10 (2-D and 1-D) with the resolved geometry
    (:func:`onnx2fpga.sim.golden.qlinear_conv`)."""
    dtype, lo, hi = _int_range(y_zero_point, np.asarray(x).dtype)
    xi, back = _as_images(np.asarray(x))
    w = np.asarray(w)
    w4 = w if w.ndim == 4 else w[:, :, None, :]
    y = golden.qlinear_conv(xi, x_scale, _zp(x_zero_point), w4, w_scale, _zp(w_zero_point),
                            y_scale, _zp(y_zero_point), b, lo=lo, hi=hi,
                            **_conv_geometry(attrs, "QLinearConv"))
    return back(y.astype(dtype))


def _unary64(fn):
    """An elementwise function computed in float64 and rounded to the input's float type
    (float32): the correctly rounded result, which any float32 implementation approximates."""
    def op(x, *, version=13, **attrs):
        x = np.asarray(x)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return np.asarray(fn(x.astype(np.float64), **attrs)).astype(x.dtype)
    return op


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _softplus(x):
    return np.logaddexp(0.0, x)


def _gelu(x, *, approximate="none"):
    """ONNX Gelu-20: ``0.5 x (1 + erf(x / sqrt 2))``, or with ``approximate="tanh"``
    ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``."""
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _elu(x, *, alpha=1.0):
    return np.where(x < 0, alpha * (np.exp(x) - 1.0), x)


def _selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return np.where(x <= 0, gamma * (alpha * np.exp(x) - alpha), gamma * x)


def _hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    return np.clip(alpha * x + beta, 0.0, 1.0)


def _prelu(x, slope, *, version=16):
    """ONNX PRelu-9/16: ``slope * x`` where ``x < 0`` (``slope`` broadcasts to ``x``)."""
    return np.where(x < 0, x * np.asarray(slope, x.dtype), x).astype(x.dtype)


def _variadic(fn):
    """ONNX Min / Max (opsets 6-13): elementwise over every input, broadcasting."""
    def op(*xs, version=13):
        y = xs[0]
        for v in xs[1:]:
            y = fn(y, v)
        return y
    return op


#: Elementwise activations (ONNX opset versions in the comments), each computed in float64
#: from the float32 input and rounded back to float32.
ACTIVATIONS = {
    "HardSigmoid": _unary64(_hard_sigmoid),                               # 6, 22
    "HardSwish": _unary64(lambda x: x * _hard_sigmoid(x, alpha=1 / 6)),  # 14, 22
    "Gelu": _unary64(_gelu),                                              # 20
    "Erf": _unary64(lambda x: _erf(x)),                                   # 9, 13
    "Elu": _unary64(_elu),                                                # 6, 22
    "Selu": _unary64(_selu),                                              # 6, 22
    "Softplus": _unary64(_softplus),                                      # 1, 22
    "Softsign": _unary64(lambda x: x / (1.0 + np.abs(x))),                # 1, 22
    "Mish": _unary64(lambda x: x * np.tanh(_softplus(x))),                # 18, 22
    "Log": _unary64(np.log),                                              # 6, 13
    "Reciprocal": _unary64(lambda x: 1.0 / x),                            # 6, 13
}


HOST_OPS = {
    "Identity": lambda x, *, version=13: x,
    "Relu": _f32(lambda x: np.maximum(x, 0)),
    "Sigmoid": _f32(lambda x: 1.0 / (1.0 + np.exp(-x))),
    "Tanh": _f32(np.tanh),
    "Exp": _f32(np.exp),
    "Neg": _f32(np.negative),
    "Abs": _f32(np.abs),
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Pow": _binary(lambda a, b: np.power(a, b).astype(np.result_type(a))),
    "Sqrt": _f32(np.sqrt),
    "Div": _binary(lambda a, b: np.divide(a, b) if np.issubdtype(np.asarray(a).dtype,
                                                                 np.floating)
                   else np.trunc(a / b).astype(np.asarray(a).dtype)),
    "MatMul": _binary(np.matmul),
    "Gemm": gemm,
    "Softmax": softmax,
    "LogSoftmax": log_softmax,
    "Reshape": reshape,
    "Flatten": flatten,
    "Transpose": lambda x, *, perm=None, version=13: np.transpose(x, perm),
    "DepthToSpace": _block_op("DepthToSpace"),
    "SpaceToDepth": _block_op("SpaceToDepth"),
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Clip": clip,
    "ArgMax": _argmax,
    "TopK": _topk,
    "Cast": _cast,
    "QuantizeLinear": quantize_linear,
    "DequantizeLinear": dequantize_linear,
    "Conv": conv,
    "MaxPool": max_pool,
    "AveragePool": average_pool,
    "GlobalAveragePool": _global(np.mean),
    "GlobalMaxPool": _global(np.max),
    "Expand": lambda x, shape, *, version=13, **_: np.broadcast_to(
        x, np.broadcast_shapes(np.shape(x), tuple(int(d) for d in np.reshape(shape, -1)))
    ).copy(),
    "Slice": _channel_slice,
    "Split": _channel_slice,
    "ReduceMean": _spatial_reduce(np.mean),
    "ReduceMax": _spatial_reduce(np.max),
    "ReduceSum": _spatial_reduce(np.sum),
    "BatchNormalization": batch_normalization,
    "LeakyRelu": leaky_relu,
    "Concat": concat,
    "Pad": pad,
    "Resize": resize,
    "Upsample": resize,
    "QLinearMatMul": qlinear_matmul,
    "QLinearConv": qlinear_conv,
    "MatMulInteger": matmul_integer,
    "ConvInteger": conv_integer,
    "PRelu": _prelu,
    "Greater": _binary(np.greater),
    "Less": _binary(np.less),
    "GreaterOrEqual": _binary(np.greater_equal),
    "LessOrEqual": _binary(np.less_equal),
    "Equal": _binary(np.equal),
    "Not": lambda x, *, version=1: np.logical_not(x),
    "Where": lambda c, a, b, *, version=16: np.where(c, a, b),
    "Min": _variadic(np.minimum),
    "Max": _variadic(np.maximum),
    **ACTIVATIONS,
}


# -- ai.onnx.ml: what scikit-learn converters (skl2onnx) put around a model's layers --------

#: The domain of the ONNX-ML operators.
ML_DOMAIN = "ai.onnx.ml"


def array_feature_extractor(x, indices, *, version=1, **_):
    """ONNX-ML ArrayFeatureExtractor-1: the elements of ``x``'s last axis at ``indices``
    (flattened); a 1-D ``x`` gives one row, as onnxruntime does (its
    ``array_feature_extractor.cc``, followed by ``onnx.reference``)."""
    x = np.asarray(x)
    index = np.asarray(indices, np.int64).reshape(-1)
    n = x.shape[-1]
    if index.size and (index.min() < -n or index.max() >= n):
        raise ValueError(f"index {int(index.max() if index.max() >= n else index.min())} is "
                         f"out of range for a last axis of {n}")
    shape = (1, index.size) if x.ndim == 1 else (*x.shape[:-1], index.size)
    return x[..., index].reshape(shape)


def normalizer(x, *, norm="MAX", version=1, **_):
    """ONNX-ML Normalizer-1 of each row of a 2-D ``x`` by its ``MAX``, ``L1`` or ``L2`` norm
    (floored at 1e-30, as onnxruntime does), float32 out."""
    x = np.asarray(x, np.float32)
    x2 = x.reshape(-1, x.shape[-1]) if x.ndim != 2 else x
    if norm == "MAX":
        div = np.abs(x2).max(axis=1, keepdims=True)
    elif norm == "L1":
        div = np.abs(x2).sum(axis=1, keepdims=True)
    elif norm == "L2":
        div = np.sqrt(np.square(x2).sum(axis=1, keepdims=True))
    else:
        raise ValueError(f"norm={norm!r} is not one of 'MAX', 'L1', 'L2'")
    return (x2 / np.maximum(div, np.float32(1e-30))).astype(np.float32).reshape(x.shape)


def scaler(x, *, offset=None, scale=None, version=1, **_):
    """ONNX-ML Scaler-1: ``(x - offset) * scale`` along the last axis (one value, or one per
    feature), float32 out."""
    x = np.asarray(x, np.float32)
    offset = np.zeros(1, np.float32) if offset is None else np.asarray(offset, np.float32)
    scale = np.ones(1, np.float32) if scale is None else np.asarray(scale, np.float32)
    return ((x - offset) * scale).astype(np.float32)


def binarizer(x, *, threshold=0.0, version=1, **_):
    """ONNX-ML Binarizer-1: 1 where ``x > threshold``, else 0, in ``x``'s type."""
    x = np.asarray(x)
    return (x > np.asarray(threshold, x.dtype)).astype(x.dtype)


def label_encoder(x, *, version=2, default_float=-0.0, default_int64=-1, keys_floats=None,
                  keys_int64s=None, values_floats=None, values_int64s=None, **attrs):
    """ONNX-ML LabelEncoder-2/4 between integers and floats: each element of ``x`` mapped
    through ``keys_*`` -> ``values_*``, unknown keys to the default. String keys or values
    and the opset-4 tensor attributes are refused by the frontend, not here."""
    keys = keys_int64s if keys_int64s is not None else keys_floats
    values = values_int64s if values_int64s is not None else values_floats
    if keys is None or values is None or len(keys) != len(values):
        raise ValueError("LabelEncoder needs integer or float keys and values of one length")
    otype = np.int64 if values_int64s is not None else np.float32
    default = default_int64 if values_int64s is not None else default_float
    table = dict(zip(np.asarray(keys).tolist(), np.asarray(values).tolist()))
    x = np.asarray(x)
    return np.asarray([table.get(v, default) for v in x.reshape(-1).tolist()],
                      otype).reshape(x.shape)


#: ai.onnx.ml operator -> host function (attributes as keyword arguments).
ML_HOST_OPS = {
    "ArrayFeatureExtractor": array_feature_extractor,
    "Binarizer": binarizer,
    "LabelEncoder": label_encoder,
    "Normalizer": normalizer,
    "Scaler": scaler,
}


def supported(op: str, domain: str = "") -> bool:
    """Whether the host runs operator ``op`` of ``domain`` (``""`` is ai.onnx)."""
    if domain == ML_DOMAIN:
        return op in ML_HOST_OPS
    return domain in ("", "ai.onnx") and op in HOST_OPS


def run_nodes(nodes, env: dict, constants: dict) -> dict:
    """Execute ``nodes`` (objects with ``op``, ``inputs``, ``outputs``, ``attrs``,
    ``version``) in order on the values in ``env``; returns ``env`` with every output added.
    Empty input names are passed as ``None`` (absent optional inputs)."""
    for node in nodes:
        args = []
        for name in node.inputs:
            if not name:
                args.append(None)
            elif name in env:
                args.append(env[name])
            else:
                args.append(constants[name])
        while args and args[-1] is None:
            args.pop()
        ops = ML_HOST_OPS if getattr(node, "domain", "") == ML_DOMAIN else HOST_OPS
        fn = ops[node.op]
        try:
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                y = fn(*args, version=node.version or 13, **node.attrs)
        except (ValueError, TypeError, IndexError, ArithmeticError) as e:
            label = node.name or (node.outputs[0] if node.outputs else "?")
            shapes = ", ".join(str(np.shape(a)) for a in args)
            raise HostOpError(f"Node {label!r} ({node.op}): {e} (input shapes {shapes})") \
                from None
        if isinstance(y, tuple):                 # several outputs (TopK)
            for name, value in zip(node.outputs, y):
                if name:
                    env[name] = value
        else:
            env[node.outputs[0]] = y
    return env
