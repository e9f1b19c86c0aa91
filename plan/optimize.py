"""What the folding optimizes beyond the rate: :data:`OPTIMIZE` and the latency search of
``fold(optimize="latency")``.

The folding first finds the rate (the fastest plan that fits, or the cheapest that meets a
target); every layer then takes its cheapest folding for that rate, so the pipeline is
balanced. A balanced pipeline has the shortest streams and the fewest lanes, but its latency
is long: each layer works at the bottleneck's pace, and a window waiting for its first rows
waits for rows produced at that pace (see :mod:`onnx2fpga.plan.cost`). With
``optimize="latency"`` the budget left over at that rate goes to layers that are not the
bottleneck, folded faster while the latency shrinks, the rate stays and the plan fits.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import OptionError

__all__ = ["OPTIMIZE", "check_optimize", "shorten_latency"]

#: What ``fold(optimize=...)`` may optimize besides the rate.
OPTIMIZE = ("throughput", "latency")


def check_optimize(optimize) -> str:
    """``optimize`` if it is one of :data:`OPTIMIZE`; else ``OptionError`` (a ``ValueError``)."""
    if optimize not in OPTIMIZE:
        raise OptionError(f"optimize must be one of {', '.join(map(repr, OPTIMIZE))}, "
                          f"not {optimize!r}")
    return optimize


def _next_faster(options: list, current: tuple):
    """The folding of a layer one step faster than ``current`` (the slowest of those faster,
    the cheapest of those; ``options`` are cheapest first), or None."""
    faster = [o for o in options if o[0] < current[0]]
    if not faster:
        return None
    top = max(o[0] for o in faster)
    return next(o for o in faster if o[0] == top)


def shorten_latency(options: list, chosen: list, latency_of: Callable, *,
                    evaluations: int | None = None) -> list:
    """Fold layers faster, one step at a time, while the latency shrinks.

    Parameters
    ----------
    options : list of list of (cycles, cost, params)
        Every layer's foldings (:func:`onnx2fpga.plan.fold.layer_options`).
    chosen : list of (cycles, cost, params)
        The folding of every layer at the chosen rate.
    latency_of : callable
        ``latency_of(plan)`` for a list like ``chosen``: its latency in cycles, or None if it
        does not keep the rate or does not fit.
    evaluations : int, optional
        The most plans to try (``8 * len(chosen) + 16`` by default).

    Returns
    -------
    list
        The plan of the shortest latency found (``chosen`` itself if no step shortens it).
        Rounds over the layers, from the last to the first, take each step that shortens the
        latency, until a round takes none or the evaluations are spent.
    """
    budget = 8 * len(chosen) + 16 if evaluations is None else evaluations
    best, best_latency = list(chosen), latency_of(chosen)
    if best_latency is None:
        return chosen
    start = best_latency
    improved = True
    while improved and budget > 0:
        improved = False
        for k in reversed(range(len(best))):
            step = _next_faster(options[k], best[k])
            if step is None or budget <= 0:
                continue
            trial = best[:k] + [step] + best[k + 1:]
            budget -= 1
            latency = latency_of(trial)
            if latency is not None and latency < best_latency:
                best, best_latency, improved = trial, latency, True
    return best if best_latency < start else chosen
