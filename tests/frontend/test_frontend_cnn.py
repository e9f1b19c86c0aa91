"""Convolutional networks through the frontend, judged against onnxruntime.

- Models quantized by onnxruntime (QDQ, per-channel weights): every hardware layer's integers
  are compared with onnxruntime's own quantized tensors.
- Float models with our calibration at 16 bits: the quantization error is tiny, so the
  comparison with the float model checks the operator semantics (padding, strides,
  dilation, groups, pooling counts, resize maps, stream orders of views).
- Float models at int8: the prediction survives.
- Options the hardware does not support are reported by node, operator and option.
"""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx2fpga
from onnx2fpga.errors import UnsupportedError
from onnx2fpga.ir.layers import ConvLayer
from onnx2fpga.sim import golden
from onnx2fpga.sim.model import run_design, run_head
from tests.helpers.models import CNN_KINDS, float_cnn, ort_qdq_cnn, ort_quantized_tensors

KINDS = list(CNN_KINDS)


pytestmark = pytest.mark.usefixtures("quiet_quantizer")


def on_onnxruntime_inputs(design, x, ref):
    """Each hardware layer whose output onnxruntime quantizes (``ref``:
    :func:`~tests.helpers.models.ort_quantized_tensors` of the inputs ``x``), with the golden
    model's output on onnxruntime's own input integers: ``(layer, got)`` pairs; the other
    layers' golden outputs feed the layers after them."""
    env = dict(ref)
    env.setdefault(design.dataflow.input.name, run_head(design, x))
    for layer in design.dataflow.layers:
        got = golden.run_layer(layer, *(env[t] for t in layer.inputs)).reshape(len(x), -1)
        if layer.output in ref:
            yield layer, got
        else:
            env[layer.output] = got


def _inputs(kind, n, seed):
    return np.random.default_rng(seed).standard_normal((n, 1) + CNN_KINDS[kind]).astype(
        np.float32)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("activation, opset", [("int8", 13), ("uint8", 21)])
def test_ort_qdq_cnn_layers_match_onnxruntime(tmp_path, kind, activation, opset):
    path, _ = ort_qdq_cnn(tmp_path, kind=kind, activation=activation, opset=opset)
    d = onnx2fpga.compile(path)
    df = d.design.dataflow
    x = _inputs(kind, 60, 1)
    ref = ort_quantized_tensors(path, x)
    compared = 0
    for layer, got in on_onnxruntime_inputs(d.design, x, ref):
        diff = np.abs(got - ref[layer.output])
        # Exact, except where onnxruntime's float32 kernels (average pool, add) round a
        # value next to a tie the other way: then one step.
        assert diff.max() <= 1, layer.name
        assert np.mean(diff == 0) >= 0.95, layer.name
        if layer.kind in ("conv", "dense", "concat", "pad"):
            np.testing.assert_array_equal(got, ref[layer.output], err_msg=layer.name)
        compared += 1
    assert compared >= 2
    # Per-channel weights give per-channel requantization.
    for layer in df.layers:
        if isinstance(layer, ConvLayer) and layer.out_channels > 1 and not layer.depthwise:
            assert layer.requant[0].multiplier.size == layer.out_channels


@pytest.mark.parametrize("kind", KINDS)
def test_float_cnn_semantics_at_16_bits(kind):
    """16-bit weights and activations: the golden model tracks the float model within a
    fraction of a percent of its output range (on the calibration inputs themselves, so that
    no value saturates: the point is the operators, not the calibration)."""
    model = float_cnn(kind)
    x = _inputs(kind, 40, 2)
    d = onnx2fpga.compile(model, calibration=x, weight_bits=16, activation_bits=16,
                          multiplier_bits=24)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"x": x[:, 0]})[0]
    got = d.simulate(x, engine="golden")[:, 0]
    span = float(np.ptp(ref))
    assert np.abs(got - ref).max() < 2e-3 * span


@pytest.mark.parametrize("kind", KINDS)
def test_float_cnn_int8_keeps_the_prediction(kind):
    model = float_cnn(kind)
    d = onnx2fpga.compile(model, calibration=_inputs(kind, 200, 4))
    x = _inputs(kind, 200, 5)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"x": x[:, 0]})[0]
    got = d.simulate(x, engine="golden")[:, 0]
    assert np.mean(np.argmax(got, 1) == np.argmax(ref, 1)) >= 0.9


def test_batchnorm_and_leaky_relu_fold_into_the_convolution():
    d = onnx2fpga.compile(float_cnn("bn"), calibration=_inputs("bn", 50, 6))
    kinds = [ly.kind for ly in d.design.dataflow.layers]
    assert kinds.count("requant") == 0 and kinds[0] == "conv"
    conv = d.design.dataflow.layers[0]
    assert conv.requant[0].neg_multiplier is not None            # LeakyRelu
    names = {n.name: n.op_type for n in float_cnn("bn").graph.node}
    assert {"BatchNormalization", "LeakyRelu"} <= {names.get(n) for n in conv.nodes}


def _conv_model(kernel, mode=None):
    w = numpy_helper.from_array(np.ones((3, 2, kernel, kernel), np.float32), "w")
    nodes, inits, src = [], [w], "x"
    if mode is not None:
        inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "sc"))
        nodes.append(helper.make_node("Resize", ["x", "", "sc"], ["r"], name="rs", mode=mode))
        src = "r"
    nodes.append(helper.make_node("Conv", [src, "w"], ["y"], name="c",
                                  kernel_shape=[kernel, kernel]))
    size = 12 * (2 if mode else 1) - kernel + 1
    g = helper.make_graph(nodes, "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 2, 12, 12))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         (1, 3, size, size))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("kernel, mode, message", [
    (3, "cubic", r"^Node 'rs' \(Resize, opset 13\): mode='cubic' is unsupported; only "
                 r"'nearest'$"),
])
def test_unsupported_options_are_named_before_hardware_work(tmp_path, kernel, mode, message):
    cal = np.random.default_rng(0).standard_normal((4, 1, 2, 12, 12)).astype(np.float32)
    with pytest.raises(UnsupportedError, match=message):
        onnx2fpga.compile(_conv_model(kernel, mode), tmp_path / "d", calibration=cal)
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("kernel", [8, 9, 12])
def test_large_kernels_track_the_float_model(kernel):
    """Any kernel the window core can slide (up to the whole 12x12 image): at 16 bits the
    golden model follows onnxruntime's float convolution."""
    model = _conv_model(kernel)
    x = np.random.default_rng(0).standard_normal((20, 1, 2, 12, 12)).astype(np.float32)
    d = onnx2fpga.compile(model, calibration=x, weight_bits=16, activation_bits=16,
                          multiplier_bits=24, stop_after="lower")
    assert d.design.dataflow.layers[0].kernel == (kernel, kernel)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = np.stack([sess.run(None, {"x": s})[0] for s in x])
    got = run_design(d.design, x).reshape(ref.shape)
    assert np.abs(got - ref).max() < 2e-3 * float(np.ptp(ref))


# TensorFlow's SAME padding of the 10x4 stride-2 convolution on the 49x10 map (its converters
# write it out, or as auto_pad): ceil(49 / 2) = 25 rows need (25 - 1) * 2 + 10 - 49 = 9 rows
# of padding, the odd one at the end (SAME_UPPER, TensorFlow's) or at the start (SAME_LOWER);
# ceil(10 / 2) = 5 columns need (5 - 1) * 2 + 4 - 10 = 2 columns, one each side. torch
# writes them as nn.ZeroPad2d in front of an unpadded convolution: onnxruntime's quantizer
# then puts a QuantizeLinear between the Pad and the Conv, and quantizes the Pad's value too;
# the pad merges into the convolution all the same.
@pytest.mark.parametrize("padding, pads", [("pads", (4, 1, 5, 1)), ("SAME_UPPER", (4, 1, 5, 1)),
                                           ("SAME_LOWER", (5, 1, 4, 1)),
                                           ("ZeroPad2d", (4, 1, 5, 1))])
def test_ds_cnn_with_tensorflow_padding_matches_onnxruntime(tmp_path, padding, pads):
    """MLPerf Tiny's keyword-spotting DS-CNN in small (torch, legacy exporter, onnxruntime
    QDQ per-channel): the 10x4 stride-2 convolution with TensorFlow's asymmetric SAME pads
    gives the 25x5 map, the average pool over the whole map is the global pool's hardware
    (no window), and every layer's integers are onnxruntime's; the logits' quantized
    Softmax within one step of onnxruntime's."""
    pytest.importorskip("torch")
    from tests.helpers.torch_models import DS_CNN_SHAPE, ds_cnn_qdq, output_step

    _, path, _ = ds_cnn_qdq(tmp_path, padding=padding)
    d = onnx2fpga.compile(path, stop_after="lower")
    df = d.design.dataflow
    assert [ly.kind for ly in df.layers] == ["conv", "conv", "conv", "pool", "view", "dense"]
    first, pool = df.layers[0], df.layers[3]
    assert (first.kernel, first.stride, first.pads) == ((10, 4), (2, 2), pads)
    assert any(n.endswith("/Pad") for n in first.nodes) == (padding == "ZeroPad2d")
    assert first.in_shape == (1, 49, 10) and first.out_shape == (8, 25, 5)
    assert pool.kernel == (25, 5) and pool.is_global
    x = np.random.default_rng(3).standard_normal((40, 1) + DS_CNN_SHAPE).astype(np.float32)
    ref = ort_quantized_tensors(path, x)
    compared = 0
    for layer, got in on_onnxruntime_inputs(d.design, x, ref):
        diff = np.abs(got - ref[layer.output])
        # onnxruntime's float32 average pool may round a value next to a tie the other way
        assert diff.max() <= (1 if layer.kind == "pool" else 0), layer.name
        compared += 1
    assert compared == 5
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = np.stack([sess.run(None, {"x": s})[0] for s in x])
    got = run_design(d.design, x).reshape(want.shape)
    assert np.abs(got - want).max() <= output_step(path) * (1 + 1e-6)
    assert np.mean(got.argmax(-1) == want.argmax(-1)) >= 0.95


@pytest.mark.parametrize("value, kinds", [(0.0, ["conv"]), (0.5, ["pad", "conv"])])
def test_a_quantized_pad_merges_into_the_convolution_only_with_zero(tmp_path, value, kinds):
    """A Pad quantized on its own by onnxruntime (its own QuantizeLinear before the Conv's
    DequantizeLinear): a zero pad joins the convolution's padding, another value stays a
    pad layer; either way the output is onnxruntime's."""
    from tests.helpers.torch_models import ort_quantize

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((3, 2, 3, 3)).astype(np.float32), "w")
    pads = numpy_helper.from_array(np.array([0, 0, 1, 0, 0, 0, 2, 1], np.int64), "pads")
    val = numpy_helper.from_array(np.array(value, np.float32), "val")
    nodes = [helper.make_node("Pad", ["x", "pads", "val"], ["p"], name="pad"),
             helper.make_node("Conv", ["p", "w"], ["y"], name="conv", strides=[2, 2])]
    g = helper.make_graph(nodes, "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 2, 7, 6))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 3, 4, 3))],
                          [w, pads, val])
    fp = tmp_path / "fp.onnx"
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    fp.write_bytes(m.SerializeToString())
    x = rng.standard_normal((20, 1, 2, 7, 6)).astype(np.float32)
    path = ort_quantize(str(fp), tmp_path / "qdq.onnx", x)
    d = onnx2fpga.compile(path, stop_after="lower")
    df = d.design.dataflow
    assert [ly.kind for ly in df.layers] == kinds
    assert df.layers[-1].pads == ((1, 0, 2, 1) if value == 0.0 else (0, 0, 0, 0))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = np.stack([sess.run(None, {"x": s})[0] for s in x])
    got = run_design(d.design, x).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)    # the same integers
