"""The ai.onnx.ml operators the host runs (what skl2onnx puts around a classifier's layers),
against onnxruntime running the same one-node model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2fpga.ir import HostNode
from onnx2fpga.sim import host

ort = pytest.importorskip("onnxruntime")

_FLOAT, _INT64 = TensorProto.FLOAT, TensorProto.INT64


def _ort(op, inputs, attrs, out_type, consts=()):
    """``op`` (ai.onnx.ml) on ``inputs`` (the first a graph input, the others initializers
    named ``c0``, ``c1``...) in onnxruntime."""
    names = ["x"] + [f"c{k}" for k in range(len(consts))]
    node = helper.make_node(op, names, ["y"], domain="ai.onnx.ml", **attrs)
    x = inputs
    x_info = helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype),
                                           list(x.shape))
    graph = helper.make_graph(
        [node], "g", [x_info], [helper.make_tensor_value_info("y", out_type, list(x.shape))],
        [numpy_helper.from_array(np.asarray(c), f"c{k}") for k, c in enumerate(consts)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]


def _host(op, args, attrs):
    node = HostNode(op, ["x"] + [f"c{k}" for k in range(len(args) - 1)], ["y"], attrs, op,
                    host.ML_DOMAIN, 1)
    consts = {f"c{k}": a for k, a in enumerate(args[1:])}
    return host.run_nodes([node], {"x": args[0]}, consts)["y"]


_X = np.random.default_rng(0).standard_normal((1, 6)).astype(np.float32) * 3


@pytest.mark.parametrize("op,attrs,out_type", [
    ("Normalizer", {"norm": "MAX"}, _FLOAT),
    ("Normalizer", {"norm": "L1"}, _FLOAT),
    ("Normalizer", {"norm": "L2"}, _FLOAT),
    ("Scaler", {"offset": [0.5] * 6, "scale": [1.0, 2.0, 0.5, 3.0, 1.5, 0.25]}, _FLOAT),
    ("Scaler", {"offset": [0.25], "scale": [2.0]}, _FLOAT),
    ("Binarizer", {"threshold": 0.5}, _FLOAT),
])
def test_elementwise_ml_ops_match_onnxruntime(op, attrs, out_type):
    want = _ort(op, _X, attrs, out_type)
    np.testing.assert_allclose(_host(op, [_X], attrs), want, rtol=1e-6, atol=1e-7)


def test_array_feature_extractor_matches_onnxruntime():
    """skl2onnx's label lookup: the classes (a 1-D constant) at the ArgMax indices."""
    classes = np.array([3, 1, 4, 1, 5, 9, 2, 6], np.int64)
    idx = np.array([[5], [0], [7]], np.int64)
    # onnxruntime wants the data as the graph input here; swap the roles in the model
    node = helper.make_node("ArrayFeatureExtractor", ["c", "x"], ["y"], domain="ai.onnx.ml")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", _INT64,
                                                                          [3, 1])],
                              [helper.make_tensor_value_info("y", _INT64, [3, 1])],
                              [numpy_helper.from_array(classes, "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": idx})[0]
    got = host.array_feature_extractor(classes, idx)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    x2 = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(host.array_feature_extractor(x2, np.int64([3, 0])),
                                  x2[:, [3, 0]])


def test_label_encoder_matches_onnxruntime():
    x = np.array([[0, 2, 7, 1]], np.int64)
    attrs = {"keys_int64s": [0, 1, 2], "values_floats": [0.5, -1.0, 2.5],
             "default_float": 9.0}
    want = _ort("LabelEncoder", x, attrs, _FLOAT)
    np.testing.assert_array_equal(_host("LabelEncoder", [x], attrs), want)


def test_supported_knows_the_domain():
    assert host.supported("Scaler", "ai.onnx.ml") and not host.supported("Scaler", "")
    assert not host.supported("ZipMap", "ai.onnx.ml")
    assert not host.supported("Relu", "ai.onnx.ml") and host.supported("Relu", "")
