"""Folding: choose each layer's parallelism, the ports' lane counts and the FIFO depths.

Every layer offers a set of foldings, each with its steady-state cycles per inference and its
cost in multiply lanes (``simd * pe`` of a matrix-vector unit, the lanes of a depthwise or an
elementwise multiplier). The pipeline runs at the rate of its slowest layer, so the plan is
the smallest cycle target for which every layer has a folding that meets it and the cheapest
such foldings together fit ``max_lanes``; each layer then takes its cheapest folding for that
target (fewest lanes, then the narrowest streams). Lane counts of neighbours need not divide
each other: the planner joins them with width converters.

FIFO depths: after every layer, what the cycle model says its consumer leaves in the queue
(:func:`onnx2fpga.plan.fifos.fifo_depths`: the producer's output trace against the cycles the
consumer takes its input, two inferences back to back), at least 2, so that layers of
different paces do not throttle each other; ``fifo_depth`` sets one depth for all instead. The
branches of a fork that meet again in a join get at least the depth
:func:`onnx2fpga.plan.cost.edge_fifo_depths` computes from the layers' cycle behaviour, so
that the join can never deadlock.
"""

from __future__ import annotations

from bisect import bisect_right
from functools import cache

from ..errors import OptionError, SizeError
from ..ir.dataflow import Dataflow
from ..ir.layers import (
    MULTIPLIERS,
    product_mapping,
)
from .cmvm import adders_lut_floor
from .cost import dataflow_cycles, edge_fifo_depths, stage_cycles
from .fifos import MIN_DEPTH, fifo_depths
from .graph import plan_graph, tensor_orders
from .layers import at_full_folding, kind_of
from .optimize import check_optimize, shorten_latency

__all__ = ["fold", "layer_options", "width"]


def layer_options(layer) -> list[tuple[int, int, dict]]:
    """The foldings of ``layer``: ``(cycles, cost, params)``, where ``params`` are the
    attributes to set (``simd``/``pe``/``lanes``) and ``cost`` counts multiply lanes
    (its kind's :meth:`~onnx2fpga.plan.layers.base.LayerKind.options`). The cheapest first,
    then the fewest output channels in parallel (each ``pe`` is an activation lane: a
    requantization or a row of thresholds), then the narrowest streams (:func:`width`), then
    the fastest: the first folding that meets a cycle target is the one to take, so that a
    layer with no multipliers (a pool, a concat, a pad, a resize, a slice) takes the fewest
    lanes that meet it."""
    opts = kind_of(layer).options(layer)
    return sorted(opts, key=lambda o: (o[1], o[2].get("pe", 0), width(o[2]), o[0],
                                       sorted(o[2].items())))


def width(params: dict) -> int:
    """The streams' width of a folding: its ``lanes``, ``simd`` and ``pe`` added up. Lanes
    that carry no multiplier still cost logic (a window's line buffers and multiplexers, a
    pool's comparators or adders, a width converter before and after): among foldings with
    the same multiply lanes the narrowest is the cheapest."""
    return sum(params.values())


def _choose(options, target):
    for cyc, cost, params in options:
        if cyc <= target:
            return cost, params
    return None


#: Weights of the layers at their whole-matrix folding beyond which :func:`fold` does not try
#: a plan for their adder graphs (the graphs of a larger plan take minutes to plan).
ADDERS_SEARCH_WEIGHTS = 1 << 16


def _whole_matrix_targets(layers, targets, picks, chosen_target, lut_budget=None) -> list:
    """The targets below ``chosen_target``, fastest first, that are the slowest with their
    set of layers at the whole-matrix folding (:meth:`LayerKind.full_folding
    <onnx2fpga.plan.layers.base.LayerKind.full_folding>`), a set with more layers than at
    ``chosen_target`` whose weights stay within :data:`ADDERS_SEARCH_WEIGHTS` and whose
    adder graphs may fit ``lut_budget`` LUTs (:func:`~onnx2fpga.plan.cmvm.adders_lut_floor`).
    """
    @cache
    def whole(t):
        p = picks(t)
        if p is None:
            return None
        out = [ly for ly, (_, params) in zip(layers, p) if at_full_folding(ly, params)]
        floor = sum(adders_lut_floor(getattr(ly, "matrix", ly.weight), ly.in_type.bits)
                    for ly in out)
        if lut_budget is not None and floor > lut_budget:
            return None
        return frozenset(ly.name for ly in out), sum(int(ly.weight.size) for ly in out)

    base = whole(chosen_target)
    below = [t for t in targets if t < chosen_target]
    out = []
    for i, t in enumerate(below):
        w = whole(t)
        if w is None or base is None or not (w[0] - base[0]) or w[1] > ADDERS_SEARCH_WEIGHTS:
            continue
        if i + 1 < len(below) and whole(below[i + 1]) == w:
            continue                       # a slower target has the same layers whole
        out.append(t)
    return out


def _apply(layer, params: dict) -> None:
    for key, value in params.items():
        setattr(layer, key, value)


def fold(dataflow: Dataflow, *, max_lanes: int | None = 8, overrides: dict | None = None,
         fifo_depth: int | None = None, fits=None, target_cycles: int | None = None,
         progress=None, optimize: str = "throughput", lut_budget: int | None = None
         ) -> Dataflow:
    """Set the parallelism of every layer, the ports' lanes and orders and the FIFO depths
    (in place; also returned).

    Without ``target_cycles`` the plan is the fastest one (fewest cycles per inference)
    whose multiply lanes fit ``max_lanes`` and that ``fits``; with it, the cheapest one that
    takes at most ``target_cycles`` cycles per inference. Either way every layer takes its
    cheapest folding for the chosen rate, so the pipeline is balanced.

    Parameters
    ----------
    max_lanes : int or None
        Budget of multiply lanes (sum of ``simd * pe`` and elementwise lanes); ``None``: no
        budget besides ``fits``.
    overrides : dict, optional
        Maps a layer name to any of ``{"simd": s, "pe": p, "lanes": l, "multipliers": m}``
        (``m`` one of :data:`~onnx2fpga.ir.MULTIPLIERS`); wins over the plan.
    fifo_depth : int, optional
        Transfers of the FIFO after every layer; by default each its own, from the cycle
        model (:func:`onnx2fpga.plan.fifos.fifo_depths`).
    fits : callable, optional
        ``fits(dataflow) -> None or str``, called on a completely folded dataflow: ``None``
        if the design fits the device, otherwise why not (``"dsp 160 > 156"``). Assumed to
        fail less often the fewer lanes a plan takes. It may set layers' ``multipliers`` to
        ``"lut"`` (every layer starts at ``"dsp"`` unless overridden) and fill
        ``dataflow.logic_memories``, ``dataflow.spram_memories`` and
        ``dataflow.block_memories`` (all start empty) to
        make a plan fit; the chosen plan keeps what it set.
    target_cycles : int, optional
        Cycles per inference the design must reach.
    progress : callable, optional
        ``progress(line)`` is told every plan ``fits`` is asked about, and its answer.
    optimize : str
        ``"throughput"`` (the balanced plan above) or ``"latency"``: then the budget left at
        the chosen rate (``max_lanes``, ``fits``; none without either) goes to faster foldings
        of layers while the latency shrinks (:mod:`onnx2fpga.plan.optimize`).
    lut_budget : int, optional
        With ``fits``: the device's LUTs. Past the fastest plan the halving and bisection
        find, the faster plans at which more layers take their whole matrix per cycle are
        tried too (``fits`` may make those layers adder graphs, far cheaper than their
        products), unless their graphs' LUTs cannot fit this budget.

    The choice is recorded in ``dataflow.folding_info``: ``optimize``, the rate the search
    aimed at, what stopped it from going faster (``limited_by``), the layers whose products
    are in LUTs (``lut_multipliers``), the memories in soft logic (``logic_memories``) and
    in SPRAM (``spram_memories``), the ROMs in block RAM (``block_memories``).

    Raises
    ------
    OptionError
        If ``max_lanes`` or ``target_cycles`` is not a positive integer, ``optimize`` is
        neither ``"throughput"`` nor ``"latency"``, an override names an unknown layer or does
        not fit the layer's sizes, or no plan reaches ``target_cycles`` within the budget.
    SizeError
        With ``fits``, if no plan fits (without it, every layer takes its cheapest folding).
    """
    if max_lanes is not None and (not isinstance(max_lanes, int) or isinstance(max_lanes, bool)
                                  or max_lanes < 1):
        raise OptionError(f"max_lanes must be a positive integer, not {max_lanes!r}")
    if target_cycles is not None and (not isinstance(target_cycles, int)
                                      or isinstance(target_cycles, bool) or target_cycles < 1):
        raise OptionError(f"target_cycles must be a positive integer, not {target_cycles!r}")
    if fifo_depth is not None and (not isinstance(fifo_depth, int)
                                   or isinstance(fifo_depth, bool) or fifo_depth < 0):
        raise OptionError(f"fifo_depth must be a non-negative integer, not {fifo_depth!r}")
    check_optimize(optimize)
    layers = dataflow.layers
    unknown = sorted(set(overrides or {}) - {ly.name for ly in layers})
    if unknown:
        raise OptionError(f"Folding overrides name unknown layers: {unknown}")
    options = [layer_options(layer) for layer in layers]
    if max_lanes is None:
        # No lane budget (a board, a target): besides its multiply lanes, each output
        # channel computed in parallel (pe) costs an activation lane (a requantization or a
        # row of threshold comparators) and its registers. kwsmlp_w3a3 at 500 cycles took
        # simd 2 x pe 128 (256 multiply lanes, 128 activation lanes: a routing-congested
        # 41,800-LUT design) where simd 70 x pe 4 does it in 448 cycles with 280 and 4.
        options = [sorted(opts, key=lambda o: (o[1] + o[2].get("pe", 0), width(o[2]), o[0],
                                               sorted(o[2].items())))
                   for opts in options]
    targets = sorted({cyc for opts in options for cyc, _, _ in opts})
    floor = max(dataflow.input.beats, dataflow.output.beats)

    def picks(target):
        p = [_choose(opts, target) for opts in options]
        return None if any(q is None for q in p) else p

    reasons, mappings, plan_cycles = {}, {}, {}

    def why_not(target, whole=False):
        """``None`` if the plan for ``target`` is complete and fits, otherwise why not
        (folds ``dataflow`` to that plan the first time a target is tried). ``whole``: its
        layers at the whole-matrix folding are adder graphs from the start (their products
        are never estimated: tens of thousands of them)."""
        key = (target, whole)
        if key not in reasons:
            reasons[key] = _why_not(target, whole)
            if progress is not None and fits is not None:
                progress(f"folding at {target:,} cycles per inference"
                         f"{' (adder graphs)' if whole else ''}: {reasons[key] or 'fits'}")
            # `fits` may have moved layers' products or memories into LUTs to make the
            # plan fit.
            mappings[key] = ([product_mapping(ly) for ly in layers],
                             list(dataflow.logic_memories),
                             list(dataflow.spram_memories),
                             list(dataflow.block_memories))
        return reasons[key]

    def _why_not(target, whole=False):
        p = picks(target)
        if p is None:
            slow = max(zip(options, layers), key=lambda o: min(c for c, _, _ in o[0]))
            return (f"layer {slow[1].name!r} at its fastest folding "
                    f"({min(c for c, _, _ in slow[0])} cycles)")
        lanes = sum(q[0] for q in p)
        if max_lanes is not None and lanes > max_lanes:
            return f"multiply lanes {lanes} > max_lanes {max_lanes}"
        _fold_full(dataflow, [q[1] for q in p], overrides, fifo_depth, whole)
        # Lane converters between layers may regroup through a narrow common divisor:
        # a plan counts only if the whole design meets its target.
        cycles = plan_cycles[(target, whole)] = _design_cycles(dataflow)
        if cycles > max(target, floor):
            return f"{cycles} cycles with converters"
        return None if fits is None else fits(dataflow)

    info = {"target_cycles": target_cycles, "max_lanes": max_lanes, "limited_by": None}
    chosen = chosen_target = None
    whole = False                   # the chosen plan's whole-matrix layers are adder graphs
    if target_cycles is not None:
        # The cheapest plan that meets the target: the slowest target at most target_cycles
        # (the narrowest streams first), then faster ones if converters slow it down.
        below = [t for t in targets if t <= target_cycles]
        if not below:               # names the layer that cannot go that fast
            r = why_not(target_cycles)
        for t in reversed(below):
            r = why_not(t)
            if r is None:
                chosen, chosen_target = [q[1] for q in picks(t)], t
                break
            if not r.endswith("with converters"):
                break      # faster plans take more lanes: they fit even less
        if chosen is None:
            raise OptionError(f"No folding reaches {target_cycles} cycles per inference: {r}")
        info["limited_by"] = "target_cycles"
    else:
        # The fastest plan that fits. Lanes and resources only grow as the target shrinks,
        # so: the slowest plan first (nothing fits if it does not), then halve the cycle
        # target while plans fit, then bisect between the last that fitted and the first
        # that did not; then step to slower ones past plans whose converters miss their
        # target. No plan tried is much larger than the one chosen (estimating a large
        # design is what takes the time), and a design that fits nothing is refused after
        # one try.
        def passes(i):
            r = why_not(targets[i])
            return r is None or r.endswith("with converters")

        n = len(targets)
        if passes(n - 1):
            lo, hi = -1, n - 1          # targets[lo] fails (-1: none known), targets[hi] passes
            while True:
                i = bisect_right(targets, targets[hi] // 2) - 1
                if i < 0:
                    break
                if not passes(i):
                    lo = i
                    break
                hi = i
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if passes(mid):
                    hi = mid
                else:
                    lo = mid
            for j in range(hi, n):
                if why_not(targets[j]) is None:
                    chosen, chosen_target = [q[1] for q in picks(targets[j])], targets[j]
                    info["limited_by"] = (why_not(targets[j - 1]) if j > 0
                                          else "every layer at its fastest folding")
                    break
            # Faster plans take more lanes, but a layer that takes its whole matrix per
            # cycle can become an adder graph, far cheaper than its products: the faster
            # targets at which more layers reach that folding are tried too.
            for t in (_whole_matrix_targets(layers, targets, picks, chosen_target, lut_budget)
                      if fits is not None and chosen_target is not None else ()):
                if why_not(t, True) is None:
                    chosen, chosen_target, whole = [q[1] for q in picks(t)], t, True
                    i = targets.index(t)
                    info["limited_by"] = (why_not(targets[i - 1]) if i > 0
                                          else "every layer at its fastest folding")
                    break
    if chosen is None and fits is not None:
        # A board: a design that cannot be built is no result.
        # (its cycles as planned: layers the overrides fix may make it faster than the
        # slowest target the other layers allow)
        r = why_not(targets[-1])
        raise SizeError(f"No folding of the design fits: at the slowest, "
                        f"{plan_cycles.get((targets[-1], False), targets[-1]):,} cycles per "
                        f"inference, {r}")
    if chosen is None:      # nothing fits: the cheapest folding of every layer
        chosen = [opts[0][2] for opts in options]
        info["limited_by"] = "nothing fits: every layer at its cheapest folding"
    info["optimize"] = optimize
    refit = False
    if optimize == "latency" and chosen_target is not None and \
            (max_lanes is not None or fits is not None):
        faster = _shorter_latency(dataflow, options, chosen, max(chosen_target, floor),
                                  max_lanes, fits, overrides, fifo_depth, whole)
        refit = faster != chosen
        chosen = faster
    _fold_full(dataflow, chosen, overrides, fifo_depth, whole)
    if refit and fits is not None:
        fits(dataflow)      # the products and memories the faster plan moves into LUTs
    elif chosen_target is not None:
        mults, dataflow.logic_memories, dataflow.spram_memories, dataflow.block_memories = \
            mappings[(chosen_target, whole)]
        for layer, mult in zip(layers, mults):
            if mult is not None:
                layer.multipliers = mult
    lut = [ly.name for ly in layers if product_mapping(ly) == "lut"]
    if lut:
        info["lut_multipliers"] = lut
    if dataflow.logic_memories:
        info["logic_memories"] = list(dataflow.logic_memories)
    if dataflow.spram_memories:
        info["spram_memories"] = list(dataflow.spram_memories)
    if dataflow.block_memories:
        info["block_memories"] = list(dataflow.block_memories)
    dataflow.folding_info = info
    return dataflow


def _shorter_latency(dataflow, options, chosen, cycles, max_lanes, fits, overrides,
                     fifo_depth, whole=False) -> list:
    """``chosen`` with layers folded faster while the latency shrinks, the design keeps
    ``cycles`` per inference and fits (:func:`onnx2fpga.plan.optimize.shorten_latency`)."""
    def latency_of(plan):
        if max_lanes is not None and sum(o[1] for o in plan) > max_lanes:
            return None
        _fold_full(dataflow, [o[2] for o in plan], overrides, fifo_depth, whole)
        if _design_cycles(dataflow) > cycles or (fits is not None and fits(dataflow)):
            return None
        return dataflow_cycles(dataflow)["latency_cycles"]

    start = [next(o for o in opts if o[2] == params) for opts, params in zip(options, chosen)]
    return [o[2] for o in shorten_latency(options, start, latency_of)]


def _fold_full(dataflow: Dataflow, chosen: list, overrides, fifo_depth: int | None,
               whole: bool = False) -> None:
    """Apply ``chosen`` and the overrides, then the ports and all FIFO depths (``fifo_depth``
    after every layer, or each from the cycle model with ``None``); ``whole``: the layers
    then at the whole-matrix folding are adder graphs unless overridden."""

    _fold_with(dataflow, chosen, overrides, whole)
    dataflow.logic_memories = []
    dataflow.spram_memories = []
    dataflow.block_memories = []
    depth = MIN_DEPTH if fifo_depth is None else fifo_depth
    dataflow.fifo_depths = [depth] * len(dataflow.layers)
    plan = plan_graph(dataflow, check_ports=False)
    dataflow.edge_fifos = edge_fifo_depths(dataflow, plan)
    if fifo_depth is None:
        plan = plan_graph(dataflow, check_ports=False)
        dataflow.fifo_depths, dataflow.edge_fifos = fifo_depths(dataflow, plan)


def _fold_with(dataflow: Dataflow, chosen: list, overrides, whole: bool = False) -> None:
    """Apply ``chosen`` (then the overrides) and set the ports' lanes and orders."""

    for layer, params in zip(dataflow.layers, chosen):
        _apply(layer, params)
        if product_mapping(layer) is not None:
            layer.multipliers = "adders" if whole and at_full_folding(layer) else "dsp"
        o = (overrides or {}).get(layer.name)
        if o:
            _override(layer, o)
    dataflow.edge_fifos = {}
    orders, _ = tensor_orders(dataflow)
    dataflow.input.order = orders[dataflow.input.name]
    dataflow.output.order = orders[dataflow.output.name]
    readers = dataflow.consumers(dataflow.input.name)
    first = next((ly for ly in readers if not kind_of(ly).is_view), None)
    dataflow.input.lanes = first.in_lanes if first is not None else 1
    plan = plan_graph(dataflow, check_ports=False)
    dataflow.output.lanes = plan.nets[plan.output_net][1]


def _design_cycles(dataflow: Dataflow) -> int:
    return max(stage_cycles(s) for s in plan_graph(dataflow, check_ports=False).stages)


def _override(layer, o: dict) -> None:
    unknown = sorted(set(o) - {"simd", "pe", "lanes", "multipliers"})
    if unknown:
        raise OptionError(f"Layer {layer.name!r}: unknown folding parameters {unknown}")
    if "multipliers" in o:
        if product_mapping(layer) is None:
            raise OptionError(f"Layer {layer.name!r} ({type(layer).__name__}) has no "
                              f"multipliers to map")
        if o["multipliers"] not in MULTIPLIERS:
            raise OptionError(f"Layer {layer.name!r}: multipliers must be one of "
                              f"{MULTIPLIERS}, not {o['multipliers']!r}")
        layer.multipliers = o["multipliers"]
        o = {k: v for k, v in o.items() if k != "multipliers"}
        if layer.multipliers == "adders":      # the whole matrix per cycle
            full = kind_of(layer).full_folding(layer)
            if not full:
                raise OptionError(f"Layer {layer.name!r} ({type(layer).__name__}) has no "
                                  f"'adders' realization (multipliers 'dsp' or 'lut')")
            wrong = {k: v for k, v in o.items() if k in full and v != full[k]}
            if wrong:
                raise OptionError(
                    f"Layer {layer.name!r}: multipliers 'adders' compute the whole matrix "
                    f"per cycle ({', '.join(f'{k}={v}' for k, v in full.items())}), not "
                    f"{', '.join(f'{k}={v}' for k, v in wrong.items())}")
            o = {**o, **full}
    kind_of(layer).set_folding(layer, o)
