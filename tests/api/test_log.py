"""Logging: silent in library use (a NullHandler, nothing on stderr, not even warnings), but
``progress=True`` lines printed as before, and progress logged for applications that configure
logging; the CLI's handler is tested in test_cli.py."""

import os
import subprocess
import sys


def _run(code):
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert p.returncode == 0, p.stderr
    return p.stderr


def test_library_is_silent_by_default():
    assert _run("from onnx2fpga.log import get_logger, say\n"
                "log = get_logger('onnx2fpga.boards.fit')\n"
                "log.warning('a warning'); log.info('info'); say(log, 'quiet', False)\n") == ""


def test_progress_lines_are_printed_and_logged():
    err = _run("import logging\n"
               "from onnx2fpga.log import get_logger, say\n"
               "say(get_logger('onnx2fpga.boards.build'), 'synthesis ...\\nsecond line')\n"
               "logging.basicConfig(level=logging.INFO, format='%(name)s %(message)s')\n"
               "say(get_logger('boards.build'), 'logged too')\n"
               "say(get_logger('boards.build'), 'logged only', False)\n")
    assert err == ("[onnx2fpga] synthesis ...\n[onnx2fpga]   second line\n"
                   "[onnx2fpga] logged too\nonnx2fpga.boards.build logged too\n"
                   "onnx2fpga.boards.build logged only\n")
