"""Frontend: loading, checking, lowering and quantization, judged against onnxruntime."""

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2fpga.errors import CalibrationError, CheckError, LoadError, UnsupportedError
from onnx2fpga.frontend.load import Onnx2FpgaWarning, load_model
from onnx2fpga.frontend.lower import lower
from onnx2fpga.frontend.qdq import normalize_qdq
from onnx2fpga.frontend.quantize import quantize_graph
from onnx2fpga.ir.layers import DenseLayer
from onnx2fpga.plan.fold import fold
from onnx2fpga.sim.model import run_design
from tests.helpers.models import float_mlp, float_softmax_mlp, ort_qdq_mlp, save


def _design(path_or_model, multiplier_bits=24, **kw):
    g = load_model(path_or_model)
    normalize_qdq(g)
    d = lower(g, multiplier_bits=multiplier_bits, **kw)
    fold(d.dataflow)
    return d


def _ort(path, x):
    s = ort.InferenceSession(str(path))
    return np.stack([s.run(None, {"x": xi})[0] for xi in x])


@pytest.mark.parametrize("kind,opset,activation,per_channel", [
    ("gemm", 13, "int8", False),
    ("gemm", 13, "uint8", True),
    ("gemm", 21, "int8", True),
    ("matmul", 13, "int8", False),
    ("matmul", 21, "uint8", True),
    ("matmul", 21, "int8", False),
])
def test_golden_equals_onnxruntime_on_its_qdq_models(tmp_path, kind, opset, activation,
                                                     per_channel):
    path, _ = ort_qdq_mlp(tmp_path, kind=kind, opset=opset, activation=activation,
                          per_channel=per_channel, sizes=(16, 24, 12, 6))
    d = _design(path)
    x = np.random.default_rng(7).standard_normal((500, 1, 16)).astype(np.float32)
    got = run_design(d, x)
    want = _ort(path, x)
    lsb = np.abs(got - want) / d.dataflow.output.scale
    exact = np.mean(lsb < 1e-3)
    # 24-bit multipliers (the default for models quantized elsewhere): within one step.
    assert lsb.max() <= 1.0 + 1e-3, f"largest difference {lsb.max():.3f} LSB"
    assert exact >= 0.99, f"only {exact * 100:.2f} % exact"


def test_partition_puts_softmax_on_the_host(tmp_path):
    path, _ = ort_qdq_mlp(tmp_path, softmax=True)
    d = _design(path)
    assert [n.op for n in d.head] == ["QuantizeLinear"]
    # onnxruntime quantizes the Softmax output too: DQ -> Softmax -> Q -> DQ, all on the host
    assert [n.op for n in d.tail] == ["DequantizeLinear", "Softmax", "QuantizeLinear",
                                      "DequantizeLinear"]
    x = np.random.default_rng(1).standard_normal((50, 1, 16)).astype(np.float32)
    got, want = run_design(d, x), _ort(path, x)
    lsb = float(d.tail[-1].attrs["scale"])  # the tail's own output quantizer
    assert np.abs(got - want).max() <= lsb * 1.001
    assert np.mean(np.abs(got - want) < lsb / 2) >= 0.75


@pytest.mark.parametrize("kind,trans_b", [("gemm", False), ("gemm", True), ("matmul", False)])
def test_float_model_with_calibration_tracks_float(kind, trans_b):
    model = float_mlp((20, 16, 8), kind=kind, trans_b=trans_b, softmax=False)
    rng = np.random.default_rng(5)
    cal = rng.standard_normal((200, 1, 20)).astype(np.float32)
    g = load_model(model)
    quantize_graph(g, cal)
    d = lower(g)
    fold(d.dataflow)
    x = rng.standard_normal((300, 1, 20)).astype(np.float32)
    got = run_design(d, x)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x[:, 0]})[0]
    span = ref.max() - ref.min()
    # int8 activations: the error is a few output quantization steps, not more.
    assert np.percentile(np.abs(got[:, 0] - ref), 99) < 0.05 * span
    assert np.mean(np.argmax(got[:, 0], 1) == np.argmax(ref, 1)) > 0.9


def test_pow2_scales_make_every_requantization_a_shift():
    """pow2_scales: every quantizer's scale is a power of two, so every requantization
    multiplier of the lowered design is one too (one signed digit: a shift), and the
    quantized model still tracks the float one as the min-max scales do."""
    model = float_mlp((20, 16, 8), softmax=False)
    rng = np.random.default_rng(5)
    cal = rng.standard_normal((200, 1, 20)).astype(np.float32)
    g = load_model(model)
    quantize_graph(g, cal, pow2_scales=True)
    for n in g.nodes:
        if n.op in ("QuantizeLinear", "DequantizeLinear"):
            s = np.asarray(n.attrs["scale"], np.float64)
            np.testing.assert_array_equal(np.exp2(np.round(np.log2(s))), s)
    assert g.metadata["quantization"]["pow2_scales"] is True
    d = lower(g)
    fold(d.dataflow)
    stages = [st for ly in d.dataflow.layers for st in ly.requant]
    assert stages
    for st in stages:
        m = np.abs(st.multiplier)
        assert np.all(m & (m - 1) == 0), st.multiplier
    x = rng.standard_normal((300, 1, 20)).astype(np.float32)
    got = run_design(d, x)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x[:, 0]})[0]
    assert np.percentile(np.abs(got[:, 0] - ref), 99) < 0.1 * (ref.max() - ref.min())


@pytest.mark.parametrize("bits", [2, 4, 8, 12])
def test_calibrated_widths_are_the_requested_ones(bits):
    g = load_model(float_mlp((8, 8, 4), softmax=False))
    quantize_graph(g, np.random.default_rng(0).standard_normal((50, 1, 8)).astype(np.float32),
                   weight_bits=bits, activation_bits=bits)
    d = lower(g)
    for layer in d.dataflow.layers:
        assert layer.in_type.bits == bits and layer.weight_type.bits <= bits
        assert np.abs(layer.weight).max() <= (1 << (bits - 1)) - 1


def test_not_a_file(tmp_path):
    with pytest.raises(LoadError, match=r"no such file$"):
        load_model(tmp_path / "missing.onnx")
    with pytest.raises(LoadError, match=r": not a file$"):
        load_model(tmp_path)


def test_not_onnx_and_truncated(tmp_path):
    p = tmp_path / "x.onnx"
    p.write_bytes(b"hello, this is not a protobuf \xff\xff\xff")
    with pytest.raises(LoadError, match=r"not an ONNX model"):
        load_model(p)
    good = float_mlp().SerializeToString()
    p.write_bytes(good[: len(good) // 2])
    with pytest.raises((LoadError, CheckError)):
        load_model(p)


class _OldField:
    """A protobuf < 6.31 FieldDescriptor: ``label`` and no ``is_repeated``."""

    LABEL_REPEATED = 3  # descriptor.proto's FieldDescriptorProto.Label

    def __init__(self, field, label):
        self._field, self.label = field, label

    def __getattr__(self, name):
        if name == "is_repeated":
            raise AttributeError(name)
        return getattr(self._field, name)


def test_load_on_protobuf_without_is_repeated(tmp_path, monkeypatch):
    """Every message's ListFields hands out descriptors as protobuf < 6.31 has them; the
    labels come from the serialized .proto (descriptor_pb2), not from the runtime."""
    import sys

    from google.protobuf import descriptor_pb2

    module = sys.modules[onnx.ModelProto.__module__]
    proto = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
    labels, classes = {}, []

    def walk(messages, prefix, owner):
        for m in messages:
            cls = getattr(owner, m.name)
            classes.append(cls)
            for f in m.field:
                labels[f"{prefix}{m.name}.{f.name}"] = f.label
            walk(m.nested_type, f"{prefix}{m.name}.", cls)

    walk(proto.message_type, f"{proto.package}.", module)
    seen = []
    for cls in classes:
        original = cls.ListFields

        def old_list_fields(self, original=original):
            out = [(_OldField(f, labels[f.full_name]), v) for f, v in original(self)]
            seen.extend(f.full_name for f, _ in out)
            return out

        monkeypatch.setattr(cls, "ListFields", old_list_fields)
    with pytest.raises(AttributeError):
        _OldField(onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"], 1).is_repeated
    m = float_mlp()
    p = tmp_path / "m.onnx"
    p.write_bytes(m.SerializeToString())
    g = load_model(p)
    assert [n.name for n in g.nodes] == [n.name for n in m.graph.node]
    # repeated messages (graph.node) and singular ones (model.graph) were walked
    assert {"onnx.ModelProto.graph", "onnx.GraphProto.node", "onnx.NodeProto.input"} <= set(seen)
    p.write_bytes(m.SerializeToString().replace(b"fc0", b"f\xdc0"))
    with pytest.raises(LoadError, match=r"holds a string that is not valid UTF-8$"):
        load_model(p)


def test_checker_failure_is_one_clear_line(tmp_path):
    m = float_mlp()
    m.graph.node[0].attribute.append(helper.make_attribute("bogus", 1))
    with pytest.raises(CheckError, match=r"^ONNX checker: Unrecognized attribute: bogus"):
        load_model(m)


def test_missing_default_opset_needs_lenient():
    m = float_mlp()
    del m.opset_import[:]
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(CheckError, match=r"--lenient"):
        load_model(m)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g = load_model(m, lenient=True)
    assert any("MD-04" in str(x.message) for x in w if x.category is Onnx2FpgaWarning)
    assert g.opsets[""] == 18  # IR 8 was released with opsets 15 to 18 (onnx 1.10-1.13)


def test_symbolic_non_batch_dimension_is_refused():
    m = float_mlp()
    m.graph.input[0].type.tensor_type.shape.dim[1].Clear()
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "F"
    with pytest.raises(CheckError, match=r"^Input 'x': dimension 1 is symbolic \('F'\)"):
        load_model(m)


def test_batch_dimension_bound_to_one():
    g = load_model(float_mlp())
    assert g.tensors["x"].shape == (1, 16)


def test_every_unsupported_node_is_listed(tmp_path):
    path, _ = ort_qdq_mlp(tmp_path)
    m = onnx.load(path)
    # Replace both Gemm nodes by Einsum and Hardmax-like ops the hardware cannot run.
    for n in m.graph.node:
        if n.op_type == "Gemm":
            n.op_type = "Einsum"
            del n.attribute[:]
            n.attribute.append(helper.make_attribute("equation", "ij,jk->ik"))
            del n.input[2:]
    onnx.save(m, path)
    with pytest.raises(UnsupportedError) as e:
        _design(path)
    msg = str(e.value)
    assert msg.startswith("2 unsupported nodes: ")
    assert "(Einsum, opset 13): not supported in hardware" in msg


def test_outside_external_data_is_refused(tmp_path):
    m = float_mlp()
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    del t.float_data[:]
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="../secret.bin")
    (tmp_path / "d").mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 4096)
    p = tmp_path / "d" / "m.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(LoadError, match=r"outside the model's folder$"):
        load_model(p)


def test_caller_model_is_not_mutated():
    m = float_mlp()
    before = m.SerializeToString()
    load_model(m)
    assert m.SerializeToString() == before


def test_initializer_as_input_is_a_default_with_warning(tmp_path):
    m = float_mlp()
    w = m.graph.initializer[0]
    m.graph.input.append(helper.make_tensor_value_info(w.name, TensorProto.FLOAT, list(w.dims)))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        g = load_model(m)
    assert g.inputs == ["x"]
    assert any("GR-05" in str(r.message) for r in rec)
    assert numpy_helper.to_array(w).shape == g.constants[w.name].shape
    save(m, tmp_path / "m.onnx")


def test_calibration_failure_names_sample_and_node():
    # Weights with a NaN: the float model itself produces NaN on every sample.
    m = float_mlp((6, 4, 3), softmax=False)
    w = numpy_helper.to_array(m.graph.initializer[0]).copy()
    w[0, 0] = np.nan
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, m.graph.initializer[0].name))
    g = load_model(m)
    cal = np.ones((4, 1, 6), np.float32)
    with pytest.raises(CalibrationError, match=r"^Calibration sample 0: tensor '.*' is not "
                       r"finite \(NaN or infinity in the float model\)$"):
        quantize_graph(g, cal)


def test_host_op_failure_is_our_error_naming_the_node():
    from onnx2fpga.sim import host
    from onnx2fpga.sim.host import HostOpError
    node = type("N", (), {"op": "MatMul", "inputs": ["a", "b"], "outputs": ["y"],
                          "attrs": {}, "version": 13, "name": "mm"})()
    with pytest.raises(HostOpError, match=r"^Node 'mm' \(MatMul\): .* \(input shapes "
                       r"\(1, 3\), \(4, 2\)\)$"):
        host.run_nodes([node], {"a": np.ones((1, 3), np.float32)},
                       {"b": np.ones((4, 2), np.float32)})


@pytest.mark.parametrize("opset", [13, 21])
def test_last_layer_without_quantizer_ends_in_its_accumulator(tmp_path, opset):
    """A model whose last MatMul/Gemm has no quantizer after it (like FINN's TFC): the
    layer runs in hardware up to its exact accumulator, and the host dequantizes it per
    output channel and adds the bias; the result tracks onnxruntime's float arithmetic."""
    path, _ = ort_qdq_mlp(tmp_path, kind="gemm", opset=opset, softmax=False, per_channel=True)
    m = onnx.load(path)
    nodes = list(m.graph.node)
    out = m.graph.output[0].name
    dq = next(n for n in nodes if n.output[0] == out)
    q = next(n for n in nodes if n.output[0] == dq.input[0])
    last = next(n for n in nodes if q.input[0] in n.output)
    last.output[0] = out
    for n in (q, dq):
        m.graph.node.remove(n)
    onnx.save(m, tmp_path / "noq.onnx")
    d = _design(tmp_path / "noq.onnx")
    fold(d.dataflow)
    final = d.dataflow.layers[-1]
    assert isinstance(final, DenseLayer) and final.requant == []
    assert d.dataflow.output.type == final.acc_type
    assert d.tail[0].op == "DequantizeLinear" and d.tail[0].inputs == [d.dataflow.output.name]
    x = np.random.default_rng(3).standard_normal((100, 1, 16)).astype(np.float32)
    got, want = run_design(d, x), _ort(tmp_path / "noq.onnx", x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_float_input_of_a_quantized_model_is_quantized_from_calibration(tmp_path):
    """QKeras and Brevitas exports feed the first layer a float input: with calibration data
    its input gets a quantizer too, so the whole network runs in hardware."""
    import onnx2fpga

    path, _ = ort_qdq_mlp(tmp_path, kind="gemm", softmax=False)
    m = onnx.load(path)
    q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and
              n.input[0] == q.output[0])
    for n in m.graph.node:
        n.input[:] = ["x" if i == dq.output[0] else i for i in n.input]
    m.graph.node.remove(q)
    m.graph.node.remove(dq)
    onnx.save(m, tmp_path / "float_in.onnx")
    rng = np.random.default_rng(4)
    cal = rng.standard_normal((100, 1, 16)).astype(np.float32)
    # Without calibration the first Gemm reads the float input: on the host only if asked.
    with pytest.raises(UnsupportedError, match=r"^Node 'fc0' \(Gemm, opset 13\): a compute "
                       r"operator on the host \(head\), in float: it reads the model's float "
                       r"input before the first quantized activation .*--allow-host-compute"):
        onnx2fpga.compile(tmp_path / "float_in.onnx")
    with pytest.warns(Onnx2FpgaWarning, match=r"^1 compute node run on the host in float "
                      r"\(allowed\): Node 'fc0' \(Gemm, opset 13\)"):
        without = onnx2fpga.compile(tmp_path / "float_in.onnx", allow_host_compute=True)
    d = onnx2fpga.compile(tmp_path / "float_in.onnx", calibration=cal, activation_bits=12)
    assert len(d.design.dataflow.layers) == len(without.design.dataflow.layers) + 1
    assert d.manifest["quantization"]["float_inputs_quantized"]["tensors"] == ["x"]
    assert d.design.dataflow.input.type.bits == 12
    x = rng.standard_normal((200, 1, 16)).astype(np.float32)
    got, want = d.simulate(x, engine="golden"), _ort(tmp_path / "float_in.onnx", x)
    lsb = d.design.dataflow.output.scale
    assert np.percentile(np.abs(got - want), 99) <= 2 * lsb


def test_compute_on_the_host_is_refused_unless_allowed(tmp_path):
    """A MatMul left on the host is an error naming it and the node that keeps it there;
    allow_host_compute compiles it with a warning, and the host runs it in float."""
    import onnx2fpga

    path = save(float_softmax_mlp(), tmp_path / "sig.onnx")
    cal = np.random.default_rng(1).standard_normal((20, 1, 16)).astype(np.float32)
    with pytest.raises(UnsupportedError, match=(
            r"^Node 'fc1' \(MatMul, opset 13\): a compute operator on the host \(tail\), in "
            r"float: its input comes from Node 'act' \(Softmax, opset 13\), which does not "
            r"run in hardware \(the hardware runs Abs, Add, .*\); to run it there, pass "
            r"--allow-host-compute \(allow_host_compute=True\)$")):
        onnx2fpga.compile(path, tmp_path / "refused", calibration=cal)
    assert not (tmp_path / "refused").exists()
    with pytest.warns(Onnx2FpgaWarning, match=r"^1 compute node run on the host in float "
                      r"\(allowed\): Node 'fc1' \(MatMul, opset 13\)"):
        d = onnx2fpga.compile(path, tmp_path / "allowed", calibration=cal,
                              allow_host_compute=True, stop_after="lower")
    assert [n.op for n in d.design.tail if n.op in ("MatMul", "Softmax")] == \
        ["Softmax", "MatMul"]
    x = cal[:10]
    np.testing.assert_allclose(run_design(d.design, x), _ort(path, x), atol=0.05)
