"""SliceCore in amaranth.sim: a channel range of channels-last images against the golden
model's SliceLayer under random idles and stalls, its timing at full rate, its errors."""

import numpy as np
import pytest
from amaranth import signed, unsigned

from onnx2fpga.hw.slice import SliceCore
from onnx2fpga.hw.testing import random_values, run_stream, run_timed, to_transfers
from onnx2fpga.ir.layers import SliceLayer
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan.layers import kind_of
from onnx2fpga.plan.slice import SLICE_LATENCY
from onnx2fpga.sim import golden

# (element shape, lanes, image (C, H, W), start, stop)
CASES = [
    (IntType(8, True), 1, (8, 3, 3), 3, 8),
    (IntType(8, True), 1, (8, 2, 2), 0, 3),
    (IntType(4, False), 2, (6, 2, 3), 2, 4),
    (unsigned(3), 1, (5, 1, 4), 4, 5),
    (signed(6), 3, (9, 2, 2), 0, 9),
    (IntType(8, False), 4, (8, 1, 1), 4, 8),
]


def _stream(x):
    return np.asarray(x).transpose(0, 2, 3, 1).reshape(len(x), -1)


@pytest.mark.parametrize("seed,case", list(enumerate(CASES)))
def test_slice_matches_golden_under_stalls(seed, case):
    shape, lanes, image, start, stop = case
    rng = np.random.default_rng(seed)
    x = random_values(rng, shape, (3,) + image)
    t = shape if isinstance(shape, IntType) else IntType(shape.width, shape.signed)
    layer = SliceLayer("s", t, image, start, stop, lanes=lanes)
    kind_of(layer).check(layer)
    expected = _stream(golden.run_layer(layer, x.reshape(3, -1)))
    dut = SliceCore(shape, lanes, image[0] // lanes, start // lanes, stop // lanes)
    got = run_stream(dut, to_transfers(_stream(x), lanes), expected.size // lanes, seed)
    np.testing.assert_array_equal(np.array(got).reshape(expected.shape), expected)


def test_slice_timing():
    """One input transfer per cycle; a kept one leaves SLICE_LATENCY cycles after it came."""
    x = np.arange(2 * 6 * 4).reshape(1, 6, 2, 4) % 100
    dut = SliceCore(IntType(8, False), 2, 3, 1, 2)
    items = to_transfers(_stream(x), 2)
    kept = [k for k in range(len(items)) if k % 3 == 1]
    times = run_timed(dut, items, len(kept))
    assert times["in"] == list(range(len(items)))
    assert times["out"] == [times["in"][k] + SLICE_LATENCY for k in kept]


def test_slice_errors():
    with pytest.raises(ValueError, match=r"^Slice must satisfy 0 <= start < stop <= period, "
                                         r"not start=2, stop=2, period=4$"):
        SliceCore(signed(8), 1, 4, 2, 2)
    with pytest.raises(TypeError, match=r"^Period must be an integer, not 2.0$"):
        SliceCore(signed(8), 1, 2.0, 0, 1)
    with pytest.raises(ValueError, match=r"^Layer 's': channels 2\.\.9 are not a range of "
                                         r"\(8, 2, 2\)$"):
        SliceLayer("s", IntType(8, True), (8, 2, 2), 2, 9)
