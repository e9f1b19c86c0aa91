"""Design folders on disk: where a compile may write, how it replaces a folder atomically,
the locks that keep commands on one folder apart, and the checks a folder must pass before
anything in it is run.

A compile never writes into its output folder in place. It writes a complete folder next to
it (``.NAME.tmp-XXXX``) and renames that into place (:func:`publish`), so an interrupted or
failed compile leaves the old folder as it was and a reader never sees half of one. What it
may replace is narrow: a missing folder, an empty one, or (with ``force``) a folder holding
nothing but what onnx2fpga's commands write (:data:`OWN_ENTRIES`), recognized by its manifest;
anything else is refused before any work, naming the first foreign entry.

Commands that read or write one design folder hold a lock on it (:class:`FolderLock`,
``flock`` on ``DIR/.onnx2fpga.lock``): ``simulate``, ``build`` and :func:`~onnx2fpga.api.load`
share it, a compile replacing the folder takes it alone and waits for them.

The files named after the design's top module (``NAME.v``, the filelist ``NAME.f`` and the
FuseSoC core ``NAME.core``; ``NAME`` is ``manifest["top"]["module"]``, ``top`` by default and
in folders written before it could be chosen) are :func:`design_files`.

:func:`verify` checks ``NAME.v``, ``design.json``, ``design.npz`` and the filelist and core
against the manifest's SHA-256 hashes and refuses Verilog that would make a simulator run
anything but the circuit (system tasks other than ``$signed``/``$unsigned``, compiler
directives), since ``simulate`` and ``run --sim`` compile ``NAME.v`` with Verilator.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import signal
import tempfile
import threading

import numpy as np

from .errors import DesignDirError, OptionError

__all__ = ["OWN_ENTRIES", "HASHED", "LOCK_NAME", "DEFAULT_MODULE", "check_module_name",
           "module_name", "design_files", "hashed_files", "WEIGHT_IMAGE", "FolderLock",
           "check_target", "publish", "file_hashes", "verify", "check_verilog", "check_top",
           "atomic_write", "output_path", "save_array", "INTERRUPTED", "check_interrupted"]

#: Set by the command line's SIGINT handler. A KeyboardInterrupt raised inside a ``__del__``
#: or a callback is swallowed by Python ("Exception ignored in ..."); the long steps check
#: this flag at their boundaries, so Ctrl-C is honoured all the same.
INTERRUPTED = threading.Event()


def check_interrupted() -> None:
    """Raise :class:`KeyboardInterrupt` if Ctrl-C came and was swallowed on its way."""
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt

#: The lock file of a design folder.
LOCK_NAME = ".onnx2fpga.lock"

#: The files whose SHA-256 the manifest records (``manifest["files"]``) besides those named
#: after the top module (:func:`hashed_files`).
HASHED = ("design.json", "design.npz")

#: The weight image of a design with weights in SPRAM (``manifest["spram"]``), which
#: ``flash`` writes after the bitstream.
WEIGHT_IMAGE = "weights.bin"

#: Everything onnx2fpga's commands write into a design folder besides the files named after
#: the top module (:func:`design_files`); ``--force`` replaces a folder only if it holds
#: nothing else.
OWN_ENTRIES = frozenset({
    *HASHED, "manifest.json", "report.html", "report.md", "graph.json", "quantization.json",
    "measured.json", "build", "sim_build", "sim_board", WEIGHT_IMAGE, LOCK_NAME})

#: The top module's name when none is chosen (and in manifests written before it could be).
DEFAULT_MODULE = "top"

# Verilog-2005 and SystemVerilog (IEEE 1800-2017, Annex B) keywords: a module of such a
# name cannot be read back (Verilator reads .v files as SystemVerilog).
_KEYWORDS = frozenset("""
    accept_on alias always always_comb always_ff always_latch and assert assign assume
    automatic before begin bind bins binsof bit break buf bufif0 bufif1 byte case casex casez
    cell chandle checker class clocking cmos config const constraint context continue cover
    covergroup coverpoint cross deassign default defparam design disable dist do edge else
    end endcase endchecker endclass endclocking endconfig endfunction endgenerate endgroup
    endinterface endmodule endpackage endprimitive endprogram endproperty endspecify
    endsequence endtable endtask enum event eventually expect export extends extern final
    first_match for force foreach forever fork forkjoin function generate genvar global
    highz0 highz1 if iff ifnone ignore_bins illegal_bins implements implies import incdir
    include initial inout input inside instance int integer interconnect interface intersect
    join join_any join_none large let liblist library local localparam logic longint
    macromodule matches medium modport module nand negedge nettype new nexttime nmos nor
    noshowcancelled not notif0 notif1 null or output package packed parameter pmos posedge
    primitive priority program property protected pull0 pull1 pulldown pullup
    pulsestyle_ondetect pulsestyle_onevent pure rand randc randcase randsequence rcmos real
    realtime ref reg reject_on release repeat restrict return rnmos rpmos rtran rtranif0
    rtranif1 s_always s_eventually s_nexttime s_until s_until_with scalared sequence shortint
    shortreal showcancelled signed small soft solve specify specparam static string strong
    strong0 strong1 struct super supply0 supply1 sync_accept_on sync_reject_on table tagged
    task this throughout time timeprecision timeunit tran tranif0 tranif1 tri tri0 tri1
    triand trior trireg type typedef union unique unique0 unsigned until until_with untyped
    use uwire var vectored virtual void wait wait_order wand weak weak0 weak1 while wildcard
    wire with within wor xnor xor""".split())
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_NAME_RULE = ("a Verilog identifier (a letter or underscore, then letters, digits or "
              "underscores; at most 64 characters; no Verilog keyword)")


def check_module_name(name) -> str:
    """``name`` if it can name the design's top module (and its files), else raise.

    The rule: a plain Verilog identifier (``[A-Za-z_][A-Za-z0-9_]*``) of at most 64
    characters that is not a Verilog or SystemVerilog keyword: every tool reads it
    unescaped, and it names files.

    Raises
    ------
    OptionError
        One line naming the value and the rule.
    """
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name) or name in _KEYWORDS:
        raise OptionError(f"Module name must be {_NAME_RULE}, not {name!r}")
    return name


def module_name(manifest, where: str | None = None) -> str:
    """The design's top module as ``manifest["top"]["module"]`` names it (``top`` where the
    manifest names none). ``where``: the folder, for the message.

    Raises
    ------
    DesignDirError
        If the manifest names a module that :func:`check_module_name` refuses.
    """
    top = manifest.get("top") if isinstance(manifest, dict) else None
    name = top.get("module", DEFAULT_MODULE) if isinstance(top, dict) else DEFAULT_MODULE
    try:
        return check_module_name(name)
    except OptionError:
        raise DesignDirError(f"{where + ': ' if where else ''}manifest.json names the top "
                             f"module {name!r}, which is not "
                             f"{_NAME_RULE}; compile the model again") from None


def design_files(name: str) -> dict:
    """The files of a design folder named after its top module ``name``: ``verilog``
    (``NAME.v``), ``filelist`` (``NAME.f``) and ``core`` (``NAME.core``)."""
    return {"verilog": f"{name}.v", "filelist": f"{name}.f", "core": f"{name}.core"}


def hashed_files(name: str) -> tuple:
    """Every file whose SHA-256 a manifest of a design with top module ``name`` records."""
    files = design_files(name)
    return (files["verilog"], *HASHED, files["filelist"], files["core"])

_MARKERS = ("manifest.json", "graph.json", "design.json")


def _entries(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError as e:
        raise DesignDirError(f"{path}: cannot list the folder ({e.strerror})") from None


def _is_design_folder(path: str, names: list[str]) -> bool:
    """Whether ``path`` (holding ``names``) was written by a compile: a manifest of ours, or
    the files of a compile stopped early (``--stop-after``)."""
    if "manifest.json" in names:
        try:
            with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
                return json.load(f).get("format") == "onnx2fpga-manifest"
        except (OSError, ValueError, AttributeError):
            return False
    return any(m in names for m in _MARKERS)


def _folder_module(path: str, names: list[str]) -> str:
    """The top module a design folder's manifest names (``top`` if it has none or it cannot
    be read: then only the default's files count as the folder's own)."""
    if "manifest.json" not in names:
        return DEFAULT_MODULE
    try:
        with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
            return module_name(json.load(f))
    except (OSError, ValueError, DesignDirError):
        return DEFAULT_MODULE


def check_target(output_dir, force: bool, keep=()) -> str:
    """The absolute path a compile will write, after refusing every target it must not
    replace: a file, a folder below a file, a non-empty folder without ``force``, and with
    ``force`` any folder that is not a design folder or holds entries no onnx2fpga command
    writes (``keep``: paths of the user's inputs, refused if they lie inside the target).
    A symbolic link to a folder stands for that folder.

    Raises
    ------
    DesignDirError
    """
    out = os.path.realpath(os.path.abspath(os.fspath(output_dir)))
    parent = os.path.dirname(out)
    probe = parent
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise DesignDirError(f"{out}: {probe} is a file, not a folder")
    if not os.path.exists(out):
        return out
    if not os.path.isdir(out):
        raise DesignDirError(f"{out}: exists and is not a folder")
    names = [n for n in _entries(out) if n != LOCK_NAME]
    if not names:
        return out
    if not force:
        raise DesignDirError(f"{out}: folder is not empty (use --force to replace a design "
                             f"folder)")
    own = OWN_ENTRIES | set(design_files(_folder_module(out, names)).values())
    foreign = [n for n in names if n not in own]
    if foreign or not _is_design_folder(out, names):
        what = f"holds {foreign[0]!r}, which" if foreign else "has no onnx2fpga manifest, so it"
        raise DesignDirError(f"{out}: not a design folder: it {what} onnx2fpga did not write; "
                             f"--force replaces only design folders (nothing was deleted)")
    for path in keep:
        if path is None or not isinstance(path, (str, os.PathLike)):
            continue
        p = os.path.realpath(os.fspath(path))
        if p == out or p.startswith(out + os.sep):
            raise DesignDirError(f"{out}: holds {p}, an input of this compile; choose another "
                                 f"output folder")
    return out


class FolderLock:
    """``flock`` on ``DIR/.onnx2fpga.lock``, shared or exclusive, as a context manager.

    Waits (saying so once through ``say``) while another command holds it. A folder replaced
    while this process waited is noticed (the lock file's inode changed) and locked again.
    A folder that cannot hold a lock file (read-only) is used unlocked when ``shared``.
    """

    def __init__(self, directory, *, shared: bool = False, say=None):
        self.directory = os.fspath(directory)
        self.shared = shared
        self.say = say
        self.fd = None

    def __enter__(self):
        path = os.path.join(self.directory, LOCK_NAME)
        mode = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        told = False
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            except OSError as e:
                if self.shared and e.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
                    return self
                raise DesignDirError(f"{self.directory}: cannot lock the folder "
                                     f"({e.strerror})") from None
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                if self.say is not None and not told:
                    self.say(f"waiting for another onnx2fpga command using {self.directory}")
                    told = True
                fcntl.flock(fd, mode)
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return self
            os.close(fd)              # the folder was replaced while we waited: again

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        return False


@contextlib.contextmanager
def _parent_lock(parent: str):
    fd = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _signals_held():
    """Hold SIGINT and SIGTERM back for the two renames of a swap (main thread only)."""
    held = (signal.SIGINT, signal.SIGTERM)
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def publish(out: str, write, *, force: bool, keep=(), say=None) -> None:
    """Run ``write(folder)`` on a new folder beside ``out`` and rename it into place.

    ``out`` is checked by :func:`check_target` again under the locks, right before the
    swap, so a folder that became foreign meanwhile is not replaced. The new folder is
    removed if ``write`` fails or is interrupted; the old one stays untouched until the
    swap, and is then deleted.
    """
    parent = os.path.dirname(out)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    except OSError as e:
        raise DesignDirError(f"{out}: cannot write beside it in {parent} ({e.strerror})") \
            from None
    aside = None
    try:
        os.chmod(tmp, 0o777 & ~_umask())
        write(tmp)
        check_interrupted()
        while True:
            if not os.path.lexists(out):
                with _parent_lock(parent):
                    if os.path.lexists(out):
                        continue
                    with _signals_held():
                        os.rename(tmp, out)
                        tmp = None
                return
            with FolderLock(out, say=say):
                check_target(out, force, keep)
                with _parent_lock(parent):
                    aside = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-",
                                             dir=parent)
                    with _signals_held():
                        os.rename(out, os.path.join(aside, "old"))
                        os.rename(tmp, out)
                        tmp = None
            return
    except OSError as e:
        raise DesignDirError(f"{out}: cannot write the design folder ({e.strerror})") \
            from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_hashes(directory, names) -> dict:
    """SHA-256 of each file of ``names`` in ``directory``."""
    out = {}
    for name in names:
        h = hashlib.sha256()
        with open(os.path.join(directory, name), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        out[name] = h.hexdigest()
    return out


_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_ESCAPED = re.compile(r"\\\S+")
_SYSTEM = re.compile(r"\$[A-Za-z_][A-Za-z0-9_$]*")
_ALLOWED_TASKS = {"$signed", "$unsigned"}


def check_verilog(text: str, where: str) -> None:
    """Refuse Verilog with system tasks or compiler directives that our emitter never writes
    (``$system``, ``$fopen``, ``$readmemh``, `` `include``...): a simulator would run them."""
    code = _ESCAPED.sub(" ", _STRING.sub('""', _COMMENT.sub(" ", text)))
    bad = sorted({m.group(0) for m in _SYSTEM.finditer(code)} - _ALLOWED_TASKS)
    if "`" in code:
        bad.append("`" + code.split("`", 1)[1].split(None, 1)[0])
    if bad:
        raise DesignDirError(f"{where}: holds {', '.join(bad[:3])}, which onnx2fpga never "
                             f"emits; refusing to simulate or build it")


def verify(directory, manifest: dict) -> None:
    """Check the files ``manifest["files"]`` records against their hashes (``NAME.v``,
    ``design.json``, ``design.npz``, ``NAME.f``, ``NAME.core``; a folder written before the
    filelist and core were records the first three) and ``NAME.v`` with
    :func:`check_verilog`.

    Raises
    ------
    DesignDirError
        A file differs from what the compile wrote, the manifest has no hashes (written
        before they were recorded), or ``NAME.v`` holds what a simulator would run.
    """
    d = os.fspath(directory)
    want = manifest.get("files") if isinstance(manifest, dict) else None
    names = hashed_files(module_name(manifest, d))
    verilog = names[0]
    if not isinstance(want, dict) or not set(names[:3]) <= set(want) <= set(names):
        raise DesignDirError(f"{d}: manifest.json records no file hashes (written by an older "
                             f"onnx2fpga, or edited); compile the model again")
    names = [n for n in names if n in want]
    try:
        have = file_hashes(d, names)
    except OSError as e:
        raise DesignDirError(f"{d}: cannot read the design ({e})") from None
    changed = [n for n in names if have[n] != want[n]]
    top = manifest.get("top")
    if not changed and (not isinstance(top, dict)
                        or top.get("verilog_sha256") != have[verilog]):
        changed = ["manifest.json"]
    if changed:
        raise DesignDirError(f"{d}: {', '.join(changed)} differ{'s' if len(changed) == 1 else ''}"
                             f" from what the compile wrote (manifest hashes); compile the "
                             f"model again")
    with open(os.path.join(d, verilog), "rb") as f:
        check_top(f.read(), manifest, os.path.join(d, verilog))


def check_top(raw: bytes, manifest: dict, where: str) -> str:
    """The text of ``NAME.v`` read as ``raw``, after checking it is what the manifest names
    (``top.verilog_sha256``) and holds nothing a simulator would run (:func:`check_verilog`);
    for a reader that compiles the text it read itself.

    Raises
    ------
    DesignDirError
    """
    top = manifest.get("top") if isinstance(manifest, dict) else None
    if not isinstance(top, dict) or hashlib.sha256(raw).hexdigest() != top.get("verilog_sha256"):
        raise DesignDirError(f"{where}: differs from what the compile wrote (manifest hash); "
                             f"compile the model again")
    text = raw.decode("utf-8", errors="replace")
    check_verilog(text, where)
    return text


def atomic_write(path, data) -> None:
    """Write ``data`` (text, or bytes) to ``path`` through a temporary file in the same
    folder and a rename, so readers see the old file or the new one, never a part."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
        tmp = None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)


def output_path(path, force: bool) -> str:
    """The file ``np.save(path, ...)`` would write (``.npy`` appended when neither ``.npy``
    nor ``.npz`` ends it), after refusing an existing one without ``force`` and a folder
    that cannot take it — checked before the work whose result it will hold.

    Raises
    ------
    DesignDirError
    """
    p = os.fspath(path)
    if not p.endswith((".npy", ".npz")):
        p += ".npy"
    if os.path.isdir(p):
        raise DesignDirError(f"{p}: is a folder")
    if os.path.lexists(p) and not force:
        raise DesignDirError(f"{p}: exists (use --force to overwrite)")
    folder = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(folder):
        raise DesignDirError(f"{p}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DesignDirError(f"{p}: folder {folder} is not writable")
    return p


def save_array(path: str, array) -> None:
    """``np.save`` to exactly ``path`` through a temporary file and a rename; a dict of
    arrays by name is written with ``np.savez`` (one ``NAME.npy`` member each)."""
    buf = io.BytesIO()
    if isinstance(array, dict):
        np.savez(buf, **array)
    else:
        np.save(buf, array, allow_pickle=False)
    try:
        atomic_write(path, buf.getvalue())
    except OSError as e:
        raise DesignDirError(f"{path}: cannot write ({e.strerror})") from None

