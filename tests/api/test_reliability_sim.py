"""Simulations that run at the same time or in hostile places: two ``simulate --engine rtl``
processes of one design, a design folder whose path has a space.

Real processes throughout; every output is compared with the golden model for its own inputs.
"""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import onnx2fpga
from onnx2fpga.cli import main
from onnx2fpga.sim.model import run_design
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
    runs = _race(tmp_path, design, 120)
    _check_own_results(design, runs)
    for _, _, _, err in runs:
        assert "building" not in err                        # both reused the build
    assert os.listdir(design / "sim_build" / "runs") == []  # run folders are removed


@pytest.mark.rtl
def test_two_rtl_simulations_share_one_build(compiled, tmp_path):
    # Neither finds a build: one builds under the lock, the other waits for it and reuses it.
    design = _copy(compiled, tmp_path / "design")
    runs = _race(tmp_path, design, 20)
    _check_own_results(design, runs)
    errs = [err for _, _, _, err in runs]
    assert sorted("[rtl] built in " in err for err in errs) == [False, True], errs
    waiter = errs[0] if "[rtl] built in " in errs[1] else errs[1]
    assert "[rtl] waiting for " in waiter


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
