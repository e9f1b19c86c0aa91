"""Joins of two activations: add (a residual join), sub, mul, min, max."""

from __future__ import annotations

import numpy as np

from ...ir.layers import AddLayer
from ..builder import Builder, finish_layer
from .base import LayerKind, divisors

__all__ = ["Add"]


class Add(LayerKind):
    """An :class:`~onnx2fpga.ir.AddLayer`: ``add`` joining both inputs (the second in the
    first's stream order) by the layer's ``op``, then ``requant``. Folding: ``lanes``
    elements per transfer."""
    layer_type = AddLayer

    def check(self, layer) -> None:
        super().check(layer)
        self.check_size_lanes(layer)

    def required_order(self, layer, k: int):
        return "any" if k == 0 else "first"

    def output_order(self, layer, in_orders):
        return in_orders[0]

    def stages(self, b: Builder, layer, ins, orders, k, out_net) -> str:
        a = b.lanes(ins[0], layer.lanes, f"convert_{k}a")
        c = b.lanes(ins[1], layer.lanes, f"convert_{k}b")
        for m in layer.multipliers:
            if m.size != 1:
                raise ValueError(f"Layer {layer.name!r}: the add core takes one multiplier "
                                 f"per input, not per-channel ones")
        net = b.add("add", f"add_{k}", [a, c], layer.sum_type, layer.lanes, layer.out_size,
                    layer=layer,
                    params={"b_type": b.nets[c][0], "zero_points": tuple(layer.in_zero_points),
                            "multipliers": tuple(int(m[0]) for m in layer.multipliers),
                            "op": layer.op})
        net = b.requant(net, layer.requant, layer.shape, orders[0], f"requant_{k}", layer)
        return finish_layer(b, net, out_net)

    def options(self, layer):
        shape = layer.shape
        c = shape[0] if len(shape) > 1 else layer.out_size
        return [(layer.out_size // lanes, lanes, {"lanes": lanes}) for lanes in divisors(c)]

    def need(self, layer):
        k = np.arange(layer.out_size, dtype=np.int64)
        return [k + 1, k + 1]

    def manifest(self, layer) -> dict:
        return {**super().manifest(layer), "op": layer.op,
                "in_zero_points": layer.in_zero_points,
                "multipliers": [int(m[0]) for m in layer.multipliers]}
