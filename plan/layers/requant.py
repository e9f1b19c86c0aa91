"""Requantization layers: an elementwise epilogue on its own (a BatchNormalization or an
activation between two joins, say)."""

from __future__ import annotations

import numpy as np

from ...ir.layers import RequantLayer
from ..builder import Builder, finish_layer
from .base import LayerKind, divisors

__all__ = ["Requant"]


class Requant(LayerKind):
    """A :class:`~onnx2fpga.ir.RequantLayer`: ``requant`` (or ``threshold``) cores in the
    input's stream order, ``lanes`` elements per cycle."""
    layer_type = RequantLayer

    def check(self, layer) -> None:
        super().check(layer)
        if layer.channels % layer.lanes:
            raise ValueError(f"Lanes of layer {layer.name!r} must divide channels="
                             f"{layer.channels}, not {layer.lanes}")
        if not layer.requant:
            raise ValueError(f"Layer {layer.name!r} must have at least one requant stage")

    def required_order(self, layer, k: int):
        return "any"

    def output_order(self, layer, in_orders):
        return in_orders[0]

    def stages(self, b: Builder, layer, ins, orders, k, out_net) -> str:
        net = b.lanes(ins[0], layer.lanes, f"convert_{k}")
        return finish_layer(b, b.requant(net, layer.requant, layer.shape, orders[0],
                                         f"requant_{k}", layer), out_net)

    def options(self, layer):
        shape = layer.shape
        c = shape[0] if len(shape) > 1 else layer.out_size
        return [(layer.out_size // lanes, lanes, {"lanes": lanes}) for lanes in divisors(c)]

    def need(self, layer):
        return [np.arange(layer.out_size, dtype=np.int64) + 1]
