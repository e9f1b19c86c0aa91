"""``fold(optimize="latency")``: at the rate the throughput plan reaches, the budget left folds
layers faster while the modelled latency shrinks; the rate, the budget and the fit hold."""

import numpy as np
import pytest

from onnx2fpga.errors import OptionError
from onnx2fpga.frontend.load import load_model
from onnx2fpga.frontend.lower import lower
from onnx2fpga.frontend.quantize import quantize_graph
from onnx2fpga.frontend.resolve import resolve_geometry
from onnx2fpga.plan.cost import dataflow_cycles
from onnx2fpga.plan.fold import fold, layer_options
from onnx2fpga.plan.optimize import shorten_latency
from tests.helpers.models import CNN_KINDS, float_cnn, float_mlp


def _dataflow(kind):
    model = float_mlp((24, 16, 10), softmax=False, seed=1) if kind == "mlp" else float_cnn(kind)
    shape = (24,) if kind == "mlp" else CNN_KINDS[kind]
    g = resolve_geometry(load_model(model))
    x = np.random.default_rng(0).standard_normal((20, 1) + shape).astype(np.float32)
    quantize_graph(g, x)
    return lower(g, multiplier_bits=16).dataflow


def _lanes(df):
    return sum(cost for ly in df.layers for _, cost, params in layer_options(ly)
               if all(getattr(ly, k) == v for k, v in params.items()))


def _folded(kind, **options):
    df = fold(_dataflow(kind), **options)
    return df, dataflow_cycles(df)


@pytest.mark.parametrize("kind, budget", [("mlp", 12), ("residual", 16), ("conv1d", 20),
                                          ("depthwise", 24)])
def test_latency_plan_keeps_rate_and_budget(kind, budget):
    _, fast = _folded(kind, max_lanes=budget)
    df, short = _folded(kind, max_lanes=budget, optimize="latency")
    assert short["cycles_per_inference"] == fast["cycles_per_inference"]
    assert short["latency_cycles"] <= fast["latency_cycles"]
    assert _lanes(df) <= budget
    assert df.folding_info["optimize"] == "latency"


@pytest.mark.parametrize("kind, budget", [("depthwise", 16), ("basic", 12)])
def test_latency_plan_is_shorter_with_budget_left(kind, budget):
    """The throughput plan leaves lanes unused at its rate (the next faster rate does not
    fit): the latency plan spends them and is shorter (1219 -> 804 and 976 -> 732 cycles when
    written)."""
    _, fast = _folded(kind, max_lanes=budget)
    _, short = _folded(kind, max_lanes=budget, optimize="latency")
    assert short["latency_cycles"] <= 0.8 * fast["latency_cycles"]


def test_latency_plan_fits_the_check():
    """With a device check instead of a lane budget, every plan tried and the one kept fit."""
    limit = 18
    seen = []

    def fits(df):
        seen.append(_lanes(df))
        return None if seen[-1] <= limit else f"lanes {seen[-1]} > {limit}"

    df, short = _folded("residual", max_lanes=None, fits=fits, optimize="latency")
    _, fast = _folded("residual", max_lanes=None, fits=lambda d: None if _lanes(d) <= limit
                      else "too many")
    assert _lanes(df) <= limit
    assert short["cycles_per_inference"] == fast["cycles_per_inference"]
    assert short["latency_cycles"] <= fast["latency_cycles"]


def test_shorten_latency_takes_steps_that_shorten_only():
    # Two layers of foldings (cycles, cost, params); the latency is the sum of the cycles, and a
    # plan over 5 cost units does not fit.
    options = [[(8, 1, {"a": 1}), (4, 2, {"a": 2}), (2, 4, {"a": 4})],
               [(8, 1, {"b": 1}), (4, 2, {"b": 2}), (2, 4, {"b": 4})]]

    def latency_of(plan):
        return None if sum(o[1] for o in plan) > 5 else sum(o[0] for o in plan)

    start = [options[0][0], options[1][0]]
    assert shorten_latency(options, start, latency_of) == [options[0][1], options[1][1]]
    assert shorten_latency(options, start, lambda plan: 1) == start


def test_unknown_optimize_is_refused():
    with pytest.raises(OptionError, match=r"^optimize must be one of 'throughput', 'latency', "
                                          r"not 'speed'$"):
        fold(_dataflow("mlp"), optimize="speed")
