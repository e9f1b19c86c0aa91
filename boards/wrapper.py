"""The raw board wrapper: an accelerator behind a UART (or the board's USB port, see
:mod:`.link`).

Bytes received on the link become the accelerator's input beats, its output beats go back as
bytes. No framing and no CRC yet: the host sends exactly one tensor's bytes and reads exactly
one tensor's bytes back (see :class:`UartBridge`).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Elaboratable, Module, Signal

from .link import check_link, serial_front_end, usb_bridge_members
from .uart import uart_divisor

__all__ = ["UartBridge", "AXIS_PORTS"]

#: The flat AXI4-Stream ports every accelerator top level has: name -> direction seen from the
#: accelerator. ``tdata`` widths come from the ports' ``Port.tdata_width``.
AXIS_PORTS = {
    "s_axis_tdata": "i", "s_axis_tvalid": "i", "s_axis_tready": "o", "s_axis_tlast": "i",
    "m_axis_tdata": "o", "m_axis_tvalid": "o", "m_axis_tready": "i", "m_axis_tlast": "o",
}


def _check_positive(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, not {value!r}")


def _check_tdata_width(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value % 8:
        raise ValueError(f"{name} must be a positive multiple of 8, not {value!r}")


class UartBridge(Elaboratable):
    """An accelerator with flat AXI4-Stream ports, driven through an 8N1 UART (or, with
    ``link="usb"``, a USB CDC-ACM device: :mod:`.link`).

    Input: each ``in_tdata_width / 8`` received bytes form one beat, the first byte in the
    least significant bits (little-endian); ``s_axis_tlast`` is asserted on beat
    ``in_beats_per_tensor - 1`` of every tensor. Output: each beat accepted from ``m_axis`` is
    sent as ``out_tdata_width / 8`` bytes, least significant first. The output beat counter
    checks ``m_axis_tlast`` against ``out_beats_per_tensor``.

    There is no flow control on the UART: a ``rx_fifo_depth``-byte FIFO absorbs input while the
    accelerator stalls; a byte arriving when it is full is dropped and sets ``error``. The host
    must therefore not send the next tensor before the previous result has come back if the
    accelerator cannot buffer a whole tensor. There is no resynchronization either: after a
    lost byte the beat and tensor boundaries stay shifted until reset.

    On a platform, the wrapper requests the ``uart`` resource (``rx``/``tx`` pins) and, if the
    board has them, two LEDs: activity (lit for 50 to 75 ms after each byte in either direction)
    and error (sticky). Without a platform (simulation) drive :attr:`rx` and watch :attr:`tx`.

    Parameters
    ----------
    accelerator : Elaboratable
        Has the signals named in :data:`AXIS_PORTS` as attributes, in the ``sync`` domain.
    in_tdata_width, out_tdata_width : int
        Widths of ``s_axis_tdata`` and ``m_axis_tdata`` (multiples of 8).
    in_beats_per_tensor, out_beats_per_tensor : int
        Beats per input and output tensor.
    clk_freq : int or float
        Frequency of the ``sync`` clock in Hz.
    baud : int
        UART bit rate. ``round(clk_freq / baud)`` must be at least 4 and within 2 % of it.
    rx_fifo_depth : int
        Bytes buffered between the receiver and the beat assembler.
    uart : tuple of (str, int)
        The UART resource to request.
    leds : sequence of (str, int)
        Activity and error LED resources; missing ones are skipped.
    link : str
        ``"uart"`` or ``"usb"`` (:data:`.link.LINKS`). With ``"usb"``, ``baud`` and ``uart``
        are not used, and neither overrun nor framing errors happen (USB has flow control).
    usb, usb_bus, usb_fifo_depth, usb_strings :
        As for :class:`~.framed.FramedBridge`.

    Attributes
    ----------
    rx : Signal, in
        Serial input (only when elaborated without a platform).
    tx : Signal, out
        Serial output.
    activity, error : Signal, out
        LED drives. ``error`` is sticky: receiver overrun (FIFO full), framing error, or
        ``m_axis_tlast`` not on the expected beat.
    overrun, framing_error, tlast_error : Signal, out
        The sticky causes of ``error``.
    divisor : int or None
        Clock cycles per UART bit (``None`` on USB).
    """

    def __init__(self, accelerator, in_tdata_width, out_tdata_width, in_beats_per_tensor,
                 out_beats_per_tensor, clk_freq, baud=115200, *, rx_fifo_depth=16,
                 uart=("uart", 0), leds=(("led", 0), ("led", 1)), link="uart",
                 usb=("usb", 0), usb_bus=None, usb_fifo_depth=64, usb_strings=None):
        if not isinstance(accelerator, Elaboratable):
            raise TypeError(f"Accelerator must be an Elaboratable, not {accelerator!r}")
        _check_tdata_width("Input tdata width", in_tdata_width)
        _check_tdata_width("Output tdata width", out_tdata_width)
        _check_positive("Input beats per tensor", in_beats_per_tensor)
        _check_positive("Output beats per tensor", out_beats_per_tensor)
        _check_positive("RX FIFO depth", rx_fifo_depth)
        expected = {"s_axis_tdata": in_tdata_width, "m_axis_tdata": out_tdata_width}
        for name in AXIS_PORTS:
            sig = getattr(accelerator, name, None)
            if sig is None:
                raise TypeError(f"Accelerator {type(accelerator).__name__} has no port {name!r}")
            width = expected.get(name, 1)
            if len(sig) != width:
                raise ValueError(f"Accelerator port {name!r} must be {width} bits wide, "
                                 f"not {len(sig)}")
        self.link = check_link(link)
        self.divisor = uart_divisor(clk_freq, baud) if link == "uart" else None
        usb_bridge_members(self, usb_resource=usb, usb_bus=usb_bus,
                           usb_fifo_depth=usb_fifo_depth, usb_strings=usb_strings)

        self.accelerator = accelerator
        self.in_tdata_width = in_tdata_width
        self.out_tdata_width = out_tdata_width
        self.in_beats_per_tensor = in_beats_per_tensor
        self.out_beats_per_tensor = out_beats_per_tensor
        self.clk_freq = clk_freq
        self.baud = baud
        self.rx_fifo_depth = rx_fifo_depth
        self.uart_resource = tuple(uart)
        self.led_resources = tuple(tuple(led) for led in leds)

        self.rx = Signal(init=1)
        self.tx = Signal(init=1)
        self.activity = Signal()
        self.error = Signal()
        self.overrun = Signal()
        self.framing_error = Signal()
        self.tlast_error = Signal()

    def elaborate(self, platform):
        m = Module()
        acc = self.accelerator
        m.submodules.accelerator = acc
        link = serial_front_end(m, platform, self, (self.activity, self.error))

        # FIFO -> input beats: shift each byte in at the top, so after a full beat the first
        # byte sits in the least significant bits.
        in_bytes = self.in_tdata_width // 8
        beat = Signal(self.in_tdata_width)
        byte_index = Signal(range(in_bytes))
        beat_full = Signal()
        in_beat_index = Signal(range(self.in_beats_per_tensor))
        m.d.comb += [
            acc.s_axis_tdata.eq(beat),
            acc.s_axis_tvalid.eq(beat_full),
            acc.s_axis_tlast.eq(in_beat_index == self.in_beats_per_tensor - 1),
            link.rx.ready.eq(~beat_full),
        ]
        with m.If(link.rx.valid & ~beat_full):
            m.d.sync += beat.eq(Cat(beat[8:], link.rx.payload) if in_bytes > 1
                                else link.rx.payload)
            with m.If(byte_index == in_bytes - 1):
                m.d.sync += [byte_index.eq(0), beat_full.eq(1)]
            with m.Else():
                m.d.sync += byte_index.eq(byte_index + 1)
        with m.If(acc.s_axis_tvalid & acc.s_axis_tready):
            m.d.sync += beat_full.eq(0)
            with m.If(in_beat_index == self.in_beats_per_tensor - 1):
                m.d.sync += in_beat_index.eq(0)
            with m.Else():
                m.d.sync += in_beat_index.eq(in_beat_index + 1)

        # Output beats -> transmitter, least significant byte first.
        out_bytes = self.out_tdata_width // 8
        shreg = Signal(self.out_tdata_width)
        bytes_left = Signal(range(out_bytes + 1))
        out_beat_index = Signal(range(self.out_beats_per_tensor))
        m.d.comb += [
            acc.m_axis_tready.eq(bytes_left == 0),
            link.tx.payload.eq(shreg[:8]),
            link.tx.valid.eq(bytes_left != 0),
        ]
        with m.If(acc.m_axis_tvalid & acc.m_axis_tready):
            m.d.sync += [shreg.eq(acc.m_axis_tdata), bytes_left.eq(out_bytes)]
            expect_last = out_beat_index == self.out_beats_per_tensor - 1
            with m.If(acc.m_axis_tlast != expect_last):
                m.d.sync += self.tlast_error.eq(1)
            with m.If(expect_last):
                m.d.sync += out_beat_index.eq(0)
            with m.Else():
                m.d.sync += out_beat_index.eq(out_beat_index + 1)
        with m.If(link.tx.valid & link.tx.ready):
            m.d.sync += [shreg.eq(shreg >> 8), bytes_left.eq(bytes_left - 1)]

        # Sticky errors and the activity LED.
        with m.If(link.overrun):
            m.d.sync += self.overrun.eq(1)
        with m.If(link.framing_error):
            m.d.sync += self.framing_error.eq(1)
        m.d.comb += self.error.eq(self.overrun | self.framing_error | self.tlast_error)

        # The activity LED stays lit for 2 to 3 periods of a free-running prescaler (about 25 ms
        # each). The prescaler's carry out is the tick, so no wide comparator sits on a path.
        prescale_bits = max(1, (int(self.clk_freq) // 40).bit_length() - 1)
        prescaler = Signal(prescale_bits + 1)
        m.d.sync += prescaler.eq(prescaler[:prescale_bits] + 1)
        tick = prescaler[prescale_bits]
        stretch = Signal(2)
        with m.If(link.rx_event | (link.tx.valid & link.tx.ready)):
            m.d.sync += stretch.eq(3)
        with m.Elif(tick & (stretch != 0)):
            m.d.sync += stretch.eq(stretch - 1)
        m.d.comb += self.activity.eq(stretch != 0)

        return m
