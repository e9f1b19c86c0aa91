"""frontend/groups.py: the one definition of a group, used by the quantizer and the lowering."""

import copy
import os

import numpy as np
import pytest

from onnx2fpga.frontend.groups import Group, QdqGraph, find_groups, float_groups
from onnx2fpga.frontend.ir import logical_shape
from onnx2fpga.frontend.load import load_model
from onnx2fpga.frontend.partition import find_entry
from onnx2fpga.frontend.quantize import fold_constants, quantize_graph
from onnx2fpga.frontend.resolve import resolve_geometry
from tests.helpers import paths

EXAMPLES = str(paths.EXAMPLES)


def _summary(groups):
    return [(g.core.name if g.core is not None else None, [n.op for n in g.after])
            for g in groups]


@pytest.mark.parametrize(("example", "expected"), [
    ("digits", [("fc1", ["Relu"]), ("fc2", [])]),
    ("cnn_digits", [("conv1", ["BatchNormalization", "Relu"]), ("pool1", []),
                    ("conv2", ["Relu"]), ("conv3", ["Relu"]), ("residual", []),
                    ("gap", []), ("fc", [])]),
])
def test_the_quantizer_and_the_lowering_find_the_same_groups(example, expected):
    """The groups of a float model (where the quantizer places its quantizers) are the
    groups the lowering finds in the model it quantized: one layer per group."""
    graph = load_model(os.path.join(EXAMPLES, example, "model.onnx"))
    fold_constants(graph)
    resolve_geometry(graph)
    assert _summary(float_groups(graph)) == expected
    samples = np.load(os.path.join(EXAMPLES, example, "calibration.npy"))
    if samples.ndim == len(graph.tensors[graph.inputs[0]].shape):
        samples = samples[:, None]           # one model input (batch 1) per sample
    qdq = quantize_graph(copy.deepcopy(graph), samples)
    qg = QdqGraph(qdq)
    entry = find_entry(qg)
    found = find_groups(qg, entry, qg.ancestors(entry))
    assert all(isinstance(g, Group) for g in found)
    assert _summary(found) == expected
    assert [g.quant.op for g in found] == ["QuantizeLinear"] * len(expected)


@pytest.mark.parametrize(("shape", "expected"), [
    ((1, 3, 4, 5), (3, 4, 5)), ((1, 10), (10,)), ((2, 10), (2, 10)), ((1,), (1,)),
    ((), ()), ((1, 1), (1,)),
])
def test_logical_shape_drops_a_batch_of_one(shape, expected):
    assert logical_shape(shape) == expected
