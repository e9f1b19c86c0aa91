"""Elementwise functions by lookup table: the :class:`LutCore`."""

from __future__ import annotations

from math import gcd

from amaranth import C, Cat, Module, Shape, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..ir.stages import LutStage
from ..plan.checks import check_count
from ..plan.lut import lut_latency
from .blocks import int_shape, quiet_if_invalid, skid_output, wrap_incr

__all__ = ["LutCore"]


class LutCore(wiring.Component):
    """Pipelined elementwise function of one integer by a table: a
    :class:`~onnx2fpga.ir.LutStage`, exactly as :func:`onnx2fpga.sim.golden.lookup`::

        y = table[c, x - in_lo]

    Channels cycle as in :class:`~onnx2fpga.hw.requant.RequantCore`: lane ``j`` of transfer
    ``t`` is channel ``(t*lanes + j) % channels``. Each lane reads its own ROM (one read
    port each), addressed by the low bits of ``x - in_lo`` and, when the table differs
    between the channels the lane sees, the lane's transfer slot in the period of
    ``channels // gcd(channels, lanes)`` transfers. The ROM is ``2**k`` words per slot,
    ``k`` the bits of the table's length; a board build maps it to block RAM or LUTs as the
    memory rules say (:func:`onnx2fpga.plan.devices.memory_mapping`). Inputs outside
    ``in_lo .. in_lo + n - 1`` read an unspecified entry: the planner cuts a table to the
    range its input can take.

    Parameters
    ----------
    stage : LutStage
        The table, with 1 or ``channels`` rows.
    channels : int
        Number of channels the rows cycle through.
    lanes : int
        Elements per transfer.
    in_shape : IntType or Amaranth integer shape
        Type of the input elements.

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(in_shape, lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(out_shape, lanes)))``
        ``out_shape`` is the shape of ``stage.out_type``.

    Timing: one transfer per cycle; latency 2 cycles (the ROM's read register, then an
    output register; :func:`onnx2fpga.plan.lut.lut_latency`). An output that is not taken
    moves to a skid register; the pipeline stalls as a whole while both hold one, and
    ``i_stream.ready`` is a function of registers only.
    """

    @classmethod
    def from_stage(cls, stage) -> LutCore:
        """The core of a ``"lut"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        stages = stage.params["stages"]
        if len(stages) != 1:
            raise ValueError(f"A lut stage holds one LutStage, not {len(stages)}")
        return cls(stages[0], stage.params["channels"], stage.in_lanes, stage.in_type)

    @quiet_if_invalid
    def __init__(self, stage, channels, lanes, in_shape):
        if not isinstance(stage, LutStage):
            raise TypeError(f"Stage must be a LutStage, not {stage!r}")
        channels = check_count("Channels", channels)
        lanes = check_count("Lanes", lanes)
        shape = int_shape(in_shape)
        rows = stage.table.shape[0]
        if rows not in (1, channels):
            raise ValueError(f"Table must have 1 or {channels} rows, not {rows}")
        self._stage = stage
        self._channels, self._lanes, self._in_shape = channels, lanes, shape
        self._out_shape = int_shape(stage.out_type)
        n = stage.table.shape[1]
        self._index_bits = max(1, (n - 1).bit_length())
        self._period = channels // gcd(channels, lanes)
        super().__init__({
            "i_stream": In(stream.Signature(data.ArrayLayout(shape, lanes))),
            "o_stream": Out(stream.Signature(data.ArrayLayout(self._out_shape, lanes))),
        })

    @property
    def stage(self) -> LutStage:
        return self._stage

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
    def latency(self) -> int:
        """Cycles from an input transfer to the output transfer of the same elements."""
        return lut_latency()

    def lane_words(self, j: int) -> list[list[int]]:
        """The table rows lane ``j`` reads, one per transfer slot of the period (a single
        one when they are all equal), each padded to ``2**k`` words."""
        table = self._stage.table
        size = 1 << self._index_bits
        slots = []
        for p in range(self._period):
            row = table[(p * self._lanes + j) % self._channels if len(table) > 1 else 0]
            slots.append([int(v) for v in row] + [0] * (size - len(row)))
        if all(s == slots[0] for s in slots):
            slots = slots[:1]
        return slots

    def elaborate(self, platform):
        m = Module()
        i_stream, o_stream = self.i_stream, self.o_stream
        period = self._period

        advance = Signal()                  # the pipeline shifts (see skid_output)
        m.d.comb += i_stream.ready.eq(advance)

        t_in = Signal(range(max(period, 2)))
        with m.If(i_stream.valid & advance):
            m.d.sync += t_in.eq(wrap_incr(t_in, period))

        valid_rd, valid = Signal(), Signal()
        y = Signal(data.ArrayLayout(self._out_shape, self._lanes), reset_less=True)
        with m.If(advance):
            m.d.sync += [valid_rd.eq(i_stream.valid), valid.eq(valid_rd)]
        for j in range(self._lanes):
            slots = self.lane_words(j)
            rom = Memory(shape=self._out_shape, depth=len(slots) << self._index_bits,
                         init=[v for s in slots for v in s])
            m.submodules[f"table_{j}"] = rom
            rd = rom.read_port()
            index = (i_stream.payload[j] - C(self._stage.in_lo))[:self._index_bits]
            m.d.comb += [rd.addr.eq(index if len(slots) == 1 else Cat(index, t_in)),
                         rd.en.eq(advance)]
            with m.If(advance):
                m.d.sync += y[j].eq(rd.data)

        m.d.comb += advance.eq(skid_output(m, o_stream, valid, y))
        return m
