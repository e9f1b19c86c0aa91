"""Activation by thresholds: the :class:`ThresholdCore` and the exact conversion of a
monotonic requantization into thresholds (:func:`requant_as_thresholds`).

A :class:`~onnx2fpga.ir.ThresholdStage` maps an integer ``x`` of channel ``c`` to
``base + step * #{i : x >= thresholds[c, i]}`` (FINN's MultiThreshold on integers, see
:func:`onnx2fpga.sim.golden.threshold`). Every monotonic function of one integer onto a range
of integers has this form, so a requantization stage whose output takes few values (a 1 to
4 bit activation) can be computed by a handful of comparators instead of a wide multiplier,
rounding and clipping: :func:`requant_as_thresholds` finds the thresholds by an exact integer
search against the golden model, and :mod:`onnx2fpga.plan.graph` uses them where
:func:`onnx2fpga.plan.thresholds.threshold_is_cheaper` says they cost less.
"""

from __future__ import annotations

from math import gcd

import numpy as np
from amaranth import C, Cat, Module, Mux, Shape, Signal
from amaranth.hdl import Array
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..ir.stages import ThresholdStage
from ..plan import thresholds
from ..plan.checks import check_count
from .blocks import (
    int_shape,
    quiet_if_invalid,
    range_shape,
    shape_range,
    skid_output,
    tree_sum,
    wrap_incr,
)

__all__ = ["ThresholdCore"]


# ---------------------------------------------------------------------------------------------
# Requantization -> thresholds


# ---------------------------------------------------------------------------------------------
# The core


class _ThresholdPlan:
    """Compile-time tables of one threshold stage on an input range ``[x_lo, x_hi]``.

    Thresholds are clamped to ``[x_lo, x_hi + 1]`` (one below the range is always passed,
    one above never), which keeps the comparators as wide as the input plus one bit.
    ``rows[j][t]`` is the threshold row of lane ``j`` in transfer ``t`` of the period.
    """

    def __init__(self, stage: ThresholdStage, channels: int, lanes: int, x_lo: int,
                 x_hi: int, search: str):
        t = np.clip(np.asarray(stage.thresholds, np.int64), x_lo, x_hi + 1)
        t = np.broadcast_to(t, (channels, t.shape[1]))
        self.n = int(t.shape[1])
        self.search = thresholds.threshold_search(self.n) if search == "auto" else search
        self.period = channels // gcd(channels, lanes)
        self.rows = [[[int(v) for v in t[(p * lanes + j) % channels]]
                      for p in range(self.period)] for j in range(lanes)]
        self.thr_shape = range_shape(x_lo, x_hi + 1)
        self.base, self.step = int(stage.base), int(stage.step)
        self.out_shape = int_shape(stage.out_type)
        self.out_lo, self.out_hi = stage.lo, stage.hi
        self.levels = max(1, self.n.bit_length())   # binary search: 2**levels - 1 >= n
        # Thresholds that differ between the channels of a lane come from a table (decided
        # as the cost model does: by rows and period, not by the values).
        self.table = thresholds.threshold_table(stage, channels, lanes)
        self.latency = thresholds.threshold_stage_latency(self.n, self.search, self.table)

    def level_table(self, j: int, level: int) -> list[list[int]]:
        """Binary search, lane ``j``, level ``level``: ``table[t][p]`` is the threshold
        compared when the ``level`` bits decided before are ``p`` (thresholds padded to
        ``2**levels - 1`` with ones never passed)."""
        s = self.levels - 1 - level
        pad = (1 << self.levels) - 1 - self.n
        never = (1 << (self.thr_shape.width - 1)) - 1 if self.thr_shape.signed else \
            (1 << self.thr_shape.width) - 1
        table = []
        for row in self.rows[j]:
            full = [min(v, never) for v in row] + [never] * pad
            table.append([full[(p << (s + 1)) + (1 << s) - 1] for p in range(1 << level)])
        return table


class ThresholdCore(wiring.Component):
    """Pipelined elementwise activation by thresholds: every
    :class:`~onnx2fpga.ir.ThresholdStage` of ``stages`` in order, exactly as
    :func:`onnx2fpga.sim.golden.threshold`::

        y = base + step * #{i : x >= thresholds[c, i]}

    Channels cycle as in :class:`~onnx2fpga.hw.requant.RequantCore`: lane ``j`` of transfer
    ``t`` is channel ``(t*lanes + j) % channels``; thresholds that vary over the channels of
    a lane live in a ROM per lane, read one cycle ahead; thresholds equal for all channels
    of a lane are constants. Thresholds below the input range are always passed and those
    above never, so they are clamped to ``[x_lo, x_hi + 1]``: a comparator is as wide as the
    input plus one bit.

    A stage of ``n`` thresholds is computed one of two ways (``search``; ``"auto"`` takes
    :func:`onnx2fpga.plan.thresholds.threshold_search`: parallel up to 15 thresholds, a 4-bit
    output):

    - ``"parallel"``: ``n`` comparators per lane in one cycle (their results a thermometer
      code, registered), then their count times ``step`` plus ``base`` in a second cycle.
      Latency 2 cycles, 3 when the thresholds differ between channels (a register stage
      holds the table's output); cost ``n`` comparators per lane and one ROM word of ``n``
      thresholds per channel.
    - ``"binary"``: a pipelined binary search over the thresholds (padded to
      ``2**k - 1`` with ``k = max(1, n.bit_length())``): level ``L`` compares with the
      threshold picked by the ``L`` result bits before it, one level per cycle, the last
      one writing ``base + step * count``. Latency ``k`` cycles, ``3k - 1`` when the
      thresholds differ between channels (a register stage holds each level's table
      output, so that no block RAM output feeds a comparator, and one more before each
      level after the first addresses its table from registers, so that no comparator
      feeds a block RAM address); cost ``k`` comparators per lane and, per level ``L``, a
      ROM of ``2**L`` thresholds per channel (or a ``2**L``-way constant multiplexer).

    Parameters
    ----------
    stages : list of ThresholdStage
        At least one; ``thresholds`` with 1 or ``channels`` rows.
    channels : int
        Number of channels the thresholds cycle through.
    lanes : int
        Elements per transfer.
    in_shape : IntType or Amaranth integer shape
        Type of the input elements.
    search : str
        ``"auto"``, ``"parallel"`` or ``"binary"``, for every stage.

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(in_shape, lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(out_shape, lanes)))``
        ``out_shape`` is the shape of ``stages[-1].out_type``.

    Timing: one transfer per cycle; latency ``1 + sum of the stages' latencies`` (an input
    register first), :func:`onnx2fpga.plan.thresholds.threshold_latency`. An output that is not
    taken moves to a skid register; the pipeline stalls as a whole while both hold one, and
    ``i_stream.ready`` is a function of registers only.
    """

    @classmethod
    def from_stage(cls, stage) -> ThresholdCore:
        """The core of a ``"threshold"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        return cls(stage.params["stages"], stage.params["channels"], stage.in_lanes,
                   stage.in_type)

    @quiet_if_invalid
    def __init__(self, stages, channels, lanes, in_shape, search="auto"):
        if not isinstance(stages, (list, tuple)) or not stages:
            raise ValueError(f"Stages must be a non-empty list of ThresholdStage, "
                             f"not {stages!r}")
        for k, stage in enumerate(stages):
            if not isinstance(stage, ThresholdStage):
                raise TypeError(f"Stage {k} must be a ThresholdStage, not {stage!r}")
        channels = check_count("Channels", channels)
        lanes = check_count("Lanes", lanes)
        shape = int_shape(in_shape)
        if search not in ("auto", "parallel", "binary"):
            raise ValueError(f"Search must be 'auto', 'parallel' or 'binary', not {search!r}")
        for k, stage in enumerate(stages):
            rows = stage.thresholds.shape[0]
            if rows not in (1, channels):
                raise ValueError(f"Stage {k} thresholds must have 1 or {channels} rows, "
                                 f"not {rows}")
        self._stages = list(stages)
        self._channels, self._lanes, self._in_shape = channels, lanes, shape
        x_lo, x_hi = shape_range(shape)
        self._plans = []
        for stage in self._stages:
            plan = _ThresholdPlan(stage, channels, lanes, x_lo, x_hi, search)
            self._plans.append(plan)
            x_lo, x_hi = plan.out_lo, plan.out_hi
        self._out_shape = self._plans[-1].out_shape
        super().__init__({
            "i_stream": In(stream.Signature(data.ArrayLayout(shape, lanes))),
            "o_stream": Out(stream.Signature(data.ArrayLayout(self._out_shape, lanes))),
        })

    @property
    def stages(self) -> list:
        return list(self._stages)

    @property
    def channels(self) -> int:
        return self._channels

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def in_shape(self) -> Shape:
        return self._in_shape

    @property
    def out_shape(self) -> Shape:
        return self._out_shape

    @property
    def searches(self) -> list[str]:
        """The way each stage is computed, ``"parallel"`` or ``"binary"``."""
        return [p.search for p in self._plans]

    @property
    def latency(self) -> int:
        """Cycles from an input transfer to the output transfer of the same elements."""
        return 1 + sum(p.latency for p in self._plans)

    def elaborate(self, platform):
        m = Module()
        lanes = self._lanes
        i_stream, o_stream = self.i_stream, self.o_stream
        period = self._plans[0].period            # the same for every stage
        t_shape = range(max(period, 2))

        advance = Signal()                  # the pipeline shifts (see skid_output)
        m.d.comb += i_stream.ready.eq(advance)

        t_in = Signal(t_shape)
        with m.If(i_stream.valid & advance):
            m.d.sync += t_in.eq(wrap_incr(t_in, period))

        # Data registers have no reset, only the valid flags and slots (see MatVecCore).
        x = Signal(data.ArrayLayout(self._in_shape, lanes), reset_less=True)
        valid = Signal()
        t_cur = Signal(t_shape)
        # `t_next` is what the register holding `t_cur` loads on the next advance: a ROM
        # addressed with it has its data line up with the register's contents.
        t_next = t_in
        with m.If(advance):
            m.d.sync += [x.eq(i_stream.payload), valid.eq(i_stream.valid), t_cur.eq(t_in)]

        for k, plan in enumerate(self._plans):
            if plan.search == "parallel":
                x, valid, t_cur, t_next = self._parallel(m, k, plan, x, valid, t_cur, t_next,
                                                         advance)
            else:
                x, valid, t_cur, t_next = self._binary(m, k, plan, x, valid, t_cur, t_next,
                                                       advance)

        m.d.comb += advance.eq(skid_output(m, o_stream, valid, x))
        return m

    def _map(self, plan, count):
        """``base + step * count``."""
        prod = count if plan.step == 1 else count * C(plan.step)
        return C(plan.base) + prod

    def _parallel(self, m, k, plan, x, valid, t_cur, t_next, advance):
        lanes, n = self._lanes, plan.n
        t_shape = t_cur.shape()
        varies = any(len({tuple(r) for r in rows}) > 1 for rows in plan.rows)
        if varies and n:
            word = data.ArrayLayout(plan.thr_shape, n)
            rom = Memory(shape=data.ArrayLayout(word, lanes), depth=plan.period,
                         init=[[plan.rows[j][t] for j in range(lanes)]
                               for t in range(plan.period)])
            m.submodules[f"thresholds_{k}"] = rom
            rd = rom.read_port()
            m.d.comb += [rd.addr.eq(t_next), rd.en.eq(advance)]
            thr = [[rd.data[j][i] for i in range(n)] for j in range(lanes)]
        else:
            thr = [[C(v, plan.thr_shape) for v in plan.rows[j][0]] for j in range(lanes)]
        if plan.table and n:
            x, valid, thr, t_next, t_cur, _ = _table_register(
                m, advance, f"{k}", plan.thr_shape, x, valid, t_cur, thr)
        bits = [Signal(max(n, 1), name=f"cmp{k}_{j}", reset_less=True) for j in range(lanes)]
        y = Signal(data.ArrayLayout(plan.out_shape, lanes), name=f"y{k}", reset_less=True)
        valid_a, valid_b = Signal(name=f"valid{k}_a"), Signal(name=f"valid{k}_b")
        t_a, t_b = Signal(t_shape, name=f"t{k}_a"), Signal(t_shape, name=f"t{k}_b")
        with m.If(advance):
            m.d.sync += [valid_a.eq(valid), valid_b.eq(valid_a), t_a.eq(t_cur), t_b.eq(t_a)]
            for j in range(lanes):
                if n:
                    m.d.sync += bits[j].eq(Cat(x[j] >= thr[j][i] for i in range(n)))
                count = tree_sum([bits[j][i] for i in range(n)]) if n else C(0, 1)
                m.d.sync += y[j].eq(self._map(plan, count))
        return y, valid_b, t_b, t_a

    def _binary(self, m, k, plan, x, valid, t_cur, t_next, advance):
        lanes = self._lanes
        t_shape = t_cur.shape()
        prefix = [None] * lanes          # the bits decided so far, per lane (register)
        prefix_next = [None] * lanes     # what that register loads on the next advance
        ahead = [None] * lanes           # this level's two candidate thresholds (registers)
        for level in range(plan.levels):
            last = level == plan.levels - 1
            if plan.table and level:
                # A register stage before the tables are read: their address is the bits
                # decided so far as registered, not the comparator's output (MobileNetV1 at
                # 91.1 MHz on the ECP5: table register -> comparator -> the next level's
                # block RAM address, 11.0 ns).
                prefix_next = prefix
                x, valid, t_next, t_cur, prefix = _stage_register(
                    m, advance, f"{k}_{level}", "a", x, valid, t_cur, prefix)
            thr = []
            for j in range(lanes):
                table = plan.level_table(j, level)
                if ahead[j] is not None:     # chosen by the bit decided last
                    thr.append(Mux(prefix[j][0], ahead[j][1], ahead[j][0]))
                elif any(row != table[0] for row in table):
                    # Address: the channel's transfer slot and the bits decided so far.
                    init = [v for row in table for v in row]
                    rom = Memory(shape=plan.thr_shape, depth=len(init), init=init)
                    m.submodules[f"thresholds_{k}_{level}_{j}"] = rom
                    rd = rom.read_port()
                    addr = t_next if level == 0 else Cat(prefix_next[j], t_next)
                    m.d.comb += [rd.addr.eq(addr), rd.en.eq(advance)]
                    thr.append(rd.data)
                elif level == 0:
                    thr.append(C(table[0][0], plan.thr_shape))
                else:
                    consts = Array(C(v, plan.thr_shape) for v in table[0])
                    thr.append(consts[prefix[j]])
            if plan.table:
                x, valid, thr, t_next, t_cur, p_r = _table_register(
                    m, advance, f"{k}_{level}", plan.thr_shape, x, valid, t_cur, thr,
                    prefix if level else None)
                prefix = p_r or prefix
            bit = [x[j] >= thr[j] for j in range(lanes)]
            decided = [bit[j] if level == 0 else Cat(bit[j], prefix[j]) for j in range(lanes)]
            valid_n = Signal(name=f"valid{k}_{level}")
            t_n = Signal(t_shape, name=f"t{k}_{level}")
            with m.If(advance):
                m.d.sync += [valid_n.eq(valid), t_n.eq(t_cur)]
            if last:
                y = Signal(data.ArrayLayout(plan.out_shape, lanes), name=f"y{k}",
                           reset_less=True)
                with m.If(advance):
                    m.d.sync += [y[j].eq(self._map(plan, decided[j])) for j in range(lanes)]
                return y, valid_n, t_n, t_cur
            x_n = Signal.like(x, name=f"x{k}_{level}", reset_less=True)
            p_n = [Signal(level + 1, name=f"p{k}_{level}_{j}", reset_less=True)
                   for j in range(lanes)]
            with m.If(advance):
                m.d.sync += x_n.eq(x)
                m.d.sync += [p_n[j].eq(decided[j]) for j in range(lanes)]
            ahead = [self._ahead(m, k, plan, j, level + 1, prefix[j], advance)
                     for j in range(lanes)]
            x, valid, prefix, prefix_next = x_n, valid_n, p_n, decided
            t_next, t_cur = t_cur, t_n
        raise AssertionError("unreachable")  # pragma: no cover

    def _ahead(self, m, k, plan, j, level, prefix, advance):
        """The two thresholds level ``level`` of lane ``j`` may compare, registered a level
        early: a level whose thresholds are constants indexed by the bits decided so far
        (the same in every channel, no table register) would otherwise put a multiplexer of
        ``2**level`` constants (a LUT level per two address bits) before its comparator in
        one stage (the DS-CNN's thresholds at 100 MHz on the ECP5: 10.6 ns, four LUT levels,
        the carry chain and two more). Chosen there by the bit decided last (the low bit of
        the prefix: ``table[2 p + bit]``), so one LUT level is left before the comparator.
        None where the level has a table, or a multiplexer of two constants at most."""
        if level >= plan.levels or level < 2 or plan.table:
            return None
        table = plan.level_table(j, level)
        if any(row != table[0] for row in table):
            return None
        regs = []
        for bit in (0, 1):
            r = Signal(plan.thr_shape, name=f"thr{k}_{level}_{j}_{bit}", reset_less=True)
            consts = Array(C(v, plan.thr_shape) for v in table[0][bit::2])
            with m.If(advance):
                m.d.sync += r.eq(consts[prefix])
            regs.append(r)
        return regs


def _stage_register(m, advance, tag, suffix, x, valid, t_cur, prefix=None, loads=()):
    """A register stage of the binary search loaded on ``advance``: ``x``, ``valid``,
    ``t_cur``, the bits decided so far per lane (``prefix``, if given) and ``loads``, named
    after ``tag`` with ``suffix``. Returns the registered ``x, valid``, the stage's
    ``t_next, t_cur`` and the registered prefix."""
    x_r = Signal.like(x, name=f"x{tag}_{suffix}", reset_less=True)
    valid_r = Signal(name=f"valid{tag}_{suffix}")
    t_r = Signal(t_cur.shape(), name=f"t{tag}_{suffix}")
    p_r = None
    if prefix is not None:
        p_r = [Signal(len(p), name=f"p{tag}_{j}_{suffix}", reset_less=True)
               for j, p in enumerate(prefix)]
    with m.If(advance):
        m.d.sync += [x_r.eq(x), valid_r.eq(valid), t_r.eq(t_cur), *loads]
        m.d.sync += [r.eq(p) for r, p in zip(p_r or [], prefix or [], strict=True)]
    return x_r, valid_r, t_cur, t_r, p_r


def _table_register(m, advance, tag, thr_shape, x, valid, t_cur, thr, prefix=None):
    """A register stage between a threshold table and its comparators: ``x``, ``valid``,
    ``t_cur``, the thresholds ``thr`` (a list per lane, nested as given) and ``prefix`` (see
    :func:`_stage_register`) loaded on ``advance``. The table's data lines up with the
    registers loaded on this advance, which take it with them: no block RAM output feeds a
    comparator. Returns the registered ``x, valid, thr``, the stage's ``t_next, t_cur`` and
    the registered prefix."""
    loads = []

    def hold(value, name):
        if isinstance(value, list):
            return [hold(v, f"{name}_{i}") for i, v in enumerate(value)]
        reg = Signal(thr_shape, name=name, reset_less=True)
        loads.append(reg.eq(value))
        return reg
    thr_r = hold(thr, f"thr{tag}")
    x_r, valid_r, t_next, t_r, p_r = _stage_register(m, advance, tag, "r", x, valid, t_cur,
                                                     prefix, loads)
    return x_r, valid_r, thr_r, t_next, t_r, p_r
