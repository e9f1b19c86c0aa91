"""The README's promises: its pytest example runs as written."""

import re

import numpy as np
import pytest

from tests.helpers import paths
from tests.helpers.models import float_mlp, save

README = paths.README


@pytest.mark.rtl
def test_readme_pytest_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    example = next(b for b in blocks if "def test_my_model_in_hardware" in b)
    monkeypatch.chdir(tmp_path)
    save(float_mlp((12, 8, 4)), tmp_path / "my_model.onnx")
    np.save(tmp_path / "calibration.npy",
            np.random.default_rng(0).standard_normal((64, 1, 12)).astype(np.float32))
    scope = {}
    exec(compile(example, str(README), "exec"), scope)
    scope["test_my_model_in_hardware"](tmp_path)
    assert (tmp_path / "design" / "top.v").is_file()
