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

For a single vector through dense layers the latency is exact; with images it is a model: the
first output of a stage follows the first input after the stage's start-up (the rows a
window needs, one vector of a matrix unit), the last output follows the last input by the
stage's drain time, and no stream carries more than one transfer per cycle.
"""

from __future__ import annotations

import numpy as np

from ..ir.dataflow import Dataflow
from .builder import Plan, Stage
from .graph import layer_stages, plan_graph
from .layers import kind_of
from .thresholds import threshold_latency

__all__ = [
    "ADDER_LEVELS_PER_STAGE", "matvec_tree_stages", "matvec_stages", "matvec_latency",
    "requant_latency", "fifo_latency", "stage_cycles", "layer_cycles", "layer_latency",
    "dataflow_cycles", "plan_timing", "layer_need", "edge_fifo_depths",
]


_PLUMBING = ("convert", "cast", "fifo")


#: Adder levels between two registers of :class:`~onnx2fpga.hw.matvec.MatVecCore`'s adder tree:
#: two levels of 16..24-bit carry chains and their routing fit a 10 ns cycle on ECP5.
ADDER_LEVELS_PER_STAGE = 2


def matvec_tree_stages(simd: int) -> int:
    """Register stages of the adder tree of a :class:`~onnx2fpga.hw.matvec.MatVecCore` that
    sums ``simd`` products: ``ceil(log2(simd))`` adder levels, at most
    :data:`ADDER_LEVELS_PER_STAGE` per stage, at least one stage."""
    levels = (int(simd) - 1).bit_length()
    return max(1, -(-levels // ADDER_LEVELS_PER_STAGE))


def matvec_stages(simd: int) -> int:
    """Pipeline registers of a :class:`~onnx2fpga.hw.matvec.MatVecCore` between its memories
    and its accumulator: memory data, operand registers, products and the adder tree's
    :func:`matvec_tree_stages` (4 for ``simd <= 4``, 5 up to 16, 6 up to 64)."""
    return 3 + matvec_tree_stages(simd)


def matvec_latency(folds: int, groups: int, simd: int) -> int:
    """Latency of a :class:`~onnx2fpga.hw.matvec.MatVecCore` with ``folds`` input transfers and
    ``groups`` output transfers per vector and ``simd`` products per output and step:
    ``folds + folds * groups + matvec_stages(simd)``."""
    return folds + folds * groups + matvec_stages(simd)


def requant_latency(stages: int) -> int:
    """Latency of a :class:`~onnx2fpga.hw.requant.RequantCore` of ``stages`` stages
    (``2 + 5 * stages``; 0 for no stage, when no core is built)."""
    return 2 + 5 * stages if stages else 0


# Resource estimates (LUT4 per lane) that decide between requantization and thresholds.
# A LUT-built multiplier costs about 3 LUT4 per partial-product bit (DESIGN.md: 206 LUT4 for
# 8x8, 60 for 4x4 on iCE40); a constant multiplier one adder per set bit after the first; a
# comparator or an adder one LUT4 per bit (with the carry chain); a 2:1 multiplexer one per
# bit; a bit of a per-channel table 1/16 of a LUT4 (a LUT4 holds 16 bits; yosys 0.70 leaves
# these small ROMs in LUTs). DSP blocks are not counted: on a device with spare multipliers
# the requantization is cheaper than this (benchmarks/lowbit_resources.py measures both).


def fifo_latency(depth: int) -> int:
    """Cycles from a write into a :class:`~onnx2fpga.hw.plumbing.StreamFIFO` of ``depth`` to the
    earliest read (0 for depth 0, which is a plain connection)."""
    if depth <= 0:
        return 0
    return 1 if depth <= 4 else 2


def _geometry(stage: Stage):
    from .window import WindowGeometry
    p = stage.params
    return WindowGeometry.make(p["channels"], p["height"], p["width"], p["kernel"],
                               p["stride"], p["dilation"], p["pads"], stage.in_lanes)


def _matvec_figures(stage: Stage) -> tuple[int, int, int]:
    """``(folds, groups, vectors)`` of a matvec stage."""
    layer = stage.params["layer"]
    folds = layer.in_features // layer.simd
    groups = layer.out_features // layer.pe
    return folds, groups, stage.size // layer.out_features


def stage_cycles(stage: Stage) -> int:
    """Steady-state cycles per inference of one core (at least its input and output
    transfers)."""
    beats = max(stage.in_beats, stage.out_beats)
    if stage.kind == "matvec":
        folds, groups, vectors = _matvec_figures(stage)
        return max(beats, vectors * folds * groups)
    if stage.kind == "window":
        return max(beats, _geometry(stage).cycles)
    if stage.kind == "resize":
        from .resize import resize_cycles
        p = stage.params
        return resize_cycles(p["channels"], p["height"], p["width"], p["rows"], p["cols"],
                             stage.in_lanes)
    if stage.kind == "reorder":
        return stage.out_beats
    return beats


def _stage_timing(stage: Stage, first: int, last: int) -> tuple[int, int]:
    """Cycles of the first and last output transfer of ``stage`` given those of its
    (latest) input."""
    kind = stage.kind
    if kind == "matvec":
        folds, groups, vectors = _matvec_figures(stage)
        d = matvec_stages(stage.params["layer"].simd)
        if vectors == 1:
            first_out = last + folds + 1 + d
        else:
            first_out = first + 2 * folds + d
        last_out = last + folds * groups + 1 + d
    elif kind == "requant":
        d = requant_latency(len(stage.params["stages"]))
        first_out, last_out = first + d, last + d
    elif kind == "threshold":
        d = threshold_latency(stage.params["stages"], stage.params["channels"],
                              stage.in_lanes)
        first_out, last_out = first + d, last + d
    elif kind == "fifo":
        d = fifo_latency(stage.params["depth"])
        first_out, last_out = first + d, last + d
    elif kind == "convert":
        if stage.out_lanes > stage.in_lanes:
            k = stage.out_lanes // stage.in_lanes
            first_out, last_out = first + k, last + 1
        elif stage.out_lanes < stage.in_lanes:
            k = stage.in_lanes // stage.out_lanes
            first_out, last_out = first + 1, last + k
        else:
            first_out, last_out = first, last
    elif kind == "window":
        g = _geometry(stage)
        rows0 = g.row_span(0)[1]
        first_out = first + rows0 * g.width * g.folds + 1
        # After the last input row, only the output rows that read it remain.
        last_rows = sum(1 for oh in range(g.out_height) if g.row_span(oh)[1] == g.height)
        last_out = last + max(last_rows, 1) * g.row_beats + 1
    elif kind in ("reduce", "depthwise"):
        window, folds = stage.params["window"], stage.params["channels"] // stage.in_lanes
        extra = 0 if kind == "reduce" else 1
        first_out = first + (window - 1) * folds + 2 + extra
        last_out = last + 2 + extra
    elif kind in ("broadcast", "concat"):
        first_out, last_out = first + 1, last + 1
    elif kind == "add":
        from .joins import ADD_LATENCY
        first_out, last_out = first + ADD_LATENCY, last + ADD_LATENCY
    elif kind == "resize":
        from .resize import resize_latency
        p = stage.params
        row = p["width"] * p["channels"] // stage.in_lanes
        first_out = first + (int(p["rows"][0]) + 1) * row + 1
        latency = resize_latency(p["channels"], p["height"], p["width"], p["rows"], p["cols"],
                                 stage.in_lanes)
        last_out = last + latency - (stage.in_beats - 1)
    elif kind == "reorder":
        first_out = last + 2
        last_out = first_out
    else:                                   # "cast": wires
        first_out, last_out = first, last
    # A stream carries at most one transfer per cycle, and no core finishes an inference
    # faster than its cycles per inference from its first input.
    if kind not in ("cast", "convert", "fifo", "reorder"):
        last_out = max(last_out, first + stage_cycles(stage))
    return first_out, max(last_out, first_out + stage.out_beats - 1)


def plan_timing(plan: Plan, in_beats: int) -> dict:
    """First and last transfer cycle of every net of ``plan`` for one inference whose input
    arrives at one transfer per cycle from cycle 0."""
    timing = {plan.input_net: (0, in_beats - 1)}
    for stage in plan.stages:
        ins = [timing[n] for n in stage.inputs]
        first = max(t[0] for t in ins)
        last = max(t[1] for t in ins)
        if stage.kind == "concat":
            first = ins[0][0]
        out = _stage_timing(stage, first, last)
        for n in stage.outputs:
            timing[n] = out
    return timing


def layer_cycles(layer) -> int:
    """Steady-state cycles per inference of ``layer``'s cores on their own: the slowest core
    (``(in_features // simd) * (out_features // pe)`` for a DenseLayer, whose
    requantization runs alongside; ``channels // lanes`` for a RequantLayer)."""
    stages = [s for s in layer_stages(layer) if s.kind not in _PLUMBING]
    return max([stage_cycles(s) for s in stages] + [layer.in_size // layer.in_lanes])


def layer_latency(layer) -> int:
    """Cycles from the first input transfer to the last output transfer of one inference
    through ``layer``'s cores alone, fed at one transfer per cycle.

    DenseLayer with ``folds = in_features // simd``, ``groups = out_features // pe`` and
    ``n = len(requant)``: ``folds + folds * groups + d`` (``d = matvec_stages(simd)``)
    without requantization; with it,
    plus ``2 + 5 * n``, plus, when the requantization core has ``d < pe`` lanes (see
    :func:`onnx2fpga.plan.graph.requant_lanes`), ``pe // d`` (serializing) ``+ 1`` (gathering).
    RequantLayer: ``channels // lanes - 1 + 2 + 5 * n``. Stages computed by a threshold core
    (:func:`onnx2fpga.plan.graph.stage_cores`) count :func:`threshold_latency` instead of
    ``2 + 5 * n``.
    """
    first, last = 0, layer.in_size // layer.in_lanes - 1
    for stage in layer_stages(layer):
        first, last = _stage_timing(stage, first, last)
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
        an idle accelerator fed at one transfer per cycle with ``m_axis_tready`` high (exact
        for dense layers, a model with images; see the module docstring). ``layers``: per
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
                   if by_name[n].kind not in _PLUMBING + ("reorder",)], default=0)
        edge = max([stage_cycles(by_name[n]) for n in names
                    if by_name[n].kind == "reorder"], default=0)
        entry = {"name": layer.name, "cycles": int(cyc),
                 "latency": int(layer_latency(layer)) if names else 0}
        if edge:
            entry["reorder_cycles"] = int(edge)     # reordering its input: own core, own rate
        layers.append(entry)
    cycles = max([dataflow.input.beats, dataflow.output.beats]
                 + [stage_cycles(s) for s in plan.stages])
    timing = plan_timing(plan, dataflow.input.beats)
    top = max(max(ly["cycles"], ly.get("reorder_cycles", 0)) for ly in layers)
    for ly in layers:
        ly["bottleneck"] = max(ly["cycles"], ly.get("reorder_cycles", 0)) == top
    return {
        "cycles_per_inference": int(cycles),
        "latency_cycles": int(timing[plan.output_net][1]),
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
