"""Cycle figures of the generated hardware, as the cores behave.

Conventions: a *latency* is the difference between the clock cycle of the last output transfer
and the cycle of the first input transfer of one inference, with the input arriving at one
transfer per cycle, ``ready`` high downstream and the cores idle before. *Cycles* (per
inference) is the steady-state initiation interval: the number of cycles between the starts of
consecutive inferences when inputs come as fast as the cores take them and the output never
stalls.

Every figure is derived from the stage list of :func:`onnx2fpga.plan.graph.plan_graph`, the
same list the hardware is built from. Per core:

- :class:`~onnx2fpga.hw.matvec.MatVecCore`: ``folds = in_features // simd``,
  ``groups = out_features // pe``; ``folds * groups`` cycles per vector; one vector:
  latency ``folds + folds * groups + matvec_stages(simd)`` (computing starts the cycle after
  the last input transfer; one (group, fold) step per cycle; memory read, operand registers,
  multiply, the adder tree's stages and the accumulator add ``1 + matvec_stages(simd)``). A
  convolution feeds it one vector per output pixel.
- :class:`~onnx2fpga.hw.requant.RequantCore` with ``n`` stages: one transfer per cycle; an
  element leaves ``2 + 5 * n`` cycles after it enters.
- :class:`~onnx2fpga.hw.threshold.ThresholdCore`: one transfer per cycle; an element leaves
  ``1 + sum`` of its stages' latencies after it enters: 2 for a stage of at most 15
  thresholds (parallel comparators), ``max(1, n.bit_length())`` for ``n`` thresholds
  searched in binary (:func:`threshold_stage_latency`).
- :class:`~onnx2fpga.hw.matvec.MatVecCore` computes with multipliers, by the sign of ±1
  weights or by XNOR and popcount (bipolar weights and inputs): the same pipeline and the
  same figures in all three cases.
- :class:`~onnx2fpga.hw.plumbing.StreamFIFO`: 1 cycle through (depth up to 4), 2 (deeper).
- :class:`~onnx2fpga.hw.plumbing.WidthConverter`: gathering ``k`` transfers: 1 cycle after the
  last; splitting into ``k``: the last piece ``k`` cycles after the input transfer.
- :class:`~onnx2fpga.hw.window.SlidingWindowCore`: the exact row-level model of
  :class:`~onnx2fpga.plan.window.WindowGeometry`.
- :class:`~onnx2fpga.hw.reduce.WindowReduceCore`: one input transfer per cycle; a group's
  last output 2 cycles after its last input.

The latency follows every transfer of one inference (:func:`plan_traces`): each core's
:meth:`~onnx2fpga.plan.stage.CoreKind.trace` turns the cycles of its input transfers into
those of its output transfers, so a core fed at the pace of a slower one before it starts its
work when the data it needs has come at that pace (a window's rows, a matrix unit's vectors),
not when it would have come at one transfer per cycle. Exact for dense layers; with images
a model whose traces assume the output is never stalled (a core held up by a slower one
behind it is not delayed further; ``benchmarks/latency_model.py`` compares it with the
RTL). The first and last transfer of every net alone (:func:`plan_timing`,
:func:`stage_timing`: start-up and drain times, no stream carrying more than one transfer
per cycle) give each layer's latency on its own.
"""

from __future__ import annotations

import numpy as np

from ..ir.dataflow import Dataflow
from .builder import Plan
from .cores import core_kind
from .graph import layer_stages, plan_graph
from .layers import kind_of
from .stage import Stage

__all__ = [
    "stage_cycles", "stage_timing", "layer_cycles", "layer_latency", "dataflow_cycles",
    "plan_timing", "plan_traces", "layer_need", "edge_fifo_depths",
]


def stage_cycles(stage: Stage) -> int:
    """Steady-state cycles per inference of one core (at least its input and output
    transfers): its kind's :meth:`~onnx2fpga.plan.stage.CoreKind.cycles`."""
    return core_kind(stage).cycles(stage)


def stage_timing(stage: Stage, first: int, last: int) -> tuple[int, int]:
    """Cycles of the first and last output transfer of ``stage`` given those of its
    (latest) input: its kind's model, then the rules every core follows."""
    kind = core_kind(stage)
    first_out, last_out = kind.timing(stage, first, last)
    # A stream carries at most one transfer per cycle, and no core finishes an inference
    # faster than its cycles per inference from its first input.
    if kind.paced:
        last_out = max(last_out, first + kind.cycles(stage))
    return first_out, max(last_out, first_out + stage.out_beats - 1)


def plan_timing(plan: Plan, in_beats: int) -> dict:
    """First and last transfer cycle of every net of ``plan`` for one inference whose input
    arrives at one transfer per cycle from cycle 0."""
    timing = {plan.input_net: (0, in_beats - 1)}
    for stage in plan.stages:
        first, last = core_kind(stage).inputs_timing(stage, [timing[n] for n in stage.inputs])
        out = stage_timing(stage, first, last)
        for n in stage.outputs:
            timing[n] = out
    return timing


def plan_traces(plan: Plan, in_beats: int, arrival=None) -> dict:
    """Cycle of every transfer of every net of ``plan`` for one inference, the cores idle
    before and the output never stalled: each core's
    :meth:`~onnx2fpga.plan.stage.CoreKind.trace` applied in stage order, from the input's
    ``arrival`` (one transfer per cycle from cycle 0 by default)."""
    if arrival is None:
        arrival = np.arange(in_beats, dtype=np.int64)
    traces = {plan.input_net: np.asarray(arrival, dtype=np.int64)}
    for stage in plan.stages:
        out = core_kind(stage).trace(stage, [traces[n] for n in stage.inputs])
        for n in stage.outputs:
            traces[n] = out
    return traces


def layer_cycles(layer) -> int:
    """Steady-state cycles per inference of ``layer``'s cores on their own: the slowest core
    (``(in_features // simd) * (out_features // pe)`` for a DenseLayer, whose
    requantization runs alongside; ``channels // lanes`` for a RequantLayer)."""
    stages = [s for s in layer_stages(layer) if not core_kind(s).plumbing]
    return max([stage_cycles(s) for s in stages] + [layer.in_size // layer.in_lanes])


def layer_latency(layer, *, ecp5_dsp_registers: bool = False) -> int:
    """Cycles from the first input transfer to the last output transfer of one inference
    through ``layer``'s cores alone, fed at one transfer per cycle.

    DenseLayer with ``folds = in_features // simd``, ``groups = out_features // pe`` and
    ``n = len(requant)``: ``folds + folds * groups + d`` (``d = matvec_stages(simd)``, one
    more with ``ecp5_dsp_registers`` for products on DSPs, as the Dataflow's)
    without requantization; with it,
    plus ``2 + 5 * n``, plus, when the requantization core has ``d < pe`` lanes (see
    :func:`onnx2fpga.plan.graph.requant_lanes`), ``pe // d`` (serializing) ``+ 1`` (gathering).
    RequantLayer: ``channels // lanes - 1 + 2 + 5 * n``. Stages computed by a threshold core
    (:func:`onnx2fpga.plan.graph.stage_cores`) count :func:`threshold_latency` instead of
    ``2 + 5 * n``.
    """
    first, last = 0, layer.in_size // layer.in_lanes - 1
    for stage in layer_stages(layer, ecp5_dsp_registers=ecp5_dsp_registers):
        first, last = stage_timing(stage, first, last)
    return last


def dataflow_cycles(dataflow: Dataflow, plan: Plan | None = None) -> dict:
    """Cycle figures of the whole accelerator, for the manifest.

    Returns
    -------
    dict
        ``cycles_per_inference``: steady-state cycles between consecutive inferences, the
        maximum over every core's :func:`stage_cycles` and the input and output port transfer
        counts (``beats``). ``latency_cycles``: cycles from the first ``s_axis`` transfer of
        an input tensor to the last ``m_axis`` transfer (``tlast``) of its output tensor, for
        an idle accelerator fed at one transfer per cycle with ``m_axis_tready`` high, from
        :func:`plan_traces` (exact for dense layers, a model with images; see the module
        docstring). ``layers``: per
        layer, ``name``, ``cycles`` (the slowest of its cores in the accelerator),
        ``latency`` (on its own, :func:`layer_latency`) and ``bottleneck`` (the layer whose
        cycles set the rate).

    Raises
    ------
    TypeError, ValueError
        As :func:`onnx2fpga.plan.graph.plan_graph`.
    """
    plan = plan or plan_graph(dataflow)
    by_name = {s.name: s for s in plan.stages}
    layers = []
    for layer in dataflow.layers:
        names = plan.layer_stages.get(layer.name, [])
        # Lane converters, casts and FIFOs on a layer's edges move data at the rate of its
        # neighbours; the layer's own cores set its figure.
        cyc = max([stage_cycles(by_name[n]) for n in names
                   if not core_kind(by_name[n]).plumbing
                   and by_name[n].kind != "reorder"], default=0)
        edge = max([stage_cycles(by_name[n]) for n in names
                    if by_name[n].kind == "reorder"], default=0)
        entry = {"name": layer.name, "cycles": int(cyc),
                 "latency": int(layer_latency(
                     layer, ecp5_dsp_registers=getattr(dataflow, "ecp5_dsp_registers", False)))
                 if names else 0}
        if edge:
            entry["reorder_cycles"] = int(edge)     # reordering its input: own core, own rate
        layers.append(entry)
    cycles = max([dataflow.input.beats, dataflow.output.beats]
                 + [stage_cycles(s) for s in plan.stages])
    traces = plan_traces(plan, dataflow.input.beats)
    top = max(max(ly["cycles"], ly.get("reorder_cycles", 0)) for ly in layers)
    for ly in layers:
        ly["bottleneck"] = max(ly["cycles"], ly.get("reorder_cycles", 0)) == top
    return {
        "cycles_per_inference": int(cycles),
        "latency_cycles": int(traces[plan.output_net][-1]),
        "layers": layers,
    }


# ---------------------------------------------------------------------------------------------
# Skip-branch FIFOs: how far one branch of a fork can run ahead of the other


def layer_need(layer) -> list[np.ndarray]:
    """For each input of ``layer``: ``need[k]``, the input elements (in stream order) the
    layer must have taken before its output element ``k`` (stream order) can leave (its
    kind's :meth:`~onnx2fpga.plan.layers.base.LayerKind.need`)."""
    return kind_of(layer).need(layer)


def edge_fifo_depths(dataflow: Dataflow, plan: Plan | None = None, *,
                     margin: float = 0.1, extra: int = 8) -> dict:
    """FIFO depths for the branches of every fork that meet again in a join, computed from
    the layers' need functions (:func:`layer_need`), not by simulation.

    A fork hands every element to all its branches at once. When branch ``a`` is short (a
    skip connection) and branch ``b`` must take ``need_b(k)`` elements before the join's
    ``k``-th output can form, ``a`` must hold ``need_b(k) - need_a(k)`` elements meanwhile,
    or the fork stops and nothing moves again. For full rate it must also hold what arrives
    while ``b`` works: a windowed layer (convolution, pool, pad, resize) emits an output row
    over the time its input takes to bring ``stride`` rows, so each one on ``b`` adds that
    many input rows (scaled to the fork's elements). The edge FIFO of ``a`` gets the largest
    sum, in transfers of the fork's stream, plus ``margin`` and ``extra`` transfers.

    Measured on the residual block of the shared models (two 3x3 convolutions on the long
    branch, 49x49x14): the deadlock bound alone ran at 321,017 cycles per inference instead of
    201,684; with the rows in flight added, at 201,684.

    Returns
    -------
    dict
        ``"tensor->layer"`` -> depth, for the edges that need a FIFO.
    """
    plan = plan or plan_graph(dataflow)
    consumers: dict[str, list] = {}
    for layer in dataflow.layers:
        for t in layer.inputs:
            consumers.setdefault(t, []).append(layer)
    depths: dict[str, int] = {}
    sizes = {dataflow.input.name: dataflow.input.size}
    sizes.update({layer.output: layer.out_size for layer in dataflow.layers})
    for fork, readers in consumers.items():
        if len(readers) < 2:
            continue
        # need[e][tensor]: elements of `fork` taken through edge e before each element of
        # `tensor` can leave (tensors reachable from the fork only through edge e).
        reach, delays = [], []
        for first in readers:
            table = {fork: np.arange(1, sizes[fork] + 1, dtype=np.int64)}
            delay = {fork: 0.0}
            order = [ly for ly in dataflow.layers]
            start = order.index(first)
            for layer in order[start:]:
                known = [t for t in layer.inputs if t in table]
                if not known or (layer is not first and fork in layer.inputs):
                    continue
                needs = layer_need(layer)
                parts = [table[t][np.maximum(needs[j], 1) - 1]
                         for j, t in enumerate(layer.inputs) if t in table]
                table[layer.output] = np.maximum.reduce(parts)
                delay[layer.output] = max(delay[t] for t in known) + \
                    kind_of(layer).row_delay(layer) * sizes[fork] / layer.in_size
            table.pop(fork)
            reach.append(table)
            delays.append(delay)
        # A join: a layer reading tensors reached through two different edges.
        for join in dataflow.layers:
            needs = layer_need(join)
            via, late = {}, {}
            for j, t in enumerate(join.inputs):
                for e, table in enumerate(reach):
                    src = table.get(t)
                    if t == fork and join is readers[e]:
                        src = np.arange(1, sizes[fork] + 1, dtype=np.int64)
                    if src is not None:
                        f = src[np.maximum(needs[j], 1) - 1]
                        via[e] = f if e not in via else np.maximum(via[e], f)
                        late[e] = max(late.get(e, 0.0), delays[e].get(t, 0.0))
            if len(via) < 2:
                continue
            for e, f in via.items():
                ahead = max(int((g - f).max()) + int(np.ceil(late[o]))
                            for o, g in via.items() if o != e)
                if ahead <= 0:
                    continue
                lanes = plan.nets[plan.tensor_nets[fork]][1]
                depth = -(-ahead // lanes)
                depth += int(depth * margin) + extra
                key = f"{fork}->{readers[e].name}"
                depths[key] = max(depths.get(key, 0), depth)
    return depths
