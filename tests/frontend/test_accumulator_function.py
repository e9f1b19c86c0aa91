"""A monotonic function on a layer's float result (MatMul -> Add(bias) -> Mul -> Sigmoid ->
QuantizeLinear, no quantizer between the layer and the function) runs in hardware as
thresholds on the layer's integer accumulator; judged against onnxruntime. A function that
is not monotonic stays refused, saying why."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2fpga.errors import UnsupportedError
from onnx2fpga.frontend.check import Onnx2FpgaWarning
from onnx2fpga.frontend.load import load_model
from onnx2fpga.frontend.lower import lower
from onnx2fpga.frontend.qdq import normalize_qdq
from onnx2fpga.frontend.resolve import resolve_geometry
from onnx2fpga.ir import DenseLayer, ThresholdStage
from onnx2fpga.sim.model import run_design
from tests.helpers.models import save

SIZES = (32, 24, 12)
X = (np.random.default_rng(7).standard_normal((300, 1, SIZES[1])) * 4).astype(np.float32)
#: The function, its output quantizer's type, scale and zero point.
FUNCTIONS = {"Sigmoid": (TensorProto.UINT8, 1 / 256, 0),
             "Tanh": (TensorProto.INT8, 1 / 128, 0),
             "Gelu": (TensorProto.INT8, 0.05, 0)}


def accumulator_function_model(fn: str, seed=0, first_layer=False, last_layer=False):
    """An int8 MatMul layer as onnxruntime's quantize_static writes it (per-channel
    weights), followed by its float bias, a per-channel scale with negative
    entries (channels where the result falls as the accumulator rises), ``fn`` and a
    QuantizeLinear: no quantizer between the layer and the function. ``first_layer``: a
    MatMul with a quantizer in front of it; ``last_layer``: a MatMul after it, with no
    quantizer on its result (Brevitas' default last layer)."""
    rng = np.random.default_rng(seed)
    n0, n1, n2 = SIZES
    qtype, s_y, z_y = FUNCTIONS[fn]
    w1 = rng.integers(-127, 128, (n0, n1), dtype=np.int8)
    w2 = rng.integers(-127, 128, (n1, n2), dtype=np.int8)
    mul = rng.uniform(0.5, 1.5, n2).astype(np.float32) * np.where(np.arange(n2) % 3, 1, -1)
    dt = np.uint8 if qtype == TensorProto.UINT8 else np.int8
    inits = [numpy_helper.from_array(w2, "W2"), numpy_helper.from_array(np.int8(0), "z"),
             numpy_helper.from_array(rng.uniform(5e-4, 2e-3, n2).astype(np.float32),
                                     "s_w2"),
             numpy_helper.from_array(np.zeros(n2, np.int8), "z_w2"),
             numpy_helper.from_array(np.float32(0.12), "s_h"),
             numpy_helper.from_array(rng.normal(0, 0.5, n2).astype(np.float32), "bias"),
             numpy_helper.from_array(mul.astype(np.float32), "mul"),
             numpy_helper.from_array(np.float32(s_y), "s_y"),
             numpy_helper.from_array(np.array(z_y, dt), "z_y")]
    mk = helper.make_node
    nodes = [mk("QuantizeLinear", ["x", "s_x", "z"], ["x_q"], name="q_x"),
             mk("DequantizeLinear", ["x_q", "s_x", "z"], ["x_dq"], name="dq_x"),
             mk("DequantizeLinear", ["W1", "s_w1", "z"], ["W1_dq"], name="dq_w1"),
             mk("MatMul", ["x_dq", "W1_dq"], ["m1"], name="mm1"),
             mk("QuantizeLinear", ["m1", "s_h", "z"], ["h_q"], name="q_h"),
             mk("DequantizeLinear", ["h_q", "s_h", "z"], ["h"], name="dq_h")]
    if first_layer or last_layer:
        inits.append(numpy_helper.from_array(np.float32(0.01), "s_w1"))
    if first_layer:
        inits += [numpy_helper.from_array(w1, "W1"),
                  numpy_helper.from_array(np.float32(0.05), "s_x")]
    else:
        n0 = n1
        nodes = [mk("QuantizeLinear", ["x", "s_h", "z"], ["h_q"], name="q_h"),
                 mk("DequantizeLinear", ["h_q", "s_h", "z"], ["h"], name="dq_h")]
    nodes += [mk("DequantizeLinear", ["W2", "s_w2", "z_w2"], ["W2_dq"], name="dq_w2", axis=1),
             mk("MatMul", ["h", "W2_dq"], ["m2"], name="mm2"),
             mk("Add", ["m2", "bias"], ["b2"], name="add_bias"),
             mk("Mul", ["b2", "mul"], ["s2"], name="scale"),
             mk(fn, ["s2"], ["f"], name="f"),
             mk("QuantizeLinear", ["f", "s_y", "z_y"], ["y_q"], name="q_y"),
             mk("DequantizeLinear", ["y_q", "s_y", "z_y"], ["y"], name="dq_y")]
    out = "y"
    if last_layer:
        n2 = 10
        inits.append(numpy_helper.from_array(
            rng.integers(-127, 128, (SIZES[2], n2), dtype=np.int8), "W3"))
        nodes += [mk("DequantizeLinear", ["W3", "s_w1", "z"], ["W3_dq"], name="dq_w3"),
                  mk("MatMul", ["y", "W3_dq"], ["logits"], name="mm3")]
        out = "logits"
    graph = helper.make_graph(
        nodes, "acc_function", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                              [1, n0])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, n2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)],
                              producer_name="onnx2fpga-tests")
    model.ir_version = 9
    return model


def _lower(path, **kw):
    g = load_model(path)
    normalize_qdq(g)
    resolve_geometry(g)
    return lower(g, multiplier_bits=24, **kw)


@pytest.mark.parametrize("fn", ["Sigmoid", "Tanh"])
def test_monotonic_function_of_an_accumulator_is_thresholds(tmp_path, fn):
    path = save(accumulator_function_model(fn), tmp_path / f"{fn}.onnx")
    d = _lower(path)
    layers = d.dataflow.layers
    assert [type(ly) for ly in layers] == [DenseLayer]
    assert [n.op for n in d.tail] == ["DequantizeLinear"]
    (st,) = layers[0].requant
    assert isinstance(st, ThresholdStage) and st.thresholds.shape[0] == SIZES[2]
    # Channels scaled by a negative factor fall as the accumulator rises: their weights
    # are negated so that rising thresholds count.
    w2 = numpy_helper.to_array(onnx.load(path).graph.initializer[0]).T
    np.testing.assert_array_equal(layers[0].weight[::3], -w2[::3])
    np.testing.assert_array_equal(np.delete(layers[0].weight, np.s_[::3], 0),
                                  np.delete(w2, np.s_[::3], 0))
    s = ort.InferenceSession(path)
    want = np.stack([s.run(None, {"x": xi})[0] for xi in X])
    lsb = np.abs(run_design(d, X) - want) / FUNCTIONS[fn][1]
    # onnxruntime sums the float32 products; the thresholds decide on the exact
    # accumulator (dequantized in float32): rare one-step differences at a level's edge.
    assert lsb.max() <= 1.0 + 1e-3, f"largest difference {lsb.max():.3f} LSB"
    assert np.mean(lsb < 1e-3) >= 0.995, f"only {np.mean(lsb < 1e-3) * 100:.2f} % exact"


def test_non_monotonic_function_of_an_accumulator_is_refused_saying_why(tmp_path):
    # As the model's last layer, the MatMul runs to its accumulator and the host computes
    # Gelu: no compute on the host. Before another layer, that layer would be on the host.
    d = _lower(save(accumulator_function_model("Gelu", first_layer=True),
                    tmp_path / "gelu.onnx"))
    assert [n.op for n in d.tail][:4] == ["DequantizeLinear", "Add", "Mul", "Gelu"]
    path = save(accumulator_function_model("Gelu", first_layer=True, last_layer=True),
                tmp_path / "gelu3.onnx")
    with pytest.raises(UnsupportedError, match=r"Node 'mm3' \(MatMul.*Node 'f' \(Gelu.*"
                       r"non-monotonic function of a \d+-bit accumulator without a quantizer "
                       r"before it; put a quantizer"):
        _lower(path)
    with pytest.warns(Onnx2FpgaWarning, match="non-monotonic"):    # on the host when asked
        d = _lower(path, allow_host_compute=True)
    assert "MatMul" in [n.op for n in d.tail]
