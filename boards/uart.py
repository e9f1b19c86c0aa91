"""A small 8N1 UART (receiver and transmitter) in Amaranth.

One start bit (0), eight data bits least significant first, one stop bit (1), no parity, no
flow control. The bit period is ``divisor`` clock cycles (``round(clk_freq / baud)``).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["UARTRx", "UARTTx", "uart_divisor"]


def uart_divisor(clk_freq, baud, *, tolerance=0.02) -> int:
    """Clock cycles per bit for ``baud`` at ``clk_freq`` Hz.

    Raises
    ------
    ValueError
        If the rounded divisor is below 4 cycles or misses ``baud`` by more than ``tolerance``
        (2 %: an 8N1 frame tolerates about 5 % between both ends together).
    """
    if not isinstance(clk_freq, (int, float)) or clk_freq <= 0:
        raise ValueError(f"Clock frequency must be a positive number, not {clk_freq!r}")
    if not isinstance(baud, (int, float)) or baud <= 0:
        raise ValueError(f"Baud rate must be a positive number, not {baud!r}")
    divisor = round(clk_freq / baud)
    if divisor < 4:
        raise ValueError(f"Baud rate {baud} is too high for a {clk_freq:.0f} Hz clock: "
                         f"at least 4 cycles per bit are needed")
    error = abs(clk_freq / divisor - baud) / baud
    if error > tolerance:
        raise ValueError(f"Baud rate {baud} cannot be made from a {clk_freq:.0f} Hz clock within "
                         f"{tolerance:.0%} (nearest is {clk_freq / divisor:.0f}, "
                         f"{error:.1%} off)")
    return divisor


def _check_divisor(divisor):
    if not isinstance(divisor, int) or isinstance(divisor, bool) or divisor < 4:
        raise ValueError(f"Divisor must be an integer of at least 4, not {divisor!r}")


class UARTRx(wiring.Component):
    """8N1 receiver.

    The line is synchronized with two flip-flops, a start bit is checked at its middle, and each
    data bit and the stop bit are sampled ``divisor`` cycles apart from there. A received byte is
    held on ``o_stream`` until it is taken; a byte that completes while the previous one is still
    waiting is dropped and ``overrun`` pulses. A stop bit that reads 0 drops the byte, pulses
    ``framing_error`` and waits for the line to go idle (high) again.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit, at least 4.

    Members
    -------
    rx : ``In(1, init=1)``
        The serial line.
    o_stream : ``Out(stream.Signature(8))``
        Received bytes.
    overrun : ``Out(1)``
        Pulses for one cycle when a byte is dropped because ``o_stream`` was not ready.
    framing_error : ``Out(1)``
        Pulses for one cycle when a stop bit is missing.
    """

    def __init__(self, divisor):
        _check_divisor(divisor)
        self._divisor = divisor
        super().__init__({
            "rx": In(1, init=1),
            "o_stream": Out(stream.Signature(8)),
            "overrun": Out(1),
            "framing_error": Out(1),
        })

    @property
    def divisor(self):
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        divisor = self._divisor

        rx = Signal(init=1)
        m.submodules.rx_sync = FFSynchronizer(self.rx, rx, init=1)

        timer = Signal(range(divisor))
        count = Signal(range(8))
        shreg = Signal(8)

        # Cleared first, so that a byte completing in the same cycle wins (set below).
        with m.If(self.o_stream.valid & self.o_stream.ready):
            m.d.sync += self.o_stream.valid.eq(0)

        with m.FSM():
            with m.State("Idle"):
                with m.If(~rx):
                    m.d.sync += timer.eq(divisor // 2 - 1)
                    m.next = "Start"
            with m.State("Start"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(rx):
                    m.next = "Idle"  # a glitch, not a start bit
                with m.Else():
                    m.d.sync += [timer.eq(divisor - 1), count.eq(0)]
                    m.next = "Data"
            with m.State("Data"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    m.d.sync += [shreg.eq(Cat(shreg[1:], rx)), timer.eq(divisor - 1),
                                 count.eq(count + 1)]
                    with m.If(count == 7):
                        m.next = "Stop"
            with m.State("Stop"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(rx):
                    with m.If(self.o_stream.valid & ~self.o_stream.ready):
                        m.d.comb += self.overrun.eq(1)
                    with m.Else():
                        m.d.sync += [self.o_stream.payload.eq(shreg),
                                     self.o_stream.valid.eq(1)]
                    m.next = "Idle"
                with m.Else():
                    m.d.comb += self.framing_error.eq(1)
                    m.next = "Break"
            with m.State("Break"):
                with m.If(rx):
                    m.next = "Idle"

        return m


class UARTTx(wiring.Component):
    """8N1 transmitter.

    Takes a byte from ``i_stream`` when idle and sends start bit, eight data bits and stop bit,
    ``divisor`` cycles each; the next byte may start right after the stop bit.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit, at least 4.

    Members
    -------
    i_stream : ``In(stream.Signature(8))``
        Bytes to send.
    tx : ``Out(1, init=1)``
        The serial line (registered).
    """

    def __init__(self, divisor):
        _check_divisor(divisor)
        self._divisor = divisor
        super().__init__({
            "i_stream": In(stream.Signature(8)),
            "tx": Out(1, init=1),
        })

    @property
    def divisor(self):
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        divisor = self._divisor

        line = Signal(init=1)
        shreg = Signal(9)  # eight data bits, then the stop bit
        count = Signal(range(10))
        timer = Signal(range(divisor))
        m.d.comb += self.tx.eq(line)

        with m.FSM():
            with m.State("Idle"):
                m.d.comb += self.i_stream.ready.eq(1)
                with m.If(self.i_stream.valid):
                    m.d.sync += [line.eq(0), shreg.eq(Cat(self.i_stream.payload, 1)),
                                 count.eq(9), timer.eq(divisor - 1)]
                    m.next = "Send"
            with m.State("Send"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(count == 0):
                    m.next = "Idle"
                with m.Else():
                    m.d.sync += [line.eq(shreg[0]), shreg.eq(shreg >> 1),
                                 count.eq(count - 1), timer.eq(divisor - 1)]

        return m
