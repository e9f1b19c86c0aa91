"""A simulated board: the framed board wrapper around ``NAME.v``, in Verilator through cocotb,
reached over a local socket with the same :class:`~.protocol.Link` code as a real board.

The simulator runs :class:`~.framed.FramedBridge` (with the design's own ``NAME.v``
instantiated inside it, so the bytes on the line reach exactly the Verilog the manifest's
hash names) and bit-bangs the UART: the cocotb test (:mod:`._cocotb_board`) shifts the bytes
the host writes onto ``rx`` at ``divisor`` clock cycles per bit and decodes ``tx`` into bytes
for the host. Simulated time advances while bytes are in flight and for a grace period after
the last activity (longer than the wrapper's byte timeout and the accelerator's latency), then
stops until the host writes again, so a frame the host writes in one call is never split by
the board's byte timeout, and a half frame is timed out deterministically.

The simulator connects to a TCP port on 127.0.0.1 that this process listens on and proves
who it is by sending a random token first, which it reads from its private run folder (mode
0700); any other connection is closed unheard, so another local process cannot answer in the
board's place.

Faults: ``faults={"to_board": {index: xor_mask}, "to_host": {...}}`` flips bits of the
``index``-th byte (counted from 0 over the whole session) in that direction, and
``flip_probability`` with ``seed`` flips one random bit of each byte with that probability.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import re
import secrets
import select
import shutil
import socket
import threading
import time
from pathlib import Path

from amaranth.back import verilog
from amaranth.hdl import ClockSignal, Elaboratable, Instance, Module, ResetSignal, Signal

from ..designdir import WEIGHT_IMAGE, check_top, design_files, module_name
from ..errors import DesignDirError, Onnx2FpgaError
from ..hw.flashload import SpiFlashModel
from ..plan.spram import FLASH_OFFSET
from ..sim.verilator_build import new_run_dir, shared_simulator
from .framed import FramedBridge
from .protocol import design_id_from_sha256

__all__ = ["VerilogAccelerator", "SimBoard", "SimBoardError", "board_verilog", "board_source",
           "SIM_DIVISOR", "SIM_CLOCK_HZ"]

#: Clock cycles per UART bit in simulation (fast, yet every bit is still shifted).
SIM_DIVISOR = 8
#: The simulated clock; the baud rate is ``SIM_CLOCK_HZ / SIM_DIVISOR``.
SIM_CLOCK_HZ = 8_000_000
#: The wrapper's byte timeout in simulation, in UART byte times.
SIM_TIMEOUT_BYTES = 48

_TEST_MODULE = "onnx2fpga.boards._cocotb_board"
_JOB_ENV = "ONNX2FPGA_SIMBOARD_JOB"
_ACCEL_MODULE = "onnx2fpga_accelerator"
#: Length of the token the simulator sends first on its connection (hex digits).
TOKEN_BYTES = 32
#: Connections waiting to send their token; beyond that the oldest is dropped.
_MAX_PENDING = 64


class SimBoardError(Onnx2FpgaError, RuntimeError):
    """The simulated board could not be built or started, or it stopped."""


class VerilogAccelerator(Elaboratable):
    """The accelerator as an instance of the Verilog module ``module`` (from ``NAME.v``).

    Has the flat AXI4-Stream signals of :data:`~.wrapper.AXIS_PORTS` as attributes, so it
    drops into :class:`~.framed.FramedBridge`; ``clk`` and ``rst`` come from ``sync``.
    """

    def __init__(self, in_tdata_width, out_tdata_width, module="top", *, flash=False):
        self.module = module
        self.flash = bool(flash)
        if self.flash:                  # weights in SPRAM: the accelerator's flash ports
            self.flash_sck, self.flash_cs_n = Signal(), Signal(init=1)
            self.flash_copi, self.flash_cipo = Signal(), Signal()
        self.s_axis_tdata = Signal(in_tdata_width)
        self.s_axis_tvalid = Signal()
        self.s_axis_tready = Signal()
        self.s_axis_tlast = Signal()
        self.m_axis_tdata = Signal(out_tdata_width)
        self.m_axis_tvalid = Signal()
        self.m_axis_tready = Signal()
        self.m_axis_tlast = Signal()

    def elaborate(self, platform):
        m = Module()
        flash = {}
        if self.flash:
            flash = dict(o_flash_sck=self.flash_sck, o_flash_cs_n=self.flash_cs_n,
                         o_flash_copi=self.flash_copi, i_flash_cipo=self.flash_cipo)
        m.submodules.top = Instance(
            self.module, i_clk=ClockSignal(), i_rst=ResetSignal(),
            i_s_axis_tdata=self.s_axis_tdata, i_s_axis_tvalid=self.s_axis_tvalid,
            o_s_axis_tready=self.s_axis_tready, i_s_axis_tlast=self.s_axis_tlast,
            o_m_axis_tdata=self.m_axis_tdata, o_m_axis_tvalid=self.m_axis_tvalid,
            i_m_axis_tready=self.m_axis_tready, o_m_axis_tlast=self.m_axis_tlast, **flash)
        return m


class _FlashBoard(Elaboratable):
    """The bridge and, for weights in SPRAM, a model of the board's SPI flash holding the
    weight image, joined to the accelerator's flash ports."""

    def __init__(self, bridge, image):
        self.bridge, self.image = bridge, image

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge = self.bridge
        if self.image is not None:
            acc = self.bridge.accelerator
            m.submodules.flash = flash = SpiFlashModel(self.image, offset=FLASH_OFFSET)
            m.d.comb += [flash.sck.eq(acc.flash_sck), flash.cs_n.eq(acc.flash_cs_n),
                         flash.copi.eq(acc.flash_copi), acc.flash_cipo.eq(flash.cipo)]
        return m


def sim_bridge(manifest: dict, accelerator=None) -> FramedBridge:
    """The wrapper as the simulated board runs it (module ``board``)."""
    s, o = manifest["ports"]["s_axis"], manifest["ports"]["m_axis"]
    if accelerator is None:
        accelerator = VerilogAccelerator(s["tdata_width"], o["tdata_width"], _ACCEL_MODULE,
                                         flash=bool(manifest.get("spram")))
    return FramedBridge(
        accelerator, s["tdata_width"], o["tdata_width"], s["beats"], o["beats"],
        clk_freq=SIM_CLOCK_HZ, baud=SIM_CLOCK_HZ // SIM_DIVISOR,
        design_id=design_id_from_sha256(manifest["top"]["verilog_sha256"]),
        timeout_cycles=SIM_TIMEOUT_BYTES * 10 * SIM_DIVISOR,
        in_payload_width=s["lanes"] * s["bits"])


def board_verilog(manifest: dict, image: bytes | None = None) -> str:
    """Verilog of module ``board``: the wrapper, instantiating the accelerator's module
    renamed ``onnx2fpga_accelerator`` (not included); with ``image`` (weights in SPRAM), a
    model of the SPI flash holding it at :data:`~onnx2fpga.plan.spram.FLASH_OFFSET`."""
    bridge = sim_bridge(manifest)
    top = bridge if image is None else _FlashBoard(bridge, image)
    return verilog.convert(top, name="board", ports=[
        bridge.rx, bridge.tx, bridge.activity, bridge.error_led, bridge.overrun,
        bridge.framing_error, bridge.tlast_error, bridge.frames_ok, bridge.frames_bad])


def board_source(directory, manifest: dict) -> str:
    """The Verilog the simulated board runs for the design folder ``directory``: the
    design's ``NAME.v`` (checked against ``manifest``) with its module renamed
    ``onnx2fpga_accelerator``, then :func:`board_verilog`'s module ``board``.

    For weights in SPRAM (``manifest["spram"]``) the board has a model of its SPI flash
    holding ``weights.bin`` (checked against the manifest's hash), which the design loads
    at start-up.

    Raises
    ------
    SimBoardError
        If ``NAME.v`` or ``weights.bin`` cannot be read or differs from the manifest's hash,
        or ``NAME.v`` has no module ``NAME``.
    """
    # Verilator names its classes after the prefix "Vtop" that cocotb's runner uses; a
    # module called "top" below the toplevel collides with them, so the accelerator's
    # module is renamed, and its submodules with it (``\NAME.matvec_0``: NAME could be
    # the wrapper's own "board"); the body is the design's NAME.v as it is.
    directory = Path(directory)
    try:    # what runs is what the manifest names, and nothing a simulator would execute
        name = module_name(manifest, str(directory))
        path = directory / design_files(name)["verilog"]
        text = check_top(path.read_bytes(), manifest, str(path))
    except OSError as e:
        raise SimBoardError(f"{directory}: cannot read the design ({e})") from None
    except DesignDirError as e:
        raise SimBoardError(str(e)) from None
    top, count = re.subn(rf"^module {name}\(", f"module {_ACCEL_MODULE}(", text, count=1,
                         flags=re.M)
    if count != 1:
        raise SimBoardError(f"{path} has no module {name!r}")
    top = top.replace(f"\\{name}.", f"\\{_ACCEL_MODULE}.")
    return top + "\n" + board_verilog(manifest, _weight_image(directory, manifest))


def _weight_image(directory: Path, manifest: dict) -> bytes | None:
    """``weights.bin`` of a design with weights in SPRAM, checked against the manifest."""
    spram = manifest.get("spram")
    if not spram:
        return None
    path = directory / WEIGHT_IMAGE
    try:
        image = path.read_bytes()
    except OSError as e:
        raise SimBoardError(f"{path}: cannot read the weight image ({e.strerror})") from None
    if not isinstance(spram, dict) or \
            hashlib.sha256(image).hexdigest() != spram.get("sha256"):
        raise SimBoardError(f"{path}: the weight image is not the one manifest.json records; "
                            f"compile the model again")
    return image


class SimBoard:
    """Start the simulated board for a design directory; use it as a transport.

    Parameters
    ----------
    directory : str or Path
        A design directory (``NAME.v``, ``manifest.json``).
    build_dir : str or Path, optional
        Where to build; default ``DIRECTORY/sim_board``. The Verilator build is reused while
        ``NAME.v`` and the wrapper stay the same, and shared with other simulated boards of
        the design running at the same time (each has its own run folder
        ``build_dir/runs/run-XXXXXXXX``, removed by :meth:`close` unless the simulator
        failed; see :func:`~onnx2fpga.sim.verilator_build.shared_simulator`).
    faults : dict, optional
        ``{"to_board": {index: mask}, "to_host": {index: mask}}``: XOR masks for given bytes.
    flip_probability : float
        Probability that a byte on the line (either direction) gets one random bit flipped.
    seed : int
        Seed of the random flips.
    progress : bool
        Build progress on stderr.

    The transport methods are those :class:`~.protocol.Link` needs: :meth:`write`,
    :meth:`read`, :meth:`reset_input`; :meth:`close` stops the simulator and returns the
    line statistics it recorded (``stats``).
    """

    def __init__(self, directory, *, build_dir=None, faults=None, flip_probability=0.0,
                 seed=0, progress=False, manifest=None):
        self.directory = Path(directory).resolve()
        if manifest is None:
            with open(self.directory / "manifest.json") as f:
                manifest = json.load(f)
        self.manifest = manifest
        self.build_dir = Path(build_dir or self.directory / "sim_board").resolve()
        if not 0 <= flip_probability < 1:
            raise ValueError(f"Flip probability must be in [0, 1), not {flip_probability!r}")
        self.faults = {direction: {int(k): int(v) for k, v in (faults or {}).get(
            direction, {}).items()} for direction in ("to_board", "to_host")}
        self.flip_probability = float(flip_probability)
        self.seed = int(seed)
        self.progress = progress
        self.stats = None
        self._sock = None
        self._thread = None
        self._failure = None
        self._job = None
        self._stack = None
        self._keep_run = False
        self._start()

    # -- starting and stopping -----------------------------------------------------------------

    def _source_text(self) -> str:
        return board_source(self.directory, self.manifest)

    def _start(self):
        self._stack = contextlib.ExitStack()
        try:
            self._launch()
        except BaseException:
            self.close()
            raise

    def _launch(self):
        text = self._source_text()
        # Held until close(): runs of this build may share it, a rebuild waits for them.
        build = self._stack.enter_context(shared_simulator(
            self.build_dir / "board_top.v", "board", self.build_dir, source_text=text,
            progress=self.progress))
        self._job = job = new_run_dir(self.build_dir)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._stack.callback(listener.close)
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        grace = (SIM_TIMEOUT_BYTES * 10 * SIM_DIVISOR * 2
                 + 4 * int(self.manifest.get("latency_cycles", 0)) + 2000)
        # The simulator proves it is ours by sending this token first; the run folder, and
        # so job.json, is readable by this user only (mkdtemp makes it 0700).
        token = secrets.token_hex(TOKEN_BYTES // 2).encode()
        (job / "job.json").write_text(json.dumps({
            "port": listener.getsockname()[1], "token": token.decode(),
            "divisor": SIM_DIVISOR, "grace_cycles": grace, "faults": self.faults,
            "flip_probability": self.flip_probability, "seed": self.seed}, indent=1) + "\n")

        from cocotb_tools.runner import get_runner
        runner = get_runner("verilator")
        runner.log.setLevel("WARNING")

        def run():
            try:
                runner.test(test_module=_TEST_MODULE, hdl_toplevel="board",
                            hdl_toplevel_lang="verilog", build_dir=build.obj_dir,
                            test_dir=job, results_xml=str(job / "results.xml"),
                            log_file=job / "sim.log",
                            extra_env={_JOB_ENV: str(job), "COCOTB_ANSI_OUTPUT": "0"})
            except BaseException as exc:  # noqa: BLE001 - reported by the host side
                self._failure = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        self._sock = self._accept(listener, token)
        listener.close()

    def _accept(self, listener, token):
        """The connection that sends ``token`` first. Connections from anyone else (another
        local process may connect to the port before the simulator does) are closed unheard:
        they never see a byte of the host's requests."""
        listener.setblocking(False)
        pending = {}                            # connection -> bytes of its token so far
        deadline = time.monotonic() + 120
        try:
            while True:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    self._keep_run = True
                    raise SimBoardError(f"The simulated board did not start; last lines "
                                        f"of {self._job / 'sim.log'}:\n{self._log_tail()}")
                ready, _, _ = select.select([listener, *pending], [], [], 0.2)
                for conn in ready:
                    if conn is listener:
                        with contextlib.suppress(BlockingIOError, InterruptedError):
                            new, _ = listener.accept()
                            new.setblocking(False)
                            pending[new] = b""
                            if len(pending) > _MAX_PENDING:     # drop the oldest
                                old = next(iter(pending))
                                del pending[old]
                                old.close()
                        continue
                    if conn not in pending:             # dropped above as the oldest
                        continue
                    try:
                        data = conn.recv(len(token) - len(pending[conn]))
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    pending[conn] += data
                    if data and len(pending[conn]) < len(token):
                        continue
                    got = pending.pop(conn)
                    if hmac.compare_digest(got, token):
                        return conn
                    conn.close()
        finally:
            for conn in pending:
                conn.close()

    def _log_tail(self, lines=15):
        path = self._job / "sim.log"
        if not path.is_file():
            return "(no simulator log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> dict | None:
        """Stop the simulator; returns its line statistics."""
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
            stats = self._job / "stats.json"
            if stats.is_file():
                self.stats = json.loads(stats.read_text())
        if self._job is not None:
            if not (self._keep_run or self._failure is not None):
                shutil.rmtree(self._job, ignore_errors=True)
            self._job = None
        if self._stack is not None:
            self._stack.close()                 # lets go of the build
            self._stack = None
        return self.stats

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- transport -------------------------------------------------------------------------------

    def _check_alive(self):
        if self._sock is None:
            raise SimBoardError("The simulated board is closed")
        if not self._thread.is_alive():
            self._keep_run = True
            raise SimBoardError(f"The simulated board stopped; last lines of "
                                f"{self._job / 'sim.log'}:\n{self._log_tail()}")

    def write(self, data: bytes) -> None:
        self._check_alive()
        self._sock.setblocking(True)
        try:
            self._sock.sendall(bytes(data))
        finally:
            self._sock.setblocking(False)

    def read(self, n: int, timeout: float) -> bytes:
        """Up to ``n`` bytes; waits at most ``timeout`` seconds for the first one."""
        self._check_alive()
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready:
            return b""
        try:
            data = self._sock.recv(n)
        except BlockingIOError:
            return b""
        if not data:
            raise SimBoardError("The simulated board closed the connection")
        return data

    def reset_input(self) -> None:
        while True:
            try:
                if not self._sock.recv(65536):
                    return
            except (BlockingIOError, OSError):
                return
