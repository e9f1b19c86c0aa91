"""Hardware generation: streaming cores in Amaranth, the accelerator top level, Verilog.

One file per core (:mod:`.matvec`, :mod:`.requant`, :mod:`.threshold`, :mod:`.lut`, :mod:`.window`,
:mod:`.reduce`, :mod:`.depthwise`, :mod:`.joins`, :mod:`.resize`, :mod:`.plumbing`) over a
public library of building blocks (:mod:`.blocks`, :mod:`.arith`, :mod:`.memory`); the top
level (:mod:`.top`), Verilog emission (:mod:`.emit`) and resource estimates read from the
netlist (:mod:`.resources`), both with fewer garbage collections while a netlist is built
(:mod:`.collect`). What the cores are and how fast they run is planned in
:mod:`onnx2fpga.plan`.
"""

from .emit import emit_verilog
from .lut import LutCore
from .matvec import MatVecCore
from .plumbing import StreamFIFO, WidthConverter
from .requant import RequantCore
from .threshold import ThresholdCore
from .top import Accelerator, StreamAccelerator

__all__ = [
    "Accelerator", "LutCore", "MatVecCore", "RequantCore", "StreamFIFO", "WidthConverter",
    "ThresholdCore", "StreamAccelerator", "emit_verilog",
]
