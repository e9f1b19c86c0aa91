"""FIFO depths from the cycle model (:mod:`onnx2fpga.plan.fifos`): the occupancy of a queue on
hand-built traces, the take models of the cores that hold their input back against their own
output schedules, and the depths ``fold`` sets."""

import numpy as np
import pytest

from onnx2fpga.errors import OptionError
from onnx2fpga.hw.emit import emit_verilog
from onnx2fpga.hw.resources import dataflow_resources
from onnx2fpga.ir.dataflow import Dataflow, Port
from onnx2fpga.ir.layers import ConvLayer
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan.cost import edge_fifo_depths
from onnx2fpga.plan.fifos import (
    MARGIN,
    MIN_DEPTH,
    fifo_bits,
    fifo_occupancy,
    latest_writes,
)
from onnx2fpga.plan.fold import fold
from onnx2fpga.plan.graph import plan_graph
from onnx2fpga.plan.window import WindowGeometry
from onnx2fpga.sim import golden
from tests.plan.test_graph import fit_stage, residual_dataflow

U4, I8 = IntType(4, False), IntType(8, True)


def test_occupancy_of_a_burst_taken_slowly():
    # Eight transfers written at cycles 0..7, taken one every 4 cycles from cycle 1: at cycle
    # 7 the ones taken at 1 and 5 have left, the other six are held.
    written = np.arange(8)
    taken = 1 + 4 * np.arange(8)
    assert fifo_occupancy(written, taken) == 6
    # All taken long after the last write: the queue holds the whole burst.
    assert fifo_occupancy(written, 100 + np.arange(8)) == 8


def test_occupancy_of_a_stream_that_flows_through():
    # Each transfer taken the cycle after it is written: one held while the next is written.
    assert fifo_occupancy(np.arange(10), np.arange(10) + 1) == 2
    # Taken every other cycle while written every other cycle: never more than one.
    assert fifo_occupancy(2 * np.arange(10), 2 * np.arange(10) + 1) == 1
    assert fifo_occupancy(np.zeros(0), np.zeros(0)) == 0


def test_occupancy_refuses_inconsistent_traces():
    with pytest.raises(ValueError, match="one length"):
        fifo_occupancy(np.arange(3), np.arange(4))
    with pytest.raises(ValueError, match="Transfer 1 is taken at cycle 0"):
        fifo_occupancy(np.array([0, 1]), np.array([0, 0]))


@pytest.mark.parametrize("geom", [
    dict(channels=4, height=7, width=5, kernel=(3, 3), pads=(1, 1, 1, 1), lanes=2),
    dict(channels=1, height=49, width=10, kernel=(10, 4), stride=(2, 2), pads=(4, 1, 5, 1)),
    dict(channels=3, height=6, width=6, kernel=(2, 2), stride=(2, 2)),
])
@pytest.mark.parametrize("gap", [0, 3])
def test_window_takes_its_rows_in_the_timeline(geom, gap):
    """Each input row's last transfer is taken at the cycle the row-level schedule writes it,
    whether the input comes at full rate or slower; none before it is offered."""
    g = WindowGeometry.make(**geom)
    arrival = np.arange(g.in_beats) * (1 + gap)
    takes = g.takes(arrival)
    row_in = g.width * g.folds
    in_end, _ = g.timeline(1, arrival[row_in - 1::row_in])
    np.testing.assert_array_equal(takes[row_in - 1::row_in], in_end)
    assert (takes >= arrival).all() and (np.diff(takes) >= 1).all()


def _conv_dataflow():
    """A 3x3 convolution (8 channels) into a pointwise one (8 channels): the first matrix unit
    emits each pixel's 8 outputs in a burst, the pointwise one at one product per cycle takes
    a pixel's 8 channels over 64 cycles."""
    rng = np.random.default_rng(0)
    probe = rng.integers(0, 16, size=(16, 2, 6, 6))
    conv0 = ConvLayer("conv0", U4, 3, (2, 6, 6), rng.integers(-7, 8, size=(8, 2, 3, 3)),
                      IntType(4, True), rng.integers(-20, 20, 8), [], pads=(1, 1, 1, 1),
                      inputs=["x"], output="a")
    conv0.requant.append(fit_stage(rng, golden.run_layer(conv0, probe), U4, relu=True))
    h = golden.run_layer(conv0, probe)
    conv1 = ConvLayer("conv1", U4, 0, (8, 6, 6), rng.integers(-7, 8, size=(8, 8, 1, 1)),
                      IntType(4, True), rng.integers(-9, 9, 8), [], inputs=["a"], output="y")
    conv1.requant.append(fit_stage(rng, golden.run_layer(conv1, h), I8))
    return Dataflow([conv0, conv1], Port("x", (1, 2, 6, 6), U4, 0.1, 3),
                    Port("y", (1, 8, 6, 6), I8, 0.1, 0))


def test_a_producer_faster_than_its_reader_needs_no_room():
    # Written every 2 cycles, taken every 5: held back, the producer writes each transfer
    # the cycle before it is taken, and the queue holds one.
    written, taken = 2 * np.arange(20), 10 + 5 * np.arange(20)
    late = latest_writes(written, taken, 1)
    np.testing.assert_array_equal(late, taken - 1)
    assert fifo_occupancy(late, taken) == 1
    # A burst the reader takes one by one: no transfer can come later than it is taken, and
    # none earlier than written, so the burst's head waits in the queue.
    written, taken = np.array([0, 1, 2, 3]), np.array([4, 5, 6, 7])
    np.testing.assert_array_equal(latest_writes(written, taken, 1), [3, 4, 5, 6])


def _dw_dataflow(c=8, h=6, w=6):
    """A depthwise 3x3 convolution into a pointwise one (DS-CNN's block): the depthwise core
    emits a pixel's channels at the window's pace, row by row with gaps at the edges; the
    pointwise layer takes a pixel's channels at once into its matrix unit, and then computes
    for ``c * c / simd`` cycles."""
    rng = np.random.default_rng(0)
    probe = rng.integers(0, 16, size=(16, c, h, w))
    dw = ConvLayer("dw", U4, 3, (c, h, w), rng.integers(-7, 8, size=(c, 1, 3, 3)),
                   IntType(4, True), rng.integers(-20, 20, c), [], pads=(1, 1, 1, 1), group=c,
                   inputs=["x"], output="a")
    dw.requant.append(fit_stage(rng, golden.run_layer(dw, probe), U4, relu=True))
    h1 = golden.run_layer(dw, probe)
    pw = ConvLayer("pw", U4, 0, (c, h, w), rng.integers(-7, 8, size=(c, c, 1, 1)),
                   IntType(4, True), rng.integers(-9, 9, c), [], inputs=["a"], output="y")
    pw.requant.append(fit_stage(rng, golden.run_layer(pw, h1), I8))
    return Dataflow([dw, pw], Port("x", (1, c, h, w), U4, 0.1, 3),
                    Port("y", (1, c, h, w), I8, 0.1, 0))


@pytest.mark.parametrize("lanes, deep", [(2, False), (3, True), (4, True), (6, False),
                                         (8, False)])
def test_fold_sizes_the_queue_between_paces(lanes, deep):
    """Depthwise then pointwise, 8 channels on 6x6. With 2 depthwise lanes (1,296 cycles)
    before a pointwise layer of 2,304 or 1,152, the depthwise output comes in row bursts the
    pointwise layer's line buffer takes at its own pace, and the model asks for a queue deeper
    than 2 (3: Verilator runs both foldings at the model's figures with 2 as well, the model
    errs on the deep side). With 1 lane against 1 product (2,592 against 2,304) or 4 lanes
    (648) against 1,152 or 576, the producer can wait and 2 suffice. The output port never
    needs more than 2, and no queue more than the transfers of two inferences."""
    df = fold(_dw_dataflow(), max_lanes=lanes)
    assert df.fifo_depths[1] == MIN_DEPTH
    if deep:
        assert MIN_DEPTH < df.fifo_depths[0] <= 2 * 36 * 8 // df.layers[0].lanes + MARGIN
    else:
        assert df.fifo_depths[0] == MIN_DEPTH
    plan = plan_graph(df)
    assert fifo_bits(plan) == sum(d * w for d, w in zip(df.fifo_depths, (
        df.layers[0].lanes * 4, 8)))


def test_a_slow_reader_behind_a_fast_producer_leaves_the_queue_at_its_least():
    """conv0 emits a pixel every 18 cycles, the pointwise layer takes one every 32 or 64:
    the producer has time to spare and waits; the queue stays at 2."""
    for simd in (1, 2):
        df = fold(_conv_dataflow(), overrides={"conv0": {"simd": 18, "pe": 8},
                                               "conv1": {"simd": simd, "pe": 1}})
        assert df.fifo_depths == [MIN_DEPTH, MIN_DEPTH]


def test_fold_keeps_an_explicit_fifo_depth():
    df = fold(_conv_dataflow(), fifo_depth=3)
    assert df.fifo_depths == [3, 3]
    with pytest.raises(OptionError, match="fifo_depth must be a non-negative integer"):
        fold(_conv_dataflow(), fifo_depth=-1)


def test_the_estimate_counts_the_deeper_queue():
    """The resource estimate a board's folding checks is of the queues fold sized: the layer
    before a layer of another pace costs more than with 2-deep queues, by its queue alone."""
    deep = fold(_dw_dataflow(), max_lanes=4)
    shallow = fold(_dw_dataflow(), max_lanes=4, fifo_depth=MIN_DEPTH)
    assert deep.fifo_depths[0] > MIN_DEPTH and shallow.fifo_depths[0] == MIN_DEPTH
    a, b = (dataflow_resources(df, "ecp5")["layers"] for df in (deep, shallow))
    assert a[0]["lut"] + a[0]["ff"] > b[0]["lut"] + b[0]["ff"]
    assert (a[0]["products"], a[1]) == (b[0]["products"], b[1])


def test_the_sized_queues_give_the_same_verilog_every_time():
    a, b = (fold(_dw_dataflow(), max_lanes=4) for _ in range(2))
    assert a.fifo_depths == b.fifo_depths and a.fifo_depths[0] > MIN_DEPTH
    assert emit_verilog(a) == emit_verilog(b)


def test_a_skip_branch_keeps_at_least_the_depth_of_the_layers_needs():
    """On a fork's branch the queue is the deeper of the two sizings: the need-based one that
    keeps the join from deadlocking and running slow (``edge_fifo_depths``) and the traces'."""
    df = fold(residual_dataflow())
    need = edge_fifo_depths(df)
    assert list(df.edge_fifos) == list(need) == ["a->add"]
    assert df.edge_fifos["a->add"] >= need["a->add"]
