"""Hardware generation: streaming cores in Amaranth, the accelerator top level, Verilog."""

from ..plan.cost import dataflow_cycles, layer_cycles, layer_latency
from ..plan.graph import Plan, Stage, layer_stages, plan_graph, requant_lanes
from ..plan.thresholds import requant_as_thresholds
from .blocks import int_shape
from .emit import emit_verilog
from .matvec import MatVecCore
from .plumbing import StreamFIFO, WidthConverter
from .requant import RequantCore
from .threshold import ThresholdCore
from .top import Accelerator

__all__ = [
    "Accelerator", "MatVecCore", "Plan", "RequantCore", "Stage", "StreamFIFO",
    "WidthConverter", "dataflow_cycles", "emit_verilog", "int_shape", "layer_cycles",
    "layer_latency", "layer_stages", "plan_graph", "requant_lanes", "ThresholdCore",
    "requant_as_thresholds",
]
