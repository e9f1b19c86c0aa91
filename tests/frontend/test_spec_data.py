"""ONNX conformance, data: element types and their storage, external data, hostile files.

Item IDs are those of the ONNX consumer checklist (docs/onnx-conformance.md). Every model is
built here with onnx.helper; files are written only into tmp_path.
"""

import os
import sys
import tracemalloc
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2fpga.errors import CheckError, LoadError, Onnx2FpgaError, UnsupportedError
from onnx2fpga.frontend.load import MAX_ELEMENTS, load_model
from tests.api.test_fuzz import _qdq_mlp, run_frontend
from tests.helpers.models import float_mlp

_ALL_TYPES = [(name, value) for name, value in TensorProto.DataType.items() if value != 0]
_REFUSED = {"STRING": "strings", "COMPLEX64": "complex numbers",
            "COMPLEX128": "complex numbers"}


def _with_initializer(t, ir=onnx.IR_VERSION):
    m = float_mlp((8, 6, 4), softmax=False, opset=21)
    m.ir_version = ir
    m.graph.initializer.append(t)
    return m


def test_dt01_the_type_table_is_the_installed_one():
    """DT-01/DT-02: every element type of the installed onnx is exercised below."""
    assert len(_ALL_TYPES) == 28 and dict(_ALL_TYPES)["FLOAT6E3M2"] == 28


@pytest.mark.parametrize("name,value", _ALL_TYPES)
@pytest.mark.parametrize("storage", ["raw", "typed"])
def test_dt01_dt04_every_element_type_is_decoded_or_refused_by_name(name, value, storage):
    """DT-04: raw_data (little-endian, sub-byte types packed low nibble first) and the typed
    fields both decode to the same values; strings and complex numbers are refused."""
    dtype = helper.tensor_dtype_to_np_dtype(value)
    n = 5  # odd: the last packed byte is half used
    if name == "STRING":
        t = helper.make_tensor("c", value, [n], [b"a"] * n)
        want = None
    else:
        src = np.array([0, 1, 2, 1, 0], np.float32)
        want = src.astype(np.complex64) if "COMPLEX" in name else src.astype(dtype)
        want = want.astype(dtype)
        t = helper.make_tensor("c", value, [n], want, raw=(storage == "raw"))
    m = _with_initializer(t)
    if name in _REFUSED:
        with pytest.raises(UnsupportedError, match=rf"^Initializer 'c': element type {name} is "
                                                   rf"not supported \({_REFUSED[name]} cannot "
                                                   rf"be compiled\)$"):
            load_model(m)
        return
    g = load_model(m)
    got = g.constants["c"]
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_dt04_int4_packing_low_nibble_first():
    t = helper.make_tensor("c", TensorProto.INT4, [3], [0x0, 0x0, 0x0])
    t.ClearField("int32_data")
    t.raw_data = bytes([0xF7, 0x01])  # 7, -1, then 1
    g = load_model(_with_initializer(t))
    np.testing.assert_array_equal(g.constants["c"].astype(np.int8), [7, -1, 1])


def test_dt05_scalar_and_one_element_vector_stay_distinct():
    m = _qdq_mlp()
    s = [t for t in m.graph.initializer if t.name == "s_y0"][0]
    s.dims.append(1)  # ORT's bias scales are [1]
    g = load_model(m)
    assert g.constants["s_y0"].shape == (1,) and g.constants["s_x"].shape == ()
    d = run_frontend(m)
    assert len(d.dataflow.layers) == 2


def test_dt06_sequence_inputs_are_refused_by_name():
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.input.append(helper.make_value_info("seq", helper.make_sequence_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [1]))))
    with pytest.raises(UnsupportedError, match=r"^Value 'seq': sequence_type values are not "
                                               r"supported \(tensors only\)$"):
        load_model(m)


def test_dt07_denotations_are_optional_hints():
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.input[0].type.denotation = "TENSOR"
    m.graph.input[0].type.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    assert load_model(m).tensors["x"].shape == (1, 8)


def test_dt08_int4_weights_compile_and_float8_is_refused_by_name():
    m = _qdq_mlp()
    m.ir_version, m.opset_import[0].version = 10, 21
    for name in ("W0", "z_w0"):
        t = [x for x in m.graph.initializer if x.name == name][0]
        arr = np.clip(numpy_helper.to_array(t), -8, 7)
        t.CopyFrom(helper.make_tensor(name, TensorProto.INT4, list(t.dims), arr.reshape(-1)))
    d = run_frontend(m)
    assert np.abs(d.dataflow.layers[0].weight).max() <= 8
    m8 = _qdq_mlp()
    m8.ir_version, m8.opset_import[0].version = 10, 21
    for name in ("W0", "z_w0"):
        t = [x for x in m8.graph.initializer if x.name == name][0]
        arr = numpy_helper.to_array(t).astype(np.float32) / 64
        t.CopyFrom(helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, list(t.dims),
                                      arr.reshape(-1)))
    from onnx2fpga.frontend.qdq import normalize_qdq

    g = load_model(m8)
    with pytest.raises(UnsupportedError, match=r"element type float8_e4m3fn is not supported "
                                               r"\(integer types only\)"):
        normalize_qdq(g)


def test_dt08_float16_model_compiles():
    m = float_mlp((8, 6, 4), softmax=False)
    for t in m.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16),
                                           t.name))
    for vi in (m.graph.input[0], m.graph.output[0]):
        vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    d = run_frontend(m)
    assert d.inputs[0]["dtype"] == "float16" and len(d.dataflow.layers) == 2


# -- lying files ----------------------------------------------------------------------------

def _lying(mutate):
    m = float_mlp((8, 6, 4), softmax=False)
    mutate(m)
    return m


@pytest.mark.parametrize("what,mutate,msg", [
    ("short raw_data", lambda m: setattr(m.graph.initializer[0], "raw_data", b"\0" * 7),
     r"^Initializer 'W0': shape \[8, 6\] of FLOAT needs 192 bytes of raw_data, the file "
     r"has 7$"),
    ("billions of elements", lambda m: m.graph.initializer[0].dims.extend([1 << 20, 1 << 20]),
     rf"^Initializer 'W0': shape \[8, 6, 1048576, 1048576\] has more than {MAX_ELEMENTS} "
     rf"elements"),
    ("negative dim", lambda m: m.graph.initializer[0].dims.__setitem__(0, -8),
     r"^Initializer 'W0': shape \[-8, 6\] has a negative dimension$"),
    ("unknown type", lambda m: setattr(m.graph.initializer[0], "data_type", 99),
     r"^Initializer 'W0': element type #99 is not a valid ONNX element type$"),
    ("negative input dim", lambda m: setattr(
        m.graph.input[0].type.tensor_type.shape.dim[1], "dim_value", -3),
     r"^Input 'x': shape \['N', -3\] has a negative dimension$"),
    ("huge input", lambda m: setattr(
        m.graph.input[0].type.tensor_type.shape.dim[1], "dim_value", 1 << 40),
     rf"^Input 'x': shape \['N', 1099511627776\] has more than {MAX_ELEMENTS} "
     rf"elements"),
])
def test_hostile_lying_sizes_are_refused_before_decoding(what, mutate, msg):
    """Refused with nothing of the claimed size allocated: Python's peak allocation while
    loading stays far below it (measured, not timed)."""
    m = _lying(mutate)
    with _peak_allocation() as peak, pytest.raises(CheckError, match=msg):
        load_model(m)
    assert peak[0] < 16 << 20, peak


class _peak_allocation:
    """``with _peak_allocation() as peak``: ``peak[0]`` is then the most bytes Python held
    at once inside the block, beyond what it held on entry (tracemalloc)."""

    def __enter__(self):
        tracemalloc.start()
        self.peak = [0]
        return self.peak

    def __exit__(self, *exc):
        self.peak[0] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return False


def test_hostile_inferred_shape_with_billions_of_elements_is_refused():
    """A ConstantOfShape asking for 2^40 elements: shape inference computes the shape,
    nothing is allocated."""
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.initializer.append(numpy_helper.from_array(np.int64([1 << 20, 1 << 20]), "shp"))
    m.graph.node.append(helper.make_node("ConstantOfShape", ["shp"], ["big"]))
    with pytest.raises(CheckError, match=rf"^Value 'big': shape \[1048576, 1048576\] "
                                         rf"has more than {MAX_ELEMENTS} elements"):
        load_model(m)


def test_hostile_mismatched_gemm_bias_is_refused():
    """Found by the fuzzer: Gemm's C is not checked by shape inference."""
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.node[0].input[2] = "B1"
    with pytest.raises(CheckError, match=r"^Node 'fc0' \(Gemm, opset 13\): input shapes "
                                         r"\[\[1, 8\], \[8, 6\], \[4\]\]: C \[4\] does not "
                                         r"broadcast to \[1, 6\]$"):
        load_model(m)


def test_hostile_truncated_random_and_empty_files(tmp_path):
    good = float_mlp().SerializeToString()
    rng = np.random.default_rng(0)
    p = tmp_path / "m.onnx"
    for k, data in enumerate([b"", good[:1], good[: len(good) // 2], good[:-3],
                              rng.bytes(1000), b"\x0a" * 50, b"\x08\x80" * 40]):
        p.write_bytes(data)
        with _peak_allocation() as peak, pytest.raises((LoadError, CheckError)) as e:
            load_model(p)
        assert str(e.value) and peak[0] < 16 << 20, (k, e.value, peak)


def test_hostile_invalid_utf8_names(tmp_path):
    m = float_mlp()
    data = m.SerializeToString().replace(b"fc0", b"f\xdc0")
    p = tmp_path / "m.onnx"
    p.write_bytes(data)
    with pytest.raises(LoadError, match=r"holds a string that is not valid UTF-8$"):
        load_model(p)


def test_hostile_fifo_and_directory_are_not_read(tmp_path):
    os.mkfifo(tmp_path / "pipe.onnx")
    with pytest.raises(LoadError, match=r": not a file$"):
        load_model(tmp_path / "pipe.onnx")  # would block forever if opened


# -- external data --------------------------------------------------------------------------

def _external_model(folder, location, *, offset=None, length=None, checksum=None):
    """float_mlp with W0 in external data; ``w.bin`` holds W0's bytes after 16 zero bytes."""
    m = float_mlp((8, 6, 4), softmax=False)
    t = m.graph.initializer[0]
    data = numpy_helper.to_array(t).tobytes()
    (folder / "w.bin").write_bytes(b"\0" * 16 + data)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    for key, value in (("offset", offset), ("length", length), ("checksum", checksum)):
        if value is not None:
            t.external_data.add(key=key, value=str(value))
    p = folder / "m.onnx"
    p.write_bytes(m.SerializeToString())
    return p, data


def test_ed01_external_data_inside_the_folder_is_loaded(tmp_path):
    import hashlib

    p, data = _external_model(tmp_path, "w.bin", offset=16, length=192,
                              checksum=hashlib.sha1(b"\0" * 16 + b"").hexdigest())
    # a wrong checksum is refused
    with pytest.raises(LoadError, match=r"does not match its SHA-1 checksum$"):
        load_model(p)
    p, data = _external_model(tmp_path, "w.bin", offset=16, length=192,
                              checksum=hashlib.sha1(
                                  numpy_helper.to_array(float_mlp(
                                      (8, 6, 4)).graph.initializer[0]).tobytes()).hexdigest())
    g = load_model(p)
    np.testing.assert_array_equal(g.constants["W0"].tobytes(), data)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.bin").write_bytes((tmp_path / "w.bin").read_bytes())
    p, _ = _external_model(tmp_path, "sub/../sub/w.bin", offset=16)
    assert load_model(p).constants["W0"].tobytes() == data


@pytest.mark.parametrize("location,offset,length,msg", [
    ("missing.bin", None, None, r"external data file 'missing.bin' not found$"),
    ("w.bin", 300, None, r"external data range \[300, 208\) is past the end"),
    ("w.bin", 16, 400, r"external data range \[16, 416\) is past the end of 'w.bin' "
                       r"\(208 bytes\)$"),
    ("w.bin", "x", None, r"offset 'x' or length None is not an integer$"),
    ("w.bin", 0, 100, r"^Initializer 'W0': shape \[8, 6\] of FLOAT needs 192 bytes of "
                      r"raw_data, the file has 100$"),
])
def test_ed01_missing_file_and_ranges_past_the_end(tmp_path, location, offset, length, msg):
    p, _ = _external_model(tmp_path, location, offset=offset, length=length)
    with pytest.raises((LoadError, CheckError), match=msg):
        load_model(p)


def test_ed01_external_data_of_an_in_memory_model_is_refused(tmp_path):
    p, _ = _external_model(tmp_path, "w.bin")
    m = onnx.load(str(p), load_external_data=False)
    with pytest.raises(LoadError, match=r"load the model from its file so that the location "
                                        r"can be resolved inside the model's folder$"):
        load_model(m)


class _OpenRecorder:
    """Records every path Python opens (audit events ``open`` and ``os.open``): builtins
    open, io.open, os.open and everything built on them, including onnx's Python code."""
    paths: list | None = None

    @classmethod
    def hook(cls, event, args):
        if cls.paths is not None and event in ("open", "os.open") and args and \
                isinstance(args[0], (str, bytes, os.PathLike)):
            cls.paths.append(os.path.realpath(os.fsdecode(args[0])))


sys.addaudithook(_OpenRecorder.hook)


@pytest.mark.parametrize("how", ["../", "symlink", "absolute", "dir-symlink", "nested ../"])
def test_ed01_no_path_outside_the_model_folder_is_ever_opened(tmp_path, how):
    folder = tmp_path / "model"
    folder.mkdir()
    p, data = _external_model(folder, "w.bin")
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 16 + data)
    (tmp_path / "secretdir").mkdir()
    (tmp_path / "secretdir" / "w.bin").write_bytes(b"\0" * 16 + data)
    location = {"../": "../secret.bin", "absolute": str(secret),
                "nested ../": "a/../../secret.bin"}.get(how)
    if how == "symlink":
        os.symlink(secret, folder / "link.bin")
        location = "link.bin"
    elif how == "dir-symlink":
        os.symlink(tmp_path / "secretdir", folder / "d")
        location = "d/w.bin"
    p, _ = _external_model(folder, location, offset=16)
    _OpenRecorder.paths = []
    try:
        with pytest.raises(LoadError, match=rf"^{p}: tensor 'W0' has external data at "
                                            rf"'{location}', outside the model's folder$"):
            load_model(p)
    finally:
        opened, _OpenRecorder.paths = _OpenRecorder.paths, None
    inside = os.path.realpath(folder)
    assert opened, "the recorder saw nothing: it would pass vacuously"
    assert all(os.path.commonpath([inside, q]) == inside for q in opened), opened


def test_ed01_recorder_sees_the_external_file_when_it_is_inside(tmp_path):
    """The same recorder does see the legitimate external-data open (not vacuous)."""
    p, _ = _external_model(tmp_path, "w.bin", offset=16)
    _OpenRecorder.paths = []
    try:
        load_model(p)
    finally:
        opened, _OpenRecorder.paths = _OpenRecorder.paths, None
    assert os.path.realpath(tmp_path / "w.bin") in opened


def test_ed02_large_external_tensor_is_bounded(tmp_path):
    p, _ = _external_model(tmp_path, "w.bin", offset=0, length=MAX_ELEMENTS * 8 + 8)
    with pytest.raises(LoadError, match=r"past the end of 'w.bin'"):
        load_model(p)


# -- validity -------------------------------------------------------------------------------

def test_vc01_vc02_checker_errors_are_ours_and_one_line():
    m = float_mlp()
    m.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(CheckError, match=r"^ONNX checker: No Op registered for NoSuchOp with "
                                         r"domain_version of 13 \(--lenient accepts common "
                                         r"exporter deviations\)$") as e:
        load_model(m)
    assert isinstance(e.value, Onnx2FpgaError) and "\n" not in str(e.value)


def test_vc03_vc05_hardware_legality_is_a_separate_stage():
    """Valid ONNX the hardware cannot run loads, then lowering refuses it by name."""
    m = _qdq_mlp()
    for n in m.graph.node:
        if n.op_type == "Gemm":
            n.op_type = "MatMul"
            del n.input[2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = load_model(m)
    assert [n.op for n in g.nodes].count("MatMul") == 2
