"""Models as skl2onnx 1.20 writes them: a scikit-learn MLPClassifier (after a StandardScaler
or not) with its label and probabilities outputs, quantized by onnxruntime or compiled float
with calibration. Every MatMul runs in hardware; the ai.onnx.ml operators around the layers
(Scaler, ArrayFeatureExtractor) run on the host; both outputs are compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx2fpga
from onnx2fpga.errors import CheckError, InputError, UnsupportedError
from onnx2fpga.frontend.load import load_model
from onnx2fpga.sim import golden
from onnx2fpga.sim.model import run_head, stack_inputs
from tests.helpers.cli import run_cli
from tests.helpers.models import save, skl2onnx_mlp

pytest.importorskip("skl2onnx")
ort = pytest.importorskip("onnxruntime")

_N = 200          # digits compared


def _ort(path, x, extra=()):
    """onnxruntime's outputs by name (and those of the tensors ``extra``, as outputs)."""
    m = onnx.load(path)
    for name, dtype in extra:
        m.graph.output.append(helper.make_tensor_value_info(name, dtype, None))
    s = ort.InferenceSession(m.SerializeToString())
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, {"X": x})))


def _matmuls(path):
    return sum(n.op_type in ("MatMul", "Gemm") for n in onnx.load(path).graph.node)


@pytest.fixture(scope="module")
def qdq(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("skl")
    path, x = skl2onnx_mlp(tmp)
    return path, x, onnx2fpga.compile(path, tmp / "design")


@pytest.mark.parametrize("scaler", [False, True])
def test_qdq_mlp_label_and_probabilities_equal_onnxruntime(tmp_path, qdq, scaler):
    if scaler:
        path, x = skl2onnx_mlp(tmp_path, scaler=True)
        d = onnx2fpga.compile(path, tmp_path / "design")
    else:
        path, x, d = qdq
    layers = d.design.dataflow.layers
    assert [ly.kind for ly in layers] == ["dense"] * _matmuls(path) == ["dense"] * 2
    assert d.manifest["outputs"] == [{"name": "label", "dtype": "int64", "shape": [1]},
                                     {"name": "probabilities", "dtype": "float32",
                                      "shape": [1, 10]}]
    assert [n.op for n in d.design.head][0] == ("Scaler" if scaler else "Cast")
    x = x[:_N]
    hw_out = d.design.dataflow.output.name            # the last layer's int8 logits
    want = _ort(path, x, [(hw_out, TensorProto.INT8)])
    got = d.simulate(x, engine="golden")
    assert sorted(got) == ["label", "probabilities"]
    # the hardware's stream: >= 99 % exact, the rest within one step (measured: 100 % and
    # 99.85 % with the scaler)
    y_int = golden.run_dataflow(d.design.dataflow, run_head(d.design, stack_inputs(
        d.design, x)[0]))
    diff = np.abs(y_int - want[hw_out].reshape(_N, -1))
    assert diff.max() <= 1 and np.mean(diff == 0) >= 0.99
    # onnxruntime fuses DQ -> Softmax -> Q into a QLinearSoftmax (a lookup table); the host
    # computes the Softmax in float32: within one step of the probabilities' quantizer
    step = float(onnx.numpy_helper.to_array(next(
        t for t in onnx.load(path).graph.initializer if t.name == "probabilities_scale")))
    assert got["probabilities"].shape == want["probabilities"].shape == (_N, 10)
    # (measured: 100 % exact; 87 % with the scaler, the rest one step)
    assert np.abs(got["probabilities"] - want["probabilities"]).max() <= step * 1.001
    assert got["label"].dtype == want["label"].dtype and got["label"].shape == (_N,)
    assert np.mean(got["label"] == want["label"]) >= 0.99


def test_float_mlp_with_calibration_is_close_to_onnxruntime(tmp_path):
    path, x = skl2onnx_mlp(tmp_path, scaler=True, quantize=False)
    d = onnx2fpga.compile(path, tmp_path / "design", calibration=x[:64])
    assert [ly.kind for ly in d.design.dataflow.layers] == ["dense"] * 2 == \
        ["dense"] * _matmuls(path)
    got, want = d.simulate(x[:_N], engine="golden"), _ort(path, x[:_N])
    assert np.mean(got["label"] == want["label"]) >= 0.95
    assert np.abs(got["probabilities"] - want["probabilities"]).mean() < 0.01
    # the compile's own figure compares the float output (probabilities), not the label
    assert d.manifest["quantization"]["calibration_argmax_agreement"] >= 0.95


def test_zipmap_is_refused_saying_how_to_export_without_it(tmp_path):
    path, _ = skl2onnx_mlp(tmp_path, zipmap=True, quantize=False)
    with pytest.raises(UnsupportedError, match=(
            r"^Node 'ZipMap' \(ai\.onnx\.ml\.ZipMap, opset 1\): ZipMap outputs a sequence of "
            r"maps, which cannot be compiled; export the classifier without it \(skl2onnx: "
            r"to_onnx\(model, X, options=\{'zipmap': False\}\), which outputs the "
            r"probabilities as a tensor\)$")):
        load_model(path)


def test_input_layouts_and_the_error_that_lists_them(qdq):
    path, x, d = qdq
    flat = d.simulate(x[:3], engine="golden")
    rows = d.simulate(x[:3, None, :], engine="golden")     # (batch, 1, 64): the model's own
    assert flat["probabilities"].shape == (3, 10) and flat["label"].shape == (3,)
    assert rows["probabilities"].shape == (3, 1, 10) and rows["label"].shape == (3, 1)
    np.testing.assert_array_equal(rows["probabilities"][:, 0], flat["probabilities"])
    with pytest.raises(InputError, match=r"^Input 'X' must be stacked as \(batch, 1, 64\) or "
                                         r"\(batch, 64\), not \(3, 63\)$"):
        d.simulate(x[:3, :63], engine="golden")
    got = d.simulate({"X": x[:3]}, engine="golden")
    np.testing.assert_array_equal(got["label"], flat["label"])
    with pytest.raises(InputError, match=r"^Inputs must be named 'X', not 'x'$"):
        d.simulate({"x": x[:3]}, engine="golden")


def test_cli_reads_and_writes_npz_by_name(tmp_path, capsys, qdq):
    path, x, d = qdq
    np.savez(tmp_path / "x.npz", X=x[:5])
    np.save(tmp_path / "x.npy", x[:5])
    code, out, err = run_cli(capsys, "simulate", d.directory, "--engine", "golden",
                             "--inputs", tmp_path / "x.npz", "--outputs", tmp_path / "y.npz")
    assert code == 0, err
    assert out == f"golden: 5 inferences -> {tmp_path / 'y.npz'} label (5,), probabilities " \
                  f"(5, 10)\n"
    want = d.simulate(x[:5], engine="golden")
    with np.load(tmp_path / "y.npz") as y:
        assert sorted(y.files) == ["label", "probabilities"]
        for k in y.files:
            np.testing.assert_array_equal(y[k], want[k])
    code, _, err = run_cli(capsys, "simulate", d.directory, "--engine", "golden",
                           "--inputs", tmp_path / "x.npy", "--outputs", tmp_path / "y.npy")
    assert code == 2 and err == (f"error: {tmp_path / 'y.npy'}: the model has 2 outputs "
                                 f"('label', 'probabilities'); write them to a .npz file "
                                 f"(one array per output name)\n")
    assert not (tmp_path / "y.npy").exists()


def test_lenient_types_what_a_cut_model_leaves_untyped(tmp_path, qdq):
    """skl2onnx's select_model_inputs_outputs leaves the new output without a type."""
    from skl2onnx.helpers.onnx_helper import select_model_inputs_outputs

    path, x, _ = qdq
    cut = select_model_inputs_outputs(onnx.load(path), outputs=["add_result1"])
    cut.graph.value_info.append(onnx.ValueInfoProto(name="mul_result"))
    cut_path = save(cut, tmp_path / "cut.onnx")
    with pytest.raises(CheckError, match=r"^Value 'mul_result': value_info entry without a "
                                         r"type \(--lenient drops such entries\)$"):
        load_model(cut_path)
    del cut.graph.value_info[:]
    with pytest.raises(CheckError, match=r"^Output 'add_result1' has no type \(--lenient "
                                         r"takes it from shape inference\)$"):
        load_model(save(cut, tmp_path / "cut_out.onnx"))
    with pytest.warns(Warning):
        d = onnx2fpga.compile(cut_path, tmp_path / "design", lenient=True)
    assert len(d.design.dataflow.layers) == 2
    got = d.simulate(x[:_N], engine="golden")
    want = _ort(cut_path, x[:_N])["add_result1"]
    # the last layer's accumulator leaves the hardware exactly; the host adds the bias
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
