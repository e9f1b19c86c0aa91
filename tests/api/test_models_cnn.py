"""The CNN test models of tests/models.py: float models run by two executors, onnxruntime's QDQ
quantization of each (per-channel Conv weights, closeness to the float model)."""

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper, version_converter
from onnx.reference import ReferenceEvaluator

from tests.helpers.models import CNN_KINDS, float_cnn, ort_qdq_cnn

KINDS = list(CNN_KINDS)

# The operators each kind was asked to exercise, in graph order.
STRUCTURE = {
    "basic": ["Conv", "Relu", "MaxPool", "Flatten", "Gemm"],
    "residual": ["Conv", "Relu", "Conv", "Add", "Relu", "GlobalAveragePool", "Flatten", "Gemm"],
    "concat": ["Conv", "Relu", "Conv", "Relu", "Concat", "MaxPool", "Flatten", "Gemm"],
    "depthwise": ["Conv", "Relu", "Conv", "Relu", "MaxPool", "Flatten", "Gemm"],
    "avgpool": ["Conv", "Relu", "AveragePool", "Flatten", "Gemm"],
    "conv1d": ["Conv", "Relu", "MaxPool", "Flatten", "Gemm"],
    "resize": ["Resize", "Conv", "Relu", "MaxPool", "Flatten", "Gemm"],
    "bn": ["Conv", "BatchNormalization", "LeakyRelu", "MaxPool", "Flatten", "Gemm"],
    "pad": ["Pad", "Conv", "Relu", "MaxPool", "Flatten", "Gemm"],
}

# Operators that onnxruntime's quantizer leaves in float (an input not from a DequantizeLinear,
# or an output not into a QuantizeLinear), as the ort_qdq_cnn docstring says.
FLOAT_IN_QDQ = {"resize": ["Resize"]}


@pytest.fixture(autouse=True)
def _quiet_quantizer():
    # quantize_static logs a pre-processing advice per call on the root logger.
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def inputs(kind, n=64, seed=1):
    return np.random.default_rng(seed).standard_normal((n,) + CNN_KINDS[kind]).astype(np.float32)


def run_ort(model, x):
    src = model if isinstance(model, str) else model.SerializeToString()
    sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def run_reference(model, x):
    # onnx.reference's BatchNormalization-9 (used for opsets 9..13) mixes batch statistics into
    # the running ones in inference (onnx/onnx#5799; fix proposed in onnx/onnx#8442): convert
    # to opset 14, whose BatchNormalization it implements as the spec says.
    if model.opset_import[0].version < 14:
        model = version_converter.convert_version(model, 14)
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


def initializers(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


@pytest.mark.parametrize("kind", KINDS)
def test_float_cnn_structure(kind):
    m = float_cnn(kind)
    nodes = m.graph.node
    assert [n.op_type for n in nodes] == STRUCTURE[kind]
    dims = [d.dim_value or d.dim_param for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["N", *CNN_KINDS[kind]]
    assert [d.dim_value or d.dim_param for d in
            m.graph.output[0].type.tensor_type.shape.dim] == ["N", 5]
    w = initializers(m)
    convs = [n for n in nodes if n.op_type == "Conv"]
    assert all(len(n.input) == 3 for n in convs)                    # every Conv has a bias
    if kind == "residual":
        relu, add = nodes[1], nodes[3]
        assert set(add.input) == {relu.output[0], nodes[2].output[0]}
    elif kind == "concat":
        assert convs[0].input[0] == convs[1].input[0] == "x" and attr(nodes[4], "axis") == 1
    elif kind == "depthwise":
        assert attr(convs[0], "group") == 4 and w[convs[0].input[1]].shape == (4, 1, 3, 3)
        assert w[convs[1].input[1]].shape == (6, 4, 1, 1)
    elif kind == "avgpool":
        pool = nodes[2]
        assert (attr(pool, "pads"), attr(pool, "count_include_pad")) == ([1, 1, 1, 1], 0)
    elif kind == "conv1d":
        assert w[convs[0].input[1]].ndim == 3
    elif kind == "resize":
        assert attr(nodes[0], "mode") == b"nearest"
        np.testing.assert_array_equal(w[nodes[0].input[2]], [1, 1, 2, 2])
    elif kind == "pad":
        assert attr(convs[0], "pads") is None
        np.testing.assert_array_equal(w[nodes[0].input[1]], [0, 0, 1, 2, 0, 0, 2, 1])


@pytest.mark.parametrize("kind, opset", [(k, 13) for k in KINDS] +
                         [("residual", 19), ("resize", 19), ("bn", 21), ("pad", 21)])
def test_float_cnn_two_executors(kind, opset):
    m = float_cnn(kind, opset=opset, seed=2)
    x = inputs(kind)
    y = run_ort(m, x)
    assert y.shape == (64, 5)
    np.testing.assert_allclose(y, run_reference(m, x), rtol=1e-4, atol=1e-5)
    # The Gemm bias centres the logits: the class depends on the input (so that argmax
    # agreement below is not won by a constant answer).
    assert len(np.unique(y.argmax(1))) >= 3
    assert 0.05 < y.std(axis=0).mean() < 5


def test_float_cnn_seed():
    a, b = float_cnn("basic", seed=0), float_cnn("basic", seed=1)
    assert a.SerializeToString() == float_cnn("basic", seed=0).SerializeToString()
    assert a.SerializeToString() != b.SerializeToString()


def test_float_cnn_bad_kind():
    with pytest.raises(ValueError, match=r"^CNN kind must be one of basic, residual, concat, "
                       r"depthwise, avgpool, conv1d, resize, bn, pad, not 'lenet'$"):
        float_cnn("lenet")


def test_ort_qdq_cnn_bad_activation(tmp_path):
    with pytest.raises(ValueError, match=r"^Activation must be 'int8' or 'uint8', not 'int4'$"):
        ort_qdq_cnn(tmp_path, activation="int4")


def float_ops(model):
    """Non-Q/DQ nodes with an activation input not from a DequantizeLinear or an output
    not consumed (only) by QuantizeLinear."""
    inits = {t.name for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    qdq = ("QuantizeLinear", "DequantizeLinear")
    found = []
    for n in model.graph.node:
        if n.op_type in qdq:
            continue
        ins = [i for i in n.input if i and i not in inits]
        float_in = any(i not in producer or producer[i].op_type != "DequantizeLinear"
                       for i in ins)
        users = [c for c in model.graph.node if n.output[0] in c.input]
        float_out = not users or any(c.op_type != "QuantizeLinear" for c in users)
        if float_in or float_out:
            found.append(n.op_type)
    return found


def check_conv_weights(qdq, fp, per_channel):
    """Every Conv of the QDQ model reads its weight through a DequantizeLinear of an int8
    initializer that is the float model's weight, per output channel (axis 0) if asked."""
    inits, finits = initializers(qdq), initializers(fp)
    producer = {o: n for n in qdq.graph.node for o in n.output}
    qconvs = [n for n in qdq.graph.node if n.op_type == "Conv"]
    fconvs = [n for n in fp.graph.node if n.op_type == "Conv"]
    assert len(qconvs) == len(fconvs) >= 1
    for qc, fc in zip(qconvs, fconvs):
        w = finits[fc.input[1]]
        dq = producer[qc.input[1]]
        assert dq.op_type == "DequantizeLinear"
        q, scale, zp = (inits[i] for i in dq.input)
        assert q.dtype == np.int8 and q.shape == w.shape
        np.testing.assert_array_equal(zp, 0)
        if per_channel:
            assert attr(dq, "axis", 1) == 0                          # the default axis is 1
            assert scale.shape == zp.shape == (w.shape[0],)
            # each channel uses its own full range, which one per-tensor scale could not do
            assert np.all(np.abs(q).reshape(len(q), -1).max(axis=1) >= 126)
        else:
            assert scale.ndim == 0
        s = scale.reshape((-1,) + (1,) * (w.ndim - 1))
        assert np.all(np.abs(q * s - w) <= s / 2 * 1.001)


QDQ_CASES = ([(k, "int8", 13) for k in KINDS] +
             [("basic", "uint8", 13), ("residual", "uint8", 13), ("bn", "uint8", 13),
              ("concat", "int8", 19), ("depthwise", "uint8", 21), ("conv1d", "int8", 21)])


@pytest.mark.parametrize("kind, activation, opset", QDQ_CASES)
def test_ort_qdq_cnn(tmp_path, kind, activation, opset):
    path, cal = ort_qdq_cnn(tmp_path, kind=kind, activation=activation, opset=opset)
    assert cal.shape == (128, 1) + CNN_KINDS[kind] and cal.dtype == np.float32
    qdq, fp = onnx.load(path), float_cnn(kind, opset=opset)
    onnx.checker.check_model(qdq, full_check=True)
    check_conv_weights(qdq, fp, per_channel=True)

    # Activations use the requested type; Relu is absorbed into the Q zero point.
    zps = [initializers(qdq)[n.input[2]] for n in qdq.graph.node if n.op_type == "QuantizeLinear"]
    assert zps and all(z.dtype == (np.int8 if activation == "int8" else np.uint8) for z in zps)
    ops = [n.op_type for n in qdq.graph.node
           if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    assert ops == [op for op in STRUCTURE[kind] if op != "Relu"]
    assert float_ops(qdq) == FLOAT_IN_QDQ.get(kind, [])

    # Close to the float model on fresh random inputs (not the calibration ones).
    x = inputs(kind, seed=7)
    f, q = run_ort(fp, x), run_ort(path, x)
    spread = f.std(axis=0).mean()
    assert np.sqrt(np.mean((q - f) ** 2)) < 0.15 * spread
    assert np.mean(q.argmax(1) == f.argmax(1)) >= 0.9


@pytest.mark.parametrize("kind", ["basic", "depthwise", "conv1d"])
def test_ort_qdq_cnn_per_tensor(tmp_path, kind):
    path, _ = ort_qdq_cnn(tmp_path, kind=kind, per_channel=False)
    check_conv_weights(onnx.load(path), float_cnn(kind), per_channel=False)


@pytest.mark.parametrize("kind", ["residual", "concat"])
def test_ort_qdq_cnn_int8_uint8_same_values(tmp_path, kind):
    """MinMax calibration gives both activation types one grid: same scale, zero points
    128 apart, so the two QDQ models compute the same values (ort_qdq_cnn docstring)."""
    a, _ = ort_qdq_cnn(tmp_path, kind=kind, activation="int8")
    b, _ = ort_qdq_cnn(tmp_path, kind=kind, activation="uint8")
    ma, mb = onnx.load(a), onnx.load(b)
    za = [initializers(ma)[n.input[2]] for n in ma.graph.node if n.op_type == "QuantizeLinear"]
    zb = [initializers(mb)[n.input[2]] for n in mb.graph.node if n.op_type == "QuantizeLinear"]
    np.testing.assert_array_equal([z.astype(int) + 128 for z in za], [z.astype(int) for z in zb])
    x = inputs(kind)
    np.testing.assert_array_equal(run_ort(a, x), run_ort(b, x))
