"""The compile as named steps: stopping after a step writes what it produced, and going on
from there gives the same design as one whole compile."""

import json
import os

import numpy as np
import onnx
import pytest

import onnx2fpga
from onnx2fpga.errors import OptionError
from onnx2fpga.ir.serialize import load_design
from onnx2fpga.sim.model import run_design
from onnx2fpga.steps import STEPS, Compilation, run_steps, write_artifacts
from tests.helpers import paths

EXAMPLE = str(paths.EXAMPLES / "digits")
MODEL = os.path.join(EXAMPLE, "model.onnx")


@pytest.fixture(scope="module")
def calibration():
    return np.load(os.path.join(EXAMPLE, "calibration.npy"))


@pytest.fixture(scope="module")
def whole(tmp_path_factory, calibration):
    out = tmp_path_factory.mktemp("whole") / "d"
    onnx2fpga.compile(MODEL, out, calibration=calibration)
    return out


def _bytes(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("step, files", [
    ("load", ["graph.json"]),
    ("quantize", ["graph.json", "quantization.json"]),
    ("lower", ["design.json", "design.npz", "quantization.json"]),
    ("fold", ["design.json", "design.npz", "quantization.json"]),
    ("evaluate", ["design.json", "design.npz", "quantization.json"]),
])
def test_stop_after_writes_the_step_artifacts(tmp_path, calibration, step, files):
    c = onnx2fpga.compile(MODEL, tmp_path / "d", calibration=calibration, stop_after=step)
    assert isinstance(c, Compilation)
    assert c.done == list(STEPS[:STEPS.index(step) + 1])
    assert sorted(os.listdir(tmp_path / "d")) == sorted(files)


def test_graph_json_lists_the_model(tmp_path, calibration):
    onnx2fpga.compile(MODEL, tmp_path / "d", calibration=calibration, stop_after="load")
    with open(tmp_path / "d" / "graph.json") as f:
        doc = json.load(f)
    model = onnx.load(MODEL)
    assert [n["op"] for n in doc["nodes"]] == [n.op_type for n in model.graph.node]
    assert doc["inputs"] == [i.name for i in model.graph.input
                             if i.name not in {t.name for t in model.graph.initializer}]
    for t in model.graph.initializer:
        assert doc["constants"][t.name]["shape"] == list(t.dims)


def test_the_folded_design_is_the_final_one(tmp_path, calibration, whole):
    onnx2fpga.compile(MODEL, tmp_path / "d", calibration=calibration, stop_after="evaluate")
    assert _bytes(tmp_path / "d" / "design.json") == _bytes(whole / "design.json")
    assert _bytes(tmp_path / "d" / "design.npz") == _bytes(whole / "design.npz")
    design = load_design(tmp_path / "d" / "design.json", tmp_path / "d" / "design.npz")
    x = np.load(os.path.join(EXAMPLE, "test_x.npy"))[:8]
    np.testing.assert_array_equal(onnx2fpga.load(whole).simulate(x, engine="golden"),
                                  run_design(design, x))


def test_going_on_from_a_step_gives_the_same_design(tmp_path, calibration, whole):
    c = onnx2fpga.compile(MODEL, tmp_path / "d", calibration=calibration, stop_after="lower")
    assert c.verilog is None and c.design.dataflow.layers
    run_steps(c)
    assert c.done == list(STEPS)
    assert c.verilog.encode() == _bytes(whole / "top.v")
    (tmp_path / "e").mkdir()
    write_artifacts(c, str(tmp_path / "e"))
    for name in ("top.v", "manifest.json", "design.json", "design.npz"):
        assert _bytes(tmp_path / "e" / name) == _bytes(whole / name), name


def test_an_unknown_step_is_refused_before_any_work(tmp_path):
    with pytest.raises(OptionError, match=r"^stop_after must be one of load, quantize, lower, "
                                          r"fold, evaluate, emit, not 'link'$"):
        onnx2fpga.compile(MODEL, tmp_path / "d", stop_after="link")
    assert not os.path.exists(tmp_path / "d")
