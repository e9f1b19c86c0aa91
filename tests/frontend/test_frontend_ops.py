"""Operators exporters write around convolutions, judged against onnxruntime: global
reductions (ReduceMean / ReduceMax / ReduceSum over the spatial axes, as pools), channel
splits and slices, joins of two activations (Sub, Mul, Min, Max).

Models: PyTorch 2.13 exports (legacy and dynamo) quantized by onnxruntime's quantize_static
(QDQ): every hardware layer's integers against onnxruntime's own quantized tensors, on
onnxruntime's integers at its input; and onnx.helper models for the attribute forms and the
refusals.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx2fpga
from onnx2fpga.errors import UnsupportedError
from onnx2fpga.sim import golden
from onnx2fpga.sim.model import run_design, run_head

torch = pytest.importorskip("torch")

from tests.helpers.models import block_model  # noqa: E402
from tests.helpers.torch_models import (  # noqa: E402
    SHAPE,
    ort_quantize,
    ort_quantized_tensors,
    torch_qdq,
)


def _kinds_at_16_bits(model, x) -> list[str]:
    """Compile the float ``model`` with 16-bit calibration on ``x``, check that the golden
    model follows onnxruntime's float model within 0.2 % of its output range, and return
    the kinds of its layers."""
    import onnxruntime as ort

    d = onnx2fpga.compile(model, calibration=x, weight_bits=16, activation_bits=16,
                          multiplier_bits=24, stop_after="lower")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = np.stack([sess.run(None, {"x": s})[0] for s in x])
    got = run_design(d.design, x).reshape(ref.shape)
    assert np.abs(got - ref).max() < 2e-3 * float(np.ptp(ref))
    return [ly.kind for ly in d.design.dataflow.layers]


def check_layers_against_onnxruntime(path, n=40, seed=7):
    """Compile the QDQ model at ``path``; run every layer on onnxruntime's integers at its
    inputs and compare with onnxruntime's integers at its output. Returns the dataflow's
    layer kinds and ``{layer name: fraction exact}``."""
    d = onnx2fpga.compile(path, stop_after="lower")
    df = d.design.dataflow
    x = np.random.default_rng(seed).standard_normal((n, 1) + SHAPE).astype(np.float32)
    ref = ort_quantized_tensors(path, x)
    # A view's output is compared with the QuantizeLinear that reads it (same integers).
    quantizer = {nd.input[0]: nd.output[0] for nd in onnx.load(path).graph.node
                 if nd.op_type == "QuantizeLinear"}
    env = dict(ref)
    env.setdefault(df.input.name, run_head(d.design, x))
    exact = {}
    for layer in df.layers:
        got = golden.run_layer(layer, *(env[t] for t in layer.inputs)).reshape(n, -1)
        name = layer.output if layer.output in ref else quantizer.get(layer.output)
        if name in ref:
            diff = np.abs(got - ref[name])
            assert diff.max() <= 1, layer.name
            exact[layer.name] = float(np.mean(diff == 0))
        # The next layers read onnxruntime's integers where there are any.
        env[layer.output] = ref[name] if name in ref else got
    return [ly.kind for ly in df.layers], exact


@pytest.mark.parametrize("pattern, dynamo", [("adaptive", True), ("mean", False),
                                             ("amax", True), ("sum", False)])
def test_reductions_are_global_pools(tmp_path, pattern, dynamo):
    _, path, _ = torch_qdq(tmp_path, pattern, dynamo=dynamo)
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert ops & {"ReduceMean", "ReduceMax", "ReduceSum"}
    kinds, exact = check_layers_against_onnxruntime(path)
    assert kinds.count("pool") == 1 and kinds[0] == "conv" and kinds[-1] == "dense"
    assert len(exact) >= 2 and min(exact.values()) >= 0.99


def _reduce_model(op, opset, axes, keepdims, *, as_input):
    """Conv (2 -> 3 channels) then ``op`` on a (1, 2, 5, 4) input, float."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((3, 2, 3, 3)).astype(np.float32), "w")
    inits = [w]
    ins = ["h"]
    attrs = {"keepdims": keepdims}
    if as_input:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        ins.append("axes")
    else:
        attrs["axes"] = axes
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node(op, ins, ["y"], name="reduce", **attrs)]
    out_shape = [1 if a in [k % 4 for k in axes] else d for a, d in enumerate([1, 3, 5, 4])
                 if keepdims or a not in [k % 4 for k in axes]]
    graph = helper.make_graph(
        nodes, "reduce", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("op, opset, as_input, keepdims", [
    ("ReduceMean", 13, False, 1), ("ReduceMean", 18, True, 0), ("ReduceMax", 13, False, 0),
    ("ReduceSum", 11, False, 1), ("ReduceSum", 13, True, 0)])
def test_reduction_forms_match_the_float_model(op, opset, as_input, keepdims):
    """Axes as an attribute or an input, negative axes, keepdims 0 and 1: at 16 bits the
    golden model follows onnxruntime's float model within a fraction of its range."""
    model = _reduce_model(op, opset, [-2, -1] if as_input else [2, 3], keepdims,
                          as_input=as_input)
    x = np.random.default_rng(1).standard_normal((40, 1, 2, 5, 4)).astype(np.float32)
    assert _kinds_at_16_bits(model, x) == ["conv", "pool"]


@pytest.mark.parametrize("op, opset, axes, message", [
    ("ReduceMean", 13, [1], "axes=[1] of a rank-4 input is unsupported; only the spatial "
                            "axes [2, 3] of an (N, C, ...) image (a global pooling)"),
    ("ReduceMax", 18, [1, 2, 3], "axes=[1, 2, 3] of a rank-4 input is unsupported; only the "
                                 "spatial axes [2, 3] of an (N, C, ...) image (a global "
                                 "pooling)"),
    ("ReduceSum", 13, [3], "axes=[3] of a rank-4 input is unsupported; only the spatial "
                           "axes [2, 3] of an (N, C, ...) image (a global pooling)")])
def test_other_reduction_axes_are_refused_by_name(op, opset, axes, message):
    model = _reduce_model(op, opset, axes, 1, as_input=opset >= 18 or op == "ReduceSum")
    x = np.zeros((4, 1, 2, 5, 4), np.float32)
    with pytest.raises(UnsupportedError) as e:
        onnx2fpga.compile(model, calibration=x)
    assert str(e.value) == f"Node 'reduce' ({op}, opset {opset}): {message}"


@pytest.mark.parametrize("pattern, dynamo", [("mul", True), ("sub", False), ("min", True),
                                             ("max", False)])
def test_joins_of_two_activations(tmp_path, pattern, dynamo):
    """Mul, Sub, Min and Max of two convolutions' outputs: one AddLayer with its op, equal
    to onnxruntime's DequantizeLinear -> float op -> QuantizeLinear."""
    _, path, _ = torch_qdq(tmp_path, pattern, dynamo=dynamo)
    kinds, exact = check_layers_against_onnxruntime(path)
    assert kinds == ["conv", "conv", "add", "view", "dense"]
    assert len(exact) >= 4 and min(exact.values()) >= 0.99


def test_squeeze_excitation_repeats_the_scale_over_the_image(tmp_path):
    """x * relu(fc(relu(fc(pool(x))))): the (8, 1, 1) scale is repeated over the (8, 6, 6)
    image by a nearest resize of its 1 x 1 image, then multiplied."""
    _, path, _ = torch_qdq(tmp_path, "se", dynamo=False)
    kinds, exact = check_layers_against_onnxruntime(path)
    assert kinds == ["conv", "pool", "conv", "conv", "resize", "add", "pool", "dense"]
    assert len(exact) >= 6 and min(exact.values()) >= 0.99


def test_other_broadcasts_are_refused_by_name():
    """A Mul of a (1, 6, 4, 4) and a (1, 1, 4, 4) activation (a broadcast over channels)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 2, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((1, 2, 1, 1)).astype(np.float32), "v")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], name="conv_a"),
             helper.make_node("Conv", ["x", "v"], ["b"], name="conv_b"),
             helper.make_node("Mul", ["a", "b"], ["y"], name="mul")]
    graph = helper.make_graph(
        nodes, "bcast", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    x = np.random.default_rng(1).standard_normal((8, 1, 2, 4, 4)).astype(np.float32)
    with pytest.raises(UnsupportedError) as e:
        onnx2fpga.compile(model, calibration=x, stop_after="lower")
    assert str(e.value) == ("Node 'mul' (Mul, opset 13): broadcasting (6, 4, 4) and (1, 4, 4) "
                            "is not supported; only two tensors of the same shape, or an image "
                            "and one value per channel")


@pytest.mark.parametrize("pattern, dynamo", [("split", True), ("slice", False)])
def test_channel_split_and_slice(tmp_path, pattern, dynamo):
    """A Split on the channel axis becomes one SliceLayer per output; a Slice one."""
    _, path, _ = torch_qdq(tmp_path, pattern, dynamo=dynamo)
    kinds, exact = check_layers_against_onnxruntime(path)
    assert kinds.count("slice") == (2 if pattern == "split" else 1)
    assert len(exact) >= 4 and min(exact.values()) == 1.0


@pytest.mark.parametrize("dynamo", [False, True])
def test_space_to_depth_by_reshape_and_transpose_is_a_view(tmp_path, dynamo):
    """Space-to-depth as torch code writes it (Reshape to 6-D, Transpose, Reshape) between
    two convolutions: views (the next convolution reads through a reorder buffer), every
    layer's integers onnxruntime's."""
    _, path, _ = torch_qdq(tmp_path, "s2d", dynamo=dynamo)
    ops = [n.op_type for n in onnx.load(path).graph.node]
    assert ops.count("Transpose") == 1 and ops.count("Reshape") >= 2
    kinds, exact = check_layers_against_onnxruntime(path)
    assert kinds[:2] == ["conv", "view"] and kinds.count("conv") == 2
    assert set(kinds[1:kinds.index("conv", 1)]) == {"view"}
    assert len(exact) >= 3 and min(exact.values()) == 1.0


@pytest.mark.parametrize("op, attrs", [("SpaceToDepth", {}), ("DepthToSpace", {}),
                                       ("DepthToSpace", {"mode": "CRD"})])
def test_depth_to_space_and_space_to_depth_are_views(tmp_path, op, attrs):
    """ONNX SpaceToDepth and DepthToSpace (DCR and CRD) quantized by onnxruntime: two views
    each (the image as blocks, then transposed), every layer's integers onnxruntime's."""
    fp = str(tmp_path / "fp.onnx")
    onnx.save(block_model(op, 2, **attrs), fp)
    cal = np.random.default_rng(1).standard_normal((16, 1) + SHAPE).astype(np.float32)
    path = ort_quantize(fp, tmp_path / "qdq.onnx", cal)
    assert op in [n.op_type for n in onnx.load(path).graph.node]
    kinds, exact = check_layers_against_onnxruntime(path)
    assert kinds == ["conv", "view", "view", "conv"]
    assert len(exact) >= 3 and min(exact.values()) == 1.0


@pytest.mark.parametrize("op, attrs", [("SpaceToDepth", {}), ("DepthToSpace", {"mode": "CRD"})])
def test_block_views_of_a_float_model_match_it(op, attrs):
    x = np.random.default_rng(3).standard_normal((30, 1) + SHAPE).astype(np.float32)
    assert _kinds_at_16_bits(block_model(op, 2, **attrs), x) == ["conv", "view", "view",
                                                                  "conv"]


def test_a_block_view_in_an_unknown_mode_is_refused_by_name():
    x = np.random.default_rng(1).standard_normal((4, 1) + SHAPE).astype(np.float32)
    with pytest.raises(onnx2fpga.Onnx2FpgaError, match=r"^Calibration sample 0: Node 'blocks' "
                       r"\(DepthToSpace\): mode='XYZ' is unsupported; 'DCR' or 'CRD' \(input "
                       r"shapes \(1, 8, 6, 6\)\)$"):
        onnx2fpga.compile(block_model("DepthToSpace", 2, mode="XYZ"), calibration=x,
                          stop_after="lower")


def _channel_op_model(op, opset, inputs, **attrs):
    """Conv (2 -> 6 channels) on a (1, 2, 4, 4) input, then ``op`` with constant
    ``inputs`` (name -> int64 array) and ``attrs``, float."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 2, 1, 1)).astype(np.float32), "w")]
    inits += [numpy_helper.from_array(np.asarray(v, np.int64), k) for k, v in inputs.items()]
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], name="conv"),
             helper.make_node(op, ["h"] + list(inputs), ["y"], name="cut", **attrs)]
    graph = helper.make_graph(
        nodes, "cut", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("op, opset, inputs, attrs, message", [
    ("Slice", 13, {"s": [0], "e": [2], "a": [2]}, {},
     "axes=[2], starts=[0], ends=[2], steps=[1] on shape (1, 6, 4, 4) is unsupported; only a "
     "slice of the channel axis 1 with step 1"),
    ("Slice", 13, {"s": [0], "e": [6], "a": [1], "st": [2]}, {},
     "axes=[1], starts=[0], ends=[6], steps=[2] on shape (1, 6, 4, 4) is unsupported; only a "
     "slice of the channel axis 1 with step 1"),
    ("Split", 11, {}, {"axis": 3, "split": [4]},
     "axis=3 of a rank-4 input is unsupported; only a split of the channel axis 1")])
def test_other_slices_are_refused_by_name(op, opset, inputs, attrs, message):
    model = _channel_op_model(op, opset, inputs, **attrs)
    with pytest.raises(UnsupportedError) as e:
        onnx2fpga.compile(model, calibration=np.zeros((4, 1, 2, 4, 4), np.float32))
    assert str(e.value) == f"Node 'cut' ({op}, opset {opset}): {message}"


def test_a_channel_slice_of_a_float_model_matches_it():
    model = _channel_op_model("Slice", 13, {"s": [-4], "e": [5], "a": [-3]})
    x = np.random.default_rng(3).standard_normal((30, 1, 2, 4, 4)).astype(np.float32)
    assert _kinds_at_16_bits(model, x) == ["conv", "slice"]


def _expand_model(pool: bool):
    """Conv (2 -> 6, 1x1), Relu, [GlobalAveragePool], Expand to (1, 1, 4, 4) or, after the
    pool, to (1, 6, 4, 4), Flatten, Gemm (96 -> 3): float, opset 13."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 2, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1, 6 if pool else 1, 4, 4], np.int64), "shape"),
             numpy_helper.from_array(rng.standard_normal((96, 3)).astype(np.float32), "fw")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], name="conv"),
             helper.make_node("Relu", ["h"], ["r"], name="relu")]
    t = "r"
    if pool:
        nodes.append(helper.make_node("GlobalAveragePool", ["r"], ["g"], name="pool"))
        t = "g"
    nodes += [helper.make_node("Expand", [t, "shape"], ["e"], name="expand"),
              helper.make_node("Flatten", ["e"], ["f"], name="flatten"),
              helper.make_node("Gemm", ["f", "fw"], ["y"], name="fc")]
    graph = helper.make_graph(
        nodes, "expand", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_an_expand_that_keeps_the_elements_is_a_view():
    model = _expand_model(pool=False)
    x = np.random.default_rng(4).standard_normal((30, 1, 2, 4, 4)).astype(np.float32)
    assert _kinds_at_16_bits(model, x) == ["conv", "view", "dense"]


def test_an_expand_that_copies_is_refused_by_name():
    x = np.random.default_rng(4).standard_normal((8, 1, 2, 4, 4)).astype(np.float32)
    with pytest.raises(UnsupportedError) as e:
        onnx2fpga.compile(_expand_model(pool=True), calibration=x, stop_after="lower")
    assert str(e.value) == ("Node 'expand' (Expand, opset 13): expanding (1, 6, 1, 1) to "
                            "(1, 6, 4, 4) copies data; only an Expand that keeps the elements "
                            "(adds unit axes) is supported")


@pytest.mark.parametrize("opset, inputs, attrs", [
    (11, {}, {"split": [2, 4]}), (13, {"sizes": [4, 2]}, {}), (18, {}, {"num_outputs": 2})])
def test_split_forms_match_the_float_model(opset, inputs, attrs):
    """Split-11 (sizes as an attribute), -13 (as an input), -18 (num_outputs), its two parts
    concatenated in the other order: two slices and a concatenation."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 2, 1, 1)).astype(np.float32), "w")]
    inits += [numpy_helper.from_array(np.asarray(v, np.int64), k) for k, v in inputs.items()]
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], name="conv"),
             helper.make_node("Split", ["h"] + list(inputs), ["p", "q"], name="split", axis=1,
                              **attrs),
             helper.make_node("Concat", ["q", "p"], ["y"], name="concat", axis=1)]
    graph = helper.make_graph(
        nodes, "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    x = np.random.default_rng(5).standard_normal((30, 1, 2, 4, 4)).astype(np.float32)
    assert _kinds_at_16_bits(model, x) == ["conv", "slice", "slice", "concat"]
