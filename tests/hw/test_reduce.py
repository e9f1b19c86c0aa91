"""WindowReduceCore in amaranth.sim against numpy (max / sum over the window), under random
stalls, at full rate against reduce_cycles / reduce_latency, and through the Verilog backend."""

import re

import numpy as np
import pytest
from amaranth import Fragment, signed, unsigned
from amaranth.back import verilog

from onnx2fpga.hw import reduce
from onnx2fpga.hw.reduce import WindowReduceCore
from onnx2fpga.hw.testing import run_stream, run_timed, shape_range, to_transfers
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan.reduce import REGISTER_FOLDS_MAX, reduce_cycles, reduce_latency


def make_groups(rng, shape, groups, window, channels):
    """``(groups, window, channels)`` inputs: all minimum, all maximum, the two extremes mixed,
    then uniform random values."""
    lo, hi = shape_range(shape)
    x = rng.integers(lo, hi, size=(groups, window, channels), endpoint=True)
    x[0] = lo
    x[1] = hi
    x[2] = rng.choice([lo, hi], size=(window, channels))
    return x


def reference(x, op):
    """The independent model: reduce over the window axis."""
    return np.max(x, axis=1) if op == "max" else np.sum(x, axis=1)


# (shape, channels, window, lanes, op)
REDUCE_CASES = [
    (signed(8), 8, 4, 2, "max"),               # 2x2 pool, 4 folds of 2 lanes
    (signed(8), 8, 4, 2, "sum"),
    (unsigned(4), 3, 9, 1, "max"),             # 3x3 pool, 3 folds of 1 lane
    (unsigned(4), 3, 9, 1, "sum"),
    (signed(3), 4, 49, 4, "sum"),              # global 7x7, one fold of 4 lanes
    (signed(3), 2, 49, 1, "max"),              # global 7x7, two folds
    (signed(8), 1, 9, 1, "sum"),               # one channel: every transfer hits fold 0
    (IntType(8, True), 6, 1, 3, "max"),        # window 1: no storage
    (unsigned(4), 5, 1, 1, "sum"),
    (IntType(1, True), 4, 4, 2, "sum"),        # int1: values -1 and 0
    (unsigned(4), 16, 4, 1, "sum"),            # the largest register file
    (signed(8), 64, 9, 2, "max"),              # memory: 32 folds
    (signed(8), 64, 4, 2, "sum"),
    (IntType(4, False), 34, 4, 2, "max"),      # memory: 17 folds
    (signed(8), 64, 49, 2, "sum"),             # memory, global 7x7
]


@pytest.mark.parametrize("seed,case", list(enumerate(REDUCE_CASES)))
def test_reduce_matches_numpy(seed, case):
    shape, channels, window, lanes, op = case
    dut = WindowReduceCore(shape, channels, window, lanes, op)
    expected_storage = ("none" if window == 1 else
                        "registers" if channels // lanes <= REGISTER_FOLDS_MAX else "memory")
    assert dut.storage == expected_storage
    groups = 4
    x = make_groups(np.random.default_rng(seed), shape, groups, window, channels)
    got = run_stream(dut, to_transfers(x, lanes), groups * channels // lanes, seed)
    np.testing.assert_array_equal(np.array(got).reshape(groups, channels), reference(x, op))


@pytest.mark.parametrize("seed,case", list(enumerate([
    (signed(8), 4, 4, 2, "max"),               # two folds: a fold is read again two
    (signed(3), 4, 9, 2, "sum"),               # transfers after it was written
    (unsigned(4), 3, 4, 1, "sum"),             # three folds: read two transfers ahead
    (signed(5), 3, 5, 1, "max"),
])))
def test_memory_with_few_folds(monkeypatch, seed, case):
    # The memory path at its tightest read-after-write spacing, which the default threshold
    # never builds: force memory from two folds on.
    monkeypatch.setattr(reduce, "REGISTER_FOLDS_MAX", 1)
    shape, channels, window, lanes, op = case
    dut = WindowReduceCore(shape, channels, window, lanes, op)
    assert dut.storage == "memory"
    groups = 4
    x = make_groups(np.random.default_rng(seed + 100), shape, groups, window, channels)
    got = run_stream(dut, to_transfers(x, lanes), groups * channels // lanes, seed + 100)
    np.testing.assert_array_equal(np.array(got).reshape(groups, channels), reference(x, op))
    times = run_timed(dut, to_transfers(x, lanes), groups * channels // lanes)
    np.testing.assert_array_equal(np.diff(times["in"]), 1)
    assert times["out"][channels // lanes - 1] - times["in"][0] == dut.latency


def narrowest(lo, hi):
    """The narrowest integer shape holding ``lo`` and ``hi``, by trying every width."""
    for width in range(1, 64):
        for shape in (unsigned(width), signed(width)):
            s_lo, s_hi = shape_range(shape)
            if s_lo <= lo and hi <= s_hi:
                return shape
    raise AssertionError("no shape")


@pytest.mark.parametrize("shape", [signed(8), unsigned(4), signed(3), unsigned(1),
                                   IntType(1, True), IntType(16, False)])
@pytest.mark.parametrize("window", [1, 2, 4, 9, 49, 50, 1024])
def test_out_shape(shape, window):
    lo, hi = shape_range(shape)
    dut = WindowReduceCore(shape, 2, window, op="sum")
    assert dut.out_shape == narrowest(window * lo, window * hi)
    assert dut.out_shape.signed == (lo < 0)
    assert dut.storage_bits == (0 if window == 1 else 2 * dut.out_shape.width)
    dut_max = WindowReduceCore(shape, 2, window, op="max")
    assert dut_max.out_shape == dut.in_shape
    for core in (dut, dut_max):       # every width elaborates (and the cores count as used)
        Fragment.get(core, None)


# (shape, channels, window, lanes, op)
TIMING_CASES = [
    (signed(8), 8, 4, 2, "max"),
    (unsigned(4), 3, 9, 1, "sum"),
    (signed(3), 4, 49, 4, "sum"),
    (signed(8), 1, 9, 1, "max"),
    (IntType(8, True), 6, 1, 3, "max"),
    (unsigned(4), 16, 4, 1, "sum"),
    (signed(8), 64, 4, 2, "sum"),
    (IntType(4, False), 34, 4, 2, "max"),
]


@pytest.mark.parametrize("case", TIMING_CASES)
def test_reduce_timing(case):
    shape, channels, window, lanes, op = case
    dut = WindowReduceCore(shape, channels, window, lanes, op)
    folds = channels // lanes
    groups = 4
    x = make_groups(np.random.default_rng(1), shape, groups, window, channels)
    times = run_timed(dut, to_transfers(x, lanes), groups * folds)
    np.testing.assert_array_equal(np.array(times["out_items"]).reshape(groups, channels),
                                  reference(x, op))
    t_in = np.array(times["in"]).reshape(groups, window, folds)
    t_out = np.array(times["out"]).reshape(groups, folds)
    # The input is never held up: one transfer per cycle throughout.
    np.testing.assert_array_equal(np.diff(times["in"]), 1)
    # Every output leaves two cycles after the last window position of its fold came in.
    np.testing.assert_array_equal(t_out - t_in[:, -1, :], 2)
    latency = t_out[0, -1] - t_in[0, 0, 0]
    assert latency == reduce_latency(channels, window, lanes) == dut.latency
    assert latency == window * folds + 1
    np.testing.assert_array_equal(np.diff(t_out[:, -1]), reduce_cycles(channels, window, lanes))
    assert dut.cycles == reduce_cycles(channels, window, lanes) == window * folds


@pytest.mark.parametrize("case", [(signed(8), 8, 4, 2, "sum"), (signed(8), 64, 4, 2, "max"),
                                  (unsigned(4), 2, 9, 2, "sum"), (signed(3), 1, 4, 1, "max")])
def test_accumulates_while_output_stalled(case):
    # With the output stalled, every transfer that is not of the last window position is still
    # taken; the first of the last position goes to the output register, the second waits in
    # the input register. With one fold, that second one belongs to the next group.
    shape, channels, window, lanes, op = case
    folds = channels // lanes
    dut = WindowReduceCore(shape, channels, window, lanes, op)
    groups = 3
    x = make_groups(np.random.default_rng(2), shape, groups, window, channels)
    delay = 2 * window * folds + 20
    times = run_timed(dut, to_transfers(x, lanes), groups * folds, delay=delay)
    np.testing.assert_array_equal(np.array(times["out_items"]).reshape(groups, channels),
                                  reference(x, op))
    position = np.repeat(np.tile(np.arange(window), groups), folds)   # of each transfer
    second_last = np.flatnonzero(position == window - 1)[1]
    assert sum(t < delay for t in times["in"]) == second_last + 1


@pytest.mark.parametrize("case,storage", [
    ((signed(8), 8, 4, 2, "max"), "registers"),
    ((signed(8), 64, 9, 2, "sum"), "memory"),
    ((unsigned(4), 6, 1, 3, "sum"), "none"),
])
def test_verilog(case, storage):
    dut = WindowReduceCore(*case)
    assert dut.storage == storage
    text = verilog.convert(dut, name="reduce")
    assert "module reduce" in text
    has_memory = re.search(r"reg \[\d+:0\] \S*acc_mem \[\d+:0\];", text) is not None
    assert has_memory == (storage == "memory")
    if storage == "memory":
        assert dut.storage_bits == 64 * dut.out_shape.width
        assert f"reg [{2 * dut.out_shape.width - 1}:0] acc_mem [31:0];" in text


def test_reduce_errors():
    with pytest.raises(ValueError, match=r"^Lanes must divide channels=6, not 4$"):
        WindowReduceCore(signed(8), 6, 4, 4)
    with pytest.raises(ValueError, match=r"^Window must be at least 1, not 0$"):
        WindowReduceCore(signed(8), 6, 0)
    with pytest.raises(TypeError, match=r"^Window must be an integer, not 2.5$"):
        WindowReduceCore(signed(8), 6, 2.5)
    with pytest.raises(ValueError, match=r"^Channels must be at least 1, not 0$"):
        WindowReduceCore(signed(8), 0, 4)
    with pytest.raises(ValueError, match=r"^Lanes must be at least 1, not 0$"):
        WindowReduceCore(signed(8), 4, 4, 0)
    with pytest.raises(ValueError, match=r"^Op must be 'max' or 'sum', not 'min'$"):
        WindowReduceCore(signed(8), 4, 4, op="min")
    with pytest.raises(TypeError, match=r"^Op must be a string, not None$"):
        WindowReduceCore(signed(8), 4, 4, op=None)
    with pytest.raises(TypeError, match=r"^Element shape must be an IntType or an integer "
                                        r"shape, not 'int8'$"):
        WindowReduceCore("int8", 4, 4)
    with pytest.raises(ValueError, match=r"^Lanes must divide channels=3, not 2$"):
        reduce_cycles(3, 4, 2)
    with pytest.raises(ValueError, match=r"^Window must be at least 1, not -1$"):
        reduce_latency(3, -1, 1)
