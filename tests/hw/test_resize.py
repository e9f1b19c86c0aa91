"""ResizeCore and ReorderCore in amaranth.sim: against the golden model and ONNX's reference
Resize under random stalls, the cycle models against the simulated cycles, Verilog, errors."""

import functools

import numpy as np
import pytest
from amaranth import Fragment, signed, unsigned
from amaranth.back import verilog
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx2fpga.hw.resize import ReorderCore, ResizeCore
from onnx2fpga.hw.testing import image_transfers, random_images, run_stream, run_timed, shape_range
from onnx2fpga.ir.dataflow import Port
from onnx2fpga.ir.layers import ViewLayer
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan.resize import ResizeGeometry, affine_loops, resize_cycles, resize_latency
from onnx2fpga.sim import golden

# ---------------------------------------------------------------------------------------------
# ONNX Resize (nearest) as onnx.reference computes it


def resize_model(mode, nearest):
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest",
                            coordinate_transformation_mode=mode, nearest_mode=nearest)
    graph = helper.make_graph(
        [node], "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("sizes", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@functools.cache
def onnx_resize(mode, nearest):
    return ReferenceEvaluator(resize_model(mode, nearest))


def onnx_run(x, out_hw, mode, nearest):
    """ONNX Resize of NCHW ``x`` (float32, exact for small integers) to ``out_hw``."""
    sizes = np.array(list(x.shape[:2]) + list(out_hw), dtype=np.int64)
    return onnx_resize(mode, nearest).run(None, {"x": x.astype(np.float32), "sizes": sizes})[0]


def onnx_map(size, out, mode, nearest):
    """The index map of one axis: ONNX Resize of ``arange(size)`` to ``out`` elements."""
    x = np.arange(size, dtype=np.float32).reshape(1, 1, 1, size)
    return [int(v) for v in onnx_run(x, (1, out), mode, nearest).reshape(-1)]


# ---------------------------------------------------------------------------------------------
# ResizeCore


# (mode, nearest_mode, shape, channels, (height, width), (out_height, out_width), lanes)
ONNX_CASES = [
    ("asymmetric", "floor", signed(8), 2, (3, 4), (6, 8), 1),            # upsample x2
    ("half_pixel", "round_prefer_floor", unsigned(8), 4, (6, 6), (3, 3), 2),   # down x2
    ("asymmetric", "floor", signed(6), 3, (6, 5), (2, 2), 3),            # down x3, x2.5
    ("half_pixel", "round_prefer_ceil", signed(8), 2, (4, 3), (7, 5), 1),     # up x1.75, x1.67
    ("align_corners", "round_prefer_floor", unsigned(4), 2, (5, 4), (3, 7), 2),  # down / up
    ("pytorch_half_pixel", "ceil", signed(8), 1, (2, 6), (5, 4), 1),     # up / down, 3 rows
    ("half_pixel_symmetric", "floor", signed(5), 4, (5, 5), (4, 6), 4),
]


@pytest.mark.parametrize("seed,case", list(enumerate(ONNX_CASES)))
def test_resize_matches_onnx(seed, case):
    mode, nearest, shape, channels, (height, width), (oh, ow), lanes = case
    rows, cols = onnx_map(height, oh, mode, nearest), onnx_map(width, ow, mode, nearest)
    dut = ResizeCore(shape, channels, height, width, rows, cols, lanes)
    x = random_images(np.random.default_rng(seed), shape, 3, channels, height, width)
    expected = golden.resize_nearest(x, rows, cols)
    # The golden model agrees with ONNX's reference Resize on the same data.
    np.testing.assert_array_equal(expected, onnx_run(x, (oh, ow), mode, nearest))
    got = run_stream(dut, image_transfers(x, lanes), 3 * dut.out_beats, seed)
    np.testing.assert_array_equal(np.array(got), np.array(image_transfers(expected, lanes)))


# (shape, channels, height, width, rows, cols, lanes, buffer_rows)
RESIZE_CASES = {
    "identity": (signed(8), 2, 3, 3, [0, 1, 2], [0, 1, 2], 1, None),
    "up2_lanes": (signed(8), 4, 3, 2, [0, 0, 1, 1, 2, 2], [0, 0, 1, 1], 2, None),
    "up3_rows_only": (unsigned(3), 3, 2, 3, [0, 0, 0, 1, 1, 1], [0, 1, 2], 1, None),
    "down_skip_first_last": (signed(8), 2, 7, 6, [1, 3, 5], [1, 4], 2, None),
    "one_row_used": (unsigned(8), 1, 4, 3, [2, 2], [0, 2, 2], 1, None),
    "one_pixel_in": (IntType(4, True), 2, 1, 1, [0, 0, 0], [0, 0], 1, None),
    "one_pixel_out": (signed(8), 3, 3, 4, [2], [3], 3, None),
    "uneven": (signed(8), 2, 5, 4, [0, 1, 1, 3, 4, 4, 4], [0, 0, 2, 3], 1, None),
    "buffer_1": (signed(8), 2, 4, 3, [0, 0, 2, 3, 3], [0, 1, 1, 2], 2, 1),
    "buffer_3": (unsigned(5), 2, 4, 3, [0, 1, 1, 3], [0, 0, 1, 2, 2], 1, 3),
    "buffer_5_more_than_used": (signed(4), 1, 3, 2, [1, 1, 2], [0, 1, 1], 1, 5),
}


def make_resize(case):
    shape, channels, height, width, rows, cols, lanes, buffer_rows = case
    return ResizeCore(shape, channels, height, width, rows, cols, lanes,
                      buffer_rows=buffer_rows)


def resize_data(case, seed, inferences):
    shape, channels, height, width, rows, cols, lanes, _ = case
    x = random_images(np.random.default_rng([seed, 7]), shape, inferences, channels, height,
                      width)
    return image_transfers(x, lanes), image_transfers(golden.resize_nearest(x, rows, cols),
                                                      lanes)


@pytest.mark.parametrize("seed,name", list(enumerate(RESIZE_CASES)))
def test_resize_matches_golden(seed, name):
    case = RESIZE_CASES[name]
    dut = make_resize(case)
    items, expected = resize_data(case, seed, 3)
    got = run_stream(dut, items, len(expected), seed)
    np.testing.assert_array_equal(np.array(got), np.array(expected))


def check_resize_timing(case):
    """Back-to-back inferences at full rate: every row ends in the cycle the model says."""
    dut = make_resize(case)
    geom = dut.geometry
    inferences = max(3, geom.buffer_rows // len(geom.used_rows) + 3)
    items, expected = resize_data(case, 0, inferences)
    times = run_timed(dut, items, len(expected))
    np.testing.assert_array_equal(np.array(times["out_items"]), np.array(expected))
    t_in, t_out = np.array(times["in"]), np.array(times["out"])
    assert t_in[0] == 0
    in_end, out_end = geom.timeline(inferences)
    row_in, row_out = geom.row_words, geom.out_width * geom.folds
    np.testing.assert_array_equal(t_in[row_in - 1::row_in], in_end)
    np.testing.assert_array_equal(t_out[row_out - 1::row_out], out_end)
    # Within a row neither side waits.
    np.testing.assert_array_equal(np.diff(t_in.reshape(-1, row_in), axis=1), 1)
    np.testing.assert_array_equal(np.diff(t_out.reshape(-1, row_out), axis=1), 1)
    ends = t_out[dut.out_beats - 1::dut.out_beats]
    assert ends[0] - t_in[0] == dut.latency
    assert np.diff(ends)[-1] == dut.cycles
    return dut, int(ends[0] - t_in[0]), int(np.diff(ends)[-1])


@pytest.mark.parametrize("name", list(RESIZE_CASES))
def test_resize_timing(name):
    case = RESIZE_CASES[name]
    dut, latency, steady = check_resize_timing(case)
    shape, channels, height, width, rows, cols, lanes, buffer_rows = case
    assert resize_latency(channels, height, width, rows, cols, lanes, buffer_rows) == latency
    assert resize_cycles(channels, height, width, rows, cols, lanes, buffer_rows) == steady
    if buffer_rows is None:
        assert steady == max(dut.in_beats, dut.out_beats)
    if dut.out_beats > dut.in_beats and dut.buffer_rows >= 2:
        # The output is the slower side: it starts after its first input row and never waits.
        assert latency == (rows[0] + 1) * dut.geometry.row_words + dut.out_beats


@pytest.mark.parametrize("case,full", [
    # Upsampling x2, and rows down x2 with columns up x2: two rows.
    ((signed(8), 1, 4, 4, [0, 0, 1, 1, 2, 2, 3, 3], [0, 0, 1, 1, 2, 2, 3, 3], 1), 2),
    ((signed(8), 1, 6, 4, [1, 3, 5], [0, 0, 1, 1, 2, 2, 3, 3], 1), 2),
    # Downsampling: the reader is done with a row before the writer needs its slot.
    ((signed(8), 2, 6, 4, [0, 2, 4], [1, 3], 1), 1),
    ((signed(8), 1, 6, 4, [2, 5], [0, 3], 1), 1),
    # Upsampling rows while downsampling columns at equal transfer counts
    # (half_pixel, round_prefer_floor, 2 x 3 to 3 x 2; half_pixel / floor, 2 x 2 to 4 x 1).
    ((signed(8), 1, 2, 3, [0, 0, 1], [0, 2], 1), 3),
    ((signed(8), 1, 2, 2, [0, 0, 0, 1], [0], 1), 3),
])
def test_resize_default_rows_are_the_fewest(case, full):
    # With the default rows the simulated core reaches max(in_beats, out_beats); with one row
    # fewer it does not.
    dut, _, steady = check_resize_timing(case + (None,))
    assert dut.buffer_rows == full
    assert steady == max(dut.in_beats, dut.out_beats)
    if full > 1:
        _, _, fewer = check_resize_timing(case + (full - 1,))
        assert fewer > steady


def test_resize_default_rows_onnx_maps():
    # The default reaches max(in_beats, out_beats) for every ONNX nearest map of small sizes,
    # with at most three rows (the model; the model is checked against the simulation above).
    seen = set()
    for mode, nearest in [("half_pixel", "round_prefer_floor"), ("asymmetric", "floor"),
                          ("align_corners", "round_prefer_ceil"), ("half_pixel", "ceil")]:
        for size, out in [(2, 3), (2, 4), (3, 2), (3, 5), (4, 2), (4, 7), (5, 3), (6, 4)]:
            rows = onnx_map(size, out, mode, nearest)
            for w, ow in [(2, 1), (3, 2), (4, 8), (6, 4), (5, 7)]:
                geom = ResizeGeometry.make(1, size, w, rows, onnx_map(w, ow, mode, nearest))
                assert geom.cycles == max(geom.in_beats, geom.out_beats)
                seen.add(geom.buffer_rows)
    assert seen == {1, 2, 3}


def test_resize_properties():
    dut = ResizeCore(IntType(6, True), 6, 5, 7, [0, 0, 2, 4], [1, 1, 3, 6, 6], lanes=3,
                     buffer_rows=2)
    assert (dut.out_height, dut.out_width, dut.folds) == (4, 5, 2)
    assert dut.in_beats == 5 * 7 * 2 and dut.out_beats == 4 * 5 * 2
    assert dut.geometry.used_rows == (0, 2, 4)
    assert dut.buffer_depth == 2 * 7 * 2
    assert dut.buffer_width == 3 * 6
    assert dut.buffer_bits == 28 * 18
    assert dut.rom_width == 4                   # (7 - 1) * 2 = 12 needs 4 bits
    assert dut.rom_bits == 5 * 4
    assert dut.memory_bits == 28 * 18 + 20
    assert dut.rows == (0, 0, 2, 4) and dut.cols == (1, 1, 3, 6, 6)
    one_col = ResizeCore(signed(8), 2, 3, 3, [0, 1], [2])
    assert one_col.rom_bits == 0 and one_col.memory_bits == one_col.buffer_bits
    for core in (dut, one_col):
        Fragment.get(core, None)


def test_resize_verilog():
    dut = ResizeCore(signed(8), 4, 4, 3, [0, 0, 1, 1, 2, 2, 3, 3], [0, 0, 1, 1, 2, 2], lanes=2)
    text = verilog.convert(dut, name="resize")
    assert "module resize(" in text
    assert f"reg [15:0] \\buf  [{dut.buffer_depth - 1}:0];" in text
    assert f"reg [{dut.rom_width - 1}:0] col_rom [5:0];" in text


def test_resize_errors():
    def make(**kw):
        args = dict(shape=signed(8), channels=4, height=3, width=3, rows=[0, 1], cols=[1, 2])
        args.update(kw)
        return ResizeCore(**args)

    with pytest.raises(ValueError, match=r"^Rows must be non-decreasing, not 2 followed by 1 "
                                         r"at position 2$"):
        make(rows=[0, 2, 1])
    with pytest.raises(ValueError, match=r"^Cols must be indices from 0 to 2, not 3$"):
        make(cols=[0, 3])
    with pytest.raises(ValueError, match=r"^Rows must be indices from 0 to 2, not -1$"):
        make(rows=[-1, 0])
    with pytest.raises(ValueError, match=r"^Cols must not be empty$"):
        make(cols=[])
    with pytest.raises(TypeError, match=r"^Rows must be a sequence of integers, not 2$"):
        make(rows=2)
    with pytest.raises(TypeError, match=r"^Cols must be a sequence of integers, "
                                        r"not \[0, 1.5\]$"):
        make(cols=[0, 1.5])
    with pytest.raises(TypeError, match=r"^Rows must be a sequence of integers, "
                                        r"not \[True, True\]$"):
        make(rows=[True, True])
    with pytest.raises(ValueError, match=r"^Lanes must divide channels=4, not 3$"):
        make(lanes=3)
    with pytest.raises(ValueError, match=r"^Height must be at least 1, not 0$"):
        make(height=0)
    with pytest.raises(TypeError, match=r"^Width must be an integer, not 3.0$"):
        make(width=3.0)
    with pytest.raises(ValueError, match=r"^Buffer rows must be at least 1, not 0$"):
        make(buffer_rows=0)
    with pytest.raises(TypeError, match=r"^Element shape must be an IntType or an integer "
                                        r"shape, not 'int8'$"):
        make(shape="int8")
    with pytest.raises(ValueError, match=r"^Rows must be indices from 0 to 2, not 5$"):
        resize_cycles(1, 3, 3, [5], [0])
    with pytest.raises(ValueError, match=r"^Channels must be at least 1, not 0$"):
        resize_latency(0, 3, 3, [0], [0])


# ---------------------------------------------------------------------------------------------
# ReorderCore


def transpose_order(shape, perm):
    """Stream order of ``x.transpose(perm)`` in C order, read from ``x`` in C order."""
    return np.arange(int(np.prod(shape))).reshape(shape).transpose(perm).reshape(-1)


# (shape, order, lanes, addressing)
REORDER_CASES = {
    "random_7": (signed(8), np.random.default_rng(1).permutation(7), 1, "rom"),
    "random_groups": (unsigned(4), (np.random.default_rng(2).permutation(6)[:, None] * 2
                                    + np.arange(2)).reshape(-1), 2, "rom"),
    "swap_2": (signed(8), [1, 0], 1, "rom"),
    "transpose_2d": (signed(8), transpose_order((3, 5), (1, 0)), 1, "counters"),
    "hwc_to_chw": (signed(6), transpose_order((3, 4, 2), (2, 0, 1)), 1, "counters"),
    "rank4_lanes": (signed(8), transpose_order((2, 3, 2, 4), (2, 0, 1, 3)), 4, "counters"),
    "chw_to_hwc_lanes": (IntType(5, False), transpose_order((2, 3, 4), (1, 0, 2)), 2,
                         "counters"),
    "identity": (signed(8), list(range(6)), 3, "counters"),
    "one_word": (signed(8), [0, 1, 2], 3, "counters"),
    "one_element": (unsigned(1), [0], 1, "counters"),
}


def reorder_data(case, seed, inferences):
    shape, order, lanes, _ = case
    lo, hi = shape_range(shape)
    x = np.random.default_rng([seed, 3]).integers(lo, hi, size=(inferences, len(order)),
                                                 endpoint=True)
    items = [[int(v) for v in row] for row in x.reshape(-1, lanes)]
    # Output position p carries input position order[p].
    expected = x[:, np.asarray(order)].reshape(-1, lanes)
    return items, expected


@pytest.mark.parametrize("seed,name", list(enumerate(REORDER_CASES)))
def test_reorder_matches_numpy(seed, name):
    case = REORDER_CASES[name]
    shape, order, lanes, addressing = case
    dut = ReorderCore(shape, order, lanes)
    assert dut.addressing == addressing
    items, expected = reorder_data(case, seed, 3)
    got = run_stream(dut, items, len(expected), seed)
    np.testing.assert_array_equal(np.array(got), expected)


@pytest.mark.parametrize("name", list(REORDER_CASES))
def test_reorder_timing(name):
    case = REORDER_CASES[name]
    shape, order, lanes, _ = case
    dut = ReorderCore(shape, order, lanes)
    words = len(order) // lanes
    items, expected = reorder_data(case, 0, 4)
    times = run_timed(dut, items, len(expected))
    np.testing.assert_array_equal(np.array(times["out_items"]), expected)
    t_in, t_out = np.array(times["in"]), np.array(times["out"])
    # Double buffering: the input never waits, the output of a tensor leaves in one burst.
    np.testing.assert_array_equal(t_in, np.arange(len(items)))
    np.testing.assert_array_equal(np.diff(t_out.reshape(-1, words), axis=1), 1)
    ends = t_out[words - 1::words]
    assert ends[0] - t_in[0] == dut.latency == 2 * words
    np.testing.assert_array_equal(np.diff(ends), dut.cycles)
    assert dut.cycles == words


def test_reorder_channels_last_to_c_order():
    # A flatten after a convolution: the stream carries a (C, H, W) tensor channels-last; the
    # reorder turns it into the logical C order the golden model's flatten produces. (One
    # lane: neighbours in C order are not neighbours in the channels-last stream.)
    c, h, w, lanes = 4, 3, 2, 1
    chw_to_stream = transpose_order((c, h, w), (1, 2, 0))      # channels-last stream order
    port = Port("x", (c, h, w), IntType(8, True), 1.0, 0, lanes=lanes, order=chw_to_stream)
    # Output position p must carry logical element p: the stream position holding it.
    order = np.argsort(chw_to_stream)
    dut = ReorderCore(signed(8), order, lanes)
    assert dut.addressing == "counters"
    x = np.random.default_rng(5).integers(-128, 127, size=(2, c, h, w), endpoint=True)
    stream_in = port.to_stream(x)
    got = run_stream(dut, [[int(v) for v in row] for row in stream_in.reshape(-1, lanes)],
                     2 * c * h * w // lanes, 5)
    flat = golden.run_layer(ViewLayer("flatten", IntType(8, True), (c, h, w), (c * h * w,)), x)
    np.testing.assert_array_equal(np.array(got).reshape(2, -1), flat)


@pytest.mark.parametrize("shape,perm", [
    ((5,), (0,)), ((3, 4), (1, 0)), ((2, 3, 4), (2, 1, 0)), ((2, 3, 4), (0, 2, 1)),
    ((4, 1, 3), (2, 0, 1)), ((2, 2, 3, 2), (3, 1, 0, 2)), ((3, 2, 2, 2, 2), (4, 2, 0, 3, 1)),
])
def test_affine_loops_of_transposes(shape, perm):
    order = transpose_order(shape, perm)
    loops = affine_loops(order)
    assert loops is not None
    # The loops regenerate the permutation, digit 0 the fastest.
    seq = np.zeros(len(order), dtype=np.int64)
    p = np.arange(len(order))
    for count, stride in loops:
        seq += (p % count) * stride
        p //= count
    np.testing.assert_array_equal(seq, order)


def test_affine_loops_rejects():
    assert affine_loops([1, 0]) is None                 # does not start at 0
    assert affine_loops([0, 2, 1, 3, 5, 4]) is None    # no nested-loop form
    assert affine_loops([0, 3, 1, 4, 5, 2]) is None
    assert affine_loops(list(range(8))) == [(8, 1)]    # merged into one loop


def test_reorder_properties():
    order = transpose_order((4, 6), (1, 0))
    dut = ReorderCore(signed(8), order, 1)
    assert dut.words == 24 and dut.size == 24
    assert dut.loops == [(4, 6), (6, 1)]
    assert dut.buffer_depth == 48 and dut.buffer_width == 8
    assert dut.buffer_bits == 48 * 8 and dut.rom_bits == 0
    assert dut.memory_bits == dut.buffer_bits
    rom = ReorderCore(IntType(4, False), np.random.default_rng(0).permutation(24), 1)
    assert rom.addressing == "rom"
    assert rom.rom_width == 5                           # words - 1 = 23
    assert rom.rom_bits == 24 * 5
    assert rom.memory_bits == 48 * 4 + 24 * 5
    assert rom.word_order == rom.order
    for core in (dut, rom):
        Fragment.get(core, None)


def test_reorder_verilog():
    rom = ReorderCore(signed(8), [2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9], 2)
    counters = ReorderCore(signed(8), transpose_order((3, 4), (1, 0)), 1)
    assert rom.word_order == (1, 0, 3, 2, 5, 4)
    assert (rom.addressing, counters.addressing) == ("rom", "counters")
    for dut, has_rom in ((rom, True), (counters, False)):
        text = verilog.convert(dut, name="reorder")
        assert "module reorder(" in text
        assert f"reg [{dut.buffer_width - 1}:0] \\buf  [{dut.buffer_depth - 1}:0];" in text
        assert ("addr_rom" in text) == has_rom


def test_reorder_errors():
    with pytest.raises(ValueError, match=r"^Order must be a permutation of range\(4\), but "
                                         r"order\[2\] is 4$"):
        ReorderCore(signed(8), [0, 1, 4, 2])
    with pytest.raises(ValueError, match=r"^Order must be a permutation of range\(4\), but "
                                         r"1 appears 2 times$"):
        ReorderCore(signed(8), [0, 1, 1, 2])
    with pytest.raises(ValueError, match=r"^Order must not be empty$"):
        ReorderCore(signed(8), [])
    with pytest.raises(TypeError, match=r"^Order must be a sequence of integers, not 3$"):
        ReorderCore(signed(8), 3)
    with pytest.raises(TypeError, match=r"^Order must be a sequence of integers, "
                                        r"not \[0.0, 1.0\]$"):
        ReorderCore(signed(8), [0.0, 1.0])
    with pytest.raises(ValueError, match=r"^Lanes must divide the tensor size 6, not 4$"):
        ReorderCore(signed(8), list(range(6)), 4)
    with pytest.raises(ValueError, match=r"^Order must move whole groups of 2 lanes: "
                                         r"order\[2\] must be a multiple of 2, not 1$"):
        ReorderCore(signed(8), [2, 3, 1, 0], 2)
    with pytest.raises(ValueError, match=r"^Order must move whole groups of 2 lanes: "
                                         r"order\[1\] must be order\[0\] \+ 1 = 3, not 1$"):
        ReorderCore(signed(8), [2, 1, 0, 3], 2)
    with pytest.raises(ValueError, match=r"^Lanes must be at least 1, not 0$"):
        ReorderCore(signed(8), [0, 1], 0)
