"""Train the digits CNN example in numpy; export it to ONNX (float) with calibration and test data.

scikit-learn's ``load_digits`` (1,797 real 8x8 handwritten digits, shipped inside the
scikit-learn wheel), split exactly as in ``examples/digits`` (``test_size=0.25,
random_state=0, stratify=y``: the same 450 test digits), trains a small residual CNN. Forward
and backward passes are written by hand in numpy (im2col convolutions, Adam); no deep-learning
framework is used. The model is written with ``onnx.helper`` (opset 13), input
``x: float32[N, 1, 8, 8]`` (pixels / 16, as in the MLP example)::

    Conv(1->8, 3x3, pads 1, no bias) -> BatchNormalization -> Relu -> MaxPool(2x2, stride 2)
    -> Conv(8->16, 3x3, pads 1) -> Relu  ------------------------------+
    -> Conv(16->16, 3x3, pads 1) -> Relu -> Add(residual) <------------+
    -> GlobalAveragePool -> Flatten -> Gemm(16->10, transB=1)  -> logits: float32[N, 10]

Writes, next to this file: ``model.onnx``, ``calibration.npy`` (200 training images, drawn as
in the MLP example), ``test_x.npy`` / ``test_y.npy`` (the held-out test split). Checks that
onnxruntime and the numpy forward pass agree within 1e-4. Deterministic: a fixed seed.

    python examples/cnn_digits/train.py
"""

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 0
EPOCHS = 40
BATCH = 32
LR = 3e-3
WEIGHT_DECAY = 1e-4
BN_EPSILON = 1e-5


# ---- layers: forward returns (output, cache), backward takes (gradient, cache) ----------------

def _cols(x):
    """im2col of a 3x3, stride 1, pads 1 convolution: ``(N, C, H, W) -> (N*H*W, C*9)``."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))  # N, C, H, W, 3, 3
    return win.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * w, c * 9)


def conv_forward(x, w, b):
    n, _, h, ww = x.shape
    cols = _cols(x)
    y = cols @ w.reshape(len(w), -1).T
    if b is not None:
        y = y + b
    return y.reshape(n, h, ww, len(w)).transpose(0, 3, 1, 2), (x.shape, cols, w)


def conv_backward(dy, cache):
    (n, c, h, w), cols, wt = cache
    dyf = dy.transpose(0, 2, 3, 1).reshape(n * h * w, len(wt))
    dw = (dyf.T @ cols).reshape(wt.shape)
    db = dyf.sum(0)
    dcols = (dyf @ wt.reshape(len(wt), -1)).reshape(n, h, w, c, 3, 3)
    dxp = np.zeros((n, c, h + 2, w + 2), dy.dtype)
    for i in range(3):                     # col2im: add each kernel tap back where it came from
        for j in range(3):
            dxp[:, :, i:i + h, j:j + w] += dcols[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    return dxp[:, :, 1:-1, 1:-1], dw, db


def bn_forward_train(x, gamma, beta):
    mean = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    inv = 1.0 / np.sqrt(var + BN_EPSILON)
    xhat = (x - mean[:, None, None]) * inv[:, None, None]
    return gamma[:, None, None] * xhat + beta[:, None, None], (xhat, inv, gamma)


def bn_backward(dy, cache):
    xhat, inv, gamma = cache
    m = dy.shape[0] * dy.shape[2] * dy.shape[3]
    dbeta = dy.sum(axis=(0, 2, 3))
    dgamma = (dy * xhat).sum(axis=(0, 2, 3))
    dxhat = dy * gamma[:, None, None]
    dx = (inv[:, None, None] / m) * (m * dxhat - dxhat.sum(axis=(0, 2, 3))[:, None, None]
                                     - xhat * (dxhat * xhat).sum(axis=(0, 2, 3))[:, None, None])
    return dx, dgamma, dbeta


def maxpool_forward(x):
    """2x2, stride 2 (H and W even)."""
    n, c, h, w = x.shape
    win = x.reshape(n, c, h // 2, 2, w // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(
        n, c, h // 2, w // 2, 4)
    arg = win.argmax(-1)                   # the gradient goes to one element, even on ties
    return np.take_along_axis(win, arg[..., None], -1)[..., 0], (x.shape, arg)


def maxpool_backward(dy, cache):
    (n, c, h, w), arg = cache
    dwin = np.zeros(dy.shape + (4,), dy.dtype)
    np.put_along_axis(dwin, arg[..., None], dy[..., None], -1)
    return dwin.reshape(n, c, h // 2, w // 2, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(
        n, c, h, w)


# ---- the network ------------------------------------------------------------------------------

def init_params(rng):
    def he(shape):
        fan_in = int(np.prod(shape[1:]))
        return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)

    return {
        "conv1_w": he((8, 1, 3, 3)),
        "bn1_scale": np.ones(8), "bn1_bias": np.zeros(8),
        "conv2_w": he((16, 8, 3, 3)), "conv2_b": np.zeros(16),
        "conv3_w": he((16, 16, 3, 3)), "conv3_b": np.zeros(16),
        "fc_w": rng.standard_normal((10, 16)) * np.sqrt(1.0 / 16), "fc_b": np.zeros(10),
    }


def forward(p, x, stats=None):
    """Logits of images ``x (N, 1, 8, 8)``.

    ``stats=None``: training mode (batch statistics in BatchNormalization), returns
    ``(logits, caches, (batch mean, batch variance))``. Otherwise ``stats = (mean, var)`` are
    the running statistics (inference, what the ONNX model computes) and only logits return.
    """
    caches = {}
    c1, caches["conv1"] = conv_forward(x, p["conv1_w"], None)
    if stats is None:
        batch_stats = (c1.mean(axis=(0, 2, 3)), c1.var(axis=(0, 2, 3)))
        bn, caches["bn1"] = bn_forward_train(c1, p["bn1_scale"], p["bn1_bias"])
    else:
        mean, var = stats
        bn = ((c1 - mean[:, None, None]) / np.sqrt(var[:, None, None] + BN_EPSILON)
              * p["bn1_scale"][:, None, None] + p["bn1_bias"][:, None, None])
    r1 = np.maximum(bn, 0)
    m1, caches["pool1"] = maxpool_forward(r1)
    c2, caches["conv2"] = conv_forward(m1, p["conv2_w"], p["conv2_b"])
    r2 = np.maximum(c2, 0)
    c3, caches["conv3"] = conv_forward(r2, p["conv3_w"], p["conv3_b"])
    r3 = np.maximum(c3, 0)
    s = r2 + r3
    g = s.mean(axis=(2, 3))                                 # GlobalAveragePool + Flatten
    logits = g @ p["fc_w"].T + p["fc_b"]
    if stats is not None:
        return logits
    caches.update(bn=bn, c2=c2, c3=c3, g=g, hw=s.shape[2:])
    return logits, caches, batch_stats


def backward(p, dlogits, caches):
    grads = {}
    grads["fc_w"] = dlogits.T @ caches["g"]
    grads["fc_b"] = dlogits.sum(0)
    dg = dlogits @ p["fc_w"]
    h, w = caches["hw"]
    ds = np.broadcast_to(dg[:, :, None, None] / (h * w), dg.shape + (h, w))
    dr2 = ds.copy()                                         # the residual branch
    dc3 = ds * (caches["c3"] > 0)
    dr2_main, grads["conv3_w"], grads["conv3_b"] = conv_backward(dc3, caches["conv3"])
    dr2 += dr2_main
    dc2 = dr2 * (caches["c2"] > 0)
    dm1, grads["conv2_w"], grads["conv2_b"] = conv_backward(dc2, caches["conv2"])
    dr1 = maxpool_backward(dm1, caches["pool1"])
    dbn = dr1 * (caches["bn"] > 0)
    dc1, grads["bn1_scale"], grads["bn1_bias"] = bn_backward(dbn, caches["bn1"])
    _, grads["conv1_w"], _ = conv_backward(dc1, caches["conv1"])
    return grads


def softmax_cross_entropy(logits, y):
    z = logits - logits.max(1, keepdims=True)
    prob = np.exp(z)
    prob /= prob.sum(1, keepdims=True)
    loss = -np.log(prob[np.arange(len(y)), y]).mean()
    prob[np.arange(len(y)), y] -= 1
    return loss, prob / len(y)


def train(x, y, rng):
    p = init_params(rng)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    step = 0
    for epoch in range(EPOCHS):
        lr = LR * 0.5 * (1 + np.cos(np.pi * epoch / EPOCHS))        # cosine decay
        order = rng.permutation(len(x))
        losses = []
        for k in range(0, len(x), BATCH):
            idx = order[k:k + BATCH]
            logits, caches, _ = forward(p, x[idx])
            loss, dlogits = softmax_cross_entropy(logits, y[idx])
            losses.append(loss)
            grads = backward(p, dlogits, caches)
            step += 1
            for name, g in grads.items():                           # Adam, L2 on weights
                if name.endswith("_w"):
                    g = g + WEIGHT_DECAY * p[name]
                m[name] = 0.9 * m[name] + 0.1 * g
                v[name] = 0.999 * v[name] + 0.001 * g * g
                mh = m[name] / (1 - 0.9 ** step)
                vh = v[name] / (1 - 0.999 ** step)
                p[name] -= lr * mh / (np.sqrt(vh) + 1e-8)
        if epoch % 10 == 9 or epoch == EPOCHS - 1:
            print(f"epoch {epoch + 1:3d}: mean training loss {np.mean(losses):.4f}")
    return p


def population_stats(p, x):
    """BatchNormalization statistics of the first convolution over the whole training set."""
    c1, _ = conv_forward(x, p["conv1_w"], None)
    return c1.mean(axis=(0, 2, 3)), c1.var(axis=(0, 2, 3))


# ---- export -----------------------------------------------------------------------------------

def to_onnx(p, stats):
    f32 = {k: v.astype(np.float32) for k, v in p.items()}
    f32["bn1_mean"], f32["bn1_var"] = (s.astype(np.float32) for s in stats)
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1]}
    nodes = [
        helper.make_node("Conv", ["x", "conv1_w"], ["c1"], name="conv1", **conv),
        helper.make_node("BatchNormalization",
                         ["c1", "bn1_scale", "bn1_bias", "bn1_mean", "bn1_var"], ["b1"],
                         name="bn1", epsilon=BN_EPSILON),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["m1"], name="pool1", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Conv", ["m1", "conv2_w", "conv2_b"], ["c2"], name="conv2", **conv),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "conv3_w", "conv3_b"], ["c3"], name="conv3", **conv),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        helper.make_node("Add", ["r2", "r3"], ["s"], name="residual"),
        helper.make_node("GlobalAveragePool", ["s"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
    ]
    order = ["conv1_w", "bn1_scale", "bn1_bias", "bn1_mean", "bn1_var", "conv2_w", "conv2_b",
             "conv3_w", "conv3_b", "fc_w", "fc_b"]
    graph = helper.make_graph(
        nodes, "digits_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(f32[k], k) for k in order])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="onnx2fpga-examples", producer_version="0.1",
                              doc_string="residual CNN on scikit-learn digits (8x8), trained "
                                         "in numpy")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model, f32


def main():
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]          # N, 1, 8, 8
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0,
                                                        stratify=y)
    rng = np.random.default_rng(SEED)
    p = train(x_train.astype(np.float64), y_train, rng)
    stats = population_stats(p, x_train.astype(np.float64))
    model, f32 = to_onnx(p, stats)

    # The numpy forward pass on the exported float32 parameters is what the ONNX model means.
    ref = forward(f32, x_test, stats=(f32["bn1_mean"], f32["bn1_var"]))
    import onnxruntime as ort
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out = sess.run(None, {"x": x_test})[0]
    diff = float(np.abs(out - ref).max())
    print(f"onnxruntime vs numpy forward: max |difference| {diff:.2e}")
    if diff > 1e-4:
        raise SystemExit(f"onnxruntime and the numpy forward pass differ by {diff}")
    print(f"float accuracy (numpy) on {len(y_test)} test digits: "
          f"{np.mean(ref.argmax(1) == y_test) * 100:.2f} %")
    print(f"float accuracy (onnxruntime) on {len(y_test)} test digits: "
          f"{np.mean(out.argmax(1) == y_test) * 100:.2f} %")
    n_params = sum(int(np.prod(v.shape)) for v in f32.values())
    print(f"{n_params} parameters (BatchNormalization statistics included)")

    onnx.save(model, os.path.join(HERE, "model.onnx"))
    cal = x_train[np.random.default_rng(0).choice(len(x_train), 200, replace=False)]
    np.save(os.path.join(HERE, "calibration.npy"), cal)
    np.save(os.path.join(HERE, "test_x.npy"), x_test)
    np.save(os.path.join(HERE, "test_y.npy"), y_test)


if __name__ == "__main__":
    main()
