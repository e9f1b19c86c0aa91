"""Reliability of what users hand the command line: input and calibration files, option values,
names in the model. Every bad input ends in one ``error:`` line and exit status 2, before any
expensive work; nothing hangs, nothing wraps silently."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx2fpga
from onnx2fpga.cli import main
from onnx2fpga.errors import InputError
from onnx2fpga.sim.model import run_head
from tests.helpers.models import float_mlp, ort_qdq_mlp, save


def _run(capsys, *argv):
    """Exit code, stdout, and stderr without the ``[onnx2fpga]`` progress lines."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    err = "".join(line for line in err.splitlines(keepends=True)
                  if not line.startswith("[onnx2fpga] "))
    return code, out, err


def _cli(cwd, *argv, timeout=300):
    """The command line in a process of its own (a hang fails the test instead of the run):
    exit code and stderr without progress lines."""
    p = subprocess.run([sys.executable, "-m", "onnx2fpga", *map(str, argv)], cwd=cwd,
                       capture_output=True, text=True, timeout=timeout)
    err = "".join(line for line in p.stderr.splitlines(keepends=True)
                  if not line.startswith(("[onnx2fpga] ", "[rtl] ")))
    return p.returncode, err


def _one_error(code, err):
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """A float MLP (12 -> 8 -> 4), its calibration batch and its compiled design."""
    tmp = tmp_path_factory.mktemp("mlp")
    path = save(float_mlp((12, 8, 4)), tmp / "mlp.onnx")
    cal = np.random.default_rng(0).standard_normal((64, 1, 12)).astype(np.float32)
    np.save(tmp / "cal.npy", cal)
    onnx2fpga.compile(path, tmp / "design", calibration=cal)
    return tmp, path, cal


# -- point 7: NaN refused, infinities and huge values saturate ---------------------------------

def _ort_input_quantizer(model_path, x):
    """onnxruntime's QuantizeLinear of the model's input, with the model's own scale and zero
    point, as a model of that one node."""
    import onnxruntime as ort

    m = onnx.load(model_path)
    q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    inits = [t for t in m.graph.initializer if t.name in q.input[1:]]
    zp = next(t for t in inits if t.name == q.input[2])
    g = helper.make_graph([q], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                   list(x.shape[1:]))],
                          [helper.make_tensor_value_info(q.output[0], zp.data_type, None)],
                          inits)
    model = helper.make_model(g, opset_imports=list(m.opset_import))
    model.ir_version = m.ir_version
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.stack([sess.run(None, {"x": s})[0] for s in x])


@pytest.mark.parametrize("activation", ["int8", "uint8"])
def test_infinities_and_huge_inputs_saturate_as_onnxruntime(tmp_path, capsys, activation):
    path, cal = ort_qdq_mlp(tmp_path, activation=activation)
    out = tmp_path / "d"
    assert _run(capsys, "compile", path, "-o", out)[0] == 0
    specials = [-np.inf, np.inf, 1e30, -1e30, 2.0 ** 63, -2.0 ** 63, 2.0 ** 64, -2.0 ** 70,
                np.finfo(np.float32).max, np.finfo(np.float32).min, 9.2e18, -9.3e18]
    x = cal[:len(specials)].copy()
    for k, v in enumerate(specials):
        x[k, 0, (3 * k) % x.shape[-1]] = v
    q = run_head(onnx2fpga.load(out).design, x)
    np.testing.assert_array_equal(q, _ort_input_quantizer(path, x).reshape(len(x), -1))
    # The whole model: an infinite input gives what the same input clipped to a large finite
    # value gives (before, -inf quantized like the largest value).
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "x_finite.npy", np.clip(x, -1e6, 1e6))
    for name in ("x", "x_finite"):
        code, _, err = _run(capsys, "simulate", out, "--engine", "golden", "--inputs",
                            tmp_path / f"{name}.npy", "--outputs", tmp_path / f"y_{name}.npy")
        assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "y_x.npy"),
                                  np.load(tmp_path / "y_x_finite.npy"))


def test_nan_input_is_refused_naming_sample_and_element(tmp_path, capsys, mlp):
    tmp, _, cal = mlp
    x = cal[:6].copy()
    x[4, 0, 7] = np.nan
    x[5, 0, 1] = np.nan
    np.save(tmp_path / "x.npy", x)
    code, _, err = _run(capsys, "simulate", tmp / "design", "--engine", "golden", "--inputs",
                        tmp_path / "x.npy", "--outputs", tmp_path / "y.npy")
    err = _one_error(code, err)
    assert "sample 4, element [0, 7] (flat index 7) is nan" in err, err
    assert not (tmp_path / "y.npy").exists()
    d = onnx2fpga.load(tmp / "design")
    for engine in ("golden", "rtl"):         # refused before Verilator is started
        with pytest.raises(InputError, match=r"sample 4, element \[0, 7\]"):
            d.simulate(x, engine=engine)
    # Samples concatenated along the model's batch axis: the same sample and element.
    with pytest.raises(InputError, match=r"sample 4, element \[0, 7\]"):
        d.simulate(x[:, 0], engine="golden")


def test_nan_input_of_run_is_refused_before_the_board_is_opened(tmp_path, capsys, mlp):
    tmp, _, cal = mlp
    x = cal[:3].copy()
    x[2, 0, 11] = np.nan
    np.save(tmp_path / "x.npy", x)
    # A port nobody can open: the inputs are refused before it is tried.
    code, _, err = _run(capsys, "run", tmp / "design", "--port", str(tmp_path / "no-tty"),
                        "--inputs", tmp_path / "x.npy", "--outputs", tmp_path / "y.npy")
    err = _one_error(code, err)
    assert "sample 2, element [0, 11] (flat index 11) is nan" in err, err


@pytest.mark.parametrize("value,shown", [(np.nan, "nan"), (-np.inf, "-inf"), (np.inf, "inf")])
def test_calibration_with_nan_or_infinity_is_refused(tmp_path, capsys, mlp, value, shown):
    _, path, cal = mlp
    bad = cal.copy()
    bad[9, 0, 3] = value
    np.save(tmp_path / "cal.npy", bad)
    code, _, err = _run(capsys, "compile", path, "-o", tmp_path / "d", "--calibration",
                        tmp_path / "cal.npy")
    err = _one_error(code, err)
    assert f"Calibration data: sample 9, element [0, 3] (flat index 3) is {shown};" in err, err
    assert not (tmp_path / "d").exists()


# -- point 10: FIFOs and devices, lying .npy headers ------------------------------------------

def _npy_header(shape, descr="<f4", version=(1, 0)):
    """The bytes of a .npy header for ``shape``, written by hand (no data follows)."""
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    size = 2 if version == (1, 0) else 4
    pad = 64 - (8 + size + len(text) + 1) % 64
    text += " " * pad + "\n"
    head = b"\x93NUMPY" + bytes(version)
    return head + struct.pack("<H" if size == 2 else "<I", len(text)) + text.encode("latin1")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("command", ["simulate", "run", "compile"])
def test_fifo_inputs_are_refused_not_read(tmp_path, mlp, command):
    tmp, path, _ = mlp
    fifo = tmp_path / "x.npy"
    os.mkfifo(fifo)
    if command == "compile":
        argv = ["compile", path, "-o", tmp_path / "d", "--calibration", fifo]
        what = "calibration data"
    else:
        argv = [command, tmp / "design", "--inputs", fifo, "--outputs", tmp_path / "y.npy"]
        argv += ["--engine", "golden"] if command == "simulate" else ["--sim"]
        what = "inputs"
    code, err = _cli(tmp_path, *argv, timeout=120)    # blocked forever in open() before
    err = _one_error(code, err)
    assert err == f"error: {fifo}: {what} must be a regular .npy file, not a FIFO\n"


@pytest.mark.parametrize("target,kind", [("/dev/null", "character device"),
                                         (".", "directory")])
def test_devices_and_directories_are_refused_as_inputs(tmp_path, capsys, mlp, target, kind):
    tmp, _, _ = mlp
    if not os.path.exists(target):
        pytest.skip(f"no {target}")
    code, _, err = _run(capsys, "simulate", tmp / "design", "--engine", "golden",
                        "--inputs", target, "--outputs", tmp_path / "y.npy")
    err = _one_error(code, err)
    assert err.endswith(f"inputs must be a regular .npy file, not a {kind}\n")


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_npy_header_claiming_a_trillion_rows(tmp_path, capsys, mlp, version):
    tmp, path, _ = mlp
    lie = tmp_path / "lie.npy"
    lie.write_bytes(_npy_header((10 ** 12, 1, 12), version=version) + bytes(48))
    code, _, err = _run(capsys, "simulate", tmp / "design", "--engine", "golden",
                        "--inputs", lie, "--outputs", tmp_path / "y.npy")
    err = _one_error(code, err)
    assert "header says shape (1000000000000, 1, 12) float32" in err
    assert "file holds 48" in err
    code, _, err = _run(capsys, "compile", path, "-o", tmp_path / "d", "--calibration", lie)
    assert "header says shape (1000000000000, 1, 12)" in _one_error(code, err)


def test_npy_files_that_numpy_would_not_load_safely(tmp_path, capsys, mlp):
    tmp, _, cal = mlp
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    truncated = tmp_path / "truncated.npy"
    np.save(truncated, cal[:4])
    truncated.write_bytes(truncated.read_bytes()[:-5])
    archive = tmp_path / "x.npz"
    np.savez(archive, x=cal[:4])
    for f, needle in ((objects, "inputs must be numbers, not Python objects"),
                      (truncated, "damaged .npy file"),
                      (archive, "cannot read inputs: not a .npy file"),
                      (tmp_path / "missing.npy", "cannot read inputs: No such file")):
        code, _, err = _run(capsys, "simulate", tmp / "design", "--engine", "golden",
                            "--inputs", f, "--outputs", tmp_path / "y.npy")
        assert needle in _one_error(code, err), (f, err)
