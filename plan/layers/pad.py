"""Constant padding (Pad) that no convolution could take into its own padding."""

from __future__ import annotations

from ...ir.layers import PadLayer, image_shape
from ..builder import Builder, finish_layer, window_params
from .base import LayerKind, divisors, window_cycles_of, window_need

__all__ = ["Pad"]


class Pad(LayerKind):
    """A :class:`~onnx2fpga.ir.PadLayer`: a 1x1 ``window`` with the padding. Folding:
    ``lanes`` channels per transfer."""
    layer_type = PadLayer

    def check(self, layer) -> None:
        super().check(layer)
        self.check_image_lanes(layer)

    def stages(self, b: Builder, layer, ins, orders, k, out_net) -> str:
        net = b.lanes(ins[0], layer.lanes, f"convert_{k}")
        params = window_params(layer, layer.value, kernel=(1, 1))
        net = b.window(f"pad_{k}", net, layer.in_type, layer.lanes, layer.out_size, layer,
                       params)
        return finish_layer(b, net, out_net)

    def options(self, layer):
        c = image_shape(layer.in_shape)[0]
        return [(window_cycles_of(layer, lanes, kernel=(1, 1)), 0, {"lanes": lanes})
                for lanes in divisors(c)]

    def need(self, layer):
        return [window_need(layer, layer.image[0], (1, 1), (1, 1), (1, 1), layer.pads)]

    def row_delay(self, layer) -> int:
        c, _, w = image_shape(layer.in_shape)
        return w * c
