"""Nearest-neighbour resizing (Resize, Upsample)."""

from __future__ import annotations

import numpy as np

from ...ir.layers import ResizeLayer, image_shape
from ..builder import Builder, finish_layer, hwc_order
from .base import LayerKind, divisors

__all__ = ["Resize"]


class Resize(LayerKind):
    """A :class:`~onnx2fpga.ir.ResizeLayer`: ``resize`` (rows and columns picked by index
    maps from buffered input rows), then ``requant`` if it has one. Folding: ``lanes``
    channels per transfer."""
    layer_type = ResizeLayer

    def check(self, layer) -> None:
        super().check(layer)
        self.check_image_lanes(layer)

    def stages(self, b: Builder, layer, ins, orders, k, out_net) -> str:
        net = b.lanes(ins[0], layer.lanes, f"convert_{k}")
        c, h, w = image_shape(layer.in_shape)
        net = b.add("resize", f"resize_{k}", [net], layer.in_type, layer.lanes,
                    layer.out_size, layer=layer,
                    params={"channels": c, "height": h, "width": w, "rows": layer.rows,
                            "cols": layer.cols})
        if layer.requant:
            net = b.requant(net, layer.requant, layer.out_shape, hwc_order(layer.out_shape),
                            f"requant_{k}", layer)
        return finish_layer(b, net, out_net)

    def options(self, layer):
        c = image_shape(layer.in_shape)[0]
        return [(max(layer.in_size, layer.out_size) // lanes, 0, {"lanes": lanes})
                for lanes in divisors(c)]

    def need(self, layer):
        c, _, w = image_shape(layer.in_shape)
        per_row = len(layer.cols) * c
        return [np.repeat((layer.rows + 1) * w * c, per_row)]

    def row_delay(self, layer) -> int:
        c, _, w = image_shape(layer.in_shape)
        return w * c
