"""A cluster job's child process: ``python -m onnx2fpga.jobs JOB_DIR`` runs the compile, build
or simulation that ``JOB_DIR/job.json`` describes on the files beside it, and writes
``JOB_DIR/result.json`` (its result, or its error in one line) and ``JOB_DIR/out.tar.gz``
(the folder it made). :func:`onnx2fpga.cluster.run_job` starts it on a Dask worker."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from .api import compile as compile_
from .api import load
from .cluster import BUILD_DROP, pack, unpack
from .errors import Onnx2FpgaError

__all__ = ["main"]


def _compile_job(work: str, args: dict) -> tuple[dict, str]:
    kwargs = dict(args)
    for name in ("calibration.npy", "calibration.npz"):
        if os.path.isfile(os.path.join(work, name)):
            kwargs["calibration"] = os.path.join(work, name)
    out = os.path.join(work, "design")
    d = compile_(os.path.join(work, "model.onnx"), out, verbose=True, **kwargs)
    m = d.manifest
    return {"cycles_per_inference": m["cycles_per_inference"],
            "latency_cycles": m["latency_cycles"], "resources": m.get("resources"),
            "verilog_sha256": m["top"]["verilog_sha256"], "folding": m.get("folding")}, out


def _build_job(work: str, args: dict) -> tuple[dict, str]:
    folder = os.path.join(work, "design")
    with open(os.path.join(work, "design.tar.gz"), "rb") as f:
        unpack(f.read(), folder)
    d = load(folder)
    board = args.pop("board")
    report = d.build(board, progress=True, **args)
    netlist = f"{d.module}.json"            # yosys' netlist: tens of MB on large designs
    for path, _dirs, files in os.walk(os.path.join(folder, "build")):
        for name in files:
            if name.endswith(BUILD_DROP) or name == netlist:
                os.remove(os.path.join(path, name))
    return report, folder


def _simulate_job(work: str, args: dict) -> tuple[dict, str]:
    import numpy as np

    folder = os.path.join(work, "design")
    with open(os.path.join(work, "design.tar.gz"), "rb") as f:
        unpack(f.read(), folder)
    d = load(folder)
    with np.load(os.path.join(work, "x.npz"), allow_pickle=False) as z:
        x = {k: z[k] for k in z.files}
    if args.pop("array"):
        x = x["x"]
    y = d.simulate(x, engine="rtl", progress=False, **args)
    out = os.path.join(work, "y")
    os.makedirs(out)
    np.savez(os.path.join(out, "y.npz"), **(y if isinstance(y, dict) else {"": y}))
    return {"last_run": d.last_run, "several": isinstance(y, dict)}, out


def _orphan_watch() -> None:
    """Kill this job's process group (the job and the tools it runs) once the worker that
    started it is gone: a killed worker leaves no place and route running for nobody."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os.killpg(0, signal.SIGKILL)
    threading.Thread(target=watch, daemon=True, name="onnx2fpga-orphan-watch").start()


def main(work: str) -> int:
    """The job's child process: run ``work/job.json`` and write ``work/result.json`` (and
    ``work/out.tar.gz``, what it made)."""
    _orphan_watch()

    with open(os.path.join(work, "job.json"), encoding="utf-8") as f:
        job = json.load(f)
    fn = {"compile": _compile_job, "build": _build_job, "simulate": _simulate_job}[job["kind"]]
    res = {"result": None, "error": None}
    try:
        result, made = fn(work, dict(job["args"]))
        skip = ("sim_build/",) if job["kind"] != "simulate" else ()
        data = pack(made, skip=skip)
        with open(os.path.join(work, "out.tar.gz"), "wb") as f:
            f.write(data)
        res["result"] = result
    except Onnx2FpgaError as e:
        res["error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
    except Exception as e:  # noqa: BLE001 - a job reports every failure as its row
        res["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:500]
    with open(os.path.join(work, "result.json"), "w", encoding="utf-8") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
