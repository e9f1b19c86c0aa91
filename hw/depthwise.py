"""Streaming depthwise convolution: the computing half of a depthwise ONNX Conv.

A depthwise convolution (``group == C == OC``) is a :class:`~onnx2fpga.hw.window.SlidingWindowCore`
followed by a :class:`DepthwiseCore`: per output pixel, the window core emits ``kh * kw`` window
positions of ``channels // lanes`` transfers each, and the depthwise core multiplies every
element by its channel's weight for that window position and sums per channel, ``lanes``
multiply-accumulates per cycle. The input zero point is folded into the bias by the caller
(padding carries the zero point, so ``sum_k (x - zp) * w = sum_k x * w - zp * sum_k w``); the
core sees raw values. Requantization follows in a :class:`~onnx2fpga.hw.requant.RequantCore`.

The cycle figures here follow the conventions of :mod:`onnx2fpga.plan.cost`.
"""

from __future__ import annotations

import numpy as np
from amaranth import C, Module, Mux, Shape, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..ir.layers import MULTIPLIERS
from ..plan.depthwise import depthwise_cycles, depthwise_latency, int_array
from ..plan.reduce import REGISTER_FOLDS_MAX, check_geometry, fold_storage
from .arith import ecp5_registered_product, is_ecp5, mult18x18d, product
from .blocks import (
    counter,
    int_shape,
    quiet_if_invalid,
    range_shape,
    shape_range,
    skid_output,
    wrap_incr,
)
from .chains import chain_sum, registered_pairs
from .reduce import partial_results

__all__ = ["DepthwiseCore"]

#: The products a depthwise core builds (of :data:`~onnx2fpga.ir.MULTIPLIERS`: not
#: ``"adders"``, a realization of whole matrices).
DEPTHWISE_MULTIPLIERS = tuple(m for m in MULTIPLIERS if m != "adders")


class DepthwiseCore(wiring.Component):
    """Per-channel weighted sum over a window, plus a bias: a depthwise convolution's
    accumulators.

    The input is a sequence of groups (output pixels) following each other without a gap or a
    ``last`` flag; the core counts. A group is ``window`` window positions ``k``, each of
    ``folds = channels // lanes`` transfers: lane ``j`` of transfer ``(k, cf)`` is element
    ``x[k, c]`` of the window of channel ``c = cf*lanes + j`` (the output order of
    :class:`~onnx2fpga.hw.window.SlidingWindowCore`). The group's output is ``folds``
    transfers, lane ``j`` of transfer ``cf`` being::

        y[c] = bias[c] + sum_k x[k, c] * weight[c, k]

    With ``weight = w.reshape(C, kh * kw)`` of an ONNX depthwise weight ``w`` of shape
    ``(C, 1, kh, kw)`` and ``bias = b - zp * weight.sum(1)``, that is
    :func:`onnx2fpga.sim.golden.conv` with ``group=C`` and input zero point ``zp``.

    Parameters
    ----------
    in_shape : IntType or Amaranth integer shape
        Element shape of the input.
    channels : int
        Channels per window position; a multiple of ``lanes``.
    window : int
        Window positions per group, at least 1 (``kh * kw``).
    weight : array of int, shape ``(channels, window)``
    bias : array of int, shape ``(channels,)``
    lanes : int
        Elements per transfer: multiply-accumulates per cycle.
    multipliers : str
        ``"dsp"``: a ``*`` (a hard multiplier) for products wider than
        :data:`~onnx2fpga.hw.arith.LUT_PRODUCT_MAX_BITS` bits; ``"lut"``: every product from
        shifted partial products in LUTs (:func:`~onnx2fpga.hw.arith.lut_product`).

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(in_shape, lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(out_shape, lanes)))``
        ``out_shape`` is the narrowest signed shape holding every ``y[c]`` over the input
        range (exact, never wraps; the shape ``dataflow.acc_type_for(weight, bias, in_type)``
        gives).

    Structure: three registers deep. Stage 1 is the input register, next to the weights of its
    window position and fold read from a ROM (:class:`~amaranth.lib.memory.Memory`,
    ``window * folds`` words of ``lanes`` weights in the narrowest shape holding them,
    addressed by the transfer's position within its group). Stage 2 holds the ``lanes``
    products. Then one read-modify-write of the partial sums of the product's fold per cycle,
    the first window position adding the bias (constants for one fold, else a ROM of one word
    per fold read one stage ahead); the partial sums of the ``folds`` folds are registers up to
    :data:`~onnx2fpga.hw.reduce.REGISTER_FOLDS_MAX` folds and a memory (block RAM, read one
    stage ahead) beyond, none for ``window == 1``. The sum of the last window position of a
    fold goes to the output register. :attr:`memory_bits` counts the weight and bias ROMs and
    the partial-sum memory.

    Timing: one input transfer per cycle; :attr:`cycles` (:func:`depthwise_cycles`)
    ``= window * folds`` cycles per group with full-rate input and an output that is never
    stalled; :attr:`latency` (:func:`depthwise_latency`) ``= window * folds + 2`` cycles from
    the first input transfer of a group to its last output transfer. While the output stalls,
    transfers of the first ``window - 1`` positions are still taken; one of the last position
    waits in stage 2 once the output register and its skid register are full
    (``i_stream.ready`` comes from registers only).
    """

    @classmethod
    def from_stage(cls, stage) -> DepthwiseCore:
        """The core of a ``"depthwise"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        p = stage.params
        return cls(stage.in_type, p["channels"], p["window"], p["weight"], p["bias"],
                   stage.in_lanes, multipliers=p.get("multipliers", "dsp"))

    @quiet_if_invalid
    def __init__(self, in_shape, channels, window, weight, bias, lanes=1, *,
                 multipliers="dsp"):
        if multipliers not in DEPTHWISE_MULTIPLIERS:
            raise ValueError(f"Multipliers must be one of {DEPTHWISE_MULTIPLIERS}, not "
                             f"{multipliers!r}")
        self._lut = multipliers == "lut"
        shape = int_shape(in_shape)
        channels, window, lanes = check_geometry(channels, window, lanes)
        weight = int_array("Weight", weight, (channels, window))
        bias = int_array("Bias", bias, (channels,))
        self._in_shape = shape
        self._channels = channels
        self._window = window
        self._lanes = lanes
        self._weight = weight
        self._bias = bias
        self._w_shape = range_shape(int(weight.min()), int(weight.max()))
        lo, hi = shape_range(shape)
        w = weight.astype(object)
        y_lo = (np.minimum(w * lo, w * hi).sum(axis=1) + bias.astype(object)).min()
        y_hi = (np.maximum(w * lo, w * hi).sum(axis=1) + bias.astype(object)).max()
        self._out_shape = signed(range_shape(min(int(y_lo), -1), max(int(y_hi), 0)).width)
        super().__init__({
            "i_stream": In(stream.Signature(data.ArrayLayout(shape, lanes))),
            "o_stream": Out(stream.Signature(data.ArrayLayout(self._out_shape, lanes))),
        })

    # -- Parameters and figures

    @property
    def in_shape(self) -> Shape:
        return self._in_shape

    @property
    def out_shape(self) -> Shape:
        """Element shape of the output: the narrowest signed shape holding every result."""
        return self._out_shape

    @property
    def weight_shape(self) -> Shape:
        """Element shape of the weight ROM: the narrowest holding every weight."""
        return self._w_shape

    @property
    def channels(self) -> int:
        return self._channels

    @property
    def window(self) -> int:
        return self._window

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def weight(self) -> np.ndarray:
        return self._weight.copy()

    @property
    def bias(self) -> np.ndarray:
        return self._bias.copy()

    @property
    def folds(self) -> int:
        """Transfers per window position and output transfers per group, ``channels // lanes``."""
        return self._channels // self._lanes

    @property
    def storage(self) -> str:
        """Where the partial sums live: ``"none"`` (``window == 1``), ``"registers"`` (up to
        :data:`~onnx2fpga.hw.reduce.REGISTER_FOLDS_MAX` folds) or ``"memory"``."""
        return fold_storage(self._window, self.folds, REGISTER_FOLDS_MAX)

    @property
    def weight_bits(self) -> int:
        """Bits of the weight ROM, ``window * channels * weight_shape.width``."""
        return self._window * self._channels * self._w_shape.width

    @property
    def bias_bits(self) -> int:
        """Bits of the bias ROM, ``channels * out_shape.width`` (0 for one fold: constants)."""
        return 0 if self.folds == 1 else self._channels * self._out_shape.width

    @property
    def storage_bits(self) -> int:
        """Bits of partial-sum storage, ``channels * out_shape.width`` (0 for ``window == 1``);
        a memory only when :attr:`storage` is ``"memory"``."""
        return 0 if self.storage == "none" else self._channels * self._out_shape.width

    @property
    def memory_bits(self) -> int:
        """Bits of all memories: the weight ROM, the bias ROM, and the partial sums when they
        live in a memory. Pipeline registers are not counted."""
        acc = self.storage_bits if self.storage == "memory" else 0
        return self.weight_bits + self.bias_bits + acc

    @property
    def cycles(self) -> int:
        """Steady-state cycles per group, :func:`depthwise_cycles`."""
        return depthwise_cycles(self._channels, self._window, self._lanes)

    @property
    def latency(self) -> int:
        """Cycles from the first input transfer to the last output transfer of a group,
        :func:`depthwise_latency`."""
        return depthwise_latency(self._channels, self._window, self._lanes)

    # -- Hardware

    def elaborate(self, platform):
        m = Module()
        lanes, folds, window = self._lanes, self.folds, self._window
        steps = window * folds
        in_layout = data.ArrayLayout(self._in_shape, lanes)
        out_shape = self._out_shape
        out_layout = data.ArrayLayout(out_shape, lanes)
        i_stream, o_stream = self.i_stream, self.o_stream

        # -- Stage 0: position of the next input transfer within its group (the weight ROM
        # address) and its fold.
        step = counter(steps)
        cf = counter(folds)

        m.submodules.w_rom = w_rom = Memory(
            shape=data.ArrayLayout(self._w_shape, lanes), depth=steps,
            init=[[int(self._weight[f * lanes + j, k]) for j in range(lanes)]
                  for k in range(window) for f in range(folds)])
        w_rd = w_rom.read_port()

        # -- Stage 1: the input register and its weights.
        s1_valid, s1_first, s1_last = Signal(), Signal(), Signal()
        s1_x = Signal(in_layout)
        s1_cf = counter(folds)
        # -- Stage 2: the products.
        s2_valid, s2_first, s2_last = Signal(), Signal(), Signal()
        s2_cf = counter(folds)
        w_word = w_rd.data
        prods = [Signal.like(s1_x[j] * w_word[j], name=f"prod_{j}") for j in range(lanes)]
        # On an ECP5 the weights of stage 0 come from a fabric register holding the word of
        # `step` (w_cur), the ROM read two steps ahead into it, and stage 1 holds what the
        # products start from: hard products in registered MULT18X18Ds (their input
        # registers in stage 1's place), LUT products as their pairs of rows (hw.chains), so
        # that stage 2 adds them. A block RAM's output (5.6 ns clock-to-out) through a whole
        # carry-chain product into the product register was a DS-CNN build's critical path
        # (13.9 ns); through an unregistered DSP it cannot fit 10 ns either.
        dsp = not self._lut and ecp5_registered_product(platform, self._in_shape,
                                                         self._w_shape)
        chains = self._lut and is_ecp5(platform)

        # The output register leaves through a skid register (blocks.skid_output): `free`,
        # from registers only, says it may be loaded. Stage 2 moves on unless it holds a
        # last-position product and the output register may not be loaded; the stages
        # before move with it. (With the consumer's ready in these enables, a DS-CNN build's
        # critical path ran from a requantization's skid flag across the die into the
        # partial sums' enables: 11.1 ns, 9.6 of them routing.)
        o_valid = Signal()
        o_payload = Signal(out_layout)
        free = skid_output(m, o_stream, o_valid, o_payload, free_copy=True)
        s2_go = ~s2_last | free
        s2_done = s2_valid & s2_go
        advance = ~s2_valid | s2_go
        if dsp or chains:       # the weights read ahead into w_cur
            # After a reset, two cycles of priming take no input: the first reads the word of
            # step 0, which the second loads into w_cur while reading the word of step 1.
            # w_cur has no reset and powers up at zero, and nothing but the read is in front
            # of it: on ECP5 the block RAM's own output register (boards.outreg).
            primed0, primed = Signal(name="primed0"), Signal(name="primed")
            m.d.sync += [primed0.eq(1), primed.eq(primed0)]
            take = i_stream.valid & advance & primed
            m.d.comb += i_stream.ready.eq(advance & primed)
            w_cur = Signal(w_word.shape(), name="w_cur", reset_less=True)
            # The steps the priming reads are those of step1 and step2 themselves: both 0 in
            # the first cycle, both 1 in the second, then 1 and 2. So the read address is
            # chosen by the input's valid alone, and the priming flags are only the step
            # registers' enables. (yosys merges the identical priming flags of all depthwise
            # cores into one register: in the address it crossed the die into a LUT ROM's
            # decoder, MobileNetV1's critical path at 776ad1b, 10.8 ns.)
            step1 = Signal.like(step, name="step1")
            step2 = Signal.like(step, name="step2")
            # The read is enabled with `advance`, when `take` is the input's valid (after
            # priming): the address comes from the input's valid, not from the output's
            # ready, and without `advance` the word of step1 holds, as it did when read
            # again. The ready chain requant -> depthwise -> take into a LUT ROM's decoder
            # ranked first in a static timing estimate of MobileNetV1 (9 logic levels).
            m.d.comb += [w_rd.addr.eq(Mux(i_stream.valid, step2, step1)),
                         w_rd.en.eq(advance | ~primed)]
            with m.If(~primed0):
                m.d.sync += [step1.eq(1 % steps), step2.eq(1 % steps)]
            with m.Elif(~primed):
                m.d.sync += step2.eq(2 % steps)
            with m.Elif(take):
                m.d.sync += [step1.eq(step2), step2.eq(wrap_incr(step2, steps))]
            with m.If(take | (primed0 & ~primed)):
                m.d.sync += w_cur.eq(w_rd.data)
        else:
            take = i_stream.valid & advance
            m.d.comb += [i_stream.ready.eq(advance), w_rd.addr.eq(step), w_rd.en.eq(advance)]
        if dsp:
            for j in range(lanes):
                m.d.comb += prods[j].eq(mult18x18d(m, i_stream.payload[j], w_cur[j], advance,
                                                   f"mul_{j}"))
        if chains:
            rows = [registered_pairs(m, platform, i_stream.payload[j], w_cur[j], advance,
                                     f"mul_{j}", f"rows_{j}") for j in range(lanes)]
        with m.If(take):
            m.d.sync += [step.eq(wrap_incr(step, steps)), cf.eq(wrap_incr(cf, folds))]
        with m.If(advance):
            m.d.sync += [
                s1_valid.eq(i_stream.valid), s1_x.eq(i_stream.payload), s1_cf.eq(cf),
                s1_first.eq(step < folds), s1_last.eq(step >= steps - folds),
                s2_valid.eq(s1_valid), s2_first.eq(s1_first), s2_last.eq(s1_last),
                s2_cf.eq(s1_cf),
            ]
            if chains:      # LUT products on an ECP5: carry chains, about half the LUTs
                m.d.sync += [prods[j].eq(chain_sum(m, platform, rows[j], self._in_shape,
                                                   self._w_shape, f"mul_{j}"))
                             for j in range(lanes)]
            elif not dsp:
                m.d.sync += [prods[j].eq(product(s1_x[j], w_word[j], lut=self._lut))
                             for j in range(lanes)]

        # -- Bias of the fold in stage 2.
        bias_words = self._bias.reshape(folds, lanes)
        if folds == 1:
            bias = [C(int(v), out_shape) for v in bias_words[0]]
        else:
            m.submodules.b_rom = b_rom = Memory(
                shape=out_layout, depth=folds,
                init=[[int(v) for v in row] for row in bias_words])
            b_rd = b_rom.read_port()
            # Read a stage earlier, at the fold entering stage 1, into a register that moves
            # with stage 2: a block RAM's output (5.6 ns clock-to-out) straight into the
            # adder was a MobileNetV1 build's critical path at 100 MHz (13.4 ns).
            m.d.comb += [b_rd.addr.eq(cf), b_rd.en.eq(advance)]
            # (No reset: the read's register on ECP5, see boards.outreg.)
            b_reg = Signal(out_layout, name="bias", reset_less=True)
            with m.If(advance):
                m.d.sync += b_reg.eq(b_rd.data)
            bias = [b_reg[j] for j in range(lanes)]

        # -- Partial sums: `prev` is the stored sum of fold s2_cf, `result` the new one. Sums
        # wrap modulo 2**out_shape.width: exact, because every partial and final sum lies
        # within out_shape (the input range contains 0, so each product's range does too).
        storage = self.storage
        prev, store = partial_results(m, storage, out_layout, folds, fold=s2_cf,
                                       next_fold=s1_cf, advance=advance, ahead_fold=cf)
        result = Signal(out_layout)
        for j in range(lanes):
            if storage == "none":
                base = bias[j]
            else:
                base = Mux(s2_first, bias[j], prev[j])
            m.d.comb += result[j].eq(base + prods[j])

        with m.If(s2_done):
            store(result)

        # -- Output register: the sum of the last window position of each fold.
        with m.If(o_valid & free):         # the word left: sent, or to the skid register
            m.d.sync += o_valid.eq(0)
        with m.If(s2_done & s2_last):
            m.d.sync += [o_valid.eq(1), o_payload.eq(result)]
        return m

