"""Dense layers (MatMul, Gemm): a matrix-vector core, then the requantization."""

from __future__ import annotations

import numpy as np

from ...errors import OptionError
from ...ir.layers import DenseLayer
from ..builder import Builder, add_matvec, finish_layer
from ..checks import weight_rom_bits
from .base import LayerKind, check_adders, check_positive, divisors

__all__ = ["Dense"]


class Dense(LayerKind):
    """A :class:`~onnx2fpga.ir.DenseLayer`: ``matvec`` (weights permuted to the input's stream
    order, which may be any), then ``requant`` of
    :func:`~onnx2fpga.plan.builder.requant_lanes` lanes between ``convert`` stages. Folding:
    ``simd`` inputs and ``pe`` outputs per cycle, ``(in / simd) * (out / pe)`` cycles per
    vector, ``simd * pe`` multiply lanes."""
    layer_type = DenseLayer

    def check(self, layer) -> None:
        for what, lanes, size in (("SIMD", layer.simd, "in_features"),
                                  ("PE", layer.pe, "out_features")):
            check_positive(f"{what} of layer {layer.name!r}", lanes)
            if getattr(layer, size) % lanes:
                raise ValueError(f"{what} of layer {layer.name!r} must divide {size}="
                                 f"{getattr(layer, size)}, not {lanes}")
        check_adders(layer, layer.in_features, layer.out_features)

    def required_order(self, layer, k: int):
        return "any"

    def output_order(self, layer, in_orders):
        return None

    def stages(self, b: Builder, layer, ins, orders, k, out_net) -> str:
        net = b.lanes(ins[0], layer.simd, f"convert_{k}")
        order = orders[0]
        dense = layer if order is None else DenseLayer(
            layer.name, layer.in_type, layer.in_zero_point, layer.weight[:, order],
            layer.weight_type, layer.bias, layer.requant, layer.simd, layer.pe,
            list(layer.nodes), in_bipolar=layer.in_bipolar, multipliers=layer.multipliers)
        net = add_matvec(b, dense, net, k, layer, (layer.out_features,), None)
        return finish_layer(b, net, out_net)

    def options(self, layer):
        opts = []
        for simd in divisors(layer.in_features):
            for pe in divisors(layer.out_features):
                cyc = (layer.in_features // simd) * (layer.out_features // pe)
                opts.append((cyc, simd * pe, {"simd": simd, "pe": pe}))
        return opts

    def full_folding(self, layer) -> dict:
        return {"simd": layer.in_features, "pe": layer.out_features}

    def set_folding(self, layer, params: dict) -> None:
        other = sorted(set(params) - {"simd", "pe"})
        if other:
            raise OptionError(f"Layer {layer.name!r} (dense) takes simd and pe, not "
                              f"{', '.join(other)}")
        simd, pe = params.get("simd", layer.simd), params.get("pe", layer.pe)
        for key, v, size, n in (("simd", simd, "in_features", layer.in_features),
                                ("pe", pe, "out_features", layer.out_features)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1 or n % v:
                raise OptionError(f"Layer {layer.name!r}: {key}={v} is not a valid folding "
                                  f"({key} must divide {size}={n}: "
                                  f"{', '.join(map(str, divisors(n)))})")
        layer.simd, layer.pe = int(simd), int(pe)

    def need(self, layer):
        return [np.full(layer.out_size, layer.in_size, np.int64)]

    def weight_bits(self, layer) -> int:
        return weight_rom_bits(layer.weight, layer.weight_type.bits)

    def manifest(self, layer) -> dict:
        return {**super().manifest(layer),
                "in_features": layer.in_features, "out_features": layer.out_features,
                "simd": layer.simd, "pe": layer.pe, "multipliers": layer.multipliers,
                "weight_type": layer.weight_type.name,
                "acc_type": layer.acc_type.name, "in_zero_point": layer.in_zero_point,
                "weight_memory_bits": int(layer.weight.size * layer.weight_type.bits),
                "macs": int(layer.weight.size)}
