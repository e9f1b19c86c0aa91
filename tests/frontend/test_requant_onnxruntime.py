"""onnxruntime's requantization (``requant="onnxruntime"``: stages rounding ``"float32"``)
against onnxruntime itself: layers whose requantization falls next to ties, where the float32
product rounded twice and the exact product rounded once disagree, and models quantized by
``quantize_static`` on hundreds of inputs."""

import numpy as np
import pytest

import onnx2fpga
from onnx2fpga.errors import OptionError
from onnx2fpga.ir import IntType, RequantStage, load_design, save_design
from onnx2fpga.sim import golden
from onnx2fpga.sim.model import run_design
from tests.helpers.models import CNN_KINDS, ort_qdq_cnn, ort_qdq_mlp, \
    ort_quantized_tensors, qdq_requant_ties


pytestmark = pytest.mark.usefixtures("quiet_quantizer")


def _ort(model, x):
    import onnxruntime as ort
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _golden(model, x, **options):
    c = onnx2fpga.compile(model, stop_after="lower", **options)
    return np.asarray(run_design(c.design, x)).reshape(x.shape), c


@pytest.mark.parametrize("op, activation, big", [
    ("gemm", "int8", True), ("gemm", "uint8", False), ("matmul", "int8", False),
    ("matmul", "uint8", True), ("conv", "int8", False), ("conv", "uint8", True),
    ("depthwise", "int8", True), ("depthwise", "uint8", False)])
def test_ties_match_onnxruntime(op, activation, big):
    model, x = qdq_requant_ties(op, activation=activation, big=big)
    ref = _ort(model, x)
    got, c = _golden(model, x)               # onnxruntime's quantizer: its requantization
    assert c.quant_info["requant"] == "onnxruntime"
    assert [st.rounding for layer in c.design.dataflow.layers for st in layer.requant] == \
        ["float32"]
    np.testing.assert_array_equal(got, ref)
    exact, c = _golden(model, x, requant="exact")
    assert c.quant_info["requant"] == "exact"
    # The crafted ties tell the two apart: the exact product differs in some channels.
    assert 0 < np.sum(exact != ref) and np.abs(exact - ref).max() == 1


@pytest.mark.parametrize("activation", ["int8", "uint8"])
def test_quantize_static_mlp_matches_onnxruntime(tmp_path, activation):
    path, _ = ort_qdq_mlp(tmp_path, sizes=(64, 48, 32, 10), activation=activation,
                          per_channel=True)
    x = np.random.default_rng(3).standard_normal((400, 1, 64)).astype(np.float32) * 2
    ref = ort_quantized_tensors(path, x)
    c = onnx2fpga.compile(path, stop_after="lower")
    assert c.quant_info["requant"] == "onnxruntime"
    assert _matches(c.design.dataflow, ref) >= 2


def _matches(df, ref) -> int:
    """The golden model, run layer after layer from onnxruntime's quantized input, equals
    every quantized tensor of onnxruntime's that a layer computes; returns how many."""
    assert {st.rounding for layer in df.layers for st in getattr(layer, "requant", [])[:1]
            if layer.kind in ("conv", "dense")} == {"float32"}
    env = {df.input.name: ref[df.input.name]}
    compared = 0
    for layer in df.layers:
        env[layer.output] = golden.run_layer(layer, *(env[t] for t in layer.inputs)).reshape(
            len(ref[df.input.name]), -1)
        if layer.output in ref:
            np.testing.assert_array_equal(env[layer.output], ref[layer.output],
                                          err_msg=layer.name)
            compared += 1
    return compared


def test_quantize_static_uint8_cnn_matches_onnxruntime(tmp_path):
    # uint8 activations: onnxruntime fuses every Conv into QLinearConv on x86 too (int8
    # activations run as DequantizeLinear, a float Conv, QuantizeLinear there).
    path, _ = ort_qdq_cnn(tmp_path, kind="depthwise", activation="uint8")
    x = np.random.default_rng(4).standard_normal((200, 1, 4, 8, 8)).astype(np.float32) * 2
    ref = ort_quantized_tensors(path, x)
    c = onnx2fpga.compile(path, stop_after="lower")
    assert _matches(c.design.dataflow, ref) >= 3


@pytest.mark.parametrize("kind", ["depthwise", "residual"])
def test_quantize_static_int8_cnn_matches_onnxruntime_integer_kernels(tmp_path, kind):
    # int8 activations with onnxruntime's integer kernels (session.qdqisint8allowed, which
    # x86 leaves off): every Conv's output equals onnxruntime's on every element; the add's
    # float32 kernel is not modelled (see the add test below), so the residual net compares
    # the layers before it, each from onnxruntime's own input.
    path, _ = ort_qdq_cnn(tmp_path, kind=kind, activation="int8")
    x = np.random.default_rng(8).standard_normal((200, 1) + CNN_KINDS[kind]).astype(np.float32)
    ref = ort_quantized_tensors(path, x * 2, integer_kernels=True)
    df = onnx2fpga.compile(path, stop_after="lower").design.dataflow
    convs = [layer for layer in df.layers if layer.kind == "conv" and layer.output in ref]
    assert len(convs) >= 2
    for layer in convs:
        got = golden.run_layer(layer, *(ref[t] for t in layer.inputs)).reshape(len(x), -1)
        np.testing.assert_array_equal(got, ref[layer.output], err_msg=layer.name)


def test_float32_stage_checks_and_round_trip(tmp_path):
    t = IntType(8, True)
    with pytest.raises(ValueError, match=r"^A float32 requantization has no offset and no "
                                         r"negative side$"):
        RequantStage([3], [1], 4, 0, -128, 127, t, rounding="float32")
    with pytest.raises(ValueError, match=r"^Multiplier 33554433 / 2\*\*30 is not a normal "
                                         r"float32$"):
        RequantStage([(1 << 25) + 1], [0], 30, 0, -128, 127, t, rounding="float32")
    path, _ = ort_qdq_mlp(tmp_path, sizes=(16, 12, 6), per_channel=True)
    d = onnx2fpga.compile(path, stop_after="lower", requant="onnxruntime").design
    save_design(d, tmp_path / "d.json", tmp_path / "d.npz")
    back = load_design(tmp_path / "d.json", tmp_path / "d.npz")
    for a, b in zip(d.dataflow.layers, back.dataflow.layers, strict=True):
        for sa, sb in zip(a.requant, b.requant, strict=True):
            assert sb.rounding == sa.rounding == "float32"
            np.testing.assert_array_equal(sa.multiplier, sb.multiplier)
            assert sa.shift == sb.shift


def test_requant_option_is_checked(tmp_path):
    path, _ = ort_qdq_mlp(tmp_path)
    with pytest.raises(OptionError, match=r"^requant must be one of onnxruntime, exact, not "
                                          r"'float'$"):
        onnx2fpga.compile(path, requant="float")


def test_models_not_from_onnxruntime_keep_the_exact_requantization():
    model, x = qdq_requant_ties("gemm")
    model.producer_name = "brevitas"
    _, c = _golden(model, x)
    assert c.quant_info["requant"] == "exact"
    assert {st.rounding for layer in c.design.dataflow.layers for st in layer.requant} == \
        {"half_even"}


@pytest.mark.parametrize("activation", ["int8", "uint8"])
def test_quantize_static_add_nearly_matches_onnxruntime(tmp_path, activation):
    # An add of two activations takes multipliers of multiplier_bits (24) under onnxruntime's
    # requantization instead of 12. On onnxruntime's own inputs it then differs from
    # onnxruntime's float32 add kernel on a few near-ties only (0.006 %), where 12 bits
    # differ far more often (0.65 % of ResNet-8's first add).
    path, _ = ort_qdq_cnn(tmp_path, kind="residual", activation=activation)
    x = np.random.default_rng(6).standard_normal((200, 1, 3, 8, 8)).astype(np.float32) * 2
    ref = ort_quantized_tensors(path, x)
    wrong = {}
    for requant in ("onnxruntime", "exact"):
        df = onnx2fpga.compile(path, stop_after="lower", requant=requant).design.dataflow
        [add] = [layer for layer in df.layers if layer.kind == "add"]
        bits = int(np.abs(np.asarray(add.multipliers, np.int64)).max()).bit_length()
        assert bits == (24 if requant == "onnxruntime" else 12)
        got = golden.run_layer(add, *(ref[t] for t in add.inputs)).reshape(len(x), -1)
        diff = np.abs(got - ref[add.output])
        assert diff.max() <= 1
        wrong[requant] = int(np.sum(diff != 0))
    assert wrong["onnxruntime"] <= 1e-4 * ref[add.output].size
    assert wrong["onnxruntime"] < wrong["exact"]


@pytest.mark.parametrize("activation", ["int8", "uint8"])
def test_quantize_static_padded_average_pool_rounds_ties_as_onnxruntime(tmp_path, activation):
    # A 3x3 average pool with pads and count_include_pad=0 (border counts 4 and 6): its exact
    # ties (a sum of 3 over 6) land on half in onnxruntime's float32 average and round to
    # even. The float32 stage does so too; a multiplier rounded to 24 bits (the exact
    # requantization) rounds them up. What is left are ties that onnxruntime's float32 sum
    # of dequantized inputs moves off half.
    path, _ = ort_qdq_cnn(tmp_path, kind="avgpool", activation=activation)
    x = np.random.default_rng(6).standard_normal((50, 1) + CNN_KINDS["avgpool"])
    ref = ort_quantized_tensors(path, x.astype(np.float32) * 2)
    wrong = {}
    for requant in ("onnxruntime", "exact"):
        df = onnx2fpga.compile(path, stop_after="lower", requant=requant).design.dataflow
        [pool] = [layer for layer in df.layers if layer.kind == "pool"]
        assert pool.requant[0].rounding == ("float32" if requant == "onnxruntime" else
                                            "half_even")
        got = golden.run_layer(pool, *(ref[t] for t in pool.inputs)).reshape(len(x), -1)
        diff = np.abs(got - ref[pool.output])
        assert diff.max() <= 1
        wrong[requant] = int(np.sum(diff != 0))
    assert wrong["exact"] >= 0.025 * ref[pool.output].size
    assert wrong["onnxruntime"] <= wrong["exact"] / 3
