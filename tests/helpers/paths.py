"""Paths of the repository the tests read (never write): its root, the README, the bundled
examples, the docs and the test data (behavioural models of vendor primitives)."""

from pathlib import Path

__all__ = ["ROOT", "README", "EXAMPLES", "DOCS", "DATA"]

ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs"
DATA = Path(__file__).resolve().parent / "data"
