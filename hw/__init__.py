"""Hardware generation: streaming cores in Amaranth, the accelerator top level, Verilog."""

from .cores import MatVecCore, RequantCore, StreamFIFO, WidthConverter, int_shape
from .cost import dataflow_cycles, layer_cycles, layer_latency
from .emit import emit_verilog
from .graph import Plan, Stage, layer_stages, plan_graph, requant_lanes
from .threshold import ThresholdCore, requant_as_thresholds
from .top import Accelerator

__all__ = [
    "Accelerator", "MatVecCore", "Plan", "RequantCore", "Stage", "StreamFIFO",
    "WidthConverter", "dataflow_cycles", "emit_verilog", "int_shape", "layer_cycles",
    "layer_latency", "layer_stages", "plan_graph", "requant_lanes", "ThresholdCore",
    "requant_as_thresholds",
]
