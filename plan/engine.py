"""The layer-sequential engine's program: a dataflow's layers run one after another on one
multiply-accumulate unit (:class:`onnx2fpga.hw.engine.LayerEngine`), for devices too small
for a core per layer (the iCE40 UP5K: 5,280 LUTs and 8 DSPs against a DS-CNN's 12 layers).

Every layer the engine runs is a convolution in the NCHW sense of the golden model
(:func:`onnx2fpga.sim.golden.conv`): a dense layer is a 1x1 convolution of a 1x1 image, a
depthwise one reads input channel ``o`` for output channel ``o``, an average pool is a
depthwise convolution whose weights are all 1 (``unit``, none stored). Activations live in
two byte buffers in C order (``c * H * W + h * W + w``), the layers reading one and writing
the other in turn; a view (a reshape in C order) moves nothing.

The weight image is 16-bit words, per layer and output channel a record::

    bias (2 words, int32), multiplier (2 words, int32), offset (3 words, int48),
    weights (cin_per_group * kh * kw bytes, two per word, the first in the low byte)

The output channel loop is the outermost, so each record is read once per channel for its
header and once per output pixel for its weights, and a channel's output pixels are
requantized with one multiplier.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..ir import ConvLayer, Dataflow, DenseLayer, PoolLayer, RequantStage, ViewLayer
from .spram import SPRAM_WORDS, SpramSlot, weight_image

__all__ = ["EngineLayer", "EngineProgram", "EngineError", "engine_program", "HEADER_WORDS",
           "ENGINE_ROUNDINGS", "requant_cycles", "layer_requant_cycles", "layer_cycles",
           "engine_cycles", "engine_slot", "engine_image", "ENGINE_SPRAMS", "ARCHITECTURES"]

#: Compile's ``architecture``: ``"auto"`` (a core per layer, the engine when no folding fits
#: the board), ``"dataflow"`` (never the engine), ``"engine"`` (always).
ARCHITECTURES = ("auto", "dataflow", "engine")
#: SPRAMs the engine takes with its weights in SPRAM (the weight records, two activations).
ENGINE_SPRAMS = 3
#: 16-bit words of a record's header (bias, multiplier, offset).
HEADER_WORDS = 7
#: The requantizations the engine computes (see :class:`~onnx2fpga.ir.RequantStage`).
ENGINE_ROUNDINGS = ("half_even", "float32")
#: Multiplier magnitude bits the serial requantizer takes.
MULT_BITS = 32
#: Offset bits (signed) of a record.
OFFSET_BITS = 48
#: Bits of the accumulator (signed).
ACC_BITS = 32


@dataclass(frozen=True)
class EngineLayer:
    """One layer of an :class:`EngineProgram` (see the module docstring)."""
    name: str
    in_c: int
    in_h: int
    in_w: int
    out_c: int
    out_h: int
    out_w: int
    kh: int
    kw: int
    sh: int
    sw: int
    top: int
    left: int
    depthwise: bool
    unit: bool
    max_pool: bool
    in_signed: bool
    in_zero_point: int
    out_signed: bool
    zero_point: int
    lo: int
    hi: int
    shift: int
    float32: bool
    record_base: int
    record_words: int

    @property
    def cin_group(self) -> int:
        """Input channels per output channel."""
        return 1 if self.depthwise else self.in_c

    @property
    def taps(self) -> int:
        """Products per output value."""
        return self.cin_group * self.kh * self.kw

    @property
    def in_size(self) -> int:
        return self.in_c * self.in_h * self.in_w

    @property
    def out_size(self) -> int:
        return self.out_c * self.out_h * self.out_w


@dataclass(frozen=True)
class EngineProgram:
    """The layers, in order, and the weight image (``uint16`` words)."""
    layers: tuple
    image: np.ndarray
    in_size: int
    out_size: int

    @property
    def buffer_bytes(self) -> int:
        """Bytes each activation buffer holds: the largest tensor but the last (streamed)."""
        sizes = [self.in_size] + [ly.out_size for ly in self.layers[:-1]]
        return max(sizes)


class EngineError(ValueError):
    """A dataflow the engine cannot run; the message names the layer and what is wrong."""


def _stage(layer):
    stages = getattr(layer, "requant", None) or []
    if isinstance(layer, PoolLayer) and layer.op == "max":
        if not stages:       # no change of scale: y = x, as an identity stage
            t = layer.in_type
            return RequantStage([1], [0], 0, layer.in_zero_point, t.lo, t.hi, t)
        if stages[0].in_zero_point == layer.in_zero_point:   # the engine centres x itself
            stages = [dataclasses.replace(stages[0], in_zero_point=0)]
    if len(stages) != 1:
        raise EngineError(f"Layer {layer.name!r}: the engine takes exactly one "
                          f"requantization stage, not {len(stages)}")
    st = stages[0]
    if st.rounding not in ENGINE_ROUNDINGS:
        raise EngineError(f"Layer {layer.name!r}: rounding {st.rounding!r} is not supported "
                          f"by the engine (supported: {', '.join(ENGINE_ROUNDINGS)})")
    if st.neg_multiplier is not None or st.in_zero_point != 0:
        raise EngineError(f"Layer {layer.name!r}: a stage with a negative side or an input "
                          f"zero point is not supported by the engine")
    if st.out_type.bits > 8:
        raise EngineError(f"Layer {layer.name!r}: {st.out_type.name} output; the engine "
                          f"stores 8-bit activations")
    return st


def _per_channel(values, channels: int, what: str, name: str) -> np.ndarray:
    a = np.asarray(values, np.int64)
    if a.size == 1:
        return np.full(channels, int(a.reshape(-1)[0]), np.int64)
    a = a.reshape(-1) if a.ndim == 1 or a.shape[1:] == (1,) * (a.ndim - 1) else None
    if a is None or a.size != channels:
        raise EngineError(f"Layer {name!r}: {what} per pixel; the engine takes them per "
                          f"channel")
    return a


def _words(value: int, n: int) -> list[int]:
    v = int(value) & ((1 << (16 * n)) - 1)
    return [(v >> (16 * k)) & 0xFFFF for k in range(n)]


def engine_program(dataflow: Dataflow) -> EngineProgram:
    """The engine's program for ``dataflow``: its layers in order, each reading the
    previous one's output (views skipped).

    Raises
    ------
    EngineError
        Naming the first layer the engine cannot run and why.
    """
    layers, image = [], []
    current = dataflow.input.name
    size = int(np.prod(dataflow.input.shape[1:]))
    if dataflow.input.type.bits > 8:
        raise EngineError(f"Input {dataflow.input.name!r}: {dataflow.input.type.name}; the "
                          f"engine stores 8-bit activations")
    for layer in dataflow.layers:
        if list(layer.inputs) != [current]:
            raise EngineError(f"Layer {layer.name!r}: the engine runs a chain of layers, "
                              f"each reading the one before")
        current = layer.output
        if isinstance(layer, ViewLayer):
            if layer.perm is not None and list(layer.perm) != sorted(layer.perm):
                raise EngineError(f"Layer {layer.name!r}: a transpose; the engine moves no "
                                  f"data for a view")
            continue
        ly, recs = _layer(layer, len(image))
        image += recs
        layers.append(ly)
    if current != dataflow.output.name or not layers:
        raise EngineError("The engine's layers do not end in the dataflow's output")
    if layers[0].in_size != size:
        raise EngineError(f"Layer {layers[0].name!r} reads {layers[0].in_size} values; the "
                          f"input has {size}")
    program = EngineProgram(tuple(layers), np.asarray(image, np.uint16), size,
                            layers[-1].out_size)
    if len(image) > SPRAM_WORDS:
        raise EngineError(f"The engine's weight records take {len(image):,} words of 16 "
                          f"bits; it holds {SPRAM_WORDS:,} (one SPRAM)")
    if (program.buffer_bytes + 1) // 2 > SPRAM_WORDS:
        raise EngineError(f"An activation of {program.buffer_bytes:,} bytes does not fit "
                          f"the engine's buffers ({2 * SPRAM_WORDS:,} bytes: one SPRAM)")
    return program


def engine_slot(program: EngineProgram) -> SpramSlot:
    """The one SPRAM the weight records take (:mod:`onnx2fpga.plan.spram`'s layout)."""
    return SpramSlot("engine", 0, 1, 16, max(len(program.image), 1))


def engine_image(program: EngineProgram) -> bytes:
    """The flash image of the weight records (:func:`~onnx2fpga.plan.spram.weight_image`)."""
    return weight_image([engine_slot(program)], [[int(w) for w in program.image]])


def _layer(layer, base: int):
    name = layer.name
    if isinstance(layer, DenseLayer):
        w = layer.weight.reshape(layer.weight.shape[0], -1, 1, 1)
        geo = dict(in_c=w.shape[1], in_h=1, in_w=1, kh=1, kw=1, sh=1, sw=1, top=0, left=0,
                   depthwise=False, unit=False, max_pool=False)
        in_type, zp_in, bias, wtype = layer.in_type, layer.in_zero_point, layer.bias, \
            layer.weight_type
    elif isinstance(layer, ConvLayer):
        c, h, wd = (layer.in_shape if len(layer.in_shape) == 3 else
                    (layer.in_shape[0], 1, layer.in_shape[1]))
        if tuple(layer.dilation) != (1, 1):
            raise EngineError(f"Layer {name!r}: dilation {tuple(layer.dilation)}; the engine "
                              f"takes 1")
        depthwise = layer.group == c == layer.weight.shape[0] and layer.group > 1
        if layer.group != 1 and not depthwise:
            raise EngineError(f"Layer {name!r}: a grouped convolution ({layer.group} groups) "
                              f"that is not depthwise")
        w = layer.weight
        geo = dict(in_c=c, in_h=h, in_w=wd, kh=w.shape[2], kw=w.shape[3],
                   sh=layer.stride[0], sw=layer.stride[1], top=layer.pads[0],
                   left=layer.pads[1], depthwise=depthwise, unit=False, max_pool=False)
        in_type, zp_in, bias, wtype = layer.in_type, layer.in_zero_point, layer.bias, \
            layer.weight_type
    elif isinstance(layer, PoolLayer):
        c, h, wd = layer.image
        if tuple(layer.dilation) != (1, 1):
            raise EngineError(f"Layer {name!r}: dilation {tuple(layer.dilation)}; the engine "
                              f"takes 1")
        w = np.ones((c, 1) + tuple(layer.kernel), np.int64)
        geo = dict(in_c=c, in_h=h, in_w=wd, kh=layer.kernel[0], kw=layer.kernel[1],
                   sh=layer.stride[0], sw=layer.stride[1], top=layer.pads[0],
                   left=layer.pads[1], depthwise=True, unit=True,
                   max_pool=layer.op == "max")
        in_type, zp_in, bias, wtype = layer.in_type, layer.in_zero_point, np.zeros(c), None
    else:
        raise EngineError(f"Layer {name!r}: a {layer.kind} layer"
                          f"{' (' + layer.op + ')' if hasattr(layer, 'op') else ''} is not "
                          f"supported by the engine (supported: conv, depthwise conv, dense, "
                          f"average and max pools, views)")
    if in_type.bits > 8:
        raise EngineError(f"Layer {name!r}: {in_type.name} input; the engine takes 8 bits")
    if wtype is not None and (wtype.bits > 8 or not wtype.signed and wtype.bits == 8):
        raise EngineError(f"Layer {name!r}: {wtype.name} weights; the engine takes int8")
    st = _stage(layer)
    oc = w.shape[0]
    mult = _per_channel(st.multiplier, oc, "multipliers", name)
    off = _per_channel(st.offset, oc, "offsets", name)
    if np.abs(mult).max(initial=0) >= 1 << (MULT_BITS - 1):
        raise EngineError(f"Layer {name!r}: multipliers of more than {MULT_BITS - 1} bits")
    if np.abs(off).max(initial=0) >= 1 << (OFFSET_BITS - 1):
        raise EngineError(f"Layer {name!r}: offsets of more than {OFFSET_BITS - 1} bits")
    bias = np.asarray(bias, np.int64).reshape(-1)
    if np.abs(bias).max(initial=0) >= 1 << (ACC_BITS - 2):
        raise EngineError(f"Layer {name!r}: a bias of more than {ACC_BITS - 2} bits")
    oh = (geo["in_h"] + geo["top"] + _bottom(layer) - geo["kh"]) // geo["sh"] + 1
    ow = (geo["in_w"] + geo["left"] + _right(layer) - geo["kw"]) // geo["sw"] + 1
    taps = (1 if geo["depthwise"] else geo["in_c"]) * geo["kh"] * geo["kw"]
    wwords = 0 if geo["unit"] else (taps + 1) // 2
    rec = HEADER_WORDS + wwords
    words = []
    for o in range(oc):
        words += _words(bias[o], 2) + _words(mult[o], 2) + _words(off[o], 3)
        if not geo["unit"]:
            b = (np.asarray(w[o], np.int64).reshape(-1) & 0xFF).tolist() + [0]
            words += [b[2 * k] | (b[2 * k + 1] << 8) for k in range(wwords)]
    ly = EngineLayer(name=name, out_c=oc, out_h=oh, out_w=ow, in_signed=in_type.signed,
                     in_zero_point=int(zp_in), out_signed=st.out_type.signed,
                     zero_point=int(st.zero_point), lo=int(st.lo), hi=int(st.hi),
                     shift=int(st.shift), float32=st.rounding == "float32",
                     record_base=base, record_words=rec, **geo)
    return ly, words


def _bottom(layer) -> int:
    return layer.pads[2] if isinstance(layer, (ConvLayer, PoolLayer)) else 0


def _right(layer) -> int:
    return layer.pads[3] if isinstance(layer, (ConvLayer, PoolLayer)) else 0


def _round_steps(bits: int) -> tuple[int, int]:
    """Steps of the serial requantizer's rounding to 24 significant bits of a value of
    ``bits`` bits (4 bits a step while it has 28 or more, then 1), and the bits it drops."""
    steps = dropped = 0
    while bits > 24:
        n = 4 if bits >= 28 else 1
        bits, steps, dropped = bits - n, steps + 1, dropped + n
    return steps, dropped


def _shift_steps(left: int) -> int:
    """Steps of the final shift by ``left`` bits (right by 4, then by 1; left by 1)."""
    return left // 4 + left % 4 if left >= 0 else -left


def requant_cycles(acc_bits: int, mult: int, shift: int, float32: bool) -> int:
    """Cycles from the serial requantizer's ``start`` to its ``done`` for an accumulator of
    at most ``acc_bits`` bits (magnitude) and multiplier ``mult``, without the hold
    (:func:`layer_requant_cycles`): the most over such accumulators."""
    bm = abs(int(mult)).bit_length()
    mul = (bm + 1) // 2 + 1
    if not float32:
        return 1 + 1 + mul + _shift_steps(shift) + 1 + 1
    worst = 0
    for bx in range(acc_bits + 1):
        s1, d1 = _round_steps(bx)
        ba_opts = {bx} if bx <= 24 else {24, 25}
        for ba in ba_opts:
            for bp in {0, max(ba + bm - 1, 0), ba + bm}:
                s2, d2 = _round_steps(bp)
                c = 1 + (s1 + 1) + mul + (s2 + 1) + _shift_steps(shift - d1 - d2) + 1
                worst = max(worst, c + 1)
    return worst


def layer_requant_cycles(layer: EngineLayer, image) -> int:
    """The requantizer's fixed duration in ``layer`` (start to done): the most
    :func:`requant_cycles` over its channels, their accumulators bounded by the bias and the
    weights' magnitudes times the largest input value. The hardware holds every result to
    it, so that the cycles do not depend on the data."""
    image = np.asarray(image, np.int64)
    xmax = max(abs(lo - layer.in_zero_point) for lo in
               ((-128, 127) if layer.in_signed else (0, 255)))
    worst = 0
    for o in range(layer.out_c):
        base = layer.record_base + o * layer.record_words
        h = [int(v) for v in image[base:base + HEADER_WORDS]]
        bias = _signed(h[0] | h[1] << 16, 32)
        mult = _signed(h[2] | h[3] << 16, 32)
        if layer.unit:
            wsum = layer.taps
        else:
            words = image[base + HEADER_WORDS:base + layer.record_words]
            b = np.stack([words & 0xFF, words >> 8], 1).reshape(-1)[:layer.taps]
            wsum = int(np.abs(np.where(b >= 128, b - 256, b)).sum())
        acc_bits = (abs(bias) + wsum * xmax).bit_length()
        worst = max(worst, requant_cycles(acc_bits, mult, layer.shift, layer.float32))
    return worst


def _signed(v: int, bits: int) -> int:
    return v - (1 << bits) if v >> (bits - 1) else v


def layer_cycles(layer: EngineLayer, req: int) -> tuple[int, int]:
    """``(cycles, last)``: from the cycle ``layer`` starts (its ``LAYER`` state) to the
    cycle before the next layer's (or the next input's) start, and to its last value's
    requantization start, with requantizations of ``req`` cycles. Per output channel the
    header (8 cycles); per value its taps and 4 cycles, or ``req + 2`` when that is more
    (a requantization runs beside the next value's products)."""
    t, pixels = layer.taps, layer.out_h * layer.out_w
    step = max(t + 4, req + 2)
    h = t + 12                                   # the first value's requantization start
    h += (pixels - 1) * step
    for _ in range(layer.out_c - 1):
        h = max(h + t + 12, h + req + 2) + (pixels - 1) * step
    return h + req + 2, h


def engine_cycles(program: EngineProgram) -> dict:
    """The engine's cycle figures without stalls: ``cycles_per_inference`` (the input's
    transfers, every layer, the last value out; the next input is taken after it),
    ``latency_cycles`` (first input transfer to last output transfer), and per layer its
    ``cycles`` and requantization ``req_cycles``."""
    layers = []
    total = program.in_size
    for ly in program.layers:
        req = layer_requant_cycles(ly, program.image)
        cyc, _ = layer_cycles(ly, req)
        layers.append({"name": ly.name, "cycles": cyc, "req_cycles": req})
        total += cyc + 1
    return {"cycles_per_inference": total, "latency_cycles": total - 2, "layers": layers}
