"""Fuzzing the commands with hostile design folders, inputs and options: every case ends in a
result, ``error:`` and exit 2, or exit 1 (a failed check), never in a traceback or a hang,
and touches no file outside the paths named on its command line.

A case (:func:`make_case`) copies a real design folder into a sandbox, damages it (files
deleted, truncated, flipped, replaced by folders, links out of the sandbox, FIFOs or devices;
JSON values replaced by hostile ones; arrays of other shapes; Verilog that would run host
commands; hostile build reports), sometimes makes the manifest's hashes agree again (as a
crafted folder would) and picks a command with hostile paths and option values
(``simulate``, ``report``, ``flash --dry-run``, ``compile`` into hostile targets, ``build``
and ``run`` up to the point where they would start real work). :func:`run_case` runs it
through :func:`onnx2fpga.cli.main` in this process and classifies the outcome.

CI runs a few dozen derandomized cases; ``benchmarks/fuzz.py --folders N`` runs many, each
in a worker process with a time limit.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import signal
import stat
import zipfile

import numpy as np
import pytest

from tests.helpers.models import float_mlp, save

__all__ = ["make_pristine", "make_case", "run_case", "snapshot"]

#: What the sandbox's foreign files hold; a case must never change them.
SECRET = b"do not touch"

HOSTILE_VALUES = [None, -1, 0, 1, 2 ** 70, -2 ** 70, 1e308, float("inf"), float("nan"), "",
                  "x", "../../outside/secret", "/etc/passwd", [], {}, True, [[[[[]]]]],
                  {"__type__": "Design"}, {"__array__": "nope"}, {"__int__": "int99"}]

HOSTILE_OPTION_VALUES = ["0", "-1", "1", "2", "3", "33", "64", "99999999999999999999", "1e309",
                         "inf", "-inf", "nan", "", "abc", "1,2", "0.5", "-0.5", "1e-300"]

FOLDINGS = ["dense0:0:0", "dense0:1:0", "dense0:-1:1", "dense0:3:1", "dense0:1:1:0",
            "nope:1:1", "dense0:lanes=0", "dense0:multipliers=foo", "dense0:multipliers=lut",
            "dense0:12:8", "dense0:99999:1", "dense1:2:2,dense1:1:1", ":::", "dense0"]

BOARDS = ["icebreaker", "ulx3s-85f", "tangnano9k", "bogus", "../x", "", "ICEBREAKER"]


def make_pristine(root) -> dict:
    """A compiled design folder, its model and its inputs under ``root``."""
    import onnx2fpga

    os.makedirs(root, exist_ok=True)
    model = save(float_mlp((12, 8, 4)), os.path.join(root, "mlp.onnx"))
    rng = np.random.default_rng(0)
    cal = rng.standard_normal((16, 1, 12)).astype(np.float32)
    np.save(os.path.join(root, "cal.npy"), cal)
    design = os.path.join(root, "design")
    onnx2fpga.compile(model, design, calibration=cal)
    return {"root": root, "model": model, "cal": os.path.join(root, "cal.npy"),
            "design": design, "x": cal[:3]}


# -- damage -------------------------------------------------------------------------------

def _json_paths(doc, path=()):
    yield path
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _json_paths(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _json_paths(v, path + (i,))


def _json_mutate(doc, rng):
    paths = [p for p in _json_paths(doc) if p]
    if not paths:
        return rng.choice(HOSTILE_VALUES)
    path = rng.choice(paths)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if isinstance(parent, dict) and rng.random() < 0.3:
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice(HOSTILE_VALUES)
    return doc


def _npz_mutate(path, rng):
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    if not arrays:
        return
    key = rng.choice(sorted(arrays))
    choice = rng.randrange(5)
    a = arrays[key]
    if choice == 0:
        del arrays[key]
    elif choice == 1:
        arrays[key] = np.zeros((0,) + a.shape[1:], a.dtype)
    elif choice == 2:
        arrays[key] = a.astype(rng.choice([np.float64, np.uint8, np.int64, np.bool_]))
    elif choice == 3:
        arrays[key] = np.resize(a, (a.size + rng.randrange(1, 9),))
    else:
        arrays[key] = np.full(a.shape, rng.choice([2 ** 62, -2 ** 62, 0]), np.int64)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _rehash(d):
    """Make the manifest's hashes agree with the files again, if it can be read."""
    if not os.path.isfile(os.path.join(d, "manifest.json")):   # never read a FIFO or device
        return
    try:
        with open(os.path.join(d, "manifest.json")) as f:
            m = json.load(f)
        files = {}
        for name in ("top.v", "design.json", "design.npz"):
            if not os.path.isfile(os.path.join(d, name)):    # a FIFO or /dev/zero: never read
                return
            with open(os.path.join(d, name), "rb") as f:
                files[name] = hashlib.sha256(f.read()).hexdigest()
        m["files"] = files
        m["top"]["verilog_sha256"] = files["top.v"]
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(m, f)
    except Exception:  # noqa: BLE001 - a folder too damaged to rehash stays as it is
        pass


def _damage(sandbox, d, rng):
    outside = os.path.join(sandbox, "outside")
    names = ["manifest.json", "top.v", "design.json", "design.npz", "report.md"]
    for _ in range(rng.randint(1, 3)):
        with contextlib.suppress(OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            _damage_one(sandbox, d, rng, outside, names)   # (a step may fail on earlier damage)
    if rng.random() < 0.5:
        _rehash(d)


def _damage_one(sandbox, d, rng, outside, names):
    """One random damage of design folder ``d``."""
    name = rng.choice(names)
    p = os.path.join(d, name)
    kind = rng.randrange(12)
    if not os.path.isfile(p) or os.path.islink(p):
        return
    if kind == 0:
        os.remove(p)
    elif kind == 1:
        size = os.path.getsize(p)
        with open(p, "r+b") as f:
            f.truncate(rng.randrange(size + 1))
    elif kind == 2:
        data = bytearray(open(p, "rb").read())
        for _ in range(rng.randint(1, 8)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        open(p, "wb").write(bytes(data))
    elif kind == 3:
        os.remove(p)
        os.mkdir(p)
    elif kind == 4:
        os.remove(p)
        os.symlink(os.path.join(outside, "secret"), p)
    elif kind == 5:
        os.remove(p)
        os.symlink(rng.choice(["/dev/zero", "/dev/null", "/dev/urandom"]), p)
    elif kind == 6:
        os.remove(p)
        os.mkfifo(p)
    elif kind in (7, 8) and name.endswith(".json"):
        try:
            doc = json.load(open(p))
        except ValueError:
            return
        for _ in range(rng.randint(1, 3)):
            doc = _json_mutate(doc, rng)
        with open(p, "w") as f:
            json.dump(doc, f, allow_nan=True)
    elif kind in (7, 8) and name == "design.npz":
        _npz_mutate(p, rng)
    elif kind == 9 and name == "top.v":
        text = open(p).read()
        payload = rng.choice([f'initial $system("touch {outside}/pwned");',
                              f'initial begin $fopen("{outside}/pwned", "w"); end',
                              f'`include "{outside}/secret"',
                              f'initial $readmemh("{outside}/secret", m);',
                              "// $system in a comment is harmless"])
        open(p, "w").write(text.replace("endmodule", payload + "\nendmodule", 1))
    elif kind == 10:
        open(os.path.join(d, rng.choice(["notes.txt", ".hidden", "build"])), "w").close() \
            if rng.random() < 0.5 else None
    elif kind == 11:
        board = rng.choice(["icebreaker", "ulx3s-85f"])
        b = os.path.join(d, "build", board)
        os.makedirs(b, exist_ok=True)
        report = {"board": rng.choice([board, "tangnano9k", 7, None]),
                  "bitstream": rng.choice(["top.bin", "../../outside/secret",
                                           f"{outside}/secret", "-h", "..", "", None,
                                           ["a"], "link.bin"]),
                  "design_id": rng.choice([None, "ab" * 8, 5])}
        try:
            if not os.path.isfile(os.path.join(d, "manifest.json")):
                raise OSError("not a regular file")
            with open(os.path.join(d, "manifest.json")) as f:
                if rng.random() < 0.6:
                    report["design_id"] = json.load(f)["top"]["verilog_sha256"][:16]
        except Exception:  # noqa: BLE001
            pass
        with open(os.path.join(b, "top.bin"), "wb") as f:
            f.write(b"\xff" * 16)
        if not os.path.lexists(os.path.join(b, "link.bin")):
            os.symlink(os.path.join(outside, "secret"), os.path.join(b, "link.bin"))
        text = json.dumps(report) if rng.random() < 0.9 else "{broken"
        with open(os.path.join(b, "report.json"), "w") as f:
            f.write(text)


def _hostile_array(path, rng):
    kind = rng.randrange(8)
    if kind == 0:
        os.mkfifo(path)
    elif kind == 1:
        os.symlink("/dev/zero", path)
    elif kind == 2:
        with open(path, "wb") as f:      # a header claiming 10^12 rows
            header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 1, 12), }"
            header += " " * (118 - len(header)) + "\n"
            f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
    elif kind == 3:
        np.save(path, np.full((2, 1, 12), rng.choice([np.nan, np.inf, -np.inf, 1e30]),
                              np.float32))
    elif kind == 4:
        np.save(path, np.zeros((2, 7), np.float32))
    elif kind == 5:
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif kind == 6:
        with open(path, "wb") as f:
            f.write(b"not an npy")
    else:
        os.mkdir(path)


# -- a case -------------------------------------------------------------------------------

def make_case(pristine: dict, sandbox: str, seed: int) -> tuple[list[str], list[str]]:
    """Lay out ``sandbox`` for case ``seed``; the command line and the paths it names (which
    the case may change)."""
    rng = random.Random(seed)
    outside = os.path.join(sandbox, "outside")
    os.makedirs(outside)
    with open(os.path.join(outside, "secret"), "wb") as f:
        f.write(SECRET)
    d = os.path.join(sandbox, "d")
    shutil.copytree(pristine["design"], d, symlinks=True)
    if rng.random() < 0.8:
        _damage(sandbox, d, rng)
    x = os.path.join(sandbox, "x.npy")
    if rng.random() < 0.3:
        _hostile_array(x, rng)
    else:
        np.save(x, pristine["x"])
    y = os.path.join(sandbox, rng.choice(["y.npy", "y", "outside/secret", "nowhere/y.npy",
                                          "outside", "x.npy"]))
    written = y if y.endswith(".npy") else y + ".npy"      # as np.save names it
    opt = lambda: rng.choice(HOSTILE_OPTION_VALUES)  # noqa: E731
    command = rng.choice(["simulate", "simulate", "report", "flash", "compile", "compile",
                          "build", "run"])
    if command == "simulate":
        argv = ["simulate", d, "--engine", "golden", "--inputs", x, "--outputs", y]
        for extra in rng.sample([["--force"], ["--seed", opt()], ["--json"], ["--check"]],
                                rng.randint(0, 2)):
            argv += extra
        named = [d, y, written]
    elif command == "report":
        argv, named = ["report", d], [d]
    elif command == "flash":
        argv = ["flash", d, "--board", rng.choice(BOARDS), "--dry-run"]
        named = [d]
    elif command == "build":
        argv = ["build", d, "--board", rng.choice(BOARDS)]
        for flag in rng.sample(["--seed", "--clock-mhz", "--baud"], rng.randint(0, 2)):
            argv += [flag, opt()]
        named = [d]
    elif command == "run":
        argv = ["run", d, "--port", rng.choice(["loop://", "/dev/null", "/nonexistent",
                                                "socket://127.0.0.1:1"]),
                "--inputs", x, "--outputs", y, "--timeout", rng.choice(["0.2", "0", "nan"]),
                "--retries", rng.choice(["0", "-1"])]
        named = [d, y, written]
    else:
        target = rng.choice([os.path.join(sandbox, "new"), d, outside, sandbox,
                             os.path.join(outside, "secret", "sub"),
                             os.path.join(sandbox, "link")])
        if target.endswith("link") and not os.path.lexists(target):
            os.symlink(outside, target)
        model = rng.choice([pristine["model"]] * 4 + [x, outside, "/dev/zero",
                                                      os.path.join(sandbox, "missing.onnx")])
        argv = ["compile", model, "-o", target]
        if rng.random() < 0.8:
            argv += ["--calibration", rng.choice([pristine["cal"], x])]
        if rng.random() < 0.5:
            argv.append("--force")
        for flag in rng.sample(["--weight-bits", "--activation-bits", "--multiplier-bits",
                                "--max-lanes", "--clock", "--target-fps", "--utilization",
                                "--folding", "--board", "--stop-after"], rng.randint(0, 3)):
            value = {"--folding": lambda: rng.choice(FOLDINGS),
                     "--board": lambda: rng.choice(BOARDS),
                     "--stop-after": lambda: rng.choice(["load", "lower", "emit", "x"])
                     }.get(flag, opt)()
            argv += [flag, value]
        named = [target]
    return [str(a) for a in argv], named


def snapshot(sandbox: str, named) -> dict:
    """Every entry under ``sandbox`` outside the ``named`` paths: type, size, mtime, bytes."""
    named = [os.path.abspath(p) for p in named]
    out = {}
    for top, dirs, files in os.walk(sandbox):
        if any(top == n or top.startswith(n + os.sep) for n in named):
            dirs[:] = []
            continue
        for name in dirs + files:
            p = os.path.join(top, name)
            if any(p == n for n in named):
                continue
            st = os.lstat(p)
            if stat.S_ISDIR(st.st_mode):        # its entries are compared one by one
                out[p] = (stat.S_IFDIR,)
                continue
            content = None
            if stat.S_ISREG(st.st_mode) and st.st_size < 1 << 16:
                with open(p, "rb") as f:
                    content = f.read()
            out[p] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, content)
    return out


def run_case(pristine: dict, sandbox: str, seed: int) -> tuple[str, str]:
    """Run case ``seed`` in ``sandbox`` through the command line in this process:
    ``(outcome, detail)``. Outcomes: ``ok``, ``error``, ``failed`` (exit 1), ``usage``
    (argparse), and the findings ``traceback:<Exception>``, ``multi-line``, ``touched``."""
    import onnx2fpga.boards.build as build
    from onnx2fpga.cli import main

    argv, named = make_case(pristine, sandbox, seed)
    before = snapshot(sandbox, named)
    started = []

    def no_build(*args, **kwargs):      # the checks before a build are what is fuzzed here
        started.append(1)
        raise KeyboardInterrupt
    real = build.build_bitstream
    build.build_bitstream = no_build
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as e:
                code = "usage" if e.code == 2 else e.code
    except Exception as e:  # noqa: BLE001 - a finding
        import traceback
        return f"traceback:{type(e).__name__}", " ".join(argv) + "\n" + traceback.format_exc()
    finally:
        build.build_bitstream = real
    text = err.getvalue()
    detail = " ".join(argv) + "\n" + text
    lines = [ln for ln in text.splitlines()
             if not ln.startswith(("[onnx2fpga]", "[rtl]", "warning:", "$ ")) and ln.strip()]
    if "Traceback" in text:
        return "traceback:printed", detail
    if os.path.exists(os.path.join(sandbox, "outside", "pwned")):
        return "touched", detail + "\noutside/pwned exists"
    after = snapshot(sandbox, named)
    if after != before:
        changed = sorted(set(after) ^ set(before)
                         | {k for k in after if k in before and after[k] != before[k]})
        return "touched", detail + f"\nchanged outside the named paths: {changed[:5]}"
    if code == "usage":
        return "usage", detail
    if code == 130 and started:
        return "build-started", detail
    if code == 2:
        errors = [ln for ln in lines if ln.startswith("error: ")]
        if len(errors) != 1 or len(lines) != 1:
            return "multi-line", detail
        return "error", detail
    return {0: "ok", 1: "failed"}.get(code, f"exit:{code}"), detail


# -- tests --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make_pristine(str(tmp_path_factory.mktemp("pristine")))


@pytest.mark.parametrize("seed", range(60))
def test_hostile_folders_and_options(pristine, tmp_path, seed):
    """A fixed sample of cases (``benchmarks/fuzz.py --folders`` runs many more)."""
    def hang(signum, frame):
        raise TimeoutError("no result after 120 s (a hang)")
    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(120)
    try:
        outcome, detail = run_case(pristine, str(tmp_path / "s"), seed)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert outcome in ("ok", "error", "failed", "usage", "build-started"), \
        f"{outcome}: {detail}"
