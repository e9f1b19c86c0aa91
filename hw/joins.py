"""Stream forks and joins for graphs with branches: broadcast, element-wise add, concatenation.

A residual block forks its input into a main branch and a skip branch
(:class:`BroadcastCore`) and joins them again with a sum (:class:`AddCore`, followed by a
:class:`~onnx2fpga.hw.requant.RequantCore` that requantizes the sum); an inception-style block
joins its branches with a channel concatenation (:class:`ConcatCore`). Streams carry images
channels-last (see :mod:`onnx2fpga.ir`), ``lanes`` elements per transfer.

Cores with several streams on one side have an *array member* (``o_stream`` of the broadcast,
``i_stream`` of the concatenation, built with :meth:`amaranth.lib.wiring.Member.array`): element
``k`` is an ordinary stream interface, connected with
``wiring.connect(m, core.o_stream[k], other.i_stream)``. In the Verilog the ports are named
``o_stream__0__valid``, ``o_stream__0__payload``, ...

Their cycle figures are those of :mod:`onnx2fpga.plan.joins`, in the conventions of
:mod:`onnx2fpga.plan.cost`. Every core here has a registered output and moves one transfer
per cycle per port; a transfer leaves ``BROADCAST_LATENCY``, ``ADD_LATENCY`` or
``CONCAT_LATENCY`` cycles after the input transfer it comes from.
"""

from __future__ import annotations

import numpy as np
from amaranth import C, Module, Mux, Shape, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..ir.layers import JOIN_OPS
from ..plan.checks import check_count
from ..plan.joins import (
    add_cycles,
    add_latency,
    broadcast_cycles,
    broadcast_latency,
    check_chunks,
    concat_cycles,
    concat_latency,
)
from .arith import TABLE_PRODUCT_MAX_BITS, table_product
from .blocks import counter, int_shape, output_register, quiet_if_invalid, range_shape, shape_range

__all__ = ["AddCore", "BroadcastCore", "ConcatCore"]


# ---------------------------------------------------------------------------------------------
# Timing model


# ---------------------------------------------------------------------------------------------
# Broadcast


class BroadcastCore(wiring.Component):
    """Fork one stream into ``outputs`` copies: every input transfer is delivered exactly once
    on every output.

    Each output has its own valid flag over a shared payload register: an output may take its
    copy in a later cycle than the others. The input is taken again as soon as every output
    either has no pending copy or passes it on in that cycle, so all pending copies are always
    of the same transfer and one payload register serves them all. A stalled output holds back
    the input (and so the other outputs) by at most one transfer: put a FIFO on an output
    whose consumer runs behind (the skip branch of a residual block).

    Parameters
    ----------
    shape : IntType or Amaranth integer shape
        Element shape.
    lanes : int
        Elements per transfer.
    outputs : int
        Number of outputs, at least 2.

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(shape, lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(shape, lanes))).array(outputs)``
        ``o_stream[k]`` is output ``k``.

    Timing: one transfer per cycle when every output is ready; every output transfer comes
    :data:`BROADCAST_LATENCY` ``= 1`` cycle after its input transfer. ``i_stream.ready``
    follows the outputs' ``ready`` combinationally while copies are pending.
    """

    @classmethod
    def from_stage(cls, stage) -> BroadcastCore:
        """The core of a ``"broadcast"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        return cls(stage.out_type, stage.out_lanes, stage.params["outputs"])

    @quiet_if_invalid
    def __init__(self, shape, lanes, outputs):
        self._shape = int_shape(shape)
        self._lanes = check_count("Lanes", lanes)
        self._outputs = check_count("Outputs", outputs, 2)
        sig = stream.Signature(data.ArrayLayout(self._shape, self._lanes))
        super().__init__({
            "i_stream": In(sig),
            "o_stream": Out(sig).array(self._outputs),
        })

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def outputs(self) -> int:
        return self._outputs

    @property
    def cycles(self) -> int:
        """Steady-state cycles per transfer, 1 (see :func:`broadcast_cycles`)."""
        return broadcast_cycles(1)

    @property
    def latency(self) -> int:
        """Cycles from an input transfer to its output transfers, :data:`BROADCAST_LATENCY`."""
        return broadcast_latency(1)

    def elaborate(self, platform):
        m = Module()
        i_stream, outs = self.i_stream, self.o_stream
        payload = Signal(data.ArrayLayout(self._shape, self._lanes))
        pending = [Signal(name=f"pending_{k}") for k in range(self._outputs)]
        free = [~pending[k] | out.ready for k, out in enumerate(outs)]
        ready = free[0]
        for f in free[1:]:
            ready = ready & f
        m.d.comb += i_stream.ready.eq(ready)
        take = i_stream.valid & ready
        for k, out in enumerate(outs):
            m.d.comb += [out.valid.eq(pending[k]), out.payload.eq(payload)]
            with m.If(take):
                m.d.sync += pending[k].eq(1)
            with m.Elif(out.ready):
                m.d.sync += pending[k].eq(0)
        with m.If(take):
            m.d.sync += payload.eq(i_stream.payload)
        return m


# ---------------------------------------------------------------------------------------------
# Add


class AddCore(wiring.Component):
    """Element-wise join of two quantized streams in multiplier form, exactly as
    :func:`onnx2fpga.sim.golden.join`: with ``ta = (a - za) * ma`` and ``tb = (b - zb) * mb``,

        v = ta + tb  (op "add"),  ta * tb  ("mul"),  min(ta, tb)  ("min"),  max(ta, tb)  ("max")

    with integer constants (the requantization of ``v`` is a separate
    :class:`~onnx2fpga.hw.requant.RequantCore`). Lane ``j`` of output transfer ``t`` is the sum
    of lane ``j`` of input transfer ``t`` of both inputs.

    Parameters
    ----------
    a_shape, b_shape : IntType or Amaranth integer shape
        Element shapes of the inputs.
    lanes : int
        Elements per transfer (on both inputs and the output).
    zero_points : pair of int
        ``(za, zb)``.
    multipliers : pair of int
        ``(ma, mb)``, one value for all elements.
    op : str
        One of ``"add"``, ``"mul"``, ``"min"``, ``"max"``.

    Members
    -------
    i_a : ``In(stream.Signature(data.ArrayLayout(a_shape, lanes)))``
    i_b : ``In(stream.Signature(data.ArrayLayout(b_shape, lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(out_shape, lanes)))``
        ``out_shape`` is the narrowest shape holding ``v`` for every pair of input values (so
        it never wraps).

    Timing: a transfer is taken from both inputs in the same cycle, when both are valid
    (``i_a.ready`` follows ``i_b.valid`` combinationally and vice versa, the usual join); one
    transfer per cycle; the output transfer comes :data:`ADD_LATENCY` ``= 3`` cycles after the
    input transfer (input registers, a register after the two constant multiplies, then the
    output register after the sum). The pipeline stalls as a whole while the output holds a
    sum that is not taken (the inputs' ``ready`` then follows ``o_stream.ready``
    combinationally).
    """

    @classmethod
    def from_stage(cls, stage) -> AddCore:
        """The core of an ``"add"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        p = stage.params
        return cls(stage.in_type, p["b_type"], stage.in_lanes, p["zero_points"],
                   p["multipliers"], p.get("op", "add"))

    @quiet_if_invalid
    def __init__(self, a_shape, b_shape, lanes, zero_points=(0, 0), multipliers=(1, 1),
                 op="add"):
        self._a_shape = int_shape(a_shape)
        self._b_shape = int_shape(b_shape)
        self._lanes = check_count("Lanes", lanes)
        for what, pair in (("Zero points", zero_points), ("Multipliers", multipliers)):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2 or any(
                    not isinstance(v, (int, np.integer)) or isinstance(v, bool) for v in pair):
                raise TypeError(f"{what} must be a pair of integers, not {pair!r}")
        self._zero_points = (int(zero_points[0]), int(zero_points[1]))
        self._multipliers = (int(multipliers[0]), int(multipliers[1]))
        if op not in JOIN_OPS:
            raise ValueError(f"Op must be one of {', '.join(JOIN_OPS)}, not {op!r}")
        self._op = op
        terms = []
        for shape, z, mult in zip((self._a_shape, self._b_shape), self._zero_points,
                                  self._multipliers, strict=True):
            x_lo, x_hi = shape_range(shape)
            ends = ((x_lo - z) * mult, (x_hi - z) * mult)
            terms.append((min(ends), max(ends)))
        (alo, ahi), (blo, bhi) = terms
        if op == "add":
            lo, hi = alo + blo, ahi + bhi
        elif op == "mul":
            ends = [x * y for x in (alo, ahi) for y in (blo, bhi)]
            lo, hi = min(ends), max(ends)
        elif op == "max":
            lo, hi = max(alo, blo), max(ahi, bhi)
        else:
            lo, hi = min(alo, blo), min(ahi, bhi)
        self._term_ranges = tuple(terms)
        self._out_range = (lo, hi)
        self._out_shape = range_shape(lo, hi)
        super().__init__({
            "i_a": In(stream.Signature(data.ArrayLayout(self._a_shape, self._lanes))),
            "i_b": In(stream.Signature(data.ArrayLayout(self._b_shape, self._lanes))),
            "o_stream": Out(stream.Signature(data.ArrayLayout(self._out_shape, self._lanes))),
        })

    @property
    def a_shape(self) -> Shape:
        return self._a_shape

    @property
    def b_shape(self) -> Shape:
        return self._b_shape

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def zero_points(self) -> tuple[int, int]:
        return self._zero_points

    @property
    def multipliers(self) -> tuple[int, int]:
        return self._multipliers

    @property
    def op(self) -> str:
        return self._op

    @property
    def out_range(self) -> tuple[int, int]:
        """The smallest and largest value of ``v`` over the input shapes."""
        return self._out_range

    @property
    def out_shape(self) -> Shape:
        """Element shape of the output, the narrowest holding :attr:`out_range`."""
        return self._out_shape

    @property
    def cycles(self) -> int:
        """Steady-state cycles per transfer, 1 (see :func:`add_cycles`)."""
        return add_cycles(1)

    @property
    def latency(self) -> int:
        """Cycles from an input transfer to its output transfer, :data:`ADD_LATENCY`."""
        return add_latency(1)

    def elaborate(self, platform):
        m = Module()
        lanes = self._lanes
        i_a, i_b, o_stream = self.i_a, self.i_b, self.o_stream
        (za, zb), (ma, mb) = self._zero_points, self._multipliers

        o_valid = Signal()
        advance = ~o_valid | o_stream.ready
        m.d.comb += [
            i_a.ready.eq(advance & i_b.valid),
            i_b.ready.eq(advance & i_a.valid),
        ]
        take = i_a.valid & i_b.valid & advance

        def scaled(x, mult):
            return x if mult == 1 else C(0, 1) if mult == 0 else x * C(mult)

        def product(x, mult):
            # Narrow inputs: from tables of the multiples of mult (no hard multiplier, whose
            # unregistered path did not fit 10 ns on an ECP5); the same value.
            if mult in (0, 1) or len(x) > TABLE_PRODUCT_MAX_BITS:
                return scaled(x, mult)
            return table_product(x, mult)

        if self._op != "add":
            return self._elaborate_join(m, take, advance, o_valid)

        # Stage 0: the inputs in registers (an input may come straight from a block RAM, too
        # slow to meet a multiplier in the same cycle); stage 1: the two products of each
        # lane (constant multiplies).
        a_reg = Signal.like(i_a.payload, name="a_reg")
        b_reg = Signal.like(i_b.payload, name="b_reg")
        s0_valid, s1_valid = Signal(), Signal()
        prods = []
        for j in range(lanes):
            pa, pb = scaled(a_reg[j], ma), scaled(b_reg[j], mb)
            prods.append((Signal.like(pa, name=f"pa_{j}"), Signal.like(pb, name=f"pb_{j}")))
        # Stage 2: the output register, v = a*ma + b*mb - (za*ma + zb*mb).
        const = -(za * ma + zb * mb)
        o_payload = Signal(data.ArrayLayout(self._out_shape, lanes))
        with m.If(advance):
            m.d.sync += [a_reg.eq(i_a.payload), b_reg.eq(i_b.payload),
                         s0_valid.eq(take), s1_valid.eq(s0_valid), o_valid.eq(s1_valid)]
            for j, (pa, pb) in enumerate(prods):
                m.d.sync += [
                    pa.eq(product(a_reg[j], ma)),
                    pb.eq(product(b_reg[j], mb)),
                    # Truncation to out_shape is exact: the sum lies within out_range.
                    o_payload[j].eq(pa + pb + C(const)),
                ]
        m.d.comb += [o_stream.valid.eq(o_valid), o_stream.payload.eq(o_payload)]
        return m

    def _elaborate_join(self, m, take, advance, o_valid):
        """Product, minimum or maximum of the terms: the same three stages as the sum, the
        terms ``(x - z) * mult`` computed in stage 1."""
        i_a, i_b, o_stream = self.i_a, self.i_b, self.o_stream
        (za, zb), (ma, mb) = self._zero_points, self._multipliers
        a_reg = Signal.like(i_a.payload, name="a_reg")
        b_reg = Signal.like(i_b.payload, name="b_reg")
        s0_valid, s1_valid = Signal(), Signal()
        o_payload = Signal(data.ArrayLayout(self._out_shape, self._lanes))
        (alo, ahi), (blo, bhi) = self._term_ranges
        with m.If(advance):
            m.d.sync += [a_reg.eq(i_a.payload), b_reg.eq(i_b.payload),
                         s0_valid.eq(take), s1_valid.eq(s0_valid), o_valid.eq(s1_valid)]
            for j in range(self._lanes):
                ta = Signal(range_shape(alo, ahi), name=f"ta_{j}")
                tb = Signal(range_shape(blo, bhi), name=f"tb_{j}")
                m.d.sync += [ta.eq((a_reg[j] - C(za)) * C(ma)),
                             tb.eq((b_reg[j] - C(zb)) * C(mb))]
                if self._op == "mul":
                    v = ta * tb
                elif self._op == "max":
                    v = Mux(ta >= tb, ta, tb)
                else:
                    v = Mux(ta <= tb, ta, tb)
                # Truncation to out_shape is exact: v lies within out_range.
                m.d.sync += o_payload[j].eq(v)
        m.d.comb += [o_stream.valid.eq(o_valid), o_stream.payload.eq(o_payload)]
        return m


# ---------------------------------------------------------------------------------------------
# Concat


class ConcatCore(wiring.Component):
    """Interleave ``len(chunks)`` streams into one: ``chunks[0]`` transfers from input 0, then
    ``chunks[1]`` transfers from input 1, ..., then again from input 0, and so on.

    For a channel concatenation of images streamed channels-last, ``chunks[k]`` is
    ``C_k // lanes`` (a round is one pixel); for a concatenation of vectors, ``size_k // lanes``
    (a round is one tensor). All inputs share one element shape: the planner casts or
    requantizes them before. No ``last`` flag: the core counts.

    Parameters
    ----------
    shape : IntType or Amaranth integer shape
        Element shape of every input and of the output.
    lanes : int
        Elements per transfer.
    chunks : list of int
        Transfers per round from each input, at least two inputs, each at least 1.

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(shape, lanes))).array(len(chunks))``
        ``i_stream[k]`` is input ``k``; only the input whose turn it is sees ``ready``.
    o_stream : ``Out(stream.Signature(data.ArrayLayout(shape, lanes)))``

    Timing: one transfer per cycle (registered output); each output transfer comes
    :data:`CONCAT_LATENCY` ``= 1`` cycle after its input transfer; :func:`concat_cycles` and
    :func:`concat_latency` per round. An input that is not valid in its turn holds up the
    whole output (the others wait); ``ready`` of the input in turn follows ``o_stream.ready``
    combinationally while the output register is full.
    """

    @classmethod
    def from_stage(cls, stage) -> ConcatCore:
        """The core of a ``"concat"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        return cls(stage.out_type, stage.out_lanes, stage.params["chunks"])

    @quiet_if_invalid
    def __init__(self, shape, lanes, chunks):
        self._shape = int_shape(shape)
        self._lanes = check_count("Lanes", lanes)
        self._chunks = check_chunks(chunks)
        sig = stream.Signature(data.ArrayLayout(self._shape, self._lanes))
        super().__init__({
            "i_stream": In(sig).array(len(self._chunks)),
            "o_stream": Out(sig),
        })

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def chunks(self) -> tuple[int, ...]:
        return self._chunks

    @property
    def cycles(self) -> int:
        """Steady-state cycles per round, :func:`concat_cycles` ``= sum(chunks)``."""
        return concat_cycles(self._chunks)

    @property
    def latency(self) -> int:
        """Cycles from the first input transfer to the last output transfer of one round,
        :func:`concat_latency` ``= sum(chunks)``."""
        return concat_latency(self._chunks)

    def elaborate(self, platform):
        m = Module()
        chunks, n = self._chunks, len(self._chunks)
        ins, o_stream = self.i_stream, self.o_stream

        sel = counter(n)                     # the input whose turn it is
        count = counter(max(chunks))         # transfers taken from it in this round
        o_valid = Signal()
        advance = ~o_valid | o_stream.ready
        o_payload = output_register(m, o_stream, o_valid,
                                     data.ArrayLayout(self._shape, self._lanes))
        with m.Switch(sel):
            for k, i_k in enumerate(ins):
                with m.Case(k):
                    m.d.comb += i_k.ready.eq(advance)
                    with m.If(i_k.valid & advance):
                        m.d.sync += [o_payload.eq(i_k.payload), o_valid.eq(1)]
                        if chunks[k] == 1:
                            m.d.sync += sel.eq((k + 1) % n)
                        else:
                            with m.If(count == chunks[k] - 1):
                                m.d.sync += [sel.eq((k + 1) % n), count.eq(0)]
                            with m.Else():
                                m.d.sync += count.eq(count + 1)
        return m
