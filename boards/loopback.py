"""A stand-in accelerator for bringing up a board and its host link without a model."""

from __future__ import annotations

from amaranth.hdl import Cat, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ByteIncrement"]


class ByteIncrement(wiring.Component):
    """Adds ``increment`` (modulo 256) to every byte of every beat; ``tlast`` passes through.

    Has the accelerator's flat AXI4-Stream ports, so it drops into :class:`UartBridge` and
    :func:`~onnx2fpga.boards.build.build_bitstream` in place of a compiled model. Latency 1
    cycle, one beat per cycle, full backpressure (a single output register).

    Parameters
    ----------
    width : int
        ``tdata`` width in bits, a positive multiple of 8.
    increment : int
        Added to each byte, 0..255.

    Members
    -------
    s_axis_tdata : ``In(width)``; s_axis_tvalid, s_axis_tlast : ``In(1)``;
    s_axis_tready : ``Out(1)``
    m_axis_tdata : ``Out(width)``; m_axis_tvalid, m_axis_tlast : ``Out(1)``;
    m_axis_tready : ``In(1)``
    """

    def __init__(self, width=8, increment=1):
        if not isinstance(width, int) or isinstance(width, bool) or width <= 0 or width % 8:
            raise ValueError(f"Width must be a positive multiple of 8, not {width!r}")
        if not isinstance(increment, int) or not 0 <= increment <= 255:
            raise ValueError(f"Increment must be an integer from 0 to 255, not {increment!r}")
        self._width = width
        self._increment = increment
        super().__init__({
            "s_axis_tdata": In(width), "s_axis_tvalid": In(1), "s_axis_tready": Out(1),
            "s_axis_tlast": In(1),
            "m_axis_tdata": Out(width), "m_axis_tvalid": Out(1), "m_axis_tready": In(1),
            "m_axis_tlast": Out(1),
        })

    @property
    def width(self):
        return self._width

    @property
    def increment(self):
        return self._increment

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.s_axis_tready.eq(~self.m_axis_tvalid | self.m_axis_tready)
        with m.If(self.s_axis_tvalid & self.s_axis_tready):
            incremented = Cat((self.s_axis_tdata[i:i + 8] + self._increment)[:8]
                              for i in range(0, self._width, 8))
            m.d.sync += [self.m_axis_tdata.eq(incremented), self.m_axis_tlast.eq(
                self.s_axis_tlast), self.m_axis_tvalid.eq(1)]
        with m.Elif(self.m_axis_tready):
            m.d.sync += self.m_axis_tvalid.eq(0)
        return m

