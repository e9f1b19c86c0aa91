"""scikit-learn's linear models as skl2onnx writes them, rewritten into ai.onnx operators.

skl2onnx converts a LogisticRegression (or another linear classifier) into one
``ai.onnx.ml`` ``LinearClassifier`` node and a LinearRegression into a ``LinearRegressor``:
the whole computation is a matrix product inside one opaque operator. :func:`normalize_ml`
rewrites each into what the rest of the frontend knows, following ONNX-ML
LinearClassifier-1 / LinearRegressor-1 (``onnx.reference``'s ``op_linear_classifier.py``
and onnxruntime's ``linearclassifier.cc``):

* the scores: ``Gemm(X, coefficients.T, intercepts)``, which quantization and lowering put in
  hardware like any other Gemm;
* the ``post_transform``: ``NONE`` (Identity), ``LOGISTIC`` (Sigmoid) or ``SOFTMAX``
  (Softmax over the classes), on the host;
* the label: ``ArgMax`` of the transformed scores, looked up in ``classlabels_ints``
  (``ArrayFeatureExtractor``, then a Reshape to one label per sample), on the host.

A binary classifier with one row of coefficients scores the two classes ``[-s, s]``, as the
operator specifies: its Gemm gets the rows ``-w`` and ``w``.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from ..sim.host import ML_DOMAIN
from .check import onnx_module
from .ir import Graph, Node, TensorInfo

__all__ = ["REWRITTEN_ML_OPS", "normalize_ml"]

#: ai.onnx.ml operators :func:`normalize_ml` rewrites into ai.onnx ones.
REWRITTEN_ML_OPS = ("LinearClassifier", "LinearRegressor")

_POST = {"NONE": "Identity", "LOGISTIC": "Sigmoid", "SOFTMAX": "Softmax"}


def normalize_ml(graph: Graph) -> Graph:
    """Rewrite every LinearClassifier and LinearRegressor of ``graph`` (in place).

    Raises
    ------
    UnsupportedError
        String class labels, a post_transform other than NONE, LOGISTIC or SOFTMAX, or
        coefficients that do not match the input's features; every such node at once.
    """
    problems, nodes = [], []
    for n in graph.nodes:
        if n.domain != ML_DOMAIN or n.op not in REWRITTEN_ML_OPS:
            nodes.append(n)
            continue
        try:
            nodes.extend(_rewrite(graph, n))
        except UnsupportedError as e:
            problems.extend(e.problems)
    if problems:
        raise UnsupportedError(problems)
    graph.nodes = nodes
    return graph


def _features(graph: Graph, n: Node) -> int:
    info = graph.tensors.get(n.inputs[0])
    if info is None or info.shape is None or len(info.shape) != 2 or \
            not isinstance(info.shape[1], int):
        raise UnsupportedError([f"{n.describe()}: input {n.inputs[0]!r} must be a matrix "
                                f"(batch, features) of known size, not "
                                f"{None if info is None else info.shape}"])
    return int(info.shape[1])


def _rewrite(graph: Graph, n: Node) -> list[Node]:
    a = n.attrs
    post = a.get("post_transform", "NONE")
    if post not in _POST:
        raise UnsupportedError([f"{n.describe()}: post_transform={post!r} is not supported "
                                f"(only {', '.join(_POST)})"])
    if a.get("classlabels_strings"):
        raise UnsupportedError([f"{n.describe()}: string class labels cannot be compiled; "
                                f"train on integer labels (classlabels_ints)"])
    f = _features(graph, n)
    coef = np.asarray(a.get("coefficients", []), np.float32)
    if coef.size == 0 or coef.size % f:
        raise UnsupportedError([f"{n.describe()}: {coef.size} coefficients are not rows of "
                                f"the input's {f} features"])
    w = coef.reshape(-1, f)
    rows = len(w)
    bias = np.asarray(a.get("intercepts", np.zeros(rows)), np.float32).reshape(-1)
    if bias.size != rows:
        raise UnsupportedError([f"{n.describe()}: {bias.size} intercepts for {rows} rows of "
                                f"coefficients"])
    label = n.op == "LinearClassifier"
    if not label and post != "NONE":
        raise UnsupportedError([f"{n.describe()}: post_transform={post!r} is not supported "
                                f"(a LinearRegressor's only NONE)"])
    classes = np.asarray(a.get("classlabels_ints", []), np.int64)
    if label and rows == 1 and classes.size == 2:     # binary: scores [-s, s]
        w, bias, rows = np.concatenate([-w, w]), np.concatenate([-bias, bias]), 2
    if label and classes.size != rows:
        raise UnsupportedError([f"{n.describe()}: {classes.size} class labels for {rows} "
                                f"score columns"])
    base = n.name or n.outputs[0]
    opset = graph.opsets.get("", 13)
    onnx = onnx_module()

    def node(op, inputs, outputs, attrs=None, suffix=""):
        version = onnx.defs.get_schema(op, opset, "").since_version
        return Node(op, inputs, outputs, attrs or {}, f"{base}__{suffix or op.lower()}", "",
                    version, opset)

    def const(suffix, value):
        name = f"{base}__{suffix}"
        graph.constants[name] = value
        graph.tensors[name] = TensorInfo(value.dtype.name, tuple(value.shape))
        return name

    scores_out = n.outputs[1] if label else n.outputs[0]
    raw = f"{base}__scores" if label and post != "NONE" or not scores_out else scores_out
    graph.tensors[raw] = TensorInfo("float32", (1, rows))
    out = [node("Gemm", [n.inputs[0], const("weight", np.ascontiguousarray(w.T)),
                         const("bias", bias)], [raw])]
    if not label:
        return out
    scores = scores_out or f"{base}__probabilities"
    if raw != scores:
        attrs = {"axis": -1 if opset >= 13 else 1} if post == "SOFTMAX" else {}
        out.append(node(_POST[post], [raw], [scores], attrs))
    graph.tensors[scores] = TensorInfo("float32", (1, rows))
    if n.outputs[0]:
        idx = f"{base}__argmax"
        picked = f"{base}__label_row"
        out += [node("ArgMax", [scores], [idx], {"axis": 1, "keepdims": 0}),
                Node("ArrayFeatureExtractor", [const("classes", classes), idx], [picked], {},
                     f"{base}__label", ML_DOMAIN, 1, graph.opsets.get(ML_DOMAIN, 1)),
                node("Reshape", [picked, const("label_shape", np.int64([-1]))],
                     [n.outputs[0]])]
        graph.tensors[idx] = TensorInfo("int64", (1,))
        graph.tensors[picked] = TensorInfo("int64", (1, 1))
    return out
