"""Pooling (MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool)."""

from __future__ import annotations

import numpy as np

from ...ir.layers import PoolLayer, image_shape
from ...ir.stages import RequantStage, ThresholdStage
from ...ir.types import IntType
from ..builder import Builder, finish_layer, hwc_order, window_params
from .base import LayerKind, divisors, window_cycles_of, window_need

__all__ = ["Pool"]


class Pool(LayerKind):
    """A :class:`~onnx2fpga.ir.PoolLayer`: ``window`` (none for a global pool) and
    ``reduce`` (max or sum), then ``requant`` (an average's division is its multiplier).
    Folding: ``lanes`` channels per transfer."""
    layer_type = PoolLayer

    def check(self, layer) -> None:
        super().check(layer)
        self.check_image_lanes(layer)

    def stages(self, b: Builder, layer, ins, orders, k, out_net) -> str:
        net = b.lanes(ins[0], layer.lanes, f"convert_{k}")
        c, h, w = layer.image
        pad_value = layer.in_type.lo if layer.op == "max" else layer.in_zero_point
        window = layer.window
        if not layer.is_global:
            oh, ow = layer.out_hw
            net = b.window(f"window_{k}", net, layer.in_type, layer.lanes, oh * ow * window * c,
                           layer, window_params(layer, pad_value))
        if layer.op == "max":
            red_type = layer.in_type
        else:
            red_type = IntType.for_range(window * layer.in_type.lo, window * layer.in_type.hi)
        net = b.add("reduce", f"reduce_{k}", [net], red_type, layer.lanes,
                    layer.out_size, layer=layer,
                    params={"op": "max" if layer.op == "max" else "sum", "channels": c,
                            "window": window})
        if not layer.requant:
            return finish_layer(b, net, out_net)
        stages = list(layer.requant)
        if layer.op == "avg":
            # The core sums raw values, padding (the zero point) included: that is the
            # window sum of x - zero_point plus window * zero_point.
            s0 = stages[0]
            if isinstance(s0, ThresholdStage):
                stages[0] = ThresholdStage(s0.thresholds + window * layer.in_zero_point,
                                           s0.base, s0.step, s0.out_type)
            else:
                stages[0] = RequantStage(s0.multiplier, s0.offset, s0.shift, s0.zero_point,
                                         s0.lo, s0.hi, s0.out_type,
                                         s0.in_zero_point + window * layer.in_zero_point,
                                         s0.rounding, s0.neg_multiplier, s0.neg_offset)
        net = b.requant(net, stages, layer.out_shape, hwc_order(layer.out_shape),
                        f"requant_{k}", layer)
        return finish_layer(b, net, out_net)

    def options(self, layer):
        c = image_shape(layer.in_shape)[0]
        opts = []
        for lanes in divisors(c):
            if not layer.is_global:
                cyc = window_cycles_of(layer, lanes)
            else:
                cyc = max(layer.in_size, layer.out_size) // lanes
            opts.append((cyc, 0, {"lanes": lanes}))
        return opts

    def need(self, layer):
        if layer.is_global:
            return [np.full(layer.out_size, layer.in_size, np.int64)]
        return [window_need(layer, layer.image[0], layer.kernel, layer.stride,
                            layer.dilation, layer.pads)]

    def row_delay(self, layer) -> int:
        if layer.is_global:
            return 0
        c, _, w = layer.image
        return layer.stride[0] * w * c

    def manifest(self, layer) -> dict:
        return {**super().manifest(layer),
                "op": layer.op, "kernel": list(layer.kernel), "stride": list(layer.stride),
                "dilation": list(layer.dilation), "pads": list(layer.pads),
                "global": layer.is_global}
