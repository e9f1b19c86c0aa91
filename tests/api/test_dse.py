"""Design-space exploration and batches on a real Dask cluster: a ``dask scheduler`` and two
``dask worker`` processes on 127.0.0.1 (onnx2fpga.cluster, onnx2fpga.dse)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import onnx2fpga
from onnx2fpga import dse as explore_module
from onnx2fpga.cluster import pack, unpack
from onnx2fpga.dse import FIGURES, explore
from onnx2fpga.errors import DesignDirError, OptionError
from onnx2fpga.sim.model import run_design
from tests.helpers.cli import run_cli
from tests.helpers.models import float_mlp, save
from tests.helpers.paths import EXAMPLES

pytestmark = [pytest.mark.synth, pytest.mark.slow]

DIGITS = EXAMPLES / "digits"
_DASK = str(Path(sys.executable).parent / "dask")


class Cluster:
    """A scheduler and named workers, each a process of the ``dask`` command line."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.file = folder / "scheduler.json"
        self.procs = {}
        self.logs = []
        self.procs["scheduler"] = self._start(
            "scheduler", [_DASK, "scheduler", "--host", "127.0.0.1", "--port", "0",
                          "--no-dashboard", "--scheduler-file", str(self.file)])
        deadline = time.monotonic() + 60
        while not self.file.is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.address = json.loads(self.file.read_text())["address"]
        from distributed import Client
        self.client = Client(self.address, timeout="30s")
        for name in ("w1", "w2"):
            self.start_worker(name)

    def _start(self, name, argv):
        log = open(self.folder / f"{name}.log", "ab")       # noqa: SIM115 - closed at stop
        self.logs.append(log)
        return subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def start_worker(self, name):
        self.procs[name] = self._start(name, [
            _DASK, "worker", self.address, "--name", name, "--nthreads", "1", "--no-nanny",
            "--no-dashboard", "--host", "127.0.0.1"])
        deadline = time.monotonic() + 60
        while self.worker(name) is None:
            assert time.monotonic() < deadline, f"worker {name} did not start"
            time.sleep(0.2)

    def worker(self, name):
        """The address of the running worker called ``name``, or None."""
        for addr, info in self.client.scheduler_info()["workers"].items():
            if info.get("name") == name:
                return addr
        return None

    def stop(self):
        self.client.close()
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in self.logs:
            log.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("dask"))
    yield c
    c.stop()


def _figures(rows):
    return [{k: r[k] for k in FIGURES} for r in rows]


#: The whole sweep test builds the digits example nine times (about 4 minutes of both cores);
#: it runs when this variable is 1, which CI's time budget does not allow yet.
SWEEP_ENV = "ONNX2FPGA_TEST_SWEEP"


@pytest.mark.skipif(os.environ.get(SWEEP_ENV) != "1",
                    reason=f"nine iCE40 builds; set {SWEEP_ENV}=1 to run")
def test_explore_digits_on_the_cluster_survives_a_killed_worker_and_matches_a_local_sweep(
        cluster, tmp_path, monkeypatch):
    """The digits example over two seeds and two foldings for the iCEBreaker, on the
    cluster; worker w2 is killed while it builds. Every run has its row, each naming a
    worker, w2's run was done again on w1, and a local cluster gives the same figures."""
    kw = {"seeds": [1, 2], "foldings": [2, 8], "calibration": str(DIGITS / "calibration.npy"),
          "progress": False}
    model = str(DIGITS / "model.onnx")
    out, box = tmp_path / "cluster", {}

    def sweep():
        try:
            box["doc"] = explore(model, out, "icebreaker", scheduler=cluster.address, **kw)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            box["error"] = e

    w1, w2 = cluster.worker("w1"), cluster.worker("w2")
    thread = threading.Thread(target=sweep)
    thread.start()
    killed, deadline = None, time.monotonic() + 600
    while killed is None and thread.is_alive() and time.monotonic() < deadline:
        for key in cluster.client.processing(workers=[w2]).get(w2, ()):
            if key.startswith("onnx2fpga-build-"):
                time.sleep(3)                           # into its place and route
                cluster.procs["w2"].kill()
                killed = key[len("onnx2fpga-build-"):].rsplit("-", 2)[0]
                break
        time.sleep(0.2)
    thread.join(timeout=1800)
    cluster.start_worker("w2")                          # for the tests after this one
    assert "error" not in box, box.get("error")
    assert killed is not None, "w2 never ran a build"
    doc = box["doc"]
    rows = doc["rows"]
    assert [r["run"] for r in rows] == ["lanes2-osc-s1", "lanes2-osc-s2", "lanes8-osc-s1",
                                        "lanes8-osc-s2"]
    # Nothing lost: the killed worker's run was retried on the other one.
    assert all(r["status"] == "ok" and r["error"] is None for r in rows), rows
    assert {r["worker"] for r in rows} <= {w1, w2}
    assert next(r for r in rows if r["run"] == killed)["worker"] == w1
    saved = json.loads((out / "explore.json").read_text())
    assert saved["rows"] == rows and saved["best"] == doc["best"]

    # Each run's figures are its own build's and compile's.
    for r in rows:
        d = onnx2fpga.load(out / "runs" / r["run"])
        rep = json.loads((out / "runs" / r["run"] / "build" / "icebreaker" /
                          "report.json").read_text())
        assert (rep["seed"], rep["fmax_mhz"], rep["timing_met"]) == \
            (r["seed"], r["fmax_mhz"], r["timing_met"])
        assert rep["resources"]["lut"]["used"] == r["lut"]
        assert d.manifest["cycles_per_inference"] == r["cycles_per_inference"]
        assert r["inferences_per_second"] == round(r["fmax_mhz"] * 1e6 /
                                                   r["cycles_per_inference"], 1)
    assert max(r["cycles_per_inference"] for r in rows if r["candidate"] == "lanes8") < \
        min(r["cycles_per_inference"] for r in rows if r["candidate"] == "lanes2")

    # The Pareto fronts, by brute force over the rows.
    for cost in ("lut", "dsp"):
        for r in rows:
            dominated = any(o[cost] <= r[cost] and o["inferences_per_second"] >=
                            r["inferences_per_second"] and (o[cost] < r[cost] or
                            o["inferences_per_second"] > r["inferences_per_second"])
                            for o in rows)
            assert r[f"pareto_{cost}"] == (not dominated)
    # The chosen run: timing met, the most inferences/s at its clock, then Fmax.
    met = [r for r in rows if r["timing_met"]]
    want = max(met, key=lambda r: (r["clock_mhz"] / r["cycles_per_inference"], r["fmax_mhz"]))
    assert doc["best"] == want["run"]
    best = onnx2fpga.load(out / "best")
    assert json.loads((out / "best" / "build" / "icebreaker" / "report.json").read_text())[
        "fmax_mhz"] == want["fmax_mhz"]
    assert best.manifest["cycles_per_inference"] == want["cycles_per_inference"]
    page = (out / "explore.html").read_text()
    assert page.count("<svg") == 2 and want["run"] in page

    # Resuming a finished sweep runs nothing.
    def no_jobs(*a, **k):
        raise AssertionError("a finished run ran again")
    monkeypatch.setattr(explore_module, "run_jobs", no_jobs)
    again = explore(model, out, "icebreaker", scheduler=cluster.address, **kw)
    assert _figures(again["rows"]) == _figures(rows)
    monkeypatch.undo()

    # The same sweep on a local cluster: the same rows, workers aside.
    local = explore(model, tmp_path / "local", "icebreaker", workers=2, **kw)
    assert _figures(local["rows"]) == _figures(rows)
    assert local["best"] == doc["best"]
    assert not {r["worker"] for r in local["rows"]} & {w1, w2}


def test_simulate_and_build_seeds_on_the_cluster(cluster, tmp_path, capsys):
    """``simulate --scheduler`` splits the batch over both workers and joins the outputs in
    order, bit-exact against the golden model; ``build --seed 1,2 --scheduler`` builds each
    seed on a worker and keeps the best run's folder."""
    path = save(float_mlp((12, 8, 4), softmax=False), tmp_path / "mlp.onnx")
    cal = np.random.default_rng(0).standard_normal((64, 1, 12)).astype(np.float32)
    d = onnx2fpga.compile(path, tmp_path / "d", calibration=cal, board="icebreaker")
    x = np.random.default_rng(1).standard_normal((150, 1, 12)).astype(np.float32) * 3
    np.save(tmp_path / "x.npy", x)
    code, stdout, err = run_cli(capsys, "simulate", tmp_path / "d", "--inputs",
                                tmp_path / "x.npy", "--outputs", tmp_path / "y.npy",
                                "--scheduler", cluster.address, "--check", "--json")
    assert code == 0, err
    res = json.loads(stdout)
    assert res["golden_match"] == "150/150" and res["jobs"] == 2
    assert sorted(res["workers"]) == sorted([cluster.worker("w1"), cluster.worker("w2")])
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), run_design(d.design, x))

    report = d.build("icebreaker", seed=[1, 2], scheduler=cluster.address, progress=False)
    runs = report["seed_sweep"]
    assert [r["seed"] for r in runs] == [1, 2]
    assert {r["worker"] for r in runs} <= {cluster.worker("w1"), cluster.worker("w2")}
    want = max(runs, key=lambda r: (r["timing_met"], r["fmax_mhz"], -r["seed"]))
    assert report["seed"] == want["seed"] and report["fmax_mhz"] == want["fmax_mhz"]
    board = tmp_path / "d" / "build" / "icebreaker"
    assert json.loads((board / "report.json").read_text()) == report
    assert (board / report["bitstream"]).stat().st_size == report["bitstream_bytes"]


def test_failures_are_rows(tmp_path):
    """A run that times out is a row with its error; the sweep goes on to the end."""
    doc = explore(str(DIGITS / "model.onnx"), tmp_path / "s", "icebreaker", seeds=[1, 2],
                  foldings=[8], calibration=str(DIGITS / "calibration.npy"), timeout=0.5,
                  workers=1, progress=False)
    assert [(r["run"], r["status"]) for r in doc["rows"]] == [
        ("lanes8-osc-s1", "failed"), ("lanes8-osc-s2", "failed")]
    for r in doc["rows"]:
        assert r["error"] == "not run: its compile failed (timed out after 0.5 s)"
    assert doc["best"] is None and not (tmp_path / "s" / "best").exists()
    assert "none (no run met timing)" in (tmp_path / "s" / "explore.html").read_text()


def test_bad_sweeps_are_refused_before_any_work(tmp_path, capsys):
    model, cal = str(DIGITS / "model.onnx"), str(DIGITS / "calibration.npy")
    with pytest.raises(OptionError, match=r"^a folding is 'board', a positive number of "):
        explore(model, tmp_path / "a", "icebreaker", foldings=[0], calibration=cal)
    with pytest.raises(OptionError, match=r"^seeds must differ"):
        explore(model, tmp_path / "a", "icebreaker", seeds=[1, 1], calibration=cal)
    with pytest.raises(OptionError, match=r"^compile_options: folding cannot be set"):
        explore(model, tmp_path / "a", "icebreaker", compile_options={"folding": {}},
                calibration=cal)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("keep")
    with pytest.raises(DesignDirError, match=r"exists and is not a sweep folder"):
        explore(model, tmp_path / "full", "icebreaker", calibration=cal)
    assert (tmp_path / "full" / "mine.txt").read_text() == "keep"
    # A sweep folder of another model is not resumed with this one.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "explore.json").write_text(json.dumps(
        {"format": "onnx2fpga-explore", "model": "x.onnx", "model_sha256": "0" * 64,
         "rows": []}))
    with pytest.raises(DesignDirError, match=r"holds a sweep with other model, model_sha256"):
        explore(model, tmp_path / "other", "icebreaker", calibration=cal)
    # The command line: a one-line error, exit status 2, nothing written.
    args = ["explore", model, "-o", tmp_path / "cli", "--calibration", cal]
    for argv, message in ((["--board", "nope"], "nope"),
                          (["--board", "icebreaker", "--seeds", "1,1"], "seeds must differ")):
        code, _, err = run_cli(capsys, *args, *argv)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SystemExit) as e:
        run_cli(capsys, *args, "--board", "icebreaker", "--foldings", "2,x")
    assert e.value.code == 2
    assert "a folding is 'board', a number of lanes or @FILE.json, not 'x'" in \
        capsys.readouterr().err
    assert not (tmp_path / "cli").exists()


def test_pack_and_unpack(tmp_path):
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "a" / "x.txt").write_text("x")
    (tmp_path / "a" / "sub" / "y.bin").write_bytes(b"\0\1")
    (tmp_path / "a" / ".onnx2fpga.lock").write_text("")
    data = pack(tmp_path / "a")
    assert data == pack(tmp_path / "a")                 # the same files, the same bytes
    unpack(data, tmp_path / "b")
    assert sorted(p.relative_to(tmp_path / "b").as_posix()
                  for p in (tmp_path / "b").rglob("*") if p.is_file()) == ["sub/y.bin", "x.txt"]
    assert (tmp_path / "b" / "sub" / "y.bin").read_bytes() == b"\0\1"
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"e"))
    with pytest.raises(ValueError, match="not a file inside the folder"):
        unpack(buf.getvalue(), tmp_path / "c")
    assert not (tmp_path / "escape.txt").exists()
    os.rmdir(tmp_path / "c")
