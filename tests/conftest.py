import os
import tempfile

import pytest


@pytest.fixture(scope="session", autouse=True)
def _shared_build_cache(tmp_path_factory):
    """One build cache (Verilator's runtime objects, built simulators) for the whole session,
    shared by the xdist workers (their base folders are siblings), unless the user set
    ``$ONNX2FPGA_CACHE_DIR``: a design compiled by several tests is built once."""
    from onnx2fpga.sim.rtl import CACHE_ENV
    if CACHE_ENV not in os.environ:
        base = tmp_path_factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):
            base = base.parent                  # the session's folder, above popen-gwN
        os.environ[CACHE_ENV] = str(base / "onnx2fpga-cache")
    yield


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_in_pytest_basetemp(tmp_path_factory):
    """Every temporary folder of the session (``compile()`` without an output folder makes
    one with ``tempfile.mkdtemp``, so do the CLI's subprocesses) goes below pytest's own
    base folder, which pytest prunes to its last three runs, instead of leaking into /tmp."""
    tmp = str(tmp_path_factory.mktemp("tempfile"))
    saved = (tempfile.tempdir, os.environ.get("TMPDIR"))
    tempfile.tempdir = tmp
    os.environ["TMPDIR"] = tmp
    yield
    tempfile.tempdir = saved[0]
    if saved[1] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved[1]
