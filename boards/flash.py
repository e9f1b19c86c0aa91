"""Writing a built bitstream to a board with its programmer.

:func:`flash_plan` checks that ``DIR/build/NAME/report.json`` exists, was built for that board
and for the design now in ``DIR`` (the report's ``design_id`` against the manifest's
``verilog_sha256``), and returns the programmer's command line (the program named by its
environment variable, ``ICEPROG``, ``ICESPROG``, ``OPENFPGALOADER`` or ``DFU_UTIL``, if set:
:func:`~.build.tool_command`); :func:`run_flash` runs it,
copying the programmer's output through, and turns a failure into a :class:`FlashError` that
quotes the programmer's last line (its own "no device found" message when no board is
attached).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

from ..designdir import WEIGHT_IMAGE
from ..errors import Onnx2FpgaError
from ..plan.spram import FLASH_OFFSET
from .build import REPORT, tool_command, tool_env_var
from .targets import get_board

__all__ = ["FlashError", "flash_plan", "image_plan", "flash_plans", "run_flash",
           "INSTALL_HINTS"]

#: How to get each programmer.
INSTALL_HINTS = {
    "openFPGALoader": "apt install openfpgaloader",
    "iceprog": "apt install fpga-icestorm",
    "dfu-util": "apt install dfu-util",
    "icesprog": "it comes with the iCESugar tools (no Debian package); 'openFPGALoader -b "
                "icesugar' also programs the board",
}


class FlashError(Onnx2FpgaError, RuntimeError):
    """No usable bitstream for the board, the programmer is missing, or it failed."""


def flash_plan(directory, board) -> list[str]:
    """The programmer command for the bitstream of ``board`` built in ``directory``.

    Raises
    ------
    FlashError
        No build for ``board``, a report for another board, a bitstream of another design or
        one without the host link, a missing bitstream file, or a bitstream named outside the
        build folder (a path, ``..``, a link out of it).
    UnknownBoardError
        ``board`` is not a registered board.
    """
    target = get_board(board)
    directory = os.path.abspath(os.fspath(directory))
    build_dir = os.path.join(directory, "build", target.name)
    report_path = os.path.join(build_dir, REPORT)
    hint = f"run 'onnx2fpga build {directory} --board {target.name}' first"
    if not os.path.isfile(report_path):
        raise FlashError(f"{directory}: no bitstream built for {target.name} ({report_path} "
                         f"is missing); {hint}")
    try:
        with open(report_path) as f:
            report = json.load(f)
        built_for, bitstream = report["board"], report["bitstream"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FlashError(f"{report_path}: unreadable build report ({e}); {hint}") from None
    if built_for != target.name:
        raise FlashError(f"{report_path}: the bitstream was built for {built_for}, not "
                         f"{target.name}; {hint}")
    try:
        with open(os.path.join(directory, "manifest.json")) as f:
            want = json.load(f)["top"]["verilog_sha256"][:16]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FlashError(f"{directory}: not a design directory ({e})") from None
    have = report.get("design_id")
    if have is None:
        raise FlashError(f"{report_path}: the bitstream has no host link (built without a "
                         f"design id); {hint}")
    if have != want:
        raise FlashError(f"{report_path}: the bitstream holds design {have}, but {directory} "
                         f"now holds {want}; {hint}")
    if (not isinstance(bitstream, str) or not bitstream or bitstream != os.path.basename(bitstream)
            or bitstream in (".", "..") or bitstream.startswith("-") or "/" in bitstream
            or "\\" in bitstream):
        raise FlashError(f"{report_path}: bitstream {bitstream!r} is not a file name inside "
                         f"{build_dir}; {hint}")
    path = os.path.join(build_dir, bitstream)
    real = os.path.realpath(path)
    if os.path.dirname(real) != os.path.realpath(build_dir):
        raise FlashError(f"{report_path}: bitstream {bitstream!r} leads outside {build_dir} "
                         f"(to {real}); {hint}")
    if not os.path.isfile(path):
        raise FlashError(f"{path}: bitstream missing; {hint}")
    # The programmer's variable (ICEPROG, ICESPROG, OPENFPGALOADER, DFU_UTIL) names another
    # program or command line for it.
    default = target.flash_command(path)
    return [*tool_command(target.flash_tool), *default[1:]]


def image_plan(directory, board) -> list[str] | None:
    """The programmer command that writes the design's weight image (``weights.bin``, for
    weights in SPRAM: ``manifest["spram"]``) into the board's flash at
    :data:`~onnx2fpga.plan.spram.FLASH_OFFSET`, where the design loads it from at start-up;
    ``None`` for a design without one.

    Raises
    ------
    FlashError
        The image is missing or not the one the manifest records, the manifest names
        another offset or file, or the board's programmer cannot write at an offset (only
        ``iceprog`` is known to: ``-o``).
    """
    target = get_board(board)
    directory = os.path.abspath(os.fspath(directory))
    try:
        with open(os.path.join(directory, "manifest.json")) as f:
            spram = json.load(f).get("spram")
    except (OSError, ValueError, AttributeError) as e:
        raise FlashError(f"{directory}: not a design directory ({e})") from None
    if not spram:
        return None
    hint = "compile the model again"
    if not isinstance(spram, dict) or spram.get("file") != WEIGHT_IMAGE or \
            spram.get("flash_offset") != FLASH_OFFSET:
        raise FlashError(f"{directory}: manifest.json's weight image is not {WEIGHT_IMAGE} at "
                         f"{FLASH_OFFSET:#x}; {hint}")
    path = os.path.join(directory, WEIGHT_IMAGE)
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        raise FlashError(f"{path}: cannot read the weight image ({e.strerror}); {hint}") \
            from None
    if digest != spram.get("sha256"):
        raise FlashError(f"{path}: the weight image is not the one manifest.json records; "
                         f"{hint}")
    if target.flash_tool != "iceprog":
        raise FlashError(f"{target.name}: its programmer {target.flash_tool} cannot write the "
                         f"weight image at an offset here; write {path} at byte "
                         f"{FLASH_OFFSET:#x} of the flash yourself")
    return [*tool_command(target.flash_tool), "-o", str(FLASH_OFFSET), path]


def flash_plans(directory, board) -> list[list[str]]:
    """The programmer commands for ``board``, in order: the bitstream (:func:`flash_plan`),
    then the weight image where the design has one (:func:`image_plan`). Both are checked
    before either runs."""
    plans = [flash_plan(directory, board)]
    image = image_plan(directory, board)
    if image is not None:
        plans.append(image)
    return plans


def run_flash(argv, *, stream=None) -> None:
    """Run the programmer, copying its output to ``stream`` (default: standard error).

    Raises
    ------
    FlashError
        The programmer is not on ``PATH`` (the message says how to install it) or exits with
        a non-zero status (the message quotes its last line of output).
    """
    stream = sys.stderr if stream is None else stream
    tool = argv[0]
    if shutil.which(tool) is None:
        name = os.path.basename(tool)
        raise FlashError(f"programmer {tool!r} not found on PATH; install it "
                         f"({INSTALL_HINTS.get(name, 'see its documentation')}) or name it "
                         f"with {tool_env_var(name)}")
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    except OSError as e:
        raise FlashError(f"cannot run {tool}: {e}") from None
    lines = []
    for raw in proc.stdout:
        line = raw.decode(errors="replace")
        stream.write(line)
        stream.flush()
        if line.strip():
            lines.append(line.strip())
    status = proc.wait()
    if status != 0:
        last = f": {lines[-1]}" if lines else " without a message"
        raise FlashError(f"{tool} failed with exit status {status}{last}")
