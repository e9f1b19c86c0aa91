"""Stream plumbing: a FIFO and a lane-count (width) converter, both value- and order-preserving.
"""

from __future__ import annotations

from amaranth import (
    Elaboratable,
    Module,
    Mux,
    Signal,
)
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..plan import plumbing as timing
from ..plan.checks import check_count
from ..plan.devices import NO_RW_CHECK, block_ram_shapes
from .blocks import counter, int_shape, quiet_if_invalid, skid_output, wrap_incr

__all__ = ["StreamFIFO", "WidthConverter"]



class StreamFIFO(wiring.Component):
    """A first-in first-out queue of ``lanes``-wide transfers.

    Depth 1 is a single pipeline register (full throughput; ``i_stream.ready`` follows
    ``o_stream.ready`` combinationally while it is full); depth 2 a skid buffer (an output
    register and a register beside it for the transfer that arrives while the output is held:
    ``i_stream.ready`` and the output both come from registers, so that no ready or data path
    runs through it; latency 1, and on every cycle the same transfers as a
    :class:`~amaranth.lib.fifo.SyncFIFO` of depth 2; with ``in_register``, two registers
    written in turn straight from the input instead); depths 3..4 use
    :class:`amaranth.lib.fifo.SyncFIFO` (storage in flip-flops, latency 1); deeper queues use
    :class:`amaranth.lib.fifo.SyncFIFOBuffered` (storage in block RAM, latency 2), whose
    output comes straight from the block RAM unless ``out_register`` puts a pipeline register
    (as depth 1) behind it (latency 3; the storage then in column slices that each fit one
    ECP5 block RAM, :class:`_SlicedQueue`).

    Parameters
    ----------
    shape : IntType or Amaranth integer shape
        Element shape.
    lanes : int
        Elements per transfer.
    depth : int
        Number of transfers the queue holds, at least 1.
    out_register : bool
        For a queue in block RAM (depth over 4): a register behind its output.
    in_register : bool
        For depth 2: two registers that each take the input with no logic in front (the
        output picks one through a multiplexer), instead of the skid buffer's output register
        behind a multiplexer of the input and the register beside it. The same transfers on
        every cycle; for a block RAM's read, whose 5.8 ns clock-to-out on an ECP5 leaves
        little for logic in front of the first register.

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(shape, lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(shape, lanes)))``
        One transfer per cycle on each side; ``latency`` cycles from a write to its read.
    """

    @classmethod
    def from_stage(cls, stage) -> StreamFIFO:
        """The core of a ``"fifo"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        return cls(stage.out_type, stage.out_lanes, stage.params["depth"],
                   out_register=stage.params.get("out_register", False),
                   in_register=stage.params.get("in_register", False))

    @quiet_if_invalid
    def __init__(self, shape, lanes, depth, *, out_register=False, in_register=False):
        self._shape = int_shape(shape)
        self._lanes = check_count("Lanes", lanes)
        self._depth = check_count("FIFO depth", depth)
        self._out_register = bool(out_register) and self._depth > timing.FLOP_FIFO_DEPTH
        self._in_register = bool(in_register) and self._depth == 2
        layout = data.ArrayLayout(self._shape, self._lanes)
        super().__init__({
            "i_stream": In(stream.Signature(layout)),
            "o_stream": Out(stream.Signature(layout)),
        })

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def latency(self) -> int:
        """Cycles from a write to the earliest read of that transfer."""
        return timing.fifo_latency(self._depth, self._out_register)

    def elaborate(self, platform):
        m = Module()
        i_stream, o_stream = self.i_stream, self.o_stream
        if self._depth == 1:
            _register(m, i_stream, o_stream)
            return m
        if self._depth == 2:
            (_pair if self._in_register else _skid)(m, i_stream, o_stream)
            return m
        if self._out_register:
            m.submodules.queue = queue = _SlicedQueue(self._shape.width * self._lanes,
                                                      self._depth)
            m.d.comb += [queue.w_data.eq(i_stream.payload), queue.w_en.eq(i_stream.valid),
                         i_stream.ready.eq(queue.w_rdy)]
            reg_in = stream.Signature(self._shape.width * self._lanes).flip().create()
            m.d.comb += [reg_in.payload.eq(queue.r_data), reg_in.valid.eq(queue.r_rdy),
                         queue.r_en.eq(reg_in.ready)]
            _register(m, reg_in, o_stream)
            return m
        width = self._shape.width * self._lanes
        cls = fifo.SyncFIFO if self._depth <= timing.FLOP_FIFO_DEPTH else fifo.SyncFIFOBuffered
        m.submodules.fifo = q = cls(width=width, depth=self._depth)
        m.d.comb += [
            q.w_data.eq(i_stream.payload),
            q.w_en.eq(i_stream.valid),
            i_stream.ready.eq(q.w_rdy),
            o_stream.payload.eq(q.r_data),
            o_stream.valid.eq(q.r_rdy),
            q.r_en.eq(o_stream.ready),
        ]
        return m



def slice_bits(width: int, depth: int) -> int:
    """Bits per column slice of a queue's storage of ``depth`` rows of ``width`` bits (see
    :class:`_SlicedQueue`): the widest slice whose rows fit one DP16KD
    (:func:`~onnx2fpga.plan.devices.block_ram_shapes`), so that a slice is one column of
    block RAMs with no multiplexer behind it; ``width`` when all of it fits or when
    ``depth`` is beyond a block's 16,384 rows."""
    for bits, rows in reversed(block_ram_shapes("ecp5")):
        if depth <= rows:
            return min(width, bits)
    return width


class _SlicedQueue(Elaboratable):
    """A first-in first-out queue in memory, cycle for cycle
    :class:`amaranth.lib.fifo.SyncFIFOBuffered` (``w_data``, ``w_en``, ``w_rdy``,
    ``r_data``, ``r_en``, ``r_rdy``; ``depth - 1`` rows in memory, the head in the read
    port's register), its storage cut into column slices of ``bits`` bits (default
    :func:`slice_bits`): each slice's rows fit one block RAM, so that no block RAM's output
    passes a multiplexer of blocks chained in depth. (An 8-bit skip queue of ResNet-8 in
    five DP16KD chained in depth, read through their multiplexer into the register behind
    the queue, was its critical path at 100 MHz: 10.6 ns, 5.8 of it the block RAM's
    clock-to-out.)"""

    def __init__(self, width: int, depth: int, bits=None):
        self.width, self.depth = width, depth
        self.bits = slice_bits(width, depth - 1) if bits is None else bits
        self.w_data, self.w_en, self.w_rdy = Signal(width), Signal(), Signal()
        self.r_data, self.r_en, self.r_rdy = Signal(width), Signal(), Signal()

    def elaborate(self, platform):
        m = Module()
        rows = self.depth - 1
        level = Signal(range(rows + 1))         # rows held in memory
        produce, consume = Signal(range(rows)), Signal(range(rows))
        write = self.w_en & self.w_rdy
        read = (level != 0) & (~self.r_rdy | self.r_en)
        m.d.comb += self.w_rdy.eq(level != rows)
        step = self.bits
        for lo in range(0, self.width, step):
            hi = min(self.width, lo + step)
            # Reads only with rows held, writes only with rows free: the read and write
            # addresses differ whenever both are enabled (NO_RW_CHECK).
            mem = Memory(shape=hi - lo, depth=rows, init=[], attrs=NO_RW_CHECK)
            m.submodules[f"storage_{lo // step}"] = mem
            w_port, r_port = mem.write_port(), mem.read_port()
            m.d.comb += [w_port.addr.eq(produce), w_port.data.eq(self.w_data[lo:hi]),
                         w_port.en.eq(write), r_port.addr.eq(consume), r_port.en.eq(read),
                         self.r_data[lo:hi].eq(r_port.data)]
        with m.If(write):
            m.d.sync += produce.eq(wrap_incr(produce, rows))
        with m.If(read):
            m.d.sync += [consume.eq(wrap_incr(consume, rows)), self.r_rdy.eq(1)]
        with m.Elif(self.r_en):
            m.d.sync += self.r_rdy.eq(0)
        with m.If(write & ~read):
            m.d.sync += level.eq(level + 1)
        with m.Elif(read & ~write):
            m.d.sync += level.eq(level - 1)
        return m


def _register(m, i_stream, o_stream) -> None:
    """A pipeline register from ``i_stream`` to ``o_stream``: full throughput,
    ``i_stream.ready`` following ``o_stream.ready`` combinationally while it is full."""
    full = Signal()
    m.d.comb += [
        i_stream.ready.eq(~full | o_stream.ready),
        o_stream.valid.eq(full),
    ]
    with m.If(o_stream.ready):
        m.d.sync += full.eq(0)
    with m.If(i_stream.valid & i_stream.ready):
        m.d.sync += [full.eq(1), o_stream.payload.eq(i_stream.payload)]


class WidthConverter(wiring.Component):
    """Regroup a stream of ``in_lanes``-wide transfers into ``out_lanes``-wide transfers.

    One lane count must divide the other. Element order is kept: the elements of consecutive
    input transfers are concatenated (lane 0 first) and cut into output transfers.

    Parameters
    ----------
    shape : IntType or Amaranth integer shape
        Element shape.
    in_lanes, out_lanes : int
        Elements per input and per output transfer.

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(shape, in_lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(shape, out_lanes)))``

    Timing: equal lane counts are a wire. Gathering (``out_lanes = k * in_lanes``) outputs one
    cycle after the ``k``-th input transfer and accepts an input every cycle. Splitting
    (``in_lanes = k * out_lanes``) outputs the ``k`` pieces in the ``k`` cycles after the input
    transfer and accepts the next input in the cycle its last piece leaves. In both cases an
    output that is not taken moves to a skid register, so that ``o_stream.ready`` enables no
    data register and ``i_stream.ready`` is a function of registers only.
    """

    @classmethod
    def from_stage(cls, stage) -> WidthConverter:
        """The core of a ``"convert"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        return cls(stage.out_type, stage.in_lanes, stage.out_lanes)

    @quiet_if_invalid
    def __init__(self, shape, in_lanes, out_lanes):
        self._shape = int_shape(shape)
        self._in_lanes = check_count("Input lanes", in_lanes)
        self._out_lanes = check_count("Output lanes", out_lanes)
        if self._in_lanes % self._out_lanes and self._out_lanes % self._in_lanes:
            raise ValueError(f"One lane count must divide the other, not in_lanes="
                             f"{in_lanes} and out_lanes={out_lanes}")
        super().__init__({
            "i_stream": In(stream.Signature(data.ArrayLayout(self._shape, self._in_lanes))),
            "o_stream": Out(stream.Signature(data.ArrayLayout(self._shape, self._out_lanes))),
        })

    @property
    def in_lanes(self) -> int:
        return self._in_lanes

    @property
    def out_lanes(self) -> int:
        return self._out_lanes

    def elaborate(self, platform):
        m = Module()
        i_stream, o_stream = self.i_stream, self.o_stream
        n_in, n_out = self._in_lanes, self._out_lanes
        bits = self._shape.width
        if n_in == n_out:
            wiring.connect(m, wiring.flipped(i_stream), wiring.flipped(o_stream))
            return m
        if n_out > n_in:                   # gather k inputs into one output
            k = n_out // n_in
            buf = Signal(n_out * bits)
            count = counter(k)
            o_valid = Signal()
            free = skid_output(m, o_stream, o_valid, buf, free_copy=True)
            m.d.comb += i_stream.ready.eq(free)
            with m.If(o_valid & free):     # the word left: sent, or to the skid register
                m.d.sync += o_valid.eq(0)
            with m.If(i_stream.valid & i_stream.ready):
                with m.Switch(count):
                    for c in range(k):
                        with m.Case(c):
                            m.d.sync += buf.word_select(c, n_in * bits).eq(i_stream.payload)
                m.d.sync += count.eq(wrap_incr(count, k))
                with m.If(count == k - 1):
                    m.d.sync += o_valid.eq(1)
            return m
        k = n_in // n_out                   # split one input into k outputs
        word = Signal(n_in * bits)
        count = counter(k)
        full = Signal()
        last = count == k - 1
        free = skid_output(m, o_stream, full, word[:n_out * bits], free_copy=True)
        m.d.comb += i_stream.ready.eq(~full | (free & last))
        with m.If(full & free):            # a piece left: sent, or to the skid register
            m.d.sync += [word.eq(word >> (n_out * bits)), count.eq(wrap_incr(count, k))]
            with m.If(last):
                m.d.sync += full.eq(0)
        with m.If(i_stream.valid & i_stream.ready):
            m.d.sync += [word.eq(i_stream.payload), full.eq(1)]
        return m


def _pair(m, i_stream, o_stream) -> None:
    """Two registers from ``i_stream`` to ``o_stream``, written in turn straight from the
    input and read in turn through a multiplexer: two transfers, ``i_stream.ready`` and
    ``o_stream.valid`` from registers, full throughput."""
    regs = [Signal.like(i_stream.payload, name=f"entry_{k}") for k in range(2)]
    w_sel, r_sel = Signal(), Signal()
    level = Signal(range(3))
    m.d.comb += [i_stream.ready.eq(level != 2), o_stream.valid.eq(level != 0),
                 o_stream.payload.eq(Mux(r_sel, regs[1], regs[0]))]
    write = i_stream.valid & i_stream.ready
    read = o_stream.valid & o_stream.ready
    with m.If(write):
        m.d.sync += w_sel.eq(~w_sel)
        for k in range(2):
            with m.If(w_sel == k):
                m.d.sync += regs[k].eq(i_stream.payload)
    with m.If(read):
        m.d.sync += r_sel.eq(~r_sel)
    with m.If(write & ~read):
        m.d.sync += level.eq(level + 1)
    with m.Elif(read & ~write):
        m.d.sync += level.eq(level - 1)


def _skid(m, i_stream, o_stream) -> None:
    """A skid buffer from ``i_stream`` to ``o_stream``: two transfers, ``i_stream.ready``
    and ``o_stream`` from registers, full throughput."""
    full = Signal()     # the output register holds a transfer
    skid = Signal()     # so does the register beside it (only while the output is held)
    held = Signal.like(i_stream.payload)
    take = i_stream.valid & ~skid
    m.d.comb += [i_stream.ready.eq(~skid), o_stream.valid.eq(full)]
    with m.If(~full | o_stream.ready):      # the output register is free for the next cycle
        with m.If(skid):
            m.d.sync += [o_stream.payload.eq(held), skid.eq(0)]
        with m.Elif(take):
            m.d.sync += o_stream.payload.eq(i_stream.payload)
        m.d.sync += full.eq(skid | take)
    with m.Elif(take):
        m.d.sync += [held.eq(i_stream.payload), skid.eq(1)]
