"""Automatic folding: the chosen plan is the fastest that fits, or the cheapest that meets a
target, checked against an exhaustive search over every combination of layer foldings."""

import functools
import itertools
import re

import numpy as np
import pytest

from onnx2fpga.errors import OptionError, SizeError
from onnx2fpga.frontend.load import load_model
from onnx2fpga.frontend.lower import lower
from onnx2fpga.frontend.quantize import quantize_graph
from onnx2fpga.ir.layers import DenseLayer
from onnx2fpga.plan.cost import stage_cycles
from onnx2fpga.plan.fold import _fold_full, fold, layer_options
from onnx2fpga.plan.graph import plan_graph
from tests.helpers.models import float_mlp


def _dataflow(sizes):
    g = load_model(float_mlp(sizes, softmax=False, seed=1))
    x = np.random.default_rng(0).standard_normal((20, 1, sizes[0])).astype(np.float32)
    quantize_graph(g, x)
    return lower(g, multiplier_bits=16).dataflow


def _cycles(df):
    return max(stage_cycles(s) for s in plan_graph(df, check_ports=False).stages)


def _dense_lanes(df):
    return sum(ly.simd * ly.pe for ly in df.layers if isinstance(ly, DenseLayer))


def _lanes(df):
    return sum(cost for ly in df.layers for _, cost, params in layer_options(ly)
               if all(getattr(ly, k) == v for k, v in params.items()))


@functools.cache
def _plans(sizes):
    return _every_plan(_dataflow(sizes))


def _every_plan(df):
    """(design cycles, lanes, dense lanes, activation lanes) of every combination of layer
    foldings; activation lanes are the dense layers' pe."""
    options = [layer_options(ly) for ly in df.layers]
    out = []
    for combo in itertools.product(*options):
        _fold_full(df, [c[2] for c in combo], None, 2)
        out.append((_cycles(df), sum(c[1] for c in combo), _dense_lanes(df),
                    sum(c[2].get("pe", 0) for c in combo)))
    return out


SIZES = [(4, 6, 2), (6, 4, 3)]


@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("budget", [1, 5, 9, 14, 40])
def test_fastest_plan_within_a_lane_budget(sizes, budget):
    df = _dataflow(sizes)
    plans = _plans(sizes)
    fold(df, max_lanes=budget)
    if all(lanes > budget for _, lanes, _, _ in plans):
        assert df.folding_info["limited_by"] == ("nothing fits: every layer at its cheapest "
                                                 "folding")
        assert _lanes(df) == min(lanes for _, lanes, _, _ in plans)
        return
    best = min(c for c, lanes, _, _ in plans if lanes <= budget)
    assert _lanes(df) <= budget
    assert _cycles(df) == best


@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("dsp", [2, 4, 7, 12])
def test_fastest_plan_that_fits_a_resource_check(sizes, dsp):
    df = _dataflow(sizes)
    plans = _plans(sizes)
    best = min(c for c, _, dense, _ in plans if dense <= dsp)

    def fits(d):
        used = _dense_lanes(d)
        return None if used <= dsp else f"dsp {used} > {dsp}"

    lines = []
    fold(df, max_lanes=None, fits=fits, progress=lines.append)
    assert _dense_lanes(df) <= dsp
    assert _cycles(df) == best
    # The slowest plan first, then faster ones; every plan asked about is a progress line.
    slowest = max(c for c, _, _, _ in plans)
    assert lines[0] == f"folding at {slowest:,} cycles per inference: fits"
    assert f"folding at {best:,} cycles per inference: fits" in lines
    limited = df.folding_info["limited_by"]
    if best > min(c for c, _, _, _ in plans):
        assert limited.startswith("dsp ") and limited.endswith(f" > {dsp}")
    else:
        assert limited == "every layer at its fastest folding"


def test_a_device_nothing_fits_is_refused():
    """With a device check (a board), no plan that fits is an error naming what overflows at
    the slowest plan, not the cheapest folding written as a design; without one, a lane
    budget nothing meets still gives every layer its cheapest folding."""
    df = _dataflow((6, 4, 3))
    slowest = max(c for c, _, _, _ in _plans((6, 4, 3)))
    seen = []

    def fits(d):
        seen.append(_cycles(d))
        return f"dsp {_dense_lanes(d)} > 0"

    with pytest.raises(SizeError, match=rf"^No folding of the design fits: at the slowest, "
                                        rf"{slowest:,} cycles per inference, dsp 2 > 0$"):
        fold(df, max_lanes=None, fits=fits)
    assert seen == [slowest]           # refused after estimating the slowest plan once
    fold(df, max_lanes=1)
    assert df.folding_info["limited_by"] == "nothing fits: every layer at its cheapest folding"


@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("target", [1, 3, 5, 8, 13, 24])
def test_cheapest_plan_that_meets_a_target(sizes, target):
    df = _dataflow(sizes)
    plans = _plans(sizes)
    # Without a lane budget, the cheapest counts an activation lane per pe as well.
    meets = [lanes + pe for c, lanes, _, pe in plans if c <= target]
    if not meets:
        with pytest.raises(OptionError, match=r"^No folding reaches \d+ cycles per inference"):
            fold(df, max_lanes=None, target_cycles=target)
        return
    fold(df, max_lanes=None, target_cycles=target)
    assert _cycles(df) <= target
    pe = sum(ly.pe for ly in df.layers if isinstance(ly, DenseLayer))
    assert _lanes(df) + pe == min(meets)


def test_a_target_the_budget_cannot_reach_is_refused():
    df = _dataflow((6, 4, 3))
    with pytest.raises(OptionError, match=r"^No folding reaches 2 cycles per inference: "
                                          r"multiply lanes \d+ > max_lanes 3$"):
        fold(df, max_lanes=3, target_cycles=2)
    with pytest.raises(OptionError, match=r"^target_cycles must be a positive integer, "
                                          r"not 0$"):
        fold(df, target_cycles=0)


@pytest.mark.parametrize("board,family", [("icebreaker", "ice40"), ("ulx3s-85f", "ecp5")])
def test_board_folding_fits_the_estimate_and_less_room_is_never_faster(board, family):
    """compile(board=...) keeps the estimated board resources (with the wrapper) within the
    device; with less room (lower utilization) the design can only get slower, and where
    not even the slowest folding fits, the compile is refused (SizeError naming what
    overflows) instead of writing a design that cannot be built."""
    import onnx2fpga
    from onnx2fpga.boards.targets import get_board

    model = float_mlp((16, 12, 6), softmax=False, seed=2)
    cal = np.random.default_rng(1).standard_normal((32, 1, 16)).astype(np.float32)
    lim = get_board(board).limits
    cycles = []
    for util in (0.8, 0.3, 0.05):
        try:
            d = onnx2fpga.compile(model, calibration=cal, board=board, utilization=util)
        except SizeError as e:
            # Each resource over, with the device's figure and the utilization.
            assert re.match(rf"^No folding of the design fits {board}: at the slowest, "
                            r"[\d,]+ cycles per inference, ([\d,]+ [a-zA-Z0-9 -]+ > [\d,]+ "
                            rf"\([\d,]+ x {util}\)(; |$))+", str(e)), str(e)
            cycles.append(None)
            continue
        f, est = d.manifest["folding"], d.manifest["resources"][family]["board"]
        assert (f["board"], f["utilization"]) == (board, util)
        assert not f["limited_by"].startswith("nothing fits")
        assert est["lut"] <= lim.lut * util and est["ff"] <= lim.ff * util
        assert est["dsp"] <= lim.dsp * util and est["bram"] <= lim.bram
        cycles.append(d.manifest["cycles_per_inference"])
    built = [c for c in cycles if c is not None]
    assert built and cycles == built + [None] * (len(cycles) - len(built))
    assert built == sorted(built)
    assert built[0] < built[-1] or len(built) < len(cycles)


def test_board_folding_moves_products_into_luts_when_the_dsps_run_out():
    """At a target whose products outnumber the MULT18X18D board folding may use (75 % of
    the ECP5 85F's 156), it builds the products of the layers with the most multipliers in
    LUTs (the estimate then fits); a layer the user pins to hard multipliers stays, and the
    target is refused when the pinned ones alone overflow."""
    import onnx2fpga
    from onnx2fpga.boards.targets import get_board

    model = float_mlp((40, 40, 4), softmax=False, seed=3)
    cal = np.random.default_rng(4).standard_normal((32, 1, 40)).astype(np.float32)
    kw = {"calibration": cal, "board": "ulx3s-85f", "target_fps": 100e6 / 8, "clock_mhz": 100,
          "weight_bits": 6}
    board = get_board("ulx3s-85f")
    dsp_cap = int(board.limits.dsp * board.utilization)       # the default utilization
    d = onnx2fpga.compile(model, **kw)
    m = d.manifest
    assert m["cycles_per_inference"] <= 8
    dense = [ly for ly in m["layers"] if ly["kind"] == "dense"]
    # Each product is one MULT18X18D as hard multipliers (8 x 6 bits): more than the device
    # has at this rate.
    assert sum(ly["simd"] * ly["pe"] for ly in dense) > dsp_cap
    lut = [ly["name"] for ly in dense if ly["multipliers"] == "lut"]
    assert lut and m["folding"]["lut_multipliers"] == lut
    assert m["resources"]["ecp5"]["board"]["dsp"] <= dsp_cap
    for ly in dense:
        # The requantization keeps its few multipliers either way.
        uses = ly["resources"]["ecp5"]["dsp"] >= ly["simd"] * ly["pe"]
        assert uses == (ly["name"] not in lut)
    # The layer with the most multipliers moved. Pinned to hard multipliers, it stays there,
    # and moving the other one is not enough: the target is refused, naming the DSPs.
    big = max(dense, key=lambda ly: ly["simd"] * ly["pe"])["name"]
    assert lut == [big]
    with pytest.raises(OptionError, match=r"^No folding reaches 8 cycles per inference: "
                                          rf"\d+ MULT18X18D > {dsp_cap} \(156 x 0\.75; \d+ "
                                          r"requantizing, which stay when products move to "
                                          r"LUTs\)$"):
        onnx2fpga.compile(model, folding={big: {"multipliers": "dsp"}}, **kw)


def test_lut_multipliers_override_is_bit_exact_in_rtl():
    """A layer whose products the user puts into LUTs: the emitted Verilog (no hard
    multiplier for it) computes what the golden model does, under stalls."""
    import onnx2fpga

    model = float_mlp((12, 8, 4), softmax=False, seed=5)
    rng = np.random.default_rng(6)
    cal = rng.standard_normal((32, 1, 12)).astype(np.float32)
    d = onnx2fpga.compile(model, calibration=cal, folding={"dense0": {"multipliers": "lut"}})
    assert [ly.get("multipliers") for ly in d.manifest["layers"]
            if ly["kind"] == "dense"] == ["lut", "dsp"]
    x = rng.standard_normal((6, 1, 12)).astype(np.float32)
    np.testing.assert_array_equal(d.simulate(x, engine="rtl", seed=2),
                                  d.simulate(x, engine="golden"))
    with pytest.raises(OptionError, match=r"^Layer 'dense0': multipliers must be one of "
                                          r"\('dsp', 'lut', 'adders'\), not 'soft'$"):
        onnx2fpga.compile(model, calibration=cal, folding={"dense0": {"multipliers": "soft"}})


def test_cheapest_cover_is_the_exhaustive_minimum():
    """The memories board folding moves into soft logic: the set whose block RAMs add up to
    at least what is missing at the least logic cost, as an exhaustive search finds it."""
    import random

    from onnx2fpga.steps import cheapest_cover
    rng = random.Random(0)
    for _ in range(200):
        items = [(f"m{i}", rng.randint(1, 6), rng.randint(1, 50))
                 for i in range(rng.randint(1, 7))]
        need = rng.randint(1, 15)
        got = cheapest_cover(items, need)
        size = {n: (s, c) for n, s, c in items}
        covers = [sum(c for _, _, c in combo) for r in range(len(items) + 1)
                  for combo in itertools.combinations(items, r)
                  if sum(s for _, s, _ in combo) >= need]
        if not covers:
            assert got == sorted(n for n, _, _ in items)
            continue
        assert sum(size[n][0] for n in got) >= need
        assert sum(size[n][1] for n in got) == min(covers)
    assert cheapest_cover([("a", 2, 5)], 0) == []


def _pool_dataflow(op):
    """``op`` (a 2x2 pool of stride 2 or a global one) on an 8-channel 8x8 input, then a
    Gemm: the pool's lanes, not a window's, set how fast the input can be taken."""
    import onnx
    from onnx import TensorProto, helper

    import onnx2fpga

    rng = np.random.default_rng(3)
    attrs = {} if op.startswith("Global") else {"kernel_shape": [2, 2], "strides": [2, 2]}
    n = 8 if op.startswith("Global") else 8 * 4 * 4
    w = helper.make_tensor("w", TensorProto.FLOAT, [n, 5],
                           rng.standard_normal((n, 5)).astype(np.float32).ravel())
    nodes = [helper.make_node(op, ["x"], ["p"], **attrs),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "w"], ["y"])]
    graph = helper.make_graph(
        nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    x = rng.standard_normal((16, 8, 8, 8)).astype(np.float32)
    return onnx2fpga.compile(model, calibration=x, stop_after="lower").design.dataflow


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "GlobalAveragePool"])
def test_pool_lanes_follow_the_rate(op):
    """A pool costs no multiply lane, but its lanes cost logic: at every rate it takes the
    fewest lanes whose cores (their cycle models) keep up with the design, never more (it
    took one lane per channel at any rate: MobileNetV1's average pool was estimated at 122k
    LUTs)."""
    from onnx2fpga.ir.layers import PoolLayer
    from onnx2fpga.plan.graph import layer_stages
    from onnx2fpga.plan.layers.base import divisors

    df = _pool_dataflow(op)
    pool = next(ly for ly in df.layers if isinstance(ly, PoolLayer))
    own = {}
    for lanes in divisors(pool.in_shape[0]):
        pool.lanes = lanes
        own[lanes] = max(stage_cycles(s) for s in layer_stages(pool))
    chosen = []
    for target in sorted({c for c, _, _ in layer_options(pool)}, reverse=True):
        fold(df, max_lanes=None, target_cycles=target)
        cycles = _cycles(df)
        assert own[pool.lanes] <= cycles
        assert all(own[lanes] > cycles for lanes in own if lanes < pool.lanes), (target, own)
        chosen.append(pool.lanes)
    assert chosen == sorted(chosen) and chosen[0] == 1 and chosen[-1] == 8


def test_board_folding_keeps_the_requantization_on_hard_multipliers():
    """The products of a layer move into LUTs, its requantization's MULT18X18D stay: the
    estimate splits each layer into those parts, what it counted as requantization is what
    the layer still uses after the move, and the board check moves products until what stays
    fits (it took a layer's whole count off and stopped one layer short)."""
    from types import SimpleNamespace

    from onnx2fpga.hw.resources import dataflow_resources
    from onnx2fpga.steps import device_check

    df = _dataflow((40, 40, 4))
    fold(df, max_lanes=None, target_cycles=8)
    res = dataflow_resources(df, "ecp5", wrapper=True)
    parts = {lr["name"]: lr for lr in res["layers"]}
    for lr in res["layers"]:
        assert lr["products"]["dsp"] + lr["requant"]["dsp"] <= lr["dsp"]
        assert lr["requant"]["dsp"] > 0 and lr["products"]["dsp"] >= 8
    for ly in df.layers:
        ly.multipliers = "lut"
    moved = {lr["name"]: lr for lr in dataflow_resources(df, "ecp5")["layers"]}
    for name, lr in moved.items():
        assert lr["dsp"] == lr["requant"]["dsp"] == parts[name]["requant"]["dsp"]
        assert lr["products"]["dsp"] == 0

    # Room for all but the largest layer's whole count: moving its products alone leaves its
    # requantization over, so the smaller layer's products move too.
    big, small = sorted(parts.values(), key=lambda lr: -lr["products"]["dsp"])
    cap = res["board"]["dsp"] - big["dsp"]
    assert big["requant"]["dsp"] <= small["products"]["dsp"]
    target = SimpleNamespace(family="ecp5", limits=SimpleNamespace(
        lut=10**6, ff=10**6, dsp=cap, bram=10**3))
    for ly in df.layers:
        ly.multipliers = "dsp"
    assert device_check(target, 1.0)(df) is None
    assert [ly.multipliers for ly in df.layers] == ["lut", "lut"]
    assert dataflow_resources(df, "ecp5", wrapper=True)["board"]["dsp"] <= cap
    for ly in df.layers:
        ly.multipliers = "dsp"
    kept = sum(lr["requant"]["dsp"] for lr in res["layers"])
    rest = res["board"]["dsp"] - sum(lr["products"]["dsp"] for lr in res["layers"])
    target.limits.dsp = rest - 1
    assert device_check(target, 1.0)(df) == (
        f"{rest} MULT18X18D > {rest - 1} ({rest - 1} x 1; {kept} requantizing, which stay "
        f"when products move to LUTs)")


def test_default_utilization_is_the_boards():
    """Without ``utilization``, a board folding fills the board's share
    (``BoardTarget.utilization``: 0.75 on an ECP5, 0.8 on an iCE40), and the manifest says
    which; a given one wins."""
    import onnx2fpga
    from onnx2fpga.boards.targets import get_board

    model = float_mlp((16, 16, 4), softmax=False, seed=5)
    cal = np.random.default_rng(6).standard_normal((16, 1, 16)).astype(np.float32)
    assert (get_board("ulx3s-85f").utilization, get_board("icebreaker").utilization) == \
        (0.75, 0.8)
    for board, want in (("ulx3s-85f", 0.75), ("icebreaker", 0.8)):
        d = onnx2fpga.compile(model, calibration=cal, board=board)
        assert d.manifest["folding"]["utilization"] == want
    d = onnx2fpga.compile(model, calibration=cal, board="ulx3s-85f", utilization=0.5)
    assert d.manifest["folding"]["utilization"] == 0.5
