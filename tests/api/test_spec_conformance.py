"""docs/onnx-conformance.md covers every checklist ID and names only tests that exist."""

import ast
import os
import re

from tests.helpers import paths

TESTS = str(paths.ROOT / "tests")
DOC = str(paths.DOCS / "onnx-conformance.md")

# The item IDs of the ONNX consumer checklist (shared/spec/onnx-consumer-checklist.md),
# copied here so that the test needs no file outside the repository.
CHECKLIST = ([f"MD-{k:02d}" for k in range(1, 14)] + [f"GR-{k:02d}" for k in range(1, 17)]
             + [f"ND-{k:02d}" for k in range(1, 11)] + [f"OP-{k:02d}" for k in range(1, 11)]
             + [f"DT-{k:02d}" for k in range(1, 9)] + [f"SH-{k:02d}" for k in range(1, 7)]
             + ["ED-01", "ED-02"] + [f"FN-{k:02d}" for k in range(1, 7)] + ["TR-01", "TR-02"]
             + [f"VC-{k:02d}" for k in range(1, 6)])


def _rows():
    rows = {}
    with open(DOC) as f:
        for line in f:
            m = re.match(r"^\| ([A-Z]{2}-\d\d) \| (.*) \|(.*)\|$", line.rstrip("\n"))
            if m:
                assert m.group(1) not in rows, f"{m.group(1)} listed twice"
                rows[m.group(1)] = (m.group(2), m.group(3).strip())
    return rows


def _tests_in(filename):
    with open(os.path.join(TESTS, filename)) as f:
        tree = ast.parse(f.read())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_every_checklist_id_is_in_the_table():
    rows = _rows()
    assert len(CHECKLIST) == 78
    assert sorted(rows) == sorted(CHECKLIST)


def test_every_row_has_tests_or_a_reason_and_the_tests_exist():
    with open(DOC) as f:
        text = f.read()
    refs = re.findall(r"((?:[a-z]+/)?test_[a-z_]+\.py)::(test_\w+)", text)
    assert len(refs) > 78
    for filename, name in refs:
        assert name in _tests_in(filename), f"{filename}::{name} does not exist"
    for item, (what, tests) in _rows().items():
        assert tests or what.startswith("Reason: "), f"{item} has neither tests nor a reason"


def test_counts():
    rows = _rows()
    tested = [k for k, (_, t) in rows.items() if t]
    reasons = [k for k, (_, t) in rows.items() if not t]
    assert (len(tested), len(reasons)) == (76, 2), (tested, reasons)
