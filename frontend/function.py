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
from ..ir import LutStage
from ..plan.lut import LUT_MAX_INPUT_BITS
from ..sim import host
from .epilogue import QuantInfo, out_info
from .groups import QDQ, Group, QdqGraph

__all__ = ["function_table", "function_node"]


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
