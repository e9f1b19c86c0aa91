"""Hardware generation: streaming cores in Amaranth, the accelerator top level, Verilog."""

from .chain import ChainStage, layer_stages, plan_chain, requant_lanes
from .cores import MatVecCore, RequantCore, StreamFIFO, WidthConverter, int_shape
from .cost import dataflow_cycles, layer_cycles, layer_latency
from .emit import emit_verilog
from .top import Accelerator

__all__ = [
    "Accelerator", "ChainStage", "MatVecCore", "RequantCore", "StreamFIFO", "WidthConverter",
    "dataflow_cycles", "emit_verilog", "int_shape", "layer_cycles", "layer_latency",
    "layer_stages", "plan_chain", "requant_lanes",
]
