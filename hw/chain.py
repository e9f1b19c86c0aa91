"""The stream chain of an accelerator: which cores, in which order, with which parameters.

:func:`plan_chain` checks a :class:`~onnx2fpga.dataflow.Dataflow` and lowers it into a flat list
of :class:`ChainStage` records, from the input port to the output port. It is plain Python (no
Amaranth): :mod:`onnx2fpga.hw.top` builds the hardware from it and :mod:`onnx2fpga.hw.cost`
derives the cycle figures from the same list, so the two cannot disagree about the structure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..dataflow import Dataflow, DenseLayer, IntType, RequantLayer

__all__ = ["ChainStage", "layer_stages", "plan_chain", "requant_lanes"]


@dataclass(frozen=True)
class ChainStage:
    """One core of the chain.

    Parameters
    ----------
    kind : str
        ``"matvec"`` (a :class:`~onnx2fpga.hw.cores.MatVecCore`), ``"requant"``
        (:class:`~onnx2fpga.hw.cores.RequantCore`), ``"fifo"``
        (:class:`~onnx2fpga.hw.cores.StreamFIFO`), ``"convert"``
        (:class:`~onnx2fpga.hw.cores.WidthConverter`) or ``"cast"`` (a value-preserving
        change of element type, wires only).
    name : str
        A readable name, used for the submodule.
    in_type, out_type : IntType
        Element types on either side.
    in_lanes, out_lanes : int
        Elements per transfer on either side.
    size : int
        Elements per inference on the output side (equal to the input side for all kinds but
        ``"matvec"``).
    layer : DenseLayer or RequantLayer or None
        The layer a ``"matvec"`` or ``"requant"`` stage comes from.
    params : dict
        ``"matvec"``: nothing. ``"requant"``: ``stages``, ``channels``. ``"fifo"``: ``depth``.
    """
    kind: str
    name: str
    in_type: IntType
    out_type: IntType
    in_lanes: int
    out_lanes: int
    size: int
    layer: object = None
    params: dict = field(default_factory=dict)

    @property
    def out_beats(self) -> int:
        return self.size // self.out_lanes


def _fits(inner: IntType, outer: IntType) -> bool:
    return outer.lo <= inner.lo and inner.hi <= outer.hi


def _link(chain: list, src_type: IntType, dst_type: IntType, lanes: int, size: int,
          what: str) -> None:
    if src_type == dst_type:
        return
    if not _fits(src_type, dst_type):
        raise ValueError(f"{what}: {src_type.name} values do not all fit {dst_type.name}")
    chain.append(ChainStage("cast", f"cast_{len(chain)}", src_type, dst_type, lanes, lanes,
                            size))


def requant_lanes(layer: DenseLayer) -> int:
    """Lanes of the requantization core of a DenseLayer: the fewest that keep up.

    The matrix-vector core delivers ``pe`` accumulators once every ``folds`` cycles, so a
    requantization core of ``d`` lanes (``d`` dividing ``pe``) keeps up when
    ``pe // d <= folds``. Each lane costs a wide multiplier (accumulator width times
    multiplier width), the largest single item of a small design: take the smallest such
    ``d``.
    """
    folds = layer.in_features // layer.simd
    return min(d for d in range(1, layer.pe + 1) if layer.pe % d == 0 and layer.pe // d <= folds)


def layer_stages(layer, index: int = 0) -> list[ChainStage]:
    """The cores of one layer (without the FIFO after it).

    A DenseLayer is a ``"matvec"`` stage, then, if it has requantization stages, a
    ``"requant"`` stage of :func:`requant_lanes` lanes, between a ``"convert"`` splitting the
    ``pe`` accumulators into transfers of that many lanes and one gathering them back to
    ``pe`` when it is fewer than ``pe``. A RequantLayer is a ``"requant"`` stage.
    ``index`` numbers the stage names.
    """
    k = index
    if isinstance(layer, RequantLayer):
        return [ChainStage("requant", f"requant_{k}", layer.in_type, layer.out_type,
                           layer.lanes, layer.lanes, layer.out_size, layer,
                           {"stages": list(layer.requant), "channels": layer.channels})]
    stages = [ChainStage("matvec", f"matvec_{k}", layer.in_type, layer.acc_type, layer.simd,
                         layer.pe, layer.out_size, layer)]
    if not layer.requant:
        return stages
    d = requant_lanes(layer)
    if d != layer.pe:
        stages.append(ChainStage("convert", f"serialize_{k}", layer.acc_type, layer.acc_type,
                                 layer.pe, d, layer.out_size))
    stages.append(ChainStage("requant", f"requant_{k}", layer.acc_type, layer.out_type, d, d,
                             layer.out_size, layer,
                             {"stages": list(layer.requant), "channels": layer.out_features}))
    if d != layer.pe:
        stages.append(ChainStage("convert", f"deserialize_{k}", layer.out_type,
                                 layer.out_type, d, layer.pe, layer.out_size))
    return stages


def plan_chain(dataflow: Dataflow) -> list[ChainStage]:
    """Check ``dataflow`` and lower it into the list of cores from input port to output port.

    Layer ``k`` becomes the stages of :func:`layer_stages`, followed by a ``"fifo"`` of depth
    ``dataflow.fifo_depths[k]`` (in transfers of the layer's ``out_lanes``) unless that is 0.
    A ``"convert"`` stage joins layers whose lane counts differ, and a ``"cast"`` stage element
    types whose ranges nest but differ (a port or layer type that is narrower than the next).

    Raises
    ------
    TypeError
        If ``dataflow`` is not a Dataflow or holds an unknown layer type.
    ValueError
        If sizes, lane counts or element types of neighbouring layers and ports do not match.
    """
    if not isinstance(dataflow, Dataflow):
        raise TypeError(f"Dataflow must be a Dataflow, not {dataflow!r}")
    layers = list(dataflow.layers)
    if not layers:
        raise ValueError("Dataflow must have at least one layer, not none")
    for k, layer in enumerate(layers):
        if not isinstance(layer, (DenseLayer, RequantLayer)):
            raise TypeError(f"Layer {k} must be a DenseLayer or a RequantLayer, not {layer!r}")
        if isinstance(layer, DenseLayer):
            for what, lanes, size in (("SIMD", layer.simd, "in_features"),
                                      ("PE", layer.pe, "out_features")):
                if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1:
                    raise ValueError(f"{what} of layer {layer.name!r} must be a positive "
                                     f"integer, not {lanes!r}")
                if getattr(layer, size) % lanes:
                    raise ValueError(f"{what} of layer {layer.name!r} must divide {size}="
                                     f"{getattr(layer, size)}, not {lanes}")
        if isinstance(layer, RequantLayer):
            if not isinstance(layer.lanes, int) or layer.lanes < 1:
                raise ValueError(f"Lanes of layer {layer.name!r} must be a positive integer, "
                                 f"not {layer.lanes!r}")
            if layer.channels % layer.lanes:
                raise ValueError(f"Lanes of layer {layer.name!r} must divide channels="
                                 f"{layer.channels}, not {layer.lanes}")
            if not layer.requant:
                raise ValueError(f"Layer {layer.name!r} must have at least one requant stage")
    for k, depth in enumerate(dataflow.fifo_depths):
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
            raise ValueError(f"FIFO depth after layer {k} must be a non-negative integer, "
                             f"not {depth!r}")

    inp, out = dataflow.input, dataflow.output
    first, last = layers[0], layers[-1]
    if inp.lanes != first.in_lanes:
        raise ValueError(f"Input port {inp.name!r} must have the lanes of the first layer "
                         f"{first.name!r} ({first.in_lanes}), not {inp.lanes}")
    if out.lanes != last.out_lanes:
        raise ValueError(f"Output port {out.name!r} must have the lanes of the last layer "
                         f"{last.name!r} ({last.out_lanes}), not {out.lanes}")
    if inp.size != first.in_size:
        raise ValueError(f"Input port {inp.name!r} must have the size of the first layer "
                         f"{first.name!r} ({first.in_size}), not {inp.size}")
    if out.size != last.out_size:
        raise ValueError(f"Output port {out.name!r} must have the size of the last layer "
                         f"{last.name!r} ({last.out_size}), not {out.size}")

    chain: list[ChainStage] = []
    _link(chain, inp.type, first.in_type, inp.lanes, inp.size,
          f"Input port {inp.name!r} feeding layer {first.name!r}")
    for k, layer in enumerate(layers):
        if k > 0:
            prev = layers[k - 1]
            if prev.out_size != layer.in_size:
                raise ValueError(f"Layer {layer.name!r} must take the {prev.out_size} elements "
                                 f"layer {prev.name!r} produces, not {layer.in_size}")
            a, b = prev.out_lanes, layer.in_lanes
            if a % b and b % a:
                raise ValueError(f"Lanes of layer {prev.name!r} ({a}) and layer {layer.name!r} "
                                 f"({b}) must divide one another")
            _link(chain, prev.out_type, layer.in_type, a, layer.in_size,
                  f"Layer {prev.name!r} feeding layer {layer.name!r}")
            if a != b:
                chain.append(ChainStage("convert", f"convert_{k}", layer.in_type, layer.in_type,
                                        a, b, layer.in_size))
        chain.extend(layer_stages(layer, k))
        depth = dataflow.fifo_depths[k]
        if depth:
            chain.append(ChainStage("fifo", f"fifo_{k}", layer.out_type, layer.out_type,
                                    layer.out_lanes, layer.out_lanes, layer.out_size,
                                    params={"depth": depth}))
    _link(chain, last.out_type, out.type, out.lanes, out.size,
          f"Last layer {last.name!r} feeding output port {out.name!r}")
    return chain
