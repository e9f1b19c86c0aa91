"""The dataflow graph and the compiled design: ports, layers and FIFOs, host nodes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .layers import LAYER_TYPES
from .types import IntType

__all__ = ["Port", "Dataflow", "HostNode", "Design"]



@dataclass
class Port:
    """One accelerator port: a tensor of integers crossing an AXI-Stream.

    ``scale`` and ``zero_point`` say what the integers mean (``real = (q - zero_point) *
    scale``); ``lanes`` elements travel per transfer, packed as in the module docstring.
    ``order`` is the stream order (``order[p]``: logical flat index of stream position ``p``;
    ``None``: C order), set by folding from the layers the port feeds or is fed by.
    ``parts`` describes a multiplexed port (several graph inputs, or several results of the
    hardware part, flattened in C order and concatenated): one dict per tensor with its
    ``tensor``, ``offset``, ``size``, ``shape``, ``type``, ``scale`` and ``zero_point``
    (``scale`` and ``zero_point`` of the port itself are then 1 and 0); None for one tensor.
    """
    name: str
    shape: tuple[int, ...]
    type: IntType
    scale: float
    zero_point: int
    lanes: int = 1
    order: np.ndarray | None = None
    parts: list | None = None

    def __post_init__(self):
        self.shape = tuple(int(d) for d in self.shape)
        if self.order is not None:
            self.order = np.asarray(self.order, dtype=np.int64).reshape(-1)
            if np.array_equal(self.order, np.arange(self.order.size)):
                self.order = None

    def to_stream(self, x: np.ndarray) -> np.ndarray:
        """Logical tensors ``(batch, ...)`` to stream sequences ``(batch, size)``."""
        x = np.asarray(x).reshape(len(x), -1)
        return x if self.order is None else x[:, self.order]

    def from_stream(self, s: np.ndarray) -> np.ndarray:
        """Stream sequences ``(batch, size)`` to logical flat tensors ``(batch, size)``."""
        s = np.asarray(s).reshape(len(s), -1)
        if self.order is None:
            return s
        out = np.empty_like(s)
        out[:, self.order] = s
        return out

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def beats(self) -> int:
        return self.size // self.lanes

    @property
    def payload_width(self) -> int:
        """Bits of a transfer's elements, before the padding to whole bytes."""
        return self.lanes * self.type.bits

    @property
    def tdata_width(self) -> int:
        """Payload width on the AXI-Stream: the elements rounded up to whole bytes."""
        return -(-self.payload_width // 8) * 8


@dataclass
class Dataflow:
    """The hardware part: a graph of layers with FIFOs between them.

    ``layers`` are in topological order; layer ``k`` reads the tensors named in its
    ``inputs`` and writes the tensor ``output``. The input port's tensor is ``input.name``,
    the output port's ``output.name``. Layers given without names form a chain: each reads
    the previous one's output (the first the input port), the last writes the output port.

    ``fifo_depths[k]`` is the depth of the FIFO after layer ``k`` (0: a direct connection).
    ``edge_fifos`` maps ``"tensor->layer"`` to the depth of a FIFO on that edge only, for a
    tensor read by several layers (a skip connection), in transfers of the tensor's stream.
    ``folding_info`` records how the folding was chosen (see :func:`onnx2fpga.plan.fold`).
    ``logic_memories`` names memories a board build puts into soft logic instead of block
    RAM, ``"stage/memory"`` (a core's stage name, :func:`onnx2fpga.hw.resources.memory_path`)
    or ``"wrapper/buffer"``, ``"wrapper/rx_fifo"``: board folding fills it when the block
    RAMs run out; the values and cycles are the same either way. ``ice40_dsps``: the iCE40
    ``SB_MAC16`` cells the MatVecs' products may take on an iCE40 (to the layers in order
    whose products fit what is left, see :class:`~onnx2fpga.hw.matvec.MatVecCore`'s
    ``ice40_dsp``); 0 (the default) builds every product in LUTs. Folding for an iCE40 board
    sets it to the device's DSPs within the utilization. ``spram_memories``: the weight
    memories, ``"stage/w_mem"``, that live in the iCE40 UltraPlus' SPRAMs instead of block
    RAM, loaded from the board's SPI flash at start-up (see :mod:`onnx2fpga.plan.spram`);
    the values and cycles per inference are the same, the input waits for the load.
    ``ecp5_dsp_registers``: the MatVecs whose products take ECP5 ``MULT18X18D`` cells put a
    register in fabric behind each DSP's output (one more pipeline stage, on every platform,
    so that the cycles do not depend on it): the route out of a DSP block placed far from
    its adder tree was a ResNet-8 build's critical path at 100 MHz (8.8 ns of 12.2 ns).
    Folding for an ECP5 board sets it. ``block_memories``: the weight ROMs,
    ``"stage/w_mem"``, that carry yosys' ``rom_style = "block"`` so that they take block RAM
    where yosys would build them in LUTs: board folding fills it when LUTs run short and
    block RAMs do not; the values and cycles are the same either way. ``bram_registers``:
    a block RAM read that feeds another core passes a pipeline register first (a cycle of
    latency each, on every platform): each sliding window's output (two two-transfer
    buffers, whose ready is a register too: two cycles; the first takes the read into
    registers with no multiplexer in front) and each queue in block RAM
    (:class:`~onnx2fpga.hw.plumbing.StreamFIFO`'s ``out_register``). An ECP5 block RAM's
    output (5.8 ns clock-to-out) into a core placed far away was a ResNet-8 build's critical
    path at 100 MHz three times: a window's through its padding multiplexer (11.4 ns), then a
    skip queue's (10.5 ns), then a window's through the skid buffer's input multiplexer
    (10.8 ns, 3.3 ns of route across the die); and a ready chain from a requantization
    through a depthwise core into a window's counters a DS-CNN build's (13.6 ns) while that
    register was a one-transfer pipeline register. Folding for an ECP5 board sets it.
    ``adder_levels``: adder levels between two registers of the adder graph of a layer
    whose multipliers are ``"adders"`` (:class:`~onnx2fpga.hw.cmvm.ConstMatVecCore`); board
    folding sets it from the family's carry-chain delays at the clock
    (:func:`onnx2fpga.plan.devices.adder_levels`). ``engine``: ``""`` for the
    streaming dataflow of a core per layer; ``"spram"`` or ``"rom"`` for the
    layer-sequential engine instead (:mod:`onnx2fpga.plan.engine`),
    its weight records in an SPRAM loaded from flash or in a ROM: board folding chooses it
    when no folding fits the device and the engine does; its ports then carry one element
    a transfer in C order.
    """
    layers: list
    input: Port
    output: Port
    fifo_depths: list[int] = field(default_factory=list)
    edge_fifos: dict = field(default_factory=dict)
    folding_info: dict = field(default_factory=dict)
    logic_memories: list = field(default_factory=list)
    ice40_dsps: int = 0
    spram_memories: list = field(default_factory=list)
    ecp5_dsp_registers: bool = False
    block_memories: list = field(default_factory=list)
    bram_registers: bool = False
    adder_levels: int = 1
    engine: str = ""

    def __post_init__(self):
        if not self.fifo_depths:
            self.fifo_depths = [2] * len(self.layers)
        if len(self.fifo_depths) != len(self.layers):
            raise ValueError("One FIFO depth per layer is required")
        prev = self.input.name
        for k, layer in enumerate(self.layers):
            if not isinstance(layer, LAYER_TYPES):
                continue                          # reported by the consumers' checks
            if not layer.inputs:
                layer.inputs = [prev]
            if not layer.output:
                layer.output = self.output.name if k == len(self.layers) - 1 else layer.name
            prev = layer.output

    def producer(self, tensor: str):
        """The layer writing ``tensor`` (None for the input port's tensor)."""
        for layer in self.layers:
            if layer.output == tensor:
                return layer
        return None

    def consumers(self, tensor: str) -> list:
        """The layers reading ``tensor``, in order."""
        return [layer for layer in self.layers if tensor in layer.inputs]


@dataclass
class HostNode:
    """An operator that runs on the host in numpy (see :mod:`onnx2fpga.sim.host`)."""
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict
    name: str = ""
    domain: str = ""
    version: int = 0


@dataclass
class Design:
    """Everything needed to run a compiled model: host head, hardware, host tail.

    ``head`` turns the model inputs into the integers of ``dataflow.input`` (the tensor named
    ``dataflow.input.name``); ``tail`` turns ``dataflow.output`` into the model's outputs.
    ``constants`` holds the float tensors the host nodes read.
    """
    dataflow: Dataflow
    head: list[HostNode]
    tail: list[HostNode]
    constants: dict[str, np.ndarray]
    inputs: list[dict]
    outputs: list[dict]
    metadata: dict = field(default_factory=dict)
