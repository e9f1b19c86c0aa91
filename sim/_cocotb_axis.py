"""The cocotb test that :func:`onnx2fpga.sim.rtl.simulate_rtl` runs inside the simulator with
``harness="cocotb"`` (the reference for the compiled testbench, ``axis_driver.cpp``).

Not for direct use: it reads its job from the folder named by ``ONNX2FPGA_RTL_JOB`` (see
:mod:`onnx2fpga.sim.rtl` for the phases and the files) and writes ``outputs.npy`` and
``result.json``, or ``error.json`` with a message for the caller.

One coroutine drives both streams, so every transfer gets an exact cycle number. Each cycle it
sets the testbench's outputs just after the rising edge, then samples the handshake in the
read-only phase; a transfer happens at the next edge exactly when ``tvalid`` and ``tready``
are both high in that sample. The stall decisions come from
``numpy.random.default_rng(seed)``, so a run is reproducible.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from ..ir.dataflow import Port
from ..ir.types import IntType
from .rtl import JOB_ENV, pack_beats, stall_dependence, unpack_beats

__all__ = ["run_axis"]

#: Idle cycles between phases, with ``m_axis_tready`` high: any extra output beat shows here.
_DRAIN_CYCLES = 16
_RESET_CYCLES = 4


class StreamError(Exception):
    """The design broke the stream contract (reported to the caller as is)."""


def _port(doc: dict) -> Port:
    return Port(doc["name"], tuple(doc["shape"]), IntType.parse(doc["type"]), doc["scale"],
                doc["zero_point"], doc["lanes"], doc.get("order"))


class _Coins:
    """Seeded stream of stall decisions, drawn in blocks for speed."""

    def __init__(self, rng: np.random.Generator, prob: float):
        self.rng, self.prob = rng, prob
        self.block: list[bool] = []

    def stall(self) -> bool:
        if self.prob == 0:
            return False
        if not self.block:
            self.block = (self.rng.random(4096) < self.prob).tolist()
        return self.block.pop()


class _Bench:
    def __init__(self, dut, job: Path, cfg: dict):
        self.dut, self.job, self.cfg = dut, job, cfg
        self.in_port, self.out_port = _port(cfg["in_port"]), _port(cfg["out_port"])
        self.edge = RisingEdge(dut.clk)
        self.read_only = ReadOnly()
        self.cycle = 0
        self.max_cycles = cfg["max_cycles_per_inference"]
        self.progress_seconds = cfg["progress_seconds"]
        self.progress_path = job / "progress.log"
        self.start_time = self.last_report = time.monotonic()

    def progress(self, text: str) -> None:
        """Append a line to ``progress.log``, which the caller copies to its stderr."""
        self.last_report = time.monotonic()
        with open(self.progress_path, "a") as f:
            f.write(f"{text} (cycle {self.cycle}, {self.last_report - self.start_time:.1f} s)\n")

    def check_ports(self) -> None:
        dut = self.dut
        for name in ("clk", "rst", "s_axis_tdata", "s_axis_tvalid", "s_axis_tready",
                     "s_axis_tlast", "m_axis_tdata", "m_axis_tvalid", "m_axis_tready",
                     "m_axis_tlast"):
            if not hasattr(dut, name):
                raise StreamError(f"Toplevel {dut._name!r} has no port {name!r}")
        for prefix, port in (("s_axis", self.in_port), ("m_axis", self.out_port)):
            width = len(getattr(dut, f"{prefix}_tdata"))
            if width != port.tdata_width:
                raise StreamError(
                    f"{prefix}_tdata is {width} bits wide, but port {port.name!r} "
                    f"(lanes={port.lanes}, {port.type.name}) needs tdata_width "
                    f"{port.tdata_width}")

    async def tick(self, n: int = 1) -> None:
        for _ in range(n):
            await self.edge
            self.cycle += 1

    async def reset(self) -> None:
        dut = self.dut
        dut.rst.value = 1
        dut.s_axis_tvalid.value = 0
        dut.s_axis_tlast.value = 0
        dut.s_axis_tdata.value = 0
        dut.m_axis_tready.value = 0
        await self.tick(_RESET_CYCLES)
        dut.rst.value = 0
        await self.tick(1)

    async def drain(self, phase: str) -> None:
        """Idle with ``m_axis_tready`` high; no output beat may appear."""
        dut = self.dut
        dut.s_axis_tvalid.value = 0
        dut.m_axis_tready.value = 1
        for _ in range(_DRAIN_CYCLES):
            await self.read_only
            if dut.m_axis_tvalid.value:
                raise StreamError(
                    f"{phase}: the design sent more than the expected "
                    f"{self.out_port.beats} output beats per inference (m_axis_tvalid high "
                    f"{self.cycle} cycles into the simulation, after the last expected beat)")
            await self.tick()
        dut.m_axis_tready.value = 0

    async def phase(self, x: np.ndarray, stall_in: float, stall_out: float, rng,
                    phase: str, report: bool = False):
        """Stream the tensors ``x`` through; returns output words and cycle stamps."""
        dut = self.dut
        s_tdata, s_tvalid, s_tlast, s_tready = (dut.s_axis_tdata, dut.s_axis_tvalid,
                                                dut.s_axis_tlast, dut.s_axis_tready)
        m_tdata, m_tvalid, m_tlast, m_tready = (dut.m_axis_tdata, dut.m_axis_tvalid,
                                                dut.m_axis_tlast, dut.m_axis_tready)
        in_beats, out_beats = self.in_port.beats, self.out_port.beats
        n = x.shape[0]
        words_in = pack_beats(x, self.in_port)
        n_in, n_out = len(words_in), n * out_beats
        coins_in, coins_out = _Coins(rng, stall_in), _Coins(rng, stall_out)
        slow = 1.0 / ((1.0 - stall_in) * (1.0 - stall_out))
        budget = int(self.max_cycles * n * slow) + 100
        start_cycle = last_progress = self.cycle

        i = 0                      # next input beat to offer
        holding = False            # s_axis_tvalid is high with beat i
        valid_driven = False
        ready_driven = False
        pending = None             # (tdata, tlast) seen with tvalid high and tready low
        words_out: list[int] = []
        first_in_cycles: list[int] = []
        last_out_cycles: list[int] = []

        while len(words_out) < n_out:
            # Drive for this cycle. AXI4-Stream: once tvalid is high it stays high, with the
            # same payload, until the transfer.
            if not holding and i < n_in and not coins_in.stall():
                s_tdata.value = words_in[i]
                s_tlast.value = int(i % in_beats == in_beats - 1)
                holding = True
            if holding != valid_driven:
                s_tvalid.value = int(holding)
                valid_driven = holding
            ready = not coins_out.stall()
            if ready != ready_driven:
                m_tready.value = int(ready)
                ready_driven = ready

            await self.read_only
            cycle = self.cycle
            if holding and s_tready.value:
                if i % in_beats == 0:
                    first_in_cycles.append(cycle)
                i += 1
                holding = False
                last_progress = cycle
            if m_tvalid.value:
                data, last = int(m_tdata.value), int(m_tlast.value)
                if pending is not None and pending != (data, last):
                    raise StreamError(
                        f"{phase}: m_axis_tdata/tlast changed from {pending[0]:#x}/{pending[1]} "
                        f"to {data:#x}/{last} while m_axis_tvalid was high and m_axis_tready "
                        f"low (output beat {len(words_out)}, cycle {cycle}); AXI4-Stream "
                        f"requires them to hold until the transfer")
                if ready:
                    k = len(words_out)
                    want = int(k % out_beats == out_beats - 1)
                    if last != want:
                        raise StreamError(
                            f"{phase}: m_axis_tlast was {last} on output beat {k % out_beats} "
                            f"of inference {k // out_beats}; it must be high on beat "
                            f"{out_beats - 1} only (out_port.beats = {out_beats})")
                    words_out.append(data)
                    if last:
                        last_out_cycles.append(cycle)
                        done = len(last_out_cycles)
                        if report and self.progress_seconds and \
                                time.monotonic() - self.last_report >= self.progress_seconds:
                            self.progress(f"{phase}: {done}/{n} inferences")
                    pending = None
                    last_progress = cycle
                else:
                    pending = (data, last)
            elif pending is not None:
                raise StreamError(
                    f"{phase}: m_axis_tvalid fell without a transfer (output beat "
                    f"{len(words_out)}, cycle {cycle}); AXI4-Stream requires it to hold "
                    f"until m_axis_tready")

            if cycle - last_progress > self.max_cycles or cycle - start_cycle > budget:
                why = (f"no transfer for {self.max_cycles} cycles"
                       if cycle - last_progress > self.max_cycles
                       else f"the phase exceeded its budget of {budget} cycles")
                raise StreamError(
                    f"{phase}: simulation stopped at cycle {cycle}, {why} "
                    f"(max_cycles_per_inference={self.max_cycles}); the design accepted {i} of "
                    f"{n_in} input beats and sent {len(words_out)} of {n_out} output beats "
                    f"(s_axis_tready={int(s_tready.value)}, "
                    f"m_axis_tvalid={int(m_tvalid.value)})")
            await self.tick()

        if i != n_in:
            raise StreamError(f"{phase}: the design sent all {n_out} output beats after taking "
                              f"only {i} of {n_in} input beats")
        s_tvalid.value = 0
        m_tready.value = 0
        return words_out, first_in_cycles, last_out_cycles, self.cycle - start_cycle

    async def run(self) -> dict:
        cfg = self.cfg
        x = np.load(self.job / "x.npy")
        batch, runs = cfg["batch"], cfg["timing_runs"]
        self.check_ports()
        Clock(self.dut.clk, 10, unit="ns").start()
        await self.reset()
        rng = np.random.default_rng(cfg["seed"])

        words, _, _, stalled = await self.phase(
            x, cfg["stall_prob_in"], cfg["stall_prob_out"], rng, "correctness run", report=True)
        outputs = unpack_beats(words, self.out_port)
        await self.drain("correctness run")

        result = {"cycles_per_inference": None, "latency_cycles": None, "tlast_cycles": [],
                  "stalled_cycles": stalled}
        if runs:
            words, first_in, last_out, _ = await self.phase(x[:1], 0.0, 0.0, rng, "latency run")
            self.compare(unpack_beats(words, self.out_port), outputs, [0], "latency run")
            result["latency_cycles"] = last_out[0] - first_in[0]
            await self.drain("latency run")

            rows = [k % batch for k in range(runs)]
            words, _, last_out, _ = await self.phase(x[rows], 0.0, 0.0, rng, "interval run")
            self.compare(unpack_beats(words, self.out_port), outputs, rows, "interval run")
            await self.drain("interval run")
            gaps = np.diff(last_out)
            steady = gaps[len(gaps) // 2:]
            result["cycles_per_inference"] = float(np.mean(steady))
            result["tlast_cycles"] = [int(c) for c in last_out]
        result["total_cycles"] = self.cycle
        np.save(self.job / "outputs.npy", outputs)
        return result

    def compare(self, got, outputs, rows, phase) -> None:
        message = stall_dependence(got, outputs, rows, phase)
        if message is not None:
            raise StreamError(message)


@cocotb.test()
async def run_axis(dut):
    """Run the job in ``$ONNX2FPGA_RTL_JOB`` and write its result files."""
    job = Path(os.environ[JOB_ENV])
    try:
        cfg = json.loads((job / "job.json").read_text())
        bench = _Bench(dut, job, cfg)
        result = await bench.run()
    except StreamError as exc:
        (job / "error.json").write_text(json.dumps({"message": str(exc)}) + "\n")
        raise
    except Exception as exc:
        message = (f"The RTL testbench failed: {type(exc).__name__}: {exc}\n"
                   f"{''.join(traceback.format_exception(exc)[-4:])}")
        (job / "error.json").write_text(json.dumps({"message": message}) + "\n")
        raise
    (job / "result.json").write_text(json.dumps(result, indent=1) + "\n")
