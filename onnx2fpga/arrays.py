"""Arrays read from ``.npy`` files a user names (``--inputs``, ``--calibration``).

:func:`read_array` checks a file before numpy reads it, so that a bad one gives one error
line instead of a hang, a traceback or a huge allocation: it must be a regular file (a FIFO
or a device would block or never end), start with the ``.npy`` magic, have a header numpy can
read, not hold Python objects, and hold exactly the bytes its header's shape and dtype need
(a header claiming 10^12 rows in a small file is refused before anything is allocated).
"""

from __future__ import annotations

import math
import os
import stat

import numpy as np

from .errors import Onnx2FpgaError

__all__ = ["read_array", "file_kind"]

_KINDS = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR,
          "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words (``"FIFO"``, ``"directory"``, ...)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "regular file" if stat.S_ISREG(mode) else "special file"


def read_array(path, what: str, error: type[Onnx2FpgaError] = Onnx2FpgaError) -> np.ndarray:
    """The array in the ``.npy`` file ``path``, or ``error`` (one line naming the file and
    ``what`` it should hold) if it cannot be: no such file, not a regular file (checked
    before it is opened), not ``.npy`` (format 1.0 or 2.0), object dtype, or a header whose
    shape and dtype do not match the file's size."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise error(f"{p}: cannot read {what}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{p}: {what} must be a regular .npy file, not a {file_kind(st.st_mode)}")
    # Opened without blocking (a FIFO swapped in after the check would block in open) and
    # checked again on the open descriptor.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | \
        getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(p, flags)
    except OSError as e:
        raise error(f"{p}: cannot read {what}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{p}: {what} must be a regular .npy file, not a "
                        f"{file_kind(st.st_mode)}")
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f".npy format version {version[0]}.{version[1]} is not "
                                 f"supported (1.0 and 2.0 are)")
        except (ValueError, OSError, EOFError) as e:
            raise error(f"{p}: cannot read {what}: not a .npy file ({_one_line(e)})") \
                from None
        if dtype.hasobject:
            raise error(f"{p}: {what} must be numbers, not Python objects (dtype {dtype})")
        need = math.prod(shape) * dtype.itemsize
        have = st.st_size - f.tell()
        if need != have:
            raise error(f"{p}: damaged .npy file: its header says shape {tuple(shape)} "
                        f"{dtype} ({need:,} bytes of data) but the file holds {have:,}")
        f.seek(0)
        try:
            return np.lib.format.read_array(f, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise error(f"{p}: cannot read {what}: {_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
