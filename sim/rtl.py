"""RTL simulation of an emitted accelerator: Verilator on the AXI4-Stream top, driven by a
compiled C++ testbench (default) or by cocotb 2.x (the reference).

The device under test is a Verilog module with the top-level ports of every design this project
emits::

    clk, rst                                        (rst: active high, synchronous)
    s_axis_tdata, s_axis_tvalid, s_axis_tready, s_axis_tlast    (input stream, slave)
    m_axis_tdata, m_axis_tvalid, m_axis_tready, m_axis_tlast    (output stream, master)

One inference is ``in_port.beats`` input transfers of ``in_port.lanes`` elements each, packed
as :mod:`onnx2fpga.ir` says (element ``j`` of a transfer at bits ``[j*bits, (j+1)*bits)``,
two's complement when signed, unused high bits of ``tdata`` zero); the DUT answers with
``out_port.beats`` transfers and raises ``m_axis_tlast`` on the last one of each tensor.

:func:`simulate_rtl` builds the Verilog with Verilator, or reuses an earlier build, then runs
one simulation in three phases. Two testbenches (``harness``) implement the same phases and
checks:

* ``"compiled"`` (default, :mod:`onnx2fpga.sim.driver`): ``axis_driver.cpp`` is compiled
  with the design into one executable, kept in the per-user build cache
  (:func:`~.verilator_build.cache_dir`) under the hash of the Verilog's contents, the toplevel
  and the tool versions; Python writes the input beats and reads the output beats and
  figures. It runs at Verilator's own speed, and a large batch can be split over several
  processes of the executable (``jobs``).
* ``"cocotb"``: :mod:`onnx2fpga.sim._cocotb_axis` drives every clock edge from Python (about
  20,000 cycles per second); built with cocotb's runner in ``build_dir`` (shared read only by
  every process that simulates the file, under a lock, see
  :func:`~.verilator_build.shared_simulator`).

1. **Correctness**: the whole batch back to back, with random gaps in ``s_axis_tvalid`` and
   random low ``m_axis_tready`` (a seeded pattern). Every output beat is checked against the
   AXI4-Stream rules (``tvalid`` holds and ``tdata``/``tlast`` stay stable until the transfer)
   and ``tlast`` must be high on exactly the last beat of every tensor.
2. **Latency**: after the pipeline has drained, one inference with no stalls on either side;
   latency is counted from the clock edge that takes the first input beat to the clock edge
   that completes the last output beat.
3. **Initiation interval**: ``timing_runs`` inferences back to back with no stalls; the cycles
   between successive output ``tlast`` transfers, averaged over the second half of the run
   (steady state, after the pipeline has filled).

The outputs of phases 2 and 3 must equal those of phase 1 for the same inputs: a design whose
results depend on the stall pattern is reported as an error.

Each run has a folder of its own, ``build_dir/runs/run-XXXXXXXX`` (``cache_dir()/runs`` by
default) for the job files in and the results out, ``sim.log``, and ``dump.vcd`` with
``waves``, removed after the run unless ``waves`` or ``keep_run`` ask to keep it; so any
number of simulations may run at once, in threads or processes. The cocotb test module runs
inside the simulator process that :meth:`cocotb_tools.runner.Runner.test` starts, with its
folder named by the environment variable ``ONNX2FPGA_RTL_JOB``; its build briefly swaps
:data:`os.environ` (cocotb's runner reads ``PATH`` from it), so do not build with cocotb from
several threads of one process at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..ir.dataflow import Port
from .driver import Shard, SimulatorCrash, compiled_simulator, run_shards
from .verilator_build import (
    CACHE_ENV,
    MIN_VERILATOR_VERSION,
    RUNTIME_CACHE_ENV,
    RtlSimulationError,
    SimulatorBuild,
    VerilatorEnv,
    cache_dir,
    new_run_dir,
    say,
    shared_simulator,
    verilator_env,
)

logger = logging.getLogger(__name__)

__all__ = [
    "RtlSimulationError", "RtlResult", "VerilatorEnv", "verilator_env", "pack_beats",
    "unpack_beats", "simulate_rtl", "MIN_VERILATOR_VERSION", "RUNTIME_CACHE_ENV", "CACHE_ENV",
    "cache_dir", "SHARD_MIN_INPUTS", "stall_dependence",
]

#: Name of the cocotb test module the simulator loads.
_TEST_MODULE = "onnx2fpga.sim._cocotb_axis"

#: Seconds between progress lines of a long simulation.
_PROGRESS_SECONDS = 5.0

#: Environment variable naming the job folder, read by the cocotb test module.
JOB_ENV = "ONNX2FPGA_RTL_JOB"


# ---------------------------------------------------------------------------------------------
# Packing tensors into stream beats (pure numpy; shared with the host link).

def _check_port(port: Port) -> None:
    if not isinstance(port, Port):
        raise TypeError(f"Port must be an onnx2fpga.ir.Port, not {port!r}")
    if not isinstance(port.lanes, int) or port.lanes < 1:
        raise ValueError(f"Port {port.name!r}: lanes must be a positive integer, "
                         f"not {port.lanes!r}")
    if port.size % port.lanes:
        raise ValueError(f"Port {port.name!r}: size {port.size} must be a multiple of lanes "
                         f"{port.lanes}")


def _check_values(values, port: Port) -> np.ndarray:
    """``values`` as a 2-D integer array ``(n, port.size)``, range-checked for ``port``."""
    _check_port(port)
    arr = np.asarray(values)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != port.size:
        raise ValueError(f"Values for port {port.name!r} must have shape ({port.size},) or "
                         f"(n, {port.size}), not {np.shape(values)}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"Values for port {port.name!r} must be integers, not {arr.dtype}")
    t = port.type
    bad = np.flatnonzero((arr < t.lo) | (arr > t.hi))
    if bad.size:
        k = int(bad[0])
        index = tuple(int(i) for i in np.unravel_index(k, arr.shape))
        raise ValueError(f"Value {int(arr.reshape(-1)[k])} at index {index} for port "
                         f"{port.name!r} is outside {t.name} [{t.lo}, {t.hi}]")
    return arr


def pack_beats(values, port: Port) -> list[int]:
    """Pack tensors into the ``tdata`` words of their stream transfers.

    Parameters
    ----------
    values : array_like of int
        Shape ``(port.size,)`` for one tensor or ``(n, port.size)`` for ``n`` tensors, each
        flattened in C order; they travel in the port's stream order (``port.order``, e.g.
        channels-last for an image). Every value must lie in ``port.type``'s range.
    port : Port
        Gives the element type, ``lanes`` and ``tdata_width``.

    Returns
    -------
    list of int
        ``n * port.beats`` non-negative words, tensor after tensor. Element ``j`` of a beat sits
        at bits ``[j*bits, (j+1)*bits)`` in two's complement; padding bits up to
        ``port.tdata_width`` are zero.

    Raises
    ------
    TypeError
        If the values are not integers.
    ValueError
        If the shape is wrong or a value is out of range.
    """
    arr = _check_values(values, port)
    if arr.shape[0] == 0:
        return []
    packed = _packed_bytes(arr, port)
    nbytes, data = packed.shape[1], packed.tobytes()
    return [int.from_bytes(data[k:k + nbytes], "little") for k in range(0, len(data), nbytes)]


def _packed_bytes(arr: np.ndarray, port: Port) -> np.ndarray:
    """Checked values ``(n, port.size)`` as ``(n * port.beats, tdata_width // 8)`` bytes, each
    row one beat's ``tdata`` in little-endian order."""
    n = arr.shape[0]
    arr = port.to_stream(arr)
    bits = port.type.bits
    # Two's complement bit pattern of every element, as uint64 (bits <= 64).
    if arr.dtype == np.uint64:
        u = arr
    else:
        u = arr.astype(np.int64).view(np.uint64)
    shifts = np.arange(bits, dtype=np.uint64)
    bit_planes = ((u.reshape(n * port.beats, port.lanes)[..., None] >> shifts) & np.uint64(1))
    bit_planes = bit_planes.astype(np.uint8).reshape(n * port.beats, port.lanes * bits)
    pad = port.tdata_width - port.lanes * bits
    if pad:
        bit_planes = np.concatenate(
            [bit_planes, np.zeros((n * port.beats, pad), dtype=np.uint8)], axis=1)
    return np.packbits(bit_planes, axis=1, bitorder="little")


def _words32(arr: np.ndarray, port: Port) -> np.ndarray:
    """Checked values as ``(n * port.beats, ceil(tdata_width / 32))`` little-endian uint32
    words: the compiled testbench's input format."""
    packed = _packed_bytes(arr, port)
    words = -(-port.tdata_width // 32)
    padded = np.zeros((packed.shape[0], 4 * words), dtype=np.uint8)
    padded[:, :packed.shape[1]] = packed
    return padded.view("<u4")


def unpack_beats(words, port: Port) -> np.ndarray:
    """Unpack ``tdata`` words into tensors: the inverse of :func:`pack_beats`.

    Parameters
    ----------
    words : sequence of int
        ``n * port.beats`` words, each in ``[0, 2**port.tdata_width)``. Padding bits above
        ``port.lanes * port.type.bits`` are ignored.
    port : Port
        Gives the element type, ``lanes`` and ``tdata_width``.

    Returns
    -------
    numpy.ndarray
        ``int64`` array of shape ``(n, port.size)``, each tensor in C order (the stream order
        undone), sign-extended when ``port.type`` is signed (``uint64`` for an unsigned 64-bit
        type, which ``int64`` cannot hold).

    Raises
    ------
    ValueError
        If the number of words is not a multiple of ``port.beats`` or a word is out of range.
    """
    _check_port(port)
    words = [int(w) for w in words]
    if len(words) % port.beats:
        raise ValueError(f"Port {port.name!r} needs a multiple of {port.beats} words, "
                         f"not {len(words)}")
    nbytes = port.tdata_width // 8
    limit = 1 << port.tdata_width
    for k, w in enumerate(words):
        if not 0 <= w < limit:
            raise ValueError(f"Word {k} ({w:#x}) for port {port.name!r} does not fit "
                             f"{port.tdata_width} bits")
    raw = np.frombuffer(b"".join(w.to_bytes(nbytes, "little") for w in words), dtype=np.uint8)
    return _unpack_bytes(raw.reshape(len(words), nbytes), port)


def _unpack_bytes(raw: np.ndarray, port: Port) -> np.ndarray:
    """``(beats, tdata_width // 8)`` little-endian bytes into ``(n, port.size)`` tensors."""
    t = port.type
    n = raw.shape[0] // port.beats
    out_dtype = np.uint64 if (t.bits == 64 and not t.signed) else np.int64
    if n == 0:
        return np.zeros((0, port.size), dtype=out_dtype)
    bit_planes = np.unpackbits(raw, axis=1, bitorder="little")
    bit_planes = bit_planes[:, :port.lanes * t.bits].reshape(raw.shape[0], port.lanes, t.bits)
    weights = np.uint64(1) << np.arange(t.bits, dtype=np.uint64)
    u = (bit_planes.astype(np.uint64) * weights).sum(axis=2, dtype=np.uint64)
    if t.signed:
        if t.bits < 64:
            sign = np.uint64(1) << np.uint64(t.bits - 1)
            u = (u ^ sign) - sign               # sign extension in wrapping uint64 arithmetic
        out = u.view(np.int64)
    else:
        out = u.astype(out_dtype)
    return port.from_stream(out.reshape(n, port.size))


def _from_words32(words: np.ndarray, port: Port) -> np.ndarray:
    """The compiled testbench's output beats (uint32 words) as tensors."""
    raw = np.ascontiguousarray(words.astype("<u4")).view(np.uint8)
    return _unpack_bytes(raw[:, :port.tdata_width // 8], port)


# ---------------------------------------------------------------------------------------------
# Running.

def _log(progress: bool, message: str) -> None:
    say(progress, message, logger)


@dataclass(frozen=True)
class RtlResult:
    """What :func:`simulate_rtl` measured.

    Attributes
    ----------
    outputs : numpy.ndarray
        ``(batch, out_port.size)`` integers (``int64``), from the run with random stalls.
    cycles_per_inference : float or None
        Initiation interval in steady state with no stalls: mean cycles between successive
        output ``tlast`` transfers over the second half of ``timing_runs`` back-to-back
        inferences. ``None`` when ``timing_runs == 0``.
    latency_cycles : int or None
        With an empty pipeline and no stalls: clock edges from the one that takes the first
        input beat to the one that completes the last output beat (a design with one register
        stage and one beat per tensor has latency 1). ``None`` when ``timing_runs == 0``.
    total_cycles : int
        Clock cycles simulated in all, reset and every phase included, summed over the
        shards.
    stalled_cycles : int
        Cycles of the correctness phase (the whole batch with random stalls), summed over
        the shards.
    tlast_cycles : tuple of int
        Cycle numbers of the output ``tlast`` transfers in the initiation-interval phase.
    rebuilt : bool
        Whether Verilator ran (``False``: an earlier build was reused).
    build_seconds, sim_seconds : float
        Wall-clock time of the Verilator build (0 when cached) and of the simulation proper
        (the simulator processes, not the build nor Python's packing of the data).
    shards : int
        Simulator processes the batch was split over (``jobs``).
    run_dir : Path or None
        The run's folder when it was kept (``waves`` or ``keep_run``): ``dump.vcd`` (with
        ``waves``), ``sim.log`` and the job files. ``None`` when it was removed.
    """
    outputs: np.ndarray
    cycles_per_inference: float | None
    latency_cycles: int | None
    total_cycles: int
    stalled_cycles: int
    tlast_cycles: tuple[int, ...]
    rebuilt: bool
    build_seconds: float
    sim_seconds: float
    run_dir: Path | None = None
    shards: int = 1


def _port_json(port: Port) -> dict:
    return {"name": port.name, "shape": list(port.shape), "type": port.type.name,
            "scale": float(port.scale), "zero_point": int(port.zero_point),
            "lanes": int(port.lanes),
            "order": None if port.order is None else [int(i) for i in port.order]}


class _ProgressTail(threading.Thread):
    """Copies the lines the simulator appends to ``progress.log`` to our stderr."""

    def __init__(self, path: Path, enabled: bool):
        super().__init__(daemon=True)
        self.path, self.enabled = path, enabled
        self.stop_event = threading.Event()
        self.offset = 0

    def poll(self) -> None:
        if not self.enabled or not self.path.is_file():
            return
        with open(self.path) as f:
            f.seek(self.offset)
            text = f.read()
        end = text.rfind("\n") + 1
        if end:
            for line in text[:end].splitlines():
                _log(True, line)
            self.offset += len(text[:end].encode())

    def run(self) -> None:
        while not self.stop_event.wait(0.5):
            self.poll()

    def finish(self) -> None:
        self.stop_event.set()
        self.join()
        self.poll()


def _tail(path: Path, lines: int = 15) -> str:
    if not path.is_file():
        return "(no simulator log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class _NoResult(Exception):
    """The simulator ended without writing a result (the message names its log)."""


def _run_job(job: Path, build: SimulatorBuild, verilog_path: Path, toplevel: str,
             in_port: Port, out_port: Port, x: np.ndarray, stall_prob_in: float,
             stall_prob_out: float, seed: int, timing_runs: int,
             max_cycles_per_inference: int, waves: bool, progress: bool) -> RtlResult:
    """Write the job files into the run folder ``job``, run the simulator, read its result."""
    batch = int(x.shape[0])
    np.save(job / "x.npy", x.astype(np.int64) if x.dtype != np.uint64 else x)
    (job / "job.json").write_text(json.dumps({
        "in_port": _port_json(in_port), "out_port": _port_json(out_port), "batch": batch,
        "stall_prob_in": float(stall_prob_in), "stall_prob_out": float(stall_prob_out),
        "seed": int(seed), "timing_runs": int(timing_runs),
        "max_cycles_per_inference": int(max_cycles_per_inference),
        "progress_seconds": _PROGRESS_SECONDS if progress else 0,
    }, indent=1) + "\n")

    from cocotb_tools.runner import get_runner
    runner = get_runner("verilator")
    runner.log.setLevel("WARNING")
    timing = (f", then 1 + {timing_runs} without stalls for latency and interval"
              if timing_runs else "")
    _log(progress, f"simulating {toplevel!r}: {batch} inference(s) of {in_port.beats} input "
                   f"and {out_port.beats} output beats with stalls (in {stall_prob_in:g}, "
                   f"out {stall_prob_out:g}){timing}")
    tail = _ProgressTail(job / "progress.log", progress)
    tail.start()
    start = time.monotonic()
    failure = None
    try:
        runner.test(test_module=_TEST_MODULE, hdl_toplevel=toplevel,
                    hdl_toplevel_lang="verilog", build_dir=build.obj_dir, test_dir=job,
                    results_xml=str(job / "results.xml"), log_file=job / "sim.log",
                    waves=waves, extra_env={JOB_ENV: str(job), "COCOTB_ANSI_OUTPUT": "0"})
    except (RuntimeError, SystemExit, OSError) as exc:
        failure = exc
    finally:
        tail.finish()
    sim_seconds = time.monotonic() - start

    error_file, result_file = job / "error.json", job / "result.json"
    if error_file.is_file():
        message = json.loads(error_file.read_text())["message"]
        raise RtlSimulationError(message)
    if failure is not None or not result_file.is_file():
        raise _NoResult(
            f"The simulation of {verilog_path.name} ended without a result"
            f"{f' ({failure})' if failure is not None else ''}; last lines of "
            f"{job / 'sim.log'}:\n{_tail(job / 'sim.log')}")
    result = json.loads(result_file.read_text())
    outputs = np.load(job / "outputs.npy")
    res = RtlResult(
        outputs=outputs,
        cycles_per_inference=result["cycles_per_inference"],
        latency_cycles=result["latency_cycles"],
        total_cycles=int(result["total_cycles"]),
        stalled_cycles=int(result["stalled_cycles"]),
        tlast_cycles=tuple(result["tlast_cycles"]),
        rebuilt=build.rebuilt, build_seconds=build.seconds, sim_seconds=sim_seconds,
    )
    timing = (f"; {res.cycles_per_inference:g} cycles per inference, latency "
              f"{res.latency_cycles} cycles" if timing_runs else "")
    _log(progress, f"done: {batch} inference(s) in {res.total_cycles} cycles, "
                   f"{sim_seconds:.1f} s{timing}")
    return res


#: A batch is split over several simulator processes by default only from this many inputs per
#: process (fewer do not pay for the extra process and pipeline fill).
SHARD_MIN_INPUTS = 256


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _shard_count(batch: int, jobs: int | None, waves: bool) -> int:
    if jobs is None:
        if waves:
            return 1
        return max(1, min(_cores(), batch // SHARD_MIN_INPUTS))
    return min(jobs, batch)


def stall_dependence(got: np.ndarray, outputs: np.ndarray, rows, phase: str) -> str | None:
    """The error message when a run without stalls (``got[k]`` for input row ``rows[k]``)
    gave other outputs than the run with stalls (``outputs``), else ``None``; shared by the
    compiled and the cocotb testbench."""
    for k, row in enumerate(rows):
        if not np.array_equal(got[k], outputs[row]):
            diff = np.flatnonzero(got[k] != outputs[row])
            j = int(diff[0])
            return (f"{phase}: the output for input row {row} differs from the run with "
                    f"stalls at {diff.size} element(s), first element {j}: {int(got[k][j])} "
                    f"without stalls, {int(outputs[row][j])} with stalls; the design's "
                    f"results depend on the stall pattern")
    return None


def _compare(got: np.ndarray, outputs: np.ndarray, rows, phase: str) -> None:
    message = stall_dependence(got, outputs, rows, phase)
    if message is not None:
        raise RtlSimulationError(message)


def _run_compiled(job: Path, verilog_path: Path, toplevel: str, in_port: Port, out_port: Port,
                  x: np.ndarray, stall_prob_in: float, stall_prob_out: float, seed: int,
                  timing_runs: int, max_cycles_per_inference: int, waves: bool,
                  runtime_cache, progress: bool, jobs: int | None) -> RtlResult:
    sim = compiled_simulator(verilog_path, toplevel, waves=waves, runtime_cache=runtime_cache,
                             progress=progress)
    for prefix, port in (("s_axis", in_port), ("m_axis", out_port)):
        width = sim.widths[f"{prefix}_tdata"]
        if width != port.tdata_width:
            raise RtlSimulationError(
                f"{prefix}_tdata is {width} bits wide, but port {port.name!r} "
                f"(lanes={port.lanes}, {port.type.name}) needs tdata_width {port.tdata_width}")
    batch = int(x.shape[0])
    n = _shard_count(batch, jobs, waves)
    parts = np.array_split(np.arange(batch), n)
    shards = [Shard(k, len(rows), _words32(x[rows], in_port)) for k, rows in enumerate(parts)]
    dirs = [job] if n == 1 else [job / f"shard-{k}" for k in range(n)]
    for d in dirs:
        d.mkdir(exist_ok=True)
    timing = (f", then 1 + {timing_runs} without stalls for latency and interval"
              if timing_runs else "")
    _log(progress, f"simulating {toplevel!r}: {batch} inference(s) of {in_port.beats} input "
                   f"and {out_port.beats} output beats with stalls (in {stall_prob_in:g}, "
                   f"out {stall_prob_out:g}){timing}"
                   f"{f' in {n} processes' if n > 1 else ''}")
    results, seconds = run_shards(
        sim, shards, dirs, in_beats=in_port.beats, out_beats=out_port.beats,
        stall_prob_in=stall_prob_in, stall_prob_out=stall_prob_out, seed=seed,
        timing_runs=timing_runs, max_cycles_per_inference=max_cycles_per_inference,
        progress_seconds=_PROGRESS_SECONDS if progress else 0, waves=waves,
        verilog_name=verilog_path.name)
    outs = []
    for shard, (words, _) in zip(shards, results, strict=True):
        outs.append(_from_words32(words[:shard.rows * out_port.beats], out_port))
    outputs = np.concatenate(outs)
    first = results[0][1]
    ii = latency = None
    tlast: tuple[int, ...] = ()
    if timing_runs:
        words = results[0][0][shards[0].rows * out_port.beats:]
        got = _from_words32(words, out_port)
        _compare(got[:1], outputs, [0], "latency run")
        rows = [k % shards[0].rows for k in range(timing_runs)]
        _compare(got[1:], outputs, rows, "interval run")
        tlast = tuple(int(c) for c in first["tlast_cycles"].split())
        gaps = np.diff(tlast)
        ii = float(np.mean(gaps[len(gaps) // 2:]))
        latency = int(first["latency_cycles"])
    res = RtlResult(
        outputs=outputs, cycles_per_inference=ii, latency_cycles=latency,
        total_cycles=sum(int(r["total_cycles"]) for _, r in results),
        stalled_cycles=sum(int(r["stalled_cycles"]) for _, r in results),
        tlast_cycles=tlast, rebuilt=sim.rebuilt, build_seconds=sim.seconds,
        sim_seconds=seconds, shards=n)
    timing = (f"; {res.cycles_per_inference:g} cycles per inference, latency "
              f"{res.latency_cycles} cycles" if timing_runs else "")
    _log(progress, f"done: {batch} inference(s) in {res.total_cycles} cycles, "
                   f"{seconds:.1f} s ({res.total_cycles / max(seconds, 1e-9):,.0f} cycles/s)"
                   f"{timing}")
    return res


def simulate_rtl(verilog_path, in_port: Port, out_port: Port, x, *, toplevel: str = "top",
                 build_dir=None, stall_prob_in: float = 0.3, stall_prob_out: float = 0.3,
                 seed: int = 0, timing_runs: int = 8,
                 max_cycles_per_inference: int | None = None, waves: bool = False,
                 keep_run: bool = False, runtime_cache=None,
                 progress: bool = True, harness: str = "compiled",
                 jobs: int | None = None) -> RtlResult:
    """Run a batch of tensors through the Verilog accelerator and measure it.

    Parameters
    ----------
    verilog_path : str or Path
        The Verilog file (one file holding the top module and everything below it).
    in_port, out_port : Port
        Stream formats of ``s_axis`` and ``m_axis``; ``s_axis_tdata`` and ``m_axis_tdata`` must
        be ``tdata_width`` bits wide.
    x : array_like of int
        ``(batch, in_port.size)`` input tensors, flattened in C order, in ``in_port.type``'s
        range; ``batch >= 1``.
    toplevel : str
        Name of the top Verilog module.
    build_dir : str or Path, optional
        Folder for the run folders (``build_dir/runs``, one per call) and, with
        ``harness="cocotb"``, for its Verilator build (``build_dir/verilator``, reused while the
        file's contents, the toplevel and the tool versions stay the same). Default: the
        per-user build cache (:func:`~.verilator_build.cache_dir`). The compiled harness
        always keeps its simulators in that cache (``cache_dir()/sim``), keyed by the
        Verilog's contents, so a design compiled again elsewhere reuses its build.
    stall_prob_in, stall_prob_out : float
        In the correctness phase, the probability that the testbench leaves a cycle without
        ``s_axis_tvalid`` (when it could offer a beat) and holds ``m_axis_tready`` low.
        In ``[0, 1)``.
    seed : int
        Seed of the stall pattern; equal arguments (``jobs`` included) give equal cycle
        counts. The compiled harness draws from ``std::mt19937_64`` seeded with
        ``std::seed_seq{seed & 0xffffffff, seed >> 32, shard}``; the cocotb harness from
        ``numpy.random.default_rng(seed)``, so the two stall differently.
    timing_runs : int
        Back-to-back inferences of the initiation-interval phase (inputs taken from ``x``, of
        the first shard, cyclically); at least 2, or 0 to skip the latency and interval phases.
    max_cycles_per_inference : int, optional
        Cycle budget of one inference without stalls. The simulation stops with an error when
        no transfer happens on either stream for this many cycles while work is pending, or
        when a phase exceeds its budget (scaled by ``1 / (1 - stall_prob)`` on each side).
        Default ``10_000 + 100 * (in_port.beats + out_port.beats)``.
    waves : bool
        Record ``dump.vcd`` (of the first shard) in the run's folder, which is then kept
        (:attr:`RtlResult.run_dir`). Needs a build with tracing, cached beside the plain one.
    keep_run : bool
        Keep the run's folder (job files, ``sim.log``) after a successful run; it is also kept
        when the simulator ends without a result (the error names its ``sim.log``) and
        removed in every other case.
    runtime_cache : str or Path, optional
        Folder for Verilator's precompiled runtime objects, which every build links.
        Default: ``$ONNX2FPGA_VERILATOR_CACHE`` if set, else ``cache_dir()/verilator-runtime``.
    progress : bool
        Print build and simulation progress to stderr (also logged through ``logging``).
    harness : str
        ``"compiled"`` (default): a C++ testbench compiled with the design drives the streams,
        at Verilator's speed. ``"cocotb"``: the Python cocotb testbench (about 20,000 cycles
        per second), kept as the reference.
    jobs : int, optional
        Simulator processes the batch is split over (compiled harness): contiguous shards of
        the inputs, outputs joined in input order; latency and interval come from the first
        shard, ``stalled_cycles`` and ``total_cycles`` are summed. Default: one per available
        core, but no more than one per :data:`SHARD_MIN_INPUTS` inputs (so a batch under
        512 runs in one process) and one with ``waves``. Cycle counts depend on the number
        of shards; pass ``jobs`` for counts that do not depend on the machine.

    Returns
    -------
    RtlResult

    Raises
    ------
    RtlSimulationError
        Verilator or a build tool is missing, the build fails, a cycle limit is exceeded,
        ``tdata`` widths differ from the ports, ``tlast`` is on the wrong beats, a stream rule
        is broken, or outputs depend on the stall pattern.
    TypeError, ValueError
        For malformed arguments.
    """
    verilog_path = Path(verilog_path).resolve()
    if not verilog_path.is_file():
        raise ValueError(f"Verilog file {str(verilog_path)!r} does not exist")
    if not isinstance(toplevel, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", toplevel):
        raise ValueError(f"Toplevel must be a Verilog module name, not {toplevel!r}")
    for name, p in (("stall_prob_in", stall_prob_in), ("stall_prob_out", stall_prob_out)):
        if not isinstance(p, (int, float)) or not 0 <= p < 1:
            raise ValueError(f"{name} must be a number in [0, 1), not {p!r}")
    if not isinstance(timing_runs, int) or timing_runs == 1 or timing_runs < 0:
        raise ValueError(f"timing_runs must be 0 or an integer >= 2, not {timing_runs!r}")
    if not isinstance(seed, (int, np.integer)) or seed < 0 or seed >= 1 << 64:
        raise ValueError(f"Seed must be a non-negative integer, not {seed!r}")
    if harness not in ("compiled", "cocotb"):
        raise ValueError(f"harness must be 'compiled' or 'cocotb', not {harness!r}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs must be a positive integer, not {jobs!r}")
    if harness == "cocotb" and jobs not in (None, 1):
        raise ValueError(f"jobs={jobs} needs harness='compiled' (the cocotb harness runs one "
                         f"process)")
    if harness == "cocotb" and importlib.util.find_spec("cocotb") is None:
        raise RtlSimulationError("harness='cocotb' needs cocotb, which is not installed: "
                                 "pip install 'onnx2fpga[simboard]'")
    _check_port(in_port)
    _check_port(out_port)
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != in_port.size or x.shape[0] < 1:
        raise ValueError(f"x must have shape (batch, {in_port.size}) with batch >= 1, "
                         f"not {x.shape}")
    _check_values(x, in_port)                   # type and range check before any build
    if max_cycles_per_inference is None:
        max_cycles_per_inference = 10_000 + 100 * (in_port.beats + out_port.beats)
    if not isinstance(max_cycles_per_inference, int) or max_cycles_per_inference < 1:
        raise ValueError(f"max_cycles_per_inference must be a positive integer, "
                         f"not {max_cycles_per_inference!r}")

    keep = bool(waves or keep_run)
    if harness == "compiled":
        job = new_run_dir(cache_dir() if build_dir is None else Path(build_dir).resolve())
        try:
            res = _run_compiled(job, verilog_path, toplevel, in_port, out_port, x,
                                stall_prob_in, stall_prob_out, seed, timing_runs,
                                max_cycles_per_inference, waves, runtime_cache, progress, jobs)
        except SimulatorCrash:
            keep = True                         # the message names the run's sim.log
            raise
        finally:
            if not keep:
                shutil.rmtree(job, ignore_errors=True)
    else:
        if build_dir is None:
            ident = hashlib.sha256(f"{verilog_path}\0{toplevel}".encode()).hexdigest()[:16]
            build_dir = cache_dir() / "cocotb" / ident
        build_dir = Path(build_dir).resolve()
        with shared_simulator(verilog_path, toplevel, build_dir, waves=waves,
                              runtime_cache=runtime_cache, progress=progress) as build:
            job = new_run_dir(build_dir)
            try:
                res = _run_job(job, build, verilog_path, toplevel, in_port, out_port, x,
                               stall_prob_in, stall_prob_out, seed, timing_runs,
                               max_cycles_per_inference, waves, progress)
            except _NoResult as exc:
                keep = True                     # the message names the run's sim.log
                raise RtlSimulationError(str(exc)) from None
            finally:
                if not keep:
                    shutil.rmtree(job, ignore_errors=True)
    if keep:
        res = dataclasses.replace(res, run_dir=job)
        _log(progress, f"kept the run's files{' (dump.vcd)' if waves else ''} in {job}")
    return res
