"""Logging: one :mod:`logging` logger per module, under ``onnx2fpga``.

A module takes its logger with ``log = get_logger(__name__)``. As a library the package is
silent by default (a :class:`logging.NullHandler` on the ``onnx2fpga`` logger, as the Python
logging HOWTO asks of libraries): what it logs reaches the user only through handlers the
user configures. The exception is a call with ``progress=True`` (``build``, ``simulate``,
``compile(verbose=True)``): :func:`say` prints its progress lines on standard error, as the
package always has. Progress lines are logged at ``INFO`` either way, so that an application
that configures logging gets them there (with ``progress=False``, only there).

The command line installs a handler for the terminal (:func:`terminal_handler`): progress and
warnings on standard error, ``-v`` adds ``DEBUG`` messages (each tool's full progress, the
fit check's figures), ``-q`` keeps warnings and errors only. While it is installed,
:func:`say` leaves the printing to it.

A leaf module: it imports nothing of the project, and every layer may import it.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["PACKAGE", "PREFIX", "get_logger", "say", "terminal_handler", "remove_handler"]

#: The package logger's name; every module's logger is a child of it.
PACKAGE = "onnx2fpga"
#: What starts every line the package writes on the terminal.
PREFIX = "[onnx2fpga]"

_package = logging.getLogger(PACKAGE)
_package.addHandler(logging.NullHandler())


def get_logger(name: str) -> logging.Logger:
    """The logger of module ``name`` (``__name__``), inside the ``onnx2fpga`` hierarchy."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        name = f"{PACKAGE}.{name}"
    return logging.getLogger(name)


class _Formatter(logging.Formatter):
    """``[onnx2fpga] message``; warnings and errors say so; continuation lines indented."""

    def format(self, record):
        text = record.getMessage()
        if record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {text}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return f"{PREFIX} " + text.replace("\n", f"\n{PREFIX}   ")


class _StderrHandler(logging.StreamHandler):
    """A stream handler writing to whatever ``sys.stderr`` is when a record comes (a test's
    capture, a redirected stream), not to the one it was made with."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def _terminal_installed() -> bool:
    return any(isinstance(h, _StderrHandler) for h in _package.handlers)


def terminal_handler(verbosity: int = 0) -> logging.Handler:
    """Install the command line's handler on the package logger and return it.

    ``verbosity``: negative shows warnings and errors only (``-q``), 0 adds progress
    (``INFO``), 1 or more adds ``DEBUG``. :func:`remove_handler` takes it away again.
    """
    handler = _StderrHandler()
    handler.setFormatter(_Formatter())
    level = (logging.WARNING if verbosity < 0 else logging.INFO if verbosity == 0
             else logging.DEBUG)
    handler.onnx2fpga_level = _package.level     # restored by remove_handler
    _package.setLevel(level)
    _package.addHandler(handler)
    return handler


def remove_handler(handler: logging.Handler) -> None:
    """Undo :func:`terminal_handler`."""
    _package.removeHandler(handler)
    _package.setLevel(getattr(handler, "onnx2fpga_level", logging.NOTSET))


def say(logger: logging.Logger, message: str, enabled: bool = True) -> None:
    """A progress line: logged at ``INFO`` and, when ``enabled`` and the command line's
    handler is not installed, printed on standard error (library calls with
    ``progress=True``)."""
    if enabled and not _terminal_installed():
        print(f"{PREFIX} " + message.replace("\n", f"\n{PREFIX}   "), file=sys.stderr,
              flush=True)
    logger.info(message, stacklevel=2)
