"""Design-space exploration: compile a model at several foldings, build each at several seeds
and clocks on a Dask cluster, and report the Pareto front.

>>> doc = onnx2fpga.explore("kws.onnx", "sweep/", board="ulx3s-85f", seeds=[1, 2, 3, 4],
...                         targets=[200e3, 800e3], foldings=["board"], clock_mhz=[100])
...                                                                     # doctest: +SKIP

A *candidate* is one compile of the model: ``"board"`` (the fastest folding whose estimate
fits the board), a lane budget (an integer: ``max_lanes``), a per-layer folding (a dict, as
:func:`onnx2fpga.compile`'s ``folding``), or a rate (``targets``: the cheapest folding reaching
so many inferences per second at the run's clock). A *run* is one build of a candidate at a
seed and a clock. Each candidate compiles once on a worker; its runs build on workers as soon
as it has (:mod:`onnx2fpga.cluster`: files travel with the jobs).

The folder ``DIR`` holds ``explore.json`` (the sweep's options and one row per run, written
after every run, so an interrupted sweep resumes where it stopped), ``runs/KEY/`` (each
finished run's design folder with its ``build/BOARD/``), ``explore.html`` (the Pareto fronts
and every row) and ``best/`` (a copy of the chosen run's folder).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import numbers
import os
import shutil
import time

from .cluster import connect, run_jobs, unpack, worker_count
from .designdir import atomic_write
from .dse_html import write_html
from .errors import DesignDirError, OptionError
from .log import get_logger, say

__all__ = ["explore", "FORMAT", "FIGURES", "pareto"]

_log = get_logger(__name__)

FORMAT = "onnx2fpga-explore"
#: A row's columns that a run's results decide (the same sweep gives the same figures on
#: any cluster; ``worker``, ``host`` and the times are where and how long it ran).
FIGURES = ("run", "candidate", "folding", "seed", "clock_mhz", "status", "error",
           "cycles_per_inference", "latency_cycles", "fmax_mhz", "timing_met", "lut", "ff",
           "dsp", "bram", "inferences_per_second")
#: Compile options a sweep passes to every candidate's compile.
COMPILE_OPTIONS = ("lenient", "weight_bits", "activation_bits", "per_channel", "pow2_scales",
                   "multiplier_bits", "requant", "utilization", "optimize", "adder_levels",
                   "weights", "architecture", "allow_host_compute")


def explore(model, output_dir, board: str, *, seeds=None, foldings=None, targets=None,
            clock_mhz=None, pnr_options: str | None = None, scheduler=None,
            workers: int | None = None, calibration=None, compile_options: dict | None = None,
            timeout: float | None = None, retry_failed: bool = False,
            progress: bool = True) -> dict:
    """Run the sweep and return ``explore.json``'s content (``rows``, ``best``: the chosen
    run's key or None).

    Parameters
    ----------
    model : path to an ONNX file
    output_dir : path
        The sweep's folder: new, empty, or a sweep of the same model, board and options,
        which resumes (its finished runs are kept, the others run).
    board : str
        The board to build for (``onnx2fpga boards``).
    seeds : list of int
        nextpnr placement seeds (default ``[1]``).
    foldings : list
        Candidates: ``"board"``, an int (a lane budget), a dict (per-layer folding).
        Default ``["board"]`` when ``targets`` is not given either.
    targets : list of float
        Candidates that reach this many inferences per second at the run's clock.
    clock_mhz : list of float
        Clocks to build at (default: the board's oscillator).
    pnr_options : str
        More nextpnr options for every build (:meth:`~onnx2fpga.api.CompiledDesign.build`).
    scheduler : str or distributed.Client
        ``tcp://HOST:PORT`` of a Dask scheduler; without it a local cluster, ``workers``
        processes (default one per core).
    calibration : array or path to .npy / .npz
        For a float model (:func:`onnx2fpga.compile`).
    compile_options : dict
        More :func:`onnx2fpga.compile` options for every candidate (:data:`COMPILE_OPTIONS`).
    timeout : float
        Seconds a compile or a build may take; beyond it the run is a failed row.
    retry_failed : bool
        On resume, run the failed runs again too (by default a failed run is a result).

    The chosen run (``best``, copied to ``DIR/best/``): among runs that met timing, the
    most inferences per second at the clock it was built for, then the highest Fmax, then
    the fewest LUTs, then the first in sweep order.
    """
    from .boards.targets import get_board

    t0 = time.monotonic()
    target = get_board(board)
    seeds = _seeds(seeds)
    clocks = _clocks(clock_mhz)
    opts = _compile_options(compile_options)
    candidates = _candidates(foldings, targets, clocks, target, opts)
    out = os.fspath(output_dir)
    model_bytes, model_name = _read_model(model)
    cal = _calibration_file(calibration)
    files = {"model.onnx": model_bytes, **cal}
    header = {"format": FORMAT, "model": model_name,
              "model_sha256": hashlib.sha256(model_bytes).hexdigest(),
              "calibration_sha256": next((hashlib.sha256(v).hexdigest()
                                          for v in cal.values()), None),
              "board": target.name,
              "compile_options": opts, "pnr_options": pnr_options}
    doc = _open_folder(out, header)
    _check_model(model, calibration, [_compile_args(c, k, opts, target) for c in candidates
                                      for k in (c["clocks"] or [None])])
    runs = {}                               # run key -> (candidate, seed, clock), sweep order
    for cand in candidates:
        for clock in (cand["clocks"] or clocks):
            for seed in seeds:
                runs[_run_key(cand["id"], clock, seed)] = (cand, seed, clock)
    rows = {r["run"]: r for r in doc["rows"]}
    todo = [k for k in runs if k not in rows or (retry_failed and rows[k]["status"] != "ok")]
    say(_log, f"explore: {len(runs)} runs ({len(candidates)} candidates x {len(seeds)} seeds"
              f"{f' x {len(clocks)} clocks' if len(clocks) > 1 else ''}) for {target.name}; "
              f"{len(runs) - len(todo)} done already, {len(todo)} to run", progress)
    jobs, compiled, finished = {}, {}, []
    for key in todo:
        cand, seed, clock = runs[key]
        ckey = _compile_key(cand, clock)
        if ckey not in jobs:
            jobs[ckey] = ({"kind": "compile", "args": _compile_args(cand, clock, opts, target),
                           "files": files, "timeout": timeout}, None)
        jobs[key] = ({"kind": "build", "timeout": timeout,
                      "args": {"board": target.name, "seed": seed, "clock_mhz": clock,
                               "pnr_options": pnr_options}}, ckey)
    if jobs:
        with connect(scheduler, workers=workers, progress=progress) as client:
            doc["workers"] = worker_count(client)

            def done(key, outcome):
                if outcome["kind"] == "compile":
                    compiled[key] = outcome
                    if not outcome["ok"]:
                        say(_log, f"explore: compile of {key} failed: {outcome['error']}",
                            progress)
                    return
                cand, seed, clock = runs[key]
                row = _row(key, cand, seed, clock, outcome,
                           compiled.get(_compile_key(cand, clock)), target)
                if outcome["ok"]:
                    folder = os.path.join(out, "runs", key)
                    shutil.rmtree(folder, ignore_errors=True)
                    unpack(outcome["files"], folder)
                rows[key] = row
                finished.append(key)
                _save(out, doc, rows, runs)
                say(_log, f"explore: {len(finished)}/{len(todo)} {_say_row(row)}", progress)

            run_jobs(client, jobs, done, progress=progress, what="compiles and builds")
    doc["wall_seconds"] = round(doc.get("wall_seconds", 0) + time.monotonic() - t0, 1)
    _save(out, doc, rows, runs, final=True)
    return doc


def pareto(points) -> list[bool]:
    """For ``(cost, value)`` pairs, whether each is on the Pareto front: no other point costs
    as little or less and gives as much or more, one of the two strictly."""
    flags = []
    for i, (c, v) in enumerate(points):
        flags.append(not any((c2 <= c and v2 >= v) and (c2 < c or v2 > v)
                             for j, (c2, v2) in enumerate(points) if j != i))
    return flags


def _save(out, doc, rows, runs, final=False) -> None:
    order = list(runs) + sorted(k for k in rows if k not in runs)
    doc["rows"] = [rows[k] for k in order if k in rows]
    ok = [r for r in doc["rows"] if r["status"] == "ok" and r["fmax_mhz"]]
    for cost in ("lut", "dsp"):
        flags = pareto([(r[cost], r["inferences_per_second"]) for r in ok])
        for r in doc["rows"]:
            r[f"pareto_{cost}"] = False
        for r, f in zip(ok, flags):
            r[f"pareto_{cost}"] = f
    met = [r for r in ok if r["timing_met"]]
    best = min(met, key=lambda r: (-(r["clock_mhz"] / r["cycles_per_inference"]),
                                   -r["fmax_mhz"], r["lut"], order.index(r["run"])),
               default=None)
    doc["best"] = best["run"] if best else None
    doc["run_seconds"] = round(sum(r["wall_seconds"] or 0 for r in doc["rows"]), 1)
    atomic_write(os.path.join(out, "explore.json"), json.dumps(doc, indent=1) + "\n")
    if final:
        best_dir = os.path.join(out, "best")
        shutil.rmtree(best_dir, ignore_errors=True)
        if best:
            shutil.copytree(os.path.join(out, "runs", best["run"]), best_dir)
        write_html(os.path.join(out, "explore.html"), doc)


def _row(key, cand, seed, clock, outcome, compiled, target) -> dict:
    rep = outcome["result"] if outcome["ok"] else None
    comp = (compiled or {}).get("result") or {}
    res = (rep or {}).get("resources") or {}
    cycles = comp.get("cycles_per_inference")
    fmax = rep.get("fmax_mhz") if rep else None
    row = {"run": key, "candidate": cand["id"], "folding": cand["describe"], "seed": seed,
           "clock_mhz": rep["clock_mhz"] if rep else (clock or target.clock_mhz),
           "status": "ok" if rep else "failed", "error": outcome["error"],
           "cycles_per_inference": cycles, "latency_cycles": comp.get("latency_cycles"),
           "fmax_mhz": fmax, "timing_met": rep.get("timing_met") if rep else None}
    for k in ("lut", "ff", "dsp", "bram"):
        row[k] = res.get(k, {}).get("used") if rep else None
    row["inferences_per_second"] = (round(fmax * 1e6 / cycles, 1)
                                    if fmax and cycles else None)
    row["wall_seconds"] = outcome["seconds"]
    row["compile_seconds"] = (compiled or {}).get("seconds")
    row["worker"] = outcome["worker"]
    row["host"] = outcome["host"]
    row["compile_worker"] = (compiled or {}).get("worker")
    return row


def _say_row(row) -> str:
    where = f" on {row['worker']}" if row["worker"] else ""
    if row["status"] != "ok":
        return f"{row['run']}{where}: failed: {row['error']}"
    met = "timing met" if row["timing_met"] else "timing NOT met"
    return (f"{row['run']}{where}: {row['fmax_mhz']:.1f} MHz ({met}), {row['lut']} LUT, "
            f"{row['dsp']} DSP, {row['inferences_per_second']:,.0f} inferences/s at Fmax "
            f"[{row['wall_seconds']:.0f} s]")


# -- options ----------------------------------------------------------------------------------

def _seeds(seeds) -> list[int]:
    seeds = [1] if seeds is None else list(seeds) if isinstance(seeds, (list, tuple)) \
        else [seeds]
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0
                        for s in seeds):
        raise OptionError(f"seeds must be non-negative integers, not {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise OptionError(f"seeds must differ, not {seeds!r}")
    return seeds


def _clocks(clock_mhz) -> list:
    if clock_mhz is None:
        return [None]
    clocks = list(clock_mhz) if isinstance(clock_mhz, (list, tuple)) else [clock_mhz]
    if not clocks or any(isinstance(c, bool) or not isinstance(c, numbers.Real)
                         or not 0 < c < math.inf for c in clocks):
        raise OptionError(f"clock_mhz must be positive numbers of MHz, not {clock_mhz!r}")
    if len(set(clocks)) != len(clocks):
        raise OptionError(f"clocks must differ, not {clocks!r}")
    return [float(c) for c in clocks]


def _compile_options(options) -> dict:
    opts = dict(options or {})
    bad = sorted(set(opts) - set(COMPILE_OPTIONS))
    if bad:
        raise OptionError(f"compile_options: {', '.join(bad)} cannot be set per sweep (it "
                          f"takes {', '.join(COMPILE_OPTIONS)}; the folding comes from "
                          f"foldings and targets)")
    return dict(sorted(opts.items()))


def _candidates(foldings, targets, clocks, target, opts) -> list[dict]:
    from .steps import FAMILIES

    if foldings is None and not targets:
        foldings = ["board"]
    foldable = target.family in FAMILIES
    board = {"board": target.name} if foldable else {}
    out = []
    for f in foldings or ():
        if f == "board":
            if not foldable:
                raise OptionError(f"folding 'board' needs resource estimates of "
                                  f"{target.name}'s device ({target.family}); give lane "
                                  f"budgets or targets instead")
            out.append({"id": "board", "describe": f"fastest that fits {target.name}",
                        "compile": dict(board), "clocks": None})
        elif isinstance(f, int) and not isinstance(f, bool) and f >= 1:
            out.append({"id": f"lanes{f}", "describe": f"at most {f} multiply lanes",
                        "compile": dict(board, max_lanes=f), "clocks": None})
        elif isinstance(f, dict) and f:
            text = json.dumps(f, sort_keys=True)
            tag = hashlib.sha256(text.encode()).hexdigest()[:8]
            out.append({"id": f"folding-{tag}", "describe": f"per layer {text}",
                        "compile": dict(board, folding=f), "clocks": None})
        else:
            raise OptionError(f"a folding is 'board', a positive number of lanes or a "
                              f"per-layer folding dict, not {f!r}")
    for fps in targets or ():
        if isinstance(fps, bool) or not isinstance(fps, numbers.Real) or \
                not 0 < fps < math.inf:
            raise OptionError(f"targets must be positive inferences per second, not {fps!r}")
        out.append({"id": f"fps{fps:g}", "describe": f"{fps:g} inferences/s at the clock",
                    "compile": dict(board, target_fps=float(fps)), "clocks": clocks})
    ids = [c["id"] for c in out]
    if len(set(ids)) != len(ids):
        raise OptionError(f"foldings and targets name the same candidate twice ({ids})")
    return out


def _compile_args(cand, clock, opts, target) -> dict:
    """:func:`onnx2fpga.compile`'s options for ``cand`` (at ``clock`` for a rate)."""
    args = dict(opts, **cand["compile"])
    if cand["clocks"]:
        args["clock_mhz"] = clock if clock is not None else target.clock_mhz
    return args


def _run_key(cid, clock, seed) -> str:
    return f"{cid}-{'osc' if clock is None else f'{clock:g}mhz'}-s{seed}"


def _compile_key(cand, clock) -> str:
    if cand["clocks"]:
        return f"{cand['id']}@{'osc' if clock is None else f'{clock:g}mhz'}"
    return cand["id"]


def _read_model(model) -> tuple[bytes, str]:
    if not isinstance(model, (str, os.PathLike)):
        raise OptionError("explore takes the model as a path to its .onnx file (the workers "
                          "receive its bytes)")
    path = os.fspath(model)
    try:
        with open(path, "rb") as f:
            return f.read(), os.path.basename(path)
    except OSError as e:
        raise OptionError(f"{path}: cannot read the model ({e.strerror})") from None


def _calibration_file(calibration) -> dict:
    import numpy as np

    if calibration is None:
        return {}
    if isinstance(calibration, (str, os.PathLike)):
        path = os.fspath(calibration)
        ext = ".npz" if path.endswith(".npz") else ".npy"
        try:
            with open(path, "rb") as f:
                return {f"calibration{ext}": f.read()}
        except OSError as e:
            raise OptionError(f"{path}: cannot read the calibration data ({e.strerror})") \
                from None
    buf = io.BytesIO()
    if isinstance(calibration, dict):
        np.savez(buf, **calibration)
        return {"calibration.npz": buf.getvalue()}
    np.save(buf, np.asarray(calibration), allow_pickle=False)
    return {"calibration.npy": buf.getvalue()}


def _check_model(model, calibration, compiles) -> None:
    """Every compile's options, and the model through loading and checking, before any
    job: a bad input is one line here, not a failed row per run."""
    import tempfile

    from .api import compile as compile_
    from .steps import check_options, default_utilization, fold_options

    for c in compiles:
        check_options(c.get("weight_bits", 8), c.get("activation_bits", 8),
                      c.get("multiplier_bits"), c.get("folding"), c.get("requant"),
                      c.get("adder_levels"))
        util = c.get("utilization")
        fold_options(c.get("board"), c.get("target_fps"), c.get("clock_mhz"),
                     default_utilization(c.get("board")) if util is None else util,
                     c.get("max_lanes"), optimize=c.get("optimize", "throughput"),
                     weights=c.get("weights", "auto"),
                     architecture=c.get("architecture", "auto"), folding=c.get("folding"))
    with tempfile.TemporaryDirectory(prefix="onnx2fpga-check-") as tmp:
        lenient = bool(compiles and compiles[0].get("lenient"))
        compile_(model, os.path.join(tmp, "d"), calibration=calibration, lenient=lenient,
                 stop_after="load")


def _open_folder(out: str, header: dict) -> dict:
    """The sweep's document: the one in ``out`` if it is a sweep with the same header, a new
    one if ``out`` is new or empty; anything else is refused, nothing in it touched."""
    path = os.path.join(out, "explore.json")
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise DesignDirError(f"{path}: cannot read the sweep to resume ({e})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise DesignDirError(f"{path}: not an onnx2fpga sweep")
        differ = [k for k in header if doc.get(k) != header[k]]
        if differ:
            raise DesignDirError(f"{out}: holds a sweep with other {', '.join(differ)}; "
                                 f"resume it with the same ones or choose another folder")
        doc.setdefault("rows", [])
        return doc
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise DesignDirError(f"{out}: exists and is not a sweep folder (explore.json); "
                             f"choose a new or empty folder")
    try:
        os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    except OSError as e:
        raise DesignDirError(f"{out}: cannot create ({e.strerror})") from None
    return dict(header, rows=[])
