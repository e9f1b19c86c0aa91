"""The committed files of examples/cnn_digits: the model is the architecture asked for, the data
are scikit-learn's digits split as in examples/digits, and the README's accuracy is measured."""

import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper, version_converter
from onnx.reference import ReferenceEvaluator

from tests.helpers import paths

EXAMPLES = str(paths.EXAMPLES)
HERE = os.path.join(EXAMPLES, "cnn_digits")


def load(name):
    return np.load(os.path.join(HERE, name), allow_pickle=False)


def test_architecture():
    m = onnx.load(os.path.join(HERE, "model.onnx"))
    onnx.checker.check_model(m, full_check=True)
    assert [(o.domain, o.version) for o in m.opset_import] == [("", 13)]
    nodes = m.graph.node
    assert [n.op_type for n in nodes] == [
        "Conv", "BatchNormalization", "Relu", "MaxPool", "Conv", "Relu", "Conv", "Relu", "Add",
        "GlobalAveragePool", "Flatten", "Gemm"]
    shapes = {t.name: numpy_helper.to_array(t).shape for t in m.graph.initializer}
    assert [shapes[n.input[1]] for n in nodes if n.op_type == "Conv"] == [
        (8, 1, 3, 3), (16, 8, 3, 3), (16, 16, 3, 3)]
    assert shapes[nodes[-1].input[1]] == (10, 16)
    assert set(nodes[8].input) == {nodes[5].output[0], nodes[7].output[0]}   # residual join
    dims = [d.dim_value or d.dim_param for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["N", 1, 8, 8]


def test_data_is_the_digits_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    x_train, x_test, _, y_test = train_test_split(x, d.target.astype(np.int64), test_size=0.25,
                                                  random_state=0, stratify=d.target)
    tx, ty, cal = load("test_x.npy"), load("test_y.npy"), load("calibration.npy")
    assert (tx.dtype, ty.dtype, cal.dtype) == (np.float32, np.int64, np.float32)
    np.testing.assert_array_equal(tx, x_test)
    np.testing.assert_array_equal(ty, y_test)
    assert cal.shape == (200, 1, 8, 8)
    train_rows = {r.tobytes() for r in x_train}
    assert all(r.tobytes() in train_rows for r in cal)
    # the same digits as the MLP example
    mlp = os.path.join(EXAMPLES, "digits")
    np.testing.assert_array_equal(ty, np.load(os.path.join(mlp, "test_y.npy")))
    np.testing.assert_array_equal(tx.reshape(len(tx), -1), np.load(os.path.join(mlp, "test_x.npy")))


def test_accuracy_matches_readme():
    path = os.path.join(HERE, "model.onnx")
    x, y = load("test_x.npy"), load("test_y.npy")
    out = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    # a second executor; opset 14 because onnx.reference's BatchNormalization-9 is wrong in
    # inference (onnx/onnx#5799, fix proposed in onnx/onnx#8442)
    ref = ReferenceEvaluator(version_converter.convert_version(onnx.load(path), 14))
    np.testing.assert_allclose(out, ref.run(None, {"x": x})[0], atol=1e-4, rtol=0)
    correct = int(np.sum(out.argmax(1) == y))
    assert correct / len(y) >= 0.95
    with open(os.path.join(HERE, "README.md")) as f:
        readme = f.read()
    assert f"| float, onnxruntime | {correct / len(y) * 100:.2f} % ({correct} / {len(y)}) |" \
        in readme
