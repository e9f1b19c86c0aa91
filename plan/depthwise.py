"""Cycle model of the depthwise core (:class:`~onnx2fpga.hw.depthwise.DepthwiseCore`): steady-state
cycles and latency per output pixel, in the conventions of :mod:`onnx2fpga.plan.cost`.
"""

from __future__ import annotations

import numpy as np

from .reduce import ReduceTiming, check_geometry

__all__ = ["depthwise_cycles", "depthwise_latency", "DepthwiseTiming"]


def depthwise_cycles(channels: int, window: int, lanes: int = 1) -> int:
    """Steady-state cycles per output pixel of a :class:`DepthwiseCore`.

    ``window * (channels // lanes)``: one input transfer per cycle, and the outputs of a pixel
    never hold up the next one (when the output is not stalled). An inference of ``P`` output
    pixels takes ``P`` times as many.

    Raises
    ------
    TypeError, ValueError
        If a count is not a positive integer or ``lanes`` does not divide ``channels``.
    """
    channels, window, lanes = check_geometry(channels, window, lanes)
    return window * (channels // lanes)


def depthwise_latency(channels: int, window: int, lanes: int = 1) -> int:
    """Cycles from the first input transfer of an output pixel to its last output transfer.

    ``window * (channels // lanes) + 2`` with the input at one transfer per cycle, the output
    never stalled and the core idle before: the last input transfer comes
    ``window * folds - 1`` cycles after the first, then the input register (with the weight
    ROM read), the product register and the output register take one cycle each.

    Raises
    ------
    TypeError, ValueError
        If a count is not a positive integer or ``lanes`` does not divide ``channels``.
    """
    return depthwise_cycles(channels, window, lanes) + 2


def int_array(name: str, value, shape: tuple) -> np.ndarray:
    """``value`` as an int64 array of ``shape``."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an array of integers, not of dtype {arr.dtype}")
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, not {arr.shape}")
    if arr.dtype == np.uint64 and arr.size and arr.max() >= 1 << 63:
        raise ValueError(f"{name} must fit 64-bit signed integers, not {arr.max()}")
    return arr.astype(np.int64)


class DepthwiseTiming(ReduceTiming):
    """A :class:`~onnx2fpga.hw.depthwise.DepthwiseCore`: a window reduction with one more
    register (the products)."""
    kinds = ("depthwise",)
    extra = 1
