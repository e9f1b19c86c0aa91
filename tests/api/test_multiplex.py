"""Several inputs and outputs of the hardware part multiplexed onto its one input and one
output stream (flattened in C order and concatenated, each part with its own scale and zero
point; the manifest's port ``parts`` give the layout): golden against onnxruntime on its own
quantize_static models, dicts through the API and ``.npz`` files through the command line."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx2fpga
from onnx2fpga.errors import InputError, UnsupportedError
from onnx2fpga.sim.model import run_design
from onnx2fpga.steps import partition_text
from tests.api.test_fuzz import run_frontend
from tests.helpers.cli import run_cli
from tests.helpers.models import ort_qdq_multi_io

ort = pytest.importorskip("onnxruntime")


def _lsb(model, output):
    """The scale of the DequantizeLinear that makes graph output ``output``."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    dq = next(n for n in model.graph.node if n.output[0] == output)
    assert dq.op_type == "DequantizeLinear"
    return float(inits[dq.input[1]])


def _agree(model, got, want):
    """Golden equal to onnxruntime: >= 99 % of the output codes exact, the rest within 1."""
    for name, ref in want.items():
        diff = np.rint(np.abs(got[name].reshape(ref.shape) - ref) / _lsb(model, name))
        assert diff.max() <= 1, name
        assert (diff == 0).mean() >= 0.99, name


def _ort(path, feeds):
    sess = ort.InferenceSession(path)
    names = [o.name for o in sess.get_outputs()]
    outs = [np.stack([sess.run([n], {k: v[j] for k, v in feeds.items()})[0]
                      for j in range(len(next(iter(feeds.values()))))]) for n in names]
    return dict(zip(names, outs))


@pytest.mark.parametrize("kind, outputs", [("two_heads", ["a", "b"]),
                                           ("hidden_out", ["y", "h"])])
def test_several_hardware_results_leave_through_one_stream(tmp_path, capsys, kind, outputs):
    path, cal = ort_qdq_multi_io(tmp_path, kind)
    d = onnx2fpga.compile(path, tmp_path / "design")
    port = d.manifest["ports"]["m_axis"]
    parts = port["parts"]
    assert sorted(p["size"] for p in parts) == ([3, 4] if kind == "two_heads" else [4, 8])
    assert [p["offset"] for p in parts] == [0, parts[0]["size"]]
    assert port["shape"] == [1, sum(p["size"] for p in parts)]
    assert port["scale"] == 1.0 and port["zero_point"] == 0
    report = (tmp_path / "design" / "report.md").read_text()
    for p in parts:
        assert f"| m_axis | {p['tensor']} | {p['offset']} | {p['size']} |" in report
    got = d.simulate(cal["x"], engine="golden")
    assert list(got) == outputs
    _agree(onnx.load(path), got, _ort(path, cal))
    np.save(tmp_path / "x.npy", cal["x"][:5])
    code, stdout, _ = run_cli(capsys, "simulate", tmp_path / "design", "--engine", "golden",
                              "--inputs", tmp_path / "x.npy", "--outputs", tmp_path / "y.npz")
    assert code == 0, stdout
    with np.load(tmp_path / "y.npz") as y:
        assert sorted(y.files) == sorted(outputs)
        for name in outputs:
            np.testing.assert_array_equal(y[name], got[name][:5])


def test_two_inputs_enter_through_one_stream(tmp_path, capsys):
    path, cal = ort_qdq_multi_io(tmp_path, "two_inputs")
    out = tmp_path / "design"
    code, stdout, _ = run_cli(capsys, "compile", path, "-o", out)
    assert code == 0, stdout
    parts = json.loads((out / "manifest.json").read_text())["ports"]["s_axis"]["parts"]
    assert [(p["offset"], p["size"], p["shape"]) for p in parts] == \
        [(0, 12, [1, 12]), (12, 6, [1, 6])]
    d = onnx2fpga.load(out)
    assert partition_text(d.design) == ("host: quantize and dequantize only; hardware: 6 "
                                        "layers; 2 inputs multiplexed")
    assert [ly.kind for ly in d.design.dataflow.layers][:4] == ["slice", "slice", "dense",
                                                                "dense"]
    got = {"y": d.simulate(cal, engine="golden")}     # a dict in (one output: an array out)
    _agree(onnx.load(path), got, _ort(path, cal))
    np.savez(tmp_path / "x.npz", **cal)
    code, stdout, _ = run_cli(capsys, "simulate", out, "--engine", "golden", "--inputs",
                              tmp_path / "x.npz", "--outputs", tmp_path / "y.npy")
    assert code == 0, stdout
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), got["y"])


@pytest.mark.rtl
def test_hidden_activation_and_accumulator_outputs_rtl_equal_golden(tmp_path):
    """A hidden int8 activation and the last Gemm's accumulator (no output quantizer: it runs
    to its accumulator in hardware, the host dequantizes it) leave through one stream of the
    wider type; RTL equal to golden under stalls, golden equal to onnxruntime."""
    path, cal = ort_qdq_multi_io(tmp_path, "hidden_out")
    m = onnx.load(path)
    prod = {o: n for n in m.graph.node for o in n.output}
    dq = prod["y"]
    q = prod[dq.input[0]]
    prod[q.input[0]].output[0] = "y"
    m.graph.node.remove(q)
    m.graph.node.remove(dq)
    path = str(tmp_path / "acc.onnx")
    onnx.save(m, path)
    d = onnx2fpga.compile(path, tmp_path / "design")
    port = d.manifest["ports"]["m_axis"]
    assert [p["type"] for p in port["parts"]] == ["int8", port["type"]] != ["int8", "int8"]
    x = cal["x"][:10]
    golden = d.simulate(x, engine="golden")
    sess = ort.InferenceSession(path)
    for name in ("y", "h"):
        want = np.stack([sess.run([name], {"x": s})[0] for s in x])
        np.testing.assert_allclose(golden[name], want, rtol=1e-5, atol=1e-6)
    for seed, stall in ((1, 0.3), (2, 0.6)):
        rtl = d.simulate(x, engine="rtl", seed=seed, stall_in=stall, stall_out=stall)
        for name in ("y", "h"):
            np.testing.assert_array_equal(rtl[name], golden[name])


def test_inputs_of_two_integer_types_are_refused_and_a_bare_array_too(tmp_path):
    path, cal = ort_qdq_multi_io(tmp_path, "two_inputs")
    design = run_frontend(path)
    with pytest.raises(InputError, match=r"^The model has 2 inputs \('x', 'z'\): pass a dict "
                                         r"\(a \.npz file\) of one array per input name$"):
        run_design(design, cal["x"])
    with pytest.raises(InputError, match=r"^Inputs 'x', 'z' must hold the same number of "
                                         r"samples in the same layout, not shapes "
                                         r"\(64, 1, 12\), \(3, 1, 6\)$"):
        run_design(design, {"x": cal["x"], "z": cal["z"][:3]})
    m = onnx.load(path)
    inits = {i.name: i for i in m.graph.initializer}
    q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "z")
    zp = numpy_helper.to_array(inits[q.input[2]])
    inits[q.input[2]].CopyFrom(numpy_helper.from_array((zp.astype(np.int16) + 128)
                                                       .astype(np.uint8), q.input[2]))
    with pytest.raises(UnsupportedError, match=r"^Graph '[^']+': inputs 'x', 'z' are "
                                               r"quantized to int8, uint8; several inputs "
                                               r"share one input stream and must have one "
                                               r"integer type$"):
        run_frontend(m)


def _two_image_model():
    """Conv of x (2x5x4) and of z (1x5x4) concatenated on channels -> Relu -> two Conv heads
    a (2 channels) and b (3): images in and out, in C order on the host, channels last in
    the streams."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def conv(src, cin, cout, out):
        k = len(inits) // 2
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((cout, cin, 3, 3)) / 3).astype(np.float32), f"W{k}"))
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(cout) * 0.1).astype(np.float32), f"B{k}"))
        nodes.append(helper.make_node("Conv", [src, f"W{k}", f"B{k}"], [out],
                                      pads=[1, 1, 1, 1], name=f"conv{k}"))

    conv("x", 2, 3, "cx")
    conv("z", 1, 3, "cz")
    nodes += [helper.make_node("Concat", ["cx", "cz"], ["s"], axis=1, name="concat"),
              helper.make_node("Relu", ["s"], ["h"], name="relu")]
    conv("h", 6, 2, "a")
    conv("h", 6, 3, "b")

    def vi(name, c):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, c, 5, 4])

    graph = helper.make_graph(nodes, "two_images", [vi("x", 2), vi("z", 1)],
                              [vi("a", 2), vi("b", 3)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def test_image_inputs_and_outputs_are_multiplexed_in_c_order(tmp_path):
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    rng = np.random.default_rng(1)
    cal = {"x": rng.standard_normal((32, 1, 2, 5, 4)).astype(np.float32),
           "z": rng.standard_normal((32, 1, 1, 5, 4)).astype(np.float32)}

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({k: v[j] for k, v in cal.items()} for j in range(32))

        def get_next(self):
            return next(self.it, None)

    fp, path = str(tmp_path / "fp.onnx"), str(tmp_path / "qdq.onnx")
    onnx.save(_two_image_model(), fp)
    quantize_static(fp, path, Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)
    d = onnx2fpga.compile(path, tmp_path / "design")
    assert [ly.kind for ly in d.design.dataflow.layers] == [
        "slice", "view", "slice", "view", "conv", "conv", "concat", "conv", "conv", "view",
        "view", "concat"]
    got = d.simulate(cal, engine="golden")
    _agree(onnx.load(path), got, _ort(path, cal))
