"""The compiled AXI4-Stream harness: Verilator builds the design together with a C++ testbench
(``axis_driver.cpp``, shipped in this package) into one executable, kept in the per-user build
cache, and Python only writes the job, runs the executable and reads its results.

Building (:func:`compiled_simulator`): ``verilator --cc --exe`` with ``--prefix Vdut`` (the
model class has one name whatever the toplevel is called), then ``make``. The executable is
stored in ``cache_dir()/sim/<key>/`` where the key is the SHA-256 of the Verilog's contents,
the toplevel, the Verilator and C++ compiler versions, the testbench's source, the build
options and ``waves``; so a design compiled again into a new folder reuses it. An entry is
built in a temporary folder and renamed into place whole, under an exclusive
:func:`fcntl.flock` on ``<key>.lock`` so that of several processes wanting the same entry one
builds and the others wait and reuse it; a reader never sees a half-written entry (it only
looks at complete, renamed folders). Verilator's runtime objects come from
:class:`~.verilator_build.RuntimeCache` as for the cocotb harness.

Running (:func:`run_shards`): one process per shard of the batch, all of the same executable,
each with a job folder of its own (``job.txt``, ``input.bin`` in; ``outputs.bin``,
``result.txt`` or ``error.txt`` out; ``dump.vcd`` with waves).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .verilator_build import (
    RtlSimulationError,
    RuntimeCache,
    VerilatorEnv,
    cache_dir,
    cxx_identity,
    first_errors,
    lock,
    runtime_folder,
    say,
    verilator_env,
)

logger = logging.getLogger(__name__)

__all__ = ["DRIVER_SOURCE", "VERILATOR_ARGS", "MAKE_VARS", "CompiledSimulator",
           "compiled_simulator", "Shard", "run_shards", "SimulatorCrash"]

#: The C++ testbench compiled into every simulator.
DRIVER_SOURCE = Path(__file__).with_name("axis_driver.cpp")

#: Verilator options of the compiled harness: optimized model, X values resolved once at
#: build time, no assertions. The C++ is compiled with Verilator's default -Os: on the CNN
#: example -O2 (``-CFLAGS -O2``) doubled the compile's CPU time (22 s against 12 s) and
#: ran no faster (0.93-0.98 s against 0.88-0.91 s of CPU for 517,775 cycles).
VERILATOR_ARGS = ("-Wno-fatal", "-O3", "--x-assign", "fast", "--x-initial", "fast",
                  "--noassert")

#: make variables of the build: the code that runs once (constructors, initial values; a
#: third of the C++) unoptimized, which takes 2.4 s to compile on the CNN example, not 5.
MAKE_VARS = ("OPT_SLOW=-O0",)

#: The ports every design has (see :mod:`onnx2fpga.sim.rtl`).
AXIS_PORTS = ("clk", "rst", "s_axis_tdata", "s_axis_tvalid", "s_axis_tready", "s_axis_tlast",
              "m_axis_tdata", "m_axis_tvalid", "m_axis_tready", "m_axis_tlast")

_PORT_DECL = re.compile(r"VL_(?:IN|OUT)(?:8|16|64|W)?\(&(\w+),(\d+),(\d+)")


class SimulatorCrash(RtlSimulationError):
    """A simulator process ended without a result (the message names its ``sim.log``)."""


@dataclass(frozen=True)
class CompiledSimulator:
    """A simulator in the build cache.

    Attributes
    ----------
    executable : Path
        Run it with a job file: ``executable job.txt``.
    widths : dict
        Bit width of each top-level port, read from Verilator's model header.
    rebuilt : bool
        Whether this call built it (``False``: found in the cache).
    seconds : float
        Wall-clock time of that build (0 when found).
    """
    executable: Path
    widths: dict
    rebuilt: bool
    seconds: float


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _cache_key(verilog: bytes, toplevel: str, venv: VerilatorEnv, waves: bool) -> str:
    doc = {"verilog_sha256": _sha256(verilog), "toplevel": toplevel,
           "verilator": list(venv.version), "verilator_root": str(venv.root or venv.executable),
           "cxx": cxx_identity(), "driver_sha256": _sha256(DRIVER_SOURCE.read_bytes()),
           "args": list(VERILATOR_ARGS), "make": list(MAKE_VARS), "waves": bool(waves),
           "env": {k: os.environ.get(k, "") for k in ("CXXFLAGS", "CPPFLAGS", "LDFLAGS")}}
    return _sha256(json.dumps(doc, sort_keys=True).encode())[:32]


def _load(entry: Path) -> CompiledSimulator | None:
    meta = entry / "meta.json"
    if not (meta.is_file() and (entry / "sim").is_file()):
        return None
    doc = json.loads(meta.read_text())
    return CompiledSimulator(entry / "sim", doc["widths"], False, 0.0)


def _run(cmd: list[str], cwd: Path, env: dict, log: Path) -> bool:
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
    return proc.returncode == 0


def _build(verilog_path: Path, verilog: bytes, toplevel: str, venv: VerilatorEnv, waves: bool,
           runtime: RuntimeCache, work: Path, failed_log: Path, progress: bool
           ) -> tuple[dict, bool]:
    """Verilate and compile into ``work``; returns the port widths and whether the cached
    runtime objects were linked (``False``: compiled for this build)."""
    staging = None
    if re.search(r"\s", str(work)):
        # GNU make refuses to build in a path with whitespace (verilated.mk); the executable
        # does not depend on where it was built.
        staging = Path(tempfile.mkdtemp(prefix="onnx2fpga-verilator-"))
    try:
        return _build_in(staging or work, verilog_path, verilog, toplevel, venv, waves,
                         runtime, work, failed_log, progress)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _build_in(where: Path, verilog_path: Path, verilog: bytes, toplevel: str,
              venv: VerilatorEnv, waves: bool, runtime: RuntimeCache, work: Path,
              failed_log: Path, progress: bool) -> tuple[dict, bool]:
    obj = where / "obj"
    log = work / "build.log"
    env = venv.environ()
    cmd = [str(venv.executable), "--cc", "--exe", *VERILATOR_ARGS, "--top-module", toplevel,
           "--prefix", "Vdut", "-Mdir", str(obj), "-o", "sim",
           *(["--trace"] if waves else []), str(DRIVER_SOURCE), str(verilog_path)]

    def fail(what: str):
        shutil.copy(log, failed_log)
        raise RtlSimulationError(
            f"Verilator build of {verilog_path} (toplevel {toplevel!r}) failed:\n{what}\n"
            f"(full log: {failed_log})") from None

    if not _run(cmd, work, env, log):
        fail(first_errors(log.read_text(errors="replace")))
    header = (obj / "Vdut.h").read_text()
    widths = {m.group(1): int(m.group(2)) - int(m.group(3)) + 1
              for m in _PORT_DECL.finditer(header)}
    for name in AXIS_PORTS:
        if name not in widths:
            raise RtlSimulationError(f"Toplevel {toplevel!r} has no port {name!r}")
    jobs = f"-j{max(1, min(4, os.cpu_count() or 1))}"
    make = ["make", "-s", jobs, "-f", "Vdut.mk", f"VM_TRACE={int(waves)}", *MAKE_VARS]
    built = False
    overrides = runtime.make_overrides() if runtime.ready() else None
    if overrides:
        env2 = dict(env)
        env2["MAKEFLAGS"] = " ".join(filter(None, [env.get("MAKEFLAGS", ""), overrides]))
        built = _run(make, obj, env2, log) and runtime.matches(obj)
        if not built:
            say(progress, f"cached runtime objects in {runtime.path} not usable; building "
                          f"them", logger)
    reused = built
    if not built:
        if not _run(make, obj, env, log):
            fail(first_errors(log.read_text(errors="replace")))
        runtime.store(obj)
    if _sha256(verilog_path.read_bytes()) != _sha256(verilog):
        raise RtlSimulationError(f"{verilog_path} changed while Verilator built it; run again")
    shutil.copy2(obj / "sim", work / "sim")
    shutil.rmtree(obj)
    return widths, reused


def compiled_simulator(verilog_path, toplevel: str, *, waves: bool = False, runtime_cache=None,
                       progress: bool = True, venv: VerilatorEnv | None = None
                       ) -> CompiledSimulator:
    """The simulator of ``verilog_path`` with the compiled testbench, from the build cache or
    built now (see the module docstring). Safe to call from several processes at once.

    Raises
    ------
    RtlSimulationError
        Verilator or a build tool is missing, the build fails, or a port is missing.
    """
    verilog_path = Path(verilog_path)
    verilog = verilog_path.read_bytes()
    venv = verilator_env() if venv is None else venv
    folder = cache_dir() / "sim"
    key = _cache_key(verilog, toplevel, venv, waves)
    entry = folder / key
    found = _load(entry)
    if found is not None:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        lock(fd, fcntl.LOCK_EX, progress,
             f"waiting for another process building the simulator of {verilog_path.name}")
        found = _load(entry)
        if found is not None:
            return found
        runtime = RuntimeCache(runtime_folder(runtime_cache), venv, waves, makefile="Vdut.mk",
                               flavour={"harness": "compiled", "args": list(VERILATOR_ARGS)})
        lines = verilog.count(b"\n")
        say(progress, f"building simulator for {verilog_path.name} ({lines} lines, toplevel "
                      f"{toplevel!r}) with Verilator {venv.version[0]}.{venv.version[1]:03d}"
                      f"{' and tracing' if waves else ''}"
                      f"{', reusing its runtime objects' if runtime.ready() else ''} "
                      f"into {entry}", logger)
        start = time.monotonic()
        work = folder / f".tmp-{os.getpid()}-{secrets.token_hex(8)}"
        work.mkdir()
        try:
            widths, reused = _build(verilog_path, verilog, toplevel, venv, waves, runtime, work,
                            folder / f"{key}.failed.log", progress)
            seconds = time.monotonic() - start
            (work / "meta.json").write_text(json.dumps(
                {"verilog": str(verilog_path), "toplevel": toplevel, "widths": widths,
                 "verilator": list(venv.version), "build_seconds": round(seconds, 3),
                 "runtime_objects": "reused" if reused else "compiled"},
                indent=1) + "\n")
            if entry.exists():                  # left incomplete by hand; we hold the lock
                shutil.rmtree(entry)
            work.rename(entry)                  # atomic: the entry appears complete
        finally:
            shutil.rmtree(work, ignore_errors=True)
        say(progress, f"built in {seconds:.1f} s", logger)
        return CompiledSimulator(entry / "sim", widths, True, seconds)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Shard:
    """One simulator process's part of a batch and what it measured.

    ``words_in``: ``(rows * in_beats, in_words)`` uint32 input beats. After the run,
    ``outputs`` holds the output beats of the correctness, latency and interval phases in
    that order (``(beats, out_words)`` uint32) and ``result`` the ``result.txt`` figures.
    """
    index: int
    rows: int
    words_in: np.ndarray


def _job_text(fields: dict) -> str:
    return "".join(f"{k} {v}\n" for k, v in fields.items())


def _parse_result(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        out[key] = value
    return out


def run_shards(sim: CompiledSimulator, shards: list[Shard], job_dirs: list[Path], *,
               in_beats: int, out_beats: int, stall_prob_in: float, stall_prob_out: float,
               seed: int, timing_runs: int, max_cycles_per_inference: int,
               progress_seconds: float, waves: bool, verilog_name: str
               ) -> tuple[list[tuple[np.ndarray, dict]], float]:
    """Run every shard in a process of its own, all at once; shard 0 alone runs the timing
    phases. Returns ``(outputs, result)`` per shard and the wall-clock seconds of the runs.

    Raises
    ------
    RtlSimulationError
        With the testbench's message when a shard breaks a stream rule or a cycle budget
        (the first such shard's), or naming the log when a simulator fails otherwise.
    """
    in_words = shards[0].words_in.shape[1]
    out_words = (sim.widths["m_axis_tdata"] + 31) // 32
    procs = []
    for shard, job in zip(shards, job_dirs, strict=True):
        shard.words_in.astype("<u4").tofile(job / "input.bin")
        tag = f"shard {shard.index + 1}/{len(shards)}: " if len(shards) > 1 else ""
        (job / "job.txt").write_text(_job_text({
            "batch": shard.rows, "in_beats": in_beats, "out_beats": out_beats,
            "in_words": in_words, "out_words": out_words,
            "stall_prob_in": repr(float(stall_prob_in)),
            "stall_prob_out": repr(float(stall_prob_out)), "seed": int(seed),
            "shard": shard.index, "timing_runs": timing_runs if shard.index == 0 else 0,
            "max_cycles_per_inference": max_cycles_per_inference,
            "progress_seconds": progress_seconds, "tag": tag,
            "input": job / "input.bin", "outputs": job / "outputs.bin",
            "result": job / "result.txt", "error": job / "error.txt",
            "vcd": job / "dump.vcd" if waves and shard.index == 0 else "",
        }))
    start = time.monotonic()
    codes = []
    try:
        for job in job_dirs:
            log = open(job / "sim.log", "w")
            procs.append((log, None))
            procs[-1] = (log, subprocess.Popen(
                [str(sim.executable), str(job / "job.txt")], cwd=job, stdout=log,
                stderr=None if progress_seconds else log))
        for _, proc in procs:
            codes.append(proc.wait())
    except OSError as exc:
        raise RtlSimulationError(f"Cannot run the simulator {sim.executable}: {exc}") from None
    finally:
        # On an error or an interrupt, no simulator outlives the call.
        for log, proc in procs:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    seconds = time.monotonic() - start
    for job, code in zip(job_dirs, codes, strict=True):
        if (job / "error.txt").is_file():
            raise RtlSimulationError((job / "error.txt").read_text().strip())
    out = []
    for shard, job, code in zip(shards, job_dirs, codes, strict=True):
        if code or not (job / "result.txt").is_file():
            log = (job / "sim.log").read_text(errors="replace").strip().splitlines()[-15:]
            raise SimulatorCrash(
                f"The simulation of {verilog_name} ended without a result (exit code {code}); "
                f"last lines of {job / 'sim.log'}:\n" + "\n".join(log))
        words = np.fromfile(job / "outputs.bin", dtype="<u4").reshape(-1, out_words)
        out.append((words, _parse_result((job / "result.txt").read_text())))
    return out, seconds
