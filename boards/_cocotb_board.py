"""The cocotb test that :class:`onnx2fpga.boards.simboard.SimBoard` runs inside the simulator.

Not for direct use. It connects to the host's socket (port in ``job.json`` in the folder
named by ``ONNX2FPGA_SIMBOARD_JOB``), sends the token from ``job.json`` first (the host
drops connections without it), shifts every byte the host sends onto ``rx`` as an 8N1
frame of ``divisor`` cycles per bit, decodes ``tx`` into bytes for the host, applies the
configured faults, and writes ``stats.json`` when the host closes the connection.

Simulated time advances while a byte is being shifted in and for ``grace_cycles`` after the
last byte in either direction; then the simulation waits (in real time, simulated time
frozen) until the host sends more.
"""

from __future__ import annotations

import json
import os
import random
import select
import socket
import time
from pathlib import Path

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, Timer

__all__ = ["board"]

_JOB_ENV = "ONNX2FPGA_SIMBOARD_JOB"
_PERIOD_NS = 10


class _Line:
    def __init__(self, cfg):
        self.faults = {d: {int(k): int(v) for k, v in cfg["faults"].get(d, {}).items()}
                       for d in ("to_board", "to_host")}
        self.prob = float(cfg["flip_probability"])
        self.rng = random.Random(cfg["seed"])
        self.count = {"to_board": 0, "to_host": 0}
        self.flipped = {"to_board": 0, "to_host": 0}

    def pass_byte(self, direction, byte):
        index = self.count[direction]
        self.count[direction] += 1
        mask = self.faults[direction].get(index, 0)
        if self.prob and self.rng.random() < self.prob:
            mask ^= 1 << self.rng.randrange(8)
        if mask:
            self.flipped[direction] += 1
        return byte ^ mask


@cocotb.test()
async def board(dut):
    """Serve the host's socket until it closes."""
    job = Path(os.environ[_JOB_ENV])
    cfg = json.loads((job / "job.json").read_text())
    divisor, grace = int(cfg["divisor"]), int(cfg["grace_cycles"])
    line = _Line(cfg)
    sock = socket.create_connection(("127.0.0.1", int(cfg["port"])))
    sock.sendall(cfg["token"].encode())
    sock.setblocking(False)

    Clock(dut.clk, _PERIOD_NS, unit="ns").start()
    dut.rx.value = 1
    dut.rst.value = 1
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    clock = {"now": 0, "last": 0}

    def cycles(n):
        # One timer per bit, not one Python wake-up per clock edge: about 30 times faster.
        return Timer(n * _PERIOD_NS, unit="ns")

    async def receive():
        while True:
            await FallingEdge(dut.tx)
            await cycles(divisor // 2)
            if int(dut.tx.value):
                continue                      # a glitch, not a start bit
            byte = 0
            for i in range(8):
                await cycles(divisor)
                byte |= int(dut.tx.value) << i
            await cycles(divisor)
            clock["last"] = clock["now"]
            data = bytes([line.pass_byte("to_host", byte)])
            sock.setblocking(True)
            try:
                sock.sendall(data)
            except OSError:
                return
            finally:
                sock.setblocking(False)

    cocotb.start_soon(receive())
    pending = bytearray()
    waited = 0.0
    started = time.monotonic()
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            data = None
        except OSError:
            break
        if data == b"":
            break                              # the host closed the connection
        if data:
            pending += data
        if pending:
            byte = line.pass_byte("to_board", pending.pop(0))
            for bit in [0] + [(byte >> i) & 1 for i in range(8)] + [1]:
                dut.rx.value = bit
                await cycles(divisor)
            clock["now"] += 10 * divisor
            clock["last"] = clock["now"]
            continue
        if clock["now"] - clock["last"] < grace:
            await cycles(10 * divisor)
            clock["now"] += 10 * divisor
            continue
        t0 = time.monotonic()
        select.select([sock], [], [], 0.5)    # idle: simulated time stands still
        waited += time.monotonic() - t0
    stats = {"bytes": line.count, "flipped": line.flipped, "cycles": clock["now"],
             "seconds": round(time.monotonic() - started, 3), "idle_seconds": round(waited, 3),
             "frames_ok": int(dut.frames_ok.value), "frames_bad": int(dut.frames_bad.value),
             "overrun": int(dut.overrun.value), "framing_error": int(dut.framing_error.value),
             "tlast_error": int(dut.tlast_error.value)}
    (job / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    sock.close()
