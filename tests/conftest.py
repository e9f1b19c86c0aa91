import os
import tempfile

import pytest


@pytest.fixture(scope="session", autouse=True)
def _shared_verilator_runtime(tmp_path_factory):
    """Compile Verilator's runtime objects once per test session, not once per design."""
    from onnx2fpga.sim.rtl import RUNTIME_CACHE_ENV
    if RUNTIME_CACHE_ENV not in os.environ:
        os.environ[RUNTIME_CACHE_ENV] = str(tmp_path_factory.mktemp("verilator-runtime"))
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
