"""Train the digits MLP example and export it to ONNX (float), with calibration and test data.

scikit-learn's ``load_digits`` (1,797 real 8x8 handwritten digits, shipped inside the
scikit-learn wheel) trains a 64-32-10 ReLU MLP. The model is written with ``onnx.helper`` as
``Gemm -> Relu -> Gemm -> Softmax`` (opset 13), input ``x: float32[N, 64]`` (pixels / 16).

Writes, next to this file: ``model.onnx``, ``calibration.npy`` (200 training images),
``test_x.npy`` / ``test_y.npy`` (the held-out test split). Deterministic: a fixed seed.

    python examples/digits/train.py
"""

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0,
                                                        stratify=y)
    clf = MLPClassifier(hidden_layer_sizes=(32,), max_iter=600, random_state=0)
    clf.fit(x_train, y_train)
    print(f"float accuracy (scikit-learn) on {len(x_test)} test digits: "
          f"{clf.score(x_test, y_test) * 100:.2f} %")
    w1, w2 = (w.astype(np.float32) for w in clf.coefs_)
    b1, b2 = (b.astype(np.float32) for b in clf.intercepts_)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["a"], name="relu1"),
        helper.make_node("Gemm", ["a", "w2", "b2"], ["logits"], name="fc2"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "digits_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"),
         numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(b2, "b2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="onnx2fpga-examples", producer_version="0.1",
                              doc_string="64-32-10 MLP on scikit-learn digits")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, os.path.join(HERE, "model.onnx"))
    rng = np.random.default_rng(0)
    cal = x_train[rng.choice(len(x_train), 200, replace=False)]
    np.save(os.path.join(HERE, "calibration.npy"), cal)
    np.save(os.path.join(HERE, "test_x.npy"), x_test)
    np.save(os.path.join(HERE, "test_y.npy"), y_test)


if __name__ == "__main__":
    main()
