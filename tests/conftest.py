import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _shared_verilator_runtime(tmp_path_factory):
    """Compile Verilator's runtime objects once per test session, not once per design."""
    from onnx2fpga.sim.rtl import RUNTIME_CACHE_ENV
    if RUNTIME_CACHE_ENV not in os.environ:
        os.environ[RUNTIME_CACHE_ENV] = str(tmp_path_factory.mktemp("verilator-runtime"))
    yield
