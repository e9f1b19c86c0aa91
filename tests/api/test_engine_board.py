"""Compiling for a board that no folding fits: the layer engine instead (the iCEBreaker's
UP5K and a DS-CNN), from ``compile`` through the manifest and report to the RTL simulation
with the weights loaded from the flash model; and the refusal when the engine cannot run the
model either."""

from pathlib import Path

import numpy as np
import pytest

import onnx2fpga
from onnx2fpga.errors import SizeError
from onnx2fpga.hw.emit import emit_verilog
from onnx2fpga.plan.engine import engine_cycles, engine_image, engine_program
from tests.helpers.models import ort_qdq_cnn
from tests.helpers.torch_models import ds_cnn_qdq


@pytest.fixture(scope="module")
def ds_cnn(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine")
    _, qp, _ = ds_cnn_qdq(tmp, channels=8)
    with pytest.warns(UserWarning, match=r"^the layer engine runs the model on icebreaker, "
                                         r"one layer at a time: [\d,]+ cycles per "
                                         r"inference, about [\d,]+ LUTs"):
        return qp, onnx2fpga.compile(qp, tmp / "d", board="icebreaker")


def test_no_folding_fits_the_up5k_so_the_engine_runs_it(ds_cnn):
    path, d = ds_cnn
    m, df = d.manifest, d.design.dataflow
    assert m["architecture"] == "layer engine" and df.engine == "spram"
    figures = engine_cycles(engine_program(df))
    assert m["cycles_per_inference"] == figures["cycles_per_inference"]
    assert m["latency_cycles"] == figures["latency_cycles"]
    assert m["ports"]["s_axis"]["lanes"] == m["ports"]["m_axis"]["lanes"] == 1
    # The weight records go to the flash image; the board estimate counts its SPRAMs.
    assert (Path(d.directory) / "weights.bin").read_bytes() == engine_image(engine_program(df))
    assert m["spram"]["memories"] == ["engine"]
    board = m["resources"]["ice40"]["board"]
    assert board["spram"] == 3 and board["lut"] < 5280 * 0.8
    # Every hardware layer listed, the view with no cycles of its own.
    assert sum(ly["cycles"] for ly in m["layers"]) + m["ports"]["s_axis"]["beats"] + \
        sum(1 for ly in m["layers"] if ly["engine"]) == m["cycles_per_inference"]
    assert "engine, 40 products a value" in (Path(d.directory) / "report.md").read_text()
    # The same model and options give the same Verilog.
    assert emit_verilog(df) == (Path(d.directory) / "top.v").read_text()


@pytest.mark.rtl
def test_engine_design_simulates_bit_exactly_with_the_weight_load(ds_cnn):
    _, d = ds_cnn
    x = np.random.default_rng(4).standard_normal((3, 1, 490)).astype(np.float32)
    np.testing.assert_array_equal(d.simulate(x, engine="rtl"), d.simulate(x, engine="golden"))
    assert d.last_run["cycles_per_inference"] == d.manifest["cycles_per_inference"]
    assert d.last_run["latency_cycles"] == d.manifest["latency_cycles"]


def test_a_model_the_engine_cannot_run_is_refused_with_both_reasons(tmp_path):
    path, _ = ort_qdq_cnn(tmp_path, kind="residual")
    with pytest.raises(SizeError, match=r"^No folding of the design fits icebreaker: .*; and "
                                        r"Layer '\w+': the engine runs a chain of layers, each "
                                        r"reading the one before$"):
        onnx2fpga.compile(path, tmp_path / "d", board="icebreaker", utilization=0.05)
    assert not (tmp_path / "d").exists()


def test_architecture_option(tmp_path):
    """``architecture="engine"`` without a board: the engine, its weights in a ROM, and no
    warning (asked for); ``"dataflow"`` never takes it; anything else is refused."""
    import warnings

    path, _ = ort_qdq_cnn(tmp_path, kind="depthwise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = onnx2fpga.compile(path, tmp_path / "e", architecture="engine")
    assert d.design.dataflow.engine == "rom" and d.manifest["architecture"] == "layer engine"
    assert "spram" not in d.manifest
    d = onnx2fpga.compile(path, tmp_path / "f", architecture="dataflow")
    assert d.manifest["architecture"] == "dataflow"
    with pytest.raises(onnx2fpga.errors.OptionError,
                       match=r"^architecture must be one of auto, dataflow, engine, not "
                             r"'serial'$"):
        onnx2fpga.compile(path, architecture="serial")


def test_engine_refuses_the_options_of_a_folded_design(tmp_path):
    """The engine has no per-layer folding: ``folding`` and ``max_lanes`` with it are
    refused rather than ignored, and a ``target_fps`` it cannot reach is refused with its
    cycle count (the engine model's, :func:`engine_cycles`)."""
    path, _ = ort_qdq_cnn(tmp_path, kind="depthwise")
    err = onnx2fpga.errors.OptionError
    for kw in ({"folding": {"conv0": {"lanes": 2}}}, {"max_lanes": 4}):
        name = next(iter(kw))
        with pytest.raises(err, match=rf"^{name} sets the folding of a core per layer; the "
                                      r"layer engine \(architecture 'engine'\) has one "
                                      r"multiplier for all layers: drop one of the two$"):
            onnx2fpga.compile(path, tmp_path / "d", architecture="engine", **kw)
    d = onnx2fpga.compile(path, tmp_path / "e", architecture="engine")
    cycles = engine_cycles(engine_program(d.design.dataflow))["cycles_per_inference"]
    assert cycles == d.manifest["cycles_per_inference"]
    # Just fast enough, then one cycle short.
    d = onnx2fpga.compile(path, tmp_path / "f", architecture="engine", clock_mhz=1,
                          target_fps=1e6 / cycles)
    assert d.manifest["cycles_per_inference"] == cycles
    with pytest.raises(err, match=rf"^The layer engine takes {cycles:,} cycles per inference, "
                                  rf"more than the {cycles - 1:,} that target_fps asks for at "
                                  r"clock_mhz$"):
        onnx2fpga.compile(path, tmp_path / "g", architecture="engine", clock_mhz=1,
                          target_fps=1e6 / (cycles - 1))
    assert not (tmp_path / "d").exists() and not (tmp_path / "g").exists()


@pytest.mark.rtl
def test_engine_design_on_the_simulated_board(ds_cnn):
    """The board wrapper around the engine, over the framed UART link of the simulated
    board, its weights loaded from the flash model at start-up: ``infer`` equals golden."""
    _, d = ds_cnn
    x = np.random.default_rng(5).standard_normal((2, 1, 490)).astype(np.float32)
    with onnx2fpga.connect(d.directory, sim=True, timeout=30.0) as board:
        y = board.infer(x)
    np.testing.assert_array_equal(y, d.simulate(x, engine="golden"))
