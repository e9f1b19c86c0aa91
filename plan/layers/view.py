"""Views (Reshape, Flatten, Squeeze, Unsqueeze, Transpose): a new stream order, no core."""

from __future__ import annotations

import numpy as np

from ...ir.layers import ViewLayer
from ..builder import Builder
from .base import LayerKind

__all__ = ["View", "view_order"]


def view_order(layer: ViewLayer, order):
    """The stream order of a view's output, given its input's."""
    if layer.perm is None:
        return order
    n = layer.in_size
    g = np.arange(n).reshape(layer.in_shape).transpose(layer.perm).reshape(-1)
    f = np.empty(n, dtype=np.int64)
    f[g] = np.arange(n)                 # input logical index -> output logical index
    out = f if order is None else f[order]
    return None if np.array_equal(out, np.arange(n)) else out


class View(LayerKind):
    """A :class:`~onnx2fpga.ir.ViewLayer`: the output is the input's stream under another
    logical shape (and, for a transpose, another stream order); no core, no folding."""
    layer_type = ViewLayer
    is_view = True

    def check(self, layer) -> None:
        pass

    def required_order(self, layer, k: int):
        return "any"

    def output_order(self, layer, in_orders):
        return view_order(layer, in_orders[0])

    def stages(self, b: Builder, layer, ins, orders, k, out_net) -> str:
        return ins[0]

    def options(self, layer):
        return [(0, 0, {})]

    def need(self, layer):
        return [np.arange(layer.out_size, dtype=np.int64) + 1]

    def manifest(self, layer) -> dict:
        return {"perm": list(layer.perm) if layer.perm is not None else None}
