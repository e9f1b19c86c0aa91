"""The layers of a dataflow: one dataclass per layer kind, plain data only."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .stages import RequantStage
from .types import IntType, acc_type_for

__all__ = [
    "DenseLayer", "RequantLayer", "ConvLayer", "PoolLayer", "AddLayer", "ConcatLayer",
    "ResizeLayer", "PadLayer", "ViewLayer", "SliceLayer", "LAYER_TYPES", "MULTIPLIERS",
    "product_mapping", "image_shape", "align_params", "window_out_size", "JOIN_OPS",
]




#: How a layer's products are built (``multipliers`` of :class:`DenseLayer` and
#: :class:`ConvLayer`): ``"dsp"``, a hard multiplier for every product wider than
#: :data:`onnx2fpga.hw.arith.LUT_PRODUCT_MAX_BITS` bits where the device has them (the
#: narrower ones in LUTs); ``"lut"``, every product in LUTs (sums of the input's multiples
#: picked by the weights' digits), no hard multiplier; ``"adders"``, the weights as
#: constants: the whole matrix an adder graph of shifted inputs with common subexpressions
#: shared, one vector per cycle (``simd`` and ``pe`` then the whole matrix), the
#: requantization folded in where it can be (:mod:`onnx2fpga.plan.cmvm`). Same values
#: either way.
MULTIPLIERS = ("dsp", "lut", "adders")


def product_mapping(layer) -> str | None:
    """How ``layer`` builds its products, one of :data:`MULTIPLIERS`; None for a layer
    without a multiplier array (an :class:`AddLayer`'s ``multipliers`` are its
    requantization's)."""
    return layer.multipliers if isinstance(layer, (DenseLayer, ConvLayer)) else None


def _check_multipliers(layer) -> None:
    if layer.multipliers not in MULTIPLIERS:
        raise ValueError(f"Layer {layer.name!r}: multipliers must be one of {MULTIPLIERS}, "
                         f"not {layer.multipliers!r}")


def _check_bipolar(layer) -> None:
    if not isinstance(layer.in_bipolar, (bool, np.bool_)):
        raise TypeError(f"in_bipolar of layer {layer.name!r} must be a bool, "
                        f"not {layer.in_bipolar!r}")
    layer.in_bipolar = bool(layer.in_bipolar)
    if layer.in_bipolar and not (layer.in_type.signed and layer.in_type.bits >= 2):
        raise ValueError(f"Layer {layer.name!r}: bipolar inputs need a signed input type of "
                         f"at least 2 bits, not {layer.in_type.name}")


def _prod(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


class _Lanes:
    """A layer that moves ``lanes`` elements per transfer on both sides."""

    @property
    def in_lanes(self) -> int:
        return self.lanes

    @property
    def out_lanes(self) -> int:
        return self.lanes


class _OneInput:
    """A layer reading one tensor of logical shape ``in_shape``."""

    @property
    def in_size(self) -> int:
        return _prod(self.in_shape)

    @property
    def out_size(self) -> int:
        return _prod(self.out_shape)

    @property
    def in_shapes(self) -> list[tuple]:
        return [tuple(self.in_shape)]


@dataclass
class DenseLayer:
    """A fully connected layer with requantization: the matrix-vector core.

    ``acc[o] = sum_i (x[i] - in_zero_point) * weight[o, i] + bias[o]``, then every stage of
    ``requant`` in order. ``simd`` input elements and ``pe`` output channels are processed per
    cycle; ``in_features % simd == 0`` and ``out_features % pe == 0``. ``multipliers``: how
    the products are built, one of :data:`MULTIPLIERS` (folding for a board may move a layer
    to ``"lut"`` when the device's hard multipliers run out).

    ``in_bipolar``: every input value is -1 or +1 (the raw integers, before the zero point
    is subtracted; the producer is a bipolar quantizer or a threshold stage with outputs
    -1 and +1, and ``in_type`` is signed, ``int2``). Set by the frontend; the golden model
    does not read it (the values say it), the hardware does: with weights of -1 and +1
    too, the matrix-vector unit computes by XNOR and popcount
    (:func:`onnx2fpga.plan.graph.matvec_arithmetic`). An input outside {-1, +1} then gives
    wrong results.
    """
    name: str
    in_type: IntType
    in_zero_point: int
    weight: np.ndarray
    weight_type: IntType
    bias: np.ndarray
    requant: list[RequantStage]
    simd: int = 1
    pe: int = 1
    nodes: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    output: str = ""
    in_bipolar: bool = False
    multipliers: str = "dsp"

    kind = "dense"

    def __post_init__(self):
        self.weight = np.asarray(self.weight, dtype=np.int64)
        self.bias = np.asarray(self.bias, dtype=np.int64).reshape(-1)
        if self.weight.ndim != 2:
            raise ValueError(f"Weight of layer {self.name!r} must be 2-D, not {self.weight.shape}")
        if self.bias.shape != (self.out_features,):
            raise ValueError(f"Bias of layer {self.name!r} must have shape "
                             f"({self.out_features},), not {self.bias.shape}")
        _check_bipolar(self)
        _check_multipliers(self)

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[1])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def in_size(self) -> int:
        return self.in_features

    @property
    def out_size(self) -> int:
        return self.out_features

    @property
    def in_shapes(self) -> list[tuple]:
        return [(self.in_features,)]

    @property
    def out_shape(self) -> tuple:
        return (self.out_features,)

    @property
    def out_type(self) -> IntType:
        return self.requant[-1].out_type if self.requant else self.acc_type

    @property
    def in_lanes(self) -> int:
        return self.simd

    @property
    def out_lanes(self) -> int:
        return self.pe

    @property
    def folded_bias(self) -> np.ndarray:
        """Bias with the input zero point folded in: ``acc = x @ weight.T + folded_bias``."""
        return self.bias - self.in_zero_point * self.weight.sum(axis=1)

    @property
    def acc_type(self) -> IntType:
        """Exact accumulator type of ``x @ weight.T + folded_bias`` over the input range."""
        return acc_type_for(self.weight, self.folded_bias, self.in_type)

    @property
    def cycles(self) -> int:
        """Cycles per input vector in steady state."""
        return (self.in_features // self.simd) * (self.out_features // self.pe)


@dataclass
class RequantLayer(_Lanes):
    """An elementwise requantization layer (a ReLU, LeakyRelu, BatchNormalization or any
    per-channel affine map on integers).

    ``shape`` is the logical tensor shape (``(channels,)`` when omitted); ``channels`` its
    size. Stage parameters are aligned on the left with ``shape`` (per channel of an image,
    per element of a vector).
    """
    name: str
    in_type: IntType
    channels: int
    requant: list[RequantStage]
    lanes: int = 1
    nodes: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    output: str = ""
    shape: tuple = ()

    kind = "requant"

    def __post_init__(self):
        self.shape = tuple(int(d) for d in self.shape) or (int(self.channels),)
        if _prod(self.shape) != self.channels:
            raise ValueError(f"Layer {self.name!r}: shape {self.shape} does not hold "
                             f"{self.channels} elements")

    @property
    def in_size(self) -> int:
        return self.channels

    @property
    def out_size(self) -> int:
        return self.channels

    @property
    def in_shapes(self) -> list[tuple]:
        return [self.shape]

    @property
    def out_shape(self) -> tuple:
        return self.shape

    @property
    def out_type(self) -> IntType:
        return self.requant[-1].out_type

    @property
    def cycles(self) -> int:
        return self.channels // self.lanes


def image_shape(shape) -> tuple[int, int, int]:
    """``(C, H, W)`` of a logical image shape: ``(C, H, W)`` itself, ``(C, W)`` as
    ``(C, 1, W)`` (1-D), ``(C,)`` as ``(C, 1, 1)``."""
    shape = tuple(int(d) for d in shape)
    if len(shape) == 3:
        return shape
    if len(shape) == 2:
        return (shape[0], 1, shape[1])
    if len(shape) == 1:
        return (shape[0], 1, 1)
    raise ValueError(f"An image must have 1 to 3 dimensions (C, H, W), not {shape}")


def align_params(param: np.ndarray, ndim: int) -> np.ndarray:
    """``param`` reshaped to broadcast against a logical tensor of ``ndim`` dimensions,
    aligned on the left (see the module docstring)."""
    param = np.asarray(param)
    if param.size == 1:
        return param.reshape(())
    if param.ndim > ndim:
        raise ValueError(f"Parameters of shape {param.shape} do not align with {ndim} "
                         f"dimensions")
    return param.reshape(param.shape + (1,) * (ndim - param.ndim))


def _check_geometry(name, kernel, stride, dilation, pads):
    for what, v, n in (("kernel", kernel, 2), ("stride", stride, 2),
                       ("dilation", dilation, 2), ("pads", pads, 4)):
        if len(v) != n or any(int(d) != d for d in v):
            raise ValueError(f"Layer {name!r}: {what} must be {n} integers, not {v!r}")
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(pads) < 0:
        raise ValueError(f"Layer {name!r}: kernel {kernel}, stride {stride}, dilation "
                         f"{dilation} must be positive and pads {pads} not negative")


def window_out_size(size: int, kernel: int, stride: int, dilation: int, before: int,
                    after: int) -> int:
    """Output size of a sliding window along one axis (ONNX Conv/Pool, floor mode; ceil
    mode is a larger ``after`` pad)."""
    return (size + before + after - (kernel - 1) * dilation - 1) // stride + 1


class _Windowed(_OneInput):
    """Shared geometry of layers with a sliding window over a ``(C, H, W)`` image."""

    @property
    def image(self) -> tuple[int, int, int]:
        """The input as ``(C, H, W)``."""
        return image_shape(self.in_shape)

    @property
    def out_hw(self) -> tuple[int, int]:
        _, h, w = self.image
        top, left, bottom, right = self.pads
        return (window_out_size(h, self.kernel[0], self.stride[0], self.dilation[0], top,
                                bottom),
                window_out_size(w, self.kernel[1], self.stride[1], self.dilation[1], left,
                                right))

    def _out_shape(self, channels: int) -> tuple:
        oh, ow = self.out_hw
        if len(self.in_shape) == 3:
            return (channels, oh, ow)
        if len(self.in_shape) == 2:
            return (channels, ow)
        return (channels,)


@dataclass
class ConvLayer(_Windowed):
    """A convolution with requantization (ONNX Conv on integers, NCHW)::

        acc[o, y, x] = bias[o] + sum over c in the group of o, i < kh, j < kw of
            (xp[c, y*sh + i*dh, x*sw + j*dw] - in_zero_point) * weight[o, c % (C/group), i, j]

    where ``xp`` is the input padded with ``in_zero_point`` by ``pads`` = ``(top, left,
    bottom, right)`` (so that padding contributes zero), then every stage of ``requant``
    (parameters per output channel). ``in_shape`` is ``(C, H, W)`` or ``(C, W)`` for a 1-D
    convolution (then ``kernel[0] == 1``, ``top == bottom == 0``); ``weight`` is always
    ``(OC, C // group, kh, kw)``.

    Folding: ``lanes`` input channels per transfer through the sliding window; a dense
    convolution then runs on a matrix-vector unit with ``simd`` window elements and ``pe``
    output channels per cycle; a depthwise one (``group == C == OC``) computes ``lanes``
    channels per cycle. ``multipliers``: as for :class:`DenseLayer`.

    ``in_bipolar``: every input value is -1 or +1, as for :class:`DenseLayer` (padding
    holds ``in_zero_point``: the matrix unit takes the XNOR form only without padding or
    with a zero point of -1 or +1).
    """
    name: str
    in_type: IntType
    in_zero_point: int
    in_shape: tuple
    weight: np.ndarray
    weight_type: IntType
    bias: np.ndarray
    requant: list[RequantStage]
    stride: tuple = (1, 1)
    dilation: tuple = (1, 1)
    pads: tuple = (0, 0, 0, 0)
    group: int = 1
    lanes: int = 1
    simd: int = 1
    pe: int = 1
    nodes: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    output: str = ""
    in_bipolar: bool = False
    multipliers: str = "dsp"

    kind = "conv"

    def __post_init__(self):
        self.weight = np.asarray(self.weight, dtype=np.int64)
        self.bias = np.asarray(self.bias, dtype=np.int64).reshape(-1)
        self.in_shape = tuple(int(d) for d in self.in_shape)
        self.stride, self.dilation = tuple(self.stride), tuple(self.dilation)
        self.pads = tuple(int(p) for p in self.pads)
        if self.weight.ndim != 4:
            raise ValueError(f"Weight of layer {self.name!r} must be (OC, C/group, kh, kw), "
                             f"not {self.weight.shape}")
        _check_geometry(self.name, self.kernel, self.stride, self.dilation, self.pads)
        c = self.image[0]
        if self.group < 1 or c % self.group or self.out_channels % self.group or \
                self.weight.shape[1] * self.group != c:
            raise ValueError(f"Layer {self.name!r}: weight {self.weight.shape} and group="
                             f"{self.group} do not fit {c} input channels")
        if self.bias.shape != (self.out_channels,):
            raise ValueError(f"Bias of layer {self.name!r} must have shape "
                             f"({self.out_channels},), not {self.bias.shape}")
        _check_bipolar(self)
        _check_multipliers(self)
        if min(self.out_hw) < 1:
            raise ValueError(f"Layer {self.name!r}: the output would be empty "
                             f"({self.out_hw})")

    @property
    def kernel(self) -> tuple[int, int]:
        return (int(self.weight.shape[2]), int(self.weight.shape[3]))

    @property
    def out_channels(self) -> int:
        return int(self.weight.shape[0])

    @property
    def depthwise(self) -> bool:
        """One input channel per output channel and group (``group == C == OC``)."""
        return self.group > 1 and self.group == self.image[0] == self.out_channels

    @property
    def out_shape(self) -> tuple:
        return self._out_shape(self.out_channels)

    @property
    def out_type(self) -> IntType:
        return self.requant[-1].out_type if self.requant else self.acc_type

    @property
    def matrix(self) -> np.ndarray:
        """The weights as the matrix a matrix-vector unit multiplies with the window vector:
        ``(OC, kh * kw * C)``, columns in the window's stream order ``(i, j, c)``; zero
        outside a channel's group (a grouped convolution that is not depthwise)."""
        oc, cg, kh, kw = self.weight.shape
        c = self.image[0]
        full = np.zeros((oc, c, kh, kw), dtype=np.int64)
        per = oc // self.group
        for o in range(oc):
            g = o // per
            full[o, g * cg:(g + 1) * cg] = self.weight[o]
        return full.transpose(0, 2, 3, 1).reshape(oc, kh * kw * c)

    @property
    def acc_type(self) -> IntType:
        """Exact accumulator type over the input range, padding included."""
        w = self.weight.reshape(self.out_channels, -1)
        bias = self.bias - self.in_zero_point * w.sum(axis=1)
        return acc_type_for(w, bias, self.in_type)

    @property
    def in_lanes(self) -> int:
        return self.lanes

    @property
    def out_lanes(self) -> int:
        return self.lanes if self.depthwise else self.pe


@dataclass
class PoolLayer(_Windowed, _Lanes):
    """A pooling layer over a ``(C, H, W)`` (or ``(C, W)``) image (ONNX MaxPool, AveragePool,
    GlobalMaxPool, GlobalAveragePool on integers).

    ``op="max"``: the maximum of the window, padding excluded (it never wins: padding
    positions take ``in_type.lo``); then ``requant`` if any (a change of scale).
    ``op="avg"``: ``sum over the window of (x - in_zero_point)``, padding positions counting
    zero, then ``requant``, whose multipliers divide by the window count (per pixel,
    parameters of shape ``(1, OH, OW)``, where ``count_include_pad=0`` makes the count vary
    at the borders). A global pool is a window as large as the image.
    """
    name: str
    op: str
    in_type: IntType
    in_shape: tuple
    kernel: tuple
    stride: tuple = (1, 1)
    dilation: tuple = (1, 1)
    pads: tuple = (0, 0, 0, 0)
    in_zero_point: int = 0
    requant: list[RequantStage] = field(default_factory=list)
    lanes: int = 1
    nodes: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    output: str = ""

    kind = "pool"

    def __post_init__(self):
        self.in_shape = tuple(int(d) for d in self.in_shape)
        self.kernel, self.stride = tuple(self.kernel), tuple(self.stride)
        self.dilation, self.pads = tuple(self.dilation), tuple(int(p) for p in self.pads)
        if self.op not in ("max", "avg"):
            raise ValueError(f"Layer {self.name!r}: op must be 'max' or 'avg', not {self.op!r}")
        _check_geometry(self.name, self.kernel, self.stride, self.dilation, self.pads)
        if self.op == "avg" and not self.requant:
            raise ValueError(f"Layer {self.name!r}: an average needs a requantization stage "
                             f"(the division)")
        if min(self.out_hw) < 1:
            raise ValueError(f"Layer {self.name!r}: the output would be empty "
                             f"({self.out_hw})")

    @property
    def window(self) -> int:
        return int(self.kernel[0] * self.kernel[1])

    @property
    def is_global(self) -> bool:
        """The window is the whole image (no padding, one output pixel)."""
        _, h, w = self.image
        return tuple(self.kernel) == (h, w) and not any(self.pads)

    @property
    def sum_type(self) -> IntType:
        """Exact type of an average's window sum of ``x - in_zero_point``."""
        k = self.window
        return IntType.for_range(k * (self.in_type.lo - self.in_zero_point),
                                 k * (self.in_type.hi - self.in_zero_point))

    @property
    def out_shape(self) -> tuple:
        return self._out_shape(self.image[0])

    @property
    def out_type(self) -> IntType:
        return self.requant[-1].out_type if self.requant else self.in_type


#: The joins of two tensors an :class:`AddLayer` computes (its ``op``).
JOIN_OPS = ("add", "mul", "min", "max")


@dataclass
class AddLayer(_Lanes):
    """An elementwise join of two tensors of the same shape, requantized (ONNX Add, Sub,
    Mul, Min or Max of two quantized activations; a residual join). With the terms
    ``ta = (a - in_zero_points[0]) * multipliers[0]`` and
    ``tb = (b - in_zero_points[1]) * multipliers[1]``, ``v`` is, by ``op``:

    * ``"add"``: ``ta + tb`` (a Sub is an add with a negative ``multipliers[1]``);
    * ``"mul"``: ``ta * tb``;
    * ``"min"``, ``"max"``: ``min(ta, tb)``, ``max(ta, tb)``;

    then every stage of ``requant`` (for an add, a min or a max usually with multiplier 1:
    its offset, shift, zero point and clip finish the value on the terms' common scale; for
    a product, the multiplier of ``s_a * s_b / s_out``). ``multipliers`` are integers, or
    arrays aligned on the left with ``shape``.
    """
    name: str
    in_types: list[IntType]
    in_zero_points: list[int]
    shape: tuple
    multipliers: list
    requant: list[RequantStage]
    lanes: int = 1
    nodes: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    output: str = ""
    op: str = "add"

    kind = "add"

    def __post_init__(self):
        self.shape = tuple(int(d) for d in self.shape)
        self.in_zero_points = [int(z) for z in self.in_zero_points]
        self.multipliers = [np.atleast_1d(np.asarray(m, dtype=np.int64))
                            for m in self.multipliers]
        if len(self.in_types) != 2 or len(self.in_zero_points) != 2 or \
                len(self.multipliers) != 2:
            raise ValueError(f"Layer {self.name!r}: an add has two inputs")
        if self.op not in JOIN_OPS:
            raise ValueError(f"Layer {self.name!r}: op must be one of {JOIN_OPS}, "
                             f"not {self.op!r}")
        if not self.requant:
            raise ValueError(f"Layer {self.name!r}: an add needs a requantization stage")

    def term_ranges(self) -> list[tuple[int, int]]:
        """The smallest and largest value of ``ta`` and of ``tb``."""
        out = []
        for t, z, m in zip(self.in_types, self.in_zero_points, self.multipliers):
            ends = [int(mm) * (v - z) for mm in (int(m.min()), int(m.max()))
                    for v in (t.lo, t.hi)]
            out.append((min(ends), max(ends)))
        return out

    @property
    def sum_type(self) -> IntType:
        """Exact type of ``v`` (over the input types)."""
        (alo, ahi), (blo, bhi) = self.term_ranges()
        if self.op == "add":
            return IntType.for_range(alo + blo, ahi + bhi)
        if self.op == "mul":
            ends = [x * y for x in (alo, ahi) for y in (blo, bhi)]
            return IntType.for_range(min(ends), max(ends))
        if self.op == "max":
            return IntType.for_range(max(alo, blo), max(ahi, bhi))
        return IntType.for_range(min(alo, blo), min(ahi, bhi))

    @property
    def in_type(self) -> IntType:
        return self.in_types[0]

    @property
    def in_size(self) -> int:
        return _prod(self.shape)

    @property
    def out_size(self) -> int:
        return _prod(self.shape)

    @property
    def in_shapes(self) -> list[tuple]:
        return [self.shape, self.shape]

    @property
    def out_shape(self) -> tuple:
        return self.shape

    @property
    def out_type(self) -> IntType:
        return self.requant[-1].out_type


@dataclass
class ConcatLayer(_Lanes):
    """Tensors joined along logical ``axis`` (ONNX Concat; ``axis`` without the batch).

    Input ``k`` first goes through ``requant[k]`` (empty: values unchanged, they must fit
    ``out_type``), so that all inputs share the output's scale and zero point.
    """
    name: str
    in_types: list[IntType]
    in_shapes: list[tuple]
    axis: int
    out_type: IntType
    requant: list[list[RequantStage]]
    lanes: int = 1
    nodes: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    output: str = ""

    kind = "concat"

    def __post_init__(self):
        self.in_shapes = [tuple(int(d) for d in s) for s in self.in_shapes]
        n = len(self.in_shapes)
        if n < 1 or len(self.in_types) != n or len(self.requant) != n:
            raise ValueError(f"Layer {self.name!r}: one type and one stage list per input")
        rank = len(self.in_shapes[0])
        if not 0 <= self.axis < rank:
            raise ValueError(f"Layer {self.name!r}: axis {self.axis} outside rank {rank}")
        for s in self.in_shapes:
            if len(s) != rank or s[:self.axis] + s[self.axis + 1:] != \
                    self.in_shapes[0][:self.axis] + self.in_shapes[0][self.axis + 1:]:
                raise ValueError(f"Layer {self.name!r}: shapes {self.in_shapes} do not "
                                 f"concatenate along axis {self.axis}")

    @property
    def in_type(self) -> IntType:
        return self.in_types[0]

    @property
    def in_size(self) -> int:
        return sum(_prod(s) for s in self.in_shapes)

    @property
    def out_shape(self) -> tuple:
        s = list(self.in_shapes[0])
        s[self.axis] = sum(x[self.axis] for x in self.in_shapes)
        return tuple(s)

    @property
    def out_size(self) -> int:
        return _prod(self.out_shape)


@dataclass
class SliceLayer(_OneInput, _Lanes):
    """Channels ``start .. stop - 1`` of a tensor (ONNX Slice on the channel axis with step
    1, or one output of a Split on it): ``y = x[start:stop]`` along the first logical axis
    (the channels of a ``(C, H, W)`` or ``(C, W)`` image, the features of a vector)."""
    name: str
    in_type: IntType
    in_shape: tuple
    start: int
    stop: int
    lanes: int = 1
    nodes: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    output: str = ""

    kind = "slice"

    def __post_init__(self):
        self.in_shape = tuple(int(d) for d in self.in_shape)
        self.start, self.stop = int(self.start), int(self.stop)
        if not self.in_shape or not 0 <= self.start < self.stop <= self.in_shape[0]:
            raise ValueError(f"Layer {self.name!r}: channels {self.start}..{self.stop} are "
                             f"not a range of {self.in_shape}")

    @property
    def out_shape(self) -> tuple:
        return (self.stop - self.start,) + self.in_shape[1:]

    @property
    def out_type(self) -> IntType:
        return self.in_type


@dataclass
class ResizeLayer(_OneInput, _Lanes):
    """Nearest-neighbour resizing of a ``(C, H, W)`` (or ``(C, W)``) image (ONNX Resize /
    Upsample, ``mode="nearest"``): ``y[c, i, j] = x[c, rows[i], cols[j]]``, then ``requant``
    if any. The index maps follow from the operator's scales or sizes, coordinate
    transformation and nearest mode, resolved by the frontend; both must be non-decreasing.
    """
    name: str
    in_type: IntType
    in_shape: tuple
    rows: np.ndarray
    cols: np.ndarray
    requant: list[RequantStage] = field(default_factory=list)
    lanes: int = 1
    nodes: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    output: str = ""

    kind = "resize"

    def __post_init__(self):
        self.in_shape = tuple(int(d) for d in self.in_shape)
        self.rows = np.asarray(self.rows, dtype=np.int64).reshape(-1)
        self.cols = np.asarray(self.cols, dtype=np.int64).reshape(-1)
        _, h, w = image_shape(self.in_shape)
        for what, m, n in (("rows", self.rows, h), ("cols", self.cols, w)):
            if m.size < 1 or m.min() < 0 or m.max() >= n or np.any(np.diff(m) < 0):
                raise ValueError(f"Layer {self.name!r}: {what} must be non-decreasing "
                                 f"indices below {n}")

    @property
    def out_shape(self) -> tuple:
        c = self.in_shape[0]
        if len(self.in_shape) == 3:
            return (c, len(self.rows), len(self.cols))
        return (c, len(self.cols))

    @property
    def out_type(self) -> IntType:
        return self.requant[-1].out_type if self.requant else self.in_type


@dataclass
class PadLayer(_OneInput, _Lanes):
    """Constant padding of a ``(C, H, W)`` (or ``(C, W)``) image by ``pads = (top, left,
    bottom, right)`` with the integer ``value`` (ONNX Pad, ``mode="constant"``, that could not
    be merged into the padding of the following window)."""
    name: str
    in_type: IntType
    in_shape: tuple
    pads: tuple
    value: int
    lanes: int = 1
    nodes: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    output: str = ""

    kind = "pad"

    def __post_init__(self):
        self.in_shape = tuple(int(d) for d in self.in_shape)
        self.pads = tuple(int(p) for p in self.pads)
        if len(self.pads) != 4 or min(self.pads) < 0:
            raise ValueError(f"Layer {self.name!r}: pads must be four non-negative integers, "
                             f"not {self.pads}")
        if not self.in_type.lo <= self.value <= self.in_type.hi:
            raise ValueError(f"Layer {self.name!r}: pad value {self.value} outside "
                             f"{self.in_type.name}")

    @property
    def out_shape(self) -> tuple:
        c, h, w = image_shape(self.in_shape)
        top, left, bottom, right = self.pads
        if len(self.in_shape) == 3:
            return (c, h + top + bottom, w + left + right)
        return (c, w + left + right)

    @property
    def out_type(self) -> IntType:
        return self.in_type


@dataclass
class ViewLayer(_OneInput):
    """A change of logical shape that moves no data: ``y = x.transpose(perm).reshape(out)``
    (ONNX Reshape, Flatten, Squeeze, Unsqueeze: ``perm=None``; Transpose). In hardware it is
    wires: the stream keeps its element sequence, only the tensor's stream order changes."""
    name: str
    in_type: IntType
    in_shape: tuple
    out_shape: tuple
    perm: tuple | None = None
    nodes: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    output: str = ""

    kind = "view"

    def __post_init__(self):
        self.in_shape = tuple(int(d) for d in self.in_shape)
        self.out_shape = tuple(int(d) for d in self.out_shape)
        if self.perm is not None:
            self.perm = tuple(int(a) for a in self.perm)
            if sorted(self.perm) != list(range(len(self.in_shape))):
                raise ValueError(f"Layer {self.name!r}: perm {self.perm} is not a "
                                 f"permutation of {len(self.in_shape)} axes")
        if _prod(self.in_shape) != _prod(self.out_shape):
            raise ValueError(f"Layer {self.name!r}: cannot view {self.in_shape} as "
                             f"{self.out_shape}")

    @property
    def out_type(self) -> IntType:
        return self.in_type


LAYER_TYPES = (DenseLayer, RequantLayer, ConvLayer, PoolLayer, AddLayer, ConcatLayer,
               ResizeLayer, PadLayer, ViewLayer, SliceLayer)
