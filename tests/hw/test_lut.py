"""LutCore under random stalls against the golden model; tables become thresholds where
they are monotonic, and the planner folds the stages after a table into it."""

import numpy as np
import pytest
from amaranth import signed, unsigned

from onnx2fpga.hw.lut import LutCore
from onnx2fpga.ir.stages import LutStage, RequantStage, ThresholdStage
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan.builder import stage_cores, stream_stages
from onnx2fpga.plan.lut import lut_as_thresholds
from onnx2fpga.sim import golden
from tests.hw.test_cores import run_stream, run_timed, to_transfers
from tests.hw.test_threshold import shape_range

# (in_shape, channels, lanes, per_channel, out_type)
CASES = [
    (signed(8), 1, 1, False, IntType(8, True)),
    (unsigned(8), 6, 3, True, IntType(8, False)),       # two slots per lane
    (signed(4), 5, 1, True, IntType(3, True)),          # five slots
    (signed(6), 4, 4, True, IntType(6, False)),          # one channel per lane
    (unsigned(3), 3, 2, True, IntType(2, True)),         # tiny table, period 3
]


def random_table(rng, in_shape, rows, out_type):
    lo, hi = shape_range(in_shape)
    t = rng.integers(out_type.lo, out_type.hi, size=(rows, hi - lo + 1), endpoint=True)
    return LutStage(t, lo, out_type)


@pytest.mark.parametrize("seed,case", list(enumerate(CASES)))
def test_lut_matches_golden(seed, case):
    in_shape, channels, lanes, per_channel, out_type = case
    rng = np.random.default_rng(seed)
    stage = random_table(rng, in_shape, channels if per_channel else 1, out_type)
    dut = LutCore(stage, channels, lanes, in_shape)
    period = int(np.lcm(channels, lanes))
    n = period * max(2, 90 // period)
    lo, hi = shape_range(in_shape)
    x = rng.integers(lo, hi, size=n, endpoint=True)
    x[:2] = [lo, hi]
    expected = golden.lookup(x.reshape(-1, channels), stage).reshape(-1)
    got = run_stream(dut, to_transfers(x, lanes), n // lanes, seed)
    np.testing.assert_array_equal(np.array(got).reshape(-1), expected)


def test_lut_timing():
    in_shape, channels, lanes, _, out_type = CASES[1]
    stage = random_table(np.random.default_rng(3), in_shape, channels, out_type)
    dut = LutCore(stage, channels, lanes, in_shape)
    x = np.random.default_rng(4).integers(0, 255, size=12 * lanes, endpoint=True)
    times = run_timed(dut, to_transfers(x, lanes), 12)
    np.testing.assert_array_equal(np.array(times["out_items"]).reshape(-1),
                                  golden.lookup(x.reshape(-1, channels), stage).reshape(-1))
    assert dut.latency == 2
    np.testing.assert_array_equal(np.array(times["out"]) - np.array(times["in"]), 2)
    np.testing.assert_array_equal(np.diff(times["out"]), 1)


def test_lut_errors():
    st = LutStage([[1, 2], [3, 0]], 0, IntType(3, False))
    with pytest.raises(ValueError, match=r"^Table must have 1 or 3 rows, not 2$"):
        LutCore(st, 3, 1, unsigned(1))
    with pytest.raises(TypeError, match=r"^Stage must be a LutStage, not ThresholdStage\(.*\)$"):
        LutCore(ThresholdStage([[1]], 0, 1, IntType(2, False)), 1, 1, signed(8))
    with pytest.raises(ValueError, match=r"^Table entries 0\.\.9 must lie within uint3$"):
        LutStage([[0, 9]], 0, IntType(3, False))


def test_monotonic_tables_become_exact_thresholds():
    rng = np.random.default_rng(0)
    for rows, up in ((1, True), (4, True), (3, False)):
        steps = rng.integers(0, 3, size=(rows, 31))          # repeated levels and jumps
        t = np.cumsum(np.concatenate([rng.integers(0, 3, (rows, 1)), steps], axis=1), axis=1)
        t = t if up else 60 - t
        lut = LutStage(t, -16, IntType(8, True))
        th = lut_as_thresholds(lut)
        assert th is not None and th.step == (1 if up else -1)
        x = np.arange(-16, 16)
        xs = np.repeat(x[:, None], rows, axis=1)
        np.testing.assert_array_equal(golden.threshold(xs, th), golden.lookup(xs, lut))
    bumpy = LutStage([[0, 2, 1, 3]], 0, IntType(3, False))
    assert lut_as_thresholds(bumpy) is None
    # Channels going opposite ways cannot share one step.
    assert lut_as_thresholds(LutStage([[0, 1, 2], [2, 1, 0]], 0, IntType(2, False))) is None


def test_stage_cores_folds_stages_after_a_table_and_cuts_it_to_its_range():
    # A requantization clipping to 0..7 (a Relu), a non-monotonic table, another
    # requantization: the table reads only 0..7 and takes the last stage in.
    first = RequantStage([1], [0], 0, 0, 0, 7, IntType(8, True))
    table = np.array([[(v * v) % 11 - 5 for v in range(-128, 128)]])
    lut = LutStage(table, -128, IntType(8, True))
    after = RequantStage([3], [1], 1, 2, -128, 127, IntType(8, True))
    st, channels = stream_stages([first, lut, after], (4,), None)
    runs = stage_cores(st, IntType(16, True), channels)
    assert [k for k, _ in runs] == ["requant", "lut"]
    cut = runs[1][1][0]
    assert (cut.in_lo, cut.in_hi) == (0, 7)
    x = np.arange(-300, 300).reshape(-1, 4)
    want = golden.requant_stages(x, [first, lut, after])
    got = golden.requant_stages(x, [s for _, run in runs for s in run])
    np.testing.assert_array_equal(got, want)

def test_stage_cores_takes_thresholds_for_a_monotonic_table_of_up_to_255_levels():
    # An 8-bit Sigmoid: 246 thresholds, no memory.
    sig = 1 / (1 + np.exp(-np.arange(-128, 128) / 32))
    table = np.clip(np.rint(sig * 255) - 128, -128, 127).reshape(1, -1)
    lut = LutStage(table, -128, IntType(8, True))
    runs = stage_cores([lut], IntType(8, True), 1)
    assert [k for k, _ in runs] == ["threshold"]
    x = np.arange(-128, 128).reshape(-1, 1)
    np.testing.assert_array_equal(golden.requant_stages(x, runs[0][1]), golden.lookup(x, lut))
    # A 12-bit ramp would take 4095: looked up.
    ramp = LutStage(np.arange(-2048, 2048).reshape(1, -1), -2048, IntType(12, True))
    assert [k for k, _ in stage_cores([ramp], IntType(12, True), 1)] == ["lut"]


def test_stream_stages_per_channel_tables():
    # Per-channel rows of a (3, 2, 2) image travelling channels-last: period 3.
    t = np.arange(3 * 4).reshape(3, 4)
    lut = LutStage(t, 0, IntType(5, False))
    order = np.arange(12).reshape(3, 2, 2).transpose(1, 2, 0).reshape(-1)
    (st,), channels = stream_stages([lut], (3, 2, 2), order)
    assert channels == 3
    np.testing.assert_array_equal(st.table, t)


def test_per_channel_tables_on_an_image_stream_in_the_accelerator(tmp_path):
    # A QDQ CNN (onnxruntime's quantizer) with a PRelu of one slope per channel between two
    # convolutions: channels-last images through per-channel tables, against the golden
    # model, under stalls (Amaranth's simulator).
    import logging

    from onnx2fpga.frontend.load import load_model
    from onnx2fpga.frontend.lower import lower
    from onnx2fpga.frontend.qdq import normalize_qdq
    from onnx2fpga.frontend.resolve import resolve_geometry
    from onnx2fpga.hw.top import Accelerator
    from onnx2fpga.plan.fold import fold
    from onnx2fpga.plan.graph import plan_graph
    from tests.helpers.activations import act_cnn, ort_qdq
    from tests.helpers.models import save
    from tests.hw.test_top import pack, run_axi, unpack

    fp = save(act_cnn("PRelu"), tmp_path / "cnn.onnx")
    cal = np.random.default_rng(3).standard_normal((16, 1, 2, 6, 6)).astype(np.float32)
    logging.getLogger().setLevel(logging.ERROR)
    g = load_model(ort_qdq(fp, tmp_path / "q.onnx", cal))
    normalize_qdq(g)
    resolve_geometry(g)
    df = lower(g).dataflow
    fold(df, max_lanes=2)
    luts = [st for st in plan_graph(df).stages if st.kind == "lut"]
    assert len(luts) == 1 and luts[0].params["channels"] == 4
    inp, out = df.input, df.output
    x = np.random.default_rng(5).integers(inp.type.lo, inp.type.hi, size=(2, inp.size),
                                          endpoint=True)
    res = run_axi(Accelerator(df), pack(inp.to_stream(x), inp.type, inp.lanes),
                  2 * out.beats, seed=6, idle=0.2, stall=0.4)
    got = unpack([d for d, _, _ in res["out"]], out.type, out.lanes).reshape(2, -1)
    np.testing.assert_array_equal(out.from_stream(got), golden.run_dataflow(df, x))
