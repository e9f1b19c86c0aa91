"""skl2onnx's linear models (LinearClassifier, LinearRegressor) rewritten into a Gemm and host
operators: the rewritten graph, run in float by the host interpreter, against onnxruntime on
the model skl2onnx wrote; and a LogisticRegression compiled with its Gemm in hardware."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import onnx2fpga
from onnx2fpga.errors import UnsupportedError
from onnx2fpga.frontend.load import load_model
from onnx2fpga.frontend.sklearn import normalize_ml
from onnx2fpga.sim import host
from tests.helpers.models import save

pytest.importorskip("skl2onnx")
ort = pytest.importorskip("onnxruntime")


def _digits(classes=10):
    from sklearn.datasets import load_digits

    x, y = load_digits(n_class=classes, return_X_y=True)
    return x.astype(np.float32), y


def _convert(tmp_path, est, x, name):
    from skl2onnx import to_onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = to_onnx(est, x[:1], options={id(est): {"zipmap": False}}
                      if hasattr(est, "classes_") else None)
    return save(onx, tmp_path / f"{name}.onnx")


def _models():
    from sklearn.linear_model import LinearRegression, LogisticRegression

    return {"logistic_multiclass": (lambda: LogisticRegression(max_iter=50), 10),
            "logistic_binary": (lambda: LogisticRegression(max_iter=50), 2),
            "linear_regression": (lambda: LinearRegression(), 10)}


@pytest.mark.parametrize("name", ["logistic_multiclass", "logistic_binary",
                                  "linear_regression"])
def test_rewritten_linear_models_equal_onnxruntime(tmp_path, name):
    make, classes = _models()[name]
    x, y = _digits(classes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = make().fit(x, y.astype(np.float32) if "regression" in name else y)
    path = _convert(tmp_path, est, x, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # skl2onnx imports ai.onnx twice
        g = normalize_ml(load_model(path, lenient=True))
    assert not any(n.op.startswith("Linear") for n in g.nodes)
    assert sum(n.op == "Gemm" for n in g.nodes) == 1
    xs = x[:40]
    s = ort.InferenceSession(path)
    want = dict(zip([o.name for o in s.get_outputs()], s.run(None, {"X": xs})))
    for k, sample in enumerate(xs):
        env = host.run_nodes(g.nodes, {"X": sample[None]}, g.constants)
        for out in g.outputs:
            got, ref = np.asarray(env[out]), want[out][k:k + 1]
            if got.dtype.kind == "f":
                np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-4,
                                           atol=1e-4 * np.abs(ref).max())
            else:
                np.testing.assert_array_equal(got.reshape(ref.shape), ref)


def test_logistic_regression_compiles_with_its_gemm_in_hardware(tmp_path):
    from sklearn.linear_model import LogisticRegression

    x, y = _digits()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = _convert(tmp_path, LogisticRegression(max_iter=50).fit(x, y), x, "lr")
        d = onnx2fpga.compile(path, tmp_path / "design", calibration=x[:64], lenient=True)
    assert [ly.kind for ly in d.design.dataflow.layers] == ["dense"]
    assert [o["name"] for o in d.manifest["outputs"]] == ["label", "probabilities"]
    got = d.simulate(x[:200], engine="golden")
    s = ort.InferenceSession(path)
    label, prob = s.run(["label", "probabilities"], {"X": x[:200]})
    assert np.mean(got["label"] == label) >= 0.97
    assert np.abs(got["probabilities"] - prob).mean() < 0.01


def test_string_labels_are_refused_by_name(tmp_path):
    from sklearn.linear_model import LogisticRegression

    x, y = _digits(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = LogisticRegression(max_iter=20).fit(x, np.array(["a", "b", "c"])[y])
    path = _convert(tmp_path, est, x, "strings")
    with pytest.raises(UnsupportedError, match=r"^Node 'LinearClassifier' "
                                               r"\(ai\.onnx\.ml\.LinearClassifier, opset 1\): "
                                               r"string class labels cannot be compiled; "
                                               r"train on integer labels "
                                               r"\(classlabels_ints\)$"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            normalize_ml(load_model(path, lenient=True))
