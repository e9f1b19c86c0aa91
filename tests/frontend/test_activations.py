"""Activations in hardware: a function of one quantized input (DQ -> f -> Q) becomes a table
(or thresholds where it is monotonic), judged against onnxruntime on the QDQ models its
quantizer makes of exporters' float models, and against onnx.reference on every input code."""

import logging

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx2fpga.errors import UnsupportedError
from onnx2fpga.frontend.load import load_model
from onnx2fpga.frontend.lower import lower
from onnx2fpga.frontend.qdq import normalize_qdq
from onnx2fpga.frontend.quantize import quantize_graph
from onnx2fpga.frontend.resolve import resolve_geometry
from onnx2fpga.ir import DenseLayer, LutStage, RequantLayer
from onnx2fpga.plan.fold import fold
from onnx2fpga.plan.graph import plan_graph
from onnx2fpga.plan.lut import lut_as_thresholds
from onnx2fpga.sim import golden
from onnx2fpga.sim.model import run_design
from tests.helpers.activations import (
    ACTIVATIONS,
    SIZES,
    TORCH_ACTIVATIONS,
    act_cnn,
    act_mlp,
    ort_qdq,
    torch_act_mlp,
)
from tests.helpers.models import save

CAL = (np.random.default_rng(100).standard_normal((64, 1, SIZES[0])) * 1.5).astype(np.float32)
X = (np.random.default_rng(7).standard_normal((200, 1, SIZES[0])) * 1.5).astype(np.float32)


def _design(path):
    g = load_model(path)
    normalize_qdq(g)
    resolve_geometry(g)
    d = lower(g, multiplier_bits=24)
    fold(d.dataflow)
    return d


def _quantized(tmp_path, fp, tag):
    logging.getLogger().setLevel(logging.ERROR)     # quantize_static's pre-processing hint
    return ort_qdq(fp, tmp_path / f"qdq_{tag}.onnx", CAL)


def _check_against_onnxruntime(q):
    """Every Gemm in hardware, one table for the activation, golden == onnxruntime;
    returns the design and the core kinds of its plan."""
    d = _design(q)
    assert sum(isinstance(ly, DenseLayer) for ly in d.dataflow.layers) == 2
    assert [n.op for n in d.tail] == ["DequantizeLinear"]
    luts = [st for ly in d.dataflow.layers for st in ly.requant if isinstance(st, LutStage)]
    assert len(luts) == 1
    s = ort.InferenceSession(q)
    want = np.stack([s.run(None, {"x": xi})[0] for xi in X])
    lsb = np.abs(run_design(d, X) - want) / float(d.tail[-1].attrs["scale"])
    assert lsb.max() <= 1.0 + 1e-3, f"largest difference {lsb.max():.3f} LSB"
    assert np.mean(lsb < 1e-3) >= 0.99, f"only {np.mean(lsb < 1e-3) * 100:.2f} % exact"
    kinds = {st.kind for st in plan_graph(d.dataflow).stages}
    return d, kinds


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_of_an_onnxruntime_qdq_model_runs_in_hardware(tmp_path, name):
    fp = save(act_mlp(name), tmp_path / f"fp_{name}.onnx")
    d, kinds = _check_against_onnxruntime(_quantized(tmp_path, fp, name))
    (lut,) = [st for ly in d.dataflow.layers for st in ly.requant if isinstance(st, LutStage)]
    # Monotonic functions are counted by thresholds, the others looked up.
    assert (lut_as_thresholds(lut) is not None) == ACTIVATIONS[name][2]
    assert ("lut" in kinds) != ACTIVATIONS[name][2]
    if name == "PRelu":         # one slope per feature: one table per feature
        assert lut.table.shape == (SIZES[1], 256)


@pytest.mark.parametrize("name,dynamo", [(n, False) for n in TORCH_ACTIVATIONS] +
                         [("GELU", True), ("Softplus", True)])
def test_activation_of_a_torch_export_runs_in_hardware(tmp_path, name, dynamo):
    pytest.importorskip("torch")
    fp = torch_act_mlp(name, tmp_path / f"torch_{name}_{dynamo}.onnx", dynamo=dynamo)
    _check_against_onnxruntime(_quantized(tmp_path, fp, f"{name}_{dynamo}"))


# name -> (op, attributes, output scale, output zero point); opset 20 (onnx.reference's
# DequantizeLinear starts at 19)
REFERENCE = {
    "Sigmoid": ("Sigmoid", {}, 1 / 255, -128),
    "Tanh": ("Tanh", {}, 1 / 127, 0),
    "HardSigmoid": ("HardSigmoid", {"alpha": 0.3, "beta": 0.6}, 1 / 255, -128),
    "HardSwish": ("HardSwish", {}, 4.5 / 255, -110),
    "Gelu": ("Gelu", {}, 4.2 / 255, -118),
    "Gelu-tanh": ("Gelu", {"approximate": "tanh"}, 4.2 / 255, -118),
    "Erf": ("Erf", {}, 1 / 127, 0),
    "Elu": ("Elu", {"alpha": 0.8}, 5 / 255, -30),
    "Selu": ("Selu", {}, 6 / 255, -40),
    "Softplus": ("Softplus", {}, 4.1 / 255, -128),
    "Softsign": ("Softsign", {}, 1 / 127, 0),
    "Mish": ("Mish", {}, 4.4 / 255, -110),
    "Exp": ("Exp", {}, 55 / 255, -128),
}


@pytest.mark.parametrize("name", list(REFERENCE))
def test_table_equals_onnx_reference_on_every_code(name):
    op, attrs, s_out, z_out = REFERENCE[name]
    s_in, z_in = np.float32(4 / 128), np.int8(3)

    def q(name, value):
        return numpy_helper.from_array(np.asarray(value), name)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_in", "z_in"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s_in", "z_in"], ["xd"]),
             helper.make_node(op, ["xd"], ["f"], name="act", **attrs),
             helper.make_node("QuantizeLinear", ["f", "s_out", "z_out"], ["y"])]
    graph = helper.make_graph(
        nodes, "f", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, ["N", 1])],
        [q("s_in", s_in), q("z_in", z_in), q("s_out", np.float32(s_out)),
         q("z_out", np.int8(z_out))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    codes = np.arange(-128, 128)
    x = ((codes - int(z_in)) * s_in).astype(np.float32).reshape(-1, 1)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0].astype(np.int64).reshape(-1)
    g = load_model(model)
    normalize_qdq(g)
    d = lower(g)
    (layer,) = d.dataflow.layers
    assert isinstance(layer, RequantLayer) and isinstance(layer.requant[0], LutStage)
    got = golden.lookup(codes.reshape(-1, 1), layer.requant[0]).reshape(-1)
    diff = np.abs(got - want)
    # onnx.reference evaluates in float32 numpy (the table: float64 rounded to float32):
    # they may differ where the result lies within float32 rounding of a quantization tie.
    assert diff.max() <= 1 and np.mean(diff == 0) >= 0.99, (diff.max(), np.mean(diff == 0))


def test_too_wide_an_input_for_a_table_is_refused_by_name(tmp_path):
    fp = save(act_mlp("Sigmoid"), tmp_path / "fp.onnx")
    logging.getLogger().setLevel(logging.ERROR)
    q = ort_qdq(fp, tmp_path / "q16.onnx", CAL, activation="int16")
    with pytest.raises(UnsupportedError, match=r"^Node 'act0' \(Sigmoid, opset \d+\): its "
                       r"input is quantized to 16 bits; a function of one quantized input "
                       r"runs in hardware as a table of inputs of at most 12 bits$"):
        _design(q)


def test_float_model_with_tanh_between_two_gemms_runs_every_gemm_in_hardware():
    model = act_mlp("Tanh")
    g = load_model(model)
    quantize_graph(g, CAL)
    d = lower(g)
    fold(d.dataflow)
    assert sum(isinstance(ly, DenseLayer) for ly in d.dataflow.layers) == 2
    assert [n.op for n in d.tail] == ["DequantizeLinear"]
    assert "threshold" in {st.kind for st in plan_graph(d.dataflow).stages}
    got = run_design(d, X)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, {"x": X[:, 0]})[0]
    span = ref.max() - ref.min()
    assert np.percentile(np.abs(got[:, 0] - ref), 99) < 0.05 * span


def test_float_model_silu_is_one_function_group():
    g = load_model(act_mlp("SiLU"))
    quantize_graph(g, CAL)
    # One quantizer after the Mul, none between the Sigmoid and the Mul.
    prod = g.producers()
    mul = next(n for n in g.nodes if n.op == "Mul")
    assert [c.op for c in g.consumers()[mul.outputs[0]]] == ["QuantizeLinear"]
    assert prod[mul.inputs[1]].op == "Sigmoid"
    d = lower(g)
    assert sum(isinstance(ly, DenseLayer) for ly in d.dataflow.layers) == 2


@pytest.mark.parametrize("op", ["PRelu", "HardSwish"])
def test_activation_between_convolutions_runs_in_hardware(tmp_path, op):
    fp = save(act_cnn(op), tmp_path / f"cnn_{op}.onnx")
    cal = np.random.default_rng(3).standard_normal((32, 1, 2, 6, 6)).astype(np.float32)
    logging.getLogger().setLevel(logging.ERROR)
    q = ort_qdq(fp, tmp_path / f"qcnn_{op}.onnx", cal)
    d = _design(q)
    assert [type(ly).__name__ for ly in d.dataflow.layers] == ["ConvLayer", "ConvLayer"]
    (lut,) = [st for ly in d.dataflow.layers for st in ly.requant if isinstance(st, LutStage)]
    assert lut.table.shape[0] == (4 if op == "PRelu" else 1)   # one table per channel
    x = np.random.default_rng(4).standard_normal((20, 1, 2, 6, 6)).astype(np.float32)
    s = ort.InferenceSession(q)
    want = np.stack([s.run(None, {"x": xi})[0] for xi in x])
    lsb = np.abs(run_design(d, x) - want) / float(d.tail[-1].attrs["scale"])
    assert lsb.max() <= 1.0 + 1e-3 and np.mean(lsb < 1e-3) >= 0.99


@pytest.mark.parametrize("name", ["GELU", "SiLU", "Softplus"])
def test_float_torch_export_with_calibration_runs_every_gemm_in_hardware(tmp_path, name):
    # The legacy exporter writes GELU as x * (erf(x / sqrt 2) + 1) * 0.5: one function group.
    pytest.importorskip("torch")
    fp = torch_act_mlp(name, tmp_path / f"torch_{name}.onnx")
    g = load_model(fp)
    quantize_graph(g, CAL)
    d = lower(g)
    assert sum(isinstance(ly, DenseLayer) for ly in d.dataflow.layers) == 2
    assert [n.op for n in d.tail] == ["DequantizeLinear"]
    s = ort.InferenceSession(fp)
    ref = np.concatenate([s.run(None, {"x": xi})[0] for xi in X])
    got = run_design(d, X)[:, 0]
    assert np.percentile(np.abs(got - ref), 99) < 0.05 * (ref.max() - ref.min())
