"""Arrays read from ``.npy`` and ``.npz`` files a user names (``--inputs``, ``--calibration``).

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
import zipfile

import numpy as np

from .errors import Onnx2FpgaError

__all__ = ["read_array", "read_npz", "read_arrays", "file_kind"]

_KINDS = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR,
          "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words (``"FIFO"``, ``"directory"``, ...)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "regular file" if stat.S_ISREG(mode) else "special file"


def _open_regular(p: str, what: str, error, kind: str):
    """``p`` opened for reading after checking (before and after opening, without blocking)
    that it is a regular file; the file object and its size."""
    try:
        st = os.stat(p)
    except OSError as e:
        raise error(f"{p}: cannot read {what}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{p}: {what} must be a regular {kind} file, not a "
                    f"{file_kind(st.st_mode)}")
    # Opened without blocking (a FIFO swapped in after the check would block in open) and
    # checked again on the open descriptor.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | \
        getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(p, flags)
    except OSError as e:
        raise error(f"{p}: cannot read {what}: {e.strerror or e}") from None
    f = os.fdopen(fd, "rb")
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        f.close()
        raise error(f"{p}: {what} must be a regular {kind} file, not a "
                    f"{file_kind(st.st_mode)}")
    return f, st.st_size


def _read_npy(f, size: int, where: str, what: str, error) -> np.ndarray:
    """The array of the ``.npy`` data in ``f`` (``size`` bytes from its current position),
    after checking its header (see :func:`read_array`)."""
    start = f.tell()
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
        raise error(f"{where}: cannot read {what}: not a .npy file ({_one_line(e)})") \
            from None
    if dtype.hasobject:
        raise error(f"{where}: {what} must be numbers, not Python objects (dtype {dtype})")
    need = math.prod(shape) * dtype.itemsize
    have = size - (f.tell() - start)
    if need != have:
        raise error(f"{where}: damaged .npy file: its header says shape {tuple(shape)} "
                    f"{dtype} ({need:,} bytes of data) but the file holds {have:,}")
    f.seek(start)
    try:
        return np.lib.format.read_array(f, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise error(f"{where}: cannot read {what}: {_one_line(e)}") from None


def read_array(path, what: str, error: type[Onnx2FpgaError] = Onnx2FpgaError) -> np.ndarray:
    """The array in the ``.npy`` file ``path``, or ``error`` (one line naming the file and
    ``what`` it should hold) if it cannot be: no such file, not a regular file (checked
    before it is opened), not ``.npy`` (format 1.0 or 2.0), object dtype, or a header whose
    shape and dtype do not match the file's size."""
    p = os.fspath(path)
    f, size = _open_regular(p, what, error, ".npy")
    with f:
        return _read_npy(f, size, p, what, error)


# Deflate compresses at most about 1032:1; a member claiming more is lying about its size.
_MAX_DEFLATE_RATIO = 1100


def read_npz(path, what: str, error: type[Onnx2FpgaError] = Onnx2FpgaError) \
        -> dict[str, np.ndarray]:
    """The arrays in the ``.npz`` file ``path`` by name (``np.savez`` or
    ``np.savez_compressed``), with the checks of :func:`read_array` on the file and on every
    member, and ``error`` for a file that is not a zip archive, a member that is not
    ``NAME.npy``, encrypted or compressed other than by deflate, two members of one name,
    or a member whose stated size deflate could not have produced."""
    p = os.fspath(path)
    f, _ = _open_regular(p, what, error, ".npz")
    with f:
        try:
            archive = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
            raise error(f"{p}: cannot read {what}: not a .npz file ({_one_line(e)})") \
                from None
        out = {}
        with archive:
            for info in archive.infolist():
                name = info.filename
                where = f"{p}: member {name!r}"
                if not name.endswith(".npy") or info.is_dir():
                    raise error(f"{where}: {what} must be .npy arrays (as np.savez writes)")
                key = name[:-len(".npy")]
                if key in out:
                    raise error(f"{where}: two arrays named {key!r}")
                if info.flag_bits & 0x1:
                    raise error(f"{where}: encrypted members are not supported")
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise error(f"{where}: compression method {info.compress_type} is not "
                                f"supported (stored or deflate, as np.savez writes)")
                if info.compress_type == zipfile.ZIP_DEFLATED and \
                        info.file_size > info.compress_size * _MAX_DEFLATE_RATIO + 4096:
                    raise error(f"{where}: damaged .npz file: {info.file_size:,} bytes "
                                f"cannot come from {info.compress_size:,} compressed bytes")
                try:
                    member = archive.open(info)
                except (zipfile.BadZipFile, OSError, EOFError, ValueError,
                        NotImplementedError) as e:
                    raise error(f"{where}: cannot read {what}: {_one_line(e)}") from None
                with member:
                    out[key] = _read_npy(member, info.file_size, where, what, error)
        if not out:
            raise error(f"{p}: {what}: the .npz file holds no arrays")
        return out


def read_arrays(path, what: str, error: type[Onnx2FpgaError] = Onnx2FpgaError):
    """:func:`read_npz` (a dict by name) for a path ending in ``.npz``, else
    :func:`read_array` (one array)."""
    if os.fspath(path).endswith(".npz"):
        return read_npz(path, what, error)
    return read_array(path, what, error)


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
