"""A function group's table: the nodes between one quantized tensor's DequantizeLinear and a
QuantizeLinear (:meth:`~onnx2fpga.frontend.groups.QdqGraph.match_function`) evaluated on
every integer of the input type, as ONNX defines them.

The table is computed the way the model computes it, so that the golden model equals
onnxruntime: every input code dequantized (float32), the group's operators applied by the
host implementation (:mod:`onnx2fpga.sim.host`, float32 results; quantizers inside the group
included), then the group's QuantizeLinear (round half to even, saturation). A constant
that varies along the channel axis (a PRelu slope, a per-channel Mul) gives one table per
channel.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from ..ir import LutStage, ThresholdStage
from ..plan.lut import LUT_MAX_INPUT_BITS
from ..sim import host
from .epilogue import QuantInfo, out_info
from .groups import QDQ, Group, QdqGraph
from .ir import Node

__all__ = ["function_table", "function_node", "accumulator_thresholds", "accumulator_flips",
           "MONOTONIC_SAMPLES"]


def function_node(grp: Group):
    """The node a function group is named by in messages: its first operator that is no
    QuantizeLinear or DequantizeLinear (its quantizer if there is none)."""
    return next((n for n in grp.after if n.op not in QDQ), grp.quant)


def function_table(qg: QdqGraph, grp: Group, qi: QuantInfo) -> LutStage:
    """The :class:`~onnx2fpga.ir.LutStage` of function group ``grp`` on the quantized input
    ``qi`` (``table`` with one row, or one per channel: axis 1 of the ONNX tensor).

    Raises
    ------
    UnsupportedError
        An input of more than :data:`~onnx2fpga.plan.lut.LUT_MAX_INPUT_BITS` bits, a
        constant that varies along more than the channel axis, a result that is not a
        number (NaN) for some input.
    """
    node = function_node(grp)
    where = node.describe()
    bits = qi.type.bits
    if bits > LUT_MAX_INPUT_BITS:
        raise UnsupportedError([f"{where}: its input is quantized to {bits} bits; a function "
                                f"of one quantized input runs in hardware as a table of "
                                f"inputs of at most {LUT_MAX_INPUT_BITS} bits"])
    src = grp.dqs[0]
    shape = qg.shape(src.outputs[0])
    codes = np.arange(qi.type.lo, qi.type.hi + 1, dtype=np.int64)
    x = codes.reshape((-1,) + (1,) * max(len(shape) - 1, 0))
    nodes = [src] + grp.after + [grp.quant]
    consts = dict(qg.graph.constants)
    for n in nodes:
        for i in n.inputs:
            if i and i not in consts and qg.is_const(i) and \
                    qg.float_constant(i)[0] is not None:
                consts[i] = qg.float_constant(i)[0].astype(np.float32)
    try:
        env = host.run_nodes(nodes, {src.inputs[0]: x}, consts)
    except host.HostOpError as e:
        raise UnsupportedError([f"{where}: the function has no quantized value for some "
                                f"input ({e})"]) from None
    y = np.asarray(env[grp.quant.outputs[0]], np.int64)
    channels = shape[1] if len(shape) > 1 else 1
    ok = y.ndim == x.ndim and y.shape[0] == len(codes) and \
        all(d == 1 for d in y.shape[2:]) and (y.ndim < 2 or y.shape[1] in (1, channels))
    if not ok:
        raise UnsupportedError([f"{where}: a constant of the function varies along more "
                                f"than the channel axis of {tuple(shape)}"])
    table = y.reshape(len(codes), -1).T
    if len(table) > 1 and np.all(table == table[:1]):
        table = table[:1]
    return LutStage(table, qi.type.lo, out_info(grp).type)


# -- a function of an accumulator -----------------------------------------------------------

#: Accumulator values per channel at which :func:`accumulator_thresholds` checks, besides
#: both sides of every threshold, that the quantized function does not fall.
MONOTONIC_SAMPLES = 4097


def _acc_evaluator(qg: QdqGraph, grp: Group, acc_scale, bias_real, channels: int,
                   rank: int):
    """``f(a)``: the quantized output of group ``grp`` (a MatMul / Gemm / Conv whose
    epilogue ``after`` is followed by function operators ``func``, then ``quant``) for
    accumulator values ``a`` of shape ``(k, channels)``, computed as the host computes the
    float model: the accumulator dequantized per channel (``a * acc_scale[c]`` in
    float32, a DequantizeLinear), plus the float bias, then every node of the group in
    graph order in float32 (:mod:`onnx2fpga.sim.host`), then the QuantizeLinear."""
    core = grp.core
    out = core.outputs[0]
    has_bias = bool(np.any(bias_real))
    deq_out = f"{out}__unbiased" if has_bias else out
    attrs = {"scale": np.broadcast_to(np.asarray(acc_scale, np.float32).reshape(-1),
                                      (channels,)).copy(),
             "zero_point": np.zeros(channels, np.int64), "axis": 1}
    nodes = [Node("DequantizeLinear", ["__accumulator"], [deq_out], attrs, "", "", 13, 13)]
    consts = dict(qg.graph.constants)
    if has_bias:
        consts[f"{out}__bias"] = np.broadcast_to(
            np.asarray(bias_real, np.float32).reshape(-1), (channels,)).reshape(
            (channels,) + (1,) * (rank - 2)).astype(np.float32)
        nodes.append(Node("Add", [deq_out, f"{out}__bias"], [out], {}, "", "", 14, 14))
    for n in grp.after + grp.func:
        for i in n.inputs:
            if i and i not in consts and qg.is_const(i) and \
                    qg.float_constant(i)[0] is not None:
                consts[i] = qg.float_constant(i)[0].astype(np.float32)
    last = (grp.after + grp.func)[-1].outputs[0]
    where = grp.func[0].describe()

    def f(a):
        a = np.asarray(a, np.int64)
        x = a.reshape(a.shape + (1,) * (rank - 2))
        try:
            env = host.run_nodes(nodes + grp.after + grp.func, {"__accumulator": x}, consts)
            env[grp.quant.inputs[0]] = env[last]           # views after it keep values
            env = host.run_nodes([grp.quant], env, consts)
        except (host.HostOpError, ValueError) as e:
            raise UnsupportedError([f"{where}: cannot evaluate the function of the "
                                    f"accumulator per channel ({e})"]) from None
        y = np.asarray(env[grp.quant.outputs[0]])
        if y.size != a.size or (y.ndim > 1 and y.shape[1] != channels):
            raise UnsupportedError([f"{where}: a constant of the function varies along "
                                    f"more than the channel axis"])
        return y.reshape(a.shape).astype(np.int64)
    return f


def accumulator_flips(qg: QdqGraph, grp: Group, acc_scale, bias_real, channels: int,
                      rank: int, value_range) -> np.ndarray | None:
    """Channels whose quantized function falls as the accumulator rises (a negative scale,
    a falling function): their weights and bias are negated so that rising thresholds
    count (see :func:`accumulator_thresholds`). None if there are none."""
    f = _acc_evaluator(qg, grp, acc_scale, bias_real, channels, rank)
    lo_v, hi_v = value_range
    y = f(np.array([[lo_v] * channels, [hi_v] * channels]))
    flip = y[1] < y[0]
    return flip if flip.any() else None


def accumulator_thresholds(qg: QdqGraph, grp: Group, acc_scale, bias_real, channels: int,
                           rank: int, value_range, flip=None) -> ThresholdStage:
    """The :class:`~onnx2fpga.ir.ThresholdStage` on an integer accumulator equal to the
    group's float epilogue, its function operators and its quantizer (FINN's
    MultiThreshold): per channel ``c`` and output level ``k``, the smallest accumulator
    value in ``value_range`` whose quantized output reaches ``k``, found by bisection on
    the float32 evaluation (:func:`_acc_evaluator`); ``flip`` marks channels whose
    accumulator is negated (:func:`accumulator_flips`).

    The function must not fall on any channel: checked on :data:`MONOTONIC_SAMPLES` values
    spread over the range and on both sides of every threshold, where the thresholds must
    give the evaluated output.

    Raises
    ------
    UnsupportedError
        A quantizer by thresholds, bipolar or Trunc; a per-axis quantizer; a function that
        is not monotonic over the accumulator's range.
    """
    qa = grp.quant.attrs
    where = grp.func[0].describe()
    if "thresholds" in qa or qa.get("bipolar") or "trunc_shift" in qa or \
            np.asarray(qa["scale"]).size != 1:
        raise UnsupportedError([f"{grp.quant.describe()}: after {grp.func[0].op} on an "
                                f"accumulator only a per-tensor QuantizeLinear is supported"])
    f0 = _acc_evaluator(qg, grp, acc_scale, bias_real, channels, rank)
    sign = np.where(flip, -1, 1) if flip is not None else np.ones(channels, np.int64)

    def f(a):                                   # a: (k, channels)
        return f0(np.asarray(a, np.int64) * sign)
    lo_v, hi_v = int(value_range[0]), int(value_range[1])
    ends = f(np.array([[lo_v] * channels, [hi_v] * channels]))
    base, top = int(ends[0].min()), int(ends[1].max())
    bits = max(abs(lo_v), abs(hi_v)).bit_length() + 1
    refusal = UnsupportedError([
        f"{where}: a non-monotonic function of a {bits}-bit accumulator without a "
        f"quantizer before it; put a quantizer (e.g. QuantIdentity / QuantReLU, a "
        f"QuantizeLinear) before the activation"])
    n = top - base
    if n <= 0:
        out_type = qa["qtype"]
        step = 1 if base < out_type.hi else -1
        t = np.full((1, 1), hi_v + 1, np.int64)
        y = f(np.linspace(lo_v, hi_v, 64).astype(np.int64)[:, None].repeat(channels, 1))
        if np.any(y != base):
            raise refusal
        return ThresholdStage(t, base, step, out_type)
    levels = base + np.arange(1, n + 1, dtype=np.int64)          # (n,)
    lo = np.full((n, channels), lo_v, np.int64)
    hi = np.full((n, channels), hi_v + 1, np.int64)            # hi_v + 1: never reached
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        ok = f(np.minimum(mid, hi_v)) >= levels[:, None]
        ok &= mid <= hi_v
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid + 1)
    t = hi.T.copy()                                               # (channels, n)
    if np.any(np.diff(t, axis=1) < 0):
        raise refusal
    grid = np.linspace(lo_v, hi_v, MONOTONIC_SAMPLES).astype(np.int64)
    sample = np.concatenate([np.broadcast_to(grid[:, None], (grid.size, channels)),
                             np.clip(t.T, lo_v, hi_v), np.clip(t.T - 1, lo_v, hi_v)])
    sample = np.sort(sample, axis=0)
    y = f(sample)
    want = base + np.stack([np.searchsorted(t[c], sample[:, c], side="right")
                            for c in range(channels)], axis=1)
    if np.any(np.diff(y, axis=0) < 0) or np.any(y != want):
        raise refusal
    if np.all(t == t[:1]):
        t = t[:1]
    return ThresholdStage(t, base, 1, qa["qtype"])
