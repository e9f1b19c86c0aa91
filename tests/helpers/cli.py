"""Running the command line from tests: in this process (with pytest's capture) or in a
process of its own (a hang then fails the test instead of the whole run); stderr without the
progress lines."""

from __future__ import annotations

import subprocess
import sys

from onnx2fpga.cli import main

__all__ = ["run_cli", "run_cli_process", "PROGRESS"]

#: Prefixes of progress lines (not part of what a command says about its result).
PROGRESS = ("[onnx2fpga] ", "[rtl] ")


def _quiet(err: str) -> str:
    return "".join(line for line in err.splitlines(keepends=True)
                   if not line.startswith(PROGRESS))


def run_cli(capture, *argv):
    """``onnx2fpga ARGV`` through :func:`onnx2fpga.cli.main`: exit code, stdout, stderr
    (``capture``: pytest's ``capsys`` or ``capfd``)."""
    code = main([str(a) for a in argv])
    out, err = capture.readouterr()
    return code, out, _quiet(err)


def run_cli_process(cwd, *argv, timeout=300):
    """``python -m onnx2fpga ARGV`` in ``cwd``: exit code and stderr."""
    p = subprocess.run([sys.executable, "-m", "onnx2fpga", *map(str, argv)], cwd=cwd,
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, _quiet(p.stderr)
