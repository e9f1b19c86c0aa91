"""The framed board wrapper: an accelerator behind a byte link (a UART, or the board's USB port
as a CDC-ACM serial device: :mod:`.link`) that speaks :mod:`.protocol`.

:class:`FramedBridge` parses request frames byte by byte, checks type, length and CRC, keeps an
INFER payload in a buffer until its CRC has been checked, and only then streams it into the
accelerator; the reply frame's header goes out while the accelerator computes, its output
beats follow as they come, then the CRC. Anything wrong is answered with an ERROR frame
and dropped; a half frame is dropped when the line stays quiet for ``timeout_cycles``
(the parser's reset), as is the rest of a frame with a bad type or length.

Example (simulation: drive ``rx``, watch ``tx``)::

    bridge = FramedBridge(accelerator, 32, 8, 16, 10, clk_freq=8e6, baud=1e6,
                          design_id=bytes(8), timeout_cycles=2000)
"""

from __future__ import annotations

import operator
from contextlib import contextmanager

from amaranth.hdl import Array, Cat, Const, Elaboratable, Module, Mux, Signal
from amaranth.lib import stream
from amaranth.lib.memory import Memory
from amaranth.utils import exact_log2

from ..hw.blocks import skid_output, tree_sum
from ..hw.resources import WRAPPER_BANK_BEATS
from ..plan.devices import NO_RW_CHECK
from .link import check_link, serial_front_end, usb_bridge_members
from .protocol import PROTOCOL_VERSION, SYNC, BoardInfo, ErrorCode, FrameType
from .uart import uart_divisor
from .wrapper import AXIS_PORTS

#: Encodings of the receive and transmit state machines (:class:`FramedBridge`'s
#: ``fsm_encoding``).
FSM_ENCODINGS = ("one-hot", "binary")

__all__ = ["FramedBridge", "crc16_byte"]


class _StateMachine:
    """A state machine written like Amaranth's ``m.FSM``: ``with fsm.state(NAME):`` holds what
    happens in a state, ``fsm.goto(NAME)`` inside it moves on; ``fsm.bits[NAME]`` is true in
    that state.

    ``one_hot``: a flip-flop per state (``{name}_{state}``); otherwise a binary state register
    ``{name}_state``. Amaranth encodes its FSMs in binary, and yosys does not re-encode a
    state register that has an initial value: the receiver's next state, decoded from 4 state
    bits and the conditions of 15 states, was 7 LUT levels and the critical path of the
    digits example on the iCEBreaker (``rx_state`` -> ``rx_state``, 26.7 ns, 37.4 MHz).
    One-hot, a state's flip-flop depends only on the few states that enter or leave it.
    """

    def __init__(self, m: Module, name: str, states, init: str, *, one_hot: bool = True):
        self._m = m
        self._current = None
        self._one_hot = one_hot
        if one_hot:
            self.bits = {s: Signal(name=f"{name}_{s.lower().replace('-', '_')}",
                                   init=int(s == init)) for s in states}
        else:
            self._index = {s: i for i, s in enumerate(states)}
            self._state = Signal(range(len(states)), name=f"{name}_state",
                                 init=self._index[init])
            self.bits = {s: self._state == i for s, i in self._index.items()}

    @contextmanager
    def state(self, name: str):
        self._current = name
        try:
            with self._m.If(self.bits[name]):
                yield
        finally:
            self._current = None

    @property
    def current(self) -> str:
        """The state whose ``with fsm.state(...)`` block is being written."""
        if self._current is None:
            raise RuntimeError("not inside a state")
        return self._current

    def goto(self, name: str):
        if name == self.current:
            return
        if self._one_hot:
            self._m.d.sync += [self.bits[self._current].eq(0), self.bits[name].eq(1)]
        else:
            self._m.d.sync += self._state.eq(self._index[name])


def crc16_byte(crc, byte):
    """One byte of CRC-16/CCITT-FALSE (polynomial 0x1021, MSB first) as Amaranth logic."""
    for i in range(8):
        feedback = byte[7 - i] ^ crc[15]
        crc = Cat(Const(0, 1), crc[:15]) ^ Mux(feedback, Const(0x1021, 16), Const(0, 16))
    return crc[:16]


class FramedBridge(Elaboratable):
    """An accelerator with flat AXI4-Stream ports behind an 8N1 UART or a USB CDC-ACM device
    (``link``), speaking the frame protocol of :mod:`onnx2fpga.boards.protocol`. The frames are
    the same on both links; only the byte transport differs.

    Parameters
    ----------
    accelerator : Elaboratable
        Has the signals of :data:`~.wrapper.AXIS_PORTS` as attributes, in the ``sync`` domain.
    in_tdata_width, out_tdata_width : int
        Widths of ``s_axis_tdata`` and ``m_axis_tdata`` (multiples of 8).
    in_payload_width : int, optional
        Significant low bits of an input beat (the elements before the padding to whole
        bytes); the input buffer keeps only those and feeds the padding as zeros. Default:
        ``in_tdata_width``. A 784-beat input of 2-bit elements then takes one iCE40 block RAM
        instead of two.
    fsm_encoding : str
        ``"one-hot"`` (default) or ``"binary"``: how the receive and transmit state machines
        hold their state (see :class:`_StateMachine`). Board builds take one-hot on iCE40,
        where it lifted the digits example from 37.4 to 42 MHz, and binary on ECP5, where
        the kwsmlp_w3a3 design with one-hot machines closed at 87.0 MHz at seed 1 after a
        congested route (2,178 s of routing) and at 112.9 MHz with the binary wrapper from
        before the one-hot change. Weak evidence: with this binary encoding its seed 1 routed
        congested too (97.4 MHz); placement of a design that size varies with any change.
    in_beats, out_beats : int
        Beats per input and output tensor.
    bank_beats : int
        Input buffer rows per memory bank (a power of 2, default
        :data:`~onnx2fpga.hw.resources.WRAPPER_BANK_BEATS`): a longer input is buffered in
        banks whose outputs are registered before one is chosen, two more cycles before the
        first beat.
    clk_freq : int or float
        Frequency of the ``sync`` clock in Hz (reported in the HELLO reply).
    baud : int
        UART bit rate (not used on USB).
    design_id : bytes
        8 bytes returned by HELLO (:func:`~.protocol.design_id_from_sha256`).
    timeout_cycles : int, optional
        A frame whose next byte does not come within this many cycles is dropped and
        answered with ``TIMEOUT``. Default: 20 ms. At least two byte times on a UART, two
        USB frames (2 ms) on USB.
    rx_fifo_depth : int
        Bytes buffered while the bridge sends a reply (UART).
    uart : tuple of (str, int)
        The UART resource to request on a platform.
    leds : sequence of (str, int)
        Activity and error LEDs; missing ones are skipped. The error LED is lit from an
        ERROR reply until the next good request.
    link : str
        ``"uart"`` or ``"usb"`` (:data:`.link.LINKS`).
    usb : tuple of (str, int)
        The USB resource (``d_p``, ``d_n``, optional ``pullup``) to request on a platform.
    usb_bus : object, optional
        Instead of the platform's pins: the bus LUNA's device drives (a LUNA UTMI interface,
        for simulation). Without it and without a platform, the USB side of the link is left
        to a testbench: :attr:`usb_rx`, :attr:`usb_tx`, :attr:`usb_tx_last`.
    usb_fifo_depth : int
        Bytes in each of the two FIFOs between ``sync`` and ``usb`` (a power of 2).
    usb_strings : dict, optional
        Keyword arguments of :class:`~.link.UsbAcmDevice` (``vid``, ``pid``,
        ``manufacturer``, ``product``, ``serial_number``).

    Attributes
    ----------
    rx, tx : Signal
        The serial lines (without a platform).
    activity, error_led : Signal, out
        LED drives.
    overrun, framing_error, tlast_error : Signal, out
        Sticky: a byte lost to a full FIFO, a missing stop bit, ``m_axis_tlast`` off its beat.
    frames_ok, frames_bad : Signal, out
        8-bit wrapping counters of answered requests and of ERROR replies.
    in_bytes, out_bytes : int
        INFER payload sizes.
    divisor : int or None
        Clock cycles per UART bit (``None`` on USB).
    usb_rx, usb_tx : stream-like namespaces (``payload``, ``valid``, ``ready``)
        ``usb`` domain, USB link without a device only: bytes from and to the host.
    usb_tx_last : Signal
        With :attr:`usb_tx`: the byte is the last one waiting.
    """

    def __init__(self, accelerator, in_tdata_width, out_tdata_width, in_beats, out_beats,
                 clk_freq, baud=115200, *, design_id, timeout_cycles=None, rx_fifo_depth=16,
                 uart=("uart", 0), leds=(("led", 0), ("led", 1)), link="uart",
                 usb=("usb", 0), usb_bus=None, usb_fifo_depth=64, usb_strings=None,
                 in_payload_width=None, fsm_encoding="one-hot", bank_beats=WRAPPER_BANK_BEATS):
        if not isinstance(accelerator, Elaboratable):
            raise TypeError(f"Accelerator must be an Elaboratable, not {accelerator!r}")
        for name, value in (("Input tdata width", in_tdata_width),
                            ("Output tdata width", out_tdata_width)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value % 8:
                raise ValueError(f"{name} must be a positive multiple of 8, not {value!r}")
        if in_payload_width is None:
            in_payload_width = in_tdata_width
        if not isinstance(in_payload_width, int) or isinstance(in_payload_width, bool) or \
                not 0 < in_payload_width <= in_tdata_width:
            raise ValueError(f"Input payload width must be an integer in [1, {in_tdata_width}], "
                             f"not {in_payload_width!r}")
        self.in_payload_width = in_payload_width
        if fsm_encoding not in FSM_ENCODINGS:
            raise ValueError(f"FSM encoding must be one of {FSM_ENCODINGS}, not {fsm_encoding!r}")
        self.fsm_encoding = fsm_encoding
        if not isinstance(bank_beats, int) or isinstance(bank_beats, bool) or bank_beats < 1 \
                or bank_beats & (bank_beats - 1):
            raise ValueError(f"Bank beats must be a power of 2, not {bank_beats!r}")
        self.bank_beats = bank_beats
        for name, value in (("Input beats", in_beats), ("Output beats", out_beats),
                            ("RX FIFO depth", rx_fifo_depth)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        if not isinstance(design_id, (bytes, bytearray)) or len(design_id) != 8:
            raise ValueError(f"Design id must be 8 bytes, not {design_id!r}")
        expected = {"s_axis_tdata": in_tdata_width, "m_axis_tdata": out_tdata_width}
        for name in AXIS_PORTS:
            sig = getattr(accelerator, name, None)
            if sig is None:
                raise TypeError(f"Accelerator {type(accelerator).__name__} has no port {name!r}")
            if len(sig) != expected.get(name, 1):
                raise ValueError(f"Accelerator port {name!r} must be {expected.get(name, 1)} "
                                 f"bits wide, not {len(sig)}")
        self.link = check_link(link)
        if timeout_cycles is None:
            timeout_cycles = int(clk_freq * 0.02)
        if link == "uart":
            self.divisor = uart_divisor(clk_freq, baud)
            # A byte takes 10 bit periods; a timeout shorter than two bytes drops good frames.
            least, unit = 20 * self.divisor, "two bytes"
        else:
            # The host sends a frame as bulk packets in 1 ms USB frames; a frame's bytes may be
            # a frame apart.
            self.divisor = None
            least, unit = max(1, int(clk_freq * 0.002)), "two USB frames"
        if not isinstance(timeout_cycles, int) or timeout_cycles < least:
            raise ValueError(f"Timeout must be an integer of at least {least} cycles ({unit}), "
                             f"not {timeout_cycles!r}")
        usb_bridge_members(self, usb_resource=usb, usb_bus=usb_bus,
                           usb_fifo_depth=usb_fifo_depth, usb_strings=usb_strings)
        self.in_bytes = in_tdata_width // 8 * in_beats
        self.out_bytes = out_tdata_width // 8 * out_beats
        if max(self.in_bytes, self.out_bytes) > 0xFFFF:
            raise ValueError(f"Tensors of {max(self.in_bytes, self.out_bytes)} bytes do not fit "
                             f"one frame (at most 65535)")

        self.accelerator = accelerator
        self.in_tdata_width, self.out_tdata_width = in_tdata_width, out_tdata_width
        self.in_beats, self.out_beats = in_beats, out_beats
        self.clk_freq, self.baud = clk_freq, baud
        self.design_id = bytes(design_id)
        self.timeout_cycles = timeout_cycles
        self.rx_fifo_depth = rx_fifo_depth
        self.uart_resource = tuple(uart)
        self.led_resources = tuple(tuple(led) for led in leds)
        self.info = BoardInfo(PROTOCOL_VERSION, self.design_id, self.in_bytes, self.out_bytes,
                              int(round(clk_freq / 1000)))

        self.rx = Signal(init=1)
        self.tx = Signal(init=1)
        self.activity = Signal()
        self.error_led = Signal()
        self.overrun = Signal()
        self.framing_error = Signal()
        self.tlast_error = Signal()
        self.frames_ok = Signal(8)
        self.frames_bad = Signal(8)

    def elaborate(self, platform):
        m = Module()
        acc = self.accelerator
        m.submodules.accelerator = acc
        link = serial_front_end(m, platform, self, (self.activity, self.error_led))
        with m.If(link.overrun):
            m.d.sync += self.overrun.eq(1)
        with m.If(link.framing_error):
            m.d.sync += self.framing_error.eq(1)

        in_nbytes = self.in_tdata_width // 8
        out_nbytes = self.out_tdata_width // 8

        # The INFER payload, one memory row per input beat (block RAM where there is some), in
        # banks of `bank_beats` rows when there are more (see the feeder below).
        # Writes go through registers: the state machine's "last byte of a beat" decode
        # reaching the write enable of every bit of a buffer in flip-flops was the jet
        # tagger's critical path on an ECP5 (10.2 ns). The feeder starts reading at least
        # four cycles after the last write (two CRC bytes, the check, the decision).
        wr_en = Signal()
        wr_addr = Signal(range(self.in_beats))
        banks = -(-self.in_beats // self.bank_beats)
        bank_beats = self.bank_beats if banks > 1 else self.in_beats
        low = exact_log2(bank_beats) if banks > 1 else len(wr_addr)      # row within a bank
        wr_data = Signal(self.in_payload_width)
        rd_addr = Signal(range(self.in_beats))
        rd_en = Signal()
        rports = []
        for b in range(banks):
            depth = min(bank_beats, self.in_beats - b * bank_beats)
            # The feeder reads a frame's rows only after its last write, and the receiver
            # takes the next frame's payload only after the reply, which follows the last
            # read: no read meets a write (NO_RW_CHECK; the tests watch for it).
            bank = Memory(shape=self.in_payload_width, depth=depth, init=[],
                          attrs=NO_RW_CHECK)
            m.submodules["buffer" if banks == 1 else f"buffer_{b}"] = bank
            wport, rport = bank.write_port(), bank.read_port()
            hit = wr_addr[low:] == b if banks > 1 else 1
            m.d.comb += [wport.en.eq(wr_en & hit), wport.addr.eq(wr_addr[:low]),
                         wport.data.eq(wr_data), rport.addr.eq(rd_addr[:low]),
                         rport.en.eq(rd_en)]
            rports.append(rport)

        # Timing: the link state machine is split into a receiver and a transmitter (few states
        # each, so that "a byte is taken" is one LUT from the state), and everything that used
        # to hang off a received byte in the same cycle is registered: the CRC register is
        # updated one cycle after its byte (from registered copies of the bytes), the type and
        # length checks compare single bytes as they arrive and are combined in a state of their
        # own, the CRC check compares registers in a state of its own, the feeder's start and
        # the reply's start are register pulses. Only the cycle counts change, never the bytes.

        # ---- Receive side -----------------------------------------------------------------
        # A received byte waits in a register for the state machine, so the link's FIFO sees
        # only whether that register is empty, never the state: rx_state -> "a byte is taken"
        # -> the FIFO's read logic -> back into the state machine was the jet tagger's critical
        # path on an ECP5 (10.6 ns, two routes of 3.1 ns). At most a byte every two cycles,
        # far above any link's rate.
        byte = Signal(8)
        have_byte = Signal()
        m.d.comb += link.rx.ready.eq(~have_byte)
        with m.If(link.rx.valid & ~have_byte):
            m.d.sync += [byte.eq(link.rx.payload), have_byte.eq(1)]
        take = Signal()                      # a byte is consumed this cycle
        got = have_byte & take
        with m.If(got):
            m.d.sync += have_byte.eq(0)

        seq = Signal(8)
        crc = Signal(16)
        crc_lo = Signal(8)
        crc_hi = Signal(8)
        crc_ok = Signal()
        error_code = Signal(8)
        beat = Signal(self.in_tdata_width, reset_less=True)
        byte_index = Signal(range(in_nbytes))
        beat_index = Signal(range(self.in_beats))
        last_in_beat = Signal()              # byte_index == in_nbytes - 1
        last_beat = Signal()                 # beat_index == in_beats - 1
        # Header checks, one byte at a time.
        is_hello = Signal()
        is_infer = Signal()
        len_lo_zero = Signal()
        len_lo_in = Signal()
        len_hi_zero = Signal()
        len_hi_in = Signal()

        # The timeout: `timed_out` is a register equal to `idle == timeout_cycles`.
        idle = Signal(range(self.timeout_cycles + 1))
        timed_out = Signal()
        with m.If(got):
            m.d.sync += [idle.eq(0), timed_out.eq(0)]
        with m.Elif(~timed_out):
            m.d.sync += idle.eq(idle + 1)
            with m.If(idle == self.timeout_cycles - 1):
                m.d.sync += timed_out.eq(1)

        # ---- CRC: one register for both directions (they never overlap), updated a cycle
        # after its byte. The last received and the last offered byte are registered every
        # cycle; a flag says whether the byte was taken (sent) and counts.
        crc_step_rx = Signal()
        crc_step_tx = Signal()
        crc_step = crc_step_rx | crc_step_tx
        rx_data = Signal(8)
        tx_data = Signal(8)
        crc_init = Signal()
        m.d.sync += [crc_step_rx.eq(0), crc_step_tx.eq(0), rx_data.eq(byte)]

        # ---- Input beats: every received byte shifts into `beat` a cycle after it was
        # taken (from `rx_data`, enabled by a register: the state decode enabling all of
        # `beat` was the next critical path, 10.6 ns), whatever the state: header bytes leave
        # before a beat's last payload byte. `beat_done` marks a completed beat; the write
        # follows a cycle later from registers, while `beat` holds (the next byte comes two
        # cycles after the last one at the earliest).
        got_r = Signal()
        beat_done = Signal()
        beat_addr = Signal.like(wr_addr)
        m.d.sync += [got_r.eq(got), beat_done.eq(0), wr_en.eq(beat_done),
                     wr_addr.eq(beat_addr)]
        with m.If(got_r):
            m.d.sync += beat.eq(Cat(beat[8:], rx_data) if in_nbytes > 1 else rx_data)
        m.d.comb += wr_data.eq(beat[:self.in_payload_width])
        with m.If(crc_init):
            m.d.sync += crc.eq(0xFFFF)
        with m.Elif(crc_step_rx):
            m.d.sync += crc.eq(crc16_byte(crc, rx_data))
        with m.Elif(crc_step_tx):
            m.d.sync += crc.eq(crc16_byte(crc, tx_data))

        def crc_rx():
            m.d.sync += crc_step_rx.eq(1)

        def crc_tx():
            m.d.sync += crc_step_tx.eq(1)

        # ---- Transmit side ----------------------------------------------------------------
        reply_type = Signal(8)
        reply_kind = Signal(2)               # 0 HELLO, 1 INFER, 2 ERROR
        reply_start = Signal()               # pulse: receiver -> transmitter
        reply_done = Signal()                # pulse: transmitter -> receiver
        tx_left = Signal(16)                 # the reply's length, then payload bytes to send
        tx_last = Signal()                   # tx_left == 1
        tx_byte = Signal(8)
        tx_valid = Signal()
        # The link takes bytes from a register that the FSM fills while it is empty, so
        # that the link's ready reaches no FSM decision: tx_state -> tx_valid -> the UART's
        # ready -> sent -> the output shift register was the digits example's critical path
        # on the iCEBreaker (25.7 ns, 39.0 MHz). A byte takes a UART hundreds of cycles; the
        # cycle the register spends full before the UART has it costs nothing.
        out_byte = Signal(8)
        out_full = Signal()
        m.d.comb += [link.tx.payload.eq(out_byte), link.tx.valid.eq(out_full)]
        sent = tx_valid & ~out_full
        with m.If(sent):
            m.d.sync += [out_byte.eq(tx_byte), out_full.eq(1)]
        with m.Elif(link.tx.ready):
            m.d.sync += out_full.eq(0)
        m.d.sync += tx_data.eq(tx_byte)
        m.d.sync += [reply_start.eq(0), reply_done.eq(0)]

        # Output beats -> bytes, least significant first (as UartBridge).
        shreg = Signal(self.out_tdata_width)
        bytes_left = Signal(range(out_nbytes + 1))
        out_beat_index = Signal(range(self.out_beats))
        accept_output = Signal()             # a register: the INFER reply's payload is sent
        m.d.comb += acc.m_axis_tready.eq(accept_output & (bytes_left == 0))
        with m.If(acc.m_axis_tvalid & acc.m_axis_tready):
            m.d.sync += [shreg.eq(acc.m_axis_tdata), bytes_left.eq(out_nbytes)]
            expect_last = out_beat_index == self.out_beats - 1
            with m.If(acc.m_axis_tlast != expect_last):
                m.d.sync += self.tlast_error.eq(1)
            m.d.sync += out_beat_index.eq(Mux(expect_last, 0, out_beat_index + 1))

        # Input feeder: buffer rows -> s_axis, started once the CRC has been checked. The rows
        # go through a register and a skid register (hw.blocks.skid_output): the accelerator
        # sees registered tvalid and tlast and the register's data (through the skid's
        # multiplexer), and no enable but the skid flag's sees its ready, so the block RAM's
        # output only drives flip-flops (on kwsmlp_w3a3 the read straight into the
        # accelerator's first width converter was the critical path, 11.6 ns on the ECP5)
        # and the ready does not fan out to a word of flip-flops (the UNSW-NB15 MLP missed
        # 100 MHz by 0.12 ns on the first adder graph's ready into the enables of the 906-bit
        # register and skid register, 8.9 ns of routing). The read pipeline moves on while
        # the register may be loaded (`adv`, a function of registers), so it holds its
        # words, the block RAMs' outputs included, while the accelerator stalls. With more
        # than one bank, each bank's output is registered before the banks are chosen, and
        # the choice is registered again: a 9,216-row buffer read through the multiplexer
        # of its block RAMs into the skid register was MobileNetV1's critical path on the
        # ECP5 (12.3 ns: 5.8 ns clock-to-out, 3.1 ns route, three logic levels).
        feed_start = Signal()                # a register pulse
        feed_active = Signal()               # rows are left to read
        feed_index = Signal(range(self.in_beats))
        out_valid = Signal()
        out_data = Signal(self.in_payload_width, reset_less=True)
        out_last = Signal(reset_less=True)
        to_acc = stream.Signature(self.in_payload_width + 1).create()
        adv = skid_output(m, to_acc, out_valid, Cat(out_data, out_last))
        issue = feed_active & adv
        m.d.comb += [
            acc.s_axis_tdata.eq(to_acc.payload[:-1]),
            acc.s_axis_tvalid.eq(to_acc.valid),
            acc.s_axis_tlast.eq(to_acc.payload[-1]),
            to_acc.ready.eq(acc.s_axis_tready),
            rd_addr.eq(feed_index),
            rd_en.eq(issue),          # (reads only rows it feeds: NO_RW_CHECK)
        ]
        # Stage 1: the block RAMs' outputs.
        valid, last = Signal(name="rd_valid"), Signal(name="rd_last")
        with m.If(adv):
            m.d.sync += [valid.eq(issue), last.eq(feed_index == self.in_beats - 1)]
        data = rports[0].data
        if banks > 1:
            # Stage 2: each bank's output registered; stage 3: the chosen one.
            bank_of = Signal(range(banks), name="rd_bank")
            bank_data = [Signal(self.in_payload_width, name=f"rd_bank_data_{b}",
                                reset_less=True) for b in range(banks)]
            valid2, last2, bank2 = Signal(), Signal(), Signal(range(banks))
            valid3, last3 = Signal(), Signal()
            data3 = Signal(self.in_payload_width, name="rd_data", reset_less=True)
            with m.If(adv):
                m.d.sync += [bank_of.eq(feed_index[low:]), valid2.eq(valid), last2.eq(last),
                             bank2.eq(bank_of), valid3.eq(valid2), last3.eq(last2),
                             data3.eq(Array(bank_data)[bank2])]
                m.d.sync += [bank_data[b].eq(rports[b].data) for b in range(banks)]
            valid, last, data = valid3, last3, data3
        with m.If(adv):
            m.d.sync += [out_valid.eq(valid), out_data.eq(data), out_last.eq(last)]
        m.d.sync += feed_start.eq(0)
        with m.If(feed_start):
            m.d.sync += [feed_index.eq(0), feed_active.eq(1)]
        with m.Elif(issue):
            with m.If(feed_index == self.in_beats - 1):
                m.d.sync += feed_active.eq(0)
            with m.Else():
                m.d.sync += feed_index.eq(feed_index + 1)

        hello_payload = self.info.pack()
        # The HELLO payload byte for `tx_left`, registered: looked up in the cycle a byte was
        # sent, it took 2 LUT levels of the transmitter's tx_left -> tx_data path (26.7 ns on
        # the iCEBreaker). A cycle late is in time: `sent` fills `out_byte`, so no byte is
        # sent in the cycle after one, and tx_left changes only when one is.
        hello_byte = Signal(8)
        with m.Switch(tx_left[:5]):         # at most 17 bytes left while HELLO is sent
            for i, value in enumerate(hello_payload):
                with m.Case(len(hello_payload) - i):
                    m.d.sync += hello_byte.eq(value)

        def reply(kind, type_, length_):
            m.d.sync += [reply_kind.eq(kind), reply_type.eq(type_), tx_left.eq(length_),
                         tx_last.eq(length_ == 1), reply_start.eq(1)]
            m.d.comb += crc_init.eq(1)
            rx.goto("Busy")

        def fail(code, state="Send-Error"):
            m.d.sync += error_code.eq(code)
            rx.goto(state)

        one_hot = self.fsm_encoding == "one-hot"
        rx = _StateMachine(m, "rx", ("Sync-0", "Sync-1", "Type", "Seq", "Length-0", "Length-1",
                                     "Header", "Payload", "CRC-0", "CRC-1", "Check", "Decide",
                                     "Skip", "Send-Error", "Busy"), "Sync-0", one_hot=one_hot)
        with rx.state("Sync-0"):
            m.d.comb += take.eq(1)
            with m.If(got & (byte == SYNC[0])):
                rx.goto("Sync-1")
        with rx.state("Sync-1"):
            m.d.comb += take.eq(1)
            with m.If(got):
                m.d.comb += crc_init.eq(1)
                m.d.sync += [seq.eq(0), byte_index.eq(0), beat_index.eq(0),
                             last_in_beat.eq(in_nbytes == 1),
                             last_beat.eq(self.in_beats == 1)]
                with m.If(byte == SYNC[1]):
                    rx.goto("Type")
                with m.Elif(byte != SYNC[0]):
                    rx.goto("Sync-0")
            with m.Elif(timed_out):
                rx.goto("Sync-0")
        header = (
            ("Type", "Seq",
             [is_hello.eq(byte == FrameType.HELLO), is_infer.eq(byte == FrameType.INFER)]),
            ("Seq", "Length-0", [seq.eq(byte)]),
            ("Length-0", "Length-1",
             [len_lo_zero.eq(byte == 0), len_lo_in.eq(byte == (self.in_bytes & 0xFF))]),
            ("Length-1", "Header",
             [len_hi_zero.eq(byte == 0), len_hi_in.eq(byte == (self.in_bytes >> 8))]),
        )
        for state, nxt, actions in header:
            with rx.state(state):
                m.d.comb += take.eq(1)
                with m.If(got):
                    m.d.sync += actions
                    crc_rx()
                    rx.goto(nxt)
                with m.Elif(timed_out):
                    fail(ErrorCode.TIMEOUT)
        with rx.state("Header"):
            # Type and length, from the flags the header bytes left.
            with m.If(is_hello):
                with m.If(len_lo_zero & len_hi_zero):
                    rx.goto("CRC-0")
                with m.Else():
                    fail(ErrorCode.BAD_LENGTH, "Skip")
            with m.Elif(is_infer):
                with m.If(len_lo_in & len_hi_in):
                    rx.goto("Payload")
                with m.Else():
                    fail(ErrorCode.BAD_LENGTH, "Skip")
            with m.Else():
                fail(ErrorCode.UNKNOWN_TYPE, "Skip")
        with rx.state("Payload"):
            m.d.comb += take.eq(1)
            with m.If(got):
                crc_rx()
                with m.If(last_in_beat):
                    m.d.sync += [beat_done.eq(1), beat_addr.eq(beat_index)]
                    m.d.sync += [byte_index.eq(0), last_in_beat.eq(in_nbytes == 1),
                                 beat_index.eq(beat_index + 1),
                                 last_beat.eq(beat_index == max(self.in_beats - 2, 0))]
                    with m.If(last_beat):
                        rx.goto("CRC-0")
                with m.Else():
                    m.d.sync += [byte_index.eq(byte_index + 1),
                                 last_in_beat.eq(byte_index == max(in_nbytes - 2, 0))]
            with m.Elif(timed_out):
                fail(ErrorCode.TIMEOUT)
        for state, target, nxt in (("CRC-0", crc_lo, "CRC-1"), ("CRC-1", crc_hi, "Check")):
            with rx.state(state):
                m.d.comb += take.eq(1)
                with m.If(got):
                    m.d.sync += target.eq(byte)
                    rx.goto(nxt)
                with m.Elif(timed_out):
                    fail(ErrorCode.TIMEOUT)
        with rx.state("Check"):
            # The last CRC step (a cycle after the last payload byte) is done by now.
            m.d.sync += crc_ok.eq(Cat(crc_lo, crc_hi) == crc)
            rx.goto("Decide")
        with rx.state("Decide"):
            with m.If(~crc_ok):
                fail(ErrorCode.BAD_CRC)
            with m.Elif(is_hello):
                reply(0, FrameType.HELLO_REPLY, len(hello_payload))
            with m.Else():
                m.d.sync += feed_start.eq(1)
                reply(1, FrameType.INFER_REPLY, self.out_bytes)
        with rx.state("Skip"):
            # The rest of a frame whose type or length cannot be trusted.
            m.d.comb += take.eq(1)
            with m.If(timed_out):
                rx.goto("Send-Error")
        with rx.state("Send-Error"):
            reply(2, FrameType.ERROR, 1)
        with rx.state("Busy"):
            with m.If(reply_done):
                rx.goto("Sync-0")

        # The byte offered in each state, as an OR of (state & kind) AND value terms: the
        # states' assignments to tx_byte one after another made a chain of 7 multiplexer LUTs
        # that yosys does not know to be exclusive (the next critical path on the iCEBreaker,
        # 23.8 ns).
        tx_terms = []

        def offer(value, cond=None):
            cond = tx.bits[tx.current] if cond is None else tx.bits[tx.current] & cond
            tx_terms.append(Mux(cond, value, 0))

        def send(value, next_state, crc_it=True):
            offer(value)
            m.d.comb += tx_valid.eq(1)
            with m.If(sent):
                if crc_it:
                    crc_tx()
                tx.goto(next_state)

        tx = _StateMachine(m, "tx", ("Idle", "Send-Sync-0", "Send-Sync-1", "Send-Type",
                                     "Send-Seq", "Send-Length-0", "Send-Length-1",
                                     "Send-Payload", "Send-CRC-0", "Send-CRC-1"), "Idle",
                           one_hot=one_hot)
        with tx.state("Idle"):
            with m.If(reply_start):
                tx.goto("Send-Sync-0")
        with tx.state("Send-Sync-0"):
            send(SYNC[0], "Send-Sync-1", crc_it=False)
        with tx.state("Send-Sync-1"):
            send(SYNC[1], "Send-Type", crc_it=False)
        with tx.state("Send-Type"):
            send(reply_type, "Send-Seq")
        with tx.state("Send-Seq"):
            send(seq, "Send-Length-0")
        with tx.state("Send-Length-0"):
            send(tx_left[:8], "Send-Length-1")
        with tx.state("Send-Length-1"):
            send(tx_left[8:], "Send-Payload")
            with m.If(sent & (reply_kind == 1)):
                m.d.sync += accept_output.eq(1)
        with tx.state("Send-Payload"):
            for kind, value in enumerate((hello_byte, shreg[:8], error_code)):
                offer(value, reply_kind == kind)
            with m.Switch(reply_kind):
                with m.Case(0, 2):
                    m.d.comb += tx_valid.eq(1)
                with m.Case(1):
                    m.d.comb += tx_valid.eq(bytes_left != 0)
            with m.If(sent):
                crc_tx()
                m.d.sync += [tx_left.eq(tx_left - 1), tx_last.eq(tx_left == 2)]
                with m.If(reply_kind == 1):
                    m.d.sync += [shreg.eq(shreg >> 8), bytes_left.eq(bytes_left - 1)]
                with m.If(tx_last):
                    m.d.sync += accept_output.eq(0)
                    tx.goto("Send-CRC-0")
        with tx.state("Send-CRC-0"):
            # Wait for the CRC step of the last payload byte.
            with m.If(~crc_step):
                send(crc[:8], "Send-CRC-1", crc_it=False)
        with tx.state("Send-CRC-1"):
            send(crc[8:], "Idle", crc_it=False)
            with m.If(sent):
                m.d.sync += reply_done.eq(1)
                with m.If(reply_kind == 2):
                    m.d.sync += [self.frames_bad.eq(self.frames_bad + 1),
                                 self.error_led.eq(1)]
                with m.Else():
                    m.d.sync += [self.frames_ok.eq(self.frames_ok + 1),
                                 self.error_led.eq(0)]

        m.d.comb += tx_byte.eq(tree_sum(tx_terms, operator.or_))

        # The activity LED (as UartBridge): lit for 2 to 3 periods of ~25 ms after a byte.
        prescale_bits = max(1, (int(self.clk_freq) // 40).bit_length() - 1)
        prescaler = Signal(prescale_bits + 1)
        m.d.sync += prescaler.eq(prescaler[:prescale_bits] + 1)
        tick = prescaler[prescale_bits]
        stretch = Signal(2)
        # Through a register: the LED's flip-flops sit by its pin, and `sent` (from the
        # transmitter's state and the output byte count) routed there was the jet tagger's
        # critical path on the ULX3S (bytes_left -> stretch, 10.3 ns, 5.1 ns of it one route).
        byte_event = Signal()
        m.d.sync += byte_event.eq(link.rx_event | sent)
        with m.If(byte_event):
            m.d.sync += stretch.eq(3)
        with m.Elif(tick & (stretch != 0)):
            m.d.sync += stretch.eq(stretch - 1)
        m.d.comb += self.activity.eq(stretch != 0)
        return m
