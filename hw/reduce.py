"""Streaming window reduction: the reducing half of the pooling layers.

MaxPool and AveragePool are a sliding-window generator followed by a :class:`WindowReduceCore`;
GlobalMaxPool and GlobalAveragePool feed the image straight into one (the whole image is the
window). Either way the core sees, per output pixel, ``window`` window positions of
``channels // lanes`` transfers each (channel folds), and emits ``channels // lanes`` transfers
with the maximum or the sum over the window of every channel. An average is the sum followed by
a requantization that divides (see :class:`~onnx2fpga.hw.requant.RequantCore`).

The cycle figures here follow the conventions of :mod:`onnx2fpga.plan.cost`.
"""

from __future__ import annotations

from amaranth import Array, Module, Mux, Shape, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..plan.devices import NO_RW_CHECK
from ..plan.reduce import (
    REDUCE_OPS,
    REGISTER_FOLDS_MAX,
    check_geometry,
    fold_storage,
    reduce_cycles,
    reduce_latency,
)
from .blocks import (
    counter,
    int_shape,
    output_register,
    quiet_if_invalid,
    range_shape,
    shape_range,
    wrap_incr,
)

__all__ = ["WindowReduceCore", "partial_results"]


class WindowReduceCore(wiring.Component):
    """Maximum or sum over a window, per channel, of a channels-last stream.

    The input is a sequence of groups (output pixels) following each other without a gap or a
    ``last`` flag; the core counts. A group is ``window`` window positions ``k``, each of
    ``folds = channels // lanes`` transfers: lane ``j`` of transfer ``(k, cf)`` is element ``k``
    of the window of channel ``cf*lanes + j``. The group's output is ``folds`` transfers, lane
    ``j`` of transfer ``cf`` being the reduction over ``k`` of channel ``cf*lanes + j``.

    Parameters
    ----------
    shape : IntType or Amaranth integer shape
        Element shape of the input.
    channels : int
        Channels per window position; a multiple of ``lanes``.
    window : int
        Window positions per group, at least 1 (``kh * kw``, or ``H * W`` for a global pool).
    lanes : int
        Elements per transfer.
    op : str
        ``"max"`` or ``"sum"``.

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(in_shape, lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(out_shape, lanes)))``
        ``out_shape`` is ``in_shape`` for ``"max"``; for ``"sum"`` the narrowest shape holding
        every sum of ``window`` values of ``in_shape`` (exact, never wraps).

    Structure: an input register (stage 1) feeds one read-modify-write of the partial result of
    its fold per cycle; the partial results of the ``folds`` folds (``storage_bits`` bits) are
    registers up to :data:`REGISTER_FOLDS_MAX` folds and a
    :class:`~amaranth.lib.memory.Memory` (block RAM, one ``lanes * out_shape.width``-bit word
    per fold, read two transfers ahead into a register) beyond; ``window == 1`` needs no
    storage. The result of the last window position of a fold goes to the output register,
    so the outputs of a group leave interleaved with the input of its last window position
    and never hold up the next group.

    Timing: one input transfer per cycle; :func:`reduce_cycles` ``= window * folds`` cycles per
    group with full-rate input and an output that is never stalled; :func:`reduce_latency`
    ``= window * folds + 1`` cycles from the first input transfer of a group to its last output
    transfer. While the output stalls, transfers of the first ``window - 1`` positions are still
    taken; one of the last position waits in stage 1 (``i_stream.ready`` then follows
    ``o_stream.ready`` combinationally).
    """

    @classmethod
    def from_stage(cls, stage) -> WindowReduceCore:
        """The core of a ``"reduce"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        p = stage.params
        return cls(stage.in_type, p["channels"], p["window"], stage.in_lanes, p["op"])

    @quiet_if_invalid
    def __init__(self, shape, channels, window, lanes=1, op="max"):
        in_shape = int_shape(shape)
        channels, window, lanes = check_geometry(channels, window, lanes)
        if not isinstance(op, str):
            raise TypeError(f"Op must be a string, not {op!r}")
        if op not in REDUCE_OPS:
            raise ValueError(f"Op must be 'max' or 'sum', not {op!r}")
        self._in_shape = in_shape
        self._channels = channels
        self._window = window
        self._lanes = lanes
        self._op = op
        if op == "sum":
            lo, hi = shape_range(in_shape)
            self._out_shape = range_shape(window * lo, window * hi)
        else:
            self._out_shape = in_shape
        super().__init__({
            "i_stream": In(stream.Signature(data.ArrayLayout(in_shape, lanes))),
            "o_stream": Out(stream.Signature(data.ArrayLayout(self._out_shape, lanes))),
        })

    @property
    def in_shape(self) -> Shape:
        return self._in_shape

    @property
    def out_shape(self) -> Shape:
        """Element shape of the output: ``in_shape`` for ``"max"``, wide enough for ``"sum"``."""
        return self._out_shape

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
    def op(self) -> str:
        return self._op

    @property
    def folds(self) -> int:
        """Transfers per window position and output transfers per group, ``channels // lanes``."""
        return self._channels // self._lanes

    @property
    def storage(self) -> str:
        """Where the partial results live: ``"none"`` (``window == 1``), ``"registers"``
        (up to :data:`REGISTER_FOLDS_MAX` folds) or ``"memory"``."""
        return fold_storage(self._window, self.folds, REGISTER_FOLDS_MAX)

    @property
    def storage_bits(self) -> int:
        """Bits of partial-result storage, ``channels * out_shape.width`` (0 for ``window == 1``).
        Input, stage and output registers (``lanes`` elements each) are not counted."""
        if self.storage == "none":
            return 0
        return self._channels * self._out_shape.width

    @property
    def cycles(self) -> int:
        """Steady-state cycles per group, :func:`reduce_cycles`."""
        return reduce_cycles(self._channels, self._window, self._lanes)

    @property
    def latency(self) -> int:
        """Cycles from the first input transfer to the last output transfer of a group,
        :func:`reduce_latency`."""
        return reduce_latency(self._channels, self._window, self._lanes)

    def elaborate(self, platform):
        m = Module()
        lanes, folds, window = self._lanes, self.folds, self._window
        in_layout = data.ArrayLayout(self._in_shape, lanes)
        out_layout = data.ArrayLayout(self._out_shape, lanes)
        i_stream, o_stream = self.i_stream, self.o_stream

        # -- Stage 0: position counters of the next input transfer.
        cf = counter(folds)
        k = counter(window)

        # -- Stage 1: the input register.
        s1_valid, s1_first, s1_last = Signal(), Signal(), Signal()
        s1_x = Signal(in_layout)
        s1_cf = counter(folds)
        o_valid = Signal()
        # Stage 1 moves on unless it holds a last-position transfer and the output is full.
        s1_go = ~s1_last | ~o_valid | o_stream.ready
        s1_done = s1_valid & s1_go
        advance = ~s1_valid | s1_go
        m.d.comb += i_stream.ready.eq(advance)
        take = i_stream.valid & advance
        with m.If(take):
            m.d.sync += cf.eq(wrap_incr(cf, folds))
            with m.If(cf == folds - 1):
                m.d.sync += k.eq(wrap_incr(k, window))
        with m.If(advance):
            m.d.sync += [
                s1_valid.eq(i_stream.valid), s1_x.eq(i_stream.payload), s1_cf.eq(cf),
                s1_first.eq(k == 0), s1_last.eq(k == window - 1),
            ]

        # -- Partial results: `prev` is the stored value of fold s1_cf, `result` the new one.
        storage = self.storage
        # The read ahead happens only with `advance`, when `take` is the input's valid: the
        # memory's address then comes from the input's valid (a register behind a skid
        # buffer), not from the output's ready through `advance` (a DS-CNN build's critical
        # path at 100 MHz: a consumer's ready -> take -> a LUT RAM's address, 10.3 ns).
        prev, store = partial_results(m, storage, out_layout, folds, fold=s1_cf, next_fold=cf,
                                       advance=advance,
                                       ahead_fold=Mux(i_stream.valid, wrap_incr(cf, folds), cf))
        result = Signal(out_layout)
        for j in range(lanes):
            x = s1_x[j]
            if storage == "none":
                value = x
            elif self._op == "max":
                value = Mux(s1_first | (x > prev[j]), x, prev[j])
            else:
                value = Mux(s1_first, x, x + prev[j])
            m.d.comb += result[j].eq(value)

        with m.If(s1_done):
            store(result)

        # -- Output register: the result of the last window position of each fold.
        o_payload = output_register(m, o_stream, o_valid, out_layout)
        with m.If(s1_done & s1_last):
            m.d.sync += [o_valid.eq(1), o_payload.eq(result)]
        return m


#: Folds from which :func:`partial_results` writes a block RAM's partial results a cycle late
#: from registers (reading two folds ahead).
WRITE_REGISTER_FOLDS = 4


def partial_results(m: Module, storage: str, layout, folds: int, *, fold, next_fold, advance,
                    ahead_fold=None):
    """The partial results of a reduction over window positions, one ``layout`` word per fold.

    Parameters
    ----------
    m : Module
    storage : str
        As :func:`fold_storage` gives it.
    layout : data.ArrayLayout
        One partial result, a lane per element.
    folds : int
    fold : Signal
        The fold of the stage that updates a partial result: the one read and written.
    next_fold : Value
        The fold of the transfer one stage earlier: a memory is read there, one stage ahead.
    advance : Value
        The stage holding ``next_fold`` moves on; the memory read is enabled only then, so its
        data hold while that stage stalls.
    ahead_fold : Value, optional
        What ``next_fold`` will hold once its stage moves on (with ``advance``): the fold
        one transfer further ahead. Given, a memory is read there and its output passes a
        register that moves on with ``advance``: no block RAM output feeds the adder, at
        the same cycles. (An ECP5 block RAM's output, 5.8 ns clock-to-out, through a depthwise
        core's adder back into the memory was a MobileNetV1 build's critical path at
        100 MHz, 12.0 ns.) Taken from 3 folds on, so that each fold's write lands before
        the read of its next window position; below, the memory is read one stage ahead.
        Registers are then read one stage ahead (at ``next_fold``) into a register too, from
        2 folds on: the multiplexer of up to :data:`REGISTER_FOLDS_MAX` folds in front of
        the adder was a DS-CNN build's critical path at 100 MHz (10.1 ns).

    Returns
    -------
    prev : list of Value, or None
        The stored partial result of fold ``fold``, per lane (None for ``"none"``).
    store : function
        ``store(result)`` adds the write of ``result`` as the partial result of fold ``fold``;
        call it under the condition of the update.
    """
    lanes = layout.length
    if storage == "memory":
        # The read (one or two folds ahead) never meets the write of the same fold: no
        # read-before-write logic behind the block RAM (NO_RW_CHECK).
        m.submodules.acc_mem = acc_mem = Memory(shape=layout, depth=folds, init=[],
                                                attrs=NO_RW_CHECK)
        acc_rd = acc_mem.read_port()
        acc_wr = acc_mem.write_port()

        # From WRITE_REGISTER_FOLDS folds on (read two folds ahead), the write a cycle
        # later, from registers: with `prev` inside the block RAM, the read into the adder
        # and the sum back to the write port were two routes of a MobileNetV1 build's
        # critical path at 100 MHz (block RAM at (96,46), the adder at (96,7): 3.6 + 3.5 ns
        # of 11.6). A fold is read again `folds - 2` transfers after its update, so from 4
        # folds on the write has landed by then.
        if ahead_fold is not None and folds >= WRITE_REGISTER_FOLDS:
            w_en = Signal(name="acc_wen")
            w_addr = Signal.like(acc_wr.addr, name="acc_waddr", reset_less=True)
            w_data = Signal(layout, name="acc_wdata", reset_less=True)
            m.d.sync += w_en.eq(0)
            m.d.comb += [acc_wr.addr.eq(w_addr), acc_wr.data.eq(w_data), acc_wr.en.eq(w_en)]

            def store(result):
                m.d.sync += [w_addr.eq(fold), w_data.eq(result), w_en.eq(1)]
        else:
            def store(result):
                m.d.comb += [acc_wr.addr.eq(fold), acc_wr.data.eq(result), acc_wr.en.eq(1)]
        if ahead_fold is None or folds < 3:
            # Read one stage ahead. With folds >= 2 the write of a fold (one window position
            # earlier) lands before that fold is read again.
            m.d.comb += [acc_rd.addr.eq(next_fold), acc_rd.en.eq(advance)]
            return [acc_rd.data[j] for j in range(lanes)], store
        # No reset, so nothing in front (yosys put the reset in a LUT between the block RAM
        # and the flip-flop): on ECP5 the block RAM's own output register (boards.outreg),
        # 0.97 ns from the clock instead of 5.8.
        prev = Signal(layout, name="acc_prev", reset_less=True)
        m.d.comb += [acc_rd.addr.eq(ahead_fold), acc_rd.en.eq(advance)]
        with m.If(advance):
            m.d.sync += prev.eq(acc_rd.data)
        return [prev[j] for j in range(lanes)], store
    if storage == "registers":
        accs = [Signal(layout, name=f"acc_{f}") for f in range(folds)]

        def store(result):
            with m.Switch(fold):
                for f in range(folds):
                    with m.Case(f):
                        m.d.sync += accs[f].eq(result)
        if folds == 1:
            return [accs[0][j] for j in range(lanes)], store
        if ahead_fold is None:
            return [Array(acc[j] for acc in accs)[fold] for j in range(lanes)], store
        # Picked a stage ahead: the previous transfer of the fold (two or more transfers
        # earlier) has been written by then.
        prev = Signal(layout, name="acc_prev")
        with m.If(advance):
            m.d.sync += [prev[j].eq(Array(acc[j] for acc in accs)[next_fold])
                         for j in range(lanes)]
        return [prev[j] for j in range(lanes)], store
    return None, lambda result: None
