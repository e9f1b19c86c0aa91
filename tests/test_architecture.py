"""The import graph of the package, read from the source: the layering rules of
``docs/architecture.md`` hold.

Every ``import`` counts, those inside functions too (a nested import hides a cycle, it does not
remove it). The rules:

- no import cycle between modules;
- below the root package, no project module imported inside a function (but the heavy
  :data:`HEAVY`): a nested import dodges a cycle rather than removing it;
- no private name (``_x``, dunders aside) imported from another module;
- each package imports only the packages below it (:data:`ALLOWED`); the IR imports nothing
  else of the project; planning never imports Amaranth; the frontend never the hardware
  package; the hardware package never ``onnx``;
- the golden model imports nothing beyond numpy, the standard library and the IR;
- no source file is longer than :data:`MAX_LINES` lines.

The checks are functions of a source tree, so that the tests can show they fail on a tree with a
cycle or a private import added (a check that cannot fail proves nothing).
"""

from __future__ import annotations

import ast
import os
import shutil
import sys

import pytest

from tests.helpers import paths

ROOT = str(paths.ROOT)

#: Folder of each subpackage of ``onnx2fpga`` (pyproject.toml's package-dir mapping).
PACKAGES = {"onnx2fpga": "onnx2fpga", "ir": "onnx2fpga.ir", "plan": "onnx2fpga.plan",
            "frontend": "onnx2fpga.frontend", "hw": "onnx2fpga.hw", "sim": "onnx2fpga.sim",
            "boards": "onnx2fpga.boards"}

#: Layer of each package -> the project packages its modules may import (besides itself).
#: ``errors``, ``version``, ``log`` (logging) and ``designdir`` (files, locks) are leaves of the
#: root package that every layer may use; the rest of the root package (API, CLI, report, runtime) is the top,
#: imported by no layer below.
ALLOWED = {
    "onnx2fpga.ir": set(),
    "onnx2fpga.sim": {"onnx2fpga.ir"},
    "onnx2fpga.plan": {"onnx2fpga.ir", "onnx2fpga.sim"},
    "onnx2fpga.frontend": {"onnx2fpga.ir", "onnx2fpga.sim", "onnx2fpga.plan"},
    "onnx2fpga.hw": {"onnx2fpga.ir", "onnx2fpga.sim", "onnx2fpga.plan"},
    "onnx2fpga.boards": {"onnx2fpga.ir", "onnx2fpga.sim", "onnx2fpga.plan", "onnx2fpga.hw"},
}
LEAVES = {"onnx2fpga.errors", "onnx2fpga.version", "onnx2fpga.log", "onnx2fpga.designdir"}

#: Third-party imports a package must never make.
FORBIDDEN = {
    "onnx2fpga.ir": {"onnx", "amaranth", "amaranth_boards"},
    "onnx2fpga.plan": {"onnx", "amaranth", "amaranth_boards"},
    "onnx2fpga.frontend": {"amaranth", "amaranth_boards"},
    "onnx2fpga.hw": {"onnx", "onnxruntime"},
}

GOLDEN = "onnx2fpga.sim.golden"
MAX_LINES = 900


def modules(root: str) -> dict[str, str]:
    """Module name -> source path of every module of the package under ``root``."""
    out = {}
    for folder, package in PACKAGES.items():
        top = os.path.join(root, folder)
        for path, dirs, files in sorted(os.walk(top)):
            dirs[:] = sorted(d for d in dirs if os.path.isfile(os.path.join(path, d,
                                                                            "__init__.py")))
            rel = os.path.relpath(path, top)
            pkg = package if rel == "." else f"{package}.{rel.replace(os.sep, '.')}"
            for name in sorted(files):
                if name.endswith(".py"):
                    out[pkg if name == "__init__.py" else f"{pkg}.{name[:-3]}"] = \
                        os.path.join(path, name)
    return out


def imports(root: str, *, nested: bool = False) -> list[tuple[str, str, str | None, int]]:
    """Every import of the package: ``(module, imported module, name or None, line)``; a
    ``from X import name`` of a submodule counts as an import of that submodule. With
    ``nested``, only the imports inside a function."""
    mods = modules(root)
    out = []
    for mod, path in mods.items():
        package = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        inner = {id(n) for fn in ast.walk(tree)
                 if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(fn)}
        for node in ast.walk(tree):
            if nested and id(node) not in inner:
                continue
            if isinstance(node, ast.Import):
                out += [(mod, a.name, None, node.lineno) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package
                    for _ in range(node.level - 1):
                        base = base.rsplit(".", 1)[0]
                    target = base + ("." + node.module if node.module else "")
                else:
                    target = node.module
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    if sub in mods:
                        out.append((mod, sub, None, node.lineno))
                    else:
                        out.append((mod, target, a.name, node.lineno))
    return out


def _package_of(mod: str) -> str:
    parts = mod.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1] in {
        p.split(".")[-1] for p in PACKAGES.values() if p != "onnx2fpga"} else mod


def cycles(root: str) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one module (or a module
    importing itself), each sorted."""
    mods = modules(root)
    edges: dict[str, set] = {m: set() for m in mods}
    for mod, target, _, _ in imports(root):
        if target in mods and target != mod:
            edges[mod].add(target)
    index, low, stack, on, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(mods)))
    try:
        for v in sorted(mods):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def private_imports(root: str) -> list[str]:
    """``module:line imports _name from other`` for every private name imported from another
    module (dunder names aside)."""
    return [f"{mod}:{line} imports {name} from {target}"
            for mod, target, name, line in imports(root)
            if name and name.startswith("_") and not name.startswith("__")
            and target.startswith("onnx2fpga") and target != mod]


def layering_violations(root: str) -> list[str]:
    """Imports that go up or sideways between the packages, or into a forbidden third-party
    package, and imports of the golden model beyond numpy, the standard library and the IR."""
    bad = []
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for mod, target, _, line in imports(root):
        pkg, top = _package_of(mod), target.split(".")[0]
        where = f"{mod}:{line} imports {target}"
        if mod == GOLDEN and not (top in stdlib or top == "numpy"
                                  or target == "onnx2fpga.ir"
                                  or target.startswith("onnx2fpga.ir.")):
            bad.append(f"{where} (the golden model takes only numpy and the IR)")
        if top in FORBIDDEN.get(pkg, ()):
            bad.append(f"{where} ({pkg} never imports {top})")
        if top != "onnx2fpga" or pkg not in ALLOWED:
            continue
        tpkg = _package_of(target)
        if tpkg == pkg or target in LEAVES:
            continue
        if tpkg not in ALLOWED[pkg]:
            bad.append(f"{where} ({pkg} may import only "
                       f"{', '.join(sorted(ALLOWED[pkg] | LEAVES)) or 'itself'})")
    return bad


#: Project modules that may be imported inside a function below the root package: they load a
#: heavy optional stack (cocotb and Verilator) that most callers never need.
HEAVY = {"onnx2fpga.sim.rtl"}


def nested_imports(root: str) -> list[str]:
    """Imports of project modules placed inside functions below the root package (the API
    and CLI keep ``import onnx2fpga`` light by importing lazily; anywhere else a nested
    import is there to dodge a cycle), :data:`HEAVY` aside."""
    return [f"{mod}:{line} imports {target} inside a function"
            for mod, target, _, line in imports(root, nested=True)
            if target.startswith("onnx2fpga.") and _package_of(mod) in ALLOWED
            and target not in HEAVY]


def long_files(root: str) -> list[str]:
    out = []
    for path in modules(root).values():
        with open(path) as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            out.append(f"{os.path.relpath(path, root)}: {n} lines")
    return out


# ---------------------------------------------------------------------------------------------
# The package as it is


def test_no_import_cycle():
    assert cycles(ROOT) == []


def test_no_private_name_imported_from_another_module():
    assert private_imports(ROOT) == []


def test_packages_import_only_the_layers_below_them():
    assert layering_violations(ROOT) == []


def test_no_nested_import_below_the_api():
    assert nested_imports(ROOT) == []


def test_no_source_file_over_the_limit():
    assert long_files(ROOT) == []


# ---------------------------------------------------------------------------------------------
# The checks fail where they should


@pytest.fixture
def tree(tmp_path):
    """A copy of the package's source folders to break."""
    for folder in PACKAGES:
        shutil.copytree(os.path.join(ROOT, folder), tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _append(path, text):
    with open(path, "a") as f:
        f.write(text)


def test_a_cycle_is_found(tree):
    assert cycles(str(tree)) == []
    # hw.top imports hw.matvec; a nested import back closes a cycle all the same.
    _append(tree / "hw" / "matvec.py", "\n\ndef _late():\n    from .top import Accelerator\n"
                                       "    return Accelerator\n")
    assert cycles(str(tree)) == [["onnx2fpga.hw.matvec", "onnx2fpga.hw.top"]]


def test_a_private_import_is_found(tree):
    assert private_imports(str(tree)) == []
    _append(tree / "hw" / "top.py", "\nfrom .requant import _StagePlan  # noqa\n")
    assert private_imports(str(tree)) == [
        f"onnx2fpga.hw.top:{sum(1 for _ in open(tree / 'hw' / 'top.py'))} imports "
        f"_StagePlan from onnx2fpga.hw.requant"]


def test_a_layering_violation_is_found(tree):
    assert layering_violations(str(tree)) == []
    _append(tree / "frontend" / "qdq.py", "\nfrom ..hw.top import Accelerator  # noqa\n")
    _append(tree / "sim" / "golden.py", "\nimport onnx  # noqa\n")
    _append(tree / "plan" / "cost.py", "\nimport amaranth  # noqa\n")
    found = layering_violations(str(tree))
    assert sorted(f.split(" (")[0].split(":")[0] for f in found) == \
        ["onnx2fpga.frontend.qdq", "onnx2fpga.plan.cost", "onnx2fpga.sim.golden"]
    assert any("never imports amaranth" in f for f in found)
    assert any("golden model takes only numpy" in f for f in found)


def test_a_nested_import_is_found(tree):
    assert nested_imports(str(tree)) == []
    _append(tree / "plan" / "fold.py", "\n\ndef _late():\n    from .cost import stage_cycles\n"
                                       "    return stage_cycles\n")
    found = nested_imports(str(tree))
    assert [f.split(":")[0] for f in found] == ["onnx2fpga.plan.fold"]
    assert found[0].endswith("imports onnx2fpga.plan.cost inside a function")


def test_a_long_file_is_found(tree):
    path = tree / "ir" / "types.py"
    _append(path, "\n" * MAX_LINES)
    assert any(f.startswith(os.path.join("ir", "types.py")) for f in long_files(str(tree)))
