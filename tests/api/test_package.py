"""The top-level package: its verbs mirror the API they forward to, its errors are exported,
``import onnx2fpga`` stays light, and it ships ``py.typed``."""

import inspect
import re
import subprocess
import sys

import pytest

import onnx2fpga
from onnx2fpga import api, runtime
from tests.helpers.paths import ROOT


@pytest.mark.parametrize("name,target", [("compile", api.compile), ("load", api.load),
                                         ("connect", runtime.connect)])
def test_verbs_mirror_what_they_call(monkeypatch, name, target):
    """Same parameters (names, kinds, defaults, annotations) as the function they forward
    to, read from both at run time; and every argument arrives there unchanged."""
    verb = getattr(onnx2fpga, name)
    assert inspect.signature(verb) == inspect.signature(target)
    calls = []

    def record(*args, **kwargs):
        calls.append(inspect.signature(target).bind(*args, **kwargs).arguments)
        return "result"

    monkeypatch.setattr(inspect.getmodule(target), name, record)
    # a distinct object for every parameter
    given = {p: object() for p in inspect.signature(target).parameters}
    assert verb(**given) == "result"
    assert len(calls) == 1 and calls[0].keys() == given.keys()
    assert all(calls[0][p] is given[p] for p in given)


def _error_classes() -> dict:
    """Every class in the package's source that derives, directly or through another such
    class, from Onnx2FpgaError (read from the source, not from the package's list)."""
    bases = {}
    for folder in ("onnx2fpga", "ir", "plan", "frontend", "hw", "sim", "boards"):
        for path in (ROOT / folder).rglob("*.py"):
            for cls, base in re.findall(r"^class (\w+)\(([^)]*)\):", path.read_text(), re.M):
                bases[cls] = [b.strip() for b in base.split(",")]
    found, grew = {"Onnx2FpgaError"}, True
    while grew:
        new = {c for c, bs in bases.items() if c not in found and found & set(bs)}
        found |= new
        grew = bool(new)
    return found


def test_every_error_is_exported_at_the_top_level():
    names = _error_classes() | {"Onnx2FpgaWarning"}
    assert len(names) >= 20
    assert names <= set(onnx2fpga.__all__)
    ns = {}
    exec(f"from onnx2fpga import {', '.join(sorted(names))}", ns)   # noqa: S102
    for name in names - {"Onnx2FpgaWarning"}:
        assert issubclass(ns[name], onnx2fpga.Onnx2FpgaError), name
    from onnx2fpga.boards.protocol import LinkError
    from onnx2fpga.sim.verilator_build import RtlSimulationError
    assert ns["LinkError"] is LinkError and ns["RtlSimulationError"] is RtlSimulationError
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchError'"):
        onnx2fpga.NoSuchError  # noqa: B018


def test_import_is_light(tmp_path):
    code = ("import sys, onnx2fpga; from onnx2fpga import Onnx2FpgaError, MissingExtraError; "
            "print(sorted(m for m in ('numpy', 'onnx', 'amaranth', 'onnx2fpga.api') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout
    assert out.strip() == "[]"


def test_py_typed_is_installed():
    assert (ROOT / "onnx2fpga" / "py.typed").is_file()
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["onnx2fpga"]
