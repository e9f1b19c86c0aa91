"""Exact geometry of the ONNX sliding-window, resize and pad operators.

Pure functions from an operator's attributes (a dict of Python values, as
:class:`~onnx2fpga.frontend.ir.Node` holds them), its version and its input shape to the
geometry that the golden model (:mod:`onnx2fpga.sim.golden`) and the dataflow layers use:
kernel, stride, dilation and pads normalized to 2-D, the divisor of every output pixel of an
average, the index maps of a nearest-neighbour resize. Numpy only; no onnx import.

Shapes are ONNX shapes with the batch axis: ``(N, C, W)`` (1-D) or ``(N, C, H, W)`` (2-D). A 1-D
operator becomes a 2-D one of height 1 (kernel ``(1, kw)``, stride ``(1, sw)``, pads
``(0, left, 0, right)``), as :func:`onnx2fpga.ir.image_shape` views a ``(C, W)`` image as
``(C, 1, W)``. Pads are always ``(top, left, bottom, right)``.

Errors: :class:`ValueError` for a value we do not support or that is inconsistent,
:class:`TypeError` for a wrong type. Messages start with the operator and version
(``"MaxPool-12: ..."``); the lowering prefixes the node.

Where the ONNX text, ``onnx.reference`` and onnxruntime disagree, each function says what it
follows; ``tests/test_geometry.py`` says which executor checks which case and why.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from fractions import Fraction
from typing import NamedTuple

import numpy as np

__all__ = [
    "ConvGeometry", "PoolGeometry", "conv_geometry", "pool_geometry", "avg_counts",
    "resize_nearest_maps", "pad_geometry", "reduce_geometry", "CONV_ATTRIBUTES",
    "POOL_ATTRIBUTES", "RESIZE_ATTRIBUTES", "PAD_ATTRIBUTES", "REDUCE_ATTRIBUTES",
    "REDUCE_AXES_INPUT",
]

# The attributes each (operator, since_version) defines (ONNX operator schemas, onnx 1.23).
_CONV = frozenset({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})
CONV_ATTRIBUTES = {("Conv", 1): _CONV, ("Conv", 11): _CONV, ("Conv", 22): _CONV,
                   ("ConvInteger", 10): _CONV, ("QLinearConv", 10): _CONV}

_POOL_BASE = frozenset({"auto_pad", "kernel_shape", "pads", "strides"})
_MAX_10 = _POOL_BASE | {"storage_order", "ceil_mode", "dilations"}
_AVG_10 = _POOL_BASE | {"count_include_pad", "ceil_mode"}
POOL_ATTRIBUTES = {
    ("MaxPool", 1): _POOL_BASE, ("MaxPool", 8): _POOL_BASE | {"storage_order"},
    ("MaxPool", 10): _MAX_10, ("MaxPool", 11): _MAX_10, ("MaxPool", 12): _MAX_10,
    ("MaxPool", 22): _MAX_10,
    ("AveragePool", 1): _POOL_BASE, ("AveragePool", 7): _POOL_BASE | {"count_include_pad"},
    ("AveragePool", 10): _AVG_10, ("AveragePool", 11): _AVG_10,
    ("AveragePool", 19): _AVG_10 | {"dilations"}, ("AveragePool", 22): _AVG_10 | {"dilations"},
    ("GlobalMaxPool", 1): frozenset(), ("GlobalMaxPool", 22): frozenset(),
    ("GlobalAveragePool", 1): frozenset(), ("GlobalAveragePool", 22): frozenset(),
}

_RESIZE_11 = frozenset({"coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
                        "extrapolation_value", "mode", "nearest_mode"})
_RESIZE_18 = _RESIZE_11 | {"antialias", "axes", "keep_aspect_ratio_policy"}
RESIZE_ATTRIBUTES = {
    ("Resize", 10): frozenset({"mode"}), ("Resize", 11): _RESIZE_11,
    ("Resize", 13): _RESIZE_11, ("Resize", 18): _RESIZE_18, ("Resize", 19): _RESIZE_18,
    ("Upsample", 7): frozenset({"mode", "scales"}), ("Upsample", 9): frozenset({"mode"}),
}

PAD_ATTRIBUTES = {("Pad", 2): frozenset({"mode", "pads", "value"}),
                  **{("Pad", v): frozenset({"mode"}) for v in (11, 13, 18, 19, 21, 23, 24, 25)}}

_REDUCE_OLD = frozenset({"axes", "keepdims"})
_REDUCE_NEW = frozenset({"keepdims", "noop_with_empty_axes"})
#: The first version of each reduction that takes ``axes`` as an input, not an attribute.
REDUCE_AXES_INPUT = {"ReduceMean": 18, "ReduceMax": 18, "ReduceSum": 13}
REDUCE_ATTRIBUTES = {
    (op, v): (_REDUCE_NEW if v >= REDUCE_AXES_INPUT[op] else _REDUCE_OLD)
    for op, versions in (("ReduceMean", (1, 11, 13, 18)), ("ReduceMax", (1, 11, 12, 13, 18, 20)),
                         ("ReduceSum", (1, 11, 13)))
    for v in versions}

_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


class ConvGeometry(NamedTuple):
    """Geometry of a convolution in 2-D (see :class:`onnx2fpga.ir.ConvLayer`)."""
    kernel: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pads: tuple[int, int, int, int]
    group: int
    out_hw: tuple[int, int]


class PoolGeometry(NamedTuple):
    """Geometry of a pooling in 2-D (see :class:`onnx2fpga.ir.PoolLayer`).

    ``pads`` are the pads the golden model and the hardware apply: for ``ceil_mode=1`` the
    bottom / right pads are enlarged so that the floor-mode window count equals ONNX's output
    size. ``counts`` (averages only; ``None`` for a maximum) holds the ONNX divisor of every
    output pixel, int64 ``out_hw``: ``average = window_sum / counts``.
    """
    kernel: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pads: tuple[int, int, int, int]
    count_include_pad: bool
    counts: np.ndarray | None
    out_hw: tuple[int, int]


# ---------------------------------------------------------------------------------------------
# Checked reading of attributes and shapes.

def _name(op: str, version, table) -> str:
    if not isinstance(op, str):
        raise TypeError(f"Operator must be a string, not {op!r}")
    versions = sorted(v for o, v in table if o == op)
    if not versions:
        ops = sorted({o for o, _ in table})
        raise ValueError(f"Operator {op!r} is not one of {', '.join(ops)}")
    if not isinstance(version, int) or isinstance(version, bool) or version not in versions:
        raise ValueError(f"{op} version must be one of {', '.join(map(str, versions))}, "
                         f"not {version!r}")
    return f"{op}-{version}"


def _check_attrs(name: str, attrs, allowed) -> None:
    if not isinstance(attrs, Mapping):
        raise TypeError(f"{name}: attributes must be a mapping, not {type(attrs).__name__}")
    unknown = sorted(set(attrs) - allowed)
    if unknown:
        raise ValueError(f"{name}: attribute {unknown[0]!r} is not defined for {name}")


def _int(name: str, what: str, v) -> int:
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name}: {what} must be an integer, not {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{name}: {what} must be an integer, not {v!r}") from None


def _ints(name: str, what: str, v, n: int | None = None) -> tuple[int, ...]:
    if isinstance(v, (str, bytes)) or not hasattr(v, "__len__"):
        raise TypeError(f"{name}: {what} must be a list of integers, not {v!r}")
    out = tuple(_int(name, what, x) for x in np.asarray(v).reshape(-1).tolist()) \
        if isinstance(v, np.ndarray) else tuple(_int(name, what, x) for x in v)
    if n is not None and len(out) != n:
        raise ValueError(f"{name}: {what} must have {n} entries, not {list(out)}")
    return out


def _str(name: str, what: str, v) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{name}: {what} must be a string, not {v!r}")
    return v


def _flag(name: str, what: str, v) -> bool:
    v = _int(name, what, v)
    if v not in (0, 1):
        raise ValueError(f"{name}: {what} must be 0 or 1, not {v!r}")
    return bool(v)


def _shape(name: str, what: str, shape) -> tuple[int, ...]:
    shape = _ints(name, what, shape)
    if any(d < 1 for d in shape):
        raise ValueError(f"{name}: {what} {shape} must have positive dimensions")
    return shape


def _image_shape(name: str, in_shape, kind: str) -> tuple[int, ...]:
    """The input shape, checked to be ``(N, C, W)`` or ``(N, C, H, W)``."""
    in_shape = _shape(name, "input shape", in_shape)
    if len(in_shape) > 4:
        raise ValueError(f"{name}: {len(in_shape) - 2}-D {kind} (input shape {in_shape}) is "
                         f"unsupported; only 1-D and 2-D")
    if len(in_shape) < 3:
        raise ValueError(f"{name}: input shape {in_shape} must be (N, C, W) or (N, C, H, W)")
    return in_shape


def _to_2d(values, fill: int) -> tuple[int, int]:
    return (fill, values[0]) if len(values) == 1 else (values[0], values[1])


def _pads_2d(begin, end) -> tuple[int, int, int, int]:
    if len(begin) == 1:
        return (0, begin[0], 0, end[0])
    return (begin[0], begin[1], end[0], end[1])


def _auto_pad(name: str, attrs, n: int) -> tuple[str, tuple[int, ...] | None]:
    """``auto_pad`` and the explicit ``pads`` (``None`` when absent)."""
    auto_pad = _str(name, "auto_pad", attrs.get("auto_pad", "NOTSET"))
    if auto_pad not in _AUTO_PADS:
        raise ValueError(f"{name}: auto_pad={auto_pad!r} is unsupported; NOTSET, SAME_UPPER, "
                         f"SAME_LOWER or VALID")
    pads = attrs.get("pads")
    if pads is not None:
        pads = _ints(name, "pads", pads, 2 * n)
        if min(pads) < 0:
            raise ValueError(f"{name}: pads={list(pads)} is unsupported; pads must not be "
                             f"negative")
        if auto_pad != "NOTSET" and any(pads):
            raise ValueError(f"{name}: pads={list(pads)} cannot be used with "
                             f"auto_pad={auto_pad!r}")
    return auto_pad, pads


def _same_pads(size: int, stride: int, span: int, upper: bool,
               clamp: bool) -> tuple[int, int, int]:
    """``(out, begin, end)`` of ``auto_pad=SAME_*`` along one axis. The total padding is
    ``(out - 1) * stride + span - size``, at least 0 with ``clamp``, else possibly negative
    (the caller decides)."""
    out = -(-size // stride)
    total = (out - 1) * stride + span - size
    if clamp:
        total = max(0, total)
    small = total // 2
    return (out, small, total - small) if upper else (out, total - small, small)


def _window_positions(out: int, kernel: int, stride: int, dilation: int, begin: int):
    """Input coordinates ``(out, kernel)`` of every window along one axis."""
    return (np.arange(out)[:, None] * stride - begin + np.arange(kernel)[None, :] * dilation)


# ---------------------------------------------------------------------------------------------
# Conv

def conv_geometry(attrs, in_shape, weight_shape, version, *, op: str = "Conv") -> ConvGeometry:
    """Geometry of an ONNX ``Conv`` (1, 11, 22), ``ConvInteger`` (10) or ``QLinearConv`` (10).

    Follows the ONNX operator specification, section Conv: ``kernel_shape`` defaults to the
    weight's spatial shape; ``strides`` and ``dilations`` to 1, ``pads`` to 0, ``group`` to 1.
    ``auto_pad=SAME_UPPER`` / ``SAME_LOWER`` make the output ``ceil(in / stride)`` with a total
    padding of ``max(0, (out - 1) * stride + (kernel - 1) * dilation + 1 - in)`` split in two
    halves, the odd pixel at the end (``SAME_UPPER``) or at the beginning (``SAME_LOWER``);
    ``VALID`` is no padding. The ``max(0, ...)`` is what onnx.reference does where the spec's
    formula goes negative (a kernel smaller than the stride); onnxruntime differs there (see
    the tests).

    Parameters
    ----------
    attrs : Mapping
        The node's attributes.
    in_shape : sequence of int
        Input shape ``(N, C, W)`` or ``(N, C, H, W)``.
    weight_shape : sequence of int
        ``(OC, C // group, kw)`` or ``(OC, C // group, kh, kw)``.
    version : int
        The operator's since_version.
    op : str
        ``"Conv"``, ``"ConvInteger"`` or ``"QLinearConv"`` (same attributes).

    Raises
    ------
    ValueError
        3-D and higher convolutions, negative pads, ``pads`` together with ``auto_pad``, a
        ``group`` that does not divide the channels, a weight that does not fit, an empty
        output.
    """
    name = _name(op, version, CONV_ATTRIBUTES)
    _check_attrs(name, attrs, CONV_ATTRIBUTES[(op, version)])
    in_shape = _image_shape(name, in_shape, "convolution")
    weight_shape = _shape(name, "weight shape", weight_shape)
    n = len(in_shape) - 2
    if len(weight_shape) != n + 2:
        raise ValueError(f"{name}: weight shape {weight_shape} does not fit input shape "
                         f"{in_shape}")
    kernel = weight_shape[2:]
    if "kernel_shape" in attrs:
        given = _ints(name, "kernel_shape", attrs["kernel_shape"])
        if given != kernel:
            raise ValueError(f"{name}: kernel_shape={list(given)} does not match the weight "
                             f"shape {weight_shape}")
    strides = _ints(name, "strides", attrs.get("strides", (1,) * n), n)
    dilations = _ints(name, "dilations", attrs.get("dilations", (1,) * n), n)
    if min(strides) < 1 or min(dilations) < 1:
        raise ValueError(f"{name}: strides={list(strides)} and dilations={list(dilations)} "
                         f"must be positive")
    group = _int(name, "group", attrs.get("group", 1))
    channels, out_channels = in_shape[1], weight_shape[0]
    if group < 1 or channels % group or out_channels % group:
        raise ValueError(f"{name}: group={group} must divide the {channels} input channels "
                         f"and the {out_channels} output channels")
    if weight_shape[1] * group != channels:
        raise ValueError(f"{name}: weight shape {weight_shape} with group={group} takes "
                         f"{weight_shape[1] * group} input channels, not {channels}")
    auto_pad, pads = _auto_pad(name, attrs, n)
    sizes = in_shape[2:]
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, s, span in zip(sizes, strides, spans):
            _, b, e = _same_pads(size, s, span, auto_pad == "SAME_UPPER", True)
            begin.append(b)
            end.append(e)
    elif pads is None:
        begin, end = [0] * n, [0] * n
    else:
        begin, end = list(pads[:n]), list(pads[n:])
    out = []
    for size, s, span, b, e in zip(sizes, strides, spans, begin, end):
        if size + b + e < span:
            raise ValueError(f"{name}: the output would be empty (input {list(sizes)}, "
                             f"kernel {list(kernel)}, dilations {list(dilations)}, pads "
                             f"{begin + end})")
        out.append((size + b + e - span) // s + 1)
    return ConvGeometry(_to_2d(kernel, 1), _to_2d(strides, 1), _to_2d(dilations, 1),
                        _pads_2d(begin, end), group, _to_2d(out, 1))


# ---------------------------------------------------------------------------------------------
# Pooling

def avg_counts(in_hw, kernel, stride, dilation, pads, count_include_pad: bool,
               out_hw) -> np.ndarray:
    """The divisor of every output pixel of an ONNX AveragePool, int64 ``(OH, OW)``.

    ``pads`` are the operator's own pads ``(top, left, bottom, right)`` (explicit or from
    ``auto_pad``), *not* enlarged by ``ceil_mode``; ``out_hw`` is the output size. A window
    position counts if it lies in the image (``count_include_pad=False``) or in the image or
    its pads (``True``): positions that ``ceil_mode`` adds beyond the bottom / right pads never
    count. This is what onnxruntime (pool_attributes.h / pool.cc) and onnx.reference
    (op_pool_common.py) compute; the ONNX text does not say.
    """
    counts = []
    for axis in range(2):
        size, out = int(in_hw[axis]), int(out_hw[axis])
        begin, end = int(pads[axis]), int(pads[axis + 2])
        pos = _window_positions(out, int(kernel[axis]), int(stride[axis]),
                                int(dilation[axis]), begin)
        lo, hi = (-begin, size + end) if count_include_pad else (0, size)
        counts.append(((pos >= lo) & (pos < hi)).sum(axis=1))
    return np.outer(counts[0], counts[1]).astype(np.int64)


def pool_geometry(op: str, attrs, in_shape, version, *, outputs: int = 1) -> PoolGeometry:
    """Geometry of an ONNX ``MaxPool`` (1, 8, 10, 11, 12, 22), ``AveragePool`` (1, 7, 10, 11,
    19, 22), ``GlobalMaxPool`` or ``GlobalAveragePool`` (1, 22).

    Follows the ONNX operator specification, sections MaxPool and AveragePool:

    * explicit pads, floor mode: ``out = floor((in + pads - span) / stride) + 1`` with
      ``span = (kernel - 1) * dilation + 1``;
    * ``ceil_mode=1``: ``ceil`` instead of ``floor``, but a last window that would start in
      the bottom / right padding is dropped ("Sliding windows that would start in the right
      padded region are ignored"; PyTorch's rule, which onnxruntime and onnx.reference
      implement). The returned bottom / right pads grow so that the floor formula gives the
      same ``out``; for an average the extra positions count neither with
      ``count_include_pad=0`` nor with ``1`` (:func:`avg_counts`).
    * ``auto_pad=SAME_UPPER`` / ``SAME_LOWER``: ``out = ceil(in / stride)`` and a total pad of
      ``(out - 1) * stride + span - in`` split as for Conv (``ceil_mode`` changes nothing);
      ``VALID``: no padding.

    Refused, with the reason in the message: the Indices output and ``storage_order=1``;
    3-D pooling; pads not smaller than the kernel (onnxruntime refuses them too); a window
    holding no input pixel where the result would divide by zero or be the maximum of
    nothing; ``auto_pad=SAME_*`` with dilations or with a negative total pad, and
    ``auto_pad=VALID`` with ``ceil_mode=1``, where the ONNX text, onnx.reference and
    onnxruntime give different results.

    Parameters
    ----------
    op : str
        The operator type.
    attrs : Mapping
        The node's attributes.
    in_shape : sequence of int
        Input shape ``(N, C, W)`` or ``(N, C, H, W)``.
    version : int
        The operator's since_version.
    outputs : int
        Number of outputs the node uses (MaxPool's second output, Indices, is refused).
    """
    name = _name(op, version, POOL_ATTRIBUTES)
    _check_attrs(name, attrs, POOL_ATTRIBUTES[(op, version)])
    in_shape = _image_shape(name, in_shape, "pooling")
    outputs = _int(name, "outputs", outputs)
    if outputs != 1:
        what = "the Indices output is" if op == "MaxPool" and outputs == 2 else \
            f"{outputs} outputs are"
        raise ValueError(f"{name}: {what} unsupported; only the pooled tensor")
    average = op in ("AveragePool", "GlobalAveragePool")
    n = len(in_shape) - 2
    sizes = in_shape[2:]
    in_hw = _to_2d(sizes, 1)
    if op.startswith("Global"):
        kernel = _to_2d(sizes, 1)
        counts = np.full((1, 1), kernel[0] * kernel[1], dtype=np.int64) if average else None
        return PoolGeometry(kernel, (1, 1), (1, 1), (0, 0, 0, 0), False, counts, (1, 1))

    if "kernel_shape" not in attrs:
        raise ValueError(f"{name}: kernel_shape is required")
    kernel = _ints(name, "kernel_shape", attrs["kernel_shape"], n)
    strides = _ints(name, "strides", attrs.get("strides", (1,) * n), n)
    dilations = _ints(name, "dilations", attrs.get("dilations", (1,) * n), n)
    if min(kernel) < 1 or min(strides) < 1 or min(dilations) < 1:
        raise ValueError(f"{name}: kernel_shape={list(kernel)}, strides={list(strides)} and "
                         f"dilations={list(dilations)} must be positive")
    if _int(name, "storage_order", attrs.get("storage_order", 0)) != 0:
        raise ValueError(f"{name}: storage_order={attrs['storage_order']!r} is unsupported; "
                         f"only 0")
    ceil_mode = _flag(name, "ceil_mode", attrs.get("ceil_mode", 0))
    include_pad = _flag(name, "count_include_pad", attrs.get("count_include_pad", 0))
    auto_pad, pads = _auto_pad(name, attrs, n)
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]

    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if max(dilations) > 1:
            # onnxruntime leaves the dilation out of the SAME padding (its output is not
            # ceil(in / stride)) and onnx.reference's AveragePool does too.
            raise ValueError(f"{name}: auto_pad={auto_pad!r} with dilations="
                             f"{list(dilations)} is unsupported; only with dilations of 1")
        begin, end, out = [], [], []
        for size, s, span in zip(sizes, strides, spans):
            o, b, e = _same_pads(size, s, span, auto_pad == "SAME_UPPER", False)
            if b + e < 0:
                raise ValueError(f"{name}: auto_pad={auto_pad!r} with kernel_shape="
                                 f"{list(kernel)} and strides={list(strides)} needs a "
                                 f"negative padding ({b + e}) for input {list(sizes)}; "
                                 f"unsupported")
            begin.append(b)
            end.append(e)
            out.append(o)
        geo_end = end
    else:
        if auto_pad == "VALID" and ceil_mode:
            # The spec's VALID formula ignores ceil_mode; onnxruntime applies it.
            raise ValueError(f"{name}: auto_pad='VALID' with ceil_mode=1 is unsupported; "
                             f"use explicit pads")
        if pads is None:
            begin, end = [0] * n, [0] * n
        else:
            begin, end = list(pads[:n]), list(pads[n:])
            if any(p >= k for p, k in zip(begin + end, kernel + kernel)):
                raise ValueError(f"{name}: pads={list(pads)} is unsupported; pads must be "
                                 f"smaller than kernel_shape={list(kernel)}")
        out, geo_end = [], []
        for size, s, span, b, e in zip(sizes, strides, spans, begin, end):
            if size + b + e < span:
                raise ValueError(f"{name}: the output would be empty (input {list(sizes)}, "
                                 f"kernel_shape {list(kernel)}, dilations {list(dilations)}, "
                                 f"pads {begin + end})")
            o = (size + b + e - span) // s + 1
            if ceil_mode:
                o = -(-(size + b + e - span) // s) + 1
                if (o - 1) * s >= size + b:      # the last window starts in the padding
                    o -= 1
            out.append(o)
            geo_end.append(max(e, (o - 1) * s + span - size - b))

    pads2 = _pads_2d(begin, end)
    kernel2, stride2, dilation2 = _to_2d(kernel, 1), _to_2d(strides, 1), _to_2d(dilations, 1)
    out_hw = _to_2d(out, 1)
    inside = avg_counts(in_hw, kernel2, stride2, dilation2, pads2, False, out_hw)
    if (not average or not include_pad) and inside.min() == 0:
        what = "averages nothing" if average else "has no maximum"
        raise ValueError(f"{name}: a window holds no input pixel and {what} (input "
                         f"{list(sizes)}, kernel_shape {list(kernel)}, dilations "
                         f"{list(dilations)}, pads {begin + end}); unsupported")
    counts = None
    if average:
        counts = avg_counts(in_hw, kernel2, stride2, dilation2, pads2, include_pad, out_hw)
    return PoolGeometry(kernel2, stride2, dilation2, _pads_2d(begin, geo_end), include_pad,
                        counts, out_hw)


# ---------------------------------------------------------------------------------------------
# Resize / Upsample, mode nearest

_COORDINATE_MODES = {
    11: ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
         "tf_half_pixel_for_nn"),
    13: ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"),
    18: ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"),
    19: ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
         "asymmetric"),
}
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_POLICIES = ("stretch", "not_larger", "not_smaller")
_HALF = Fraction(1, 2)


def _f32(x) -> Fraction:
    """The exact value of ``x`` rounded to float32 (ONNX scales are float32 tensors)."""
    return Fraction(float(np.float32(x)))


def _nearest_index(x: Fraction, nearest_mode: str) -> int:
    floor = math.floor(x)
    frac = x - floor
    if nearest_mode == "floor":
        return floor
    if nearest_mode == "ceil":
        return floor + (frac > 0)
    if nearest_mode == "round_prefer_floor":
        return floor + (frac > _HALF)
    return floor + (frac >= _HALF)                 # round_prefer_ceil


def _axis_map(size: int, out: int, scale: Fraction, width: Fraction, mode: str,
              nearest_mode: str) -> np.ndarray:
    """Input index of every output position along one axis, clamped to ``[0, size - 1]``."""
    if scale == 1 and out == size:
        # An axis that keeps its size at scale 1 is copied: onnx.reference and onnxruntime
        # skip it (it matters for tf_half_pixel_for_nn with ceil rounding, which would shift).
        return np.arange(size, dtype=np.int64)
    idx = []
    for x in range(out):
        if mode == "legacy":
            # Resize-10 / Upsample: the spec gives no coordinate rule; onnxruntime maps
            # asymmetrically and truncates when upsampling, takes the ceiling when
            # downsampling (upsamplebase.h, ResizeNearestMode::SIMPLE).
            xo = x / scale
            i = math.ceil(xo) if scale < 1 else math.floor(xo)
        else:
            if mode == "half_pixel":
                xo = (x + _HALF) / scale - _HALF
            elif mode == "half_pixel_symmetric":
                offset = Fraction(size, 2) * (1 - out / width)
                xo = offset + (x + _HALF) / scale - _HALF
            elif mode == "pytorch_half_pixel":
                xo = (x + _HALF) / scale - _HALF if out > 1 else Fraction(0)
            elif mode == "align_corners":
                xo = Fraction(x * (size - 1), out - 1) if out > 1 else Fraction(0)
            elif mode == "asymmetric":
                xo = x / scale
            else:                                    # tf_half_pixel_for_nn
                xo = (x + _HALF) / scale
            i = _nearest_index(xo, nearest_mode)
        idx.append(min(max(i, 0), size - 1))
    return np.asarray(idx, dtype=np.int64)


def resize_nearest_maps(op: str, attrs, in_shape, version, *, scales=None,
                        sizes=None) -> tuple[np.ndarray, np.ndarray]:
    """Index maps ``(rows, cols)`` of an ONNX ``Resize`` (10, 11, 13, 18, 19) or ``Upsample``
    (7, 9) in mode ``nearest``: ``y[n, c, i, j] = x[n, c, rows[i], cols[j]]``
    (:func:`onnx2fpga.sim.golden.resize_nearest`). For a 1-D input ``rows`` is ``[0]``.

    Follows the ONNX operator specification, section Resize, in exact rational arithmetic on
    the float32 value of each scale: output size ``floor(in * scale)`` (or ``sizes``, with
    ``keep_aspect_ratio_policy`` from Resize-18: ``round_half_up(scale * in)`` with the
    smallest / largest ratio of the listed axes), the coordinate transformation
    (``half_pixel``, ``half_pixel_symmetric`` from 19, ``pytorch_half_pixel``,
    ``align_corners``, ``asymmetric``, ``tf_half_pixel_for_nn`` in 11 only) with
    ``scale = out / in`` when ``sizes`` are given, then ``nearest_mode`` (ties to the floor
    or the ceiling, or floor, or ceiling), clamped to the image. Resize-10 and Upsample
    follow onnxruntime (see ``_axis_map``). onnx.reference computes in float64 and
    onnxruntime in float32, so either may round differently where the exact coordinate is
    an integer or a tie; see the tests.

    Parameters
    ----------
    op : str
        ``"Resize"`` or ``"Upsample"``.
    attrs : Mapping
        The node's attributes (``axes`` from Resize-18; ``scales`` for Upsample-7).
    in_shape : sequence of int
        Input shape ``(N, C, W)`` or ``(N, C, H, W)``.
    version : int
        The operator's since_version.
    scales, sizes : array_like or None
        The constant ``scales`` / ``sizes`` inputs (an empty array counts as absent). The
        ``roi`` input matters only to ``tf_crop_and_resize``, which is refused; so do
        ``extrapolation_value`` and ``cubic_coeff_a`` (ignored).

    Raises
    ------
    ValueError
        Modes other than nearest (the message names the mode), ``tf_crop_and_resize``,
        ``exclude_outside=1`` and ``antialias=1``, resizing the N or C axis, both or neither
        of ``scales`` and ``sizes``, an empty output.
    """
    name = _name(op, version, RESIZE_ATTRIBUTES)
    _check_attrs(name, attrs, RESIZE_ATTRIBUTES[(op, version)])
    in_shape = _image_shape(name, in_shape, "resizing")
    rank = len(in_shape)
    mode = _str(name, "mode", attrs.get("mode", "nearest"))
    if mode != "nearest":
        raise ValueError(f"{name}: mode={mode!r} is unsupported; only 'nearest'")
    for flag in ("exclude_outside", "antialias"):
        # Both only shape linear / cubic weights; onnxruntime refuses exclude_outside=1 and
        # onnx.reference antialias=1 in mode nearest.
        if _int(name, flag, attrs.get(flag, 0)) != 0:
            raise ValueError(f"{name}: {flag}={attrs[flag]!r} is unsupported in mode "
                             f"'nearest'; only 0")
    legacy = op == "Upsample" or version == 10
    if legacy:
        coord, nearest_mode = "legacy", "floor"
    else:
        coord = _str(name, "coordinate_transformation_mode",
                     attrs.get("coordinate_transformation_mode", "half_pixel"))
        modes = _COORDINATE_MODES[version]
        if coord not in modes:
            what = "is unsupported" if coord == "tf_crop_and_resize" else \
                f"is not a mode of {name}"
            raise ValueError(f"{name}: coordinate_transformation_mode={coord!r} {what}; "
                             f"{', '.join(modes)}")
        nearest_mode = _str(name, "nearest_mode",
                            attrs.get("nearest_mode", "round_prefer_floor"))
        if nearest_mode not in _NEAREST_MODES:
            raise ValueError(f"{name}: nearest_mode={nearest_mode!r} is unsupported; "
                             f"{', '.join(_NEAREST_MODES)}")
    policy = _str(name, "keep_aspect_ratio_policy",
                  attrs.get("keep_aspect_ratio_policy", "stretch"))
    if policy not in _POLICIES:
        raise ValueError(f"{name}: keep_aspect_ratio_policy={policy!r} is unsupported; "
                         f"{', '.join(_POLICIES)}")
    axes = list(range(rank))
    if "axes" in attrs:
        axes = [a + rank if a < 0 else a for a in _ints(name, "axes", attrs["axes"])]
        if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
            raise ValueError(f"{name}: axes={list(attrs['axes'])} must be distinct axes of a "
                             f"rank-{rank} input")

    if op == "Upsample" and version == 7:
        if "scales" not in attrs:
            raise ValueError(f"{name}: the scales attribute is required")
        if scales is not None or sizes is not None:
            raise ValueError(f"{name}: scales are an attribute, not inputs")
        scales = attrs["scales"]
    scales = None if scales is None else np.asarray(scales, dtype=np.float64).reshape(-1)
    sizes = None if sizes is None else np.asarray(sizes).reshape(-1)
    if scales is not None and scales.size == 0:
        scales = None
    if sizes is not None and sizes.size == 0:
        sizes = None
    if legacy and sizes is not None:
        raise ValueError(f"{name}: takes scales, not sizes")
    if (scales is None) == (sizes is None):
        raise ValueError(f"{name}: exactly one of scales and sizes must be given")
    given = scales if scales is not None else sizes
    if given.size != len(axes):
        raise ValueError(f"{name}: {'scales' if scales is not None else 'sizes'} must have "
                         f"{len(axes)} entries, not {given.tolist()}")

    # Per axis: output length, scale (exact) and target width (fractional with a scale).
    plan = {a: (in_shape[a], Fraction(1), Fraction(in_shape[a])) for a in range(rank)}
    if scales is not None:
        if not np.all(np.isfinite(scales)) or scales.min() <= 0 or \
                (op == "Upsample" and scales.min() < 1):
            low = "at least 1" if op == "Upsample" else "positive"
            raise ValueError(f"{name}: scales {scales.tolist()} must be finite and {low}")
        for a, s in zip(axes, scales):
            scale = _f32(s)
            plan[a] = (math.floor(in_shape[a] * scale), scale, in_shape[a] * scale)
    else:
        sizes = [_int(name, "sizes", s) for s in sizes.tolist()]
        if min(sizes) < 1:
            raise ValueError(f"{name}: sizes {sizes} must be positive")
        if policy == "stretch":
            for a, s in zip(axes, sizes):
                plan[a] = (s, Fraction(s, in_shape[a]), Fraction(s))
        else:
            ratios = [Fraction(s, in_shape[a]) for a, s in zip(axes, sizes)]
            scale = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                plan[a] = (math.floor(scale * in_shape[a] + _HALF), scale, scale * in_shape[a])
    for a in range(rank):
        out, scale, _ = plan[a]
        if out < 1:
            raise ValueError(f"{name}: the output would be empty along axis {a} "
                             f"(input shape {in_shape})")
        if a < 2 and (out != in_shape[a] or scale != 1):
            what = "batch" if a == 0 else "channel"
            raise ValueError(f"{name}: resizing the {what} axis ({in_shape[a]} by "
                             f"{float(scale):g} to {out}) is unsupported; only the spatial "
                             f"axes")
    maps = [_axis_map(in_shape[a], plan[a][0], plan[a][1], plan[a][2], coord, nearest_mode)
            for a in range(2, rank)]
    if rank == 3:
        return np.zeros(1, dtype=np.int64), maps[0]
    return maps[0], maps[1]


# ---------------------------------------------------------------------------------------------
# Pad

def pad_geometry(attrs, in_shape, version, *, pads=None, axes=None) -> tuple[int, int, int, int]:
    """Spatial pads ``(top, left, bottom, right)`` of an ONNX ``Pad`` (2, 11, 13, 18, 19, 21,
    23, 24, 25) of an ``(N, C, W)`` or ``(N, C, H, W)`` tensor, mode ``constant``.

    Pad-2 takes ``pads`` as an attribute; from Pad-11 on they are an input (``pads=``), and
    from Pad-18 an optional ``axes`` input lists the axes they refer to (ONNX operator
    specification, section Pad: ``[x1_begin, x2_begin, ..., x1_end, x2_end, ...]``). The
    constant itself is the lowering's business.

    Raises
    ------
    ValueError
        Modes other than ``constant`` (reflect, edge, wrap: named in the message), padding of
        the N or C axis, negative pads (cropping), pads or axes that do not fit the input.
    """
    name = _name("Pad", version, PAD_ATTRIBUTES)
    _check_attrs(name, attrs, PAD_ATTRIBUTES[("Pad", version)])
    in_shape = _image_shape(name, in_shape, "padding")
    rank = len(in_shape)
    mode = _str(name, "mode", attrs.get("mode", "constant"))
    if mode != "constant":
        raise ValueError(f"{name}: mode={mode!r} is unsupported; only 'constant'")
    if version == 2:
        if pads is not None or axes is not None:
            raise ValueError(f"{name}: pads are an attribute, not inputs")
        if "pads" not in attrs:
            raise ValueError(f"{name}: the pads attribute is required")
        pads = attrs["pads"]
    elif pads is None:
        raise ValueError(f"{name}: the pads input is required")
    if axes is not None and version < 18:
        raise ValueError(f"{name}: the axes input needs Pad-18 or later")
    if axes is None:
        axes = list(range(rank))
    else:
        axes = [a + rank if a < 0 else a for a in _ints(name, "axes", axes)]
        if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
            raise ValueError(f"{name}: axes={list(axes)} must be distinct axes of a "
                             f"rank-{rank} input")
    pads = _ints(name, "pads", pads, 2 * len(axes))
    if min(pads) < 0:
        raise ValueError(f"{name}: pads={list(pads)} is unsupported; negative pads (cropping) "
                         f"are not")
    full = [0] * (2 * rank)
    for i, a in enumerate(axes):
        full[a], full[a + rank] = pads[i], pads[i + len(axes)]
    for a in (0, 1):
        if full[a] or full[a + rank]:
            what = "batch" if a == 0 else "channel"
            raise ValueError(f"{name}: padding the {what} axis (pads={list(pads)}) is "
                             f"unsupported; only the spatial axes")
    return _pads_2d(full[2:rank], full[rank + 2:])


# ---------------------------------------------------------------------------------------------
# Reductions over the spatial axes (global pooling)

def reduce_geometry(op: str, attrs, in_shape, version, *, axes=None) -> PoolGeometry:
    """Geometry of an ONNX ``ReduceMean``, ``ReduceMax`` or ``ReduceSum`` over the spatial
    axes of an ``(N, C, W)`` or ``(N, C, H, W)`` tensor: a global pooling (ONNX operator
    specification, sections ReduceMean / ReduceMax / ReduceSum). ``axes`` is an attribute
    before ReduceMean-18, ReduceMax-18 and ReduceSum-13 and the optional second input
    (``axes=``) from then on; absent or empty, every axis is reduced (unless
    ``noop_with_empty_axes=1``: then nothing is). ``keepdims`` only shapes the output, which
    holds the same ``N * C`` values either way.

    ``counts`` is the divisor of the one output pixel: ``H * W`` for a mean, 1 for a sum
    (the sum is an average with divisor 1); None for a maximum.

    Raises
    ------
    ValueError
        Axes other than exactly the spatial ones (named in the message), an axes input
        before the version that has it, an input that is not an image.
    """
    name = _name(op, version, REDUCE_ATTRIBUTES)
    _check_attrs(name, attrs, REDUCE_ATTRIBUTES[(op, version)])
    in_shape = _shape(name, "input shape", in_shape)
    rank = len(in_shape)
    spatial = tuple(range(2, rank))
    what = (f"only the spatial axes {list(spatial)} of an (N, C, ...) image (a global "
            f"pooling)" if rank in (3, 4) else
            "only the spatial axes of an (N, C, W) or (N, C, H, W) image (a global pooling)")
    if version >= REDUCE_AXES_INPUT[op]:
        noop = _flag(name, "noop_with_empty_axes", attrs.get("noop_with_empty_axes", 0))
    else:
        if axes is not None:
            raise ValueError(f"{name}: axes is an attribute, not an input")
        axes, noop = attrs.get("axes"), False
    axes = () if axes is None else _ints(name, "axes", np.asarray(axes).reshape(-1))
    if not axes:
        if noop:
            raise ValueError(f"{name}: noop_with_empty_axes=1 with no axes (an identity) is "
                             f"unsupported; {what}")
        axes = tuple(range(rank))
    norm = tuple(sorted(a + rank if a < 0 else a for a in axes))
    if rank not in (3, 4) or norm != spatial:
        raise ValueError(f"{name}: axes={list(axes)} of a rank-{rank} input is unsupported; "
                         f"{what}")
    _flag(name, "keepdims", attrs.get("keepdims", 1))
    kernel = _to_2d(in_shape[2:], 1)
    counts = None if op == "ReduceMax" else np.full(
        (1, 1), kernel[0] * kernel[1] if op == "ReduceMean" else 1, dtype=np.int64)
    return PoolGeometry(kernel, (1, 1), (1, 1), (0, 0, 0, 0), False, counts, (1, 1))
