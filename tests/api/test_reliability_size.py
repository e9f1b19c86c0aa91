"""Reliability, issue 20 point 5: sizes are checked before the work. A model whose weights fit
no board by far, or not the board asked for even at its slowest folding, or not this
machine's memory, is refused with one ``error:`` line and exit status 2 before lowering,
folding or generating hardware; a board that no folding fits is an error, not a design.

The 4096 x 4096 and 1024 x 1024 models here compiled for minutes before (4096 x 4096 killed
at 8 GB with or without a board, 1024 x 1024 with ``--board icebreaker`` at 8 GB after
302 s); their refusals take seconds, so the sizes of the issue are tested as they are.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import onnx2fpga
from onnx2fpga import steps
from onnx2fpga.cli import main
from onnx2fpga.errors import SizeError
from tests.helpers.cli import run_cli_process
from tests.helpers.models import float_mlp, qdq_matmul, save

_cli = run_cli_process      # a model that is not refused runs into the timeout, not the run


def _one_error(code, err):
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err[len("error: "):-1]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """QDQ int8 MatMuls of 4096 x 4096 (128 Mbit of weights) and 1024 x 1024 (8 Mbit)."""
    tmp = tmp_path_factory.mktemp("big")
    return {n: save(qdq_matmul(n, n), tmp / f"matmul{n}.onnx") for n in (4096, 1024)}


def _no_fold(monkeypatch):
    """Make folding (and generating hardware) fail loudly: a refusal must come before."""
    def boom(*args, **kw):
        raise AssertionError("folding started")
    monkeypatch.setattr("onnx2fpga.plan.fold.fold", boom)
    monkeypatch.setattr("onnx2fpga.hw.emit.emit_verilog", boom)


# -- beyond every supported device ---------------------------------------------------------

def test_weights_far_beyond_every_device_are_refused_without_a_board(models, tmp_path):
    # 4096 x 4096 int8: 2^27 bits = 128 Mbit; the ECP5 85F (ULX3S, OrangeCrab) has 208
    # DP16KD of 18 kbit = 3,744 kbit, the most of the supported devices.
    out = tmp_path / "d"
    msg = _one_error(*_cli(tmp_path, "compile", models[4096], "-o", out))
    assert msg == ("The weights take 128.0 Mbit (layer 'dense0' 128.0 Mbit); the largest "
                   "supported device (orangecrab-85f, ulx3s-85f) has 3.7 Mbit of block RAM "
                   "(208 of 18 kbit): a design needing more than 4 times that fits no board")
    assert not out.exists()
    # At the start of folding: lowering still runs (and --stop-after lower writes it)...
    code, err = _cli(tmp_path, "compile", models[4096], "-o", out, "--stop-after", "lower")
    assert code == 0, err
    assert sorted(os.listdir(out)) == ["design.json", "design.npz", "quantization.json"]
    # ...and folding does not.
    code, err = _cli(tmp_path, "compile", models[4096], "-o", tmp_path / "e",
                     "--stop-after", "fold")
    assert _one_error(code, err) == msg


def test_the_refusal_comes_before_any_folding(models, monkeypatch):
    _no_fold(monkeypatch)
    with pytest.raises(SizeError, match=r"^The weights take 128\.0 Mbit "):
        onnx2fpga.compile(models[4096])


def test_a_model_that_fits_a_board_by_a_few_times_is_not_refused(models, tmp_path):
    """1024 x 1024 int8 (8 Mbit, about twice the ECP5 85F's block RAM) fits no board but is
    a design: without a board it folds (the Verilog of it takes a minute, not run here)."""
    code, err = _cli(tmp_path, "compile", models[1024], "-o", tmp_path / "d",
                     "--stop-after", "fold")
    assert code == 0, err


# -- beyond the board ----------------------------------------------------------------------

SPRAMS = ", 4 SPRAMs of 256 kbit"


@pytest.mark.parametrize("board, device, holds, brams, kbit, spram, luts, share, of, weights", [
    ("icebreaker", "iCE40UP5K-SG48", "1.1 Mbit", 30, 4, SPRAMS, "4,224", 80, "5,280", "auto"),
    ("icebreaker", "iCE40UP5K-SG48", "151 kbit", 30, 4, "", "4,224", 80, "5,280", "rom"),
    ("ulx3s-85f", "LFE5U-85F-BG381", "4.1 Mbit", 208, 18, "", "62,730", 75, "83,640", "auto"),
])
def test_weights_beyond_the_board_are_refused_before_folding(models, tmp_path, board, device,
                                                               holds, brams, kbit, spram, luts,
                                                               share, of, weights):
    # What the board holds: its block RAMs, its SPRAMs (unless --weights rom), and its
    # default utilization's share of its LUTs (80 % on iCE40, 75 % on ECP5) as ROM in soft
    # logic at 0.131 LUT a bit (yosys 0.70, plan.devices.logic_memory_cost): UP5K
    # 30 x 4 kbit + 4,224 / 0.131 bits = 151 kbit, with its 4 x 256 kbit SPRAMs 1,175 kbit;
    # ECP5 85F 208 x 18 kbit + 62,730 / 0.131 = 4.1 Mbit.
    out = tmp_path / "d"
    msg = _one_error(*_cli(tmp_path, "compile", models[1024], "-o", out, "--board", board,
                           "--weights", weights))
    assert msg == (f"The weights take 8.0 Mbit (layer 'dense0' 8.0 Mbit) even at the "
                   f"slowest folding; {board} ({device}) holds at most {holds} of them: "
                   f"{brams} block RAMs of {kbit} kbit{spram} and {luts} LUTs ({share}% of {of}) "
                   f"as ROM")
    assert not out.exists()


def test_the_board_refusal_comes_before_any_folding(models, monkeypatch):
    _no_fold(monkeypatch)
    with pytest.raises(SizeError, match=r"^The weights take 8\.0 Mbit .* icebreaker "):
        onnx2fpga.compile(models[1024], board="icebreaker")


def test_a_board_no_folding_fits_is_an_error_not_a_design(tmp_path):
    """Within the board's memory but not its logic, at any folding (5 % of the UP5K's LUTs):
    refused, naming what overflows at the slowest folding, and nothing written (it was a
    design written with exit 0 and "folding limited by: nothing fits")."""
    model = save(float_mlp((16, 12, 6), softmax=False, seed=2), tmp_path / "m.onnx")
    np.save(tmp_path / "cal.npy", np.random.default_rng(1).standard_normal(
        (32, 1, 16)).astype(np.float32))
    out = tmp_path / "d"
    msg = _one_error(*_cli(tmp_path, "compile", model, "-o", out, "--board", "icebreaker",
                           "--utilization", "0.05", "--calibration", tmp_path / "cal.npy"))
    assert re.match(r"^No folding of the design fits icebreaker: at the slowest, [\d,]+ "
                    r"cycles per inference, .*[\d,]+ logic cells > 264 \(5,280 x 0\.05\)$",
                    msg), msg
    assert not out.exists()


def test_a_board_refusal_gives_the_cycles_of_the_layers_the_overrides_fix(tmp_path):
    """Every layer overridden to an adder graph (one vector per cycle) on a board it does
    not fit: the refusal gives that plan's one cycle per inference, not the slowest folding
    the layers would have had without the overrides."""
    model = save(float_mlp((16, 12, 6), softmax=False, seed=2), tmp_path / "m.onnx")
    cal = np.random.default_rng(1).standard_normal((32, 1, 16)).astype(np.float32)
    plain = onnx2fpga.compile(model, tmp_path / "plain", calibration=cal)
    adders = {ly.name: {"multipliers": "adders"} for ly in plain.design.dataflow.layers
              if getattr(ly, "multipliers", None) is not None}
    assert plain.manifest["cycles_per_inference"] > 1 and len(adders) == 2
    with pytest.raises(SizeError, match=r"^No folding of the design fits icebreaker: at the "
                                        r"slowest, 1 cycles per inference, [\d,]+ LUTs > 264 "):
        onnx2fpga.compile(model, tmp_path / "d", calibration=cal, board="icebreaker",
                          utilization=0.05, folding=adders)
    assert not (tmp_path / "d").exists()


def test_a_board_whose_requantizations_alone_overflow_its_multipliers_is_refused(tmp_path):
    """Ten layers of 8 whose requantizations take more MULT18X18D at the slowest folding than the
    board may use (28 x 0.34 on the OrangeCrab 25F; one each, the inputs clamped to the 18 bits
    where outputs still change): products can move into LUTs, the
    requantizations' multipliers cannot, so compile refuses at once, with the figures,
    and writes nothing (asked for a core per layer: the layer engine would fit)."""
    from onnx2fpga.hw.resources import netlist_features
    from onnx2fpga.hw.top import make_core
    from onnx2fpga.plan.fold import _fold_full, layer_options
    from onnx2fpga.plan.graph import plan_graph

    model = save(float_mlp((8,) * 10 + (4,), softmax=False, seed=2), tmp_path / "m.onnx")
    cal = np.random.default_rng(1).standard_normal((32, 1, 8)).astype(np.float32)
    np.save(tmp_path / "cal.npy", cal)
    out = tmp_path / "d"
    msg = _one_error(*_cli(tmp_path, "compile", model, "-o", out, "--board", "orangecrab-25f",
                           "--utilization", "0.34", "--calibration", tmp_path / "cal.npy",
                           "--architecture", "dataflow"))
    assert not out.exists()
    # The slowest folding (each layer's cheapest), products in LUTs: what its requantization
    # cores' netlists take.
    df = onnx2fpga.compile(model, calibration=cal, stop_after="lower").design.dataflow
    options = [layer_options(ly) for ly in df.layers]
    _fold_full(df, [opts[0][2] for opts in options], None, 2)
    for ly in df.layers:
        ly.multipliers = "lut"
    kept = sum(netlist_features(make_core(s), "ecp5")["dsp"]
               for s in plan_graph(df).stages if s.kind == "requant")
    slowest = max(c for opts in options for c, _, _ in opts)
    assert kept > 9
    assert msg == (f"No folding of the design fits orangecrab-25f: at the slowest, "
                   f"{slowest:,} cycles per inference, {kept} MULT18X18D > 9 (28 x 0.34; "
                   f"{kept} requantizing, which stay when products move to LUTs)")


# -- beyond this machine -------------------------------------------------------------------

def test_a_model_beyond_the_machine_memory_is_refused_before_lowering(tmp_path, monkeypatch,
                                                                      capsys):
    """The machine's available memory is the limit (here pretended small): a model whose
    lowering would not fit is refused before lowering, one whose Verilog would not fit
    before any hardware is built, each with the estimate and what is available."""
    model = save(qdq_matmul(256, 256), tmp_path / "m.onnx")
    monkeypatch.setattr(steps, "available_memory", lambda: 100 << 20)

    def no_lowering(*args, **kw):
        raise AssertionError("lowering started")
    monkeypatch.setattr("onnx2fpga.frontend.lower.lower", no_lowering)
    code = main(["compile", model, "-o", str(tmp_path / "d")])
    err = capsys.readouterr().err
    err = "".join(ln for ln in err.splitlines(keepends=True) if not ln.startswith("[onnx2"))
    # 65,536 weights and a few scales and zero points, at 32 bytes over 200 MB.
    assert re.match(r"^Lowering the model's 65,5\d\d constant elements takes about 202 MB "
                    r"of memory; this machine has 100 MB available$",
                    _one_error(code, err)), err
    monkeypatch.undo()
    # Enough to lower 64 k constants (202 MB), not to emit 512 kbit of weights: 200 MB
    # and 140 bytes a bit (1024 x 1024 int8 took 1.1 GB).
    monkeypatch.setattr(steps, "available_memory", lambda: 240 << 20)
    _no_fold_emit = []
    monkeypatch.setattr("onnx2fpga.hw.emit.emit_verilog",
                        lambda *a, **k: _no_fold_emit.append(1))
    with pytest.raises(SizeError, match=r"^Generating the Verilog of weights of 512 kbit "
                                        r"\(layer 'dense0' 512 kbit\) takes about 270 MB of "
                                        r"memory; this machine has 240 MB available$"):
        onnx2fpga.compile(model, tmp_path / "e")
    assert _no_fold_emit == [] and not (tmp_path / "e").exists()


def test_available_memory_is_the_machines():
    have = steps.available_memory()
    assert have is not None and 0 < have <= os.sysconf("SC_PAGE_SIZE") * os.sysconf(
        "SC_PHYS_PAGES")
