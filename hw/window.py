"""Streaming sliding-window generator: the input half of the convolution and pooling layers.

:class:`SlidingWindowCore` is the equivalent of FINN's ConvolutionInputGenerator: it takes an
image streamed channels-last and emits, for every output pixel, the window of input pixels the
ONNX Conv / MaxPool / AveragePool operator reads there (padding positions carry a constant
``pad_value``), ready for a matrix-vector unit or a :class:`~onnx2fpga.hw.reduce.WindowReduceCore`.

Its cycle figures are those of :mod:`onnx2fpga.plan.window`, in the conventions of
:mod:`onnx2fpga.plan.cost`.
"""

from __future__ import annotations

import numpy as np
from amaranth import C, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..plan.devices import NO_RW_CHECK
from ..plan.window import WindowGeometry
from .blocks import (
    counter,
    int_shape,
    quiet_if_invalid,
    shape_range,
    wrap_incr,
)

__all__ = ["SlidingWindowCore"]


# ---------------------------------------------------------------------------------------------
# Geometry and timing model


# ---------------------------------------------------------------------------------------------
# The core


class SlidingWindowCore(wiring.Component):
    """Sliding-window generator over a channels-last image stream (ONNX Conv/Pool windows).

    One inference is an image ``x[c, h, w]`` of ``channels`` x ``height`` x ``width`` elements
    (NCHW without the batch), streamed in the order ``h, w, c``: input transfer ``b`` carries,
    in lane ``j``, element ``c = (b % folds)*lanes + j`` of pixel ``p = b // folds``
    (``h = p // width``, ``w = p % width``), ``folds = channels // lanes``. Inferences follow
    each other without a gap or a ``last`` flag; the core counts.

    For every output pixel ``(oh, ow)`` in row-major order, for ``ki`` in ``range(kh)``, ``kj``
    in ``range(kw)`` and ``cf`` in ``range(folds)``, the core emits one transfer whose lane
    ``j`` is ``x[cf*lanes + j, ih, iw]`` with ``ih = oh*sh - top + ki*dh`` and
    ``iw = ow*sw - left + kj*dw``, or ``pad_value`` where ``(ih, iw)`` lies outside the image.
    The output size is ``out_height = (height + top + bottom - (kh-1)*dh - 1) // sh + 1`` and
    likewise ``out_width``: ONNX's floor mode (``ceil_mode`` is larger bottom/right pads).

    Parameters
    ----------
    shape : IntType or Amaranth integer shape
        Element shape.
    channels, height, width : int
        Input image size.
    kernel, stride, dilation : (int, int)
        ``(kh, kw)``, ``(sh, sw)``, ``(dh, dw)``, all at least 1. A 1-D window is ``height=1``
        and ``kernel=(1, k)``.
    pads : (int, int, int, int)
        ONNX order ``(top, left, bottom, right)``, not negative. A pad may exceed the kernel
        extent: windows lying wholly in the padding give ``pad_value`` only.
    lanes : int
        Elements per transfer; must divide ``channels``.
    pad_value : int
        The value of padding positions; must lie within ``shape`` (for example the input zero
        point of a quantized convolution, or the lowest value for a max pool).
    buffer_rows : int, optional
        Line buffer rows ``R``. By default :attr:`WindowGeometry.full_rows`, which lets writing
        and reading overlap fully; at least :attr:`WindowGeometry.min_rows`, where the writer
        waits for the reader at every output row.
    read_register : bool
        A second register stage behind the memory read: the read data goes into a register
        with no reset and nothing in front (an ECP5 block RAM's own output register, which
        :mod:`onnx2fpga.boards.outreg` puts there; 0.97 ns from the clock instead of 5.8),
        the pad multiplexer behind it. The output moves one cycle later (:attr:`latency` + 1);
        the values and :attr:`cycles` are the same. (The line buffer's read, routed across
        the die into the pad multiplexer, was MobileNetV1's critical path at 100 MHz on the
        ULX3S-85F: 10.6 to 11.6 ns.)

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(shape, lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(shape, lanes)))``

    Structure: the line buffer is one :class:`~amaranth.lib.memory.Memory` (block RAM) of
    :attr:`buffer_depth` ``= R * width * folds`` words of ``lanes * shape.width`` bits
    (:attr:`buffer_width`), a ring of ``R`` input rows: input row ``g`` (counted over all
    inferences) goes to slot ``g % R``. By default ``R`` (:attr:`WindowGeometry.full_rows`) is
    the rows one window spans plus the stride rows, so that the next output row's input
    arrives while the current one is read: ``kh_extent + sh`` in the usual layers (5 for a
    3x3 stride-2 convolution, 6 for a 5x5 stride-1 one), ``2 * height`` when the window is as
    tall as the image (double buffering). Less than the image unless ``kh_extent + sh`` reaches
    the image height. With ``buffer_rows`` down to :attr:`WindowGeometry.min_rows` (the rows
    one window spans) it still works, but writing waits for reading at every output row.

    The writer takes an input transfer whenever the slot of its row is free: the reader's
    current output row no longer reads the row ``R`` rows earlier. The reader issues a transfer
    (a memory read, or the pad value) whenever the last input row its output row reads has been
    written completely; both counters live in one register, the writer's row relative to the
    start of the reader's inference, so the reader of one inference never reads rows of
    another and the writer may run up to ``R`` rows into the next inference. Neither waits
    within a row, and neither can wait for the other at the same time (no deadlock): the reader
    waits only for rows below ``first + R``, which the writer may write. The writer may start
    the next inference while the reader finishes the current one, as far as slots are free; a
    reader output row lying wholly in the top padding waits for the previous inference's input
    to be complete (it reads nothing, but keeps the register bounded). The memory read is
    registered (1 cycle, read port enabled only while the output register moves), so the output
    register is the memory's data register; a read never hits the slot being written, so no
    read-during-write transparency is needed.

    Timing: one output transfer per cycle while its rows are there; :attr:`cycles`
    (:func:`window_cycles`) per inference in the steady state, ``max(in_beats, out_beats)`` with
    the default buffer; :attr:`latency` (:func:`window_latency`),
    ``min(height, kh_extent - top) * width * folds + out_beats`` in the usual layers (the
    first window waits for the input rows down to its bottom edge). ``i_stream.ready`` and
    ``o_stream.valid`` depend only on registers; the memory read enable and the counters follow
    ``o_stream.ready`` combinationally.
    """

    @classmethod
    def from_stage(cls, stage) -> SlidingWindowCore:
        """The core of a ``"window"`` :class:`~onnx2fpga.plan.stage.Stage` (a convolution's or
        pool's window, or a pad)."""
        p = stage.params
        return cls(stage.in_type, p["channels"], p["height"], p["width"], p["kernel"],
                   p["stride"], p["dilation"], p["pads"], stage.in_lanes, p["pad_value"],
                   read_register=bool(p.get("read_register", False)))

    @quiet_if_invalid
    def __init__(self, shape, channels, height, width, kernel, stride=(1, 1), dilation=(1, 1),
                 pads=(0, 0, 0, 0), lanes=1, pad_value=0, *, buffer_rows=None,
                 read_register=False):
        elem = int_shape(shape)
        self._geom = WindowGeometry.make(channels, height, width, kernel, stride, dilation,
                                         pads, lanes, buffer_rows)
        if not isinstance(pad_value, (int, np.integer)) or isinstance(pad_value, bool):
            raise TypeError(f"Pad value must be an integer, not {pad_value!r}")
        lo, hi = shape_range(elem)
        if not lo <= pad_value <= hi:
            raise ValueError(f"Pad value must lie within [{lo}, {hi}] of the element shape "
                             f"{elem!r}, not {pad_value}")
        self._shape = elem
        self._pad_value = int(pad_value)
        self._read_register = bool(read_register)
        layout = data.ArrayLayout(elem, self._geom.lanes)
        super().__init__({
            "i_stream": In(stream.Signature(layout)),
            "o_stream": Out(stream.Signature(layout)),
        })

    # -- Parameters and figures

    @property
    def geometry(self) -> WindowGeometry:
        return self._geom

    @property
    def shape(self):
        return self._shape

    @property
    def pad_value(self) -> int:
        return self._pad_value

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
        """Output transfers per inference, ``out_height * out_width * kh * kw * folds``."""
        return self._geom.out_beats

    @property
    def buffer_rows(self) -> int:
        """Input rows ``R`` the line buffer holds."""
        return self._geom.rows

    @property
    def buffer_depth(self) -> int:
        """Words of the line buffer memory, ``buffer_rows * width * folds``."""
        return self._geom.buffer_depth

    @property
    def buffer_width(self) -> int:
        """Bits per line buffer word, ``lanes * shape.width``."""
        return self._geom.lanes * self._shape.width

    @property
    def buffer_bits(self) -> int:
        """Bits of the line buffer, ``buffer_depth * buffer_width``."""
        return self.buffer_depth * self.buffer_width

    @property
    def cycles(self) -> int:
        """Steady-state cycles per inference (:func:`window_cycles`)."""
        return self._geom.cycles

    @property
    def latency(self) -> int:
        """Cycles from the first input transfer to the last output transfer of one inference
        on an idle core (:func:`window_latency`, and one more with ``read_register``)."""
        return self._geom.latency + self._read_register

    # -- Hardware

    def elaborate(self, platform):
        m = Module()
        g = self._geom
        i_stream, o_stream = self.i_stream, self.o_stream
        height, width, folds, lanes, rows = g.height, g.width, g.folds, g.lanes, g.rows
        kh, kw = g.kernel
        sh, sw = g.stride
        dh, dw = g.dilation
        top, left, _, _ = g.pads
        ext_h = g.extent[0]
        oh_count, ow_count = g.out_height, g.out_width
        row_words = width * folds                  # words per input row
        depth = rows * row_words

        # A read never hits the slot being written (see the docstring): no read-before-write
        # logic behind the block RAM (NO_RW_CHECK).
        m.submodules.buf = buf = Memory(shape=data.ArrayLayout(self._shape, lanes),
                                        depth=depth, init=[], attrs=NO_RW_CHECK)
        wr = buf.write_port()
        rd = buf.read_port()

        # `ahead`: input rows written completely, counted from the first row of the reader's
        # current inference. Negative while the writer finishes the previous inference.
        ahead = Signal(range(-height, height + rows + 1))
        # Input rows [need_lo, need_hi) of that inference the reader's output row reads; the
        # writer may run `rows` rows past need_lo, kept as `lo_bound` = need_lo + rows (and the
        # bound after the row, `lo_next`, a row ahead: see hi_next).
        lo_bound = Signal(range(rows, height + rows + 1), init=g.row_span(0)[0] + rows)
        need_hi = Signal(range(height + 1), init=g.row_span(0)[1])
        hi_first = height + g.row_span(0)[1]
        lo_first = height + g.row_span(0)[0] + rows
        lo_next = Signal(range(rows, lo_first + 1),
                         init=lo_first if oh_count == 1 else g.row_span(1)[0] + rows)

        # -- Writer: the write address runs through the ring; a row is `row_words` transfers.
        waddr = counter(depth)
        wcol = counter(row_words)
        # room == (ahead < lo_bound) on every cycle, from a register (set at the end): the
        # addition and comparison in front of the input's ready, which drives the block RAM
        # read enable of the queue before it, was ResNet-8's critical path (10.7 ns).
        room = Signal(init=int(0 < g.row_span(0)[0] + rows))
        m.d.comb += i_stream.ready.eq(room)
        write = i_stream.valid & i_stream.ready
        # wcol's last value as a flag register (as the reader's counters below): row_done
        # reaches rows_ok's and room's next values through their multiplexers.
        last_wcol = Signal(init=int(row_words == 1))
        row_done = write & last_wcol
        m.d.comb += [wr.addr.eq(waddr), wr.data.eq(i_stream.payload), wr.en.eq(write)]
        with m.If(write):
            m.d.sync += [waddr.eq(wrap_incr(waddr, depth)), wcol.eq(wrap_incr(wcol, row_words)),
                         last_wcol.eq(_last_after_step(wcol, last_wcol, row_words))]

        # -- Reader: (oh, ow, ki, kj, cf) with the input coordinates and addresses kept up to date.
        # ih, iw: input pixel of the transfer; row_addr: its row's slot * row_words (valid when
        # ih is inside the image); col = iw * folds + cf.
        ih_lo, ih_hi = -top, (oh_count - 1) * sh - top + (kh - 1) * dh
        iw_lo, iw_hi = -left, (ow_count - 1) * sw - left + (kw - 1) * dw
        oh = counter(oh_count)
        ow = counter(ow_count)
        ki = counter(kh)
        kj = counter(kw)
        cf = counter(folds)
        top_ih = Signal(range(ih_lo, ih_hi + 1), init=-top)            # oh*sh - top
        ih = Signal(range(ih_lo, ih_hi + 1), init=-top)
        left_iw = Signal(range(iw_lo, iw_hi + 1), init=-left)          # ow*sw - left
        iw = Signal(range(iw_lo, iw_hi + 1), init=-left)
        col_lo, col_hi = iw_lo * folds, iw_hi * folds + folds - 1
        left_col = Signal(range(col_lo, col_hi + 1), init=-left * folds)
        col = Signal(range(col_lo, col_hi + 1), init=-left * folds)
        # top_ih + 2*sh plus `rows`, and plus the window's extent: the unclipped bounds of the
        # output row after the next one, kept in registers beside top_ih so that the next
        # row's lo_next and hi_next are a clip of a register. Computing them from top_ih (two
        # adders, the clip's comparisons and a third adder) was a MobileNetV1 build's critical
        # path (11.1 ns).
        lo_off, hi_off = 2 * sh + rows, 2 * sh + ext_h
        top_lo = Signal(range(ih_lo + lo_off, ih_hi + lo_off + 1), init=-top + lo_off)
        top_hi = Signal(range(ih_lo + hi_off, ih_hi + hi_off + 1), init=-top + hi_off)
        row0 = (-top) % rows * row_words
        top_addr = Signal(range(depth), init=row0)
        row_addr = Signal(range(depth), init=row0)

        def ring_add(value, step_rows):
            """``value + step_rows * row_words`` modulo the ring."""
            step = step_rows % rows * row_words
            if step == 0:
                return value
            return Mux(value >= depth - step, value + (step - depth), value + step)

        o_valid = Signal()
        pad_d = Signal()
        advance = ~o_valid | o_stream.ready
        if self._read_register:
            # Stage 1 is the memory's data register (valid: read_valid), stage 2 `held`.
            read_valid = Signal()
            out_advance, advance = advance, ~read_valid | advance
        # rows_ok == (ahead >= need_hi) on every cycle, from a register (set at the end): the
        # comparison's carry chain in front of `issue`, which reaches every counter, was
        # ResNet-8's critical path on the ULX3S-85F (15.6 ns, need_hi -> issue -> ahead).
        rows_ok = Signal(init=int(0 >= g.row_span(0)[1]))
        # The bound the row's last issue moves need_hi to, and ahead + 1, kept in registers a
        # cycle ahead so that rows_ok's next value compares registers only: computing them in
        # front of the compare was a DS-CNN build's critical path (top_ih -> two carry chains
        # -> rows_ok, 11.4 ns). After the last output row the bound is the next inference's
        # first row's, `height` rows on (as `ahead` is then less `height`): with that choice
        # made by last_oh behind the comparisons, four LUTs stood between `ahead`'s carry chain
        # and rows_ok, DS-CNN's critical path at 98.6 MHz (501f4e4, seed 3, 10.1 ns).
        hi_next = Signal(range(hi_first + 1),
                         init=hi_first if oh_count == 1 else g.row_span(1)[1])
        ahead_p1 = Signal(range(1 - height, height + rows + 2), init=1)
        issue = advance & rows_ok
        pad = (ih < 0) | (ih >= height) | (iw < 0) | (iw >= width)
        m.d.comb += [
            rd.addr.eq(row_addr + col),
            rd.en.eq(issue & ~pad),
            o_stream.valid.eq(o_valid),
        ]
        pad_word = 0
        mask = (1 << self._shape.width) - 1
        for j in range(lanes):
            pad_word |= (self._pad_value & mask) << (j * self._shape.width)
        data_out = rd.data.as_value()
        if self._read_register:
            read_pad = Signal()
            held = Signal(self.buffer_width, reset_less=True)
            with m.If(advance):
                m.d.sync += [read_valid.eq(issue), read_pad.eq(pad)]
            with m.If(out_advance):
                m.d.sync += [o_valid.eq(read_valid), pad_d.eq(read_pad), held.eq(data_out)]
            data_out = held
        else:
            with m.If(advance):
                m.d.sync += [o_valid.eq(issue), pad_d.eq(pad)]
        m.d.comb += o_stream.payload.eq(Mux(pad_d, C(pad_word, self.buffer_width), data_out))

        # The reader's last issue of an output row (row_end) and of an inference
        # (frame_done), from flags kept in registers: every output row issues the same
        # `per_row` transfers. Comparing the five counters behind the issue was a ResNet-8
        # build's critical path at 100 MHz (the consumer's ready -> issue -> the counters'
        # last flags -> frame_done -> the enables of `ahead`, 11.9 ns).
        per_row = ow_count * kh * kw * folds
        row_pos = counter(per_row)
        at_row_end = Signal(init=int(per_row == 1))
        at_last_oh = Signal(init=int(oh_count == 1))
        # at_last_oh once oh steps: the next output row is the last (so the row after it is
        # the next inference's first, which hi_next and lo_next then hold).
        next_row_last = _last_after_step(oh, at_last_oh, oh_count)
        with m.If(issue):
            m.d.sync += [
                row_pos.eq(Mux(at_row_end, 0, row_pos + 1)),
                at_row_end.eq(_last_after_step(row_pos, at_row_end, per_row)),
            ]
            with m.If(at_row_end):
                m.d.sync += at_last_oh.eq(next_row_last)
        row_end = issue & at_row_end
        frame_done = row_end & at_last_oh
        # Each position counter's last value as a flag register beside it (as at_row_end):
        # comparing the counters in front of the enables below put two more LUTs between the
        # issue and the outer counters' enables, a DS-CNN build's critical path at 100 MHz
        # (the output queue's fill level -> issue -> ow's enable -> lo_bound's, 10.7 ns).
        # And the conjunctions that step each counter, registered too (`end_kj`: cf and kj
        # at their last, so ki steps; `end_ki`: ki as well, so ow steps; at_row_end: ow as
        # well, so oh steps), so that each counter's enable is the issue and one flag: with
        # the flags ANDed behind the issue, DS-CNN missed at 89.5 MHz (008aae9, seed 3) on the
        # read register's fill level -> issue -> five LUTs -> oh's enable (11.2 ns).
        # All of them under one `If(issue)`, the flags choosing inside it, so that a register
        # several counter levels load (ih, iw, col, row_addr) has the issue as its enable and
        # its next value from registers: with an `If(issue & flag)` per level, ResNet-8 missed
        # at 95.4 MHz (5a82ac6, seed 2) on the read register's fill level -> issue -> the
        # levels' choice -> ih (six LUTs, 10.5 ns).
        last_cf, last_kj, last_ki, last_ow = (
            Signal(init=int(n == 1), name=f"last_{c.name}")
            for c, n in ((cf, folds), (kj, kw), (ki, kh), (ow, ow_count)))
        end_kj = Signal(init=int(folds == 1 and kw == 1))
        end_ki = Signal(init=int(folds == 1 and kw == 1 and kh == 1))
        last_oh = at_last_oh

        def next_last(count, last, n, steps):
            """``last``'s value after this issue: the counter of ``n`` values ``steps``."""
            if n == 1:
                return C(1, 1)
            return Mux(steps, _last_after_step(count, last, n), last)

        nl_cf = next_last(cf, last_cf, folds, 1)
        nl_kj = next_last(kj, last_kj, kw, last_cf)
        nl_ki = next_last(ki, last_ki, kh, end_kj)

        def step_up(count, last, n):
            """``count`` (of ``n`` values) one on, or back to 0 from its last."""
            if n == 1:
                return []
            return [count.eq(Mux(last, 0, count + 1)), last.eq(_last_after_step(count, last, n))]

        with m.If(issue):
            m.d.sync += [cf.eq(wrap_incr(cf, folds)), last_cf.eq(nl_cf),
                         end_kj.eq(nl_cf & nl_kj), end_ki.eq(nl_cf & nl_kj & nl_ki)]
            with m.If(~last_cf):
                m.d.sync += col.eq(col + 1)
            with m.If(last_cf):                          # kj steps
                m.d.sync += step_up(kj, last_kj, kw)
                with m.If(~last_kj):
                    m.d.sync += [iw.eq(iw + dw), col.eq(col + (dw * folds - folds + 1))]
            with m.If(end_kj):                           # ki steps
                m.d.sync += step_up(ki, last_ki, kh)
                with m.If(~last_ki):
                    m.d.sync += [ih.eq(ih + dh), row_addr.eq(ring_add(row_addr, dh)),
                                 iw.eq(left_iw), col.eq(left_col)]
            with m.If(end_ki):                           # ow steps
                m.d.sync += step_up(ow, last_ow, ow_count)
                with m.If(~last_ow):
                    m.d.sync += [
                        left_iw.eq(left_iw + sw), iw.eq(left_iw + sw),
                        left_col.eq(left_col + sw * folds), col.eq(left_col + sw * folds),
                        ih.eq(top_ih), row_addr.eq(top_addr),
                    ]
                with m.Else():
                    m.d.sync += [
                        left_iw.eq(-left), iw.eq(-left),
                        left_col.eq(-left * folds), col.eq(-left * folds),
                    ]
            with m.If(at_row_end):                       # oh steps
                with m.If(~last_oh):
                    nxt = top_ih + sh
                    m.d.sync += [
                        oh.eq(oh + 1),
                        top_ih.eq(nxt), ih.eq(nxt),
                        top_addr.eq(ring_add(top_addr, sh)),
                        row_addr.eq(ring_add(top_addr, sh)),
                        lo_bound.eq(lo_next),
                        lo_next.eq(Mux(next_row_last, lo_first,
                                       _clip_value(top_lo, height + rows, rows))),
                        need_hi.eq(hi_next),
                        hi_next.eq(Mux(next_row_last, hi_first, _clip_value(top_hi, height))),
                        top_lo.eq(top_lo + sh), top_hi.eq(top_hi + sh),
                    ]
                with m.Else():
                    # Next inference: its row 0 is `height` rows after this one's.
                    step = height - (oh_count - 1) * sh
                    m.d.sync += [
                        oh.eq(0),
                        top_ih.eq(-top), ih.eq(-top),
                        top_lo.eq(-top + lo_off), top_hi.eq(-top + hi_off),
                        top_addr.eq(ring_add(top_addr, step)),
                        row_addr.eq(ring_add(top_addr, step)),
                        lo_bound.eq(g.row_span(0)[0] + rows),
                        lo_next.eq(lo_next.init),
                        need_hi.eq(g.row_span(0)[1]),
                        hi_next.eq(hi_next.init),
                    ]

        # ahead += row_done - (frame_done ? height : 0), and ahead_p1 with it, as a choice
        # among sums of registers: the flags arrive late (frame_done from the issue, which the
        # consumer's ready reaches), and an adder behind them was ResNet-8's critical path
        # (gather ready -> issue -> frame_done -> ahead's carry chain, 11.2 ns).
        ahead_p2 = ahead_p1 + 1

        def step(base, base_p1):
            return Mux(frame_done, Mux(row_done, base_p1 - height, base - height),
                       Mux(row_done, base_p1, base))
        m.d.sync += [ahead.eq(step(ahead, ahead_p1)), ahead_p1.eq(step(ahead_p1, ahead_p2))]

        # rows_ok's and room's next values for either outcome of this cycle's issue (neither
        # depends on it): without an issue, or within an output row, the bounds stay; the row's
        # last issue moves them to the next row's span, the inference's last to the first
        # row's, with `ahead` less `height` (both in hi_next and lo_next). The comparisons are
        # of registers, row_done and row_end pick.
        def at_least(bound):
            return Mux(row_done, ahead_p1 >= bound, ahead >= bound)

        def below(bound):
            return Mux(row_done, ahead_p1 < bound, ahead < bound)
        m.d.sync += [
            rows_ok.eq(Mux(row_end, at_least(hi_next), at_least(need_hi))),
            room.eq(Mux(row_end, below(lo_next), below(lo_bound))),
        ]
        return m


def _last_after_step(count, last, n: int):
    """The flag ``last`` (``count`` of ``n`` values at its last) after the counter steps:
    one on, or back to 0 from its last."""
    return Mux(last, n == 1, count == n - 2)


def _clip_value(value, hi: int, lo: int = 0):
    """``value`` clipped to ``[lo, hi]`` in hardware."""
    return Mux(value < lo, lo, Mux(value > hi, hi, value))
