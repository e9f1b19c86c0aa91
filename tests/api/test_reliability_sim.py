"""Simulations that run at the same time, in hostile places, next to hostile neighbours:
two ``simulate --engine rtl`` processes of one design, a design folder whose path has a space,
and a local process that connects to the simulated board's port before the simulator does.

Real processes and real sockets throughout; every output is compared with the golden model
for its own inputs.
"""

import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import onnx2fpga
from onnx2fpga.boards.protocol import BoardInfo, FrameDecoder, FrameType, encode_frame
from onnx2fpga.cli import main
from onnx2fpga.sim.model import run_design
from onnx2fpga.sim.verilator_build import CACHE_ENV, RUNTIME_CACHE_ENV, runtime_folder
from tests.helpers.models import float_mlp, save

#: Seconds after which a child process or a thread is taken to hang (never reached normally;
#: only there so that a broken build fails instead of blocking the test run).
HANG = 900


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reliability")
    model = save(float_mlp((16, 8, 4)), tmp / "mlp.onnx")
    cal = np.random.default_rng(1).standard_normal((64, 1, 16)).astype(np.float32)
    return onnx2fpga.compile(model, tmp / "design", calibration=cal).directory


def _copy(compiled, where):
    """A fresh copy of the compiled design folder (no simulator built yet)."""
    shutil.copytree(compiled, where)
    return where


def _inputs(path, n, seed):
    x = np.random.default_rng(seed).standard_normal((n, 1, 16)).astype(np.float32)
    np.save(path, x)
    return x


def _simulate_cmd(design, x_path, y_path):
    return [sys.executable, "-m", "onnx2fpga", "simulate", str(design), "--engine", "rtl",
            "--inputs", str(x_path), "--outputs", str(y_path)]


def _race(tmp_path, design, n):
    """Two ``simulate --engine rtl`` processes of ``design`` started together on different
    inputs; returns ``[(x, y_path, returncode, stderr), ...]``."""
    jobs = []
    for name, seed in (("a", 11), ("b", 12)):
        x = _inputs(tmp_path / f"x_{name}.npy", n, seed)
        y_path = tmp_path / f"y_{name}.npy"
        jobs.append((x, y_path, subprocess.Popen(
            _simulate_cmd(design, tmp_path / f"x_{name}.npy", y_path), cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    out = []
    for x, y_path, proc in jobs:
        _, err = proc.communicate(timeout=HANG)
        out.append((x, y_path, proc.returncode, err))
    return out


def _check_own_results(design, runs):
    d = onnx2fpga.load(design)
    goldens = [run_design(d.design, x) for x, _, _, _ in runs]
    assert not np.array_equal(goldens[0], goldens[1])       # so that a mix-up shows
    for (_, y_path, code, err), golden in zip(runs, goldens):
        assert code == 0, err
        np.testing.assert_array_equal(np.load(y_path), golden)


@pytest.mark.rtl
def test_two_rtl_simulations_of_one_design_at_once(compiled, tmp_path):
    # Before: both wrote DIR/sim_build/job; one run crashed, failed, or exited 0 with the
    # other's outputs. Now each run has its own folder and they share the build read only.
    design = _copy(compiled, tmp_path / "design")
    _inputs(tmp_path / "x0.npy", 1, 0)
    first = subprocess.run(_simulate_cmd(design, tmp_path / "x0.npy", tmp_path / "y0.npy"),
                           cwd=tmp_path, capture_output=True, text=True, timeout=HANG)
    assert first.returncode == 0, first.stderr             # the build exists: a pure run race
    runs = _race(tmp_path, design, 40)
    _check_own_results(design, runs)
    for _, _, _, err in runs:
        assert "building" not in err                        # both reused the build
    assert os.listdir(design / "sim_build" / "runs") == []  # run folders are removed


@pytest.mark.rtl
def test_two_rtl_simulations_share_one_build(compiled, tmp_path, monkeypatch):
    # Neither finds a build (an empty build cache; Verilator's runtime objects from the
    # session's): one builds under the lock, the other waits for it and reuses it.
    monkeypatch.setenv(RUNTIME_CACHE_ENV, str(runtime_folder()))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    design = _copy(compiled, tmp_path / "design")
    runs = _race(tmp_path, design, 20)
    _check_own_results(design, runs)
    errs = [err for _, _, _, err in runs]
    assert sorted("[onnx2fpga] built in " in err for err in errs) == [False, True], errs
    waiter = errs[0] if "[onnx2fpga] built in " in errs[1] else errs[1]
    assert "[onnx2fpga] waiting for " in waiter


@pytest.mark.rtl
@pytest.mark.parametrize("command", ["simulate", "run"])
def test_rtl_simulation_in_a_path_with_a_space(compiled, tmp_path, capsys, command):
    # Before: "GNU Make cannot build in directories containing spaces" from verilated.mk.
    design = _copy(compiled, tmp_path / "my designs" / "mlp one")
    x = _inputs(tmp_path / "x.npy", 3, 5)
    engine = ["--engine", "rtl"] if command == "simulate" else ["--sim"]
    code = main([command, str(design), *engine, "--inputs", str(tmp_path / "x.npy"),
                 "--outputs", str(tmp_path / "y.npy")])
    err = capsys.readouterr().err
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"),
                                  run_design(onnx2fpga.load(design).design, x))


# ---------------------------------------------------------------------------------------------
# The simulated board's port


def _listening_ports():
    """TCP ports this process listens on at 127.0.0.1, read the way any local process can
    (``/proc/net/tcp``), matched to this process's sockets."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            address, port = fields[1].split(":")
            if address == "0100007F" and fields[3] == "0A" and fields[9] in inodes:
                ports.add(int(port, 16))
    return ports


class _RogueBoard(threading.Thread):
    """A local process's socket that connects to the simulated board's port and plays a board
    of the right design that answers every inference with zeros."""

    def __init__(self, port, info):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.info = info
        self.requests = []

    def run(self):
        decoder = FrameDecoder()
        self.sock.settimeout(HANG)
        try:
            while data := self.sock.recv(4096):
                for frame in decoder.feed(data):
                    self.requests.append(frame.type)
                    if frame.type == FrameType.HELLO:
                        reply = encode_frame(FrameType.HELLO_REPLY, frame.seq, self.info.pack())
                    else:
                        reply = encode_frame(FrameType.INFER_REPLY, frame.seq,
                                             bytes(self.info.out_bytes))
                    self.sock.sendall(reply)
        except OSError:
            pass


@pytest.mark.rtl
@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux's /proc/net/tcp")
def test_sim_board_talks_only_to_its_own_simulator(compiled, tmp_path):
    # Before: the first connection to the port was taken for the simulator, so a local process
    # connecting first answered HELLO and fed its own outputs to the host.
    design = _copy(compiled, tmp_path / "design")
    d = onnx2fpga.load(design)
    df = d.design.dataflow
    info = BoardInfo(1, bytes.fromhex(d.manifest["top"]["verilog_sha256"][:16]),
                     df.input.tdata_width // 8 * df.input.beats,
                     df.output.tdata_width // 8 * df.output.beats, 8000)
    before = _listening_ports()
    started = {}

    def connect():
        try:
            started["board"] = onnx2fpga.connect(design, sim=True, timeout=3.0)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            started["error"] = exc

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    deadline = time.monotonic() + HANG
    while not (_listening_ports() - before) and thread.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (port,) = _listening_ports() - before
    rogue = _RogueBoard(port, info)                # connects before the simulator can
    rogue.start()
    try:                                           # and one that connects, says nothing
        silent = socket.create_connection(("127.0.0.1", port))
    except ConnectionRefusedError:                 # the port already took its simulator
        silent = None
    thread.join(HANG)
    if "error" in started:
        raise started["error"]
    x = np.random.default_rng(6).standard_normal((4, 1, 16)).astype(np.float32)
    with started["board"] as board:
        y = board.infer(x)
    np.testing.assert_array_equal(y, run_design(d.design, x))
    assert rogue.requests == []                    # the rogue never heard from the host
    rogue.sock.close()
    if silent is not None:
        silent.settimeout(HANG)
        assert silent.recv(1) == b""               # the silent one was hung up on
        silent.close()


def test_sim_board_accepts_only_the_whole_token(tmp_path):
    # The host's side of the handshake alone, against real local clients: a flood of silent
    # connections, a wrong token and all but the last byte of the right one come first.
    from onnx2fpga.boards import simboard

    board = simboard.SimBoard.__new__(simboard.SimBoard)
    alive = threading.Event()
    board._thread = threading.Thread(target=alive.wait, daemon=True)   # "the simulator runs"
    board._thread.start()
    board._job, board._keep_run = tmp_path, False
    token = b"0123456789abcdef0123456789abcdef"
    with socket.create_server(("127.0.0.1", 0), backlog=256) as listener:
        port = listener.getsockname()[1]
        flood = [socket.create_connection(("127.0.0.1", port))
                 for _ in range(simboard._MAX_PENDING + 6)]
        wrong = socket.create_connection(("127.0.0.1", port))
        wrong.sendall(b"x" * len(token))
        partial = socket.create_connection(("127.0.0.1", port))
        partial.sendall(token[:-1])
        right = socket.create_connection(("127.0.0.1", port))
        right.sendall(token + b"after")
        conn = board._accept(listener, token)
    alive.set()
    conn.setblocking(True)
    conn.settimeout(HANG)
    assert conn.recv(5) == b"after"              # the token's sender, and nothing of it left
    for client in [*flood, wrong, partial]:
        client.settimeout(HANG)
        try:
            assert client.recv(1) == b""         # hung up on, without a byte
        except ConnectionResetError:
            pass
        client.close()
    conn.close()
    right.close()
