"""A range of every period of a stream: the channel slice of a channels-last image (ONNX
Slice or one output of a Split on the channel axis).

Its cycle figures are those of :mod:`onnx2fpga.plan.slice`.
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..plan.checks import check_count
from ..plan.slice import SLICE_LATENCY, check_slice
from .blocks import counter, int_shape, output_register, quiet_if_invalid, wrap_incr

__all__ = ["SliceCore"]


class SliceCore(wiring.Component):
    """Pass transfers ``start .. stop - 1`` of every ``period`` transfers, drop the others.

    For a channels-last image of ``C`` channels at ``lanes`` elements per transfer, the
    period is ``C // lanes`` (one pixel) and channels ``c0 .. c1 - 1`` are transfers
    ``c0 // lanes .. c1 // lanes - 1`` (``lanes`` divides ``c0`` and ``c1``). No ``last``
    flag: the core counts.

    Parameters
    ----------
    shape : IntType or Amaranth integer shape
        Element shape.
    lanes : int
        Elements per transfer.
    period, start, stop : int
        Transfers per period, and the range kept (``0 <= start < stop <= period``).

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(shape, lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(shape, lanes)))``

    Timing: one input transfer per cycle (a dropped one is taken whatever the output does;
    a kept one when the output register is free or being emptied, so ``i_stream.ready``
    follows ``o_stream.ready`` combinationally while it is full); a kept transfer leaves
    :data:`SLICE_LATENCY` ``= 1`` cycle after it was taken.
    """

    @classmethod
    def from_stage(cls, stage) -> SliceCore:
        """The core of a ``"slice"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        p = stage.params
        return cls(stage.out_type, stage.out_lanes, p["period"], p["start"], p["stop"])

    @quiet_if_invalid
    def __init__(self, shape, lanes, period, start, stop):
        self._shape = int_shape(shape)
        self._lanes = check_count("Lanes", lanes)
        self._period, self._start, self._stop = check_slice(period, start, stop)
        sig = stream.Signature(data.ArrayLayout(self._shape, self._lanes))
        super().__init__({"i_stream": In(sig), "o_stream": Out(sig)})

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def period(self) -> int:
        return self._period

    @property
    def start(self) -> int:
        return self._start

    @property
    def stop(self) -> int:
        return self._stop

    @property
    def latency(self) -> int:
        """Cycles from a kept input transfer to its output transfer, :data:`SLICE_LATENCY`."""
        return SLICE_LATENCY

    def elaborate(self, platform):
        m = Module()
        i_stream, o_stream = self.i_stream, self.o_stream
        pos = counter(self._period)            # the position of the next input transfer
        keep = Signal()
        m.d.comb += keep.eq((pos >= self._start) & (pos < self._stop))
        o_valid = Signal()
        advance = ~o_valid | o_stream.ready
        o_payload = output_register(m, o_stream, o_valid,
                                    data.ArrayLayout(self._shape, self._lanes))
        m.d.comb += i_stream.ready.eq(~keep | advance)
        with m.If(i_stream.valid & i_stream.ready):
            m.d.sync += pos.eq(wrap_incr(pos, self._period))
            with m.If(keep):
                m.d.sync += [o_payload.eq(i_stream.payload), o_valid.eq(1)]
        return m
