"""Several graph outputs computed by the host from the accelerator's one output stream
(logits and their softmax), a second input the hardware never reads (refused), and the safe
reading of ``.npz`` input files."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx2fpga
from onnx2fpga.arrays import read_npz
from onnx2fpga.errors import CalibrationError, InputError, UnsupportedError
from tests.api.test_fuzz import run_frontend
from tests.helpers.models import float_mlp, ort_qdq_mlp, save

ort = pytest.importorskip("onnxruntime")


def test_logits_and_softmax_outputs_from_one_stream(tmp_path):
    m = float_mlp((12, 8, 4))                                   # ... -> h1 -> Softmax -> y
    m.graph.output.append(helper.make_tensor_value_info("h1", TensorProto.FLOAT, ["N", 4]))
    path = save(m, tmp_path / "two.onnx")
    cal = np.random.default_rng(1).standard_normal((48, 12)).astype(np.float32)
    np.savez(tmp_path / "cal.npz", x=cal)
    d = onnx2fpga.compile(path, tmp_path / "design", calibration=tmp_path / "cal.npz")
    assert [ly.kind for ly in d.design.dataflow.layers] == ["dense", "dense"]
    assert d.manifest["outputs"] == [
        {"name": "y", "dtype": "float32", "shape": [1, 4]},
        {"name": "h1", "dtype": "float32", "shape": [1, 4]}]
    got = d.simulate(cal, engine="golden")
    y, h1 = ort.InferenceSession(path).run(["y", "h1"], {"x": cal})
    assert list(got) == ["y", "h1"]
    scale = np.abs(h1).max()
    assert np.abs(got["h1"] - h1).max() < 0.05 * scale
    assert np.abs(got["y"] - y).max() < 0.05
    # the softmax the host computes is the softmax of the logits it returns
    e = np.exp(got["h1"] - got["h1"].max(1, keepdims=True))
    np.testing.assert_allclose(got["y"], e / e.sum(1, keepdims=True), atol=1e-6)


def test_calibration_npz_must_name_the_input(tmp_path):
    path = save(float_mlp((12, 8, 4)), tmp_path / "mlp.onnx")
    np.savez(tmp_path / "cal.npz", X=np.zeros((4, 12), np.float32))
    with pytest.raises(CalibrationError, match=r"^Calibration data must be named 'x', not "
                                               r"'X'$"):
        onnx2fpga.compile(path, tmp_path / "design", calibration=tmp_path / "cal.npz")
    assert not (tmp_path / "design").exists()


def test_a_second_input_that_feeds_no_hardware_is_refused_naming_it(tmp_path):
    """Several inputs are multiplexed onto the input stream (tests/api/test_multiplex.py);
    one read only by the host's tail is not."""
    path, _ = ort_qdq_mlp(tmp_path, sizes=(12, 8, 4))
    m = onnx.load(path)
    out = m.graph.output[0]
    m.graph.input.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4]))
    m.graph.node.append(helper.make_node("Add", [out.name, "z"], ["s"], name="add_z"))
    out.name = "s"
    with pytest.raises(UnsupportedError, match=(
            r"^Graph '[^']+': input 'z' reaches no quantized activation of its own "
            r"\(QuantizeLinear\); each of several inputs must be quantized to enter the "
            r"hardware part$")):
        run_frontend(m)


def _npz(tmp_path, members, compression=zipfile.ZIP_STORED):
    p = tmp_path / "x.npz"
    with zipfile.ZipFile(p, "w", compression) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return p


def _npy(a, **kw):
    buf = io.BytesIO()
    np.save(buf, a, **kw)
    return buf.getvalue()


def test_npz_reader_reads_what_savez_writes(tmp_path):
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.int64([1, 2])
    np.savez_compressed(tmp_path / "c.npz", a=a, b=b)
    got = read_npz(tmp_path / "c.npz", "inputs", InputError)
    assert sorted(got) == ["a", "b"]
    np.testing.assert_array_equal(got["a"], a)
    np.testing.assert_array_equal(got["b"], b)


@pytest.mark.parametrize("members,compression,needle", [
    ({"a.txt": b"hello"}, zipfile.ZIP_STORED,
     "member 'a.txt': inputs must be .npy arrays (as np.savez writes)"),
    ({"a.npy": _npy(np.array([{"k": 1}], dtype=object), allow_pickle=True)},
     zipfile.ZIP_STORED, "member 'a.npy': inputs must be numbers, not Python objects"),
    ({"a.npy": _npy(np.zeros(8, np.float32))[:-4]}, zipfile.ZIP_STORED,
     "member 'a.npy': damaged .npy file"),
    ({"a.npy": b"not an array"}, zipfile.ZIP_STORED, "member 'a.npy': cannot read inputs: "
                                                     "not a .npy file"),
    ({}, zipfile.ZIP_STORED, "the .npz file holds no arrays"),
])
def test_npz_reader_refuses_bad_members_in_one_line(tmp_path, members, compression, needle):
    p = _npz(tmp_path, members, compression)
    with pytest.raises(InputError) as e:
        read_npz(p, "inputs", InputError)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_npz_reader_refuses_a_size_deflate_cannot_make(tmp_path):
    """A member whose header claims 10^10 bytes from a few compressed ones is refused before
    anything is decompressed or allocated."""
    data = _npy(np.zeros(1000, np.float32))
    p = _npz(tmp_path, {"a.npy": data}, zipfile.ZIP_DEFLATED)
    raw = bytearray(p.read_bytes())
    size = len(data).to_bytes(4, "little")
    lie = (10 ** 9 * 4).to_bytes(8, "little")[:4]
    raw = raw.replace(size, lie)                       # local and central headers
    p.write_bytes(bytes(raw))
    with pytest.raises(InputError, match=r"cannot come from \d+ compressed bytes$"):
        read_npz(p, "inputs", InputError)


def test_npz_reader_refuses_what_is_not_a_zip(tmp_path):
    p = tmp_path / "x.npz"
    np.save(tmp_path / "x.npy", np.zeros(3))
    p.write_bytes((tmp_path / "x.npy").read_bytes())
    with pytest.raises(InputError, match=r": cannot read inputs: not a \.npz file \("):
        read_npz(p, "inputs", InputError)
