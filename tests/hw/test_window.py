"""SlidingWindowCore tests: windows against an independent numpy reference, under random
stalls, and the cycle model against the simulated cycles."""

import numpy as np
import pytest
from amaranth import signed, unsigned
from amaranth.back import verilog
from amaranth.hdl import Fragment

from onnx2fpga.hw.testing import (
    image_transfers,
    random_images,
    run_stream,
    run_timed,
    simulate,
    stream_send,
    timed_receiver,
)
from onnx2fpga.hw.window import SlidingWindowCore
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan.window import WindowGeometry, window_cycles, window_latency

# Cycles the output may take at most in each traffic phase (hw.testing's default is 100 000).
TIMEOUT = 1_000_000


# ---------------------------------------------------------------------------------------------
# Independent reference: pad the NCHW image with np.pad and slice every window.


def reference_windows(x, kernel, stride, dilation, pads, pad_value, lanes):
    """The expected output transfers for images ``x[n, c, h, w]``: rows of ``lanes`` values."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    top, left, bottom, right = pads
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=pad_value)
    ext_h, ext_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    out_h = (xp.shape[2] - ext_h) // sh + 1
    out_w = (xp.shape[3] - ext_w) // sw + 1
    beats = []
    for image in xp:
        for oh in range(out_h):
            for ow in range(out_w):
                window = image[:, oh * sh:oh * sh + ext_h:dh, ow * sw:ow * sw + ext_w:dw]
                assert window.shape[1:] == (kh, kw)
                # Order (ki, kj, c): channels innermost, cut into transfers of `lanes`.
                beats.append(window.transpose(1, 2, 0).reshape(-1, lanes))
    return np.concatenate(beats)


def test_reference_matches_onnx_definition():
    # The reference against the ONNX formula written out element by element.
    rng = np.random.default_rng(0)
    x = rng.integers(0, 100, size=(1, 2, 5, 4))
    kernel, stride, dilation, pads = (2, 3), (2, 1), (2, 1), (1, 0, 2, 1)
    got = reference_windows(x, kernel, stride, dilation, pads, -1, 1).reshape(-1)
    expected = []
    for oh in range(3):             # (5 + 1 + 2 - 3) // 2 + 1
        for ow in range(3):         # (4 + 0 + 1 - 3) // 1 + 1
            for ki in range(2):
                for kj in range(3):
                    for c in range(2):
                        ih, iw = oh * 2 - 1 + ki * 2, ow - 0 + kj
                        inside = 0 <= ih < 5 and 0 <= iw < 4
                        expected.append(x[0, c, ih, iw] if inside else -1)
    np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------------------------------------
# Windows under random stalls

# (shape, channels, height, width, kernel, stride, dilation, pads, lanes, pad_value,
#  buffer_rows, inferences)
WINDOW_CASES = {
    "3x3_pad1": (signed(8), 2, 5, 6, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, 0, None, 3),
    "5x5_pad2": (IntType(8, False), 1, 9, 7, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2), 1, 0,
                 None, 2),
    "3x3_stride2": (signed(6), 3, 7, 8, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 3, -5, None, 3),
    "dilation2": (unsigned(5), 2, 7, 6, (3, 3), (1, 1), (2, 2), (2, 2, 2, 2), 2, 31, None, 2),
    "asymmetric_pads": (signed(8), 2, 5, 5, (2, 2), (2, 2), (1, 1), (0, 1, 1, 0), 1, -128,
                        None, 3),
    "pads_beyond_kernel": (signed(4), 2, 4, 3, (2, 2), (2, 3), (1, 1), (3, 1, 4, 5), 2, 5,
                           None, 2),
    "kernel7": (unsigned(4), 1, 9, 8, (7, 7), (1, 1), (1, 1), (1, 2, 0, 1), 1, 9, None, 2),
    "global_window": (signed(8), 4, 4, 5, (4, 5), (1, 1), (1, 1), (0, 0, 0, 0), 2, 0, None, 3),
    "1d": (IntType(3, True), 3, 1, 12, (1, 3), (1, 1), (1, 1), (0, 1, 0, 1), 1, -4, None, 3),
    "lanes_folds": (unsigned(3), 8, 5, 4, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 2, 7, None, 2),
    "maxpool_3x3_s3": (signed(8), 4, 6, 6, (3, 3), (3, 3), (1, 1), (0, 0, 0, 0), 2, -128,
                       None, 3),
    "rect_mixed": (signed(7), 4, 6, 5, (2, 3), (2, 1), (1, 2), (0, 1, 1, 0), 2, 3, None, 3),
    "1x1_stride2_skip_rows": (unsigned(8), 3, 7, 5, (1, 1), (2, 2), (1, 1), (0, 0, 0, 0), 3,
                              0, None, 3),
    "min_buffer": (signed(8), 2, 5, 4, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, 1, 3, 3),
    "min_buffer_global": (unsigned(2), 2, 3, 3, (3, 3), (1, 1), (1, 1), (0, 0, 0, 0), 1, 3, 3,
                          3),
    "one_pixel": (unsigned(1), 1, 1, 1, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1, 1, 1, 3),
}


def make_core(case):
    shape, channels, height, width, kernel, stride, dilation, pads, lanes, pad_value, \
        buffer_rows, _ = case
    return SlidingWindowCore(shape, channels, height, width, kernel, stride, dilation, pads,
                             lanes, pad_value, buffer_rows=buffer_rows)


def case_data(case, seed, inferences):
    shape, channels, height, width, kernel, stride, dilation, pads, lanes, pad_value, \
        _, _ = case
    x = random_images(np.random.default_rng([seed, 0]), shape, inferences, channels, height,
                      width)
    expected = reference_windows(x, kernel, stride, dilation, pads, pad_value, lanes)
    return image_transfers(x, lanes), expected


@pytest.mark.parametrize("seed,name", list(enumerate(WINDOW_CASES)))
def test_window_matches_reference(seed, name):
    case = WINDOW_CASES[name]
    dut = make_core(case)
    inferences = case[-1]
    items, expected = case_data(case, seed, inferences)
    assert len(items) == inferences * dut.in_beats
    assert len(expected) == inferences * dut.out_beats
    got = run_stream(dut, items, len(expected), seed, timeout=TIMEOUT)
    np.testing.assert_array_equal(np.array(got), expected)


@pytest.mark.parametrize("name", ["3x3_pad1", "3x3_stride2", "pads_beyond_kernel",
                                  "lanes_folds", "min_buffer", "one_pixel"])
def test_window_read_register(name):
    """``read_register``: the same transfers as the plain core under random stalls; at full
    rate every output transfer one cycle later and every input transfer at the same cycle;
    the latency one more."""
    case = WINDOW_CASES[name]
    shape, channels, height, width, kernel, stride, dilation, pads, lanes, pad_value, \
        buffer_rows, inferences = case

    def core(read_register):
        return SlidingWindowCore(shape, channels, height, width, kernel, stride, dilation, pads,
                                 lanes, pad_value, buffer_rows=buffer_rows,
                                 read_register=read_register)

    items, expected = case_data(case, 7, inferences)
    got = run_stream(core(True), items, len(expected), 7, timeout=TIMEOUT)
    np.testing.assert_array_equal(np.array(got), expected)
    plain, registered = (run_timed(core(r), items, len(expected), timeout=TIMEOUT)
                         for r in (False, True))
    np.testing.assert_array_equal(registered["out_items"], expected)
    np.testing.assert_array_equal(registered["in"], plain["in"])
    np.testing.assert_array_equal(np.array(registered["out"]), np.array(plain["out"]) + 1)
    assert core(True).latency == core(False).latency + 1


def test_window_random_geometries():
    # Small random geometries, each under random stalls and at full rate against the model.
    rng = np.random.default_rng(2024)
    done = 0
    while done < 6:
        lanes = int(rng.choice([1, 2, 3]))
        channels = lanes * int(rng.integers(1, 3))
        height, width = (int(v) for v in rng.integers(1, 7, size=2))
        kernel, stride, dilation = ((int(a), int(b)) for a, b in rng.integers(1, [5, 4, 3],
                                                                              size=(2, 3)).T)
        pads = tuple(int(v) for v in rng.integers(0, 4, size=4))
        try:
            geom = WindowGeometry.make(channels, height, width, kernel, stride, dilation, pads,
                                       lanes)
        except ValueError:
            continue
        if geom.out_beats > 600:
            continue
        buffer_rows = int(rng.integers(geom.min_rows, geom.rows + 1)) if done % 2 else None
        case = (signed(5), channels, height, width, kernel, stride, dilation, pads, lanes,
                int(rng.integers(-16, 16)), buffer_rows, 2)
        dut = make_core(case)
        items, expected = case_data(case, done, 2)
        got = run_stream(dut, items, len(expected), done, timeout=TIMEOUT)
        np.testing.assert_array_equal(np.array(got), expected, err_msg=repr(case))
        check_timing(case, seed=done)
        done += 1


# ---------------------------------------------------------------------------------------------
# Cycles and latency


def check_timing(case, seed=0):
    """Run back-to-back inferences at full rate; the transfer cycles must be the model's."""
    dut = make_core(case)
    geom = dut.geometry
    inferences = max(2, geom.rows // geom.height + 3)       # past the start-up transient
    items, expected = case_data(case, seed, inferences)
    times = run_timed(dut, items, len(expected), timeout=TIMEOUT)
    np.testing.assert_array_equal(np.array(times["out_items"]), expected)
    t_in, t_out = np.array(times["in"]), np.array(times["out"])
    assert t_in[0] == 0
    # Every input row and every output row ends in the cycle the row-level model says.
    in_end, out_end = geom.timeline(inferences)
    row_words = geom.width * geom.folds
    np.testing.assert_array_equal(t_in[row_words - 1::row_words], in_end)
    np.testing.assert_array_equal(t_out[geom.row_beats - 1::geom.row_beats], out_end)
    # Output rows go out one transfer per cycle.
    np.testing.assert_array_equal(np.diff(t_out.reshape(-1, geom.row_beats), axis=1), 1)
    ends = t_out[dut.out_beats - 1::dut.out_beats]
    latency = ends[0] - t_in[0]
    assert latency == dut.latency == geom.latency
    steady = np.diff(ends)[-1]
    assert steady == dut.cycles == geom.cycles
    return dut, latency, steady


TIMED_CASES = ["3x3_pad1", "3x3_stride2", "dilation2", "asymmetric_pads", "pads_beyond_kernel",
               "kernel7", "global_window", "1d", "lanes_folds", "maxpool_3x3_s3", "rect_mixed",
               "1x1_stride2_skip_rows", "min_buffer", "min_buffer_global"]


@pytest.mark.parametrize("name", TIMED_CASES)
def test_window_timing(name):
    case = WINDOW_CASES[name]
    dut, latency, steady = check_timing(case)
    _, channels, height, width, kernel, stride, dilation, pads, lanes, _, buffer_rows, _ = case
    assert window_latency(channels, height, width, kernel, stride, dilation, pads, lanes,
                          buffer_rows) == latency
    assert window_cycles(channels, height, width, kernel, stride, dilation, pads, lanes,
                         buffer_rows) == steady
    if buffer_rows is None:      # default buffer: writing and reading overlap fully
        assert steady == max(dut.in_beats, dut.out_beats)
    else:                        # the smallest buffer still works, only slower
        assert steady > max(dut.in_beats, dut.out_beats)


@pytest.mark.parametrize("name, idle", [("3x3_pad1", 0.8), ("3x3_stride2", 0.5), ("1d", 0.8),
                                        ("lanes_folds", 0.3), ("maxpool_3x3_s3", 0.8),
                                        ("1x1_stride2_skip_rows", 0.8), ("kernel7", 0.6)])
def test_window_follows_a_paced_input(name, idle):
    """Input at an irregular pace (as a slower core before it delivers): every output transfer
    leaves in the cycle :meth:`WindowGeometry.follow` computes from the input transfers' cycles
    (the latency model's trace of the window)."""
    dut = make_core(WINDOW_CASES[name])
    items, expected = case_data(WINDOW_CASES[name], 0, 1)
    times = {}

    async def send(ctx):
        times["in"] = await stream_send(ctx, dut.i_stream, items,
                                        rng=np.random.default_rng(5), idle=idle)

    simulate(dut, send, timed_receiver(dut.o_stream, len(expected), times, "out",
                                       timeout=TIMEOUT))
    np.testing.assert_array_equal(np.array(times["out_items"]), expected)
    np.testing.assert_array_equal(times["out"], dut.geometry.follow(np.array(times["in"])))


# Layers of realistic networks: (channels, height, width, kernel, stride, pads, lanes)
REALISTIC = {
    "mnist_conv1_28x28x1_5x5": (1, 28, 28, (5, 5), (1, 1), (2, 2, 2, 2), 1),
    "conv_14x14x8_5x5": (8, 14, 14, (5, 5), (1, 1), (2, 2, 2, 2), 1),
    "conv_32x32x16_3x3": (16, 32, 32, (3, 3), (1, 1), (1, 1, 1, 1), 1),
    "conv_32x32x16_3x3_s2": (16, 32, 32, (3, 3), (2, 2), (1, 1, 1, 1), 1),
    "maxpool_6x6x16_3x3_s3": (16, 6, 6, (3, 3), (3, 3), (0, 0, 0, 0), 1),
    "maxpool_28x28x8_2x2_s2": (8, 28, 28, (2, 2), (2, 2), (0, 0, 0, 0), 2),
    "maxpool_ceil_7x7x4_2x2_s2": (4, 7, 7, (2, 2), (2, 2), (0, 0, 1, 1), 1),
    "resnet_stem_224x224x3_7x7_s2": (3, 224, 224, (7, 7), (2, 2), (3, 3, 3, 3), 3),
    "pointwise_16x16x32": (32, 16, 16, (1, 1), (1, 1), (0, 0, 0, 0), 4),
    "conv1d_1x100x4_k5": (4, 1, 100, (1, 5), (1, 1), (0, 2, 0, 2), 2),
}


@pytest.mark.parametrize("name", list(REALISTIC))
def test_window_cycles_realistic(name):
    channels, height, width, kernel, stride, pads, lanes = REALISTIC[name]
    geom = WindowGeometry.make(channels, height, width, kernel, stride, (1, 1), pads, lanes)
    # Full overlap: exactly as many cycles as the busier side has transfers.
    cycles = window_cycles(channels, height, width, kernel, stride, pads=pads, lanes=lanes)
    assert cycles == max(geom.in_beats, geom.out_beats)
    # The first window waits for the rows above its bottom edge, then the reader runs free.
    rows0 = min(height, kernel[0] - pads[0])
    latency = window_latency(channels, height, width, kernel, stride, pads=pads, lanes=lanes)
    assert latency == rows0 * width * geom.folds + geom.out_beats
    # The line buffer holds the window's rows plus the stride's (2 * height for 1-D), so less
    # than the image unless the image is only that tall.
    assert geom.rows == min(kernel[0] + stride[0], 2 * height)
    assert geom.rows < height or kernel[0] + stride[0] >= height
    assert geom.buffer_depth == geom.rows * width * (channels // lanes)


@pytest.mark.parametrize("name", ["conv_14x14x8_5x5", "conv_32x32x16_3x3_s2",
                                  "maxpool_6x6x16_3x3_s3"])
def test_window_timing_realistic(name):
    # Simulated, with lanes = channels where the beat count would make the simulation slow.
    channels, height, width, kernel, stride, pads, lanes = REALISTIC[name]
    if height > 8:
        lanes = channels
    case = (signed(8), channels, height, width, kernel, stride, (1, 1), pads, lanes, 0, None, 0)
    dut, _, steady = check_timing(case)
    assert steady == max(dut.in_beats, dut.out_beats)


# ---------------------------------------------------------------------------------------------
# Properties, Verilog, errors


def test_window_properties():
    dut = SlidingWindowCore(IntType(8, True), 6, 9, 7, (3, 5), (2, 1), (1, 2), (1, 4, 2, 0),
                            lanes=3, pad_value=-1)
    assert (dut.out_height, dut.out_width) == ((9 + 3 - 3) // 2 + 1, (7 + 4 - 9) // 1 + 1)
    assert dut.folds == 2
    assert dut.in_beats == 9 * 7 * 2
    assert dut.out_beats == dut.out_height * dut.out_width * 15 * 2
    assert dut.buffer_rows == 3 + 2
    assert dut.buffer_depth == 5 * 7 * 2
    assert dut.buffer_width == 3 * 8
    assert dut.buffer_bits == dut.buffer_depth * 24
    assert dut.shape == signed(8) and dut.pad_value == -1
    assert dut.geometry.min_rows == 3
    small = SlidingWindowCore(signed(8), 6, 9, 7, (3, 5), (2, 1), (1, 2), (1, 4, 2, 0), lanes=3,
                              buffer_rows=3)
    assert small.buffer_depth == 3 * 7 * 2
    assert small.cycles > dut.cycles == max(dut.in_beats, dut.out_beats)
    for core in (dut, small):
        Fragment.get(core, None)            # elaborates


def test_window_verilog():
    dut = SlidingWindowCore(signed(8), 4, 6, 5, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), lanes=2,
                            pad_value=-3)
    text = verilog.convert(dut, name="window")
    assert "module window(" in text
    # The line buffer stays one memory of buffer_depth words (block RAM for yosys).
    assert f"reg [15:0] \\buf  [{dut.buffer_depth - 1}:0];" in text


def test_window_errors():
    def make(**kw):
        args = dict(shape=signed(8), channels=4, height=5, width=5, kernel=(3, 3))
        args.update(kw)
        return SlidingWindowCore(**args)

    with pytest.raises(ValueError, match=r"^Lanes must divide channels=6, not 4$"):
        make(channels=6, lanes=4)
    with pytest.raises(ValueError, match=r"^Lanes must be at least 1, not 0$"):
        make(lanes=0)
    with pytest.raises(ValueError, match=r"^Output height must be at least 1, not 0: kernel "
                                         r"height extent 7 \(kernel 4, dilation 2\) exceeds "
                                         r"the padded input height 5 \+ 1 \+ 0$"):
        make(kernel=(4, 1), dilation=(2, 1), pads=(1, 0, 0, 0))
    with pytest.raises(ValueError, match=r"^Output width must be at least 1, not 0: kernel "
                                         r"width extent 6 \(kernel 6, dilation 1\) exceeds "
                                         r"the padded input width 5 \+ 0 \+ 0$"):
        make(kernel=(1, 6), stride=(1, 3))
    with pytest.raises(ValueError, match=r"^Pad value must lie within \[-8, 7\] of the element "
                                         r"shape signed\(4\), not 8$"):
        make(shape=signed(4), pad_value=8)
    with pytest.raises(ValueError, match=r"^Pad value must lie within \[0, 15\] of the element "
                                         r"shape unsigned\(4\), not -1$"):
        make(shape=IntType(4, False), pad_value=-1)
    with pytest.raises(TypeError, match=r"^Pad value must be an integer, not 0.5$"):
        make(pad_value=0.5)
    with pytest.raises(TypeError, match=r"^Kernel must be a pair of integers \(height, width\), "
                                        r"not 3$"):
        make(kernel=3)
    with pytest.raises(TypeError, match=r"^Kernel must be a pair of integers \(height, width\), "
                                        r"not \(3, 3, 3\)$"):
        make(kernel=(3, 3, 3))
    with pytest.raises(ValueError, match=r"^Kernel must be at least 1 in both dimensions, "
                                         r"not \(0, 3\)$"):
        make(kernel=(0, 3))
    with pytest.raises(ValueError, match=r"^Stride must be at least 1 in both dimensions, "
                                         r"not \(1, 0\)$"):
        make(stride=(1, 0))
    with pytest.raises(TypeError, match=r"^Dilation must be a pair of integers \(height, "
                                        r"width\), not \(1.5, 1\)$"):
        make(dilation=(1.5, 1))
    with pytest.raises(TypeError, match=r"^Pads must be four integers \(top, left, bottom, "
                                        r"right\), not \(1, 1\)$"):
        make(pads=(1, 1))
    with pytest.raises(ValueError, match=r"^Pads must not be negative, not \(0, -1, 0, 0\)$"):
        make(pads=(0, -1, 0, 0))
    with pytest.raises(ValueError, match=r"^Channels must be at least 1, not 0$"):
        make(channels=0)
    with pytest.raises(TypeError, match=r"^Height must be an integer, not '5'$"):
        make(height="5")
    with pytest.raises(ValueError, match=r"^Width must be at least 1, not 0$"):
        make(width=0)
    with pytest.raises(ValueError, match=r"^Buffer rows must be at least 3 \(the input rows one "
                                         r"output row reads\), not 2$"):
        make(buffer_rows=2)
    with pytest.raises(TypeError, match=r"^Element shape must be an IntType or an integer "
                                        r"shape, not 'int8'$"):
        make(shape="int8")
    with pytest.raises(ValueError, match=r"^Lanes must divide channels=6, not 4$"):
        window_cycles(6, 5, 5, (3, 3), lanes=4)
    with pytest.raises(ValueError, match=r"^Kernel must be at least 1 in both dimensions"):
        window_latency(6, 5, 5, (3, -1))


@pytest.mark.rtl
@pytest.mark.parametrize("kind, windows, queues, branches",
                         [("residual", 2, 2, 1), ("avgpool", 2, 0, 0)])
def test_bram_registers_take_one_cycle_each(tmp_path, kind, windows, queues, branches):
    """``Dataflow.bram_registers`` (set for ECP5 boards): a second register behind every
    window's line buffer read, two two-transfer buffers behind its output, a pipeline
    register behind every queue in block RAM (two in the residual net) and a skid buffer in
    front of one on a broadcast's branch (the residual net's skip queue).
    The model's latency grows by one per register on its longest path, its cycles per
    inference not; the RTL under stalls equals golden, and its figures are the model's."""
    import onnx2fpga
    from onnx2fpga.hw.emit import emit_verilog
    from onnx2fpga.plan import cost
    from onnx2fpga.plan.fold import fold
    from onnx2fpga.plan.graph import plan_graph
    from onnx2fpga.sim.golden import run_dataflow
    from onnx2fpga.sim.rtl import simulate_rtl
    from tests.helpers.models import ort_qdq_cnn

    path, _ = ort_qdq_cnn(tmp_path, kind=kind)
    figures, dfs = {}, {}
    for regs in (False, True):
        df = onnx2fpga.compile(path, stop_after="lower").design.dataflow
        df.bram_registers = regs
        fold(df)
        dfs[regs], figures[regs] = df, cost.dataflow_cycles(df)
    stages = plan_graph(dfs[True]).stages
    by_name = {s.name: s for s in stages}
    skids = [s for s in stages if s.params.get("pipeline") and s.name.endswith("_in")]
    assert len(skids) == branches
    for s in skids:     # between a broadcast and the queue in block RAM it feeds
        queue = by_name[s.name.removesuffix("_in")]
        assert queue.inputs == s.outputs and queue.params["out_register"]
        assert any(b.kind == "broadcast" and s.inputs[0] in b.outputs for b in stages)
        assert s.params["depth"] == 2 and not s.params.get("in_register")
    windowed = [s for s in stages if s.params.get("pipeline") and s not in skids]
    assert [s.name for s in windowed] == \
        [f"{s.name}_{r}" for s in stages if s.kind == "window" for r in ("rd", "reg")]
    assert [s.params["depth"] for s in windowed] == [2, 2] * windows
    # The first takes the line buffer's read into registers with no multiplexer in front.
    assert [s.params["in_register"] for s in windowed] == [True, False] * windows
    assert sum(s.kind == "window" for s in stages) == windows
    assert sum(bool(s.params.get("out_register")) for s in stages) == queues
    assert not any(s.params.get("pipeline") or s.params.get("out_register")
                   for s in plan_graph(dfs[False]).stages)
    # Every window reads its line buffer through a second register (the block RAM's output
    # register on ECP5).
    assert all(s.params.get("read_register") for s in stages if s.kind == "window")
    grown = figures[True]["latency_cycles"] - figures[False]["latency_cycles"]
    assert 3 * windows <= grown <= 3 * windows + queues
    assert figures[True]["cycles_per_inference"] == figures[False]["cycles_per_inference"]
    df = dfs[True]
    x = np.random.default_rng(2).integers(df.input.type.lo, df.input.type.hi + 1,
                                          size=(6, df.input.size))
    (tmp_path / "top.v").write_text(emit_verilog(df))
    res = simulate_rtl(tmp_path / "top.v", df.input, df.output, x, build_dir=tmp_path / "b",
                       stall_prob_in=0.3, stall_prob_out=0.5, seed=4, progress=False)
    np.testing.assert_array_equal(res.outputs, run_dataflow(df, x))
    res = simulate_rtl(tmp_path / "top.v", df.input, df.output, x[:2],
                       build_dir=tmp_path / "b", progress=False)
    assert res.latency_cycles == figures[True]["latency_cycles"]
    assert res.cycles_per_inference == figures[True]["cycles_per_inference"]
