"""The constant matrix-vector core (adder graphs, issue 24): the planner's graph against numpy
on random and pruned matrices, its sharing, and ConstMatVecCore in amaranth.sim against
``W @ x + b`` under random idles and stalls and at full rate."""

import numpy as np
import pytest
from amaranth import signed, unsigned

from onnx2fpga.hw.cmvm import ENABLE_SHARE_BITS, ConstMatVecCore
from onnx2fpga.hw.testing import random_values, run_stream, run_timed, shape_range
from onnx2fpga.plan.cmvm import Adder, adder_cost, adder_graph, csd_digits


def test_csd_digits_are_canonical():
    for v in range(-600, 600):
        digits = csd_digits(v)
        assert sum(g << s for s, g in digits) == v
        shifts = [s for s, _ in digits]
        assert all(b - a >= 2 for a, b in zip(shifts, shifts[1:]))
        # No signed-digit form has fewer nonzero digits than the CSD one (the NAF).
        assert len(digits) <= bin(abs(v)).count("1")
    assert csd_digits(7) == [(0, -1), (3, 1)]
    assert csd_digits(0) == []


def _matrix(rng, n_out, n_in, bits, zeros):
    w = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (n_out, n_in))
    w[rng.random(w.shape) < zeros] = 0
    return w


@pytest.mark.parametrize("seed", range(12))
def test_adder_graph_equals_numpy(seed):
    rng = np.random.default_rng(seed)
    n_out, n_in = (int(v) for v in rng.integers(1, 20, 2))
    w = _matrix(rng, n_out, n_in, int(rng.integers(2, 9)), float(rng.random() * 0.6))
    lo, hi = (0, 63) if seed % 2 else (-128, 127)
    bias = rng.integers(-5000, 5000, n_out) if seed % 3 else None
    g = adder_graph(w, lo, hi, bias)
    x = rng.integers(lo, hi, (200, n_in), endpoint=True)
    x[0], x[1] = lo, hi
    want = x @ w.T + (0 if bias is None else bias)
    np.testing.assert_array_equal(g.evaluate(x), want)
    # The planned ranges hold every output (and are reached at the extremes for one sign).
    for o in range(n_out):
        olo, ohi = g.output_range(o)
        assert olo <= want[:, o].min() and want[:, o].max() <= ohi


def test_sharing_saves_adders_and_keeps_the_result():
    """A pruned 6-bit 32 x 32 matrix (as the jet tagger's): the shared graph needs at least a
    quarter fewer adders and LUTs than one tree per output, and computes the same."""
    rng = np.random.default_rng(5)
    w = _matrix(rng, 32, 32, 6, 0.4)
    plain = adder_graph(w, 0, 63, share=False)
    shared = adder_graph(w, 0, 63)
    digits = sum(len(csd_digits(v)) for v in w.ravel())
    nonzero_rows = int(np.count_nonzero(np.abs(w).sum(1)))
    assert len(plain.adders) == digits - nonzero_rows + sum(
        1 for v, _, g in plain.outputs if v >= 0 and g < 0)
    assert len(shared.adders) < 0.75 * len(plain.adders)
    assert shared.luts < 0.8 * plain.luts
    x = rng.integers(0, 64, (100, 32))
    np.testing.assert_array_equal(shared.evaluate(x), plain.evaluate(x))


def test_common_pair_becomes_one_adder():
    """Four outputs that all hold x0 + 2*x1: that sum is built once."""
    w = np.array([[1, 2, 0], [1, 2, 4], [-1, -2, 0], [2, 4, 1]])
    g = adder_graph(w, 0, 15)
    pairs = [op for op in g.adders if {op.a, op.b} == {0, 1}]
    assert len(pairs) == 1 and (pairs[0].shift_b, pairs[0].sign_b) == (1, 1)
    np.testing.assert_array_equal(g.evaluate(np.array([[3, 5, 7]])), [[13, 41, -13, 33]])


def test_adder_cost_skips_pass_through_bits():
    assert adder_cost(Adder(0, 0, 1, 1, 3, 1), 12) == 9        # a + (b << 3): 3 bits are a's
    assert adder_cost(Adder(0, 0, -1, 1, 3, 1), 12) == 12      # (b << 3) - a: all bits
    assert adder_cost(Adder(0, 0, 1, 1, 0, -1), 10) == 10
    assert adder_cost(Adder(0, 0, -1, -1, 0, 1), 9) == 9        # a negation


def test_schedule_counts_registers():
    w = np.array([[1, 1, 1, 1], [1, 0, 0, 0]])
    g = adder_graph(w, 0, 255)
    one, two = g.schedule(1), g.schedule(2)
    assert g.depth == 2 and one.depth == 2 and two.depth == 1
    # Inputs (4 x 8 bits) registered once; at one level per stage, two 9-bit sums, the 10-bit
    # output, and input 0 delayed twice for the second output.
    assert one.flip_flops == 4 * 8 + 2 * 9 + 10 + 2 * 8
    assert two.flip_flops == 4 * 8 + 10 + 8
    with pytest.raises(ValueError, match="levels_per_stage must be at least 1"):
        g.schedule(0)


# (in shape, n_in, n_out, weight bits, zeros, levels per stage, bias)
CORES = [
    (unsigned(6), 16, 8, 6, 0.4, 1, True),
    (signed(8), 10, 5, 4, 0.2, 2, False),
    (signed(4), 7, 12, 3, 0.0, 1, True),
    (unsigned(2), 24, 6, 2, 0.5, 3, False),
    (signed(8), 3, 4, 8, 0.0, 1, True),
]


@pytest.mark.parametrize("seed,case", list(enumerate(CORES)))
def test_core_matches_numpy_under_stalls(seed, case):
    shape, n_in, n_out, bits, zeros, levels, with_bias = case
    rng = np.random.default_rng(seed)
    w = _matrix(rng, n_out, n_in, bits, zeros)
    w[0] = 0                                   # a zero row: its bias (or 0) alone
    bias = rng.integers(-300, 300, n_out) if with_bias else None
    lo, hi = shape_range(shape)
    g = adder_graph(w, lo, hi, bias)
    out_lo = min(g.output_range(o)[0] for o in range(n_out))
    out_hi = max(g.output_range(o)[1] for o in range(n_out))
    dut = ConstMatVecCore(g, shape, signed(max(out_lo.bit_length(), out_hi.bit_length()) + 2),
                          levels)
    x = random_values(rng, shape, (40, n_in))
    x[0], x[1] = lo, hi
    got = run_stream(dut, [list(map(int, r)) for r in x], len(x), seed)
    want = x @ w.T + (0 if bias is None else bias)
    np.testing.assert_array_equal(np.array(got), want)


def test_core_full_rate_and_latency():
    rng = np.random.default_rng(7)
    w = _matrix(rng, 6, 9, 5, 0.2)
    g = adder_graph(w, 0, 15)
    dut = ConstMatVecCore(g, unsigned(4), signed(12), 1)
    x = rng.integers(0, 16, (20, 9))
    times = run_timed(dut, [list(map(int, r)) for r in x], 20)
    assert times["in"] == list(range(20))
    assert dut.latency == g.depth + 1
    assert times["out"] == [t + dut.latency for t in times["in"]]
    np.testing.assert_array_equal(np.array(times["out_items"]), x @ w.T)


def test_enable_shares():
    """A pipeline of more than ENABLE_SHARE_BITS flip-flops spreads its enables over copies of
    the skid flag."""
    from amaranth.back import rtlil
    rng = np.random.default_rng(3)
    w = _matrix(rng, 24, 24, 6, 0.3)
    g = adder_graph(w, 0, 63)
    dut = ConstMatVecCore(g, unsigned(6), signed(16), 1)
    assert g.schedule(1).flip_flops > 2 * ENABLE_SHARE_BITS
    text = rtlil.convert(dut)
    assert "skid_full_copy1" in text


def test_core_errors():
    g = adder_graph(np.array([[3, 1]]), 0, 15)
    with pytest.raises(ValueError, match=r"Output 0 ranges over \[0, 60\], beyond the "
                                         r"output shape"):
        ConstMatVecCore(g, unsigned(4), unsigned(5))
    with pytest.raises(ValueError, match=r"Input 0 of the graph covers \[0, 15\], not the "
                                         r"whole input shape"):
        ConstMatVecCore(g, signed(4), signed(8))
    with pytest.raises(TypeError, match="graph must be an AdderGraph"):
        ConstMatVecCore(np.eye(2), unsigned(4), unsigned(8))
