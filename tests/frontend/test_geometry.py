"""frontend.geometry: the golden model with the geometry computes what ONNX defines.

Every case runs the ONNX operator on integer-valued float32 data (so that float results are
exact) in ``onnx.reference.ReferenceEvaluator`` and, where noted, in onnxruntime, and compares
with the golden model (:mod:`onnx2fpga.sim.golden`) fed with the geometry, bit for bit.

onnx.reference (onnx 1.23) is wrong in a few places; those cases are checked against
onnxruntime instead, and the constant naming the reason says why. Where onnxruntime rounds
differently from the spec (it computes resize coordinates in float32), the case is checked
against onnx.reference only, again with the reason.
"""

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx2fpga.frontend import geometry
from onnx2fpga.frontend.geometry import (
    avg_counts,
    conv_geometry,
    pad_geometry,
    pool_geometry,
    resize_nearest_maps,
)
from onnx2fpga.ir.layers import ConcatLayer, ConvLayer, PadLayer, PoolLayer, ResizeLayer, ViewLayer
from onnx2fpga.ir.stages import RequantStage
from onnx2fpga.ir.types import IntType
from onnx2fpga.sim import golden

ort.set_default_logger_severity(3)

_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.uint8): TensorProto.UINT8,
         np.dtype(np.int8): TensorProto.INT8, np.dtype(np.int32): TensorProto.INT32}


def since(op, opset):
    """The since_version that ``op`` resolves to in ``opset``."""
    return onnx.defs.get_schema(op, opset).since_version


def make_model(op, opset, x, attrs, consts=(), out_type=TensorProto.FLOAT):
    """A one-node model: input ``x`` (its array gives type and shape), then constant inputs
    (``None``: an empty slot)."""
    names, inits = ["x"], []
    for i, c in enumerate(consts):
        if c is None:
            names.append("")
        else:
            names.append(f"c{i}")
            inits.append(numpy_helper.from_array(np.asarray(c), f"c{i}"))
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", _ELEM[x.dtype], x.shape)],
        [helper.make_tensor_value_info("y", out_type, None)], initializer=inits)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = helper.find_min_ir_version_for(opsets)
    return model


def run_reference(model, x):
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


def run_onnxruntime(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


EXECUTORS = {"onnx.reference": run_reference, "onnxruntime": run_onnxruntime}


def check_executors(model, x, expected, trusted):
    """``expected`` equals the output of every executor in ``trusted``."""
    assert trusted, "a case must be checked by at least one executor"
    for name in trusted:
        got = EXECUTORS[name](model, x)
        assert got.shape == expected.shape, name
        np.testing.assert_array_equal(got, expected, err_msg=name)


def as_image(x):
    """``(N, C, W)`` as ``(N, C, 1, W)``; ``(N, C, H, W)`` unchanged."""
    return x.reshape(x.shape[0], x.shape[1], -1, x.shape[-1])


def onnx_shape(in_shape, channels, out_hw):
    """ONNX output shape of a window operator whose geometry gives ``out_hw``."""
    spatial = out_hw if len(in_shape) == 4 else out_hw[1:]
    return (in_shape[0], channels, *spatial)


# ---------------------------------------------------------------------------------------------
# Conv

# (input shape, output channels, kernel, attributes, bias, opset)
CONV_CASES = [
    # 1-D
    ((1, 3, 11), 4, (3,), {}, True, 13),
    ((2, 2, 12), 3, (5,), {"strides": [2], "pads": [2, 1]}, False, 13),
    ((1, 2, 13), 2, (3,), {"dilations": [3], "pads": [0, 4]}, True, 22),
    ((1, 2, 10), 2, (4,), {"auto_pad": "SAME_LOWER", "strides": [3]}, True, 13),
    ((1, 2, 10), 3, (2,), {"auto_pad": "SAME_UPPER", "strides": [2], "dilations": [2]}, True, 7),
    ((1, 2, 9), 2, (4,), {"auto_pad": "VALID", "strides": [2]}, False, 11),
    # 2-D, kernels 1 to 8, strides 1 to 4, symmetric and asymmetric pads
    ((1, 3, 6, 7), 4, (1, 1), {}, True, 13),
    ((1, 2, 7, 6), 3, (2, 2), {"strides": [2, 2]}, True, 13),
    ((2, 3, 8, 8), 2, (3, 3), {"pads": [1, 1, 1, 1]}, True, 22),
    ((1, 2, 9, 9), 2, (4, 4), {"pads": [1, 2, 2, 1], "strides": [3, 2]}, False, 13),
    ((1, 2, 9, 10), 3, (5, 5), {"pads": [2, 2, 2, 2], "strides": [4, 4]}, True, 13),
    ((1, 1, 10, 10), 2, (6, 6), {"pads": [0, 3, 1, 2]}, True, 7),
    ((1, 2, 11, 12), 2, (7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 3]}, True, 13),
    ((1, 2, 20, 20), 3, (8, 8), {"strides": [4, 4]}, True, 13),
    ((1, 2, 18, 19), 2, (8, 8), {"strides": [4, 4], "pads": [2, 3, 2, 1]}, False, 13),
    # rectangular kernels, dilations 1 to 3, kernel_shape given
    ((1, 2, 8, 9), 2, (1, 3), {"dilations": [1, 2]}, True, 13),
    ((1, 2, 9, 8), 2, (3, 1), {"dilations": [3, 1], "pads": [3, 0, 3, 0]}, True, 13),
    ((1, 2, 12, 12), 2, (3, 3), {"dilations": [2, 3], "strides": [2, 1], "pads": [1, 0, 2, 3]},
     True, 13),
    ((1, 2, 7, 5), 2, (2, 5), {"kernel_shape": [2, 5], "pads": [0, 2, 1, 2]}, True, 13),
    # auto_pad
    ((1, 2, 7, 8), 3, (3, 3), {"auto_pad": "SAME_UPPER"}, True, 13),
    ((1, 2, 7, 8), 3, (4, 4), {"auto_pad": "SAME_UPPER", "strides": [2, 3]}, True, 13),
    ((1, 2, 7, 8), 3, (4, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}, True, 13),
    ((1, 2, 9, 9), 2, (3, 3), {"auto_pad": "SAME_LOWER", "dilations": [2, 2], "strides": [2, 1]},
     True, 13),
    # a kernel smaller than the stride: the spec's total pad is negative, max(0, .) makes it 0
    ((1, 2, 9, 10), 2, (1, 1), {"auto_pad": "SAME_UPPER", "strides": [4, 3]}, True, 13),
    ((1, 2, 9, 10), 2, (3, 2), {"auto_pad": "VALID", "strides": [2, 3]}, True, 13),
    ((1, 2, 6, 6), 2, (3, 3), {"auto_pad": "NOTSET", "pads": [1, 0, 0, 1]}, True, 13),
    # groups: 4 groups of 2 channels, depthwise, depthwise with channel multiplier 2
    ((1, 8, 6, 6), 8, (3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, True, 13),
    ((1, 8, 6, 7), 12, (2, 2), {"group": 4, "strides": [2, 1]}, False, 13),
    ((1, 6, 7, 7), 6, (3, 3), {"group": 6, "pads": [1, 1, 1, 1]}, True, 13),
    ((1, 4, 8, 8), 8, (3, 3), {"group": 4, "strides": [2, 2], "auto_pad": "SAME_UPPER"}, True,
     13),
    ((1, 4, 9, 9), 4, (5, 5), {"group": 4, "dilations": [2, 2], "pads": [4, 4, 4, 4]}, False,
     22),
    ((1, 4, 12), 8, (3,), {"group": 4, "pads": [1, 1]}, True, 13),
    # MLPerf Tiny's keyword spotter: 10x4 stride 2 on 49x10 with TensorFlow's SAME padding,
    # written out (top 4, bottom 5) and as auto_pad; kernels larger than 8
    ((1, 1, 49, 10), 3, (10, 4), {"strides": [2, 2], "pads": [4, 1, 5, 1]}, True, 13),
    ((1, 1, 49, 10), 3, (10, 4), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, True, 13),
    ((1, 1, 49, 10), 3, (10, 4), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}, False, 13),
    ((1, 2, 13, 12), 2, (12, 11), {"pads": [0, 3, 2, 1], "strides": [3, 1]}, True, 13),
    ((1, 2, 40), 2, (17,), {"strides": [5], "auto_pad": "SAME_UPPER"}, True, 13),
]


def conv_data(in_shape, out_channels, kernel, attrs, seed, lo=-8, hi=8):
    rng = np.random.default_rng(seed)
    group = attrs.get("group", 1)
    x = rng.integers(lo, hi, in_shape)
    w = rng.integers(-3, 4, (out_channels, in_shape[1] // group, *kernel))
    b = rng.integers(-50, 51, out_channels)
    return x, w, b


def golden_conv(x, w, b, geo, zero_point=0):
    """golden.conv on the 2-D view of a 1-D or 2-D convolution."""
    w4 = w.reshape(w.shape[0], w.shape[1], *geo.kernel)
    return golden.conv(as_image(x), w4, b, zero_point, stride=geo.stride,
                       dilation=geo.dilation, pads=geo.pads, group=geo.group)


@pytest.mark.parametrize("in_shape,out_channels,kernel,attrs,bias,opset", CONV_CASES)
def test_conv_matches_onnx(in_shape, out_channels, kernel, attrs, bias, opset):
    x, w, b = conv_data(in_shape, out_channels, kernel, attrs, seed=len(CONV_CASES) + opset)
    geo = conv_geometry(attrs, in_shape, w.shape, since("Conv", opset))
    if not bias:
        b = np.zeros_like(b)
    y = golden_conv(x, w, b, geo)
    expected = y.reshape(onnx_shape(in_shape, out_channels, geo.out_hw)).astype(np.float32)
    assert y.shape[2:] == geo.out_hw
    consts = [w.astype(np.float32)] + ([b.astype(np.float32)] if bias else [])
    model = make_model("Conv", opset, x.astype(np.float32), attrs, consts)
    check_executors(model, x.astype(np.float32), expected, ["onnx.reference"])


# ConvInteger pads with the input zero point (its x_zero_point), exactly like golden.conv.
CONV_INTEGER_CASES = [(CONV_CASES[i], zp) for i, zp in
                      ((1, 17), (2, 200), (8, 128), (10, 3), (18, 90), (21, 255), (26, 60),
                       (28, 77), (30, 1))]


@pytest.mark.parametrize("case,zero_point", CONV_INTEGER_CASES)
def test_conv_integer_pads_with_the_zero_point(case, zero_point):
    in_shape, out_channels, kernel, attrs, _, _ = case
    x, w, _ = conv_data(in_shape, out_channels, kernel, attrs, seed=zero_point, lo=0, hi=256)
    w = w * 40
    geo = conv_geometry(attrs, in_shape, w.shape, 10, op="ConvInteger")
    y = golden_conv(x, w, np.zeros(out_channels, np.int64), geo, zero_point)
    expected = y.reshape(onnx_shape(in_shape, out_channels, geo.out_hw)).astype(np.int32)
    x8 = x.astype(np.uint8)
    model = make_model("ConvInteger", 10, x8, attrs,
                       [w.astype(np.int8), np.array(zero_point, np.uint8)],
                       out_type=TensorProto.INT32)
    check_executors(model, x8, expected, ["onnx.reference"])


# ---------------------------------------------------------------------------------------------
# Pooling

BOTH = ("onnx.reference", "onnxruntime")
ORT_ONLY = ("onnxruntime",)
# onnx.reference (onnx 1.23) is wrong for these; onnxruntime checks them instead:
# MaxPool with unit strides and dilations runs through _op_common_pool.CommonPool, which reads
# 2-D pads as (top, bottom, left, right) instead of (top, left, bottom, right) and ignores 1-D
# pads.
REF_MAXPOOL_UNIT_STRIDE = ORT_ONLY
# MaxPool SAME_LOWER outside that path (_max_pool) makes the output floor(in / stride) and puts
# the odd pad at the beginning.
REF_MAXPOOL_SAME_LOWER = ORT_ONLY
# AveragePool under ceil_mode adds half of the extra padding ceil_mode needs at the beginning
# (get_output_shape_explicit_padding), which shifts every window once that extra is 2 or more.
REF_AVG_CEIL_EXTRA = ORT_ONLY
# AveragePool with auto_pad asserts ceil_mode == 0.
REF_AVG_AUTO_PAD_CEIL = ORT_ONLY
# GlobalMaxPool reduces the axes (ndim - 2, ndim - 1): for an (N, C, W) input that takes the
# maximum over the channels too.
REF_GLOBAL_MAX_1D = ORT_ONLY

# (op, input shape, attributes, opset, executors)
POOL_CASES = [
    ("MaxPool", (1, 2, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}, 7, BOTH),
    ("MaxPool", (1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "storage_order": 0},
     8, BOTH),
    ("MaxPool", (1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2],
                               "pads": [1, 1, 1, 1]}, 12, BOTH),
    ("MaxPool", (1, 2, 6, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                               "ceil_mode": 1}, 12, BOTH),
    ("MaxPool", (1, 2, 5, 5), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, 10,
     BOTH),
    # ceil gives 3 windows per axis, but the third would start outside the image: dropped
    ("MaxPool", (1, 1, 4, 6), {"kernel_shape": [1, 1], "strides": [2, 2], "ceil_mode": 1}, 12,
     BOTH),
    ("MaxPool", (1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [2, 0, 1, 2],
                               "ceil_mode": 1}, 22, BOTH),
    ("MaxPool", (1, 2, 7, 7), {"kernel_shape": [3, 3], "pads": [0, 1, 2, 1]}, 12,
     REF_MAXPOOL_UNIT_STRIDE),
    ("MaxPool", (1, 2, 9, 9), {"kernel_shape": [3, 2], "strides": [2, 3], "dilations": [2, 3],
                               "ceil_mode": 1, "pads": [1, 0, 2, 1]}, 12, BOTH),
    ("MaxPool", (1, 2, 9, 9), {"kernel_shape": [3, 3], "strides": [1, 2], "dilations": [2, 2],
                               "pads": [2, 2, 2, 2]}, 22, BOTH),
    ("MaxPool", (1, 2, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 1],
                             "ceil_mode": 1}, 12, BOTH),
    ("MaxPool", (1, 2, 10), {"kernel_shape": [2], "pads": [1, 0]}, 12, REF_MAXPOOL_UNIT_STRIDE),
    ("MaxPool", (1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2],
                               "auto_pad": "SAME_UPPER"}, 12, BOTH),
    ("MaxPool", (1, 2, 7, 8), {"kernel_shape": [2, 3], "strides": [2, 3],
                               "auto_pad": "SAME_LOWER"}, 12, REF_MAXPOOL_SAME_LOWER),
    ("MaxPool", (1, 2, 7, 8), {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}, 12, BOTH),
    ("MaxPool", (1, 2, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "VALID"},
     12, BOTH),
    ("MaxPool", (1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [3, 3],
                               "auto_pad": "SAME_UPPER", "ceil_mode": 1}, 12, BOTH),
    ("AveragePool", (1, 2, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}, 7, BOTH),
    ("AveragePool", (1, 2, 7, 7), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, 7, BOTH),
    ("AveragePool", (1, 2, 7, 7), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                                   "count_include_pad": 1}, 7, BOTH),
    ("AveragePool", (1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2],
                                   "pads": [1, 2, 0, 1]}, 11, BOTH),
    ("AveragePool", (1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2],
                                   "pads": [1, 2, 0, 1], "count_include_pad": 1}, 11, BOTH),
    ("AveragePool", (1, 2, 6, 7), {"kernel_shape": [3, 3], "strides": [2, 2],
                                   "pads": [1, 1, 1, 1], "ceil_mode": 1}, 10, BOTH),
    ("AveragePool", (1, 2, 6, 7), {"kernel_shape": [3, 3], "strides": [2, 2],
                                   "pads": [1, 1, 1, 1], "ceil_mode": 1,
                                   "count_include_pad": 1}, 11, BOTH),
    ("AveragePool", (1, 2, 5, 5), {"kernel_shape": [4, 4], "strides": [4, 4], "ceil_mode": 1},
     10, REF_AVG_CEIL_EXTRA),
    ("AveragePool", (1, 2, 5, 6), {"kernel_shape": [4, 3], "strides": [4, 4], "ceil_mode": 1,
                                   "pads": [1, 0, 1, 2], "count_include_pad": 1}, 19,
     REF_AVG_CEIL_EXTRA),
    ("AveragePool", (1, 2, 3, 9), {"kernel_shape": [1, 4], "strides": [1, 3],
                                   "pads": [0, 1, 0, 1], "ceil_mode": 1,
                                   "count_include_pad": 1}, 11, REF_AVG_CEIL_EXTRA),
    ("AveragePool", (1, 2, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2],
                                   "dilations": [2, 2], "pads": [1, 1, 1, 1],
                                   "ceil_mode": 1}, 19, BOTH),
    ("AveragePool", (1, 2, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2],
                                   "dilations": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1,
                                   "count_include_pad": 1}, 19, BOTH),
    ("AveragePool", (1, 2, 8, 9), {"kernel_shape": [2, 3], "dilations": [3, 2],
                                   "count_include_pad": 1, "pads": [1, 2, 1, 0]}, 22, BOTH),
    ("AveragePool", (1, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 2],
                                 "ceil_mode": 1}, 19, BOTH),
    ("AveragePool", (1, 3, 10), {"kernel_shape": [4], "strides": [3], "pads": [2, 1],
                                 "count_include_pad": 1, "ceil_mode": 1}, 11, BOTH),
    ("AveragePool", (1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2],
                                   "auto_pad": "SAME_UPPER"}, 11, BOTH),
    ("AveragePool", (1, 2, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 3],
                                   "auto_pad": "SAME_LOWER", "count_include_pad": 1}, 11, BOTH),
    ("AveragePool", (1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2],
                                   "auto_pad": "SAME_LOWER", "ceil_mode": 1,
                                   "count_include_pad": 1}, 11, REF_AVG_AUTO_PAD_CEIL),
    ("AveragePool", (1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 3],
                                   "auto_pad": "VALID"}, 11, BOTH),
    ("GlobalMaxPool", (1, 3, 5, 6), {}, 13, BOTH),
    ("GlobalMaxPool", (2, 3, 7), {}, 22, REF_GLOBAL_MAX_1D),
    ("GlobalAveragePool", (1, 3, 5, 6), {}, 13, BOTH),
    ("GlobalAveragePool", (2, 3, 7), {}, 22, BOTH),
    # the global pool as TFLite converters write it: a kernel as large as the map
    ("AveragePool", (1, 3, 25, 5), {"kernel_shape": [25, 5]}, 19, BOTH),
    ("AveragePool", (1, 3, 24, 5), {"kernel_shape": [24, 5], "strides": [24, 5]}, 11, BOTH),
    ("MaxPool", (1, 3, 12, 10), {"kernel_shape": [12, 10], "strides": [2, 2]}, 12, BOTH),
]


def golden_pool(op, x, geo):
    """Max: golden.max_pool, padding the lowest int8. Average: window sum / count (float32)."""
    kw = dict(kernel=geo.kernel, stride=geo.stride, dilation=geo.dilation, pads=geo.pads)
    if op in ("MaxPool", "GlobalMaxPool"):
        return golden.max_pool(as_image(x), pad_value=-128, **kw).astype(np.float32)
    s = golden.window_sum(as_image(x), **kw)
    return s.astype(np.float32) / geo.counts.astype(np.float32)


@pytest.mark.parametrize("op,in_shape,attrs,opset,executors", POOL_CASES)
def test_pool_matches_onnx(op, in_shape, attrs, opset, executors):
    x = np.random.default_rng(opset).integers(-100, 101, in_shape)
    geo = pool_geometry(op, attrs, in_shape, since(op, opset))
    y = golden_pool(op, x, geo)
    assert y.shape[2:] == geo.out_hw
    expected = y.reshape(onnx_shape(in_shape, in_shape[1], geo.out_hw))
    model = make_model(op, opset, x.astype(np.float32), attrs)
    check_executors(model, x.astype(np.float32), expected, executors)


@pytest.mark.parametrize("include_pad", [False, True])
def test_avg_counts_never_count_ceil_mode_padding(include_pad):
    # 9 pixels (0..8), pads 1 and 1, kernel 4, stride 3, ceil_mode: ceil(7 / 3) + 1 = 4 windows,
    # starting at -1, 2, 5, 8. The last covers 8 (image), 9 (explicit pad), 10 and 11 (padding
    # that only ceil_mode adds, never counted).
    attrs = {"kernel_shape": [1, 4], "strides": [1, 3], "pads": [0, 1, 0, 1], "ceil_mode": 1,
             "count_include_pad": int(include_pad)}
    geo = pool_geometry("AveragePool", attrs, (1, 1, 1, 9), 11)
    assert geo.out_hw == (1, 4)
    assert geo.pads == (0, 1, 0, 3)
    want = [[4, 4, 4, 2]] if include_pad else [[3, 4, 4, 1]]
    np.testing.assert_array_equal(geo.counts, want)
    np.testing.assert_array_equal(
        avg_counts((1, 9), (1, 4), (1, 3), (1, 1), (0, 1, 0, 1), include_pad, (1, 4)), want)


# ---------------------------------------------------------------------------------------------
# Resize and Upsample, mode nearest

CTMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
# onnxruntime computes coordinates in float32: with the float32 scale 0.6 (0.60000002...) the
# exact coordinate of output row 1 is 1.5 / 0.60000002 - 0.5 = 1.99999992..., whose floor is
# 1; in float32 it rounds to 2.0.
ORT_FLOAT32_COORDINATES = ("onnx.reference",)
# onnxruntime multiplies the input size by the scale in float32: 3 * 1.6666666f rounds to 5.0,
# the exact product 4.99999988 floors to 4 (onnx.reference multiplies in float64).
ORT_FLOAT32_SIZE = ("onnx.reference",)
# onnx.reference's align_corners divides by the fractional output width (in * scale - 1), not
# by the integer output length minus one as the spec says (onnxruntime does).
REF_ALIGN_CORNERS_WIDTH = ORT_ONLY
# onnx.reference computes half_pixel_symmetric's offset in float64 and loses exact integer and
# tie coordinates (2 and 2.5 here); it also finds neighbours after adding a padding offset, which
# rounds a coordinate 1e-16 above an integer down to it.
REF_SYMMETRIC_FLOAT64 = ORT_ONLY
# onnx.reference implements no tf_half_pixel_for_nn (removed in Resize-13), no Resize-10, and
# Upsample only with integer scales in opset 9.
REF_MISSING = ORT_ONLY
# onnx.reference tests the output width (in * scale) against 1 for pytorch_half_pixel, the spec
# the output length: 1.5 wide is one pixel, at coordinate 0.
REF_PYTORCH_LENGTH_ONE = ORT_ONLY
# onnx.reference does not normalize negative axes ("axes don't match array"); onnxruntime 1.32
# ignores keep_aspect_ratio_policy with negative axes, so those take axes 2, 3 instead.
REF_NEGATIVE_AXES = ORT_ONLY

# (opset, input shape, scales, sizes, attributes, executors)
RESIZE_CASES = [
    *[(13, (1, 2, 4, 8), [1, 1, 2.5, 0.75], None,
       {"coordinate_transformation_mode": c, "nearest_mode": n}, BOTH)
      for c in CTMS for n in NEAREST],
    *[(13, (1, 2, 3, 8), None, [1, 2, 12, 6],
       {"coordinate_transformation_mode": c, "nearest_mode": n}, BOTH)
      for c in CTMS for n in NEAREST],
    # non-dyadic scales and sizes
    *[(13, (1, 2, 5, 3), [1, 1, 0.6, 1.5], None,
       {"coordinate_transformation_mode": c, "nearest_mode": n},
       ORT_FLOAT32_COORDINATES if n == "floor" and "half_pixel" in c else
       REF_ALIGN_CORNERS_WIDTH if c == "align_corners" else BOTH)
      for c in CTMS for n in NEAREST],
    *[(11, (1, 2, 3, 7), np.zeros(0, np.float32), [1, 2, 5, 3],
       {"coordinate_transformation_mode": c, "nearest_mode": n}, BOTH)
      for c in CTMS for n in ("round_prefer_floor", "ceil")],
    *[(19, (1, 2, 4, 6), [1, 1, 1.25, 0.75], None,
       {"coordinate_transformation_mode": "half_pixel_symmetric", "nearest_mode": n}, BOTH)
      for n in NEAREST],
    *[(19, (1, 2, 3, 7), [1, 1, 2.5, 0.5], None,
       {"coordinate_transformation_mode": "half_pixel_symmetric", "nearest_mode": n},
       REF_SYMMETRIC_FLOAT64) for n in NEAREST],
    *[(11, (1, 2, 4, 8), [1, 1, 2.5, 0.75], None,
       {"coordinate_transformation_mode": "tf_half_pixel_for_nn", "nearest_mode": n},
       REF_MISSING) for n in NEAREST],
    (11, (1, 2, 3, 8), np.zeros(0, np.float32), [1, 2, 12, 6],
     {"coordinate_transformation_mode": "tf_half_pixel_for_nn", "nearest_mode": "ceil"},
     REF_MISSING),
    # an unscaled spatial axis is copied, as both executors do (tf_half_pixel_for_nn with
    # round_prefer_ceil would otherwise move row x to x + 1)
    (11, (1, 2, 3, 4), [1, 1, 1, 2], None,
     {"coordinate_transformation_mode": "tf_half_pixel_for_nn",
      "nearest_mode": "round_prefer_ceil"}, REF_MISSING),
    (13, (1, 2, 2, 3), [1, 1, 1, 5 / 3], None, {"coordinate_transformation_mode": "asymmetric"},
     ORT_FLOAT32_SIZE),
    (13, (1, 1, 3, 5), [1, 1, 0.5, 0.3], None,
     {"coordinate_transformation_mode": "pytorch_half_pixel",
      "nearest_mode": "round_prefer_ceil"}, REF_PYTORCH_LENGTH_ONE),
    (13, (1, 1, 3, 5), [1, 1, 1.5, 0.5], None, {"coordinate_transformation_mode":
                                                "align_corners"}, REF_ALIGN_CORNERS_WIDTH),
    # default modes, integer factors, one axis only, 1-D
    (13, (1, 2, 4, 4), [1, 1, 4, 4], None, {}, BOTH),
    (13, (1, 2, 4, 4), [1, 1, 2, 2], None, {"coordinate_transformation_mode": "asymmetric",
                                            "nearest_mode": "floor"}, BOTH),
    (13, (1, 2, 7), [1, 1, 1.5], None, {}, BOTH),
    (13, (1, 2, 7), None, [1, 2, 3], {"coordinate_transformation_mode": "align_corners",
                                      "nearest_mode": "ceil"}, BOTH),
    # Resize-18: axes, keep_aspect_ratio_policy
    (18, (1, 2, 4, 8), [2.5, 0.75], None, {"axes": [2, 3], "nearest_mode": "ceil",
                                           "coordinate_transformation_mode": "asymmetric"},
     BOTH),
    (18, (1, 2, 4, 8), None, [6], {"axes": [3], "coordinate_transformation_mode":
                                   "align_corners"}, BOTH),
    (18, (1, 2, 4, 8), None, [10, 12], {"axes": [2, 3], "keep_aspect_ratio_policy":
                                        "not_larger"}, BOTH),
    (18, (1, 2, 4, 8), None, [10, 12], {"axes": [2, 3], "keep_aspect_ratio_policy":
                                        "not_smaller", "nearest_mode": "round_prefer_ceil"},
     BOTH),
    (19, (1, 2, 5, 8), None, [3, 3], {"axes": [2, 3], "keep_aspect_ratio_policy": "not_larger",
                                      "coordinate_transformation_mode":
                                      "half_pixel_symmetric"}, BOTH),
    (18, (1, 2, 4, 8), None, [10, 12], {"axes": [-2, -1]}, REF_NEGATIVE_AXES),
]

# Resize-10 and Upsample: (opset, op, input shape, scales, executors). Upsample-7 takes its
# scales as an attribute.
LEGACY_RESIZE_CASES = [
    (10, "Resize", (1, 2, 4, 10), [1, 1, 1.5, 0.6], REF_MISSING),
    (10, "Resize", (1, 2, 5, 4), [1, 1, 0.5, 3.0], REF_MISSING),
    (10, "Resize", (1, 2, 9), [1, 1, 0.4], REF_MISSING),
    (9, "Upsample", (1, 2, 3, 4), [1, 1, 2, 3], BOTH),
    (9, "Upsample", (1, 2, 3, 4), [1, 1, 1.5, 2.5], REF_MISSING),
    (7, "Upsample", (1, 2, 3, 4), [1, 1, 2, 1.5], REF_MISSING),
]


def distinct_image(in_shape, seed):
    """Every pixel a different value, so that a wrong index cannot go unnoticed."""
    size = int(np.prod(in_shape))
    return np.random.default_rng(seed).permutation(size).reshape(in_shape)


def golden_resize(x, rows, cols):
    y = golden.resize_nearest(as_image(x), rows, cols)
    return y if x.ndim == 4 else y.reshape(y.shape[0], y.shape[1], y.shape[3])


@pytest.mark.parametrize("opset,in_shape,scales,sizes,attrs,executors", RESIZE_CASES)
def test_resize_matches_onnx(opset, in_shape, scales, sizes, attrs, executors):
    x = distinct_image(in_shape, opset)
    sc = None if scales is None else np.asarray(scales, np.float32)
    sz = None if sizes is None else np.asarray(sizes, np.int64)
    rows, cols = resize_nearest_maps("Resize", attrs, in_shape, since("Resize", opset),
                                     scales=sc, sizes=sz)
    expected = golden_resize(x, rows, cols).astype(np.float32)
    consts = [np.zeros(0, np.float32) if opset < 13 else None, sc]
    if sz is not None:
        consts.append(sz)
    model = make_model("Resize", opset, x.astype(np.float32), attrs, consts)
    check_executors(model, x.astype(np.float32), expected, executors)


@pytest.mark.parametrize("opset,op,in_shape,scales,executors", LEGACY_RESIZE_CASES)
def test_legacy_resize_matches_onnx(opset, op, in_shape, scales, executors):
    x = distinct_image(in_shape, opset)
    sc = np.asarray(scales, np.float32)
    if opset == 7:
        attrs, kw, consts = {"scales": [float(s) for s in scales]}, {}, []
    else:
        attrs, kw, consts = {}, {"scales": sc}, [sc]
    rows, cols = resize_nearest_maps(op, attrs, in_shape, since(op, opset), **kw)
    expected = golden_resize(x, rows, cols).astype(np.float32)
    model = make_model(op, opset, x.astype(np.float32), {"mode": "nearest", **attrs}, consts)
    check_executors(model, x.astype(np.float32), expected, executors)


def test_resize_maps_are_exact_at_float_ties():
    # sizes 7 -> 18, asymmetric: output 9 maps to 9 * 7 / 18 = 3.5 exactly, which
    # round_prefer_ceil sends to 4; in float64 (onnx.reference) 9 / (18 / 7) is 3.4999999999999996
    # and becomes 3. onnxruntime's float32 happens to land on 3.5.
    attrs = {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "round_prefer_ceil"}
    rows, cols = resize_nearest_maps("Resize", attrs, (1, 1, 1, 7), 13, sizes=[1, 1, 1, 18])
    assert cols[9] == 4
    x = distinct_image((1, 1, 1, 7), 0)
    model = make_model("Resize", 13, x.astype(np.float32), attrs,
                       [None, None, np.array([1, 1, 1, 18], np.int64)])
    check_executors(model, x.astype(np.float32),
                    golden_resize(x, rows, cols).astype(np.float32), ["onnxruntime"])


# ---------------------------------------------------------------------------------------------
# Pad, mode constant

# (opset, input shape, pads, axes, value)
PAD_CASES = [
    (7, (1, 2, 3, 4), [0, 0, 1, 2, 0, 0, 3, 0], None, 0),
    (10, (1, 2, 5), [0, 0, 2, 0, 0, 1], None, -3),
    (11, (1, 2, 3, 4), [0, 0, 0, 1, 0, 0, 2, 2], None, 5),
    (13, (2, 3, 4), [0, 0, 3, 0, 0, 4], None, 0),
    (18, (1, 2, 3, 4), [1, 0, 2, 3], [2, 3], 7),
    (18, (1, 2, 3, 4), [2, 1], [-1], -1),
    (19, (1, 2, 3, 4), [0, 2, 1, 0, 0, 1], [1, 2, 3], 2),
    (21, (1, 2, 3, 4), [1, 1, 1, 1], [-2, 3], 0),
]


@pytest.mark.parametrize("opset,in_shape,pads,axes,value", PAD_CASES)
def test_pad_matches_onnx(opset, in_shape, pads, axes, value):
    x = np.random.default_rng(opset).integers(-50, 50, in_shape)
    version = since("Pad", opset)
    if version == 2:
        attrs, kw, consts = {"pads": pads, "value": float(value)}, {}, []
    else:
        attrs = {}
        kw = {"pads": np.array(pads, np.int64), "axes": axes}
        consts = [np.array(pads, np.int64), np.array(value, np.float32)]
        if axes is not None:
            consts.append(np.array(axes, np.int64))
    geo = pad_geometry(attrs, in_shape, version, **kw)
    y = golden.pad(as_image(x), geo, value)
    expected = (y if len(in_shape) == 4 else y[:, :, 0]).astype(np.float32)
    model = make_model("Pad", opset, x.astype(np.float32), {"mode": "constant", **attrs},
                       consts)
    check_executors(model, x.astype(np.float32), expected, ["onnx.reference"])


# ---------------------------------------------------------------------------------------------
# Through the dataflow layers and golden.run_layer

INT8 = IntType(8, True)
INT32 = IntType(32, True)
NOOP = RequantStage([1], [0], 0, 0, INT32.lo, INT32.hi, INT32)   # multiplier 1, shift 0


@pytest.mark.parametrize("case", [CONV_CASES[i] for i in (2, 4, 13, 17, 22, 27, 29, 31, 32,
                                                          33, 34, 35, 36)])
def test_conv_layer_matches_onnx(case):
    in_shape, out_channels, kernel, attrs, _, opset = case
    x, w, b = conv_data(in_shape, out_channels, kernel, attrs, seed=5)
    geo = conv_geometry(attrs, in_shape, w.shape, since("Conv", opset))
    layer = ConvLayer("conv", INT8, 0, in_shape[1:], w.reshape(*w.shape[:2], *geo.kernel), INT8,
                      b, [NOOP], stride=geo.stride, dilation=geo.dilation, pads=geo.pads,
                      group=geo.group)
    got = golden.run_layer(layer, x.reshape(len(x), -1))
    model = make_model("Conv", opset, x.astype(np.float32), attrs,
                       [w.astype(np.float32), b.astype(np.float32)])
    want = run_reference(model, x.astype(np.float32))
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("index", [2, 3, 6, 9, 10, 18, 21, 24, 27, 29, 35, 37, 40, 41, 42])
def test_pool_layer_matches_onnx(index):
    op, in_shape, attrs, opset, executors = POOL_CASES[index]
    x = np.random.default_rng(index).integers(-100, 101, in_shape)
    geo = pool_geometry(op, attrs, in_shape, since(op, opset))
    average = geo.counts is not None
    layer = PoolLayer("pool", "avg" if average else "max", INT8, in_shape[1:], geo.kernel,
                      geo.stride, geo.dilation, geo.pads, requant=[NOOP] if average else [])
    got = golden.run_layer(layer, x.reshape(len(x), -1))
    model = make_model(op, opset, x.astype(np.float32), attrs)
    want = EXECUTORS[executors[0]](model, x.astype(np.float32))
    assert got.shape == want.shape
    if average:
        # the layer's output is the window sum: the requantization stage would divide it
        counts = geo.counts.reshape(want.shape[2:])
        want = np.rint(want.astype(np.float64) * counts)
    np.testing.assert_array_equal(got, want)


# 2-D up and down, non-dyadic scale, align_corners, half_pixel_symmetric, tf_half_pixel_for_nn,
# 1-D, keep_aspect_ratio_policy, negative axes
@pytest.mark.parametrize("index", [0, 37, 42, 60, 64, 75, 79, 82])
def test_resize_layer_matches_onnx(index):
    opset, in_shape, scales, sizes, attrs, executors = RESIZE_CASES[index]
    x = distinct_image(in_shape, index) - 60
    sc = None if scales is None else np.asarray(scales, np.float32)
    sz = None if sizes is None else np.asarray(sizes, np.int64)
    rows, cols = resize_nearest_maps("Resize", attrs, in_shape, since("Resize", opset),
                                     scales=sc, sizes=sz)
    layer = ResizeLayer("resize", INT8, in_shape[1:], rows, cols)
    got = golden.run_layer(layer, x.reshape(len(x), -1))
    consts = [np.zeros(0, np.float32) if opset < 13 else None, sc] + \
        ([] if sz is None else [sz])
    model = make_model("Resize", opset, x.astype(np.float32), attrs, consts)
    want = EXECUTORS[executors[0]](model, x.astype(np.float32))
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("index", [3, 4, 6])
def test_pad_layer_matches_onnx(index):
    opset, in_shape, pads, axes, value = PAD_CASES[index]
    x = np.random.default_rng(index).integers(-50, 50, in_shape)
    consts = [np.array(pads, np.int64), np.array(value, np.float32)] + \
        ([] if axes is None else [np.array(axes, np.int64)])
    geo = pad_geometry({}, in_shape, since("Pad", opset), pads=pads, axes=axes)
    layer = PadLayer("pad", INT8, in_shape[1:], geo, value)
    got = golden.run_layer(layer, x.reshape(len(x), -1))
    want = run_reference(make_model("Pad", opset, x.astype(np.float32), {}, consts),
                         x.astype(np.float32))
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def _two_input_model(op, a, b, attrs, opset=13):
    node = helper.make_node(op, ["x", "x2"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, a.shape),
        helper.make_tensor_value_info("x2", TensorProto.FLOAT, b.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("shapes,axis", [(((1, 2, 3, 4), (1, 3, 3, 4)), 1),
                                         (((1, 2, 3, 4), (1, 2, 3, 2)), 3),
                                         (((2, 2, 5), (2, 2, 1)), -1)])
def test_concat_layer_matches_onnx(shapes, axis):
    rng = np.random.default_rng(len(shapes[0]))
    a, b = (rng.integers(-128, 128, s) for s in shapes)
    rank = len(shapes[0])
    logical = (axis + rank if axis < 0 else axis) - 1        # without the batch axis
    layer = ConcatLayer("cat", [INT8, INT8], [s[1:] for s in shapes], logical, INT8, [[], []])
    got = golden.run_layer(layer, a.reshape(len(a), -1), b.reshape(len(b), -1))
    model = _two_input_model("Concat", a, b, {"axis": axis})
    want = ReferenceEvaluator(model).run(None, {"x": a.astype(np.float32),
                                                "x2": b.astype(np.float32)})[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op,attrs,consts,out_shape,perm", [
    ("Reshape", {}, [np.array([2, 4, 6], np.int64)], (4, 6), None),
    ("Reshape", {}, [np.array([0, -1], np.int64)], (24,), None),
    ("Flatten", {"axis": 1}, [], (24,), None),
    ("Transpose", {"perm": [0, 2, 3, 1]}, [], (3, 4, 2), (1, 2, 0)),
    ("Transpose", {"perm": [0, 3, 1, 2]}, [], (4, 2, 3), (2, 0, 1)),
])
def test_view_layer_matches_onnx(op, attrs, consts, out_shape, perm):
    x = np.random.default_rng(3).integers(-128, 128, (2, 2, 3, 4))
    layer = ViewLayer("view", INT8, x.shape[1:], out_shape, perm)
    got = golden.run_layer(layer, x.reshape(len(x), -1))
    model = make_model(op, 13, x.astype(np.float32), attrs, consts)
    want = run_reference(model, x.astype(np.float32))
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------
# Tables and errors


def test_attribute_tables_follow_the_onnx_schemas():
    tables = {**geometry.CONV_ATTRIBUTES, **geometry.POOL_ATTRIBUTES,
              **geometry.RESIZE_ATTRIBUTES, **geometry.PAD_ATTRIBUTES}
    for (op, version), names in tables.items():
        schema = onnx.defs.get_schema(op, version)
        assert schema.since_version == version, (op, version)
        assert set(schema.attributes) == names, (op, version)
    # every version of these operators is covered, except the ones refused on purpose
    refused = {("Upsample", 1), ("Upsample", 10), ("Pad", 1)}
    for op in {op for op, _ in tables}:
        versions = {s.since_version for s in onnx.defs.get_all_schemas_with_history()
                    if s.name == op and s.domain == ""}
        assert {(op, v) for v in versions} - refused == {k for k in tables if k[0] == op}


def test_conv_geometry_normalizes_1d():
    geo = conv_geometry({"strides": [2], "pads": [1, 3], "dilations": [2]}, (1, 3, 10),
                        (4, 3, 3), 11)
    # (10 + 1 + 3 - ((3 - 1) * 2 + 1)) // 2 + 1 = 5 outputs
    assert geo == ((1, 3), (1, 2), (1, 2), (0, 1, 0, 3), 1, (1, 5))


CONV_ERRORS = [
    (({}, (1, 2, 4, 4, 4), (2, 2, 3, 3, 3), 11),
     "Conv-11: 3-D convolution (input shape (1, 2, 4, 4, 4)) is unsupported; only 1-D and 2-D"),
    (({"pads": [1, -1, 0, 0]}, (1, 2, 5, 5), (2, 2, 3, 3), 11),
     "Conv-11: pads=[1, -1, 0, 0] is unsupported; pads must not be negative"),
    (({"group": 3}, (1, 4, 5, 5), (3, 1, 3, 3), 11),
     "Conv-11: group=3 must divide the 4 input channels and the 3 output channels"),
    (({"group": 2}, (1, 4, 5, 5), (4, 1, 3, 3), 11),
     "Conv-11: weight shape (4, 1, 3, 3) with group=2 takes 2 input channels, not 4"),
    (({"kernel_shape": [3, 2]}, (1, 2, 5, 5), (2, 2, 3, 3), 22),
     "Conv-22: kernel_shape=[3, 2] does not match the weight shape (2, 2, 3, 3)"),
    (({"auto_pad": "SAME"}, (1, 2, 5, 5), (2, 2, 3, 3), 11),
     "Conv-11: auto_pad='SAME' is unsupported; NOTSET, SAME_UPPER, SAME_LOWER or VALID"),
    (({"auto_pad": "VALID", "pads": [1, 1, 1, 1]}, (1, 2, 5, 5), (2, 2, 3, 3), 11),
     "Conv-11: pads=[1, 1, 1, 1] cannot be used with auto_pad='VALID'"),
    (({"dilations": [3, 3]}, (1, 2, 5, 5), (2, 2, 3, 3), 11),
     "Conv-11: the output would be empty (input [5, 5], kernel [3, 3], dilations [3, 3], pads "
     "[0, 0, 0, 0])"),
    (({"strides": [1, 0]}, (1, 2, 5, 5), (2, 2, 3, 3), 11),
     "Conv-11: strides=[1, 0] and dilations=[1, 1] must be positive"),
    (({"strides": [1]}, (1, 2, 5, 5), (2, 2, 3, 3), 11),
     "Conv-11: strides must have 2 entries, not [1]"),
    (({"output_padding": [1, 1]}, (1, 2, 5, 5), (2, 2, 3, 3), 11),
     "Conv-11: attribute 'output_padding' is not defined for Conv-11"),
    (({}, (1, 2, 5, 5), (2, 2, 3), 11),
     "Conv-11: weight shape (2, 2, 3) does not fit input shape (1, 2, 5, 5)"),
    (({}, (1, 2, 5, 5), (2, 2, 3, 3), 12), "Conv version must be one of 1, 11, 22, not 12"),
    (({}, (2, 5), (2, 2, 3), 11),
     "Conv-11: input shape (2, 5) must be (N, C, W) or (N, C, H, W)"),
]


@pytest.mark.parametrize("args,message", CONV_ERRORS)
def test_conv_geometry_errors(args, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        conv_geometry(*args)


def test_geometry_type_errors():
    with pytest.raises(TypeError, match=r"^Conv-11: group must be an integer, not 1\.5$"):
        conv_geometry({"group": 1.5}, (1, 2, 5, 5), (2, 2, 3, 3), 11)
    with pytest.raises(TypeError, match=r"^Conv-11: auto_pad must be a string, not 1$"):
        conv_geometry({"auto_pad": 1}, (1, 2, 5, 5), (2, 2, 3, 3), 11)
    with pytest.raises(TypeError, match=r"^MaxPool-12: attributes must be a mapping, not list$"):
        pool_geometry("MaxPool", [], (1, 2, 5, 5), 12)
    with pytest.raises(TypeError, match=r"^Operator must be a string, not None$"):
        pool_geometry(None, {}, (1, 2, 5, 5), 12)
    with pytest.raises(TypeError, match=r"^Pad-13: pads must be a list of integers, not 3$"):
        pad_geometry({}, (1, 2, 5, 5), 13, pads=3)


POOL_ERRORS = [
    (("MaxPool", {"kernel_shape": [2, 2]}, (1, 2, 5, 5), 12), {"outputs": 2},
     "MaxPool-12: the Indices output is unsupported; only the pooled tensor"),
    (("MaxPool", {"kernel_shape": [2, 2], "storage_order": 1}, (1, 2, 5, 5), 12), {},
     "MaxPool-12: storage_order=1 is unsupported; only 0"),
    (("MaxPool", {"kernel_shape": [2, 2, 2]}, (1, 2, 5, 5, 5), 12), {},
     "MaxPool-12: 3-D pooling (input shape (1, 2, 5, 5, 5)) is unsupported; only 1-D and 2-D"),
    (("AveragePool", {"kernel_shape": [3, 3], "pads": [3, 0, 0, 0]}, (1, 2, 5, 5), 11), {},
     "AveragePool-11: pads=[3, 0, 0, 0] is unsupported; pads must be smaller than "
     "kernel_shape=[3, 3]"),
    (("AveragePool", {"kernel_shape": [3, 3], "dilations": [2, 2]}, (1, 2, 5, 5), 11), {},
     "AveragePool-11: attribute 'dilations' is not defined for AveragePool-11"),
    (("MaxPool", {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "dilations": [1, 2]},
      (1, 2, 5, 5), 12), {},
     "MaxPool-12: auto_pad='SAME_UPPER' with dilations=[1, 2] is unsupported; only with "
     "dilations of 1"),
    (("MaxPool", {"kernel_shape": [1, 1], "auto_pad": "SAME_LOWER", "strides": [2, 2]},
      (1, 2, 6, 6), 12), {},
     "MaxPool-12: auto_pad='SAME_LOWER' with kernel_shape=[1, 1] and strides=[2, 2] needs a "
     "negative padding (-1) for input [6, 6]; unsupported"),
    (("AveragePool", {"kernel_shape": [3, 3], "auto_pad": "VALID", "ceil_mode": 1},
      (1, 2, 6, 6), 19), {},
     "AveragePool-19: auto_pad='VALID' with ceil_mode=1 is unsupported; use explicit pads"),
    # rows -1 and 2 of a 2-row image: both outside
    (("MaxPool", {"kernel_shape": [2, 2], "dilations": [3, 1], "pads": [1, 0, 1, 0]},
      (1, 2, 2, 4), 12), {},
     "MaxPool-12: a window holds no input pixel and has no maximum (input [2, 4], "
     "kernel_shape [2, 2], dilations [3, 1], pads [1, 0, 1, 0]); unsupported"),
    (("AveragePool", {"kernel_shape": [2, 2], "dilations": [3, 1], "pads": [1, 0, 1, 0]},
      (1, 2, 2, 4), 19), {},
     "AveragePool-19: a window holds no input pixel and averages nothing (input [2, 4], "
     "kernel_shape [2, 2], dilations [3, 1], pads [1, 0, 1, 0]); unsupported"),
    (("MaxPool", {"strides": [2, 2]}, (1, 2, 5, 5), 12), {},
     "MaxPool-12: kernel_shape is required"),
    (("MaxPool", {"kernel_shape": [2, 2], "ceil_mode": 2}, (1, 2, 5, 5), 12), {},
     "MaxPool-12: ceil_mode must be 0 or 1, not 2"),
    (("MaxPool", {"kernel_shape": [6, 2]}, (1, 2, 5, 5), 12), {},
     "MaxPool-12: the output would be empty (input [5, 5], kernel_shape [6, 2], dilations "
     "[1, 1], pads [0, 0, 0, 0])"),
    (("MaxPool", {"kernel_shape": [2, 2], "ceil_mode": 1}, (1, 2, 5, 5), 8), {},
     "MaxPool-8: attribute 'ceil_mode' is not defined for MaxPool-8"),
    (("LpPool", {"kernel_shape": [2, 2]}, (1, 2, 5, 5), 11), {},
     "Operator 'LpPool' is not one of AveragePool, GlobalAveragePool, GlobalMaxPool, MaxPool"),
]


@pytest.mark.parametrize("args,kwargs,message", POOL_ERRORS)
def test_pool_geometry_errors(args, kwargs, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        pool_geometry(*args, **kwargs)


RESIZE_ERRORS = [
    (("Resize", {"mode": "cubic"}, (1, 2, 4, 4), 13), {"scales": [1, 1, 2, 2]},
     "Resize-13: mode='cubic' is unsupported; only 'nearest'"),
    (("Resize", {"mode": "linear"}, (1, 2, 4, 4), 10), {"scales": [1, 1, 2, 2]},
     "Resize-10: mode='linear' is unsupported; only 'nearest'"),
    (("Upsample", {"mode": "bilinear", "scales": [1, 1, 2, 2]}, (1, 2, 4, 4), 7), {},
     "Upsample-7: mode='bilinear' is unsupported; only 'nearest'"),
    (("Resize", {"coordinate_transformation_mode": "tf_crop_and_resize"}, (1, 2, 4, 4), 13),
     {"scales": [1, 1, 2, 2]},
     "Resize-13: coordinate_transformation_mode='tf_crop_and_resize' is unsupported; "
     "half_pixel, pytorch_half_pixel, align_corners, asymmetric"),
    (("Resize", {"coordinate_transformation_mode": "tf_half_pixel_for_nn"}, (1, 2, 4, 4), 13),
     {"scales": [1, 1, 2, 2]},
     "Resize-13: coordinate_transformation_mode='tf_half_pixel_for_nn' is not a mode of "
     "Resize-13; half_pixel, pytorch_half_pixel, align_corners, asymmetric"),
    (("Resize", {"exclude_outside": 1}, (1, 2, 4, 4), 13), {"scales": [1, 1, 2, 2]},
     "Resize-13: exclude_outside=1 is unsupported in mode 'nearest'; only 0"),
    (("Resize", {"antialias": 1}, (1, 2, 4, 4), 18), {"scales": [1, 1, 2, 2]},
     "Resize-18: antialias=1 is unsupported in mode 'nearest'; only 0"),
    (("Resize", {"nearest_mode": "round"}, (1, 2, 4, 4), 13), {"scales": [1, 1, 2, 2]},
     "Resize-13: nearest_mode='round' is unsupported; round_prefer_floor, round_prefer_ceil, "
     "floor, ceil"),
    (("Resize", {}, (1, 2, 4, 4), 13), {"scales": [1, 2, 2, 2]},
     "Resize-13: resizing the channel axis (2 by 2 to 4) is unsupported; only the spatial "
     "axes"),
    (("Resize", {}, (1, 2, 4, 4), 13), {"sizes": [2, 2, 8, 8]},
     "Resize-13: resizing the batch axis (1 by 2 to 2) is unsupported; only the spatial axes"),
    (("Resize", {}, (1, 2, 4, 4), 13), {"scales": [1, 1, 2, 2], "sizes": [1, 2, 8, 8]},
     "Resize-13: exactly one of scales and sizes must be given"),
    (("Resize", {}, (1, 2, 4, 4), 11), {"scales": np.zeros(0)},
     "Resize-11: exactly one of scales and sizes must be given"),
    (("Resize", {}, (1, 2, 4, 4), 13), {"scales": [1, 1, 2]},
     "Resize-13: scales must have 4 entries, not [1.0, 1.0, 2.0]"),
    (("Resize", {}, (1, 2, 4, 4), 13), {"scales": [1, 1, 0.2, 1]},
     "Resize-13: the output would be empty along axis 2 (input shape (1, 2, 4, 4))"),
    (("Resize", {}, (1, 2, 4, 4), 13), {"scales": [1, 1, -2, 1]},
     "Resize-13: scales [1.0, 1.0, -2.0, 1.0] must be finite and positive"),
    (("Upsample", {}, (1, 2, 4, 4), 9), {"scales": [1, 1, 0.5, 1]},
     "Upsample-9: scales [1.0, 1.0, 0.5, 1.0] must be finite and at least 1"),
    (("Resize", {"keep_aspect_ratio_policy": "fit"}, (1, 2, 4, 4), 18), {"sizes": [1, 2, 8, 8]},
     "Resize-18: keep_aspect_ratio_policy='fit' is unsupported; stretch, not_larger, "
     "not_smaller"),
    (("Resize", {"axes": [2, 2]}, (1, 2, 4, 4), 18), {"scales": [2, 2]},
     "Resize-18: axes=[2, 2] must be distinct axes of a rank-4 input"),
    (("Resize", {"axes": [2, 3]}, (1, 2, 4, 4), 13), {"scales": [2, 2]},
     "Resize-13: attribute 'axes' is not defined for Resize-13"),
    (("Resize", {}, (1, 2, 4, 4), 10), {"sizes": [1, 2, 8, 8]},
     "Resize-10: takes scales, not sizes"),
    (("Upsample", {"mode": "nearest"}, (1, 2, 4, 4), 10), {"scales": [1, 1, 2, 2]},
     "Upsample version must be one of 7, 9, not 10"),
]


@pytest.mark.parametrize("args,kwargs,message", RESIZE_ERRORS)
def test_resize_errors(args, kwargs, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        resize_nearest_maps(*args, **kwargs)


PAD_ERRORS = [
    (({"mode": "reflect"}, (1, 2, 4, 4), 13), {"pads": [0, 0, 1, 1, 0, 0, 1, 1]},
     "Pad-13: mode='reflect' is unsupported; only 'constant'"),
    (({"mode": "edge"}, (1, 2, 4, 4), 11), {"pads": [0, 0, 1, 1, 0, 0, 1, 1]},
     "Pad-11: mode='edge' is unsupported; only 'constant'"),
    (({"mode": "wrap"}, (1, 2, 4, 4), 19), {"pads": [0, 0, 1, 1, 0, 0, 1, 1]},
     "Pad-19: mode='wrap' is unsupported; only 'constant'"),
    (({}, (1, 2, 4, 4), 13), {"pads": [0, 1, 1, 1, 0, 0, 1, 1]},
     "Pad-13: padding the channel axis (pads=[0, 1, 1, 1, 0, 0, 1, 1]) is unsupported; only "
     "the spatial axes"),
    (({}, (1, 2, 4, 4), 18), {"pads": [1, 0], "axes": [0]},
     "Pad-18: padding the batch axis (pads=[1, 0]) is unsupported; only the spatial axes"),
    (({}, (1, 2, 4, 4), 13), {"pads": [0, 0, -1, 1, 0, 0, 1, 1]},
     "Pad-13: pads=[0, 0, -1, 1, 0, 0, 1, 1] is unsupported; negative pads (cropping) are not"),
    (({}, (1, 2, 4, 4), 13), {"pads": [0, 0, 1, 1]},
     "Pad-13: pads must have 8 entries, not [0, 0, 1, 1]"),
    (({}, (1, 2, 4, 4), 13), {"pads": [1, 1], "axes": [2]},
     "Pad-13: the axes input needs Pad-18 or later"),
    (({}, (1, 2, 4, 4), 18), {"pads": [1, 1, 1, 1], "axes": [2, -2]},
     "Pad-18: axes=[2, 2] must be distinct axes of a rank-4 input"),
    (({}, (1, 2, 4, 4), 13), {}, "Pad-13: the pads input is required"),
    (({"pads": [0, 0, 1, 1, 0, 0, 1, 1]}, (1, 2, 4, 4), 2), {"pads": [0, 0, 1, 1, 0, 0, 1, 1]},
     "Pad-2: pads are an attribute, not inputs"),
    (({}, (4, 4), 13), {"pads": [1, 1, 1, 1]},
     "Pad-13: input shape (4, 4) must be (N, C, W) or (N, C, H, W)"),
]


@pytest.mark.parametrize("args,kwargs,message", PAD_ERRORS)
def test_pad_errors(args, kwargs, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        pad_geometry(*args, **kwargs)
