"""The accelerator top level: the layer chain of a dataflow between two AXI4-Stream ports."""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..dataflow import Dataflow
from .chain import plan_chain
from .cores import (
    MatVecCore,
    RequantCore,
    StreamFIFO,
    WidthConverter,
    _quiet_if_invalid,
    int_shape,
)
from .cost import dataflow_cycles

__all__ = ["Accelerator"]


class Accelerator(wiring.Component):
    """A streaming accelerator for ``dataflow``: every layer as cores, chained.

    A :class:`~onnx2fpga.dataflow.DenseLayer` becomes a
    :class:`~onnx2fpga.hw.cores.MatVecCore` followed by a
    :class:`~onnx2fpga.hw.cores.RequantCore` for its ``requant`` stages; a
    :class:`~onnx2fpga.dataflow.RequantLayer` a RequantCore. A
    :class:`~onnx2fpga.hw.cores.StreamFIFO` of depth ``dataflow.fifo_depths[k]`` follows layer
    ``k`` (none for depth 0), and a :class:`~onnx2fpga.hw.cores.WidthConverter` joins layers
    whose lane counts differ (see :func:`onnx2fpga.hw.chain.plan_chain`).

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
        input type is signed); the bits above ``lanes*bits`` are ignored. Elements in the flat
        C order of the input tensor, ``dataflow.input.beats`` transfers per tensor.
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

    Raises
    ------
    TypeError, ValueError
        If the dataflow is malformed (see :func:`~onnx2fpga.hw.chain.plan_chain`) or a layer
        cannot be built (see the cores).
    """

    @_quiet_if_invalid
    def __init__(self, dataflow: Dataflow):
        self._chain = plan_chain(dataflow)
        self._dataflow = dataflow
        cores = []
        for stage in self._chain:
            if stage.kind == "matvec":
                core = MatVecCore(stage.layer)
            elif stage.kind == "requant":
                core = RequantCore(stage.params["stages"], stage.params["channels"],
                                   stage.in_lanes, stage.in_type)
            elif stage.kind == "fifo":
                core = StreamFIFO(stage.out_type, stage.out_lanes, stage.params["depth"])
            elif stage.kind == "convert":
                core = WidthConverter(stage.out_type, stage.in_lanes, stage.out_lanes)
            else:
                core = None                  # "cast": wires, made in elaborate()
            if core is not None:
                # The accelerator owns its cores: only an unused accelerator deserves the
                # UnusedElaboratable warning, not each of its parts.
                core._MustUse__used = True
            cores.append(core)
        self._cores = cores
        super().__init__({
            "s_axis_tdata": In(dataflow.input.tdata_width),
            "s_axis_tvalid": In(1),
            "s_axis_tready": Out(1),
            "s_axis_tlast": In(1),
            "m_axis_tdata": Out(dataflow.output.tdata_width),
            "m_axis_tvalid": Out(1),
            "m_axis_tready": In(1),
            "m_axis_tlast": Out(1),
        })

    @property
    def dataflow(self) -> Dataflow:
        return self._dataflow

    @property
    def chain(self) -> list:
        """The :class:`~onnx2fpga.hw.chain.ChainStage` list the accelerator is built from."""
        return list(self._chain)

    @property
    def cycles(self) -> dict:
        """:func:`onnx2fpga.hw.cost.dataflow_cycles` of the dataflow."""
        return dataflow_cycles(self._dataflow)

    def elaborate(self, platform):
        m = Module()
        inp, out = self._dataflow.input, self._dataflow.output

        # Input port -> a stream of the input type.
        in_shape = int_shape(inp.type)
        src = stream.Signature(data.ArrayLayout(in_shape, inp.lanes)).create(path=("s_axis",))
        bits = inp.type.bits
        m.d.comb += [
            src.valid.eq(self.s_axis_tvalid),
            self.s_axis_tready.eq(src.ready),
            src.payload.eq(self.s_axis_tdata[:inp.lanes * bits]),
        ]

        for stage, core in zip(self._chain, self._cores, strict=True):
            if core is None:
                layout = data.ArrayLayout(int_shape(stage.out_type), stage.out_lanes)
                dst = stream.Signature(layout).create(path=(stage.name,))
                m.d.comb += [
                    dst.valid.eq(src.valid),
                    src.ready.eq(dst.ready),
                ]
                for j in range(stage.out_lanes):
                    # Value-preserving: sign or zero extension by the source element's shape.
                    m.d.comb += dst.payload[j].eq(src.payload[j])
                src = dst
                continue
            m.submodules[stage.name] = core
            wiring.connect(m, src, core.i_stream)
            src = core.o_stream

        # Stream -> output port, counting transfers for tlast.
        # The chain ends in the output type (plan_chain adds a cast if needed), so the raw
        # payload is already packed; assignment zero-extends it to the tdata width.
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
