"""Board targets, the UART board wrapper and bitstream builds (``onnx2fpga.boards``).

- :mod:`.targets`: the registry of boards by command-line name (:func:`list_boards`,
  :func:`get_board`), with device limits, clock, UART and flasher.
- :mod:`.wrapper`: :class:`UartBridge`, an accelerator with AXI4-Stream ports behind an 8N1 UART
  (:mod:`.uart`); :mod:`.loopback` has a stand-in accelerator for bring-up.
- :mod:`.build`: :func:`build_bitstream` through amaranth-boards and YoWASP, writing
  ``report.json``.
"""

from .build import BuildError, build_bitstream, format_report
from .targets import BoardTarget, UnknownBoardError, get_board, list_boards
from .wrapper import UartBridge

__all__ = ["BoardTarget", "BuildError", "UartBridge", "UnknownBoardError", "build_bitstream",
           "format_report", "get_board", "list_boards"]
