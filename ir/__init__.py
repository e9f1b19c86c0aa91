"""The integer IR: what the frontend hands to the planner, the hardware generator and the
golden model.

Plain data only (numpy arrays and Python scalars): ``hw`` and ``sim`` import this module and
never see ONNX. Every layer is a streaming operator; layers form a directed acyclic graph from
the accelerator's input port to its output port, connected by tensor names (``inputs`` and
``output`` of each layer; a tensor read by several layers is broadcast to all of them). The
integer semantics of each layer are defined by the golden model in
:mod:`onnx2fpga.sim.golden`, on *logical* tensors: the ONNX tensor without its batch
dimension, images NCHW-style as ``(C, H, W)`` (``(C, W)`` for 1-D).

Stream conventions
------------------
A tensor crosses a stream as a flat sequence of its elements in the tensor's *stream order*:
``order[p]`` is the logical (C-order) flat index of the element at stream position ``p``
(``None``: C order itself). Images travel channels-last (pixel by pixel, the channels of a
pixel together); vectors in C order; a reshape, flatten or transpose changes only which
logical element a stream position holds (see :mod:`onnx2fpga.plan.graph`, which derives every
tensor's order). A stream with ``lanes`` elements per transfer carries stream positions
``k*lanes .. k*lanes+lanes-1`` in transfer ``k``; element ``j`` of a transfer sits at bits
``[j*bits, (j+1)*bits)`` of the payload (little-endian lane order).

Per-channel parameters (requantization multipliers, offsets) are arrays aligned on the *left*
with the logical shape: an array of shape ``(C,)`` varies along axis 0 (the channel of an image,
the feature of a vector), ``(1, OH, OW)`` per pixel, ``(1,)`` is one value for all.
"""

from .dataflow import Dataflow, Design, HostNode, Port
from .layers import (
    LAYER_TYPES,
    MULTIPLIERS,
    AddLayer,
    ConcatLayer,
    ConvLayer,
    DenseLayer,
    PadLayer,
    PoolLayer,
    RequantLayer,
    ResizeLayer,
    SliceLayer,
    ViewLayer,
    align_params,
    image_shape,
    product_mapping,
    window_out_size,
)
from .serialize import load_design, save_design
from .stages import LutStage, RequantStage, ThresholdStage
from .types import (
    FLOAT_ROUNDINGS,
    REQUANT_MODES,
    ROUNDINGS,
    SHIFT_ROUNDINGS,
    IntType,
    acc_type_for,
    float32_scales,
)

__all__ = [
    "IntType", "ROUNDINGS", "SHIFT_ROUNDINGS", "FLOAT_ROUNDINGS", "REQUANT_MODES", "float32_scales",
    "RequantStage", "ThresholdStage", "LutStage",
    "DenseLayer",
    "RequantLayer", "ConvLayer", "PoolLayer", "AddLayer", "ConcatLayer", "ResizeLayer",
    "PadLayer", "ViewLayer", "SliceLayer",
    "LAYER_TYPES", "Port", "Dataflow", "HostNode", "Design", "acc_type_for", "save_design",
    "load_design", "image_shape", "align_params", "window_out_size", "MULTIPLIERS",
    "product_mapping",
]
