"""The byte links a board bridge talks through: an 8N1 UART, or the board's own USB port as a
CDC-ACM serial device (LUNA's full-speed gateware PHY and ``USBSerialDevice``).

Both bridges (:class:`~.framed.FramedBridge`, :class:`~.wrapper.UartBridge`) see a link the
same way, as a :class:`ByteLink` in their ``sync`` domain: a stream of bytes from the host, a
stream of bytes to the host, and a few status pulses. :func:`serial_front_end` builds the one a
bridge asks for (``bridge.link``) and, on a platform, requests its pins and the LEDs.

USB needs two more clock domains, made by :class:`~.clocking.UsbClockedTop`: ``usb_io``
(48 MHz, where the PHY recovers the bit clock from D+/D-) and ``usb`` (12 MHz, the USB device
logic). The bridge stays in ``sync``, at whatever frequency the build chose; bytes cross
between ``sync`` and ``usb`` through two :class:`~amaranth.lib.fifo.AsyncFIFO` (see
:class:`UsbAcmLink`).

Example (simulation, USB side played by a testbench in the ``usb`` domain)::

    bridge = FramedBridge(accelerator, 8, 8, 4, 4, clk_freq=1e6, link="usb",
                          design_id=bytes(8))
    # bridge.usb_rx: push the host's bytes; bridge.usb_tx (+ usb_tx_last): the reply
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from types import SimpleNamespace

from amaranth.build import ResourceError
from amaranth.hdl import Const, DomainRenamer, Module, Signal
from amaranth.lib import fifo, io, stream, wiring
from amaranth.lib.wiring import In, Out

from ..errors import MissingExtraError
from ..hw.blocks import quiet_if_invalid
from .uart import UARTRx, UARTTx

__all__ = ["flash_pins", "LINKS", "USB_VID", "USB_PID", "ByteLink", "UsbAcmLink", "UsbAcmDevice",
           "check_link", "serial_front_end", "usb_bridge_members"]

#: The links a bridge can use.
LINKS = ("uart", "usb")

#: USB vendor and product id of the CDC-ACM device: pid.codes' test VID/PID (1209:0001), free
#: for development and private use; a board sold to others needs an id of its own.
USB_VID = 0x1209
USB_PID = 0x0001


def check_link(link) -> str:
    if link not in LINKS:
        raise ValueError(f"Link must be one of {', '.join(map(repr, LINKS))}, not {link!r}")
    return link


@dataclass
class ByteLink:
    """What a bridge sees of its link, all in the ``sync`` domain.

    Attributes
    ----------
    rx : stream interface of 8 bits
        Bytes from the host; the bridge drives ``ready``.
    tx : stream interface of 8 bits
        Bytes to the host; the bridge drives ``payload`` and ``valid``.
    rx_event : Signal
        A byte from the host arrived this cycle (for the activity LED).
    overrun, framing_error : Signal
        Pulses: a received byte was lost, a stop bit was missing (UART only; constant 0 on USB,
        whose flow control never drops a byte).
    """
    rx: object
    tx: object
    rx_event: object
    overrun: object
    framing_error: object


def _request_leds(m, platform, resources, drives):
    # dir="-": raw ports and explicit io.Buffer components (Amaranth 0.5 deprecates the
    # implicit buffers of platform.request). An LED the board lacks is skipped.
    for index, ((name, number), drive) in enumerate(zip(resources, drives, strict=False)):
        try:
            led = platform.request(name, number, dir="-")
        except ResourceError:
            continue
        m.submodules[f"led_buffer_{index}"] = led_buffer = io.Buffer("o", led)
        m.d.comb += led_buffer.o.eq(drive)


def _uart_link(m, platform, bridge) -> ByteLink:
    """UART receiver and transmitter and a receive FIFO of ``bridge.rx_fifo_depth`` bytes; on
    a platform, the pins of ``bridge.uart_resource`` (``bridge.rx``/``bridge.tx`` without)."""
    m.submodules.uart_rx = uart_rx = UARTRx(bridge.divisor)
    m.submodules.uart_tx = uart_tx = UARTTx(bridge.divisor)
    m.submodules.rx_fifo = rx_fifo = fifo.SyncFIFOBuffered(width=8, depth=bridge.rx_fifo_depth)

    if platform is not None:
        # Unused subsignals (RTS, DTR) stay unbuffered.
        uart = platform.request(*bridge.uart_resource, dir="-")
        m.submodules.rx_buffer = rx_buffer = io.Buffer("i", uart.rx)
        m.submodules.tx_buffer = tx_buffer = io.Buffer("o", uart.tx)
        m.d.comb += [bridge.rx.eq(rx_buffer.i), tx_buffer.o.eq(bridge.tx)]
    m.d.comb += [uart_rx.rx.eq(bridge.rx), bridge.tx.eq(uart_tx.tx)]

    # Receiver -> FIFO. The receiver holds one byte; when the FIFO is full, the next byte
    # is dropped by the receiver and reported as an overrun.
    m.d.comb += [
        rx_fifo.w_data.eq(uart_rx.o_stream.payload),
        rx_fifo.w_en.eq(uart_rx.o_stream.valid),
        uart_rx.o_stream.ready.eq(rx_fifo.w_rdy),
    ]
    rx = stream.Signature(8).create()
    m.d.comb += [rx.payload.eq(rx_fifo.r_data), rx.valid.eq(rx_fifo.r_rdy),
                 rx_fifo.r_en.eq(rx.ready)]
    return ByteLink(rx=rx, tx=uart_tx.i_stream, rx_event=rx_fifo.w_en & rx_fifo.w_rdy,
                    overrun=uart_rx.overrun, framing_error=uart_rx.framing_error)


class UsbAcmLink(wiring.Component):
    """Bytes between the ``sync`` domain and the ``usb`` domain of a USB device, through two
    asynchronous FIFOs of ``depth`` bytes each.

    The USB side is a pair of byte streams in the ``usb`` domain, to be joined to LUNA's
    ``USBSerialDevice`` (:class:`UsbAcmDevice`) or, in simulation, to a testbench standing in
    for it. Bytes from the host are never dropped: when the receive FIFO is full, ``usb_rx``
    is not ready, the OUT endpoint's buffer fills and the device NAKs the host until there is
    room again.

    ``usb_tx_last`` marks the byte after which the transmit FIFO is empty; LUNA's IN endpoint
    sends a packet when 64 bytes have gathered or on such a last byte, so a reply shorter than
    a packet (or its tail) goes out as soon as the bridge has written it instead of waiting for
    more bytes. So that a burst of bytes from the bridge is not cut into one-byte packets as
    its bytes trickle through the FIFO's synchronizers, a lone byte is held back until the
    FIFO's fill level has stayed the same for ``gather`` ``usb`` cycles. Packet boundaries mean
    nothing to a CDC-ACM byte stream; they only cost bus time.

    Parameters
    ----------
    depth : int
        Bytes per FIFO, a power of 2 (Amaranth's AsyncFIFO).
    gather : int
        ``usb`` cycles a lone byte waits for company (8: 0.67 us at 12 MHz).

    Members
    -------
    rx : ``Out(stream.Signature(8))``
        ``sync`` domain: bytes from the host.
    tx : ``In(stream.Signature(8))``
        ``sync`` domain: bytes to the host.
    usb_rx : ``In(stream.Signature(8))``
        ``usb`` domain: bytes the device received from the host.
    usb_tx : ``Out(stream.Signature(8))``
        ``usb`` domain: bytes for the device to send.
    usb_tx_last : ``Out(1)``
        ``usb`` domain: ``usb_tx`` carries the last byte the FIFO holds.
    """

    def __init__(self, depth=64, *, gather=8):
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 2 or depth & (
                depth - 1):
            raise ValueError(f"USB FIFO depth must be a power of 2 of at least 2, not {depth!r}")
        if not isinstance(gather, int) or isinstance(gather, bool) or gather < 1:
            raise ValueError(f"Gather time must be a positive integer, not {gather!r}")
        self.depth = depth
        self.gather = gather
        super().__init__({
            "rx": Out(stream.Signature(8)),
            "tx": In(stream.Signature(8)),
            "usb_rx": In(stream.Signature(8)),
            "usb_tx": Out(stream.Signature(8)),
            "usb_tx_last": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.rx_fifo = rx_fifo = fifo.AsyncFIFO(
            width=8, depth=self.depth, w_domain="usb", r_domain="sync")
        m.submodules.tx_fifo = tx_fifo = fifo.AsyncFIFO(
            width=8, depth=self.depth, w_domain="sync", r_domain="usb")
        m.d.comb += [
            rx_fifo.w_data.eq(self.usb_rx.payload),
            rx_fifo.w_en.eq(self.usb_rx.valid),
            self.usb_rx.ready.eq(rx_fifo.w_rdy),
            self.rx.payload.eq(rx_fifo.r_data),
            self.rx.valid.eq(rx_fifo.r_rdy),
            rx_fifo.r_en.eq(self.rx.ready),

            tx_fifo.w_data.eq(self.tx.payload),
            tx_fifo.w_en.eq(self.tx.valid),
            self.tx.ready.eq(tx_fifo.w_rdy),
            self.usb_tx.payload.eq(tx_fifo.r_data),
            tx_fifo.r_en.eq(self.usb_tx.ready & self.usb_tx.valid),
            # r_level counts the bytes the read side can see, this one included.
            self.usb_tx_last.eq(tx_fifo.r_level == 1),
        ]
        # Several bytes go at once; a lone one once the level has been still for `gather`.
        level = Signal.like(tx_fifo.r_level)
        still = Signal(range(self.gather + 1))
        m.d.usb += level.eq(tx_fifo.r_level)
        with m.If(tx_fifo.r_level != level):
            m.d.usb += still.eq(0)
        with m.Elif(still != self.gather):
            m.d.usb += still.eq(still + 1)
        m.d.comb += self.usb_tx.valid.eq(
            tx_fifo.r_rdy & ((tx_fifo.r_level > 1) | (still == self.gather)))
        return m


class UsbAcmDevice(wiring.Component):
    """LUNA's CDC-ACM ``USBSerialDevice`` on ``bus``, always connected, in the ``usb`` domain
    (its PHY also uses ``usb_io``), with Amaranth streams.

    Parameters
    ----------
    bus : object
        What LUNA's ``USBDevice`` accepts: raw pins (``d_p``, ``d_n`` with ``i``/``o``/``oe``,
        optional ``pullup`` with ``o``; LUNA's gateware PHY then drives them) or a UTMI
        interface (simulation).
    vid, pid : int
        USB vendor and product id.
    manufacturer, product, serial_number : str
        String descriptors.

    Members
    -------
    rx : ``Out(stream.Signature(8))``
        Bytes from the host.
    tx : ``In(stream.Signature(8))``
        Bytes to the host; ``tx_last`` ends a USB packet early (see :class:`UsbAcmLink`).
    tx_last : ``In(1)``
    """

    @quiet_if_invalid
    def __init__(self, bus, *, vid=USB_VID, pid=USB_PID, manufacturer="onnx2fpga",
                 product="onnx2fpga accelerator", serial_number=""):
        try:
            # LUNA 0.2 still imports Amaranth 0.4 names (Record, hdl.ast, hdl.xfrm) that
            # Amaranth 0.5 deprecates; nothing a user of this module can act on.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                from luna.gateware.usb.devices.acm import USBSerialDevice
        except ImportError:
            raise MissingExtraError("The USB link", ["luna-usb"], "usb") from None
        self._device = USBSerialDevice(bus=bus, idVendor=vid, idProduct=pid,
                                       manufacturer_string=manufacturer,
                                       product_string=product, serial_number=serial_number)
        super().__init__({
            "rx": Out(stream.Signature(8)),
            "tx": In(stream.Signature(8)),
            "tx_last": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        # LUNA's submodules mostly name the usb domain; anything left in sync belongs there too.
        m.submodules.acm = DomainRenamer({"sync": "usb"})(self._device)
        acm = self._device
        m.d.comb += [
            acm.connect.eq(1),
            self.rx.payload.eq(acm.rx.payload),
            self.rx.valid.eq(acm.rx.valid),
            acm.rx.ready.eq(self.rx.ready),
            acm.tx.payload.eq(self.tx.payload),
            acm.tx.valid.eq(self.tx.valid),
            acm.tx.first.eq(0),
            acm.tx.last.eq(self.tx_last),
            self.tx.ready.eq(acm.tx.ready),
        ]
        return m


def _usb_link(m, platform, bridge) -> ByteLink:
    """The asynchronous FIFOs and, on a platform (pins of ``bridge.usb_resource``) or with
    ``bridge.usb_bus``, the LUNA device. Otherwise the FIFOs' USB side is left to the caller as
    ``bridge.usb_rx``, ``bridge.usb_tx``, ``bridge.usb_tx_last``."""
    m.submodules.usb_link = link = UsbAcmLink(bridge.usb_fifo_depth)
    bus = bridge.usb_bus
    if bus is None and platform is not None:
        usb = platform.request(*bridge.usb_resource, dir="-")
        m.submodules.usb_d_p = d_p = io.Buffer("io", usb.d_p)
        m.submodules.usb_d_n = d_n = io.Buffer("io", usb.d_n)
        bus = SimpleNamespace(d_p=d_p, d_n=d_n)
        if hasattr(usb, "pullup"):
            m.submodules.usb_pullup = pullup = io.Buffer("o", usb.pullup)
            bus.pullup = pullup
    if bus is not None:
        m.submodules.usb_device = device = UsbAcmDevice(bus, **bridge.usb_strings)
        wiring.connect(m, device.rx, link.usb_rx)
        wiring.connect(m, link.usb_tx, device.tx)
        m.d.comb += device.tx_last.eq(link.usb_tx_last)
    else:
        m.d.comb += [
            link.usb_rx.payload.eq(bridge.usb_rx.payload),
            link.usb_rx.valid.eq(bridge.usb_rx.valid),
            bridge.usb_rx.ready.eq(link.usb_rx.ready),
            bridge.usb_tx.payload.eq(link.usb_tx.payload),
            bridge.usb_tx.valid.eq(link.usb_tx.valid),
            link.usb_tx.ready.eq(bridge.usb_tx.ready),
            bridge.usb_tx_last.eq(link.usb_tx_last),
        ]
    zero = Const(0)
    return ByteLink(rx=link.rx, tx=link.tx, rx_event=link.rx.valid & link.rx.ready,
                    overrun=zero, framing_error=zero)


def flash_pins(m, platform, accelerator) -> bool:
    """Join an accelerator's SPI flash ports (weights in SPRAM: ``flash_sck``, ``flash_cs_n``,
    ``flash_copi``, ``flash_cipo``, :class:`~onnx2fpga.hw.top.Accelerator`) to the board's
    configuration flash, ``spi_flash_1x`` 0 (its write protect and hold inactive). Whether
    it had them: without them nothing is requested."""
    if accelerator is None or not hasattr(accelerator, "flash_sck"):
        return False
    flash = platform.request("spi_flash_1x", 0, dir="-")
    b = {}
    for name, direction in (("cs", "o"), ("clk", "o"), ("copi", "o"), ("cipo", "i"),
                            ("wp", "o"), ("hold", "o")):
        if hasattr(flash, name):
            b[name] = io.Buffer(direction, getattr(flash, name))
            m.submodules[f"flash_{name}_buffer"] = b[name]
    m.d.comb += [b["cs"].o.eq(~accelerator.flash_cs_n), b["clk"].o.eq(accelerator.flash_sck),
                 b["copi"].o.eq(accelerator.flash_copi),
                 accelerator.flash_cipo.eq(b["cipo"].i)]
    return True


def serial_front_end(m, platform, bridge, leds) -> ByteLink:
    """The link ``bridge.link`` names, added to ``m``; on a platform also the LEDs of
    ``bridge.led_resources``, driven by ``leds`` in order (an LED the board lacks is skipped).

    ``bridge`` provides ``link``, ``led_resources`` and, for a UART, ``divisor``,
    ``rx_fifo_depth``, ``uart_resource``, ``rx``, ``tx``; for USB, ``usb_fifo_depth``,
    ``usb_resource``, ``usb_bus``, ``usb_strings``, ``usb_rx``, ``usb_tx``, ``usb_tx_last``.
    """
    if platform is not None:
        _request_leds(m, platform, bridge.led_resources, leds)
        flash_pins(m, platform, getattr(bridge, "accelerator", None))
    if bridge.link == "usb":
        return _usb_link(m, platform, bridge)
    return _uart_link(m, platform, bridge)


def usb_bridge_members(bridge, *, usb_resource, usb_bus, usb_fifo_depth, usb_strings):
    """Set the USB attributes :func:`serial_front_end` reads on ``bridge``."""
    bridge.usb_resource = tuple(usb_resource)
    bridge.usb_bus = usb_bus
    bridge.usb_fifo_depth = usb_fifo_depth
    bridge.usb_strings = dict(usb_strings or {})
    # The testbench side of the FIFOs when there is neither a platform nor a bus.
    bridge.usb_rx = SimpleNamespace(payload=Signal(8, name="usb_rx_payload"),
                                    valid=Signal(name="usb_rx_valid"),
                                    ready=Signal(name="usb_rx_ready"))
    bridge.usb_tx = SimpleNamespace(payload=Signal(8, name="usb_tx_payload"),
                                    valid=Signal(name="usb_tx_valid"),
                                    ready=Signal(name="usb_tx_ready"))
    bridge.usb_tx_last = Signal(name="usb_tx_last")
