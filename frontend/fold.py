"""Folding: choose each layer's parallelism (``simd`` inputs, ``pe`` outputs per cycle).

A simple balanced plan: the pipeline runs at the rate of its slowest layer, so every layer
gets the least parallelism that meets a common cycle target, and the target is the smallest
one whose total multiplier lanes fit ``max_lanes``. Consecutive layers must have stream
widths where one divides the other (a width converter joins them).
"""

from __future__ import annotations

from ..dataflow import Dataflow, DenseLayer, RequantLayer

__all__ = ["fold", "divisors"]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _compatible(a: int, b: int) -> bool:
    return a % b == 0 or b % a == 0


def _plan_for(layers, target: int):
    """Minimal-lane (simd, pe) per dense layer meeting ``target`` cycles, or None."""
    plan = []
    prev_out = None
    for layer in layers:
        if not isinstance(layer, DenseLayer):
            plan.append(None)
            continue
        best = None
        for simd in divisors(layer.in_features):
            if prev_out is not None and not _compatible(prev_out, simd):
                continue
            for pe in divisors(layer.out_features):
                cyc = (layer.in_features // simd) * (layer.out_features // pe)
                if cyc > target:
                    continue
                key = (simd * pe, -simd, pe)
                if best is None or key < best[0]:
                    best = (key, simd, pe)
                break  # larger pe only adds lanes
        if best is None:
            return None
        plan.append((best[1], best[2]))
        prev_out = best[2]
    return plan


def fold(dataflow: Dataflow, *, max_lanes: int = 8, overrides: dict | None = None,
         fifo_depth: int = 2) -> Dataflow:
    """Set ``simd``/``pe`` of every dense layer, lanes of elementwise layers, port lanes and
    FIFO depths (in place; also returned). ``overrides`` maps a layer name to
    ``{"simd": s, "pe": p}`` and wins over the plan."""
    if not isinstance(max_lanes, int) or max_lanes < 1:
        raise ValueError(f"max_lanes must be a positive integer, not {max_lanes!r}")
    layers = dataflow.layers
    dense = [ly for ly in layers if isinstance(ly, DenseLayer)]
    targets = sorted({(ly.in_features // s) * (ly.out_features // p)
                      for ly in dense for s in divisors(ly.in_features)
                      for p in divisors(ly.out_features)})
    chosen = None
    for target in targets:  # ascending: the first that fits is the fastest
        plan = _plan_for(layers, target)
        if plan is not None and sum(s * p for s, p in filter(None, plan)) <= max_lanes:
            chosen = plan
            break
    if chosen is None:
        chosen = [(1, 1) if isinstance(ly, DenseLayer) else None for ly in layers]
    overrides = dict(overrides or {})
    for layer, p in zip(layers, chosen):
        if isinstance(layer, DenseLayer):
            layer.simd, layer.pe = p
            o = overrides.pop(layer.name, None)
            if o:
                simd, pe = int(o.get("simd", layer.simd)), int(o.get("pe", layer.pe))
                if layer.in_features % simd or layer.out_features % pe:
                    raise ValueError(f"Layer {layer.name!r}: simd={simd} must divide "
                                     f"{layer.in_features} and pe={pe} must divide "
                                     f"{layer.out_features}")
                layer.simd, layer.pe = simd, pe
    if overrides:
        raise ValueError(f"Folding overrides name unknown layers: {sorted(overrides)}")
    prev = None
    for layer in layers:
        if isinstance(layer, RequantLayer):
            lanes = prev if prev and layer.channels % prev == 0 else 1
            layer.lanes = lanes
        prev = layer.out_lanes
    for a, b in zip(layers, layers[1:]):
        if not _compatible(a.out_lanes, b.in_lanes):
            raise ValueError(f"Layers {a.name!r} ({a.out_lanes} lanes out) and {b.name!r} "
                             f"({b.in_lanes} lanes in) need lane counts where one divides "
                             f"the other")
    dataflow.input.lanes = layers[0].in_lanes
    dataflow.output.lanes = layers[-1].out_lanes
    dataflow.fifo_depths = [fifo_depth] * len(layers)
    return dataflow
