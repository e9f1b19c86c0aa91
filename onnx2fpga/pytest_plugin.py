"""The pytest plugin: compile a model once per session, simulate it, compare outputs.

Registered through the ``pytest11`` entry point, so installing onnx2fpga makes it available
in every pytest run; it only adds options, a marker and fixtures (nothing runs for a test that
does not ask for them), and importing it imports neither numpy nor onnx nor Amaranth. Its
failures are raised as :class:`AssertionError` with their own message, so pytest need not
rewrite its asserts: PYTEST_DONT_REWRITE (no warning when the module was imported before
pytest loads it, as in a session that runs pytest inside pytest).

Fixtures
--------
onnx2fpga_compile : session
    ``compile(model, **options) -> CompiledDesign``: :func:`onnx2fpga.compile` into the
    session's temporary folder, once per session for the same model bytes and options (a
    module or session fixture of the user's wrapping it costs nothing more).
onnx2fpga_simulate : function
    ``simulate(design, x, engine=None, *, stall_in=None, stall_out=None, seed=None)``:
    :meth:`CompiledDesign.simulate` with the engine, stall probabilities and seed of the
    command line (or ini file) unless given; an RTL run without Verilator skips the test,
    naming what is missing. ``simulate.runs`` lists each run's options and measured cycles;
    a failing test shows them in its "onnx2fpga" section.
onnx2fpga_assert_equal : function
    :func:`assert_outputs_equal`.
onnx2fpga_options : session
    The session's :class:`SimulationOptions`.

Options (command line; ini keys without the dashes, ``onnx2fpga_stall_in`` ...)
-------------------------------------------------------------------------------
``--onnx2fpga-engine rtl|golden`` (default rtl), ``--onnx2fpga-stall-in P``,
``--onnx2fpga-stall-out P`` (probabilities in [0, 1) of a stall cycle on the input and output
AXI-Stream, default 0.3), ``--onnx2fpga-seed N`` (the stall pattern's seed, default 0).

Marker
------
``onnx2fpga_rtl``: a test that runs the RTL simulation; skipped when Verilator is missing,
deselected with ``-m "not onnx2fpga_rtl"``.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass

import pytest

__all__ = ["SimulationOptions", "assert_outputs_equal", "onnx2fpga_compile",
           "onnx2fpga_simulate", "onnx2fpga_assert_equal", "onnx2fpga_options"]

_ENGINES = ("rtl", "golden")
_DEFAULTS = {"engine": "rtl", "stall_in": "0.3", "stall_out": "0.3", "seed": "0"}
_HELP = {
    "engine": "onnx2fpga_simulate's engine when a test names none: rtl (Verilator, the "
              "default) or golden (the integer numpy model)",
    "stall_in": "probability in [0, 1) of a stall cycle on the RTL input stream (default 0.3)",
    "stall_out": "probability in [0, 1) of a stall cycle on the RTL output stream "
                 "(default 0.3)",
    "seed": "seed of the RTL stall pattern, a non-negative integer (default 0)",
}
_VERILATOR = pytest.StashKey[str]()      # "" when Verilator was found, else why not
_OPTIONS = pytest.StashKey["SimulationOptions"]()


@dataclass(frozen=True)
class SimulationOptions:
    """What ``onnx2fpga_simulate`` uses when a test does not say: from the command line,
    else the ini file, else the defaults of :meth:`onnx2fpga.api.CompiledDesign.simulate`."""

    engine: str = "rtl"
    stall_in: float = 0.3
    stall_out: float = 0.3
    seed: int = 0


def pytest_addoption(parser):
    group = parser.getgroup("onnx2fpga", "onnx2fpga hardware simulation")
    for key, help_text in _HELP.items():
        flag = "--onnx2fpga-" + key.replace("_", "-")
        group.addoption(flag, dest="onnx2fpga_" + key, default=None,
                        metavar="ENGINE" if key == "engine" else ("N" if key == "seed" else "P"),
                        help=help_text)
        parser.addini("onnx2fpga_" + key, help_text, default="")


def _parse(config) -> SimulationOptions:
    """The options from the command line, else the ini file; a bad value is one
    :class:`pytest.UsageError` line naming the option."""
    values = {}
    for key, default in _DEFAULTS.items():
        text, name = config.getoption("onnx2fpga_" + key), "--onnx2fpga-" + key.replace("_", "-")
        if text is None:
            text, name = str(config.getini("onnx2fpga_" + key)).strip(), "onnx2fpga_" + key
            if not text:
                text = default
        if key == "engine":
            if text not in _ENGINES:
                raise pytest.UsageError(f"{name} must be rtl or golden, not {text!r}")
            values[key] = text
        elif key == "seed":
            try:
                values[key] = int(text)
            except ValueError:
                values[key] = -1
            if values[key] < 0:
                raise pytest.UsageError(f"{name} must be a non-negative integer, not {text!r}")
        else:
            try:
                values[key] = float(text)
            except ValueError:
                values[key] = math.nan
            if not 0 <= values[key] < 1:
                raise pytest.UsageError(f"{name} must be a probability in [0, 1), not {text!r}")
    return SimulationOptions(**values)


def pytest_configure(config):
    config.addinivalue_line("markers", "onnx2fpga_rtl: runs the onnx2fpga RTL simulation "
                            "(Verilator); skipped when Verilator is missing")
    config.stash[_OPTIONS] = _parse(config)


def _verilator_missing(config) -> str:
    """Why the RTL simulation cannot run here ("" if it can), looked up once per session."""
    if _VERILATOR not in config.stash:
        from .sim.verilator_build import RtlSimulationError, verilator_env
        try:
            verilator_env()
            config.stash[_VERILATOR] = ""
        except RtlSimulationError as e:
            config.stash[_VERILATOR] = str(e)
    return config.stash[_VERILATOR]


def _skip_without_verilator(config) -> None:
    __tracebackhide__ = True      # the skip is reported at the test's line
    why = _verilator_missing(config)
    if why:
        pytest.skip(f"onnx2fpga RTL simulation unavailable: {why}")


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("onnx2fpga_rtl") is not None]
    why = _verilator_missing(config) if marked else ""
    for item in marked if why else ():
        item.add_marker(pytest.mark.skip(reason=f"onnx2fpga RTL simulation unavailable: {why}"))


# ---------------------------------------------------------------------------------------------
# Fixtures.

def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path) -> str:
    with open(path, "rb") as f:
        return _sha256(f.read())


def _fingerprint(value, *, is_path: bool = False) -> str:
    """A text that changes whenever ``value`` (an option of :func:`onnx2fpga.compile`) does:
    arrays and files by their contents."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return f"array:{value.dtype.str}:{value.shape}:{_sha256(np.ascontiguousarray(value))}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_fingerprint(v, is_path=is_path)}"
                              for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_fingerprint(v) for v in value) + "]"
    if (is_path or isinstance(value, os.PathLike)) and isinstance(value, (str, os.PathLike)) \
            and os.path.isfile(value):
        return f"file:{_file_sha256(value)}"
    return repr(value)


def _folder_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")[:40] or "model"


def _model_key(model) -> tuple[str, str]:
    """(sha256 of the model's bytes, a short name for its folder)."""
    if isinstance(model, (str, os.PathLike)):
        stem = os.path.splitext(os.path.basename(os.fspath(model)))[0]
        return _file_sha256(model), _folder_name(stem)
    if hasattr(model, "SerializeToString"):
        return (_sha256(model.SerializeToString(deterministic=True)),
                _folder_name(model.graph.name))
    raise TypeError(f"onnx2fpga_compile: model must be a path or an onnx.ModelProto, not "
                    f"{type(model).__name__}")


@pytest.fixture(scope="session")
def onnx2fpga_compile(tmp_path_factory):
    """``compile(model, **options)``: :func:`onnx2fpga.compile` once per session.

    ``model`` is a path or an ``onnx.ModelProto``; ``options`` are those of
    :func:`onnx2fpga.compile` but ``output_dir`` and ``force`` (the design goes into a new
    folder of the session's temporary folder). The same model bytes with the same options
    (arrays and the calibration file compared by contents) return the same
    :class:`~onnx2fpga.api.CompiledDesign`, so its RTL simulator is built once per session.
    """
    designs = {}
    root = []

    def compile_(model, **options):
        from .api import compile as compile_design

        taken = sorted({"output_dir", "force"} & set(options))
        if taken:
            raise TypeError(f"onnx2fpga_compile chooses the design folder itself; "
                            f"{' and '.join(taken)} cannot be given")
        model_hash, stem = _model_key(model)
        key = _sha256("\n".join([model_hash] + [
            f"{name}={_fingerprint(value, is_path=name == 'calibration')}"
            for name, value in sorted(options.items())]).encode())
        if key not in designs:
            if not root:
                root.append(tmp_path_factory.mktemp("onnx2fpga"))
            folder = root[0] / f"{stem}-{key[:12]}"
            designs[key] = compile_design(model, folder, **options)
        return designs[key]

    return compile_


@pytest.fixture(scope="session")
def onnx2fpga_options(pytestconfig) -> SimulationOptions:
    """The :class:`SimulationOptions` of this session."""
    return pytestconfig.stash[_OPTIONS]


class Simulator:
    """``simulate(design, x, engine=None, *, stall_in=None, stall_out=None, seed=None)``:
    the outputs of ``design`` (a :class:`~onnx2fpga.api.CompiledDesign` or its folder) on
    the batch ``x``; what is not given comes from :attr:`options`.

    Attributes
    ----------
    options : SimulationOptions
    runs : list of dict
        Per run: ``engine``, ``inferences``, ``stall_in``, ``stall_out``, ``seed``,
        ``directory`` and, for RTL, the measured ``cycles_per_inference``,
        ``latency_cycles`` and ``total_cycles``
        (:attr:`~onnx2fpga.api.CompiledDesign.last_run`).
    """

    def __init__(self, item, options: SimulationOptions):
        self._item = item
        self.options = options
        self.runs = []

    def __call__(self, design, x, engine=None, *, stall_in=None, stall_out=None, seed=None):
        from .api import CompiledDesign, load

        __tracebackhide__ = True
        if not isinstance(design, CompiledDesign):
            design = load(design)
        o = self.options
        run = {"engine": o.engine if engine is None else engine,
               "stall_in": o.stall_in if stall_in is None else stall_in,
               "stall_out": o.stall_out if stall_out is None else stall_out,
               "seed": o.seed if seed is None else seed}
        if run["engine"] == "rtl":
            _skip_without_verilator(self._item.config)
        y = design.simulate(x, **run)
        run["directory"] = design.directory
        if run["engine"] == "rtl":
            run.update(design.last_run)
        else:
            run["inferences"] = len(next(iter(x.values())) if isinstance(x, dict) else x)
        self.runs.append(run)
        self._item.add_report_section("call", "onnx2fpga", _describe(run))
        return y


def _describe(run: dict) -> str:
    line = f"{run['engine']}: {run['inferences']} inferences of {run['directory']}"
    if run["engine"] == "rtl":
        line += (f" with --onnx2fpga-stall-in {run['stall_in']} --onnx2fpga-stall-out "
                 f"{run['stall_out']} --onnx2fpga-seed {run['seed']}: "
                 f"{run['total_cycles']} cycles, {run['cycles_per_inference']} per inference, "
                 f"latency {run['latency_cycles']}")
    return line


@pytest.fixture
def onnx2fpga_simulate(request, onnx2fpga_options) -> Simulator:
    """A :class:`Simulator` for this test."""
    return Simulator(request.node, onnx2fpga_options)


@pytest.fixture
def onnx2fpga_assert_equal():
    """:func:`assert_outputs_equal`."""
    return assert_outputs_equal


# ---------------------------------------------------------------------------------------------
# Comparing outputs.

def assert_outputs_equal(actual, expected, *, rtol: float = 0.0, atol: float = 0.0,
                         max_shown: int = 10) -> None:
    """Fail unless ``actual`` equals ``expected``: arrays, or dicts of arrays by output name
    (as :meth:`~onnx2fpga.api.CompiledDesign.simulate` returns for several outputs).

    Equal means same shape and every element equal (NaN equals NaN), or within
    ``atol + rtol * |expected|`` when a tolerance is given. The :class:`AssertionError` names,
    per output, the shapes, how many elements and inferences (indices along axis 0) differ,
    and the first ``max_shown`` differing elements with their index, actual and expected
    value.
    """
    __tracebackhide__ = True
    if isinstance(actual, dict) or isinstance(expected, dict):
        if not (isinstance(actual, dict) and isinstance(expected, dict)):
            raise AssertionError(f"outputs differ: actual is a {type(actual).__name__}, "
                                 f"expected a {type(expected).__name__}")
        if set(actual) != set(expected):
            missing = [k for k in expected if k not in actual]
            extra = [k for k in actual if k not in expected]
            raise AssertionError(f"output names differ: missing {missing}, unexpected {extra}")
        problems = [p for p in (_difference(actual[k], expected[k], rtol, atol, max_shown,
                                            f"output {k!r}") for k in expected) if p]
        if problems:
            raise AssertionError(f"{len(problems)} of {len(expected)} outputs differ\n"
                                 + "\n".join(problems))
        return
    problem = _difference(actual, expected, rtol, atol, max_shown, "outputs")
    if problem:
        raise AssertionError(problem)


def _difference(actual, expected, rtol, atol, max_shown, what) -> str:
    """"" when equal, else the readable account of the difference."""
    import numpy as np

    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return f"{what} differ in shape: actual {a.shape}, expected {e.shape}"
    if rtol or atol:
        bad = ~np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    else:
        bad = a != e
        if np.issubdtype(a.dtype, np.inexact) and np.issubdtype(e.dtype, np.inexact):
            bad &= ~(np.isnan(a) & np.isnan(e))
    bad = np.asarray(bad)
    n = int(bad.sum())
    if n == 0:
        return ""
    tolerance = f" beyond atol={atol}, rtol={rtol}" if rtol or atol else ""
    lines = [f"{what} differ{tolerance}: {n} of {bad.size} elements "
             f"({100 * n / bad.size:.3g} %); shape {a.shape}, dtype {a.dtype} (expected "
             f"{e.dtype})"]
    if a.ndim > 1:
        rows = np.flatnonzero(bad.reshape(len(bad), -1).any(axis=1))
        shown = ", ".join(map(str, rows[:max_shown])) + (", ..." if len(rows) > max_shown
                                                         else "")
        lines.append(f"  in {len(rows)} of {len(bad)} inferences along axis 0: {shown}")
    where = np.argwhere(bad)[:max_shown]
    cells = [("index", "actual", "expected")]
    for idx in where:
        idx = tuple(int(i) for i in idx)
        cells.append((f"[{', '.join(map(str, idx))}]", repr(a[idx].item()),
                      repr(e[idx].item())))
    widths = [max(len(row[c]) for row in cells) for c in range(3)]
    lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
              for row in cells]
    if n > max_shown:
        lines.append(f"  ... and {n - max_shown} more")
    return "\n".join(lines)
