"""Small ONNX models for the tests, built with onnx.helper and quantized by onnxruntime.

Nothing here needs ../shared: every model is made from a fixed seed.
"""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["float_mlp", "ort_qdq_mlp", "qdq_matmul", "save", "CNN_KINDS", "float_cnn",
           "ort_qdq_cnn", "skl2onnx_mlp", "float_softmax_mlp", "float_multi_io",
           "ort_qdq_multi_io", "block_model", "qdq_requant_ties"]


def float_mlp(sizes=(16, 12, 6), *, kind="gemm", opset=13, softmax=True, seed=0,
              trans_b=False):
    """A float MLP: Gemm (or MatMul + Add) layers with Relu between, optional Softmax."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    t = "x"
    for k, (a, b) in enumerate(zip(sizes, sizes[1:])):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        bias = (rng.standard_normal(b) * 0.1).astype(np.float32)
        if trans_b:
            w = np.ascontiguousarray(w.T)
        inits += [numpy_helper.from_array(w, f"W{k}"), numpy_helper.from_array(bias, f"B{k}")]
        if kind == "gemm":
            nodes.append(helper.make_node("Gemm", [t, f"W{k}", f"B{k}"], [f"h{k}"],
                                          name=f"fc{k}", transB=int(trans_b)))
        else:
            nodes.append(helper.make_node("MatMul", [t, f"W{k}"], [f"m{k}"], name=f"mm{k}"))
            nodes.append(helper.make_node("Add", [f"m{k}", f"B{k}"], [f"h{k}"], name=f"add{k}"))
        t = f"h{k}"
        if k < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [t], [f"r{k}"], name=f"relu{k}"))
            t = f"r{k}"
    if softmax:
        nodes.append(helper.make_node("Softmax", [t], ["y"], name="softmax", axis=-1))
        t = "y"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", sizes[0]])],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, ["N", sizes[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="onnx2fpga-tests")
    model.ir_version = 8 if opset < 21 else 10
    onnx.checker.check_model(model, full_check=True)
    return model


def save(model, path):
    onnx.save(model, str(path))
    return str(path)


def ort_qdq_mlp(tmp_path, *, sizes=(16, 12, 6), kind="gemm", opset=13, activation="int8",
                per_channel=False, seed=0, softmax=False):
    """quantize_static (QDQ, MinMax) of :func:`float_mlp`; returns (path, calibration)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    rng = np.random.default_rng(seed + 100)
    cal = rng.standard_normal((128, 1, sizes[0])).astype(np.float32)
    fp = save(float_mlp(sizes, kind=kind, opset=opset, softmax=softmax, seed=seed),
              tmp_path / f"fp_{kind}_{opset}.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"x": c} for c in cal)

        def get_next(self):
            return next(self.it, None)

    q = str(tmp_path / f"qdq_{kind}_{opset}_{activation}_{int(per_channel)}.onnx")
    quantize_static(fp, q, Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8 if activation == "int8" else
                    QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=per_channel,
                    calibrate_method=CalibrationMethod.MinMax)
    return q, cal


def qdq_matmul(n_in: int, n_out: int, *, seed: int = 0):
    """One int8 MatMul of ``n_in`` x ``n_out`` random weights in QDQ form, as onnxruntime's
    ``quantize_static`` writes a float MatMul, built directly (no onnxruntime, no float
    weights), so that a model of 16 M weights is made in a second: QuantizeLinear ->
    DequantizeLinear -> MatMul (DequantizeLinear of the int8 weight) -> QuantizeLinear ->
    DequantizeLinear."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, (n_in, n_out), dtype=np.int8)
    inits = [numpy_helper.from_array(w, "W"),
             numpy_helper.from_array(np.float32(0.01), "s_w"),
             numpy_helper.from_array(np.int8(0), "z_w"),
             numpy_helper.from_array(np.float32(0.05), "s_x"),
             numpy_helper.from_array(np.int8(0), "z_x"),
             numpy_helper.from_array(np.float32(0.05 * 0.01 * np.sqrt(n_in) * 40), "s_y"),
             numpy_helper.from_array(np.int8(0), "z_y")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["x_q"], name="q_x"),
             helper.make_node("DequantizeLinear", ["x_q", "s_x", "z_x"], ["x_dq"], name="dq_x"),
             helper.make_node("DequantizeLinear", ["W", "s_w", "z_w"], ["W_dq"], name="dq_w"),
             helper.make_node("MatMul", ["x_dq", "W_dq"], ["m"], name="mm"),
             helper.make_node("QuantizeLinear", ["m", "s_y", "z_y"], ["y_q"], name="q_y"),
             helper.make_node("DequantizeLinear", ["y_q", "s_y", "z_y"], ["y"], name="dq_y")]
    graph = helper.make_graph(
        nodes, "qdq_matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n_out])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="onnx2fpga-tests")
    model.ir_version = 8
    return model


# ---- convolutional networks -------------------------------------------------------------------

#: The kinds :func:`float_cnn` builds, each with its input shape without the batch dimension
#: (``(C, H, W)``, or ``(C, W)`` for 1-D).
CNN_KINDS = {
    "basic": (2, 8, 8),
    "residual": (3, 8, 8),
    "concat": (2, 8, 8),
    "depthwise": (4, 8, 8),
    "avgpool": (2, 8, 8),
    "conv1d": (3, 16),
    "resize": (2, 6, 6),
    "bn": (3, 8, 8),
    "pad": (2, 8, 8),
}


class _Graph:
    """Collects nodes and initializers for :func:`float_cnn`; every value gets a fresh name."""

    def __init__(self, rng):
        self.rng, self.nodes, self.inits, self.count = rng, [], [], 0

    def name(self, stem):
        self.count += 1
        return f"{stem}{self.count}"

    def const(self, stem, array):
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type, inputs, **attrs):
        out = self.name(op_type.lower() + "_")
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out + "n",
                                           **attrs))
        return out

    def conv(self, x, cin, cout, kernel, *, pads=None, group=1, gain=2.0 ** 0.5):
        """Conv with bias; weights N(0, gain**2 / fan_in) so that activations stay O(1)."""
        kernel = tuple(kernel)
        fan_in = cin // group * int(np.prod(kernel))
        w = self.rng.standard_normal((cout, cin // group) + kernel) * gain / np.sqrt(fan_in)
        b = self.rng.standard_normal(cout) * 0.1
        attrs = {"kernel_shape": list(kernel), "group": group}
        if pads is not None:
            attrs["pads"] = list(pads)
        return self.op("Conv", [x, self.const("W", w.astype(np.float32)),
                                self.const("B", b.astype(np.float32))], **attrs)

    def dense(self, x, features, classes, shape, opset):
        """Flatten then Gemm (``transB=1``, weights stored ``(classes, features)``).

        The bias centres the logits over standard normal inputs of ``shape`` (the flattened
        features' mean is measured with onnxruntime), so that the predicted class depends on the
        input rather than on a constant offset. Not ``onnx.reference``: its BatchNormalization-9
        (opsets 9..13) blends batch statistics into the running ones in inference
        (onnx/onnx#5799, fix proposed in onnx/onnx#8442).
        """
        import onnxruntime as ort

        f = self.op("Flatten", [x], axis=1)
        w = (self.rng.standard_normal((classes, features)) / np.sqrt(features)).astype(np.float32)
        probe = helper.make_graph(
            self.nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info(f, TensorProto.FLOAT, None)], self.inits)
        probe = helper.make_model(probe, opset_imports=[helper.make_opsetid("", opset)])
        probe.ir_version = 8 if opset < 21 else 10
        xs = np.random.default_rng(12345).standard_normal((64,) + shape).astype(np.float32)
        sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
        mean = sess.run(None, {"x": xs})[0].mean(axis=0)
        b = -w @ mean + self.rng.standard_normal(classes) * 0.1
        return self.op("Gemm", [f, self.const("W", w), self.const("B", b.astype(np.float32))],
                       transB=1)


def float_cnn(kind="basic", *, seed=0, opset=13, classes=5):
    """A small float CNN (NCHW, input ``x: float32[N, *CNN_KINDS[kind]]``, output
    ``y: float32[N, classes]``) with random weights, built with ``onnx.helper``.

    Kinds (``3x3`` convolutions with pads 1 unless said otherwise; every Conv has a bias):

    ``"basic"``      Conv(2->4), Relu, MaxPool(2x2, stride 2), Flatten, Gemm
    ``"residual"``   Conv(3->4), Relu, Conv(4->4), Add(skip from the Relu), Relu,
                     GlobalAveragePool, Flatten, Gemm
    ``"concat"``     two branches Conv(2->3)+Relu and Conv(2->2, 1x1)+Relu, Concat(axis 1),
                     MaxPool(2x2, stride 2), Flatten, Gemm
    ``"depthwise"``  Conv(4->4, group 4), Relu, Conv(4->6, 1x1), Relu, MaxPool(2x2, stride 2),
                     Flatten, Gemm
    ``"avgpool"``    Conv(2->4), Relu, AveragePool(3x3, stride 2, pads 1,
                     count_include_pad=0), Flatten, Gemm
    ``"conv1d"``     on ``(N, 3, 16)``: Conv(3->4, kernel 3, pads 1), Relu, MaxPool(2, stride 2),
                     Flatten, Gemm
    ``"resize"``     on ``(N, 2, 6, 6)``: Resize(nearest, scales x2, asymmetric / floor, as
                     PyTorch exports it), Conv(2->4), Relu, MaxPool(2x2, stride 2), Flatten, Gemm
    ``"bn"``         Conv(3->4), BatchNormalization, LeakyRelu(alpha 0.1), MaxPool(2x2,
                     stride 2), Flatten, Gemm
    ``"pad"``        Pad(constant 0; top 1, left 2, bottom 2, right 1), Conv(2->4, no padding),
                     Relu, MaxPool(3x3, stride 3), Flatten, Gemm

    Weights are N(0, 2 / fan_in) (Gemm: 1 / fan_in), Conv biases N(0, 0.01): activations stay
    O(1) for standard normal inputs. The Gemm bias centres the logits over such inputs, so the
    predicted class varies with the input. Deterministic for a given ``seed``.
    """
    if kind not in CNN_KINDS:
        raise ValueError(f"CNN kind must be one of {', '.join(CNN_KINDS)}, not {kind!r}")
    rng = np.random.default_rng(seed)
    g = _Graph(rng)
    shape = CNN_KINDS[kind]
    x = "x"
    p1 = [1, 1, 1, 1]
    if kind == "basic":
        t = g.op("Relu", [g.conv(x, 2, 4, (3, 3), pads=p1)])
        t = g.op("MaxPool", [t], kernel_shape=[2, 2], strides=[2, 2])
        g.dense(t, 4 * 4 * 4, classes, shape, opset)
    elif kind == "residual":
        r = g.op("Relu", [g.conv(x, 3, 4, (3, 3), pads=p1)])
        t = g.op("Add", [g.conv(r, 4, 4, (3, 3), pads=p1), r])
        t = g.op("GlobalAveragePool", [g.op("Relu", [t])])
        g.dense(t, 4, classes, shape, opset)
    elif kind == "concat":
        a = g.op("Relu", [g.conv(x, 2, 3, (3, 3), pads=p1)])
        b = g.op("Relu", [g.conv(x, 2, 2, (1, 1))])
        t = g.op("Concat", [a, b], axis=1)
        t = g.op("MaxPool", [t], kernel_shape=[2, 2], strides=[2, 2])
        g.dense(t, 5 * 4 * 4, classes, shape, opset)
    elif kind == "depthwise":
        t = g.op("Relu", [g.conv(x, 4, 4, (3, 3), pads=p1, group=4)])
        t = g.op("Relu", [g.conv(t, 4, 6, (1, 1))])
        t = g.op("MaxPool", [t], kernel_shape=[2, 2], strides=[2, 2])
        g.dense(t, 6 * 4 * 4, classes, shape, opset)
    elif kind == "avgpool":
        t = g.op("Relu", [g.conv(x, 2, 4, (3, 3), pads=p1)])
        t = g.op("AveragePool", [t], kernel_shape=[3, 3], strides=[2, 2], pads=p1,
                 count_include_pad=0)
        g.dense(t, 4 * 4 * 4, classes, shape, opset)
    elif kind == "conv1d":
        t = g.op("Relu", [g.conv(x, 3, 4, (3,), pads=[1, 1])])
        t = g.op("MaxPool", [t], kernel_shape=[2], strides=[2])
        g.dense(t, 4 * 8, classes, shape, opset)
    elif kind == "resize":
        scales = g.const("scales", np.array([1, 1, 2, 2], np.float32))
        t = g.op("Resize", [x, "", scales], mode="nearest",
                 coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        t = g.op("Relu", [g.conv(t, 2, 4, (3, 3), pads=p1)])
        t = g.op("MaxPool", [t], kernel_shape=[2, 2], strides=[2, 2])
        g.dense(t, 4 * 6 * 6, classes, shape, opset)
    elif kind == "bn":
        t = g.conv(x, 3, 4, (3, 3), pads=p1, gain=1.0)
        params = [rng.uniform(0.5, 1.5, 4), rng.standard_normal(4) * 0.1,
                  rng.standard_normal(4) * 0.2, rng.uniform(0.5, 1.5, 4)]
        t = g.op("BatchNormalization", [t] + [g.const(s, p.astype(np.float32)) for s, p in
                                              zip(("scale", "beta", "mean", "var"), params)],
                 epsilon=1e-5)
        t = g.op("LeakyRelu", [t], alpha=0.1)
        t = g.op("MaxPool", [t], kernel_shape=[2, 2], strides=[2, 2])
        g.dense(t, 4 * 4 * 4, classes, shape, opset)
    else:  # "pad"
        pads = g.const("pads", np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64))
        t = g.op("Pad", [x, pads], mode="constant")
        t = g.op("Relu", [g.conv(t, 2, 4, (3, 3))])
        t = g.op("MaxPool", [t], kernel_shape=[3, 3], strides=[3, 3])
        g.dense(t, 4 * 3 * 3, classes, shape, opset)
    g.nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        g.nodes, f"cnn_{kind}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *shape])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="onnx2fpga-tests")
    model.ir_version = 8 if opset < 21 else 10
    onnx.checker.check_model(model, full_check=True)
    return model


def ort_qdq_cnn(tmp_path, *, kind="basic", per_channel=True, opset=13, activation="int8",
                seed=0, samples=128):
    """quantize_static (QDQ, MinMax, int8 weights) of :func:`float_cnn`.

    The calibration reader feeds ``samples`` standard normal inputs one at a time. Returns
    ``(path of the QDQ model, calibration inputs (samples, 1, *CNN_KINDS[kind]))``.

    What onnxruntime's quantizer (1.32, no ``quant_pre_process``) makes of each kind:

    - Conv and Gemm: int8 weights behind a DequantizeLinear, per channel (``axis=0``, one
      scale per output channel, zero points 0) when ``per_channel``; the bias is int32 with
      scale = input scale x weight scale.
    - Relu disappears: the Q after the Conv (or the Add, in ``"residual"``) is calibrated on
      the Relu's output, so its zero point (-128 for int8, 0 for uint8) does the clamping.
      LeakyRelu stays, between DQ and Q.
    - MaxPool, AveragePool, Flatten and Pad sit between DQ and Q that reuse the input's scale
      and zero point. Add, Concat, GlobalAveragePool, LeakyRelu and BatchNormalization get an
      output Q of their own; the two Concat inputs keep different scales.
    - BatchNormalization is not folded into the Conv: its scale becomes an int8 per-tensor
      DequantizeLinear, its B an int32 one, mean and var stay float initializers.
    - Every kind is quantized end to end except ``"resize"``: the graph input is not quantized
      before a leading Resize, which runs in float; the first Q is after it.

    ``activation="int8"`` and ``"uint8"`` dequantize to the same values (MinMax: the same
    scale, zero points 128 apart).
    """
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    if activation not in ("int8", "uint8"):
        raise ValueError(f"Activation must be 'int8' or 'uint8', not {activation!r}")
    rng = np.random.default_rng(seed + 100)
    cal = rng.standard_normal((samples, 1) + CNN_KINDS[kind]).astype(np.float32)
    fp = save(float_cnn(kind, seed=seed, opset=opset), tmp_path / f"fp_cnn_{kind}_{opset}.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"x": c} for c in cal)

        def get_next(self):
            return next(self.it, None)

    q = str(tmp_path / f"qdq_cnn_{kind}_{opset}_{activation}_{int(per_channel)}.onnx")
    quantize_static(fp, q, Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8 if activation == "int8" else
                    QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=per_channel,
                    calibrate_method=CalibrationMethod.MinMax)
    return q, cal


def skl2onnx_mlp(tmp_path, *, scaler=False, zipmap=False, quantize=True, hidden=16):
    """A scikit-learn MLPClassifier on the digits (a StandardScaler before it with
    ``scaler``), trained briefly and converted by skl2onnx (outputs ``label`` and
    ``probabilities``, or ``output_label`` and a ZipMap's ``output_probability`` with
    ``zipmap``), and with ``quantize`` quantized by onnxruntime's quantize_static (QDQ, int8,
    per channel) on the first 32 digits; returns (path, digits as float32 (N, 64))."""
    import warnings

    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from skl2onnx import to_onnx

    x, y = load_digits(return_X_y=True)
    x = x.astype(np.float32)
    clf = MLPClassifier(hidden_layer_sizes=(hidden,), max_iter=30, random_state=0)
    est = make_pipeline(StandardScaler(), clf) if scaler else clf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(x, y)
    options = None if zipmap else {MLPClassifier: {"zipmap": False}}
    name = f"skl_mlp_{int(scaler)}{int(zipmap)}"
    path = save(to_onnx(est, x[:1], options=options), tmp_path / f"{name}.onnx")
    if not quantize:
        return path, x
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"X": x[k:k + 1]} for k in range(32))

        def get_next(self):
            return next(self.it, None)

    q = str(tmp_path / f"{name}_qdq.onnx")
    quantize_static(path, q, Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    per_channel=True)
    return q, x


def float_softmax_mlp(seed=6):
    """A float MatMul 'fc0' -> Softmax 'act' -> MatMul 'fc1' (16 -> 12 -> 6): the Softmax (over
    the whole vector, not a function of one element) has no hardware layer, so 'fc1' cannot
    go to hardware."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 12)) / 4).astype(np.float32),
                                     "W0"),
             numpy_helper.from_array((rng.standard_normal((12, 6)) / 4).astype(np.float32),
                                     "W1")]
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h"], name="fc0"),
             helper.make_node("Softmax", ["h"], ["s"], name="act", axis=-1),
             helper.make_node("MatMul", ["s", "W1"], ["y"], name="fc1")]
    graph = helper.make_graph(
        nodes, "sig", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="onnx2fpga-tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def float_multi_io(kind="two_heads", seed=0):
    """Float Gemm graphs with several inputs or outputs (batch 1):

    * ``two_heads``: x(12) -> Gemm 8 -> Relu -> h; outputs Gemm 4 (``a``) and Gemm 3 (``b``)
      of h (two classifier heads on a shared hidden layer);
    * ``hidden_out``: x(12) -> Gemm 8 -> Relu -> h -> Gemm 4 -> y; outputs y and h;
    * ``two_inputs``: Gemm 8 of x(12) and Gemm 8 of z(6) concatenated -> Relu -> Gemm 4 -> y.
    """
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def gemm(src, n_in, n_out, out):
        k = len(inits) // 2
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32), f"W{k}"))
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(n_out) * 0.1).astype(np.float32), f"B{k}"))
        nodes.append(helper.make_node("Gemm", [src, f"W{k}", f"B{k}"], [out], name=f"fc{k}"))

    def vi(name, n):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, n])

    inputs = [vi("x", 12)]
    if kind == "two_inputs":
        inputs.append(vi("z", 6))
        gemm("x", 12, 8, "gx")
        gemm("z", 6, 8, "gz")
        nodes.append(helper.make_node("Concat", ["gx", "gz"], ["s"], name="concat", axis=1))
        nodes.append(helper.make_node("Relu", ["s"], ["h"], name="relu"))
        gemm("h", 16, 4, "y")
        outputs = [vi("y", 4)]
    else:
        gemm("x", 12, 8, "g0")
        nodes.append(helper.make_node("Relu", ["g0"], ["h"], name="relu"))
        if kind == "two_heads":
            gemm("h", 8, 4, "a")
            gemm("h", 8, 3, "b")
            outputs = [vi("a", 4), vi("b", 3)]
        else:
            gemm("h", 8, 4, "y")
            outputs = [vi("y", 4)] + ([vi("h", 8)] if kind == "hidden_out" else [])
    graph = helper.make_graph(nodes, kind, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="onnx2fpga-tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def ort_qdq_multi_io(tmp_path, kind="two_heads", seed=0, samples=64):
    """quantize_static (QDQ, MinMax, int8) of :func:`float_multi_io`; returns (path,
    calibration as a dict of ``(samples, 1, n)`` arrays by input name)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    model = float_multi_io(kind, seed)
    rng = np.random.default_rng(seed + 100)
    cal = {i.name: rng.standard_normal(
        (samples, 1, i.type.tensor_type.shape.dim[1].dim_value)).astype(np.float32)
        for i in model.graph.input}
    fp = save(model, tmp_path / f"fp_{kind}.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({k: v[j] for k, v in cal.items()} for j in range(samples))

        def get_next(self):
            return next(self.it, None)

    q = str(tmp_path / f"qdq_{kind}.onnx")
    quantize_static(fp, q, Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)
    return q, cal


def ort_quantized_tensors(path, x, *, integer_kernels: bool = False) -> dict:
    """onnxruntime's own value of every QuantizeLinear output of the model at ``path``, for
    each sample of ``x`` (input ``x``): tensor name -> int64 ``(samples, size)``.
    ``integer_kernels``: with the session option ``session.qdqisint8allowed``, so that
    onnxruntime fuses int8-activation QDQ nodes into its integer kernels on x86 too (by
    default there it runs them as DequantizeLinear, a float op, QuantizeLinear)."""
    import onnxruntime as ort

    m = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    types = {vi.name: vi.type.tensor_type.elem_type for vi in m.graph.value_info}
    names = []
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and n.output[0] in types:
            names.append(n.output[0])
            m.graph.output.append(helper.make_tensor_value_info(n.output[0],
                                                                types[n.output[0]], None))
    so = ort.SessionOptions()
    if integer_kernels:
        so.add_session_config_entry("session.qdqisint8allowed", "1")
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = [dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": s})))
            for s in x]
    return {t: np.stack([o[t] for o in outs]).reshape(len(x), -1).astype(np.int64)
            for t in names}


def block_model(op, blocksize, *, shape=(3, 6, 6), **attrs):
    """Conv (``shape``'s channels -> 8, 3x3, pads 1), Relu, ``op`` (DepthToSpace or
    SpaceToDepth, ``blocksize``, ``attrs``), a 1x1 Conv (-> 4 channels), float, opset 13,
    input ``x`` of ``(1, *shape)``; the block view's node is named 'blocks'."""
    rng = np.random.default_rng(0)
    c = 8 * blocksize ** 2 if op == "SpaceToDepth" else 8 // blocksize ** 2
    inits = [numpy_helper.from_array(
        rng.standard_normal((8, shape[0], 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((4, max(c, 1), 1, 1)).astype(np.float32),
                                "v")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node(op, ["r"], ["b"], name="blocks", blocksize=blocksize, **attrs),
             helper.make_node("Conv", ["b", "v"], ["y"], name="conv1")]
    graph = helper.make_graph(
        nodes, "blocks", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, *shape])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def qdq_requant_ties(op="gemm", *, activation="int8", big=False, channels=32, seed=0):
    """One quantized layer whose requantization is crafted to fall next to ties: a model as
    onnxruntime's quantizer writes it (producer ``onnx.quantize``), input ``x`` quantized
    with scale 1, then DequantizeLinear, the layer with an identity weight (per-channel
    scales ``s[c]``, int32 bias ``b[c]``), QuantizeLinear with scale 1. The accumulator is
    ``x - zero_point + b[c]``; each ``s[c]`` is the float32 nearest ``(k + 0.5) / a`` for an
    accumulator ``a`` the inputs reach, so that the exact product lies within float32
    rounding of a tie: onnxruntime's float32 product (rounded twice) and the exact product
    (rounded once) then disagree on about a third of such channels. ``big``: biases beyond
    2**25, where the accumulator's conversion to float32 rounds too.

    ``op``: ``"gemm"``, ``"matmul"`` (MatMul + Add), ``"conv"`` (1x1) or ``"depthwise"``.
    Returns ``(model, x)``: every input code of the type in every channel (float32,
    ``(256, channels)`` or ``(1, channels, 16, 16)``)."""
    rng = np.random.default_rng(seed)
    lo, zx, et = (-128, 0, TensorProto.INT8) if activation == "int8" else \
        (0, 128, TensorProto.UINT8)
    npt = np.int8 if activation == "int8" else np.uint8
    b = rng.integers(-2000, 2000, channels)
    if big:
        b = b + (1 << 25) * rng.choice([-1, 1], channels) + rng.integers(0, 1 << 20, channels)
    a0 = b + rng.integers(-100, 100, channels)
    s = np.abs(((rng.integers(-100, 100, channels) + 0.5) / a0).astype(np.float32))
    c = channels
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(zx, npt), "zx"),
             numpy_helper.from_array(np.array(0, npt) if activation == "int8" else
                                     np.array(128, npt), "zy"),
             numpy_helper.from_array(s, "sw"),
             numpy_helper.from_array(np.zeros(c, np.int8), "zw"),
             numpy_helper.from_array(b.astype(np.int32), "bq"),
             numpy_helper.from_array(s, "sb"),
             numpy_helper.from_array(np.zeros(c, np.int32), "zb")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "one", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "one", "zx"], ["xf"]),
             helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bf"], axis=0)]
    codes = np.arange(lo, lo + 256, dtype=np.float32)
    if op in ("conv", "depthwise"):
        w = np.eye(c, dtype=np.int8).reshape(c, c, 1, 1) if op == "conv" else \
            np.ones((c, 1, 1, 1), np.int8)
        nodes += [helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wf"], axis=0),
                  helper.make_node("Conv", ["xf", "wf", "bf"], ["yf"],
                                   group=1 if op == "conv" else c)]
        shape = [1, c, 16, 16]
        x = np.broadcast_to(codes.reshape(1, 1, 16, 16), shape).copy()
    else:
        w = np.eye(c, dtype=np.int8)
        nodes.append(helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wf"], axis=1))
        nodes += [helper.make_node("Gemm", ["xf", "wf", "bf"], ["yf"])] if op == "gemm" else \
            [helper.make_node("MatMul", ["xf", "wf"], ["mf"]),
             helper.make_node("Add", ["mf", "bf"], ["yf"])]
        shape = [256, c]
        x = np.broadcast_to(codes.reshape(256, 1), shape).copy()
    inits.append(numpy_helper.from_array(w, "wq"))
    nodes += [helper.make_node("QuantizeLinear", ["yf", "one", "zy"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "one", "zy"], ["y"])]
    dims = [1 if op in ("conv", "depthwise") else "N", *shape[1:]]
    g = helper.make_graph(nodes, f"ties_{op}",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)],
                          producer_name="onnx.quantize")
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m, x
