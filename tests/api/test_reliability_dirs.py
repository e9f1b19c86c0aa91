"""Nothing the user gave is lost, and nothing runs that a compile did not write: what
``--force`` may replace, atomic compiles under real signals and real concurrent processes,
folder locks, hash-checked loads, hostile Verilog and output paths (issue 20, points 1, 3, 4,
6 and 10)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import onnx2fpga
from onnx2fpga.cli import main
from onnx2fpga.designdir import FolderLock
from tests.helpers.cli import run_cli
from tests.helpers.models import float_mlp, save

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def model(tmp_path):
    """A float MLP and its calibration batch, in their own folder."""
    src = tmp_path / "src"
    src.mkdir()
    path = save(float_mlp((12, 8, 4)), src / "mlp.onnx")
    np.save(src / "cal.npy", np.random.default_rng(0).standard_normal((32, 1, 12))
            .astype(np.float32))
    return path, str(src / "cal.npy")


def _cli(capsys, *argv):
    code, _, err = run_cli(capsys, *argv)
    return code, err.splitlines()


def _proc(*argv, **kw):
    """``python -m onnx2fpga ARGV`` as a real process (in the repository, so that the
    package under test is the one imported)."""
    return subprocess.Popen([sys.executable, "-m", "onnx2fpga", *map(str, argv)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _tree(path) -> dict:
    """Every file under ``path`` with its bytes."""
    out = {}
    for top, _, files in os.walk(path):
        for f in files:
            p = os.path.join(top, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, path)] = fh.read()
    return out


def _consistent(out) -> str:
    """The design id of folder ``out`` after checking, independently of ``load``, that its
    files belong together (the manifest's hashes of top.v, design.json and design.npz)."""
    m = json.loads((out / "manifest.json").read_text())
    top = hashlib.sha256((out / "top.v").read_bytes()).hexdigest()
    assert m["top"]["verilog_sha256"] == top
    for name in ("top.v", "design.json", "design.npz"):
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == m["files"][name], name
    return top


# -- point 1: what --force may replace --------------------------------------------------------

@pytest.mark.parametrize("case", ["home", "model_folder", "link", "design_plus_file"])
def test_force_never_deletes_what_onnx2fpga_did_not_write(tmp_path, capsys, model, case):
    path, cal = model
    if case == "home":                  # -o ~ --force emptied a home folder
        out = tmp_path / "home"
        (out / ".ssh").mkdir(parents=True)
        (out / ".ssh" / "id_ed25519").write_text("key")
        (out / ".git").mkdir()
        (out / ".bashrc").write_text("alias")
        target = out
    elif case == "model_folder":        # -o <the model's own folder> deleted the model
        out = target = tmp_path / "src"
    elif case == "link":                # -o LINK emptied the link's target
        target = tmp_path / "data"
        target.mkdir()
        (target / "results.csv").write_text("1,2")
        out = tmp_path / "link"
        out.symlink_to(target)
    else:                               # a design folder the user added a file to
        out = target = tmp_path / "d"
        assert _cli(capsys, "compile", path, "-o", out, "--calibration", cal)[0] == 0
        (out / "notes.txt").write_text("mine")
    before = _tree(target)
    code, lines = _cli(capsys, "compile", path, "-o", out, "--calibration", cal, "--force")
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "not a design folder" in lines[0] and "nothing was deleted" in lines[0]
    assert _tree(target) == before
    assert not [n for n in os.listdir(target.parent) if ".tmp-" in n or ".old-" in n]


def test_force_replaces_a_design_folder_and_all_it_held(tmp_path, capsys, model):
    path, cal = model
    out = tmp_path / "d"
    assert _cli(capsys, "compile", path, "-o", out, "--calibration", cal)[0] == 0
    (out / "build" / "icebreaker").mkdir(parents=True)
    (out / "build" / "icebreaker" / "report.json").write_text("{}")
    old = _consistent(out)
    assert _cli(capsys, "compile", path, "-o", out, "--calibration", cal, "--force",
                "--max-lanes", "2")[0] == 0
    assert _consistent(out) != old
    assert not (out / "build").exists()          # the old design's builds went with it
    assert sorted(os.listdir(tmp_path)) == ["d", "src"]


def test_output_below_a_file_is_one_line(tmp_path, capsys, model):
    path, cal = model
    (tmp_path / "afile").write_text("x")
    code, lines = _cli(capsys, "compile", path, "-o", tmp_path / "afile" / "sub",
                       "--calibration", cal)
    assert code == 2 and lines == [f"error: {tmp_path / 'afile' / 'sub'}: "
                                   f"{tmp_path / 'afile'} is a file, not a folder"]


# -- point 3: atomic compiles, under signals and concurrency ----------------------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_never_leaves_a_partial_folder(tmp_path, model, sig):
    """SIGINT or SIGTERM at increasing delays into a ``compile --force`` that replaces a
    design: the folder is always a whole design (the old one or the new one), nothing is left
    beside it, and the command says it was stopped (or, signalled after the swap, succeeds)."""
    path, cal = model
    out = tmp_path / "d"
    assert main(["compile", path, "-o", str(out), "--calibration", cal]) == 0
    for delay in (0.0, 0.5, 1.0, 2.0):
        p = _proc("compile", path, "-o", out, "--calibration", cal, "--force", "--max-lanes", 2)
        first = p.stderr.readline()       # the command has started (its handlers are in place)
        time.sleep(delay)
        p.send_signal(sig)
        _, err = p.communicate(timeout=600)
        err = first + err
        assert "Traceback" not in err, err
        # -sig: the signal came after main() had finished and put back Python's handlers
        # (while the interpreter shut down), so the compile had completed.
        assert p.returncode in (0, 128 + sig, -sig), err
        _consistent(out)          # the old design or the new one, whole
        onnx2fpga.load(out)
        assert sorted(os.listdir(tmp_path)) == ["d", "src"], os.listdir(tmp_path)


def test_an_interrupted_write_leaves_the_old_design(tmp_path, capsys, model, monkeypatch):
    """Ctrl-C while the new design's files are being written (after top.v, before the
    design files): the command says so, and the folder still holds the old design whole."""
    import onnx2fpga.steps as steps

    path, cal = model
    out = tmp_path / "d"
    assert main(["compile", path, "-o", str(out), "--calibration", cal]) == 0
    before = _tree(out)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(steps, "save_design", interrupted)
    code, lines = _cli(capsys, "compile", path, "-o", out, "--calibration", cal, "--force",
                       "--max-lanes", "2")
    assert code == 130 and lines == ["error: interrupted"]
    assert _tree(out) == before
    assert sorted(os.listdir(tmp_path)) == ["d", "src"]


def test_concurrent_compiles_leave_one_whole_design(tmp_path, model):
    """Two real processes compiling different designs into one folder at once, several
    times: every time the folder holds one of the two designs whole."""
    path, cal = model
    out = tmp_path / "d"
    ids = set()
    for _ in range(2):
        procs = [_proc("compile", path, "-o", out, "--calibration", cal, "--force",
                       "--max-lanes", lanes) for lanes in (2, 4)]
        for p in procs:
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err
        ids.add(_consistent(out))
        onnx2fpga.load(out)
        assert sorted(os.listdir(tmp_path)) == ["d", "src"]
    assert 1 <= len(ids) <= 2


def test_a_compile_waits_for_a_command_using_the_folder(tmp_path, model):
    path, cal = model
    out = tmp_path / "d"
    assert main(["compile", path, "-o", str(out), "--calibration", cal]) == 0
    old = _consistent(out)
    with FolderLock(out, shared=True):            # as a running simulate or build holds it
        p = _proc("compile", path, "-o", out, "--calibration", cal, "--force",
                  "--max-lanes", 2)
        waited = []
        reader = threading.Thread(target=lambda: waited.extend(iter(p.stderr.readline, "")))
        reader.start()
        for _ in range(600):
            if any("waiting for another onnx2fpga command" in ln for ln in waited):
                break
            assert p.poll() is None, waited
            time.sleep(0.1)
        else:
            pytest.fail(f"the compile never waited: {waited}")
        assert _consistent(out) == old            # untouched while the lock is held
    assert p.wait(timeout=600) == 0
    reader.join()
    assert _consistent(out) != old


# -- point 4: a crafted design folder runs nothing --------------------------------------------

@pytest.fixture
def design(tmp_path, model):
    path, cal = model
    out = tmp_path / "d"
    assert main(["compile", path, "-o", str(out), "--calibration", cal]) == 0
    np.save(tmp_path / "x.npy", np.load(cal)[:2])
    return out


def _rehash(out):
    """Make the manifest agree with the files again, as a crafted folder would."""
    m = json.loads((out / "manifest.json").read_text())
    for name in ("top.v", "design.json", "design.npz"):
        m["files"][name] = hashlib.sha256((out / name).read_bytes()).hexdigest()
    m["top"]["verilog_sha256"] = m["files"]["top.v"]
    (out / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("rehash", [False, True])
@pytest.mark.parametrize("payload", ['initial $system("touch {marker}");',
                                     '`include "{marker}"'])
def test_hostile_verilog_is_never_simulated(tmp_path, capsys, design, rehash, payload):
    marker = tmp_path / "pwned"
    text = (design / "top.v").read_text()
    text = text.replace("endmodule", payload.format(marker=marker) + "\nendmodule", 1)
    (design / "top.v").write_text(text)
    if rehash:
        _rehash(design)
    for argv in (["simulate", design, "--engine", "rtl", "--inputs", tmp_path / "x.npy",
                  "--outputs", tmp_path / "y.npy"],
                 ["run", design, "--sim", "--inputs", tmp_path / "x.npy",
                  "--outputs", tmp_path / "y.npy"],
                 ["build", design, "--board", "icebreaker"]):
        code, lines = _cli(capsys, *argv)
        assert code == 2 and len(lines) == 1, lines
        assert ("$system" in lines[0] or "`include" in lines[0]) if rehash \
            else "top.v differs from what the compile wrote" in lines[0]
    assert not marker.exists() and not (design / "sim_build").exists()


@pytest.mark.parametrize("damage", ["manifest_not_json", "manifest_list", "no_hashes",
                                    "npz_truncated", "npz_truncated_rehashed",
                                    "design_json_garbage_rehashed"])
def test_a_damaged_design_folder_is_one_line(tmp_path, capsys, design, damage):
    if damage == "manifest_not_json":
        (design / "manifest.json").write_text("{not json")
    elif damage == "manifest_list":
        (design / "manifest.json").write_text("[1, 2]")
    elif damage == "no_hashes":
        m = json.loads((design / "manifest.json").read_text())
        del m["files"]
        (design / "manifest.json").write_text(json.dumps(m))
    elif damage.startswith("npz"):
        data = (design / "design.npz").read_bytes()
        (design / "design.npz").write_bytes(data[: len(data) // 2])
    else:
        (design / "design.json").write_text('{"layers": 7}')
    if damage.endswith("rehashed"):
        _rehash(design)
    code, lines = _cli(capsys, "simulate", design, "--engine", "golden", "--inputs",
                       tmp_path / "x.npy", "--outputs", tmp_path / "y.npy")
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {design}"), lines
    assert not (tmp_path / "y.npy").exists()


# -- point 6: outputs --------------------------------------------------------------------------

def test_outputs_name_without_npy_is_checked_as_written(tmp_path, capsys, design):
    (tmp_path / "y.npy").write_bytes(b"precious")
    code, lines = _cli(capsys, "simulate", design, "--engine", "golden", "--inputs",
                       tmp_path / "x.npy", "--outputs", tmp_path / "y")
    assert code == 2 and lines == [f"error: {tmp_path / 'y.npy'}: exists (use --force to "
                                   f"overwrite)"]
    assert (tmp_path / "y.npy").read_bytes() == b"precious"
    code, _ = _cli(capsys, "simulate", design, "--engine", "golden", "--inputs",
                   tmp_path / "x.npy", "--outputs", tmp_path / "y", "--force")
    assert code == 0 and np.load(tmp_path / "y.npy").shape[0] == 2


@pytest.mark.parametrize("where", ["missing_folder", "below_a_file", "a_folder"])
def test_an_unusable_output_path_is_refused_before_the_run(tmp_path, capsys, design, where,
                                                           monkeypatch):
    import onnx2fpga.api as api

    ran = []
    monkeypatch.setattr(api.CompiledDesign, "simulate", lambda *a, **k: ran.append(1))
    (tmp_path / "afile").write_text("x")
    (tmp_path / "afolder.npy").mkdir()
    y = {"missing_folder": tmp_path / "nowhere" / "y.npy",
         "below_a_file": tmp_path / "afile" / "y.npy",
         "a_folder": tmp_path / "afolder.npy"}[where]
    for command in (["simulate", design, "--engine", "rtl"], ["run", design, "--sim"]):
        code, lines = _cli(capsys, *command, "--inputs", tmp_path / "x.npy", "--outputs", y)
        assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {y}"), lines
    assert not ran


# -- point 10: two builds into one board folder ------------------------------------------------

def test_builds_into_one_board_folder_never_mix(tmp_path, design, monkeypatch):
    """Two builds of one board at once (threads: ``flock`` locks are per open file, so they
    exclude each other as two processes would): each report names the bitstream beside it."""
    import onnx2fpga.boards.build as build

    def fake(factory, i, o, board, build_dir, seed=None, **kw):
        bit = os.path.join(build_dir, "top.bin")
        with open(bit, "w") as f:
            f.write(f"bitstream of seed {seed}")
        time.sleep(0.5)                  # the other build runs meanwhile, unless locked out
        report = {"board": board, "bitstream": "top.bin", "seed": seed,
                  "resources": {}, "timing_met": True}
        with open(os.path.join(build_dir, "report.json"), "w") as f:
            json.dump(report, f)
        return report
    monkeypatch.setattr(build, "build_bitstream", fake)
    monkeypatch.setattr("onnx2fpga.api.write_report", lambda d: None)
    d = onnx2fpga.load(design)
    threads = [threading.Thread(target=d.build, args=("icebreaker",), kwargs={"seed": s})
               for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    board = design / "build" / "icebreaker"
    report = json.loads((board / "report.json").read_text())
    assert (board / "top.bin").read_text() == f"bitstream of seed {report['seed']}"


def test_the_simulated_board_checks_the_verilog_it_reads(tmp_path, design):
    """``SimBoard`` reads top.v itself (after ``load``): it checks what it read against the
    manifest and for system tasks, before building anything."""
    from onnx2fpga.boards.simboard import SimBoard, SimBoardError

    manifest = json.loads((design / "manifest.json").read_text())
    text = (design / "top.v").read_text()
    (design / "top.v").write_text(text.replace("endmodule", "initial $system(\"id\");\n"
                                               "endmodule", 1))
    with pytest.raises(SimBoardError, match="differs from what the compile wrote"):
        SimBoard(design, manifest=manifest, build_dir=tmp_path / "b")
    _rehash(design)
    manifest = json.loads((design / "manifest.json").read_text())
    with pytest.raises(Exception, match=r"\$system"):
        SimBoard(design, manifest=manifest, build_dir=tmp_path / "b")
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").rglob("*.o"))
