"""The command line contract: outputs, exit codes and one-line errors."""

import json
import os
import re

import numpy as np
import onnx
import pytest
from onnx import helper

from onnx2fpga.cli import main
from onnx2fpga.sim.model import run_design
from tests.helpers.cli import run_cli
from tests.helpers.models import float_mlp, float_softmax_mlp, ort_qdq_mlp, save

_run = run_cli


@pytest.fixture
def float_model(tmp_path):
    path = save(float_mlp((12, 8, 4)), tmp_path / "mlp.onnx")
    cal = np.random.default_rng(0).standard_normal((64, 1, 12)).astype(np.float32)
    np.save(tmp_path / "cal.npy", cal)
    return path, tmp_path / "cal.npy", cal


def test_compile_then_golden_simulate(tmp_path, capsys, float_model):
    path, cal_path, cal = float_model
    out = tmp_path / "d"
    code, stdout, _ = _run(capsys, "compile", path, "-o", out, "--calibration", cal_path)
    assert code == 0, stdout
    assert sorted(os.listdir(out)) == ["design.json", "design.npz", "manifest.json",
                                       "report.html", "report.md", "top.core", "top.f",
                                       "top.v"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["partition"]["host_tail"][-1] == "softmax"
    np.save(tmp_path / "x.npy", cal[:10])
    code, stdout, _ = _run(capsys, "simulate", out, "--engine", "golden", "--inputs",
                           tmp_path / "x.npy", "--outputs", tmp_path / "y.npy", "--json")
    assert code == 0
    assert json.loads(stdout)["output_shape"] == [10, 1, 4]
    y = np.load(tmp_path / "y.npy")
    assert y.dtype == np.float32 and y.shape == (10, 1, 4)
    import onnx2fpga
    np.testing.assert_array_equal(y, run_design(onnx2fpga.load(out).design, cal[:10]))


def test_same_model_gives_byte_identical_files(tmp_path, capsys, float_model):
    path, cal_path, _ = float_model
    for d in ("a", "b"):
        assert _run(capsys, "compile", path, "-o", tmp_path / d, "--calibration", cal_path)[0] == 0
    for f in ("top.v", "top.f", "top.core", "manifest.json", "design.json", "design.npz"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


@pytest.mark.parametrize("name", ["9lives", "my-top", "module", "logic", "a" * 65, ""])
def test_name_must_be_a_verilog_identifier(tmp_path, capsys, float_model, name):
    path, cal_path, _ = float_model
    code, _, err = _run(capsys, "compile", path, "-o", tmp_path / "d", "--calibration",
                        cal_path, "--name", name)
    assert code == 2
    assert err == (f"error: Module name must be a Verilog identifier (a letter or underscore, "
                   f"then letters, digits or underscores; at most 64 characters; no Verilog "
                   f"keyword), not {name!r}\n")
    assert not (tmp_path / "d").exists()


def test_non_empty_directory_needs_force(tmp_path, capsys, float_model):
    path, cal_path, _ = float_model
    out = tmp_path / "d"
    out.mkdir()
    (out / "precious.txt").write_text("mine")
    code, _, err = _run(capsys, "compile", path, "-o", out, "--calibration", cal_path)
    assert code == 2
    assert err == (f"error: {out}: folder is not empty (use --force to replace a design "
                   f"folder)\n")
    assert (out / "precious.txt").read_text() == "mine"
    code, _, err = _run(capsys, "compile", path, "-o", out, "--calibration", cal_path, "--force")
    assert code == 2 and "'precious.txt'" in err and "nothing was deleted" in err
    assert os.listdir(out) == ["precious.txt"]
    assert (out / "precious.txt").read_text() == "mine"


def test_float_model_without_calibration(tmp_path, capsys, float_model):
    path, _, _ = float_model
    code, _, err = _run(capsys, "compile", path, "-o", tmp_path / "d")
    assert code == 2
    assert err.startswith("error: Graph 'mlp' is a float model: pass calibration data")
    assert err.count("\n") == 1
    assert not (tmp_path / "d").exists()


def test_calibration_of_wrong_shape(tmp_path, capsys, float_model):
    path, _, _ = float_model
    np.save(tmp_path / "bad.npy", np.zeros((5, 11), np.float32))
    code, _, err = _run(capsys, "compile", path, "-o", tmp_path / "d", "--calibration",
                        tmp_path / "bad.npy")
    assert code == 2
    assert err == ("error: Calibration data must be (batch, 1, 12) or (batch, 12) float32, "
                   "not (5, 11) float32\n")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("content,needle", [
    (b"", "empty file, not an ONNX model"),
    (b"\x08\x07garbage\xff\xfe", "not an ONNX model"),
])
def test_not_onnx(tmp_path, capsys, content, needle):
    p = tmp_path / "m.onnx"
    p.write_bytes(content)
    code, _, err = _run(capsys, "compile", p, "-o", tmp_path / "d")
    assert code == 2 and needle in err and err.count("\n") == 1


def test_unsupported_operators_all_listed_before_hardware_work(tmp_path, capsys):
    path, _ = ort_qdq_mlp(tmp_path)
    m = onnx.load(path)
    gemms = [n for n in m.graph.node if n.op_type == "Gemm"]
    for n in gemms:
        n.op_type = "Einsum"
        del n.attribute[:]
        n.attribute.append(helper.make_attribute("equation", "ij,jk->ik"))
        del n.input[2:]
    onnx.save(m, path)
    code, _, err = _run(capsys, "compile", path, "-o", tmp_path / "d")
    assert code == 2
    assert err.startswith("error: 2 unsupported nodes: ")
    for n in gemms:
        assert f"Node '{n.name}' (Einsum, opset 13)" in err
    assert not (tmp_path / "d").exists()


def test_host_compute_needs_the_option_and_the_partition_is_printed(tmp_path, capsys):
    path = save(float_softmax_mlp(), tmp_path / "sig.onnx")
    np.save(tmp_path / "cal.npy",
            np.random.default_rng(0).standard_normal((20, 1, 16)).astype(np.float32))
    argv = ["compile", path, "-o", tmp_path / "d", "--calibration", tmp_path / "cal.npy"]
    code, _, err = _run(capsys, *argv)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: Node 'fc1' (MatMul, opset 13): a compute operator on the "
                          "host (tail), in float: its input comes from Node 'act' (Softmax, "
                          "opset 13), which does not run in hardware")
    assert not (tmp_path / "d").exists()
    assert main([str(a) for a in argv + ["--allow-host-compute"]]) == 0
    err = capsys.readouterr().err
    assert "warning: 1 compute node run on the host in float (allowed): Node 'fc1' " \
        "(MatMul, opset 13)" in err
    assert "[onnx2fpga] partition: host: Softmax, MatMul (tail); hardware: 1 layer\n" in err
    # The manifest's resource estimates, after the Verilog, are a step of their own.
    assert "[onnx2fpga] generating Verilog\n[onnx2fpga] estimating the resources on iCE40 " \
        "and ECP5 for the manifest\n" in err


def test_simulate_refuses_to_overwrite_outputs(tmp_path, capsys, float_model):
    path, cal_path, cal = float_model
    _run(capsys, "compile", path, "-o", tmp_path / "d", "--calibration", cal_path)
    np.save(tmp_path / "x.npy", cal[:2])
    (tmp_path / "y.npy").write_bytes(b"keep")
    code, _, err = _run(capsys, "simulate", tmp_path / "d", "--engine", "golden", "--inputs",
                        tmp_path / "x.npy", "--outputs", tmp_path / "y.npy")
    assert code == 2 and "exists (use --force to overwrite)" in err
    assert (tmp_path / "y.npy").read_bytes() == b"keep"


def test_simulate_passes_stalls_and_seed_to_the_simulation(tmp_path, capsys, float_model,
                                                          monkeypatch):
    """--stall-in, --stall-out and --seed reach CompiledDesign.simulate (whose RTL runs with
    them are tested in tests/api/test_pytest_plugin.py) and the --json figures."""
    import onnx2fpga.api

    path, cal_path, cal = float_model
    _run(capsys, "compile", path, "-o", tmp_path / "d", "--calibration", cal_path)
    np.save(tmp_path / "x.npy", cal[:3])
    calls = []

    def simulate(self, x, engine="rtl", **options):      # golden outputs, RTL's figures
        calls.append((engine, options))
        self.last_run = {"cycles_per_inference": 1.0, "latency_cycles": 1, "total_cycles": 9,
                         "sim_seconds": 0.5, "cycles_per_second": 18, "jobs": 1,
                         "inferences": len(x)}
        return run_design(self.design, x)
    monkeypatch.setattr(onnx2fpga.api.CompiledDesign, "simulate", simulate)
    code, stdout, err = _run(capsys, "simulate", tmp_path / "d", "--inputs", tmp_path / "x.npy",
                             "--outputs", tmp_path / "y.npy", "--stall-in", "0.75",
                             "--stall-out", "0", "--seed", "12", "--json")
    assert code == 0, err
    assert calls == [("rtl", {"stall_in": 0.75, "stall_out": 0.0, "seed": 12,
                              "progress": True, "jobs": None, "scheduler": None})]
    result = json.loads(stdout)
    assert (result["stall_in"], result["stall_out"], result["seed"]) == (0.75, 0.0, 12)
    calls.clear()
    _run(capsys, "simulate", tmp_path / "d", "--inputs", tmp_path / "x.npy", "--outputs",
         tmp_path / "y.npy", "--force")
    assert calls == [("rtl", {"stall_in": 0.3, "stall_out": 0.3, "seed": 0, "progress": True,
                              "jobs": None, "scheduler": None})]


def test_simulate_on_a_non_design_directory(tmp_path, capsys):
    code, _, err = _run(capsys, "simulate", tmp_path, "--inputs", "x.npy", "--outputs", "y.npy")
    assert code == 2
    assert "not a design directory (missing manifest.json, design.json, design.npz)" in err


@pytest.mark.parametrize("command", ["compile", "simulate", "build", "boards"])
def test_help_documents_every_command(capsys, command):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert "usage: onnx2fpga " + command in capsys.readouterr().out


def test_build_takes_one_seed_or_several(tmp_path, capsys, monkeypatch):
    # --seed 1,2,3 reaches Design.build as a list (a seed sweep); a bad list is a usage error.
    import onnx2fpga.api
    from onnx2fpga.boards.build import BuildError
    got = {}

    def fake_build(self, board, **kw):
        got.update(kw, board=board)
        raise BuildError("stop here", stage="setup")
    monkeypatch.setattr(onnx2fpga.api.CompiledDesign, "build", fake_build)
    monkeypatch.setattr(onnx2fpga.api, "load", lambda d: onnx2fpga.api.CompiledDesign.__new__(
        onnx2fpga.api.CompiledDesign))
    for text, seed in (("3", 3), ("1,2,3", [1, 2, 3])):
        code, _, err = _run(capsys, "build", tmp_path, "--board", "ulx3s-85f", "--seed", text)
        assert code != 0 and "stop here" in err and got["seed"] == seed
    code, _, err = _run(capsys, "build", tmp_path, "--board", "ulx3s-85f",
                        "--pnr-options=--router router2")
    assert code != 0 and got["pnr_options"] == "--router router2"
    code, _, err = _run(capsys, "build", tmp_path, "--board", "ulx3s-85f")
    assert got["pnr_options"] is None
    with pytest.raises(SystemExit) as e:
        main(["build", str(tmp_path), "--board", "ulx3s-85f", "--seed", "1,x"])
    assert e.value.code == 2
    assert "expected an integer or integers separated by commas, not '1,x'" in \
        capsys.readouterr().err


def test_boards_lists_the_two_first_targets(capsys):
    code, out, _ = _run(capsys, "boards")
    names = [line.split()[0] for line in out.splitlines()]
    assert code == 0 and "icebreaker" in names and "ulx3s-85f" in names


def test_folding_overrides_for_a_cnn(tmp_path, capsys):
    """``--folding`` sets a convolution's simd, pe and window lanes and a pool's lanes; a
    value the layer cannot take is one error line naming the layer and the valid values."""
    from tests.helpers.models import CNN_KINDS, float_cnn
    path = save(float_cnn("basic"), tmp_path / "cnn.onnx")
    cal = np.random.default_rng(0).standard_normal((16, 1) + CNN_KINDS["basic"]).astype(
        np.float32)
    np.save(tmp_path / "cal.npy", cal)
    code, _, err = _run(capsys, "compile", path, "-o", tmp_path / "d", "--calibration",
                        tmp_path / "cal.npy", "--folding",
                        "conv0:6:2:2,pool1:lanes=4,conv0:multipliers=lut")
    assert code == 0, err
    layers = {ly["name"]: ly for ly in
              json.loads((tmp_path / "d" / "manifest.json").read_text())["layers"]}
    assert (layers["conv0"]["simd"], layers["conv0"]["pe"], layers["conv0"]["lanes"],
            layers["conv0"]["multipliers"]) == (6, 2, 2, "lut")
    assert layers["pool1"]["in_lanes"] == 4
    code, _, err = _run(capsys, "compile", path, "-o", tmp_path / "e", "--calibration",
                        tmp_path / "cal.npy", "--folding", "conv0:5:1")
    assert code == 2
    assert err.startswith("error: Layer 'conv0': simd=5 is not a valid folding (possible: [")
    with pytest.raises(SystemExit) as e:             # argparse: usage and one error line
        main(["compile", str(path), "-o", str(tmp_path / "f"), "--folding", "conv0:x"])
    assert e.value.code == 2
    assert "folding must be NAME:SIMD:PE[:LANES], NAME:lanes=L or " \
           "NAME:multipliers=lut|dsp|adders, " \
           "comma-separated, not 'conv0:x'" in capsys.readouterr().err
    code, _, err = _run(capsys, "compile", path, "-o", tmp_path / "g", "--calibration",
                        tmp_path / "cal.npy", "--folding", "pool1:multipliers=lut")
    assert code == 2
    assert err.strip() == "error: Layer 'pool1' (PoolLayer) has no multipliers to map"


def test_target_fps_folds_the_cheapest_design_that_reaches_it(tmp_path, capsys, float_model):
    """12-8-4 MLP: at 1 MHz, 250,000 inferences/s leave 4 cycles per inference. The cheapest
    design that reaches them is found by trying every lane budget in turn."""
    path, cal_path, _ = float_model
    code, stdout, err = _run(capsys, "compile", path, "-o", tmp_path / "t", "--calibration",
                             cal_path, "--target-fps", "250000", "--clock", "1")
    assert code == 0, err
    m = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert m["cycles_per_inference"] <= 4
    assert m["folding"]["target_cycles"] == 4 and m["folding"]["limited_by"] == "target_cycles"
    lanes = sum(ly.get("simd", 1) * ly.get("pe", 1) if ly["kind"] == "dense"
                else ly["in_lanes"] for ly in m["layers"] if ly["kind"] != "view")
    import onnx2fpga
    cal = np.load(cal_path)
    for budget in range(1, lanes):     # no smaller budget reaches 4 cycles
        d = onnx2fpga.compile(path, calibration=cal, max_lanes=budget)
        assert d.manifest["cycles_per_inference"] > 4, budget
    assert "folding limited by: target_cycles" in stdout


@pytest.mark.parametrize("argv,message", [
    (["--target-fps", "1000"], "error: target_fps and clock_mhz go together: the rate in "
                               "inferences per second and the clock in MHz it is reached at"),
    (["--target-fps", "-3", "--clock", "10"], "error: target_fps must be a positive finite "
                                              "number, not -3.0"),
    (["--target-fps", "1e9", "--clock", "10"], "error: target_fps 1000000000.0 at 10.0 MHz "
                                               "leaves less than one cycle per inference"),
    (["--target-fps", "5e6", "--clock", "10", "--max-lanes", "3"],
     r"error: No folding reaches 2 cycles per inference: multiply lanes \d+ > max_lanes 3"),
    (["--board", "ulx3s-85f", "--utilization", "1.5"], "error: utilization must be a number "
                                                       "in (0, 1], not 1.5"),
])
def test_folding_option_errors(tmp_path, capsys, float_model, argv, message):
    path, cal_path, _ = float_model
    code, stdout, err = _run(capsys, "compile", path, "-o", tmp_path / "e", "--calibration",
                             cal_path, *argv)
    assert code == 2
    assert re.fullmatch(message, err.strip()) if "\\d" in message else err.strip() == message
    assert not (tmp_path / "e").exists()


def test_build_verbose_and_quiet(tmp_path, capsys, float_model, monkeypatch):
    # Progress lines through the terminal handler, each once; -q hides them, -v adds the debug
    # messages (here the fit check's figures); the handler goes away after the command.
    import logging
    import shutil
    path, cal_path, _ = float_model
    out = tmp_path / "d"
    assert main(["compile", str(path), "-o", str(out), "--calibration", str(cal_path),
                 "-q"]) == 0
    assert "[onnx2fpga]" not in capsys.readouterr().err
    false = shutil.which("false")
    monkeypatch.setenv("YOSYS", false)
    assert main(["build", str(out), "--board", "ulx3s-85f", "-v"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"^\[onnx2fpga\] ulx3s-85f: estimated \{'lut': \d+", err, re.M)
    assert err.count(f"[onnx2fpga] ulx3s-85f: synthesis ({false}) ...") == 1
    assert "\nerror: synthesis failed: " in err
    assert main(["build", str(out), "--board", "ulx3s-85f"]) == 2
    err = capsys.readouterr().err
    assert "estimated {" not in err and f"[onnx2fpga] ulx3s-85f: synthesis ({false}) ..." in err
    assert main(["build", str(out), "--board", "ulx3s-85f", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("error: synthesis failed: ")
    package = logging.getLogger("onnx2fpga")
    assert [type(h) for h in package.handlers] == [logging.NullHandler]
    assert package.level == logging.NOTSET


def test_optimize_latency_reaches_the_manifest(tmp_path, capsys, float_model):
    """--optimize latency: the manifest says so, the rate is the default's, the latency not
    longer; an unknown value is a usage error."""
    path, cal_path, _ = float_model
    runs = {}
    for optimize in ("throughput", "latency"):
        code, _, err = _run(capsys, "compile", path, "-o", tmp_path / optimize, "--calibration",
                            cal_path, "--max-lanes", "10", "--optimize", optimize)
        assert code == 0, err
        runs[optimize] = json.loads((tmp_path / optimize / "manifest.json").read_text())
        assert runs[optimize]["folding"]["optimize"] == optimize
    fast, short = runs["throughput"], runs["latency"]
    assert short["cycles_per_inference"] == fast["cycles_per_inference"]
    assert short["latency_cycles"] <= fast["latency_cycles"]
    with pytest.raises(SystemExit) as e:
        main(["compile", str(path), "-o", str(tmp_path / "x"), "--optimize", "speed"])
    assert e.value.code == 2
    assert "argument --optimize: invalid choice: 'speed'" in capsys.readouterr().err
