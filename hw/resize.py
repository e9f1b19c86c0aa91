"""Streaming cores that move data without computing: nearest-neighbour resize and reorder.

:class:`ResizeCore` resizes a channels-last image stream by index maps (ONNX Resize / Upsample
with ``mode="nearest"``, the maps resolved at compile time); :class:`ReorderCore` buffers a
whole tensor and emits it in another stream order (a Transpose the next layer cannot absorb).

Its cycle figures are those of :mod:`onnx2fpga.plan.resize`, in the conventions of
:mod:`onnx2fpga.plan.cost`.
"""

from __future__ import annotations

import numpy as np
from amaranth import C, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..plan.checks import check_count
from ..plan.devices import NO_RW_CHECK
from ..plan.resize import ResizeGeometry, affine_loops, int_sequence
from .blocks import counter, int_shape, quiet_if_invalid, wrap_incr
from .memory import double_buffer_release, double_buffer_writer

__all__ = ["ReorderCore", "ResizeCore", "select_bit"]


# ---------------------------------------------------------------------------------------------
# Helpers


# ---------------------------------------------------------------------------------------------
# Nearest-neighbour resize: geometry and timing model


# ---------------------------------------------------------------------------------------------
# Nearest-neighbour resize: the core


class ResizeCore(wiring.Component):
    """Nearest-neighbour resize of a channels-last image stream by index maps.

    One inference is an image ``x[c, h, w]`` of ``channels`` x ``height`` x ``width``
    elements streamed in the order ``h, w, c`` (as :class:`~onnx2fpga.hw.window.SlidingWindowCore`
    takes it): transfer ``b`` carries, in lane ``j``, channel ``(b % folds)*lanes + j`` of
    pixel ``b // folds``, ``folds = channels // lanes``. The output is the image
    ``y[c, i, j] = x[c, rows[i], cols[j]]`` of ``len(rows)`` x ``len(cols)`` pixels in the same
    order (:func:`onnx2fpga.sim.golden.resize_nearest`). Inferences follow each other without
    a gap or a ``last`` flag; the core counts.

    Parameters
    ----------
    shape : IntType or Amaranth integer shape
        Element shape (input and output).
    channels, height, width : int
        Input image size; ``lanes`` must divide ``channels``.
    rows, cols : sequence of int
        Non-decreasing index maps into ``range(height)`` and ``range(width)``: repeated
        entries upsample, gaps downsample, and both may mix (ONNX ``asymmetric`` or
        ``half_pixel`` maps at any scale). Input rows no output row reads are taken and
        dropped.
    lanes : int
        Elements per transfer.
    buffer_rows : int, optional
        Input rows the row buffer holds, at least 1. By default
        :attr:`ResizeGeometry.full_rows`, the fewest that reach ``max(in_beats, out_beats)``
        cycles per inference: usually 2 (the next used row arrives while the current one is
        read).

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(shape, lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(shape, lanes)))``

    Structure: the row buffer is a :class:`~amaranth.lib.memory.Memory` (block RAM) of
    :attr:`buffer_depth` ``= buffer_rows * width * folds`` words of ``lanes * shape.width``
    bits, a ring of ``buffer_rows`` slots that takes the *used* input rows only (the ``u``-th
    used row, counted over all inferences, goes to slot ``u % buffer_rows``). The column map
    lives in a ROM of ``len(cols)`` words, ``cols[j] * folds`` each (:attr:`rom_bits`; none for
    one output column), read one column ahead; which input rows are used and which output
    rows start a new used row are constant bit tables in logic. :attr:`memory_bits` counts
    both memories.

    The writer takes a transfer of a dropped row at once, and one of a used row when its slot
    is free: the reader's current output row reads a used row less than ``buffer_rows``
    before it. The reader issues a transfer (a registered memory read) when the used row its
    output row reads has been written completely. Both are kept in one register, the used rows
    written completely counted from the first used row of the reader's inference, so the
    writer may run into the next inference as far as slots are free. A read never hits the
    slot being written.

    Timing: neither side waits within a row; :attr:`cycles` (:func:`resize_cycles`) per
    inference in the steady state, ``max(in_beats, out_beats)`` with the default buffer rows;
    :attr:`latency` (:func:`resize_latency`). Default buffer rows measured with the model
    over every map of ONNX Resize (``nearest``; coordinate transformations ``half_pixel``,
    ``half_pixel_symmetric``, ``pytorch_half_pixel``, ``align_corners``, ``asymmetric``; all
    four nearest modes; maps as :mod:`onnx.reference` computes them) from heights 1..12 to
    1..24 crossed with widths 1, 2, 3, 5, 8, 12 to 1, 2, 3, 5, 7, 8, 13, 24 (276 192
    geometries): 1 row in 7 %, 2 in 85 %, 3 in 8 %; 3 only where one dimension is upsampled
    and the other downsampled (integer factors too: 2 x 2 to 4 x 1), so that input and output
    transfer counts come close and the writer must run a row further ahead. A sweep of
    larger images (heights 16..40 to 1..100, 33 552 geometries) also needed at most 3. (The
    sweeps leave out the one decreasing map :mod:`onnx.reference` gives, 7 to 17 rows with the
    half-pixel transformations and ``round_prefer_*``: a float32 rounding artefact, which
    :class:`~onnx2fpga.ir.ResizeLayer` rejects.)
    ``i_stream.ready`` and ``o_stream.valid`` depend only on registers; the memory read
    enable and the counters follow ``o_stream.ready`` combinationally.
    """

    @classmethod
    def from_stage(cls, stage) -> ResizeCore:
        """The core of a ``"resize"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        p = stage.params
        return cls(stage.in_type, p["channels"], p["height"], p["width"], p["rows"], p["cols"],
                   stage.in_lanes)

    @quiet_if_invalid
    def __init__(self, shape, channels, height, width, rows, cols, lanes=1, *,
                 buffer_rows=None):
        elem = int_shape(shape)
        self._geom = ResizeGeometry.make(channels, height, width, rows, cols, lanes,
                                         buffer_rows)
        self._shape = elem
        layout = data.ArrayLayout(elem, self._geom.lanes)
        super().__init__({
            "i_stream": In(stream.Signature(layout)),
            "o_stream": Out(stream.Signature(layout)),
        })

    # -- Parameters and figures

    @property
    def geometry(self) -> ResizeGeometry:
        return self._geom

    @property
    def shape(self):
        return self._shape

    @property
    def channels(self) -> int:
        return self._geom.channels

    @property
    def lanes(self) -> int:
        return self._geom.lanes

    @property
    def folds(self) -> int:
        """Transfers per pixel, ``channels // lanes``."""
        return self._geom.folds

    @property
    def rows(self) -> tuple[int, ...]:
        return self._geom.rows

    @property
    def cols(self) -> tuple[int, ...]:
        return self._geom.cols

    @property
    def out_height(self) -> int:
        return self._geom.out_height

    @property
    def out_width(self) -> int:
        return self._geom.out_width

    @property
    def in_beats(self) -> int:
        """Input transfers per inference, ``height * width * folds``."""
        return self._geom.in_beats

    @property
    def out_beats(self) -> int:
        """Output transfers per inference, ``len(rows) * len(cols) * folds``."""
        return self._geom.out_beats

    @property
    def buffer_rows(self) -> int:
        return self._geom.buffer_rows

    @property
    def buffer_depth(self) -> int:
        """Words of the row buffer, ``buffer_rows * width * folds``."""
        return self._geom.buffer_depth

    @property
    def buffer_width(self) -> int:
        """Bits per row buffer word, ``lanes * shape.width``."""
        return self._geom.lanes * self._shape.width

    @property
    def buffer_bits(self) -> int:
        """Bits of the row buffer (block RAM), ``buffer_depth * buffer_width``."""
        return self.buffer_depth * self.buffer_width

    @property
    def rom_width(self) -> int:
        """Bits per column ROM word: enough for ``(width - 1) * folds``."""
        return max(1, ((self._geom.width - 1) * self._geom.folds).bit_length())

    @property
    def rom_bits(self) -> int:
        """Bits of the column ROM, ``len(cols) * rom_width`` (0 for one output column)."""
        return 0 if self.out_width == 1 else self.out_width * self.rom_width

    @property
    def memory_bits(self) -> int:
        """Bits of all memories, :attr:`buffer_bits` + :attr:`rom_bits`."""
        return self.buffer_bits + self.rom_bits

    @property
    def cycles(self) -> int:
        """Steady-state cycles per inference (:func:`resize_cycles`)."""
        return self._geom.cycles

    @property
    def latency(self) -> int:
        """Cycles from the first input transfer to the last output transfer of one inference
        on an idle core (:func:`resize_latency`)."""
        return self._geom.latency

    # -- Hardware

    def elaborate(self, platform):
        m = Module()
        g = self._geom
        i_stream, o_stream = self.i_stream, self.o_stream
        height, folds, lanes, slots = g.height, g.folds, g.lanes, g.buffer_rows
        oh_count, ow_count = g.out_height, g.out_width
        row_words, depth = g.row_words, g.buffer_depth
        used = g.used_rows
        n_used = len(used)

        m.submodules.buf = buf = Memory(shape=data.ArrayLayout(self._shape, lanes),
                                        depth=depth, init=[], attrs=NO_RW_CHECK)
        wr = buf.write_port()
        rd = buf.read_port()

        # `ahead`: used rows written completely, counted from the first used row of the
        # reader's inference; `cur`: the used row (same count) the reader's output row reads.
        ahead = Signal(range(n_used + slots + 1))
        cur = counter(n_used)

        # -- Writer: input row h, column word wcol; used rows go to the ring at waddr.
        h = counter(height)
        wcol = counter(row_words)
        used_bits = [r in used for r in range(height)]
        wused = Signal(init=used_bits[0])
        waddr = counter(depth)
        m.d.comb += i_stream.ready.eq(~wused | (ahead < cur + slots))
        take = i_stream.valid & i_stream.ready
        write = take & wused
        row_end = wcol == row_words - 1
        m.d.comb += [wr.addr.eq(waddr), wr.data.eq(i_stream.payload), wr.en.eq(write)]
        with m.If(take):
            m.d.sync += wcol.eq(wrap_incr(wcol, row_words))
            with m.If(row_end):
                m.d.sync += [h.eq(wrap_incr(h, height)),
                             wused.eq(select_bit(used_bits[1:] + used_bits[:1], h))]
        with m.If(write):
            m.d.sync += waddr.eq(wrap_incr(waddr, depth))
        row_written = write & row_end

        # -- Reader: output row i, column j, fold cf; slot_addr is the slot of used row `cur`,
        # col the word within the row, cols[j] * folds + cf.
        i = counter(oh_count)
        j = counter(ow_count)
        cf = counter(folds)
        slot_addr = counter(depth)
        col_table = [c * folds for c in g.cols]
        col = Signal(range(max(row_words, 2)), init=col_table[0])

        o_valid = Signal()
        advance = ~o_valid | o_stream.ready
        issue = advance & (ahead > cur)
        m.d.comb += [
            rd.addr.eq(slot_addr + col),
            rd.en.eq(issue),
            o_stream.valid.eq(o_valid),
            o_stream.payload.eq(rd.data),
        ]
        with m.If(advance):
            m.d.sync += o_valid.eq(issue)

        last_cf, last_j, last_i = cf == folds - 1, j == ow_count - 1, i == oh_count - 1
        col_step = issue & last_cf
        if ow_count == 1:
            next_col = C(col_table[0], len(col))
        else:
            # The column ROM's data is always cols[(j + 1) % len(cols)] * folds: its address
            # runs one column ahead of `j`, two while `j` steps. (Valid from cycle 1 on; the
            # reader's first issue comes later, after a whole row is written.)
            m.submodules.col_rom = col_rom = Memory(shape=unsigned(self.rom_width),
                                                    depth=ow_count, init=col_table)
            col_rd = col_rom.read_port()
            j1 = wrap_incr(j, ow_count)
            j2 = Mux(j >= ow_count - 2, j + 2 - ow_count, j + 2)
            m.d.comb += col_rd.addr.eq(Mux(col_step, j2, j1))
            next_col = col_rd.data

        def ring_next(addr):
            """The next slot's first word, ``addr + row_words`` modulo the ring."""
            if slots == 1:
                return addr
            return Mux(addr == depth - row_words, 0, addr + row_words)

        # Whether output row i + 1 (row 0 of the next inference after the last) starts a new
        # used row.
        new_next = [self.rows[k + 1] != self.rows[k] for k in range(oh_count - 1)] + [True]
        frame_done = Signal()
        with m.If(issue):
            m.d.sync += cf.eq(wrap_incr(cf, folds))
            with m.If(~last_cf):
                m.d.sync += col.eq(col + 1)
            with m.Else():
                m.d.sync += [j.eq(wrap_incr(j, ow_count)), col.eq(next_col)]
                with m.If(last_j):
                    m.d.sync += i.eq(wrap_incr(i, oh_count))
                    with m.If(select_bit(new_next, i)):
                        m.d.sync += slot_addr.eq(ring_next(slot_addr))
                        with m.If(last_i):
                            m.d.sync += cur.eq(0)
                            m.d.comb += frame_done.eq(1)
                        with m.Else():
                            m.d.sync += cur.eq(cur + 1)

        m.d.sync += ahead.eq(ahead + row_written - Mux(frame_done, n_used, 0))
        return m


# ---------------------------------------------------------------------------------------------
# Reorder


class ReorderCore(wiring.Component):
    """Buffer a whole tensor and emit it permuted: output stream position ``p`` carries input
    stream position ``order[p]``.

    One inference is ``n = len(order)`` elements, ``lanes`` per transfer; inferences follow
    each other without a gap or a ``last`` flag. With ``lanes > 1`` the permutation moves
    whole transfers (lane groups): ``order[k*lanes + j] == order[k*lanes] + j`` and
    ``order[k*lanes] % lanes == 0``, so output transfer ``k`` is input transfer
    ``order[k*lanes] // lanes`` unchanged.

    Parameters
    ----------
    shape : IntType or Amaranth integer shape
        Element shape (input and output).
    order : sequence of int
        A permutation of ``range(n)``.
    lanes : int
        Elements per transfer; must divide ``n``.

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(shape, lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(shape, lanes)))``

    Structure: a :class:`~amaranth.lib.memory.Memory` (block RAM) of two banks of
    ``words = n // lanes`` words of ``lanes * shape.width`` bits (:attr:`buffer_bits`): tensor
    ``t`` is written in input order into bank ``t % 2`` while bank ``(t + 1) % 2`` is read
    (double buffering). The read addresses come from nested counters when the permutation of
    the words has the form :func:`affine_loops` finds (every transpose; :attr:`addressing` is
    ``"counters"``): one counter per loop, and an address register that adds a constant chosen
    by the innermost loop that does not wrap. Otherwise they come from a ROM of the word
    permutation (``"rom"``, ``words`` words of :attr:`rom_width` bits, :attr:`rom_bits`), read
    one step ahead. :attr:`memory_bits` counts both memories.

    Timing: a bank is read once it holds a whole tensor, one transfer per cycle; the writer
    takes one transfer per cycle while its bank is free. :attr:`cycles` ``= words`` per
    inference in the steady state; :attr:`latency` ``= 2 * words`` (the tensor is written in
    ``words`` cycles, its first read is issued the cycle after, each transfer leaves one cycle
    after its issue). ``i_stream.ready`` and ``o_stream.valid`` depend only on registers; the
    memory read enable and the counters follow ``o_stream.ready`` combinationally.
    """

    @classmethod
    def from_stage(cls, stage) -> ReorderCore:
        """The core of a ``"reorder"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        return cls(stage.in_type, stage.params["order"], stage.in_lanes)

    @quiet_if_invalid
    def __init__(self, shape, order, lanes=1):
        elem = int_shape(shape)
        lanes = check_count("Lanes", lanes)
        arr = int_sequence("Order", order)
        n = len(arr)
        arr = arr.astype(np.int64)
        bad = np.flatnonzero((arr < 0) | (arr >= n))
        if bad.size:
            raise ValueError(f"Order must be a permutation of range({n}), but "
                             f"order[{bad[0]}] is {arr[bad[0]]}")
        counts = np.bincount(arr, minlength=n)
        if counts.max() > 1:
            v = int(np.argmax(counts > 1))
            raise ValueError(f"Order must be a permutation of range({n}), but {v} appears "
                             f"{counts[v]} times")
        if n % lanes:
            raise ValueError(f"Lanes must divide the tensor size {n}, not {lanes}")
        groups = arr.reshape(-1, lanes)
        heads = groups[:, 0]
        bad = np.flatnonzero(heads % lanes)
        if bad.size:
            k = int(bad[0]) * lanes
            raise ValueError(f"Order must move whole groups of {lanes} lanes: order[{k}] must "
                             f"be a multiple of {lanes}, not {arr[k]}")
        bad = np.argwhere(groups != heads[:, None] + np.arange(lanes))
        if bad.size:
            k = int(bad[0][0]) * lanes
            p = k + int(bad[0][1])
            raise ValueError(f"Order must move whole groups of {lanes} lanes: order[{p}] must "
                             f"be order[{k}] + {p - k} = {arr[k] + p - k}, not {arr[p]}")
        self._shape = elem
        self._lanes = lanes
        self._order = tuple(int(v) for v in arr)
        self._word_order = tuple(int(v) // lanes for v in heads)
        self._loops = affine_loops(self._word_order)
        layout = data.ArrayLayout(elem, lanes)
        super().__init__({
            "i_stream": In(stream.Signature(layout)),
            "o_stream": Out(stream.Signature(layout)),
        })

    # -- Parameters and figures

    @property
    def shape(self):
        return self._shape

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def order(self) -> tuple[int, ...]:
        return self._order

    @property
    def size(self) -> int:
        """Elements per inference, ``len(order)``."""
        return len(self._order)

    @property
    def words(self) -> int:
        """Transfers per inference (each way) and words per bank, ``len(order) // lanes``."""
        return len(self._word_order)

    @property
    def word_order(self) -> tuple[int, ...]:
        """The permutation of transfers: output transfer ``k`` is input transfer
        ``word_order[k]``."""
        return self._word_order

    @property
    def addressing(self) -> str:
        """``"counters"`` (the word permutation is :func:`affine_loops`) or ``"rom"``."""
        return "counters" if self._loops is not None else "rom"

    @property
    def loops(self) -> list[tuple[int, int]] | None:
        """The ``(count, stride)`` loops of the read addresses, innermost first, or None."""
        return None if self._loops is None else list(self._loops)

    @property
    def buffer_depth(self) -> int:
        """Words of the buffer memory, ``2 * words``."""
        return 2 * self.words

    @property
    def buffer_width(self) -> int:
        """Bits per buffer word, ``lanes * shape.width``."""
        return self._lanes * self._shape.width

    @property
    def buffer_bits(self) -> int:
        """Bits of the double buffer (block RAM), ``buffer_depth * buffer_width``."""
        return self.buffer_depth * self.buffer_width

    @property
    def rom_width(self) -> int:
        """Bits per address ROM word: enough for ``words - 1``."""
        return max(1, (self.words - 1).bit_length())

    @property
    def rom_bits(self) -> int:
        """Bits of the address ROM, ``words * rom_width`` (0 with counters)."""
        return 0 if self.addressing == "counters" else self.words * self.rom_width

    @property
    def memory_bits(self) -> int:
        """Bits of all memories, :attr:`buffer_bits` + :attr:`rom_bits`."""
        return self.buffer_bits + self.rom_bits

    @property
    def cycles(self) -> int:
        """Steady-state cycles per inference, ``words``."""
        return self.words

    @property
    def latency(self) -> int:
        """Cycles from the first input transfer to the last output transfer of one inference
        on an idle core, ``2 * words``."""
        return 2 * self.words

    # -- Hardware

    def elaborate(self, platform):
        m = Module()
        words = self.words
        i_stream, o_stream = self.i_stream, self.o_stream

        m.submodules.buf = buf = Memory(shape=data.ArrayLayout(self._shape, self._lanes),
                                        depth=2 * words, init=[], attrs=NO_RW_CHECK)
        wr = buf.write_port()
        rd = buf.read_port()

        # -- Writer: the banks in turn; full0/full1: a whole tensor not yet read.
        full, fill = double_buffer_writer(m, i_stream, wr, words)
        full0, full1 = full

        # -- Reader: bank rb, word address `addr` within the bank.
        rb = Signal()
        o_valid = Signal()
        advance = ~o_valid | o_stream.ready
        issue = advance & Mux(rb, full1, full0)
        done = Signal()           # the last issue of a tensor: its bank may be refilled
        if self._loops is not None:
            addr = Signal(range(max(words, 2)))
            digits = [counter(count) for count, _ in self._loops]
            last = [d == count - 1 for d, (count, _) in zip(digits, self._loops)]
            with m.If(issue):
                # Increment the innermost digit that does not wrap, clear the ones inside it:
                # the address moves by that loop's stride minus the inner loops' spans.
                inner_span = 0
                for k, (count, stride) in enumerate(self._loops):
                    step = stride - inner_span
                    cond = ~last[k] if k == 0 else ~last[k] & _all(last[:k])
                    with m.If(cond):
                        m.d.sync += [digits[k].eq(digits[k] + 1), addr.eq(addr + step)]
                        m.d.sync += [digits[i].eq(0) for i in range(k)]
                    inner_span += (count - 1) * stride
                with m.If(_all(last)):
                    m.d.sync += [addr.eq(0)] + [d.eq(0) for d in digits]
                    m.d.comb += done.eq(1)
        else:
            # The ROM's data is always word_order[p]: its address runs one step ahead of the
            # read counter `p` while it steps. (Valid from cycle 1 on; the first issue comes
            # after a whole tensor is written, at cycle 2 or later: words >= 2 here, since a
            # permutation of one word is the identity, which has counters.)
            p = counter(words)
            m.submodules.addr_rom = rom = Memory(shape=unsigned(self.rom_width), depth=words,
                                                 init=list(self._word_order))
            rom_rd = rom.read_port()
            m.d.comb += rom_rd.addr.eq(Mux(issue, wrap_incr(p, words), p))
            addr = rom_rd.data
            with m.If(issue):
                m.d.sync += p.eq(wrap_incr(p, words))
            m.d.comb += done.eq(issue & (p == words - 1))

        m.d.comb += [
            rd.addr.eq(Mux(rb, words, 0) + addr),
            rd.en.eq(issue),
            o_stream.valid.eq(o_valid),
            o_stream.payload.eq(rd.data),
        ]
        with m.If(advance):
            m.d.sync += o_valid.eq(issue)
        with m.If(done):
            m.d.sync += rb.eq(~rb)
        double_buffer_release(m, full, fill, done, rb)
        return m


def _all(bits):
    """The AND of a non-empty list of 1-bit values."""
    out = bits[0]
    for b in bits[1:]:
        out = out & b
    return out


def _bit_table(bits) -> tuple[int, int]:
    """A list of booleans as an integer constant and its width (for ``bit_select``)."""
    value = 0
    for k, b in enumerate(bits):
        value |= int(bool(b)) << k
    return value, max(1, len(bits))


def select_bit(bits, index):
    """``bits[index]`` of a constant table of booleans, ``index`` a signal."""
    value, width = _bit_table(bits)
    if value == 0:
        return C(0, 1)
    if value == (1 << width) - 1:
        return C(1, 1)
    return C(value, width).bit_select(index, 1)
