"""The golden model against exact rational arithmetic and onnx.reference."""

from fractions import Fraction

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx2fpga.ir.stages import RequantStage
from onnx2fpga.ir.types import IntType
from onnx2fpga.sim import golden, host


def _round_exact(fr: Fraction, mode: str) -> int:
    floor = fr.numerator // fr.denominator
    rem = fr - floor
    if mode == "floor":
        return floor
    if mode == "ceil":
        return floor + (rem != 0)
    if mode == "to_zero":
        return floor + (rem != 0 and fr < 0)
    if rem > Fraction(1, 2):
        return floor + 1
    if rem < Fraction(1, 2):
        return floor
    if mode == "half_even":
        return floor + (floor & 1)
    return floor + 1 if fr > 0 else floor


@pytest.mark.parametrize("mode", ["half_even", "half_away", "floor", "ceil", "to_zero"])
@pytest.mark.parametrize("shift", [0, 1, 2, 7, 20])
def test_round_shift_matches_exact_rounding(mode, shift):
    rng = np.random.default_rng(shift)
    v = np.concatenate([rng.integers(-(1 << 40), 1 << 40, 500),
                        np.arange(-40, 41) << max(shift - 1, 0)])
    got = golden.round_shift(v, shift, mode)
    want = [_round_exact(Fraction(int(x), 1 << shift), mode) for x in v]
    np.testing.assert_array_equal(got, want)


def test_requant_matches_rational_definition():
    rng = np.random.default_rng(3)
    out = IntType(8, True)
    st = RequantStage(rng.integers(1, 1 << 20, 6), rng.integers(-(1 << 25), 1 << 25, 6), 21,
                      zero_point=-5, lo=-5, hi=127, out_type=out, in_zero_point=3)
    x = rng.integers(-3000, 3000, (50, 6))
    got = golden.requant(x, st)
    for r in range(50):
        for c in range(6):
            fr = Fraction(int((x[r, c] - 3) * st.multiplier[c] + st.offset[c]), 1 << 21)
            want = min(max(_round_exact(fr, "half_even") - 5, -5), 127)
            assert got[r, c] == want


def test_requant_stage_rejects_clip_outside_type():
    with pytest.raises(ValueError, match=r"^Clip range \[-200, 10\] must lie within int8$"):
        RequantStage([1], [0], 0, 0, -200, 10, IntType(8, True))


@pytest.mark.parametrize("bits,signed", [(8, True), (8, False), (16, True), (4, True)])
def test_quantize_linear_matches_reference(bits, signed):
    rng = np.random.default_rng(bits)
    x = (rng.standard_normal((4, 33)) * 40).astype(np.float32)
    x[0, :5] = [0.5, 1.5, 2.5, -0.5, -2.5]   # ties
    scale, zp = np.float32(0.5 if bits < 8 else 0.37), (3 if signed else 10)
    qt = IntType(bits, signed)
    got = golden.quantize_linear(x, scale, zp, qt.lo, qt.hi)
    if bits in (8, 16):
        dt = {(8, True): TensorProto.INT8, (8, False): TensorProto.UINT8,
              (16, True): TensorProto.INT16}[(bits, signed)]
        node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
        g = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", 1, x.shape)],
                              [helper.make_tensor_value_info("y", dt, x.shape)],
                              [helper.make_tensor("s", 1, [], [scale]),
                               helper.make_tensor("z", dt, [], [zp])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
        want = ReferenceEvaluator(m).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, want.astype(np.int64))
    else:
        want = np.clip(np.rint(x / scale) + zp, qt.lo, qt.hi)   # numpy rint: half to even
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dt", [TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_linear_saturates_infinities_as_onnxruntime(dt, per_axis):
    """-inf goes to the lowest code, +inf and values beyond int64 to the highest, exactly as
    onnxruntime's QuantizeLinear (they wrapped in the conversion to int64 before)."""
    import onnxruntime as ort

    big = [-np.inf, np.inf, 1e30, -1e30, 2.0 ** 63, -2.0 ** 63, 2.0 ** 64, -(2.0 ** 64),
           np.finfo(np.float32).max, np.finfo(np.float32).min, 9.3e18, -9.3e18, 0.0, 3.7]
    x = np.array([big, big[::-1], big[1:] + big[:1]], np.float32)
    np_dt = helper.tensor_dtype_to_np_dtype(dt)
    qt = IntType(np.iinfo(np_dt).bits, np.iinfo(np_dt).min < 0)
    scale = np.array([0.5, 0.02, 3.0], np.float32) if per_axis else np.float32(0.25)
    zp = (np.array([-3, 5, 0]) if qt.signed else np.array([7, 200, 0])) if per_axis \
        else np.array(1 if qt.signed else 9)
    got = golden.quantize_linear(x, scale, zp, qt.lo, qt.hi, axis=0)
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=0)
    g = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", 1, x.shape)],
                          [helper.make_tensor_value_info("y", dt, x.shape)],
                          [helper.make_tensor("s", 1, np.shape(scale), np.ravel(scale)),
                           helper.make_tensor("z", dt, np.shape(zp), np.ravel(zp))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want.astype(np.int64))
    assert got[0, 0] == qt.lo and got[0, 1] == qt.hi
    with pytest.raises(ValueError, match="NaN has no quantized value"):
        golden.quantize_linear(np.float32([1.0, np.nan]), np.float32(0.5), 0, qt.lo, qt.hi)


def _ref(op, inputs, attrs, opset=13):
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    if opset < 13:
        # onnx.reference applies Softmax-13 semantics to Softmax-11 (no 2-D coercion);
        # onnxruntime follows the opset-11 spec, so it is the reference there.
        import onnxruntime as ort
        m.ir_version = 7
        return ort.InferenceSession(m.SerializeToString()).run(None, dict(zip(names, inputs)))[0]
    return ReferenceEvaluator(m).run(None, dict(zip(names, inputs)))[0]


@pytest.mark.parametrize("op,shapes,attrs,opset", [
    ("Softmax", [(2, 3, 5)], {"axis": 1}, 13),
    ("Softmax", [(2, 3, 5)], {"axis": 1}, 11),
    ("LogSoftmax", [(3, 7)], {}, 13),
    ("Gemm", [(2, 5), (4, 5), (4,)], {"transB": 1, "alpha": 0.5, "beta": 2.0}, 13),
    ("Flatten", [(2, 3, 4)], {"axis": 2}, 13),
    ("Relu", [(3, 4)], {}, 13),
    ("Sigmoid", [(3, 4)], {}, 13),
    ("Add", [(3, 4), (4,)], {}, 13),
    ("Mul", [(3, 4), (3, 1)], {}, 13),
    ("Transpose", [(2, 3, 4)], {"perm": [2, 0, 1]}, 13),
    ("SpaceToDepth", [(2, 3, 6, 4)], {"blocksize": 2}, 13),
    ("DepthToSpace", [(2, 18, 2, 3)], {"blocksize": 3}, 13),
    ("DepthToSpace", [(2, 8, 3, 2)], {"blocksize": 2, "mode": "DCR"}, 11),
    ("DepthToSpace", [(2, 8, 3, 2)], {"blocksize": 2, "mode": "CRD"}, 13),
])
def test_host_ops_match_reference(op, shapes, attrs, opset):
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    want = _ref(op, inputs, attrs, opset)
    got = host.HOST_OPS[op](*inputs, version=opset, **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_threshold_stage_counts_thresholds_per_channel():
    """FINN MultiThreshold semantics: base + step * (number of thresholds x reaches)."""
    from onnx2fpga.ir.stages import ThresholdStage
    rng = np.random.default_rng(4)
    t = np.sort(rng.integers(-50, 50, size=(3, 3)), axis=1)
    st = ThresholdStage(t, base=-1, step=2, out_type=IntType(4, True))
    x = rng.integers(-60, 60, size=(20, 3, 2, 2))
    got = golden.requant(x, st)
    for b, c, h, w in np.ndindex(x.shape):
        k = sum(int(x[b, c, h, w] >= t[c, i]) for i in range(3))
        assert got[b, c, h, w] == -1 + 2 * k
    shared = ThresholdStage(t[:1], base=0, step=1, out_type=IntType(2, False))
    np.testing.assert_array_equal(golden.requant(x[:, 0], shared),
                                  (x[:, 0, ..., None] >= t[0]).sum(axis=-1))


@pytest.mark.parametrize("rounding, expected", [
    ("half_even", [-2, -2, -1, 0, 0, 2, 2]), ("half_away", [-3, -2, -1, 0, 1, 2, 3]),
    ("half_up", [-2, -1, -1, 0, 1, 2, 3]), ("floor", [-3, -2, -2, 0, 0, 2, 2]),
    ("ceil", [-2, -1, -1, 0, 1, 3, 3]), ("to_zero", [-2, -1, -1, 0, 0, 2, 2]),
])
def test_quantize_rounding_modes(rounding, expected):
    x = np.array([-2.5, -1.5, -1.2, 0.0, 0.5, 2.4, 2.5], np.float32)
    np.testing.assert_array_equal(golden.quantize_linear(x, 1.0, 0, -8, 7, rounding=rounding),
                                  expected)
    np.testing.assert_array_equal(golden.quantize_linear(x, 1.0, 0, -1, 1, bipolar=True),
                                  np.where(x >= 0, 1, -1))


@pytest.mark.parametrize("largest", [1, 0])
def test_host_topk_matches_reference(largest):
    """TopK has two outputs (values, indices): the host interpreter stores both; ties go to
    the lower index."""
    x = np.random.default_rng(5).integers(0, 4, size=(3, 7)).astype(np.float32)
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1, largest=largest)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      None),
                                        helper.make_tensor_value_info("k", TensorProto.INT64,
                                                                      None)],
                          [helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    want = ReferenceEvaluator(m).run(None, {"x": x, "k": np.array([3])})

    class N:
        op, inputs, outputs, version = "TopK", ["x", "k"], ["v", "i"], 11
        attrs = {"axis": -1, "largest": largest}
    env = host.run_nodes([N()], {"x": x, "k": np.array([3])}, {})
    np.testing.assert_array_equal(env["v"], want[0])
    np.testing.assert_array_equal(env["i"], want[1])
