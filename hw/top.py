"""The accelerator top level: the core graph of a dataflow between two AXI4-Stream ports."""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..ir.dataflow import Dataflow
from ..plan.cost import dataflow_cycles
from ..plan.engine import engine_image, engine_program
from ..plan.graph import plan_graph
from ..plan.spram import FLASH_OFFSET, spram_layout, weight_image
from .blocks import int_shape, quiet_if_invalid
from .cmvm import ConstMatVecCore
from .depthwise import DepthwiseCore
from .engine import LayerEngine
from .flashload import WAKE_CYCLES, SpiFlashModel, SpramLoader
from .joins import AddCore, BroadcastCore, ConcatCore
from .lut import LutCore
from .matvec import MatVecCore
from .plumbing import StreamFIFO, WidthConverter
from .reduce import WindowReduceCore
from .requant import RequantCore
from .resize import ReorderCore, ResizeCore
from .slice import SliceCore
from .spram import SpramStore
from .threshold import ThresholdCore
from .window import SlidingWindowCore

__all__ = ["Accelerator", "StreamAccelerator", "stream_signature", "CORES", "make_core",
           "weight_image_of", "make_top"]


class Accelerator(wiring.Component):
    """A streaming accelerator for ``dataflow``: every layer as cores, connected as the
    dataflow graph says.

    The cores and their connections are those of :func:`onnx2fpga.plan.graph.plan_graph`: a
    :class:`~onnx2fpga.ir.DenseLayer` becomes a :class:`~onnx2fpga.hw.matvec.MatVecCore`
    (multiplying, by weight sign or by XNOR and popcount) followed by a
    :class:`~onnx2fpga.hw.requant.RequantCore` or a
    :class:`~onnx2fpga.hw.threshold.ThresholdCore`, whichever is cheaper; a convolution a
    :class:`~onnx2fpga.hw.window.SlidingWindowCore` feeding a matrix-vector or depthwise core;
    a pool a window and a :class:`~onnx2fpga.hw.reduce.WindowReduceCore`; joins and forks
    their own cores. A :class:`~onnx2fpga.hw.plumbing.StreamFIFO` of depth
    ``dataflow.fifo_depths[k]`` follows layer ``k`` (none for depth 0), and
    :class:`~onnx2fpga.hw.plumbing.WidthConverter` stages join cores whose lane counts differ.

    The ports are flat signals named the AXI4-Stream way, so that the emitted Verilog module
    drops into a vendor or LiteX design; the clock and reset are the ``sync`` domain's
    ``clk`` and ``rst`` (active high, synchronous).

    Parameters
    ----------
    dataflow : Dataflow
        ``dataflow.input.lanes`` must equal the first layer's ``in_lanes`` and
        ``dataflow.output.lanes`` the last layer's ``out_lanes``.

    Members
    -------
    s_axis_tdata : ``In(dataflow.input.tdata_width)``
        Input transfer: element ``j`` at bits ``[j*bits, (j+1)*bits)`` (two's complement if the
        input type is signed); the bits above ``lanes*bits`` are ignored. Elements in the
        stream order of the input tensor (``dataflow.input.order``: channels-last for an
        image), ``dataflow.input.beats`` transfers per tensor.
    s_axis_tvalid : ``In(1)``
    s_axis_tready : ``Out(1)``
    s_axis_tlast : ``In(1)``
        Accepted and ignored: tensors are delimited by counting.
    m_axis_tdata : ``Out(dataflow.output.tdata_width)``
        Output transfer, packed as the input; the bits above ``lanes*bits`` are zero.
    m_axis_tvalid : ``Out(1)``
    m_axis_tready : ``In(1)``
    m_axis_tlast : ``Out(1)``
        High on the last transfer of each output tensor (every ``dataflow.output.beats``
        transfers).
    flash_sck, flash_cs_n, flash_copi : ``Out(1)``; flash_cipo : ``In(1)``
        Only when weights live in SPRAM (``dataflow.spram_memories``) and no ``flash_image``
        is given: the SPI flash the weights are loaded from at start-up
        (:class:`~onnx2fpga.hw.flashload.SpramLoader`; :attr:`weight_image` at
        :data:`~onnx2fpga.plan.spram.FLASH_OFFSET`). ``s_axis_tready`` stays low until the
        last weight is written.

    Other parameters
    ----------------
    flash_image : bytes, optional
        For simulation: a :class:`~onnx2fpga.hw.flashload.SpiFlashModel` holding these bytes
        at :data:`~onnx2fpga.plan.spram.FLASH_OFFSET` sits inside the accelerator in place of
        the flash ports (normally :attr:`weight_image`).
    wake_cycles : int
        The loader's wait after waking the flash (see
        :class:`~onnx2fpga.hw.flashload.SpramLoader`).

    Raises
    ------
    TypeError, ValueError
        If the dataflow is malformed (see :func:`~onnx2fpga.plan.graph.plan_graph`) or a layer
        cannot be built (see the cores).
    """

    @quiet_if_invalid
    def __init__(self, dataflow: Dataflow, *, flash_image=None,
                 wake_cycles: int = WAKE_CYCLES):
        self._plan = plan_graph(dataflow)
        self._dataflow = dataflow
        cores = []
        for stage in self._plan.stages:
            core = make_core(stage)
            if core is not None:
                # The accelerator owns its cores: only an unused accelerator deserves the
                # UnusedElaboratable warning, not each of its parts.
                core._MustUse__used = True
            cores.append(core)
        self._cores = cores
        # Weights in SPRAM: the layers' SPRAMs in stage order (plan.spram's layout).
        self._spram_cores = [(stage, core) for stage, core in zip(self._plan.stages, cores)
                             if getattr(core, "w_spram", False)]
        self._slots = spram_layout([(stage.name, core.weight_width, core.weight_depth)
                                    for stage, core in self._spram_cores]) \
            if self._spram_cores else []
        self._flash_image = None if flash_image is None else bytes(flash_image)
        self._wake_cycles = wake_cycles
        members = {
            "s_axis_tdata": In(dataflow.input.tdata_width),
            "s_axis_tvalid": In(1),
            "s_axis_tready": Out(1),
            "s_axis_tlast": In(1),
            "m_axis_tdata": Out(dataflow.output.tdata_width),
            "m_axis_tvalid": Out(1),
            "m_axis_tready": In(1),
            "m_axis_tlast": Out(1),
        }
        if self._slots and self._flash_image is None:
            members.update(flash_sck=Out(1), flash_cs_n=Out(1, init=1), flash_copi=Out(1),
                           flash_cipo=In(1))
        super().__init__(members)

    @property
    def dataflow(self) -> Dataflow:
        return self._dataflow

    @property
    def plan(self):
        """The :class:`~onnx2fpga.plan.graph.Plan` the accelerator is built from."""
        return self._plan

    @property
    def chain(self) -> list:
        """The :class:`~onnx2fpga.plan.graph.Stage` list the accelerator is built from."""
        return list(self._plan.stages)

    @property
    def spram_slots(self) -> list:
        """The :class:`~onnx2fpga.plan.spram.SpramSlot` of each layer whose weights live in
        SPRAM, in stage order (empty if none)."""
        return list(self._slots)

    @property
    def weight_image(self) -> bytes | None:
        """The image the loader reads from flash (:func:`~onnx2fpga.plan.spram.
        weight_image`), or None without weights in SPRAM."""
        if not self._slots:
            return None
        return weight_image(self._slots, [core.weight_words()
                                          for _, core in self._spram_cores])

    @property
    def cycles(self) -> dict:
        """:func:`onnx2fpga.plan.cost.dataflow_cycles` of the dataflow."""
        return dataflow_cycles(self._dataflow)

    def elaborate(self, platform):
        m = Module()
        inp, out = self._dataflow.input, self._dataflow.output

        # Input port -> a stream of the input type.
        in_shape = int_shape(inp.type)
        src = stream.Signature(data.ArrayLayout(in_shape, inp.lanes)).create(path=("s_axis",))
        bits = inp.type.bits
        loaded = self._weight_store(m)
        m.d.comb += [
            src.valid.eq(self.s_axis_tvalid & loaded),
            self.s_axis_tready.eq(src.ready & loaded),
            src.payload.eq(self.s_axis_tdata[:inp.lanes * bits]),
        ]
        nets = {self._plan.input_net: src}

        for stage, core in zip(self._plan.stages, self._cores, strict=True):
            if core is None:                 # "cast": value-preserving wires
                src = nets.pop(stage.inputs[0])
                layout = data.ArrayLayout(int_shape(stage.out_type), stage.out_lanes)
                dst = stream.Signature(layout).create(path=(stage.name,))
                m.d.comb += [
                    dst.valid.eq(src.valid),
                    src.ready.eq(dst.ready),
                ]
                for j in range(stage.out_lanes):
                    # Sign or zero extension by the source element's shape.
                    m.d.comb += dst.payload[j].eq(src.payload[j])
                nets[stage.outputs[0]] = dst
                continue
            m.submodules[stage.name] = core
            if getattr(core, "w_spram", False):
                k = [c for _, c in self._spram_cores].index(core)
                wiring.connect(m, core.w_read, getattr(m.submodules.spram_store, f"read{k}"))
            ins, outs = _core_ports(core)
            for net, port in zip(stage.inputs, ins, strict=True):
                wiring.connect(m, nets.pop(net), port)
            for net, port in zip(stage.outputs, outs, strict=True):
                nets[net] = port
        src = nets.pop(self._plan.output_net)

        # Stream -> output port, counting transfers for tlast.
        # The plan ends in the output type (it adds a cast if needed), so the raw payload is
        # already packed; assignment zero-extends it to the tdata width.
        count = Signal(range(max(out.beats, 2)))
        last = count == out.beats - 1
        m.d.comb += [
            self.m_axis_tvalid.eq(src.valid),
            src.ready.eq(self.m_axis_tready),
            self.m_axis_tdata.eq(src.payload.as_value()),
            self.m_axis_tlast.eq(last),
        ]
        with m.If(self.m_axis_tvalid & self.m_axis_tready):
            m.d.sync += count.eq(0)
            with m.If(~last):
                m.d.sync += count.eq(count + 1)
        return m

    def _weight_store(self, m):
        """The SPRAMs, their loader and its flash (ports or model): 1 without them, else
        the loader's ``done``."""
        if not self._slots:
            return 1
        m.submodules.spram_store = store = SpramStore(self._slots)
        m.submodules.spram_loader = loader = SpramLoader(
            self._slots, offset=FLASH_OFFSET, wake_cycles=self._wake_cycles)
        m.d.comb += [store.wr_spram.eq(loader.wr_spram), store.wr_addr.eq(loader.wr_addr),
                     store.wr_data.eq(loader.wr_data), store.wr_en.eq(loader.wr_en),
                     store.loading.eq(loader.loading)]
        if self._flash_image is None:
            m.d.comb += [self.flash_sck.eq(loader.sck), self.flash_cs_n.eq(loader.cs_n),
                         self.flash_copi.eq(loader.copi), loader.cipo.eq(self.flash_cipo)]
        else:
            m.submodules.flash_model = flash = SpiFlashModel(self._flash_image,
                                                             offset=FLASH_OFFSET)
            m.d.comb += [flash.sck.eq(loader.sck), flash.cs_n.eq(loader.cs_n),
                         flash.copi.eq(loader.copi), loader.cipo.eq(flash.cipo)]
        return loader.done


def stream_signature(port) -> stream.Signature:
    """The ``stream.Signature`` of a :class:`StreamAccelerator` port for ``port`` (a
    :class:`~onnx2fpga.ir.Port`).

    Its payload is a ``data.StructLayout`` of ``data`` (one transfer: a
    ``data.ArrayLayout`` of ``port.lanes`` elements of the port's type, ``signed`` where the
    type is signed) and ``last`` (1 bit: the last transfer of a tensor). ``last`` is there
    even when one transfer carries the whole tensor (``port.beats == 1``), where it is always
    1, so that every design's streams have the same form.
    """
    return stream.Signature(data.StructLayout({
        "data": data.ArrayLayout(int_shape(port.type), port.lanes),
        "last": 1,
    }))


class StreamAccelerator(wiring.Component):
    """The :class:`Accelerator` of ``dataflow`` with ``amaranth.lib.stream`` ports, to
    instantiate inside an Amaranth design and join with ``wiring.connect``.

    It holds the Accelerator (the one description of the hardware, and the module the
    emitted Verilog is made of) as its submodule ``accelerator`` and wires its AXI4-Stream
    signals to the streams: nothing but wires, so timing and throughput are the
    Accelerator's. The streams follow ``amaranth.lib.stream``'s rules (the accelerator's
    ``valid`` never waits for ``ready``; its payload holds until transferred) and expect the
    producer to follow them too.

    Parameters
    ----------
    dataflow : Dataflow

    Members
    -------
    i_stream : ``In(stream_signature(dataflow.input))``
        One transfer per ``lanes`` elements of the input tensor in its stream order
        (``dataflow.input.order``), ``dataflow.input.beats`` transfers per tensor. Tensors
        are delimited by counting: ``payload.last`` is accepted and ignored.
    o_stream : ``Out(stream_signature(dataflow.output))``
        The output tensor the same way; ``payload.last`` is 1 on the last transfer of each
        tensor (on every transfer when ``dataflow.output.beats`` is 1).
    """

    @quiet_if_invalid
    def __init__(self, dataflow: Dataflow):
        self._dataflow = dataflow
        self._accelerator = make_top(dataflow)
        self._accelerator._MustUse__used = True      # owned: only an unused wrapper warns
        super().__init__({"i_stream": In(stream_signature(dataflow.input)),
                          "o_stream": Out(stream_signature(dataflow.output))})

    @property
    def accelerator(self):
        """The :class:`Accelerator` (or, with ``dataflow.engine``, the layer engine)."""
        return self._accelerator

    @property
    def dataflow(self) -> Dataflow:
        return self._dataflow

    def elaborate(self, platform):
        m = Module()
        m.submodules.accelerator = acc = self._accelerator
        out = self.dataflow.output
        m.d.comb += [
            acc.s_axis_tvalid.eq(self.i_stream.valid),
            self.i_stream.ready.eq(acc.s_axis_tready),
            acc.s_axis_tdata.eq(self.i_stream.payload.data.as_value()),
            acc.s_axis_tlast.eq(self.i_stream.payload.last),
            self.o_stream.valid.eq(acc.m_axis_tvalid),
            acc.m_axis_tready.eq(self.o_stream.ready),
            self.o_stream.payload.data.eq(acc.m_axis_tdata[:out.lanes * out.type.bits]),
            self.o_stream.payload.last.eq(acc.m_axis_tlast),
        ]
        return m


def _core_ports(core) -> tuple[list, list]:
    """The input and output stream ports of a core, in the order of its stage's nets."""
    def many(prefix):
        member = getattr(core, prefix, None)
        if member is not None and not hasattr(member, "valid"):
            return list(member)                   # a signature array member
        if member is not None:
            return [member]
        ports, j = [], 0
        while hasattr(core, f"{prefix}_{j}"):
            ports.append(getattr(core, f"{prefix}_{j}"))
            j += 1
        return ports
    if hasattr(core, "i_a"):
        ins = [core.i_a, core.i_b]
    else:
        ins = many("i_stream")
    return ins, many("o_stream")


#: Stage kind -> the core class that builds it (``from_stage``); a cast is wires, no core.
CORES = {
    "matvec": MatVecCore, "requant": RequantCore, "threshold": ThresholdCore,
    "fifo": StreamFIFO, "convert": WidthConverter, "window": SlidingWindowCore,
    "reduce": WindowReduceCore, "depthwise": DepthwiseCore, "add": AddCore,
    "concat": ConcatCore, "broadcast": BroadcastCore, "resize": ResizeCore,
    "reorder": ReorderCore, "lut": LutCore, "slice": SliceCore, "cmvm": ConstMatVecCore,
}


def make_core(stage, *, rom_stand_in: bool = False):
    """The Amaranth core of one :class:`~onnx2fpga.plan.stage.Stage` (None for a cast): the
    ``from_stage`` of its kind's class in :data:`CORES`. ``rom_stand_in``: for the resource
    estimates, a core with a weight ROM (one that has ``weight_rom_shapes``,
    :class:`~onnx2fpga.hw.matvec.MatVecCore`) is built with a stand-in for it."""
    if stage.kind == "cast":
        return None
    try:
        core = CORES[stage.kind]
    except KeyError:
        raise ValueError(f"Unknown stage kind {stage.kind!r}") from None
    if rom_stand_in and hasattr(core, "weight_rom_shapes"):
        return core.from_stage(stage, rom_stand_in=True)
    return core.from_stage(stage)


def make_top(dataflow: Dataflow, *, flash_image=None):
    """The top level of ``dataflow``: its :class:`Accelerator`, or with ``dataflow.engine``
    the :class:`~onnx2fpga.hw.engine.LayerEngine` of its layers (same AXI4-Stream and flash
    ports); ``flash_image`` as they take it."""
    if dataflow.engine:
        return LayerEngine(engine_program(dataflow), weights=dataflow.engine,
                           flash_image=flash_image)
    return Accelerator(dataflow, flash_image=flash_image)


def weight_image_of(dataflow: Dataflow) -> bytes | None:
    """The weight image of ``dataflow``'s layers in SPRAM (:attr:`Accelerator.weight_image`:
    what goes into the flash at :data:`~onnx2fpga.plan.spram.FLASH_OFFSET`), or None when
    ``dataflow.spram_memories`` is empty; with ``dataflow.engine == "spram"`` the engine's
    weight records (:func:`~onnx2fpga.plan.engine.engine_image`)."""
    if dataflow.engine:
        return engine_image(engine_program(dataflow)) if dataflow.engine == "spram" else None
    acc = Accelerator(dataflow)
    acc._MustUse__used = True           # built for its figures, never elaborated
    return acc.weight_image
