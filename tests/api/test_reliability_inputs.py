"""Reliability of what users hand the command line: input and calibration files, option values,
names in the model. Every bad input ends in one ``error:`` line and exit status 2, before any
expensive work; nothing hangs, nothing wraps silently."""

from __future__ import annotations

import os
import struct

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx2fpga
from onnx2fpga.errors import InputError
from onnx2fpga.sim.model import run_head
from tests.helpers.cli import run_cli, run_cli_process
from tests.helpers.models import float_mlp, ort_qdq_mlp, qdq_matmul, save

_run = run_cli
_cli = run_cli_process      # a hang fails the test instead of the run


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
    archive = tmp_path / "zip.npy"            # a .npz archive under a .npy name
    np.savez(tmp_path / "x.npz", x=cal[:4])
    archive.write_bytes((tmp_path / "x.npz").read_bytes())
    for f, needle in ((objects, "inputs must be numbers, not Python objects"),
                      (truncated, "damaged .npy file"),
                      (archive, "cannot read inputs: not a .npy file"),
                      (tmp_path / "missing.npy", "cannot read inputs: No such file")):
        code, _, err = _run(capsys, "simulate", tmp / "design", "--engine", "golden",
                            "--inputs", f, "--outputs", tmp_path / "y.npy")
        assert needle in _one_error(code, err), (f, err)


# -- point 9: option values and model shapes that ended in a traceback -------------------------

@pytest.mark.parametrize("argv,message", [
    (["--folding", "dense0:0:0"], "Folding of layer 'dense0': simd must be a positive integer, "
                               "not 0"),
    (["--folding", "dense0:4:-1"], "Folding of layer 'dense0': pe must be a positive integer, "
                                "not -1"),
    (["--folding", "dense0:5:1"], "Layer 'dense0': simd=5 is not a valid folding (simd must "
                               "divide in_features=12: 1, 2, 3, 4, 6, 12)"),
    (["--folding", "dense0:lanes=0"], "Folding of layer 'dense0': lanes must be a positive "
                                   "integer, not 0"),
    (["--folding", "dense0:4:1:2"], "Layer 'dense0' (dense) takes simd and pe, not lanes"),
    (["--weight-bits", "0"], "weight_bits must be an integer from 2 to 16, not 0"),
    (["--weight-bits", "1"], "weight_bits must be an integer from 2 to 16, not 1"),
    (["--weight-bits", "33"], "weight_bits must be an integer from 2 to 16, not 33"),
    (["--activation-bits", "-1"], "activation_bits must be an integer from 2 to 16, not -1"),
    (["--activation-bits", "17"], "activation_bits must be an integer from 2 to 16, not 17"),
    (["--multiplier-bits", "1"], "multiplier_bits must be an integer from 2 to 32, not 1"),
    (["--multiplier-bits", "33"], "multiplier_bits must be an integer from 2 to 32, not 33"),
    (["--target-fps", "100", "--clock", "inf"], "clock_mhz must be a positive finite number, "
                                                "not inf"),
    (["--target-fps", "100", "--clock", "nan"], "clock_mhz must be a positive finite number, "
                                                "not nan"),
    (["--target-fps", "100", "--clock", "0"], "clock_mhz must be a positive finite number, "
                                              "not 0.0"),
    (["--target-fps", "100", "--clock", "-12"], "clock_mhz must be a positive finite number, "
                                                "not -12.0"),
    (["--target-fps", "inf", "--clock", "12"], "target_fps must be a positive finite number, "
                                               "not inf"),
    (["--target-fps", "nan", "--clock", "12"], "target_fps must be a positive finite number, "
                                               "not nan"),
    (["--target-fps", "0", "--clock", "12"], "target_fps must be a positive finite number, "
                                             "not 0.0"),
    (["--board", "icebreaker", "--utilization", "0"], "utilization must be a number in "
                                                      "(0, 1], not 0.0"),
    (["--board", "icebreaker", "--utilization", "nan"], "utilization must be a number in "
                                                        "(0, 1], not nan"),
    (["--max-lanes", "0"], "max_lanes must be a positive integer, not 0"),
])
def test_compile_option_values(tmp_path, capsys, mlp, argv, message):
    tmp, path, _ = mlp
    code, _, err = _run(capsys, "compile", path, "-o", tmp_path / "d", "--calibration",
                        tmp / "cal.npy", *argv)
    assert _one_error(code, err) == f"error: {message}\n"
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("kwargs,message", [
    ({"weight_bits": 1}, "weight_bits must be an integer from 2 to 16, not 1"),
    ({"activation_bits": 0}, "activation_bits must be an integer from 2 to 16, not 0"),
    ({"multiplier_bits": 40}, "multiplier_bits must be an integer from 2 to 32, not 40"),
    ({"folding": {"dense0": {"simd": 0}}}, "Folding of layer 'dense0': simd must be a positive "
                                        "integer, not 0"),
    ({"folding": {"dense0": {"simd": 2.5}}}, "Folding of layer 'dense0': simd must be a positive "
                                          "integer, not 2.5"),
    ({"max_lanes": 0}, "max_lanes must be a positive integer, not 0"),
    ({"target_fps": 10.0, "clock_mhz": float("inf")}, "clock_mhz must be a positive finite "
                                                      "number, not inf"),
])
def test_compile_option_values_in_the_python_api(tmp_path, mlp, kwargs, message):
    from onnx2fpga.errors import OptionError

    _, path, cal = mlp
    with pytest.raises(OptionError) as e:
        onnx2fpga.compile(path, tmp_path / "d", calibration=cal, **kwargs)
    assert str(e.value) == message
    assert not (tmp_path / "d").exists()


def test_simulate_and_run_option_values(tmp_path, capsys, mlp):
    tmp, _, cal = mlp
    np.save(tmp_path / "x.npy", cal[:2])
    design, x, y = tmp / "design", tmp_path / "x.npy", tmp_path / "y.npy"
    no_port = ["--port", tmp_path / "no-tty"]     # never opened: the options come first
    for argv, message in [
        (["simulate", design, "--engine", "golden", "--seed", "-1"],
         "seed must be a non-negative integer, not -1"),
        (["simulate", design, "--stall-in", "1.0"],
         "stall_in must be a probability in [0, 1), not 1.0"),
        (["simulate", design, "--stall-out", "nan"],
         "stall_out must be a probability in [0, 1), not nan"),
        (["simulate", design, "--stall-in", "-0.5", "--engine", "golden"],
         "stall_in must be a probability in [0, 1), not -0.5"),
        (["run", design, *no_port, "--retries", "-1"],
         "retries must be a non-negative integer, not -1"),
        (["run", design, *no_port, "--timeout", "0"],
         "timeout must be a positive finite number of seconds, not 0.0"),
        (["run", design, *no_port, "--timeout", "nan"],
         "timeout must be a positive finite number of seconds, not nan"),
        (["run", design, *no_port, "--timeout", "-2"],
         "timeout must be a positive finite number of seconds, not -2.0"),
        (["run", design, *no_port, "--baud", "0"],
         "baud must be a positive integer (bits per second), not 0"),
        # --sim: refused before the simulated board is built.
        (["run", design, "--sim", "--timeout", "0"],
         "timeout must be a positive finite number of seconds, not 0.0"),
        (["run", design, "--sim", "--flip-probability", "1.5"],
         "flip_probability must be a probability in [0, 1), not 1.5"),
        (["run", design, "--sim", "--flip-probability", "-0.1"],
         "flip_probability must be a probability in [0, 1), not -0.1"),
        (["run", design, "--sim", "--seed", "-3"], "seed must be a non-negative integer, "
                                                   "not -3"),
    ]:
        code, _, err = _run(capsys, *argv, "--inputs", x, "--outputs", y)
        assert _one_error(code, err) == f"error: {message}\n", argv
        assert not y.exists()


def test_simulate_and_connect_options_in_the_python_api(tmp_path, mlp):
    from onnx2fpga.errors import OptionError

    tmp, _, cal = mlp
    d = onnx2fpga.load(tmp / "design")
    for kwargs in ({"seed": -1}, {"engine": "verilog"}, {"stall_in": 1.0},
                   {"stall_out": float("nan")}):
        with pytest.raises(OptionError):
            d.simulate(cal[:1], **{"engine": "golden", **kwargs})
    for kwargs in ({"retries": -1}, {"timeout": float("inf")}, {"baud": 0},
                   {"sim": True, "sim_options": {"flip_probability": 2.0}}):
        with pytest.raises(OptionError):
            onnx2fpga.connect(tmp / "design", None if kwargs.get("sim") else "loop://",
                              **kwargs)


@pytest.mark.parametrize("case", ["gemm_hidden_0", "matmul_out_0", "conv_out_channels_0",
                                  "qdq_matmul_out_0"])
def test_zero_size_weights(tmp_path, capsys, case):
    from onnx import numpy_helper

    cal = np.random.default_rng(0).standard_normal((8, 1, 4)).astype(np.float32)
    if case == "gemm_hidden_0":
        model, node = float_mlp((4, 0, 3), softmax=False), "fc0"
    elif case == "matmul_out_0":
        model, node = float_mlp((4, 0), kind="matmul", softmax=False), "mm0"
    elif case == "qdq_matmul_out_0":
        # an int8 QDQ layer whose weight has no columns, as onnxruntime writes Linear(4, 0)
        model, node, cal = qdq_matmul(4, 0), "mm", None
    else:
        g = helper.make_graph(
            [helper.make_node("Conv", ["x", "W"], ["y"], name="conv0", pads=[1, 1, 1, 1])],
            "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 6, 6])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 0, 6, 6])],
            [numpy_helper.from_array(np.zeros((0, 1, 3, 3), np.float32), "W")])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        model, node = model, "conv0"
        cal = np.random.default_rng(0).standard_normal((8, 1, 1, 6, 6)).astype(np.float32)
    onnx.checker.check_model(model, full_check=True)      # valid ONNX, as exported
    path = save(model, tmp_path / "m.onnx")
    argv = ["compile", path, "-o", tmp_path / "d"]
    if cal is not None:
        np.save(tmp_path / "cal.npy", cal)
        argv += ["--calibration", tmp_path / "cal.npy"]
    code, _, err = _run(capsys, *argv)
    err = _one_error(code, err)
    assert f"Node '{node}'" in err and "empty tensor" in err, err
    assert not (tmp_path / "d").exists()


def test_serial_disconnect_during_run_is_one_line(tmp_path, capsys, mlp):
    """A real pseudo-terminal as the board's serial port: it answers HELLO as the board
    running the design, then goes away in the middle of the INFER exchange (its end
    closed: pyserial raises SerialException, an OSError, as for an unplugged board)."""
    import threading

    pytest.importorskip("serial")
    from onnx2fpga.boards.protocol import (
        PROTOCOL_VERSION,
        BoardInfo,
        FrameDecoder,
        FrameType,
        design_id_from_sha256,
        encode_frame,
    )

    tmp, _, cal = mlp
    d = onnx2fpga.load(tmp / "design")
    df = d.design.dataflow
    info = BoardInfo(PROTOCOL_VERSION, design_id_from_sha256(d.manifest["top"]["verilog_sha256"]),
                     df.input.tdata_width // 8 * df.input.beats,
                     df.output.tdata_width // 8 * df.output.beats, 12000)
    master, slave = os.openpty()
    port = os.ttyname(slave)
    seen = []

    def board():
        decoder = FrameDecoder()
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            for frame in decoder.feed(data):
                seen.append(FrameType(frame.type).name)
                if frame.type == FrameType.HELLO:
                    os.write(master, encode_frame(FrameType.HELLO | 0x80, frame.seq,
                                                  info.pack()))
                elif frame.type == FrameType.INFER:
                    os.close(master)          # unplugged
                    return

    t = threading.Thread(target=board, daemon=True)
    t.start()
    try:
        np.save(tmp_path / "x.npy", cal[:3])
        code, _, err = _run(capsys, "run", tmp / "design", "--port", port, "--inputs",
                            tmp_path / "x.npy", "--outputs", tmp_path / "y.npy",
                            "--timeout", "2", "--retries", "1")
    finally:
        os.close(slave)
        t.join(10)
    assert seen[:2] == ["HELLO", "INFER"], seen
    err = _one_error(code, err)
    assert err.startswith(f"error: Serial port {port!r} failed during the transfer "
                          f"(board disconnected?): "), err
    assert not (tmp_path / "y.npy").exists()


@pytest.mark.parametrize("clock", ["nan", "inf", "0", "-40"])
def test_build_clock_that_is_not_a_frequency(tmp_path, capsys, mlp, clock):
    """Refused before any tool runs (NaN silently meant the board's oscillator)."""
    tmp, _, _ = mlp
    code, _, err = _run(capsys, "build", tmp / "design", "--board", "icebreaker",
                        "--clock-mhz", clock)
    err = _one_error(code, err)
    assert "MHz" in err and ("positive number" in err or "cannot make inf MHz" in err), err
    assert not (tmp / "design" / "build").exists()


def test_a_board_without_resource_estimates_is_one_line(tmp_path, capsys):
    """``--board tangnano9k`` (Gowin): the estimates know iCE40 and ECP5 only; before, a
    ValueError traceback from inside the folding."""
    from tests.helpers.models import float_mlp, save

    path = save(float_mlp((12, 8, 4)), tmp_path / "m.onnx")
    np.save(tmp_path / "cal.npy", np.random.default_rng(0).standard_normal((16, 1, 12))
            .astype(np.float32))
    code, _, err = _run(capsys, "compile", path, "-o", tmp_path / "d", "--calibration",
                        tmp_path / "cal.npy", "--board", "tangnano9k")
    err = _one_error(code, err)
    assert "--board tangnano9k" in err and "gowin" in err, err
    assert not (tmp_path / "d").exists()
