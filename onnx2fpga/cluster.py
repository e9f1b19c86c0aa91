"""Running compiles, builds and RTL simulations on a Dask cluster.

A *job* is one unit of work that runs on a Dask worker: ``"compile"`` (a model into a design
folder), ``"build"`` (a design folder into a bitstream for a board) or ``"simulate"`` (a design
folder on a batch of inputs). Everything a job needs travels with it (the model's bytes, a
design folder packed as a tar archive, the inputs as ``.npz``) and everything it makes comes
back the same way, so workers need only the package installed, no shared file system.

On the worker a job runs in a child process (``python -m onnx2fpga.jobs JOB_DIR``): a
timeout kills it and its tools, a crash stays a crash of that job, and the worker's own
process stays small. A job never raises: what goes wrong is its ``error`` (one line), so a
sweep goes on. :func:`run_jobs` adds what the cluster does to a job: a worker that dies while
running it has the scheduler retry it on another worker (``distributed``'s
``allowed-failures``); a job that keeps killing workers, or that the cluster loses, comes back
as a failed outcome naming why.

:func:`connect` opens the client: to a running scheduler (``tcp://HOST:PORT``, from ``dask
scheduler``, ``dask-jobqueue``'s ``SLURMCluster`` and the like), or, without an address, to a
local cluster of one single-threaded worker process per core.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time

from .errors import OptionError
from .extras import require
from .log import get_logger, say

__all__ = ["connect", "pack", "unpack", "run_job", "run_jobs", "worker_count", "JOB_KINDS",
           "BUILD_DROP"]

_log = get_logger(__name__)

#: What a job can do.
JOB_KINDS = ("compile", "build", "simulate")

#: Large intermediates of a board's build folder that do not travel back from a build job:
#: the RTLIL, the routed iCE40 ASCII and ECP5 text configurations (the bitstream, the
#: build's scripts, logs and reports do; so does the synthesized netlist's name below).
BUILD_DROP = (".il", ".asc", ".config")


def connect(scheduler=None, *, workers: int | None = None, progress: bool = True):
    """A ``distributed.Client``, as a context manager: on the cluster whose scheduler is at
    ``scheduler`` (``tcp://HOST:PORT``; an existing ``Client`` is used as it is), or (None or
    ``"local"``) on a local cluster of ``workers`` single-threaded worker processes (default:
    one per core) that closes with the context."""
    require("cluster", "Running on a Dask cluster")
    if scheduler == "local":
        scheduler = None
    if scheduler is not None and not isinstance(scheduler, str):
        return contextlib.nullcontext(scheduler)           # a Client the caller owns
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise OptionError(f"workers must be a positive integer, not {workers!r}")
    return _client(scheduler, workers, progress)


@contextlib.contextmanager
def _client(scheduler, workers, progress):
    import dask
    from distributed import Client, LocalCluster

    if scheduler is not None:
        if not scheduler.startswith(("tcp://", "tls://", "inproc://", "ws://", "wss://")):
            raise OptionError(f"scheduler must be an address like tcp://HOST:PORT, not "
                              f"{scheduler!r}")
        try:
            client = Client(scheduler, timeout="20s")
        except OSError as e:
            raise OptionError(f"cannot reach the Dask scheduler at {scheduler} ({e})") \
                from None
        with client:
            say(_log, f"cluster: scheduler {scheduler}, {worker_count(client)} workers",
                progress)
            yield client
        return
    n = workers or os.cpu_count() or 1
    # Worker processes of their own, one thread each: a job's child process does the work,
    # so a worker needs little memory and no more than one job at a time per core.
    with dask.config.set({"distributed.worker.daemon": False,
                          "distributed.logging.distributed": "error"}), \
            LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                         dashboard_address=":0", host="127.0.0.1",
                         silence_logs=40) as cluster, Client(cluster) as client:
        say(_log, f"cluster: local, {n} worker{'s' if n > 1 else ''}", progress)
        yield client


def worker_count(client) -> int:
    """Workers the client's scheduler has now."""
    return len(client.scheduler_info().get("workers", {}))


def pack(folder, *, skip=()) -> bytes:
    """``folder``'s files as a gzipped tar archive, in sorted order with fixed times and
    owners (the same files give the same bytes). Paths relative to ``folder`` that start
    with one of ``skip`` are left out, and so are lock files."""
    folder = os.fspath(folder)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for path, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(files):
                full = os.path.join(path, name)
                rel = os.path.relpath(full, folder).replace(os.sep, "/")
                if name == ".onnx2fpga.lock" or any(rel.startswith(s) for s in skip) \
                        or not os.path.isfile(full):
                    continue
                info = tarfile.TarInfo(rel)
                info.size = os.path.getsize(full)
                info.mode = 0o644
                with open(full, "rb") as f:
                    tar.addfile(info, f)
    return buf.getvalue()


def unpack(data: bytes, folder) -> None:
    """Unpack an archive of :func:`pack` into ``folder`` (created). Only regular files with
    relative paths inside ``folder`` are taken: an archive is data, not instructions."""
    folder = os.path.abspath(os.fspath(folder))
    os.makedirs(folder, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            target = os.path.abspath(os.path.join(folder, member.name))
            if not member.isfile() or os.path.isabs(member.name) or \
                    os.path.commonpath([folder, target]) != folder:
                raise ValueError(f"archive member {member.name!r} is not a file inside the "
                                 f"folder")
            os.makedirs(os.path.dirname(target), exist_ok=True)
            src = tar.extractfile(member)
            with open(target, "wb") as f:
                shutil.copyfileobj(src, f)


def _worker_name() -> str:
    try:
        from distributed import get_worker
        return get_worker().address
    except (ImportError, ValueError):
        return f"local:{socket.gethostname()}:{os.getpid()}"


def run_job(job: dict, inputs: dict | None = None) -> dict:
    """Run ``job`` here (on a worker: the task Dask runs) and return its outcome, never
    raising: ``{"ok", "error", "result", "files", "worker", "host", "seconds"}``.

    ``job``: ``{"kind": one of JOB_KINDS, "args": {...}, "files": {name: bytes},
    "timeout": seconds or None}``. ``inputs``: the outcome of the job it depends on (a
    build's compile); its archive becomes the design folder, its failure this one's.
    """
    t0 = time.monotonic()
    out = {"ok": False, "error": None, "result": None, "files": None,
           "worker": _worker_name(), "host": socket.gethostname(), "seconds": 0.0}
    if inputs is not None and not inputs.get("ok"):
        out["error"] = f"not run: its {inputs.get('kind', 'compile')} failed ({inputs['error']})"
        return out
    files = dict(job.get("files") or {})
    if inputs is not None:
        files["design.tar.gz"] = inputs["files"]
    work = tempfile.mkdtemp(prefix="onnx2fpga-job-")
    try:
        for name, data in files.items():
            with open(os.path.join(work, name), "wb") as f:
                f.write(data)
        with open(os.path.join(work, "job.json"), "w", encoding="utf-8") as f:
            json.dump({"kind": job["kind"], "args": job.get("args") or {}}, f)
        timeout = job.get("timeout")
        log_path = os.path.join(work, "job.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "onnx2fpga.jobs", work],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                out["error"] = f"timed out after {timeout:g} s"
            except BaseException:
                _kill_group(proc)
                raise
        result_path = os.path.join(work, "result.json")
        if out["error"] is None and os.path.isfile(result_path):
            with open(result_path, encoding="utf-8") as f:
                res = json.load(f)
            out["error"] = res.get("error")
            out["result"] = res.get("result")
            out["ok"] = out["error"] is None
            made = os.path.join(work, "out.tar.gz")
            if os.path.isfile(made):
                with open(made, "rb") as f:
                    out["files"] = f.read()
        elif out["error"] is None:
            out["error"] = (f"the job's process ended with status {proc.returncode} and no "
                            f"result: {_last_line(log_path)}")
    except OSError as e:
        out["error"] = f"on {out['host']}: {e}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
        out["seconds"] = round(time.monotonic() - t0, 1)
    return out


def _kill_group(proc) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _last_line(path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "no output"


def run_jobs(client, jobs, on_done, *, progress: bool = True, what: str = "jobs",
             heartbeat: float = 60.0) -> None:
    """Submit ``jobs`` (``key -> (job, key of the job it needs, or None)``) to ``client``
    and call ``on_done(key, outcome)`` in this thread as each one ends, in the order they
    end; every ``heartbeat`` seconds without an end, a progress line says how many run. A
    job that the cluster loses (its workers died ``allowed-failures`` times, the scheduler
    went away) ends as an outcome with ``ok`` false and the reason."""
    from distributed import wait

    futures, keys = {}, {}
    stamp = f"{os.getpid()}-{time.time_ns()}"
    for key, (job, after) in jobs.items():
        dep = futures.get(after) if after is not None else None
        fut = client.submit(run_job, job, dep, key=f"onnx2fpga-{job['kind']}-{key}-{stamp}",
                            pure=False)
        futures[key], keys[fut.key] = fut, key
    pending, done, start = set(futures.values()), 0, time.monotonic()
    while pending:
        try:
            finished, pending = wait(pending, timeout=heartbeat, return_when="FIRST_COMPLETED")
        except TimeoutError:
            running = sum(len(v) for v in client.processing().values())
            say(_log, f"cluster: {done}/{len(futures)} {what} done, {running} running on "
                      f"{worker_count(client)} workers [{_minutes(time.monotonic() - start)}]",
                progress)
            continue
        for fut in sorted(finished, key=lambda f: list(futures).index(keys[f.key])):
            key = keys[fut.key]
            try:
                outcome = fut.result()
            except Exception as e:  # noqa: BLE001 - what the cluster raises is this job's row
                outcome = {"ok": False, "error": _cluster_error(e), "result": None,
                           "files": None, "worker": None, "host": None, "seconds": None}
            outcome["kind"] = jobs[key][0]["kind"]
            done += 1
            on_done(key, outcome)
    for fut in futures.values():
        fut.release()


def _minutes(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def _cluster_error(e: BaseException) -> str:
    name = type(e).__name__
    if name == "KilledWorker":
        return f"lost: every worker that ran it died ({e})"
    if name == "CancelledError":
        return "lost: cancelled by the cluster (the scheduler restarted or went away)"
    return f"{name}: {e}"


def _design_archive(directory) -> bytes:
    """A design folder without its builds and simulator builds: what a job needs of it."""
    return pack(directory, skip=("build/", "sim_build/"))


def simulate_sharded(design, x, scheduler=None, *, workers=None, stall_in=0.3,
                     stall_out=0.3, seed=0, progress=False):
    """Run ``design`` (a :class:`~onnx2fpga.api.CompiledDesign`) in RTL simulation on the
    batch ``x`` split into shards over a Dask cluster (``scheduler``: its address or a
    ``Client``; None: a local cluster), one shard per worker but at least
    :data:`SHARD_MIN` inputs each, and join the outputs in order. Returns ``(y, figures)``:
    ``y`` as :meth:`~onnx2fpga.api.CompiledDesign.simulate` returns it, ``figures`` its
    ``last_run`` with ``workers`` (the worker of each shard)."""
    import numpy as np

    from .errors import Onnx2FpgaError

    n = int(len(next(iter(x.values())) if isinstance(x, dict) else x))
    archive = _design_archive(design.directory)
    t0 = time.monotonic()
    with connect(scheduler, workers=workers, progress=progress) as client:
        shards = max(1, min(worker_count(client) or 1, -(-n // SHARD_MIN)))
        bounds = np.linspace(0, n, shards + 1).astype(int)
        jobs = {}
        for i in range(shards):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            part = {k: v[lo:hi] for k, v in x.items()} if isinstance(x, dict) else \
                {"x": x[lo:hi]}
            buf = io.BytesIO()
            np.savez(buf, **part)
            jobs[i] = ({"kind": "simulate", "files": {"design.tar.gz": archive,
                                                       "x.npz": buf.getvalue()},
                        "args": {"stall_in": stall_in, "stall_out": stall_out,
                                 "seed": int(seed), "jobs": 1,
                                 "array": not isinstance(x, dict)}}, None)
        say(_log, f"cluster: {n} inputs in {shards} shards", progress)
        outcomes = {}
        run_jobs(client, jobs, lambda k, o: outcomes.__setitem__(k, o), progress=progress,
                 what="simulation shards")
    ys, runs = [], []
    for i in range(shards):
        o = outcomes[i]
        if not o["ok"]:
            raise Onnx2FpgaError(f"simulation shard {i + 1}/{shards} (inputs {bounds[i]}.."
                                 f"{bounds[i + 1] - 1}) failed on {o['worker']}: {o['error']}")
        with tempfile.TemporaryDirectory(prefix="onnx2fpga-shard-") as tmp:
            unpack(o["files"], tmp)
            with np.load(os.path.join(tmp, "y.npz"), allow_pickle=False) as z:
                ys.append({k: z[k] for k in z.files})
        runs.append((o["result"]["last_run"], o["worker"]))
    several = outcomes[0]["result"]["several"]
    y = {k: np.concatenate([p[k] for p in ys]) for k in ys[0]}
    y = y if several else y[""]
    seconds = time.monotonic() - t0
    total = sum(r["total_cycles"] for r, _ in runs)
    figures = {"cycles_per_inference": max(r["cycles_per_inference"] for r, _ in runs),
               "latency_cycles": max(r["latency_cycles"] for r, _ in runs),
               "total_cycles": total, "sim_seconds": round(seconds, 3),
               "cycles_per_second": round(total / max(seconds, 1e-9)), "jobs": shards,
               "inferences": n, "workers": [w for _, w in runs]}
    return y, figures


#: Fewest inputs a simulation shard gets: each shard builds (or finds in its worker's cache)
#: the Verilator model and pays its start-up.
SHARD_MIN = 64


def build_seeds(design, board: str, seeds, scheduler=None, *, workers=None, args=None,
                progress=True) -> tuple[dict, bytes, list[dict]]:
    """Build ``design`` for ``board`` once per seed as jobs on a Dask cluster. Returns the
    best run's report and the archive of its design folder, by the rule of a local seed
    sweep (timing met, then the highest Fmax, then the lowest seed), and every run's
    ``{"seed", "fmax_mhz", "timing_met", "seconds", "worker", "error"}`` in seed order."""
    from .errors import Onnx2FpgaError

    archive = _design_archive(design.directory)
    jobs = {s: ({"kind": "build", "files": {"design.tar.gz": archive},
                 "args": dict(args or {}, board=board, seed=s)}, None) for s in seeds}
    outcomes = {}
    with connect(scheduler, workers=workers, progress=progress) as client:
        run_jobs(client, jobs, lambda k, o: outcomes.__setitem__(k, o), progress=progress,
                 what="seeds")
    runs = []
    for s in seeds:
        o = outcomes[s]
        rep = o["result"] if o["ok"] else {}
        runs.append({"seed": s, "fmax_mhz": rep.get("fmax_mhz"),
                     "timing_met": rep.get("timing_met"), "seconds": o["seconds"],
                     "worker": o["worker"], "error": o["error"]})
    good = [r for r in runs if r["error"] is None]
    if not good:
        raise Onnx2FpgaError(f"{board}: the build failed for every seed; seed {seeds[0]}: "
                             f"{runs[0]['error']}")
    best = max(good, key=lambda r: (bool(r["timing_met"]), r["fmax_mhz"] or 0, -r["seed"]))
    o = outcomes[best["seed"]]
    return o["result"], o["files"], runs
