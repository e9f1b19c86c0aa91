"""The golden model: integer-exact numpy definitions of what the hardware computes.

One function per operation. The compiler (calibration, accuracy figures), the core tests and the
end-to-end tests all call these; nothing re-derives them. Depends on numpy only.

All integer arithmetic is done in int64 after checking that it cannot overflow (accumulators
are bounded by :func:`onnx2fpga.dataflow.acc_type_for`; requantization products are checked
per call), or in Python integers where int64 could overflow.
"""

from __future__ import annotations

import numpy as np

from ..dataflow import Dataflow, DenseLayer, RequantLayer, RequantStage

__all__ = [
    "round_shift", "requant", "requant_stages", "dense", "run_layer", "run_dataflow",
    "quantize_linear", "dequantize_linear",
]

_INT64_SAFE = (1 << 62)


def round_shift(v, shift: int, rounding: str = "half_even") -> np.ndarray:
    """``v / 2**shift`` rounded to the nearest integer.

    ``rounding="half_even"``: ties go to the even neighbour (IEEE / ONNX QuantizeLinear).
    ``rounding="half_away"``: ties go away from zero (C ``round``, QONNX ``ROUND`` is half_even).
    Works on int64 arrays; the hardware implements exactly this with an arithmetic shift.
    """
    v = np.asarray(v, dtype=np.int64)
    if shift == 0:
        return v.copy()
    floor = v >> shift                                 # arithmetic shift: floor division
    rem = v - (floor << shift)                         # 0 <= rem < 2**shift
    half = np.int64(1) << (shift - 1)
    up = rem > half
    tie = rem == half
    if rounding == "half_even":
        up |= tie & ((floor & 1) == 1)
    elif rounding == "half_away":
        up |= tie & (v >= 0)
    else:
        raise ValueError(f"Rounding must be 'half_even' or 'half_away', not {rounding!r}")
    return floor + up.astype(np.int64)


def requant(x, stage: RequantStage, channel_axis: int = -1) -> np.ndarray:
    """One :class:`~onnx2fpga.dataflow.RequantStage` applied to integer array ``x``.

    ``x[..., c]`` uses channel ``c``'s multiplier and offset (``channel_axis`` selects the
    axis; single-entry parameters apply to every element).
    """
    x = np.asarray(x, dtype=np.int64)
    channels = x.shape[channel_axis] if x.ndim else 1
    m, off = stage.channel_params(channels) if stage.multiplier.size > 1 or \
        stage.offset.size > 1 else (stage.multiplier, stage.offset)
    shape = [1] * x.ndim
    if x.ndim:
        shape[channel_axis] = -1
    m = m.reshape(shape) if m.size > 1 else m.reshape(())
    off = off.reshape(shape) if off.size > 1 else off.reshape(())
    centred = x - stage.in_zero_point
    bound = int(np.abs(centred).max(initial=0)) * int(np.abs(m).max(initial=0)) + \
        int(np.abs(off).max(initial=0))
    if bound >= _INT64_SAFE:
        raise OverflowError(f"Requantization product needs more than 62 bits ({bound:#x})")
    y = round_shift(centred * m + off, stage.shift, stage.rounding) + stage.zero_point
    return np.clip(y, stage.lo, stage.hi)


def requant_stages(x, stages, channel_axis: int = -1) -> np.ndarray:
    for stage in stages:
        x = requant(x, stage, channel_axis)
    return np.asarray(x, dtype=np.int64)


def dense(x, weight, bias, in_zero_point: int = 0) -> np.ndarray:
    """``(x - in_zero_point) @ weight.T + bias`` on integers (ONNX MatMulInteger semantics
    with a bias added, as in ONNX QLinearMatMul / Gemm before requantization)."""
    x = np.asarray(x, dtype=np.int64) - in_zero_point
    w = np.asarray(weight, dtype=np.int64)
    bound = int(np.abs(x).max(initial=0)) * int(np.abs(w).sum(axis=1).max(initial=0)) + \
        int(np.abs(np.asarray(bias)).max(initial=0))
    if bound >= _INT64_SAFE:
        raise OverflowError("Accumulator needs more than 62 bits")
    return x @ w.T + np.asarray(bias, dtype=np.int64)


def run_layer(layer, x) -> np.ndarray:
    """Run one dataflow layer on a batch ``x`` of shape ``(batch, layer.in_size)``."""
    x = np.asarray(x, dtype=np.int64)
    if x.ndim != 2 or x.shape[1] != layer.in_size:
        raise ValueError(f"Layer {layer.name!r} takes (batch, {layer.in_size}) integers, "
                         f"not {x.shape}")
    lo, hi = layer.in_type.lo, layer.in_type.hi
    if x.size and (x.min() < lo or x.max() > hi):
        raise ValueError(f"Input of layer {layer.name!r} is outside {layer.in_type.name}")
    if isinstance(layer, DenseLayer):
        acc = dense(x, layer.weight, layer.bias, layer.in_zero_point)
        return requant_stages(acc, layer.requant)
    if isinstance(layer, RequantLayer):
        return requant_stages(x, layer.requant)
    raise TypeError(f"Unknown layer type {type(layer).__name__}")


def run_dataflow(dataflow: Dataflow, x, trace: dict | None = None) -> np.ndarray:
    """Run the whole hardware part on integer input ``x`` of shape ``(batch, input.size)``.

    Returns ``(batch, output.size)`` integers, exactly what the accelerator streams out.
    With ``trace``, every layer's output is stored under its name.
    """
    x = np.asarray(x, dtype=np.int64).reshape(len(x), -1)
    for layer in dataflow.layers:
        x = run_layer(layer, x)
        if trace is not None:
            trace[layer.name] = x
    return x


def _along(axis: int, ndim: int, scale, zero_point):
    """Scale (float32) and zero point (int64), reshaped to broadcast along ``axis`` when
    they are per-axis (1-D with more than one entry)."""
    scale = np.asarray(scale, dtype=np.float32)
    zp = np.asarray(zero_point, dtype=np.int64)
    if scale.ndim == 1 and scale.size > 1:
        shape = [1] * ndim
        shape[axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return scale, zp


def quantize_linear(x, scale, zero_point, lo: int, hi: int, axis: int = 1) -> np.ndarray:
    """ONNX QuantizeLinear (opsets 10-23): ``saturate(round_half_even(x / scale) + zero_point)``.

    Computed in float32 like onnxruntime; ``scale``/``zero_point`` are scalars or 1-D along
    ``axis``. Returns int64.
    """
    x = np.asarray(x, dtype=np.float32)
    scale, zp = _along(axis, x.ndim, scale, zero_point)
    q = np.rint(x / scale).astype(np.int64) + zp
    return np.clip(q, lo, hi)


def dequantize_linear(q, scale, zero_point, axis: int = 1) -> np.ndarray:
    """ONNX DequantizeLinear: ``(q - zero_point) * scale`` in float32."""
    q = np.asarray(q, dtype=np.int64)
    scale, zp = _along(axis, q.ndim, scale, zero_point)
    return ((q - zp).astype(np.float32) * scale).astype(np.float32)
