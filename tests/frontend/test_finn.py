"""Streamlined FINN graphs (MultiThreshold activations, integer-valued float weights) compile
and compute what a plain numpy forward pass of the same network computes."""

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx2fpga
from onnx2fpga.errors import UnsupportedError
from onnx2fpga.ir.stages import ThresholdStage


def _model(rng, *, bipolar_in=True, out_bits=2, sizes=(12, 10, 6)):
    """Input thresholded to ±1 (or to 0..3), then per layer: MatMul with ±1 weights, Mul 1,
    Unsqueeze, BatchNormalization (some negative scales), Squeeze, MultiThreshold; the last
    MatMul feeds a float scaling and TopK on the host."""
    inits, nodes, ref_layers = [], [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    t_in = np.array([[0.0]], np.float32) if bipolar_in else np.array([[-0.5, 0.0, 0.5]],
                                                                      np.float32)
    nodes.append(helper.make_node(
        "MultiThreshold", ["x", const("T0", t_in)], ["a0"], domain="qonnx.custom_op.general",
        out_dtype="BIPOLAR" if bipolar_in else "UINT2", out_scale=2.0 if bipolar_in else 1.0,
        out_bias=-1.0 if bipolar_in else 0.0))
    t = "a0"
    for k, (a, b) in enumerate(zip(sizes, sizes[1:])):
        w = rng.choice([-1.0, 1.0], size=(a, b)).astype(np.float32)
        nodes.append(helper.make_node("MatMul", [t, const(f"W{k}", w)], [f"m{k}"]))
        nodes.append(helper.make_node("Mul", [f"m{k}", const(f"one{k}", np.float32(1))],
                                      [f"s{k}"]))
        if k == len(sizes) - 2:
            t = f"s{k}"
            ref_layers.append((w, None))
            break
        gamma = rng.uniform(0.5, 2, b) * rng.choice([-1, 1], b)
        beta, mean = rng.normal(0, 1, b), rng.normal(0, 2, b)
        var = rng.uniform(1, 9, b)
        bn = [const(f"{n}{k}", v.astype(np.float32)) for n, v in
              (("g", gamma), ("b", beta), ("mu", mean), ("v", var))]
        nodes.append(helper.make_node("Unsqueeze", [f"s{k}", const(f"ax{k}", np.array([2]))],
                                      [f"u{k}"]))
        nodes.append(helper.make_node("BatchNormalization", [f"u{k}"] + bn, [f"n{k}"],
                                      epsilon=1e-5))
        nodes.append(helper.make_node("Squeeze", [f"n{k}", f"ax{k}"], [f"q{k}"]))
        thr = np.sort(rng.normal(0, 1.5, (b, 2 ** out_bits - 1)), axis=1).astype(np.float32)
        nodes.append(helper.make_node(
            "MultiThreshold", [f"q{k}", const(f"T{k + 1}", thr)], [f"a{k + 1}"],
            domain="qonnx.custom_op.general", out_dtype=f"UINT{out_bits}", out_scale=1.0,
            out_bias=0.0))
        ref_layers.append((w, (gamma, beta, mean, var, thr)))
        t = f"a{k + 1}"
    nodes.append(helper.make_node("Div", [t, const("scale", np.float32(3.0))], ["logits"]))
    nodes.append(helper.make_node("TopK", ["logits", const("k", np.array([1]))],
                                  ["top", "y"], axis=-1))
    g = helper.make_graph(nodes, "finn_mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         (1, sizes[0]))],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, (1, 1))],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                            helper.make_opsetid("qonnx.custom_op.general", 1)])
    return m, t_in, ref_layers


def _reference(x, t_in, layers, bipolar_in):
    """The network in numpy, as FINN defines MultiThreshold."""
    count = (x[..., None] >= t_in[0]).sum(-1)
    a = (2 * count - 1) if bipolar_in else count
    for w, bn in layers:
        v = a.astype(np.float32) @ w
        if bn is None:
            return np.argmax(v / 3.0, axis=-1)
        gamma, beta, mean, var, thr = bn
        v = ((v - mean) / np.sqrt(var + 1e-5) * gamma + beta).astype(np.float32)
        a = (v[..., None] >= thr).sum(-1)


@pytest.mark.parametrize("bipolar_in, out_bits", [(True, 1), (True, 2), (False, 3)])
def test_streamlined_finn_mlp(bipolar_in, out_bits):
    rng = np.random.default_rng(out_bits)
    model, t_in, layers = _model(rng, bipolar_in=bipolar_in, out_bits=out_bits)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = onnx2fpga.compile(model)
    dense = d.design.dataflow.layers
    stages = [st for ly in dense for st in getattr(ly, "requant", [])]
    assert sum(isinstance(st, ThresholdStage) for st in stages) == 1
    assert [n.op for n in d.design.tail][-1] == "TopK"
    x = np.random.default_rng(9).uniform(-1, 1, (300, 1, 12)).astype(np.float32)
    got = d.simulate(x, engine="golden").reshape(-1)
    want = _reference(x[:, 0], t_in, layers, bipolar_in)
    # Exact integer thresholds against the float BatchNormalization: equal except where a
    # float32 value lies on a threshold itself.
    assert np.mean(got == want) >= 0.99


def test_finn_thresholds_are_exact_on_the_accumulator():
    """The integer thresholds on the accumulator reproduce the float comparison at every
    accumulator value the layer can produce (the BatchNormalization folded in exactly)."""
    rng = np.random.default_rng(4)
    model, t_in, layers = _model(rng, out_bits=2, sizes=(12, 10, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = onnx2fpga.compile(model)
    layer = d.design.dataflow.layers[0]
    st = layer.requant[0]
    w, (gamma, beta, mean, var, thr) = layers[0]
    flip = np.sign(layer.weight[:, 0]) != np.sign(w.T[:, 0])   # channels negated in hardware
    acc = np.arange(-12, 13)                                   # every ±1 dot product of 12
    for c in range(w.shape[1]):
        real = acc * (-1 if flip[c] else 1)
        v = ((real - mean[c]) / np.sqrt(var[c] + 1e-5) * gamma[c] + beta[c])
        want = (v[:, None] >= thr[c]).sum(-1)
        t = st.thresholds[c if st.thresholds.shape[0] > 1 else 0]
        got = st.base + st.step * (acc[:, None] >= t).sum(-1)
        np.testing.assert_array_equal(got, want)


def test_multithreshold_options_refused_by_node():
    rng = np.random.default_rng(1)
    model, _, _ = _model(rng)
    for a in model.graph.node[0].attribute:
        if a.name == "out_scale":
            a.f = 0.5
    with pytest.raises(UnsupportedError, match=r"out_scale=0\.5 and out_bias=-1\.0 must be "):
        onnx2fpga.compile(model)
