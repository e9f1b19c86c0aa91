"""Figures measured by an RTL simulation, kept in the design folder as ``measured.json``.

:meth:`onnx2fpga.api.CompiledDesign.simulate` with ``engine="rtl"`` writes the file after
every run (atomically: a reader sees the previous run's file or this one's, whole); the
report (:mod:`onnx2fpga.report`) shows it beside the cost model's estimates. It records the
Verilog it measured (the manifest's ``verilog_sha256``), so figures of another design are
never shown as this one's. It is not among the files the manifest hashes, and ``--force``
may replace a folder holding it (:data:`onnx2fpga.designdir.OWN_ENTRIES`).

Fields: ``format`` (``"onnx2fpga-measured"``), ``verilog_sha256``, ``date`` (UTC, ISO 8601),
``simulator`` (``"Verilator 5.048"``, or ``"Verilator"`` when its version is unknown),
``inputs`` (inferences simulated), ``stall_in``, ``stall_out``, ``seed`` (the random
stalls of the correctness run), ``stalled_cycles`` (that run's cycles),
``cycles_per_inference`` (initiation interval without stalls) and ``latency_cycles``
(see :class:`onnx2fpga.sim.rtl.RtlResult`), ``total_cycles``, ``sim_seconds``,
``cycles_per_second`` and ``jobs`` (simulator processes).
"""

from __future__ import annotations

import datetime
import json
import os

from .designdir import atomic_write

__all__ = ["MEASURED", "write_measured", "read_measured"]

MEASURED = "measured.json"
_FORMAT = "onnx2fpga-measured"


def write_measured(directory, manifest: dict, result, *, inputs: int, stall_in: float,
                   stall_out: float, seed: int, simulator: str) -> dict:
    """Write ``measured.json`` for ``result`` (an :class:`~onnx2fpga.sim.rtl.RtlResult`);
    returns what it wrote."""
    def number(v):
        return None if v is None else (int(v) if float(v).is_integer() else float(v))

    record = {
        "format": _FORMAT,
        "verilog_sha256": manifest["top"]["verilog_sha256"],
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "simulator": simulator,
        "inputs": int(inputs),
        "stall_in": float(stall_in), "stall_out": float(stall_out), "seed": int(seed),
        "stalled_cycles": int(result.stalled_cycles),
        "cycles_per_inference": number(result.cycles_per_inference),
        "latency_cycles": number(result.latency_cycles),
        "total_cycles": int(result.total_cycles),
        "sim_seconds": round(float(result.sim_seconds), 4),
        "cycles_per_second": round(result.total_cycles / max(float(result.sim_seconds), 1e-9)),
        "jobs": int(result.shards),
    }
    atomic_write(os.path.join(os.fspath(directory), MEASURED),
                 json.dumps(record, indent=1) + "\n")
    return record


def read_measured(directory, manifest: dict) -> dict | None:
    """The measured figures of this design's Verilog, or ``None`` when there are none (no
    file, a damaged one, or one measured on other Verilog)."""
    try:
        with open(os.path.join(os.fspath(directory), MEASURED), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != _FORMAT:
        return None
    if record.get("verilog_sha256") != manifest.get("top", {}).get("verilog_sha256"):
        return None
    return record
