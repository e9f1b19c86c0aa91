"""Convolutions (Conv, ConvInteger, QLinearConv; 1-D and 2-D, depthwise)."""

from __future__ import annotations

from math import gcd

from ...ir.layers import ConvLayer, DenseLayer
from ..builder import Builder, add_matvec, finish_layer, hwc_order, window_params
from ..checks import weight_rom_bits
from .base import (
    LayerKind,
    check_adders,
    check_positive,
    divisors,
    window_cycles_of,
    window_need,
)

__all__ = ["Conv"]


class Conv(LayerKind):
    """A :class:`~onnx2fpga.ir.ConvLayer`: ``window`` (padding with the input zero point) on
    channels-last images, then ``matvec`` on the ``(i, j, c)`` window vector
    (:attr:`~onnx2fpga.ir.ConvLayer.matrix`) or, depthwise, ``depthwise``; then
    ``requant``. Folding: ``lanes`` channels per window transfer, ``simd`` window elements
    and ``pe`` output channels per cycle (depthwise: ``lanes`` only)."""
    layer_type = ConvLayer

    def check(self, layer) -> None:
        super().check(layer)
        self.check_image_lanes(layer)
        if not layer.depthwise:
            k = layer.matrix.shape[1]
            for what, lanes, size, total in (("SIMD", layer.simd, "window elements", k),
                                             ("PE", layer.pe, "output channels",
                                              layer.out_channels)):
                check_positive(f"{what} of layer {layer.name!r}", lanes)
                if total % lanes:
                    raise ValueError(f"{what} of layer {layer.name!r} must divide the {total} "
                                     f"{size}, not {lanes}")
        if layer.depthwise and layer.multipliers == "adders":
            raise ValueError(f"Layer {layer.name!r}: a depthwise convolution has no adders "
                             f"realization (multipliers 'dsp' or 'lut')")
        if not layer.depthwise:
            check_adders(layer, layer.matrix.shape[1], layer.out_channels)
        if layer.out_channels % layer.out_lanes:
            raise ValueError(f"Lanes of layer {layer.name!r} must divide its "
                             f"{layer.out_channels} output channels, not {layer.out_lanes}")

    def stages(self, b: Builder, layer, ins, orders, k, out_net) -> str:
        net = b.lanes(ins[0], layer.lanes, f"convert_{k}")
        c, _, _ = layer.image
        kh, kw = layer.kernel
        pixels = layer.out_hw[0] * layer.out_hw[1]
        net = b.window(f"window_{k}", net, layer.in_type, layer.lanes, pixels * kh * kw * c,
                       layer, window_params(layer, layer.in_zero_point))
        if layer.depthwise:
            w = layer.weight.reshape(c, kh * kw)
            bias = layer.bias - layer.in_zero_point * w.sum(axis=1)
            net = b.add("depthwise", f"depthwise_{k}", [net], layer.acc_type, layer.lanes,
                        layer.out_size, layer=layer,
                        params={"channels": c, "window": kh * kw, "weight": w, "bias": bias,
                                "multipliers": layer.multipliers})
            if layer.requant:
                net = b.requant(net, layer.requant, layer.out_shape,
                                hwc_order(layer.out_shape), f"requant_{k}", layer)
            return finish_layer(b, net, out_net)
        net = b.lanes(net, layer.simd, f"gather_{k}")
        # Padding holds the input zero point: still bipolar only if that is -1 or +1.
        bipolar = layer.in_bipolar and (not any(layer.pads) or layer.in_zero_point in (-1, 1))
        dense = DenseLayer(layer.name, layer.in_type, layer.in_zero_point, layer.matrix,
                           layer.weight_type, layer.bias, [], layer.simd, layer.pe,
                           list(layer.nodes), in_bipolar=bipolar,
                           multipliers=layer.multipliers)
        net = add_matvec(b, dense, net, k, layer, layer.out_shape, hwc_order(layer.out_shape))
        return finish_layer(b, net, out_net)

    def options(self, layer):
        opts = []
        c = layer.image[0]
        pixels = layer.out_hw[0] * layer.out_hw[1]
        if layer.depthwise:
            kh, kw = layer.kernel
            for lanes in divisors(c):
                cyc = max(window_cycles_of(layer, lanes), pixels * kh * kw * c // lanes)
                opts.append((cyc, lanes, {"lanes": lanes}))
            return opts
        k = layer.matrix.shape[1]
        for lanes in divisors(c):
            win = window_cycles_of(layer, lanes)
            for simd in divisors(k):
                # The window's lanes regroup into simd through their common divisor.
                regroup = pixels * k // gcd(lanes, simd)
                for pe in divisors(layer.out_channels):
                    cyc = max(win, regroup, pixels * (k // simd) * (layer.out_channels // pe))
                    opts.append((cyc, simd * pe, {"lanes": lanes, "simd": simd, "pe": pe}))
        return opts

    def full_folding(self, layer) -> dict:
        return {} if layer.depthwise else {"simd": layer.matrix.shape[1],
                                           "pe": layer.out_channels}

    def need(self, layer):
        return [window_need(layer, layer.out_channels, layer.kernel, layer.stride,
                            layer.dilation, layer.pads)]

    def weight_bits(self, layer) -> int:
        """The matrix-vector core's weights (:attr:`~onnx2fpga.ir.ConvLayer.matrix`, zero
        outside a channel's group), or depthwise a ``(channels, kh * kw)`` matrix."""
        w = layer.weight.reshape(layer.image[0], -1) if layer.depthwise else layer.matrix
        return weight_rom_bits(w, layer.weight_type.bits)

    def row_delay(self, layer) -> int:
        c, _, w = layer.image
        return layer.stride[0] * w * c

    def manifest(self, layer) -> dict:
        pixels = layer.out_hw[0] * layer.out_hw[1]
        return {**super().manifest(layer),
                "kernel": list(layer.kernel), "stride": list(layer.stride),
                "dilation": list(layer.dilation), "pads": list(layer.pads),
                "group": layer.group, "depthwise": layer.depthwise, "lanes": layer.lanes,
                "simd": layer.simd, "pe": layer.pe, "multipliers": layer.multipliers,
                "weight_type": layer.weight_type.name,
                "acc_type": layer.acc_type.name, "in_zero_point": layer.in_zero_point,
                "weight_memory_bits": int(layer.weight.size * layer.weight_type.bits),
                "macs": int(layer.weight.size * pixels)}
