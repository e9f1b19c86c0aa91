"""Concatenations of activations along the channel (or a spatial) axis."""

from __future__ import annotations

import numpy as np

from ...ir.layers import ConcatLayer, image_shape
from ..builder import Builder, finish_layer, hwc_order
from .base import LayerKind, divisors

__all__ = ["Concat", "concat_chunks", "concat_repeats", "concat_axis_position"]


def _stream_dims(shape) -> list[int]:
    """The dimensions of an image in stream (channels-last) order, outermost first."""
    c, h, w = image_shape(shape)
    return [h, w, c]


def concat_axis_position(layer: ConcatLayer) -> int:
    rank = len(layer.in_shapes[0])
    if rank == 1:
        return 0
    axis = layer.axis if rank == 3 else (0 if layer.axis == 0 else 2)
    return {1: 0, 2: 1, 0: 2}[axis]          # logical (C, H, W) axis -> stream position


def concat_repeats(layer: ConcatLayer) -> int:
    if len(layer.in_shapes[0]) == 1:
        return 1
    q = concat_axis_position(layer)
    return int(np.prod(_stream_dims(layer.in_shapes[0])[:q], dtype=np.int64))


def concat_chunks(layer: ConcatLayer) -> list[int]:
    """Transfers taken from each input in turn."""
    chunks = []
    for shape in layer.in_shapes:
        if len(shape) == 1:
            n = shape[0]
        else:
            n = int(np.prod(_stream_dims(shape)[concat_axis_position(layer):], dtype=np.int64))
        if n % layer.lanes:
            raise ValueError(f"Lanes of layer {layer.name!r} must divide the {n} elements "
                             f"each input contributes in turn, not {layer.lanes}")
        chunks.append(n // layer.lanes)
    return chunks


class Concat(LayerKind):
    """A :class:`~onnx2fpga.ir.ConcatLayer`: per input a ``requant`` (if it has one) and a
    ``cast`` to the common type, then ``concat`` taking :func:`concat_chunks` transfers from
    each input in turn. Folding: ``lanes`` elements per transfer, where they divide every
    input's chunk."""
    layer_type = ConcatLayer

    def stages(self, b: Builder, layer, ins, orders, k, out_net) -> str:
        parts = []
        for j, (net, shape, stages) in enumerate(zip(ins, layer.in_shapes, layer.requant)):
            net = b.lanes(net, layer.lanes, f"convert_{k}_{j}")
            if stages:
                net = b.requant(net, stages, shape, hwc_order(shape), f"requant_{k}_{j}",
                                layer)
            net = b.cast(net, layer.out_type, f"cast_{k}_{j}",
                         f"Input {j} of layer {layer.name!r}")
            parts.append(net)
        net = b.add("concat", f"concat_{k}", parts, layer.out_type, layer.lanes,
                    layer.out_size, layer=layer,
                    params={"chunks": concat_chunks(layer), "repeats": concat_repeats(layer)})
        return finish_layer(b, net, out_net)

    def options(self, layer):
        opts = []
        for lanes in divisors(layer.out_size):
            layer.lanes, old = lanes, layer.lanes
            try:
                concat_chunks(layer)
            except ValueError:
                continue
            finally:
                layer.lanes = old
            opts.append((layer.out_size // lanes, 0, {"lanes": lanes}))
        return opts

    def need(self, layer):
        k = np.arange(layer.out_size, dtype=np.int64)
        sizes = [ch * layer.lanes for ch in concat_chunks(layer)]
        total = sum(sizes)
        r, off = np.divmod(k, total)
        needs, start = [], 0
        for size in sizes:
            needs.append(r * size + np.clip(off - start + 1, 0, size))
            start += size
        return needs

    def requant_stages(self, layer) -> list:
        return [st for sts in layer.requant for st in sts]

    def manifest(self, layer) -> dict:
        return {**super().manifest(layer), "axis": layer.axis}
