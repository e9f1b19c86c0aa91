"""Channel slices (ONNX Slice on the channel axis, each output of a Split on it)."""

from __future__ import annotations

import numpy as np

from ...ir.layers import SliceLayer, image_shape
from ..builder import Builder, finish_layer, hwc_order
from .base import LayerKind, divisors

__all__ = ["Slice"]


def _pixels_and_channels(layer: SliceLayer) -> tuple[int, int]:
    c, h, w = image_shape(layer.in_shape) if len(layer.in_shape) <= 3 else \
        (layer.in_shape[0], 1, int(np.prod(layer.in_shape[1:])))
    return h * w, c


class Slice(LayerKind):
    """A :class:`~onnx2fpga.ir.SliceLayer`: one ``slice`` core keeping channels
    ``start .. stop - 1`` of every pixel of the channels-last stream. Folding: ``lanes``
    elements per transfer, dividing the channels, ``start`` and ``stop``."""
    layer_type = SliceLayer

    def check(self, layer) -> None:
        super().check(layer)
        _, c = _pixels_and_channels(layer)
        for what, v in (("channels", c), ("start", layer.start), ("stop", layer.stop)):
            if v % layer.lanes:
                raise ValueError(f"Lanes of layer {layer.name!r} must divide its {what} "
                                 f"({v}), not {layer.lanes}")

    def required_order(self, layer, k: int):
        return hwc_order(layer.in_shape)

    def output_order(self, layer, in_orders):
        return hwc_order(layer.out_shape)

    def stages(self, b: Builder, layer, ins, orders, k, out_net) -> str:
        net = b.lanes(ins[0], layer.lanes, f"convert_{k}")
        _, c = _pixels_and_channels(layer)
        net = b.add("slice", f"slice_{k}", [net], layer.in_type, layer.lanes, layer.out_size,
                    layer=layer, params={"period": c // layer.lanes,
                                         "start": layer.start // layer.lanes,
                                         "stop": layer.stop // layer.lanes})
        return finish_layer(b, net, out_net)

    def options(self, layer):
        _, c = _pixels_and_channels(layer)
        return [(layer.in_size // lanes, 0, {"lanes": lanes}) for lanes in divisors(c)
                if layer.start % lanes == 0 and layer.stop % lanes == 0]

    def need(self, layer):
        pixels, c = _pixels_and_channels(layer)
        kept = layer.stop - layer.start
        k = np.arange(layer.out_size, dtype=np.int64)
        pixel, ch = np.divmod(k, kept)
        return [pixel * c + layer.start + ch + 1]

    def manifest(self, layer) -> dict:
        return {**super().manifest(layer), "start": layer.start, "stop": layer.stop}
