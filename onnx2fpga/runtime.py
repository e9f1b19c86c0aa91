"""The host runtime: run inference on a board (or a simulated one) from Python.

>>> with onnx2fpga.connect("out/digits", port="/dev/ttyUSB1") as board:   # doctest: +SKIP
...     y = board.infer(x)          # x and y in the model's own dtypes and shapes

:func:`connect` opens the serial port (pyserial), says HELLO and checks that the board runs
this design (the manifest's ``top.verilog_sha256``, whose first 8 bytes the gateware holds),
then :meth:`Board.infer` runs the host head in numpy, sends the packed input beats in an INFER
frame, checks and unpacks the reply and runs the host tail: the same functions the golden and
RTL simulations use (:mod:`onnx2fpga.sim.model`). The frame protocol, its CRC and the retries
are in :mod:`onnx2fpga.boards.protocol`.
"""

from __future__ import annotations

import math
import numbers
import os

import numpy as np

from .boards.protocol import (
    PROTOCOL_VERSION,
    Link,
    LinkError,
    ProtocolVersionError,
    design_id_from_sha256,
    frame_bytes,
)
from .errors import MissingExtraError, Onnx2FpgaError, OptionError
from .extras import require

__all__ = ["connect", "check_link_options", "Board", "SerialTransport", "BoardMismatchError",
           "LinkError", "DEFAULT_BAUD"]

#: The UART bit rate of the board wrapper unless the build report says otherwise.
DEFAULT_BAUD = 115200


class BoardMismatchError(Onnx2FpgaError, RuntimeError):
    """The board answers with another design than the one in the design directory, or
    speaks another version of the host link protocol."""


class SerialTransport:
    """A serial port (pyserial) with the transport interface of :class:`~.boards.protocol.Link`.

    Parameters
    ----------
    port : str
        ``/dev/ttyUSB1``, ``COM4``, or any pyserial URL (``loop://``, ``socket://host:port``).
    baud : int
    """

    def __init__(self, port, baud=DEFAULT_BAUD):
        try:
            import serial
        except ImportError:
            raise MissingExtraError("Talking to a board", ["pyserial"], "boards") from None
        try:
            self.serial = serial.serial_for_url(port, baudrate=baud, timeout=0)
        except (serial.SerialException, ValueError) as e:
            raise Onnx2FpgaError(f"Cannot open serial port {port!r}: {e}") from None
        self.port = port
        # A board unplugged mid-transfer, a closed pseudo-terminal, a socket:// peer gone:
        # pyserial raises SerialException (an OSError), or termios.error from flush().
        self._lost_errors = (OSError, serial.SerialException) + _termios_errors()

    def _lost(self, e: Exception) -> LinkError:
        return LinkError(f"Serial port {self.port!r} failed during the transfer (board "
                         f"disconnected?): {str(e).strip() or type(e).__name__}")

    def write(self, data: bytes) -> None:
        try:
            self.serial.write(data)
            self.serial.flush()
        except self._lost_errors as e:
            raise self._lost(e) from None

    def read(self, n: int, timeout: float) -> bytes:
        try:
            self.serial.timeout = timeout
            first = self.serial.read(1)
            if not first:
                return b""
            self.serial.timeout = 0
            return first + self.serial.read(max(0, n - 1))
        except self._lost_errors as e:
            raise self._lost(e) from None

    def reset_input(self) -> None:
        try:
            self.serial.reset_input_buffer()
        except self._lost_errors as e:
            raise self._lost(e) from None

    def close(self) -> None:
        try:
            self.serial.close()
        except self._lost_errors:
            pass                # already gone; what failed before is what is reported


def _termios_errors() -> tuple:
    try:
        import termios
    except ImportError:             # not on Windows
        return ()
    return (termios.error,)


class Board:
    """A connected board (or simulated board) running one design.

    Attributes
    ----------
    design : onnx2fpga.api.CompiledDesign
    info : onnx2fpga.boards.protocol.BoardInfo
        What the board said in its HELLO reply.
    link : onnx2fpga.boards.protocol.Link
        Its ``stats`` count retries, CRC errors and ERROR replies.
    """

    def __init__(self, design, transport, *, timeout=1.0, retries=5, quiet=0.1):
        self.design = design
        self.transport = transport
        self.link = Link(transport, timeout=timeout, retries=retries, quiet=quiet)
        df = design.design.dataflow
        self.in_port, self.out_port = df.input, df.output
        self.in_bytes = self.in_port.tdata_width // 8 * self.in_port.beats
        self.out_bytes = self.out_port.tdata_width // 8 * self.out_port.beats
        try:
            self.info = self.link.hello()
        except ProtocolVersionError as e:
            self.close()
            raise BoardMismatchError(
                f"The board speaks host link protocol version {e.version}, this onnx2fpga "
                f"speaks version {PROTOCOL_VERSION}; flash it with this onnx2fpga ('onnx2fpga "
                f"flash {design.directory} --board NAME') or talk to it with the onnx2fpga "
                f"that built it") from None
        except BaseException:
            self.close()
            raise
        want = design_id_from_sha256(design.manifest["top"]["verilog_sha256"])
        if self.info.design_id != want or (self.info.in_bytes, self.info.out_bytes) != (
                self.in_bytes, self.out_bytes):
            self.close()
            raise BoardMismatchError(
                f"The board runs design {self.info.design_id.hex()} ({self.info.in_bytes} "
                f"bytes in, {self.info.out_bytes} out), not {want.hex()} from "
                f"{design.directory} ({self.in_bytes} in, {self.out_bytes} out); flash it "
                f"with 'onnx2fpga flash {design.directory} --board NAME'")

    def infer_integers(self, x_int) -> np.ndarray:
        """The hardware part alone: accelerator input integers ``(batch, n)`` to output
        integers ``(batch, m)``."""
        from .sim.rtl import pack_beats, unpack_beats

        in_nbytes = self.in_port.tdata_width // 8
        out_nbytes = self.out_port.tdata_width // 8
        rows = []
        for row in np.asarray(x_int):
            payload = b"".join(w.to_bytes(in_nbytes, "little")
                               for w in pack_beats(row, self.in_port))
            reply = self.link.infer(payload, self.out_bytes)
            words = [int.from_bytes(reply[k:k + out_nbytes], "little")
                     for k in range(0, len(reply), out_nbytes)]
            rows.append(unpack_beats(words, self.out_port)[0])
        return np.stack(rows) if rows else np.zeros((0, self.out_port.size), np.int64)

    def infer(self, x):
        """The model's outputs for ``x``: one sample in the model's input shape (its batch
        dimension is 1) or samples stacked along axis 0, in the model's input dtype (or a
        dict holding it under the input's name); the outputs come back in the model's output
        dtype, stacked the same way: one array, or a dict by output name when the model has
        several."""
        from .sim.model import run_design

        return run_design(self.design.design, x,
                          engine=lambda dataflow, x_int: self.infer_integers(x_int))

    def line_bytes_per_inference(self) -> tuple[int, int]:
        """Bytes on the line per inference: (to the board, from the board)."""
        return frame_bytes(self.in_bytes), frame_bytes(self.out_bytes)

    def close(self) -> None:
        close = getattr(self.transport, "close", None)
        if close is not None:
            close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def connect(directory, port=None, *, baud=None, sim=False, timeout=None, retries=5,
            sim_options=None) -> Board:
    """Connect to a board running the design in ``directory``.

    Parameters
    ----------
    directory : path or CompiledDesign
        A design directory written by :func:`onnx2fpga.compile`, or the design
        :func:`onnx2fpga.load` already opened (not checked and loaded again).
    port : str, optional
        Serial port (pyserial name or URL) of a real board.
    baud : int, optional
        Default: the baud rate in the newest build report of the design, else 115200 (a
        report of a USB CDC-ACM link has none: the device ignores the baud rate, and 115200
        only sizes the default timeout).
    sim : bool
        Start a simulated board (the framed wrapper and ``top.v`` in Verilator) instead.
    timeout : float, optional
        Seconds to wait for a reply per attempt. Default: enough for the frames at ``baud``
        plus 0.5 s (real board), 10 s (simulated board).
    retries : int
        Further attempts after a CRC error, an ERROR reply or a timeout.
    sim_options : dict, optional
        Keyword arguments of :class:`~onnx2fpga.boards.simboard.SimBoard` (``faults``,
        ``flip_probability``, ``seed``, ``build_dir``, ``progress``).

    Raises
    ------
    OptionError
        An option out of range (:func:`check_link_options`), before a port is opened.
    BoardMismatchError
        The board runs another design, or its HELLO reply carries another protocol version
        than :data:`onnx2fpga.boards.protocol.PROTOCOL_VERSION`.
    onnx2fpga.boards.protocol.LinkError
        The board does not answer HELLO.
    """
    from .api import CompiledDesign, load

    check_link_options(baud=baud, timeout=timeout, retries=retries, sim_options=sim_options)
    design = directory if isinstance(directory, CompiledDesign) else load(directory)
    if sim:
        if port is not None:
            raise ValueError("Give either a port or sim=True, not both")
        require("sim", "The simulated board")
        require("simboard", "The simulated board")
        from .boards.simboard import SimBoard
        transport = SimBoard(design.directory, manifest=design.manifest, **(sim_options or {}))
        return Board(design, transport, timeout=timeout or 10.0, retries=retries, quiet=0.2)
    if not isinstance(port, str) or not port:
        raise ValueError(f"Port must be a serial port name, not {port!r}")
    if baud is None:
        baud = _report_baud(design.directory)
    df = design.design.dataflow
    line_bytes = (frame_bytes(df.input.tdata_width // 8 * df.input.beats)
                  + frame_bytes(df.output.tdata_width // 8 * df.output.beats))
    if timeout is None:
        timeout = 0.5 + 10 * line_bytes / baud
    transport = SerialTransport(port, baud)
    # The board's byte timeout is 20 ms: 0.1 s of silence means its parser is idle.
    return Board(design, transport, timeout=timeout, retries=retries, quiet=0.1)


def check_link_options(*, baud=None, timeout=None, retries=5, sim_options=None) -> None:
    """The options of :func:`connect`, checked before a port is opened or a simulated board
    is built: ``baud`` a positive integer, ``timeout`` a positive finite number of seconds,
    ``retries`` a non-negative integer, and of ``sim_options`` ``flip_probability`` in
    [0, 1) (at 1 every byte is damaged and no frame could pass) and ``seed`` a non-negative
    integer. ``OptionError`` names the option and what it accepts."""
    def is_int(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)

    if baud is not None and (not is_int(baud) or baud < 1):
        raise OptionError(f"baud must be a positive integer (bits per second), not {baud!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(
            timeout, numbers.Real) or not 0 < timeout < math.inf):
        raise OptionError(f"timeout must be a positive finite number of seconds, not "
                          f"{timeout!r}")
    if not is_int(retries) or retries < 0:
        raise OptionError(f"retries must be a non-negative integer, not {retries!r}")
    o = sim_options or {}
    p = o.get("flip_probability", 0.0)
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p < 1:
        raise OptionError(f"flip_probability must be a probability in [0, 1), not {p!r}")
    seed = o.get("seed", 0)
    if not is_int(seed) or seed < 0:
        raise OptionError(f"seed must be a non-negative integer, not {seed!r}")


def _report_baud(directory) -> int:
    import json

    builds = os.path.join(directory, "build")
    reports = []
    if os.path.isdir(builds):
        for name in os.listdir(builds):
            path = os.path.join(builds, name, "report.json")
            if os.path.isfile(path):
                reports.append((os.path.getmtime(path), path))
    for _, path in sorted(reports, reverse=True):
        try:
            with open(path) as f:
                baud = int(json.load(f)["uart"]["baud"])
        except (OSError, ValueError, KeyError, TypeError, OverflowError):
            continue
        if baud > 0:
            return baud
    return DEFAULT_BAUD

