"""A constant matrix-vector product computed by adders: the :class:`ConstMatVecCore`, one
whole vector per cycle, built from the :class:`~onnx2fpga.plan.cmvm.AdderGraph` that
:mod:`onnx2fpga.plan.cmvm` plans.
"""

from __future__ import annotations

from amaranth import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..plan.cmvm import AdderGraph, cmvm_latency, cmvm_queue_depth, finish_stages
from ..plan.cmvm_requant import FusedRequant
from .blocks import (
    int_shape,
    quiet_if_invalid,
    range_shape,
    shape_range,
    tree_sum,
)
from .plumbing import StreamFIFO

__all__ = ["ConstMatVecCore"]


class ConstMatVecCore(wiring.Component):
    """``y = W @ x + b`` for a constant integer matrix, one vector in and one out per cycle.

    Every variable of ``graph`` (an input, an adder's result) is a signal: an adder adds its
    operands (shifts are wiring, signs add or subtract) in the register stage its level
    falls in (``levels_per_stage`` adder levels per stage, :meth:`AdderGraph.schedule`); a
    variable a later stage reads is registered at the end of its stage and carried in delay
    registers to the stage before its reader. Stage 0 is the input register, the graph's
    outputs are registered in its last stage; with ``fused``, two more stages finish each
    output (:class:`~onnx2fpga.plan.cmvm_requant.FusedRequant`: the rounding's adder, then
    the shift and clip, or the comparisons with thresholds and their count). The stages move
    on every cycle, with no enable (only a copy of a register for more readers,
    :attr:`~onnx2fpga.plan.cmvm.Schedule.copies`, loads valid transfers alone), into an
    output queue (:class:`~onnx2fpga.hw.plumbing.StreamFIFO`) of
    :func:`~onnx2fpga.plan.cmvm.cmvm_queue_depth` transfers; ``i_stream.ready`` holds while
    the transfers taken and not yet given out fill it, so that a stalled output loses none.

    Parameters
    ----------
    graph : AdderGraph
        The adders; input ``i`` is element ``i`` of the input transfer, output ``o`` element
        ``o`` of the output transfer.
    in_shape, out_shape : IntType or Amaranth integer shape
        Element shapes; ``out_shape`` must hold every output's range.
    levels_per_stage : int
        Adder levels between two registers.
    fused : FusedRequant or None
        The requantization that finishes each output (``out_shape`` then holds ``fused.lo
        .. fused.hi``); None: the outputs are the graph's.

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(in_shape, graph.n_in)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(out_shape, graph.n_out)))``

    Timing: one input transfer per cycle; its result is offered :attr:`latency` cycles
    (:func:`~onnx2fpga.plan.cmvm.cmvm_latency`: the pipeline's ``depth + 1 +
    finish_stages(fused)``, then the queue's) after it was taken; ``i_stream.ready`` comes
    from registers only.
    """

    @classmethod
    def from_stage(cls, stage) -> ConstMatVecCore:
        """The core of a ``"cmvm"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        p = stage.params
        return cls(p["graph"], stage.in_type, stage.out_type, p["levels_per_stage"],
                   p.get("fused"))

    @quiet_if_invalid
    def __init__(self, graph: AdderGraph, in_shape, out_shape, levels_per_stage: int = 1,
                 fused: FusedRequant | None = None):
        if not isinstance(graph, AdderGraph):
            raise TypeError(f"graph must be an AdderGraph, not {graph!r}")
        if fused is not None and not isinstance(fused, FusedRequant):
            raise TypeError(f"fused must be a FusedRequant or None, not {fused!r}")
        self._graph = graph
        self._fused = fused
        self._in_shape = int_shape(in_shape)
        self._out_shape = int_shape(out_shape)
        self._schedule = graph.schedule(levels_per_stage)
        lo, hi = shape_range(self._out_shape)
        ranges = [(fused.lo, fused.hi)] if fused is not None else \
            [graph.output_range(o) for o in range(graph.n_out)]
        for o, (olo, ohi) in enumerate(ranges):
            if olo < lo or ohi > hi:
                raise ValueError(f"Output {o} ranges over [{olo}, {ohi}], beyond the output "
                                 f"shape {self._out_shape}")
        lo, hi = shape_range(self._in_shape)
        for i in range(graph.n_in):
            if graph.lo[i] > lo or graph.hi[i] < hi:
                raise ValueError(f"Input {i} of the graph covers [{graph.lo[i]}, "
                                 f"{graph.hi[i]}], not the whole input shape "
                                 f"{self._in_shape}")
        super().__init__({
            "i_stream": In(stream.Signature(data.ArrayLayout(self._in_shape, graph.n_in))),
            "o_stream": Out(stream.Signature(data.ArrayLayout(self._out_shape,
                                                              graph.n_out))),
        })

    @property
    def graph(self) -> AdderGraph:
        return self._graph

    @property
    def depth(self) -> int:
        """Register stages after the input register."""
        return self._schedule.depth

    @property
    def latency(self) -> int:
        """Cycles from an input transfer to its output transfer, without stalls."""
        return cmvm_latency(self._graph, self._schedule.levels_per_stage, self._fused)

    def elaborate(self, platform):
        m = Module()
        g, sch = self._graph, self._schedule
        i_stream, o_stream = self.i_stream, self.o_stream
        depth = sch.depth

        shapes = [range_shape(g.lo[v], g.hi[v]) for v in range(len(g.lo))]
        comb = {}                   # v -> its value in its own stage (logic or the input)
        regs = {}                   # (v, k, c) -> copy c of its register at the end of stage k
        loads = []                  # (register, value, copy): one per register, in order;
        #                             copy: the stage k of a copy (c > 0), else None

        def reg(v, k, c=0):
            """``v``'s register at the end of stage ``k`` (copy ``c`` of it, loading the
            same value: :attr:`~onnx2fpga.plan.cmvm.Schedule.copies`)."""
            if (v, k, c) not in regs:
                r = Signal(shapes[v], name=f"v{v}_s{k}" + (f"_c{c}" if c else ""),
                           reset_less=True)
                src = comb[v] if k == sch.stage[v] else reg(v, k - 1)
                regs[(v, k, c)] = r
                loads.append((r, src, k if c else None))
            return regs[(v, k, c)]

        def value(i, j, v, k):
            """Operand ``j`` (``v``) of adder ``i``, of stage ``k``: a constant, a result of
            the same stage, or the copy of ``v``'s register of the stage before that the
            schedule gives this read."""
            if v in g.consts:
                return C(g.consts[v], shapes[v])
            if v >= g.n_in and sch.stage[v] == k:
                return comb[v]
            return reg(v, k - 1, sch.reads[(i, j)])

        # Adder results another adder of the same stage reads (levels_per_stage > 1) are
        # kept: otherwise yosys' alumacc merges the chain into one multi-operand sum whose
        # 3:2 compressors take two LUT4s a bit besides the carry chain (layers 1-3 of the jet
        # tagger at two levels per stage: 7,631 LUT4 beside 8,350 CCU2C; x + y + z of 16
        # bits: 9 CCU2C and 32 LUT4 merged, 18 CCU2C kept).
        chained = {u for op, v in zip(g.adders, g.results, strict=True)
                   for u in (op.a, op.b) if u >= g.n_in and u not in g.consts
                   and sch.stage[u] == sch.stage[v]}
        for i in range(g.n_in):
            comb[i] = i_stream.payload[i]
        for i, (op, v) in enumerate(zip(g.adders, g.results, strict=True)):
            k = sch.stage[v]
            a = value(i, 0, op.a, k) << op.shift_a
            term_a = -a if op.sign_a < 0 else a
            if op.b < 0:
                expr = term_a
            else:
                b = value(i, 1, op.b, k) << op.shift_b
                expr = term_a - b if op.sign_b < 0 else term_a + b
            s = Signal(shapes[v], name=f"v{v}", attrs={"keep": 1} if v in chained else {})
            m.d.comb += s.eq(expr)
            comb[v] = s
        for i in range(g.n_in):
            reg(i, 0)
        outs = []
        for v, shift, _ in g.outputs:
            if v < 0:
                outs.append(C(0, 1))
            elif v in g.consts:
                outs.append(C(g.consts[v] << shift))
            else:
                outs.append(reg(v, max(depth, sch.stage[v])) << shift)
        if self._fused is not None:
            outs = self._finish(outs, loads)
            depth += finish_stages(self._fused)

        # The pipeline runs on every cycle, with no enable (the whole jet tagger's enables
        # were 20,944 of the 129k arcs nextpnr had to route, and it did not route); its
        # output goes into a queue with room for every transfer in flight, whose count
        # (credits) sets i_stream.ready.
        valid = [Signal(name=f"valid_s{k}") for k in range(depth + 1)]
        ready = Signal(init=1)
        take = i_stream.valid & ready
        m.d.comb += i_stream.ready.eq(ready)
        m.d.sync += valid[0].eq(take)
        for k in range(1, depth + 1):
            m.d.sync += valid[k].eq(valid[k - 1])
        for r, src, copy in loads:              # copy: None, or the stage of a copy
            if copy is None:
                m.d.sync += r.eq(src)
            else:
                # A copy loads at least every valid transfer and holds otherwise: its next
                # value reads itself, so that yosys' opt_merge keeps it apart from the
                # register it copies. An input register's copy loads whenever ``ready``
                # (a register: with ``take``, the net from the board wrapper's valid to
                # every input copy drew a LUT of the wrapper's receiver 30 tiles away from
                # the rest of it, 82.9 MHz on the jet tagger).
                with m.If(valid[copy - 1] if copy else ready):
                    m.d.sync += r.eq(src)
        # Outputs that are constants (no weights, or none left) do not go through the queue.
        live = [o for o, (v, _, _) in enumerate(g.outputs) if v >= 0 and v not in g.consts]
        queue_depth = cmvm_queue_depth(g, sch.levels_per_stage, self._fused)
        m.submodules.queue = queue = StreamFIFO(self._out_shape, max(1, len(live)),
                                                queue_depth)
        m.d.comb += [
            queue.i_stream.valid.eq(valid[depth]),
            o_stream.valid.eq(queue.o_stream.valid),
            queue.o_stream.ready.eq(o_stream.ready),
        ]
        for j, o in enumerate(live):
            m.d.comb += [queue.i_stream.payload[j].eq(outs[o]),
                         o_stream.payload[o].eq(queue.o_stream.payload[j])]
        for o, e in enumerate(outs):
            if o not in live:
                m.d.comb += o_stream.payload[o].eq(e)
        # The transfers taken and not given out, in thermometer code (level[i]: more than i),
        # so that no adder or comparison lies on the handshake's path; ready's next value
        # assumes a transfer is taken whenever ready (an upper bound of the count), so that it
        # does not wait for the producer's valid: one logic level between registers of two
        # layers, where a count, its adder and a comparison were the jet tagger's critical
        # path (78.4 MHz: ready into the producer's queue and back through two carry chains).
        pop = o_stream.valid & o_stream.ready
        level = Signal(queue_depth, name="level")
        up, down = take & ~pop, pop & ~take
        for i in range(queue_depth):
            below = level[i - 1] if i else C(1, 1)
            above = level[i + 1] if i + 1 < queue_depth else C(0, 1)
            with m.If(up):
                m.d.sync += level[i].eq(below)
            with m.Elif(down):
                m.d.sync += level[i].eq(above)
        full_after_one = level[queue_depth - 2] if queue_depth > 1 else C(1, 1)
        with m.If(ready & ~pop):
            m.d.sync += ready.eq(~full_after_one)
        with m.Elif(~ready & pop):
            m.d.sync += ready.eq(1)
        with m.Else():
            m.d.sync += ready.eq(~level[queue_depth - 1])
        return m

    def _finish(self, outs, loads):
        """Two register stages per output: ``u + r + carry`` (or the threshold comparisons),
        then the shift and clip (or their count)."""
        f, g = self._fused, self._graph
        done = []
        for c, u in enumerate(outs):
            lo_u, hi_u = g.output_range(c)
            if f.rounding[c] == "thresholds":
                hits = [(u >= t) if f.direction[c] > 0 else (u <= t) for t in f.thresholds[c]]
                first = Signal(max(1, len(hits)), name=f"hits{c}", reset_less=True)
                loads.append((first, Cat(*hits) if hits else C(0, 1), None))
                y = Signal(self._out_shape, name=f"y{c}", reset_less=True)
                count = tree_sum([first[k] for k in range(len(hits))]) if hits else C(0, 1)
                loads.append((y, f.lo + count, None))
                done.append(y)
                continue
            s, r = f.shift[c], f.round_const[c]
            carry = C(0, 1)
            if f.rounding[c] == "bit":
                carry = u.as_unsigned().bit_select(s, 1) if s < len(u) else \
                    (u.as_signed()[-1] if lo_u < 0 else C(0, 1))
            elif f.rounding[c] == "sign":
                carry = ~u.as_signed()[-1] if lo_u < 0 else C(1, 1)
            w_lo, w_hi = lo_u + r, hi_u + r + (f.rounding[c] != "none")
            w = Signal(range_shape(w_lo, w_hi), name=f"w{c}", reset_less=True)
            loads.append((w, u + r + carry, None))
            q = w >> s
            y = Signal(self._out_shape, name=f"y{c}", reset_less=True)
            clipped = q
            if (w_hi >> s) > f.hi:
                clipped = Mux(q > f.hi, f.hi, clipped)
            if (w_lo >> s) < f.lo:
                clipped = Mux(q < f.lo, f.lo, clipped)
            loads.append((y, clipped, None))
            done.append(y)
        return done


