"""Board targets, the UART board wrapper and bitstream builds (``onnx2fpga.boards``).

- :mod:`.targets`: the registry of boards by command-line name (:func:`list_boards`,
  :func:`get_board`), with device limits, clock, UART and flasher.
- :mod:`.wrapper`: :class:`UartBridge`, an accelerator with AXI4-Stream ports behind an 8N1 UART
  (:mod:`.uart`); :mod:`.loopback` has a stand-in accelerator for bring-up.
- :mod:`.link`: the byte links both bridges use: the UART, or the board's USB port as a CDC-ACM
  serial device (LUNA's gateware, OrangeCrab), with :mod:`.clocking` making its clocks.
- :mod:`.build`: :func:`build_bitstream` through amaranth-boards and YoWASP (and apicula for
  Gowin), writing ``report.json``.
- :mod:`.protocol`: the host link's frames (header, length, CRC-16), shared by the gateware
  (:mod:`.framed`: :class:`FramedBridge`), the host runtime (:mod:`onnx2fpga.runtime`) and
  the simulated board (:mod:`.simboard`).
- :mod:`.flash`: the programmer command for a built bitstream, checked against the board and
  the design.
"""

from .build import BuildError, build_bitstream
from .framed import FramedBridge
from .pnr import format_report
from .targets import BoardTarget, UnknownBoardError, get_board, list_boards
from .wrapper import UartBridge

__all__ = ["BoardTarget", "BuildError", "FramedBridge", "UartBridge", "UnknownBoardError",
           "build_bitstream", "format_report", "get_board", "list_boards"]
