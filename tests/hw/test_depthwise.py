"""DepthwiseCore in amaranth.sim: behind a SlidingWindowCore against the golden depthwise
convolution under random stalls, alone at full rate against its cycle figures, Verilog, errors."""

import re

import numpy as np
import pytest
from amaranth import Elaboratable, Fragment, Module, signed, unsigned
from amaranth.back import verilog
from amaranth.lib import wiring

from onnx2fpga.hw import depthwise
from onnx2fpga.hw.depthwise import DepthwiseCore
from onnx2fpga.hw.testing import run_stream, run_timed, shape_range, to_transfers
from onnx2fpga.hw.window import SlidingWindowCore
from onnx2fpga.ir.layers import ConvLayer
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan.depthwise import depthwise_cycles, depthwise_latency
from onnx2fpga.plan.reduce import REGISTER_FOLDS_MAX
from onnx2fpga.sim import golden


class Chain(Elaboratable):
    """A SlidingWindowCore feeding a DepthwiseCore, with the chain's ends as its ports."""

    def __init__(self, window, dw):
        self.window, self.dw = window, dw
        self.i_stream, self.o_stream = window.i_stream, dw.o_stream

    def elaborate(self, platform):
        m = Module()
        m.submodules.window = self.window
        m.submodules.dw = self.dw
        wiring.connect(m, self.window.o_stream, self.dw.i_stream)
        return m


# ---------------------------------------------------------------------------------------------
# Behind a sliding window: a depthwise ONNX convolution


# (in_shape, channels, height, width, kernel, stride, dilation, pads, lanes, zero_point,
#  weight_bits)
CONV_CASES = {
    "1x1": (signed(8), 4, 3, 3, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 2, 0, 8),
    "3x3_pad1_uint8": (unsigned(8), 3, 5, 4, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, 128, 8),
    "3x3_stride2_lanes": (signed(8), 4, 6, 5, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 2, -3, 4),
    "5x5_pad2": (signed(4), 2, 6, 6, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2), 2, 0, 3),
    "3x3_dilation2": (unsigned(4), 2, 6, 6, (3, 3), (1, 1), (2, 2), (2, 2, 2, 2), 1, 7, 2),
    "2x3_asymmetric": (signed(6), 6, 4, 5, (2, 3), (2, 1), (1, 1), (0, 1, 1, 0), 3, 5, 5),
    "1d_k5": (signed(8), 2, 1, 9, (1, 5), (1, 1), (1, 1), (0, 2, 0, 2), 1, -1, 8),
    "lanes_equal_channels": (signed(8), 4, 4, 4, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 4, 2, 8),
    "memory_storage": (signed(8), 34, 3, 3, (2, 2), (1, 1), (1, 1), (0, 0, 1, 1), 2, 1, 6),
    "bipolar_weights": (unsigned(2), 2, 4, 4, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, 1, 0),
}


def make_conv(case, seed):
    """The chain of cores, the input images and the golden output for ``case``."""
    shape, channels, height, width, kernel, stride, dilation, pads, lanes, zp, wbits = case
    rng = np.random.default_rng([seed, 11])
    lo, hi = shape_range(shape)
    x = rng.integers(lo, hi, size=(2, channels, height, width), endpoint=True)
    x.flat[0], x.flat[-1] = lo, hi
    if wbits == 0:                                  # {-1, +1}
        w4 = rng.choice([-1, 1], size=(channels, 1) + kernel)
    else:
        w_lo, w_hi = -(1 << (wbits - 1)), (1 << (wbits - 1)) - 1
        w4 = rng.integers(w_lo, w_hi, size=(channels, 1) + kernel, endpoint=True)
        w4.flat[0], w4.flat[-1] = w_lo, w_hi
    bias = rng.integers(-1000, 1000, size=channels, endpoint=True)
    weight = w4.reshape(channels, -1)
    folded = bias - zp * weight.sum(axis=1)
    window = SlidingWindowCore(shape, channels, height, width, kernel, stride, dilation, pads,
                               lanes, zp)
    dw = DepthwiseCore(shape, channels, kernel[0] * kernel[1], weight, folded, lanes)
    expected = golden.conv(x, w4, bias, zp, stride=stride, dilation=dilation, pads=pads,
                           group=channels)
    # Channels-last, as the cores stream it.
    return Chain(window, dw), x, expected


@pytest.mark.parametrize("seed,name", list(enumerate(CONV_CASES)))
def test_depthwise_conv_matches_golden(seed, name):
    case = CONV_CASES[name]
    chain, x, expected = make_conv(case, seed)
    lanes = case[8]
    assert chain.dw.storage == ("memory" if name == "memory_storage" else
                                "none" if name == "1x1" else "registers")
    n_out = expected.size // lanes
    got = run_stream(chain, to_transfers(x.transpose(0, 2, 3, 1), lanes), n_out, seed)
    np.testing.assert_array_equal(np.array(got).reshape(-1),
                                  expected.transpose(0, 2, 3, 1).reshape(-1))


def test_depthwise_out_shape_is_conv_acc_type():
    # The output shape is the accumulator type the dataflow graph derives for the same
    # depthwise ConvLayer (zero point folded in, padding included).
    rng = np.random.default_rng(3)
    for in_type, zp in [(IntType(8, False), 128), (IntType(8, True), -5), (IntType(4, True), 0),
                        (IntType(3, False), 0), (IntType(2, False), 1)]:
        w4 = rng.integers(-7, 8, size=(3, 1, 3, 3))
        bias = rng.integers(-50, 50, size=3)
        layer = ConvLayer("dw", in_type, zp, (3, 5, 5), w4, IntType(4, True), bias, [],
                          pads=(1, 1, 1, 1), group=3)
        assert layer.depthwise
        weight = w4.reshape(3, -1)
        dw = DepthwiseCore(in_type, 3, 9, weight, bias - zp * weight.sum(1))
        assert dw.out_shape == signed(layer.acc_type.bits)
        Fragment.get(dw, None)              # elaborates (and counts as used)


# ---------------------------------------------------------------------------------------------
# Alone: the weighted sum, its range and its timing


def narrowest_signed(lo, hi):
    """The narrowest signed shape holding ``lo`` and ``hi``, by trying every width."""
    for width in range(1, 80):
        s_lo, s_hi = shape_range(signed(width))
        if s_lo <= lo and hi <= s_hi:
            return signed(width)
    raise AssertionError("no shape")


def reference(x, weight, bias):
    """``(groups, window, channels)`` inputs: the per-channel weighted sums plus bias."""
    return np.einsum("gkc,ck->gc", np.asarray(x, dtype=np.int64), weight) + bias


def extreme_groups(shape, weight, bias):
    """Inputs reaching each channel's largest and smallest result, and all minimum / all
    maximum values."""
    lo, hi = shape_range(shape)
    wt = weight.T                                           # (window, channels)
    return np.stack([np.where(wt > 0, hi, lo), np.where(wt > 0, lo, hi),
                     np.full(wt.shape, lo), np.full(wt.shape, hi)])


# (in_shape, channels, window, lanes, weight range)
ALONE_CASES = [
    (signed(8), 4, 9, 2, (-128, 127)),
    (unsigned(8), 3, 9, 1, (-128, 127)),
    (unsigned(4), 2, 25, 2, (0, 15)),              # unsigned weights: unsigned products
    (signed(4), 6, 1, 3, (-8, 7)),                 # window 1: no partial sums
    (unsigned(3), 2, 1, 2, (-2, 3)),               # window 1, one fold: one ROM word
    (IntType(1, True), 4, 4, 2, (-1, 1)),
    (signed(16), 2, 9, 1, (-32768, 32767)),        # wide operands
    (signed(8), 1, 9, 1, (-3, 3)),                 # one channel: every transfer is fold 0
    (signed(8), 16, 4, 1, (-128, 127)),            # the largest register file
    (signed(8), 34, 4, 1, (-128, 127)),            # memory: 34 folds
]


def make_alone(case, seed):
    shape, channels, window, lanes, (w_lo, w_hi) = case
    rng = np.random.default_rng([seed, 5])
    weight = rng.integers(w_lo, w_hi, size=(channels, window), endpoint=True)
    weight.flat[0], weight.flat[-1] = w_lo, w_hi
    bias = rng.integers(-300, 300, size=channels, endpoint=True)
    dut = DepthwiseCore(shape, channels, window, weight, bias, lanes)
    lo, hi = shape_range(shape)
    x = np.concatenate([extreme_groups(shape, weight, bias),
                        rng.integers(lo, hi, size=(2, window, channels), endpoint=True)])
    return dut, x, reference(x, weight, bias)


@pytest.mark.parametrize("seed,case", list(enumerate(ALONE_CASES)))
def test_depthwise_matches_numpy(seed, case):
    dut, x, expected = make_alone(case, seed)
    lanes = case[3]
    lo = int(expected[:2].min())
    hi = int(expected[:2].max())
    # The extremes are reached, and the output shape is the narrowest holding them.
    assert dut.out_shape == narrowest_signed(min(lo, -1), max(hi, 0))
    got = run_stream(dut, to_transfers(x, lanes), expected.size // lanes, seed)
    np.testing.assert_array_equal(np.array(got).reshape(expected.shape), expected)


@pytest.mark.parametrize("seed,case", [(0, ALONE_CASES[0]), (1, ALONE_CASES[1]),
                                       (6, ALONE_CASES[6])])
def test_depthwise_lut_multipliers(seed, case):
    # multipliers="lut": every product in LUTs, no MULT18X18D in yosys' reading of the
    # netlist; the same outputs on the same cycles as with hard multipliers.
    from onnx2fpga.hw.resources import netlist_features
    shape, channels, window, lanes, _ = case
    dut, x, expected = make_alone(case, seed)
    lut = DepthwiseCore(shape, channels, window, dut._weight, dut._bias, lanes,
                        multipliers="lut")
    n = expected.size // lanes
    t_dsp, t_lut = (run_timed(d, to_transfers(x, lanes), n) for d in (dut, lut))
    np.testing.assert_array_equal(np.array(t_lut["out_items"]).reshape(expected.shape),
                                  expected)
    assert (t_lut["in"], t_lut["out"]) == (t_dsp["in"], t_dsp["out"])
    assert netlist_features(dut, "ecp5")["dsp"] > 0
    assert netlist_features(lut, "ecp5")["dsp"] == 0
    with pytest.raises(ValueError, match=r"^Multipliers must be one of \('dsp', 'lut'\), "
                                         r"not 'soft'$"):
        DepthwiseCore(shape, channels, window, dut._weight, dut._bias, lanes,
                      multipliers="soft")


@pytest.mark.parametrize("seed,case", list(enumerate([
    (signed(8), 4, 4, 2, (-128, 127)),             # two folds: a fold is read again two
    (signed(3), 4, 9, 2, (-4, 3)),                 # transfers after it was written
    (unsigned(4), 3, 4, 1, (-2, 2)),               # three folds: read two stages ahead
])))
def test_depthwise_memory_with_few_folds(monkeypatch, seed, case):
    # The memory path at its tightest read-after-write spacing, which the default threshold
    # never builds: force memory from two folds on.
    monkeypatch.setattr(depthwise, "REGISTER_FOLDS_MAX", 1)
    dut, x, expected = make_alone(case, seed + 100)
    assert dut.storage == "memory"
    lanes = case[3]
    got = run_stream(dut, to_transfers(x, lanes), expected.size // lanes, seed + 100)
    np.testing.assert_array_equal(np.array(got).reshape(expected.shape), expected)
    times = run_timed(dut, to_transfers(x, lanes), expected.size // lanes)
    np.testing.assert_array_equal(np.array(times["out_items"]).reshape(expected.shape),
                                  expected)
    assert times["out"][dut.folds - 1] - times["in"][0] == dut.latency


@pytest.mark.parametrize("case", ALONE_CASES)
def test_depthwise_timing(case):
    dut, x, expected = make_alone(case, 1)
    shape, channels, window, lanes, _ = case
    folds = channels // lanes
    groups = len(x)
    times = run_timed(dut, to_transfers(x, lanes), groups * folds)
    np.testing.assert_array_equal(np.array(times["out_items"]).reshape(expected.shape),
                                  expected)
    t_in = np.array(times["in"]).reshape(groups, window, folds)
    t_out = np.array(times["out"]).reshape(groups, folds)
    # One input transfer per cycle throughout; each output three cycles after the last window
    # position of its fold came in.
    np.testing.assert_array_equal(np.diff(times["in"]), 1)
    np.testing.assert_array_equal(t_out - t_in[:, -1, :], 3)
    latency = t_out[0, -1] - t_in[0, 0, 0]
    assert latency == dut.latency == depthwise_latency(channels, window, lanes)
    assert latency == window * folds + 2
    np.testing.assert_array_equal(np.diff(t_out[:, -1]), dut.cycles)
    assert dut.cycles == depthwise_cycles(channels, window, lanes) == window * folds


@pytest.mark.parametrize("case", [(signed(8), 8, 4, 2, (-5, 5)), (signed(8), 34, 4, 2, (-5, 5)),
                                  (unsigned(4), 2, 9, 2, (0, 3)), (signed(3), 1, 4, 1, (-1, 1))])
def test_depthwise_accumulates_while_output_stalled(case):
    # With the output stalled, every transfer that is not of the last window position is still
    # taken; the first of the last position goes to the output register and on to its skid
    # register, the second to the output register, the next one into stage 2 and one more
    # into stage 1, where they wait.
    dut, x, expected = make_alone(case, 2)
    _, channels, window, lanes, _ = case
    folds = channels // lanes
    delay = 2 * window * folds + 20
    times = run_timed(dut, to_transfers(x, lanes), len(x) * folds, delay=delay)
    np.testing.assert_array_equal(np.array(times["out_items"]).reshape(expected.shape),
                                  expected)
    position = np.repeat(np.tile(np.arange(window), len(x)), folds)   # of each transfer
    third_last = np.flatnonzero(position == window - 1)[2]
    assert sum(t < delay for t in times["in"]) == third_last + 2


def test_depthwise_properties():
    weight = np.arange(-12, 12).reshape(4, 6)
    dut = DepthwiseCore(IntType(8, False), 4, 6, weight, [1, 2, 3, 4], lanes=2)
    assert dut.folds == 2 and dut.window == 6 and dut.channels == 4 and dut.lanes == 2
    assert dut.weight_shape == signed(5)
    assert dut.storage == "registers"
    assert dut.weight_bits == 6 * 4 * 5
    assert dut.bias_bits == 4 * dut.out_shape.width
    assert dut.storage_bits == 4 * dut.out_shape.width
    assert dut.memory_bits == dut.weight_bits + dut.bias_bits       # partial sums: registers
    np.testing.assert_array_equal(dut.weight, weight)
    one_fold = DepthwiseCore(signed(8), 2, 1, [[3], [-1]], [0, 0], lanes=2)
    assert one_fold.storage == "none" and one_fold.bias_bits == 0 and one_fold.storage_bits == 0
    assert one_fold.memory_bits == 2 * signed(3).width
    big = DepthwiseCore(signed(8), 2 * (REGISTER_FOLDS_MAX + 1), 4,
                        np.ones((2 * (REGISTER_FOLDS_MAX + 1), 4), dtype=np.int64),
                        np.zeros(2 * (REGISTER_FOLDS_MAX + 1), dtype=np.int64), lanes=2)
    assert big.storage == "memory"
    assert big.memory_bits == big.weight_bits + big.bias_bits + big.storage_bits
    for core in (dut, one_fold, big):
        Fragment.get(core, None)


def test_depthwise_verilog():
    weight = np.arange(36).reshape(4, 9) - 18
    dut = DepthwiseCore(signed(8), 4, 9, weight, [5, -5, 0, 1], lanes=2)
    text = verilog.convert(dut, name="depthwise")
    assert "module depthwise(" in text
    # The weight ROM: one word of two 6-bit weights per window position and fold.
    assert re.search(r"reg \[11:0\] w_rom \[17:0\]", text) is not None


def test_depthwise_errors():
    w = np.ones((4, 9), dtype=np.int64)
    b = np.zeros(4, dtype=np.int64)
    with pytest.raises(ValueError, match=r"^Weight must have shape \(4, 9\), not \(4, 3, 3\)$"):
        DepthwiseCore(signed(8), 4, 9, w.reshape(4, 3, 3), b)
    with pytest.raises(ValueError, match=r"^Bias must have shape \(4,\), not \(1, 4\)$"):
        DepthwiseCore(signed(8), 4, 9, w, b.reshape(1, 4))
    with pytest.raises(TypeError, match=r"^Weight must be an array of integers, not of dtype "
                                        r"float64$"):
        DepthwiseCore(signed(8), 4, 9, w * 0.5, b)
    with pytest.raises(TypeError, match=r"^Bias must be an array of integers, not of dtype "
                                        r"bool$"):
        DepthwiseCore(signed(8), 4, 9, w, b > 0)
    with pytest.raises(ValueError, match=r"^Lanes must divide channels=4, not 3$"):
        DepthwiseCore(signed(8), 4, 9, w, b, lanes=3)
    with pytest.raises(ValueError, match=r"^Window must be at least 1, not 0$"):
        DepthwiseCore(signed(8), 4, 0, w[:, :0], b)
    with pytest.raises(TypeError, match=r"^Channels must be an integer, not 4.0$"):
        DepthwiseCore(signed(8), 4.0, 9, w, b)
    with pytest.raises(TypeError, match=r"^Element shape must be an IntType or an integer "
                                        r"shape, not 'int8'$"):
        DepthwiseCore("int8", 4, 9, w, b)
    with pytest.raises(ValueError, match=r"^Lanes must divide channels=3, not 2$"):
        depthwise_cycles(3, 9, 2)
    with pytest.raises(ValueError, match=r"^Window must be at least 1, not -1$"):
        depthwise_latency(3, -1)
