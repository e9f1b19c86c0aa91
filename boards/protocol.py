"""The host link protocol: framed requests and replies with a CRC, over any byte transport.

One module defines the frame format for the gateware (:mod:`.framed`), the host runtime
(:mod:`onnx2fpga.runtime`) and the tests. A frame is::

    sync (2: A5 5A) | type (1) | seq (1) | length (2, LE) | payload (length) | crc (2, LE)

``crc`` is CRC-16/CCITT-FALSE (polynomial 0x1021, initial value 0xFFFF, no reflection, no final
XOR; ``crc16(b"123456789") == 0x29B1``) over ``type``, ``seq``, ``length`` and ``payload``.
The host sends requests; the board answers each one with exactly one reply that echoes
``seq``:

========== ====== ================================ ==============================================
request    type   request payload                  reply (type, payload)
========== ====== ================================ ==============================================
HELLO      0x01   none                             0x81: :class:`BoardInfo` (17 bytes)
INFER      0x02   the input tensor's beats         0x82: the output tensor's beats
========== ====== ================================ ==============================================

Beats are packed as the accelerator's AXI-Stream carries them (:func:`~onnx2fpga.sim.rtl.
pack_beats`), each ``tdata_width / 8`` bytes, least significant byte first.

A frame the board cannot take is answered with ``ERROR`` (type 0xFF, one payload byte: an
:class:`ErrorCode`) and dropped; the accelerator never sees its payload, because an INFER
payload is buffered until its CRC has been checked. A bad type or length is answered once
the line has been quiet for the board's byte timeout (the rest of the frame is skipped); a
frame cut off for that long is answered with ``TIMEOUT``, which is also how the board's
parser recovers from any half frame.

The host side (:class:`Link`) retries a request after an ERROR reply, a reply with a bad CRC,
or no reply within its timeout; before each retry it waits until the line has been quiet,
so that the board's parser is idle again and no stale reply is mistaken for the new one.
"""

from __future__ import annotations

import binascii
import enum
import struct
import time
from dataclasses import dataclass

from ..errors import Onnx2FpgaError

__all__ = ["SYNC", "HEADER_BYTES", "OVERHEAD_BYTES", "PROTOCOL_VERSION", "FrameType",
           "ErrorCode", "BoardInfo", "crc16", "encode_frame", "FrameDecoder", "Frame",
           "LinkError", "LinkTimeout", "ProtocolVersionError", "Link", "design_id_from_sha256",
           "frame_bytes", "UART_BITS_PER_BYTE", "USB_FS_PACKET_BYTES", "USB_FS_PACKETS_PER_MS",
           "LinkRate", "link_rate"]

SYNC = b"\xa5\x5a"
#: Sync, type, seq and length.
HEADER_BYTES = 6
#: Bytes of a frame besides its payload (header and CRC).
OVERHEAD_BYTES = HEADER_BYTES + 2
PROTOCOL_VERSION = 1
#: Bits on the line per byte of an 8N1 UART: a start bit, 8 data bits, a stop bit.
UART_BITS_PER_BYTE = 10
#: USB 2.0 full speed, bulk transfers: packets of at most 64 bytes, at most 19 of them in
#: a 1 ms frame (USB 2.0 specification, section 5.8.4, table 5-10: 1,216 bytes a frame).
USB_FS_PACKET_BYTES = 64
USB_FS_PACKETS_PER_MS = 19
#: Largest HELLO reply payload the host takes, so that a board of another protocol version,
#: whose reply may be longer, is still heard and refused by its version (the first byte).
MAX_HELLO_PAYLOAD = 255
#: Largest payload a frame may carry (the length field is 16 bits).
MAX_PAYLOAD = 0xFFFF


class FrameType(enum.IntEnum):
    HELLO = 0x01
    INFER = 0x02
    HELLO_REPLY = 0x81
    INFER_REPLY = 0x82
    ERROR = 0xFF


class ErrorCode(enum.IntEnum):
    """Payload byte of an ERROR frame."""
    BAD_CRC = 1
    BAD_LENGTH = 2
    UNKNOWN_TYPE = 3
    TIMEOUT = 4


def crc16(data: bytes, crc: int = 0xFFFF) -> int:
    """CRC-16/CCITT-FALSE of ``data`` (continue a running CRC by passing it as ``crc``).

    :func:`binascii.crc_hqx` is this CRC (polynomial 0x1021, MSB first, no reflection, no
    final XOR) from the initial value it is given, in C: the same bits as the gateware's
    :func:`~.framed.crc16_byte`."""
    return binascii.crc_hqx(data, crc)


def frame_bytes(payload_length: int) -> int:
    """Bytes on the line for a frame with ``payload_length`` payload bytes."""
    return OVERHEAD_BYTES + payload_length


@dataclass(frozen=True)
class LinkRate:
    """What the host link allows: see :func:`link_rate`.

    Attributes
    ----------
    link : str
        ``"uart"`` or ``"usb"``.
    bytes_in, bytes_out : int
        Bytes on the line per inference, to the board and back (frames included).
    seconds : float
        Line time per inference, one request at a time.
    assumption : str
        How ``seconds`` was computed, in words.
    """
    link: str
    bytes_in: int
    bytes_out: int
    seconds: float
    assumption: str

    @property
    def inferences_per_second(self) -> float:
        return 1.0 / self.seconds


def link_rate(in_payload: int, out_payload: int, *, link: str = "uart", baud: int | None = None,
              framed: bool = True) -> LinkRate:
    """The inferences per second a host link carries, from the bytes of one inference.

    The host sends a request and waits for its reply before the next (:class:`Link`), so
    request and reply take turns on the line. ``in_payload``, ``out_payload``: the input and
    output beats' bytes; ``framed``: each is one frame (:func:`frame_bytes`), else the raw
    bytes alone (:class:`~.wrapper.UartBridge`).

    UART (``baud`` needed): :data:`UART_BITS_PER_BYTE` bits a byte. USB (full-speed CDC-ACM):
    an upper bound from the bus alone, every byte in bulk packets of
    :data:`USB_FS_PACKET_BYTES` with :data:`USB_FS_PACKETS_PER_MS` packets a millisecond
    shared by both directions; the host's scheduling (often a frame per transfer) is not
    counted. The accelerator's own time is not counted either.
    """
    if link not in ("uart", "usb"):
        raise ValueError(f"Link must be 'uart' or 'usb', not {link!r}")
    for name, n in (("in_payload", in_payload), ("out_payload", out_payload)):
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"{name} must be a non-negative number of bytes, not {n!r}")
    b_in, b_out = ((frame_bytes(in_payload), frame_bytes(out_payload)) if framed
                   else (in_payload, out_payload))
    if link == "uart":
        if not isinstance(baud, (int, float)) or baud <= 0:
            raise ValueError(f"A UART link needs a positive baud rate, not {baud!r}")
        return LinkRate("uart", b_in, b_out, (b_in + b_out) * UART_BITS_PER_BYTE / baud,
                        f"UART at {baud:g} baud, 8N1 ({UART_BITS_PER_BYTE} bits a byte), "
                        f"request and reply in turn")
    packets = -(-b_in // USB_FS_PACKET_BYTES) - (-b_out // USB_FS_PACKET_BYTES)
    return LinkRate("usb", b_in, b_out, packets / (USB_FS_PACKETS_PER_MS * 1000),
                    f"USB full speed, bulk packets of {USB_FS_PACKET_BYTES} bytes, at most "
                    f"{USB_FS_PACKETS_PER_MS} a millisecond for both directions; the host's "
                    f"scheduling not counted (an upper bound)")


def encode_frame(type_: int, seq: int, payload: bytes = b"") -> bytes:
    """One frame, ready to send."""
    if not 0 <= type_ <= 0xFF:
        raise ValueError(f"Frame type must be a byte, not {type_!r}")
    if not 0 <= seq <= 0xFF:
        raise ValueError(f"Sequence number must be a byte, not {seq!r}")
    payload = bytes(payload)
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"Payload must be at most {MAX_PAYLOAD} bytes, not {len(payload)}")
    body = struct.pack("<BBH", type_, seq, len(payload)) + payload
    return SYNC + body + struct.pack("<H", crc16(body))


def design_id_from_sha256(verilog_sha256: str) -> bytes:
    """The 8-byte design id the gateware reports: the first 8 bytes of the manifest's
    ``top.verilog_sha256``."""
    if not isinstance(verilog_sha256, str) or len(verilog_sha256) != 64:
        raise ValueError(f"verilog_sha256 must be 64 hex digits, not {verilog_sha256!r}")
    return bytes.fromhex(verilog_sha256[:16])


@dataclass(frozen=True)
class BoardInfo:
    """What a board says in its HELLO reply.

    Attributes
    ----------
    version : int
        Protocol version (:data:`PROTOCOL_VERSION`).
    design_id : bytes
        8 bytes: the start of the manifest's ``top.verilog_sha256`` of the design it runs.
    in_bytes, out_bytes : int
        Payload bytes of an INFER request and of its reply.
    clock_khz : int
        The accelerator's clock.
    """
    version: int
    design_id: bytes
    in_bytes: int
    out_bytes: int
    clock_khz: int

    FORMAT = "<B8sHHI"
    SIZE = struct.calcsize(FORMAT)

    def pack(self) -> bytes:
        return struct.pack(self.FORMAT, self.version, self.design_id, self.in_bytes,
                           self.out_bytes, self.clock_khz)

    @classmethod
    def unpack(cls, payload: bytes) -> BoardInfo:
        """The reply's fields; its first byte, the version, must be :data:`PROTOCOL_VERSION`
        (:class:`ProtocolVersionError` otherwise, whatever the length)."""
        if payload[:1] and payload[0] != PROTOCOL_VERSION:
            raise ProtocolVersionError(payload[0])
        if len(payload) != cls.SIZE:
            raise LinkError(f"HELLO reply must have {cls.SIZE} payload bytes, not {len(payload)}")
        return cls(*struct.unpack(cls.FORMAT, payload))


@dataclass(frozen=True)
class Frame:
    type: int
    seq: int
    payload: bytes
    crc_ok: bool


class FrameDecoder:
    """Finds frames in a byte stream: feed bytes, take frames.

    Bytes before a sync pattern are skipped. A header announcing more than ``max_payload``
    bytes is taken as noise: the decoder skips its first sync byte and hunts again. A frame
    whose CRC does not match is returned with ``crc_ok`` false (its type and seq may be
    garbage).
    """

    def __init__(self, max_payload: int = MAX_PAYLOAD):
        self.max_payload = max_payload
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self.buffer += data
        frames = []
        while True:
            start = self.buffer.find(SYNC)
            if start < 0:
                # Keep a trailing first sync byte: the second may come in the next read.
                del self.buffer[:max(0, len(self.buffer) - 1)]
                if self.buffer[:1] != SYNC[:1]:
                    self.buffer.clear()
                return frames
            del self.buffer[:start]
            if len(self.buffer) < HEADER_BYTES:
                return frames
            type_, seq, length = struct.unpack_from("<BBH", self.buffer, 2)
            if length > self.max_payload:
                del self.buffer[:1]
                continue
            total = frame_bytes(length)
            if len(self.buffer) < total:
                return frames
            body = bytes(self.buffer[2:HEADER_BYTES + length])
            (crc,) = struct.unpack_from("<H", self.buffer, HEADER_BYTES + length)
            ok = crc == crc16(body)
            if ok:
                del self.buffer[:total]
            else:
                # A bad frame may hide a good one that starts inside it: resume after the sync.
                del self.buffer[:1]
            frames.append(Frame(type_, seq, body[4:], ok))

    def pending(self) -> int:
        return len(self.buffer)


class LinkError(Onnx2FpgaError, RuntimeError):
    """The board did not answer correctly, even after retrying."""


class LinkTimeout(LinkError):
    """No valid reply within the timeout on every attempt."""


class ProtocolVersionError(LinkError):
    """The board's HELLO reply carries another protocol version than :data:`PROTOCOL_VERSION`.

    Attributes
    ----------
    version : int
        The board's version.
    """

    def __init__(self, version: int):
        self.version = version
        super().__init__(f"The board speaks host link protocol version {version}; this "
                         f"onnx2fpga speaks version {PROTOCOL_VERSION}")


class Link:
    """Requests and replies over a byte transport, with retries.

    Parameters
    ----------
    transport
        Has ``write(data: bytes)``, ``read(n: int, timeout: float) -> bytes`` (returns what
        arrived, possibly fewer than ``n`` bytes, once ``timeout`` seconds have passed with
        nothing more) and ``reset_input()`` (drop bytes already received).
    timeout : float
        Seconds to wait for a complete reply after sending a request, per attempt.
    retries : int
        Further attempts after a failed one (bad CRC, ERROR reply, or timeout).
    quiet : float
        Before a retry, the line must have been silent this long (longer than the board's
        byte timeout, so that its parser is idle again).

    Attributes
    ----------
    stats : dict
        Counters: ``requests``, ``retries``, ``crc_errors`` (replies with a bad CRC),
        ``error_replies`` (by :class:`ErrorCode` name), ``timeouts``, ``stale`` (good replies
        to another sequence number, dropped).
    """

    def __init__(self, transport, *, timeout: float = 1.0, retries: int = 5,
                 quiet: float = 0.1):
        if not isinstance(retries, int) or retries < 0:
            raise ValueError(f"Retries must be a non-negative integer, not {retries!r}")
        for name, value in (("Timeout", timeout), ("Quiet time", quiet)):
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
        self.transport = transport
        self.timeout = float(timeout)
        self.retries = retries
        self.quiet = float(quiet)
        self.seq = 0
        self.stats = {"requests": 0, "retries": 0, "crc_errors": 0, "error_replies": {},
                      "timeouts": 0, "stale": 0}

    def _drain(self) -> None:
        """Read until the line has been quiet for :attr:`quiet` seconds."""
        while self.transport.read(4096, self.quiet):
            pass
        self.transport.reset_input()

    def request(self, type_: FrameType, payload: bytes = b"", *,
                reply_length: int | None = None, max_reply: int | None = None) -> bytes:
        """Send a request and return its reply's payload, retrying as needed.

        ``reply_length``: the reply's payload must have this length. ``max_reply``: without
        ``reply_length``, the longest reply payload taken (longer ones are noise to the
        decoder); default :attr:`BoardInfo.SIZE`.

        Raises
        ------
        LinkTimeout
            No reply on any attempt.
        LinkError
            Every attempt failed, the last one with a bad CRC or an ERROR reply; or a good
            reply has the wrong length.
        """
        reply_type = int(type_) | 0x80
        last_problem = None
        self.stats["requests"] += 1
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats["retries"] += 1
                self._drain()
            self.seq = (self.seq + 1) & 0xFF
            self.transport.write(encode_frame(type_, self.seq, payload))
            decoder = FrameDecoder(max_payload=max(max_reply or BoardInfo.SIZE,
                                                   reply_length or 0, 1))
            deadline = time.monotonic() + self.timeout
            outcome = None
            while outcome is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.stats["timeouts"] += 1
                    last_problem = f"no reply within {self.timeout:g} s"
                    break
                data = self.transport.read(4096, min(left, 0.05))
                for frame in decoder.feed(data):
                    if not frame.crc_ok:
                        self.stats["crc_errors"] += 1
                        last_problem = "a reply with a bad CRC"
                        outcome = "retry"
                    elif frame.type == FrameType.ERROR:
                        code = frame.payload[0] if len(frame.payload) == 1 else None
                        name = ErrorCode(code).name if code in ErrorCode._value2member_map_ \
                            else f"code {code}"
                        counts = self.stats["error_replies"]
                        counts[name] = counts.get(name, 0) + 1
                        last_problem = f"an ERROR reply ({name})"
                        outcome = "retry"
                    elif frame.seq != self.seq or frame.type != reply_type:
                        self.stats["stale"] += 1
                        continue
                    else:
                        if reply_length is not None and len(frame.payload) != reply_length:
                            raise LinkError(f"The board answered {type_.name} with "
                                            f"{len(frame.payload)} bytes, not {reply_length}")
                        return frame.payload
                    break
        cls = LinkTimeout if last_problem.startswith("no reply") else LinkError
        raise cls(f"{type_.name} failed after {self.retries + 1} attempt(s); the last one got "
                  f"{last_problem}")

    def hello(self) -> BoardInfo:
        """Ask the board which design it runs.

        Raises
        ------
        ProtocolVersionError
            The board speaks another protocol version (checked before the reply's length,
            which another version may change).
        LinkError
            No valid reply, or one of the wrong length.
        """
        return BoardInfo.unpack(self.request(FrameType.HELLO, max_reply=MAX_HELLO_PAYLOAD))

    def infer(self, payload: bytes, reply_length: int) -> bytes:
        """One inference: input beats in, output beats out."""
        return self.request(FrameType.INFER, payload, reply_length=reply_length)
