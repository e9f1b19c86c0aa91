"""The core graph of an accelerator: which cores, connected how, with which parameters.

:func:`plan_graph` checks a :class:`~onnx2fpga.ir.Dataflow` and lowers it into a flat,
topologically ordered list of :class:`Stage` records, each one core reading and writing named
*nets* (point-to-point streams). It is plain Python (no Amaranth): :mod:`onnx2fpga.hw.top`
builds the hardware from it and :mod:`onnx2fpga.plan.cost` derives the cycle figures from the
same list, so the two cannot disagree about the structure.

Stream orders
-------------
Every tensor of the dataflow has a *stream order* (:func:`tensor_orders`): ``order[p]`` is
the logical flat index of the element at stream position ``p`` (``None``: C order). Images
travel channels-last (:func:`hwc_order`), so the sliding-window cores can build their windows
from a few buffered rows; a dense layer takes any order (its weight columns are permuted to
match), an elementwise layer keeps its input's order (its per-channel parameters follow), a
view (reshape, flatten, transpose) changes only the order. Where a layer needs an order its
input does not have, a :class:`~onnx2fpga.hw.resize.ReorderCore` buffers the tensor and
reorders it.

Per layer
---------
- DenseLayer: ``matvec`` (weights permuted to the input order; multiplying, by weight
  sign or by XNOR and popcount, :func:`matvec_arithmetic`), then, with requantization,
  ``requant`` of :func:`requant_lanes` lanes between ``convert`` stages.

Wherever a layer's stage list becomes cores, :func:`stage_cores` splits it into
``requant`` and ``threshold`` cores: ThresholdStages always on thresholds, RequantStages
there too when they are monotonic and the thresholds cost less.
- ConvLayer: ``window`` (padding with the input zero point), then ``matvec`` on the
  ``(i, j, c)`` window vector (:attr:`~onnx2fpga.ir.ConvLayer.matrix`) or, depthwise,
  ``depthwise``; then ``requant``.
- PoolLayer: ``window`` (none for a global pool) and ``reduce`` (max or sum), then ``requant``.
- AddLayer: ``add`` joining both inputs, then ``requant``. ConcatLayer: ``requant`` (if any) and
  a ``cast`` per input, then ``concat``. ResizeLayer: ``resize`` (+ ``requant``). PadLayer: a
  1x1 ``window`` with the padding. RequantLayer: ``requant``. ViewLayer: nothing.

Between layers: a ``fifo`` after each layer (``Dataflow.fifo_depths``), a ``broadcast`` where a
tensor feeds several layers and an edge ``fifo`` on the branches that need one
(``Dataflow.edge_fifos``), and on every edge the ``reorder``, ``cast`` and ``convert`` (lane
count) stages the consumer needs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from math import gcd

import numpy as np

from ..ir.dataflow import Dataflow, Port
from ..ir.layers import (
    LAYER_TYPES,
    AddLayer,
    ConcatLayer,
    ConvLayer,
    DenseLayer,
    PadLayer,
    PoolLayer,
    RequantLayer,
    ResizeLayer,
    ViewLayer,
    align_params,
    image_shape,
)
from ..ir.stages import RequantStage, ThresholdStage
from ..ir.types import IntType
from .devices import ice40_matvec_dsps

__all__ = ["Stage", "plan_graph", "layer_stages", "requant_lanes", "tensor_orders",
           "hwc_order", "stream_stages", "stage_cores", "matvec_arithmetic", "Plan", "isolate"]


@dataclass(frozen=True)
class Stage:
    """One core of the accelerator.

    Parameters
    ----------
    kind : str
        ``"matvec"``, ``"requant"``, ``"threshold"``, ``"fifo"``, ``"convert"``, ``"cast"`` (a
        value-preserving change of element type, wires only), ``"window"``, ``"reduce"``,
        ``"depthwise"``, ``"add"``, ``"concat"``, ``"broadcast"``, ``"resize"`` or
        ``"reorder"``.
    name : str
        A readable name, used for the submodule.
    in_type, out_type : IntType
        Element types of the (first) input and of the output.
    in_lanes, out_lanes : int
        Elements per transfer on either side.
    size : int
        Elements per inference on the output side.
    layer : object
        The dataflow layer a stage comes from (None for plumbing).
    params : dict
        Per kind: ``"matvec"``: ``layer`` (the DenseLayer the core computes, weights in
        stream order), ``arithmetic`` (:func:`matvec_arithmetic`), ``w_logic`` (its weight
        ROM ``w_mem`` is among ``dataflow.logic_memories``: read from banks in two steps,
        see :class:`~onnx2fpga.hw.matvec.MatVecCore`), ``x_logic`` (the same for its input
        buffer ``x_mem``), ``ice40_dsp`` (its products go to SB_MAC16s on an iCE40: the
        MatVecs in dataflow order whose products fit what is left of
        ``dataflow.ice40_dsps``). ``"requant"`` (only
        RequantStages) and ``"threshold"`` (only ThresholdStages): ``stages``, ``channels``
        (:func:`stage_cores`). ``"fifo"``: ``depth``.
        ``"window"``: ``channels``, ``height``, ``width``, ``kernel``, ``stride``,
        ``dilation``, ``pads``, ``pad_value``. ``"reduce"``: ``op``, ``channels``,
        ``window``. ``"depthwise"``: ``channels``, ``window``, ``weight``, ``bias``.
        ``"add"``: ``zero_points``, ``multipliers``. ``"concat"``: ``chunks``.
        ``"broadcast"``: ``outputs``. ``"resize"``: ``channels``, ``height``, ``width``,
        ``rows``, ``cols``. ``"reorder"``: ``order``.
    inputs, outputs : tuple of str
        The nets the stage reads and writes.
    in_size : int
        Elements per inference on the (first) input side.
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
    inputs: tuple = ()
    outputs: tuple = ()
    in_size: int = 0

    @property
    def out_beats(self) -> int:
        return self.size // self.out_lanes

    @property
    def in_beats(self) -> int:
        return (self.in_size or self.size) // self.in_lanes


@dataclass
class Plan:
    """The result of :func:`plan_graph`."""
    stages: list[Stage]
    orders: dict                  # tensor name -> stream order (None: C order)
    input_net: str
    output_net: str
    layer_stages: dict            # layer name -> names of its stages
    nets: dict = field(default_factory=dict)         # net -> (IntType, lanes, size)
    tensor_nets: dict = field(default_factory=dict)  # tensor -> net its producer writes


# ---------------------------------------------------------------------------------------------
# Stream orders


def hwc_order(shape) -> np.ndarray | None:
    """Stream order of an image of logical ``shape`` ``(C, H, W)`` (or ``(C, W)``) travelling
    channels-last; ``None`` (C order) for a vector or a single channel."""
    shape = tuple(int(d) for d in shape)
    if len(shape) < 2:
        return None
    c, h, w = image_shape(shape)
    if c == 1 or h * w == 1:
        return None
    return np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).reshape(-1)


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return np.array_equal(a, b)


def _view_order(layer: ViewLayer, order):
    """The stream order of a view's output, given its input's."""
    if layer.perm is None:
        return order
    n = layer.in_size
    g = np.arange(n).reshape(layer.in_shape).transpose(layer.perm).reshape(-1)
    f = np.empty(n, dtype=np.int64)
    f[g] = np.arange(n)                 # input logical index -> output logical index
    out = f if order is None else f[order]
    return None if np.array_equal(out, np.arange(n)) else out


def _required_order(layer, k: int):
    """The order ``layer`` needs on input ``k``: an array, ``None`` (C order), or the
    string ``"any"``."""
    if isinstance(layer, (DenseLayer, RequantLayer, ViewLayer)):
        return "any"
    if isinstance(layer, AddLayer):
        return "any" if k == 0 else "first"
    return hwc_order(layer.in_shapes[k])


def _output_order(layer, in_orders):
    if isinstance(layer, DenseLayer):
        return None
    if isinstance(layer, (RequantLayer, AddLayer)):
        return in_orders[0]
    if isinstance(layer, ViewLayer):
        return _view_order(layer, in_orders[0])
    return hwc_order(layer.out_shape)


def tensor_orders(dataflow: Dataflow) -> tuple[dict, dict]:
    """Stream orders of every tensor and of every layer input.

    Returns
    -------
    orders : dict
        Tensor name -> the order its producer (or the input port) streams it in.
    wanted : dict
        ``(layer name, input index)`` -> the order that input must arrive in; where it differs
        from the tensor's, the edge gets a ``reorder`` stage.
    """
    inp = dataflow.input.name
    first_need = "any"
    for layer in dataflow.consumers(inp):
        for k, t in enumerate(layer.inputs):
            if t == inp:
                need = _required_order(layer, k)
                if not isinstance(need, str):
                    first_need = need
                    break
        if not isinstance(first_need, str):
            break
    orders = {inp: None if isinstance(first_need, str) else first_need}
    wanted = {}
    for layer in dataflow.layers:
        ins = []
        for k, t in enumerate(layer.inputs):
            need = _required_order(layer, k)
            have = orders[t]
            if isinstance(need, str):
                need = have if need == "any" else ins[0]
            wanted[(layer.name, k)] = need
            ins.append(need)
        orders[layer.output] = _output_order(layer, ins)
    return orders, wanted


def stream_stages(stages, shape, order) -> tuple[list, int]:
    """Requantization stages with logical per-channel parameters turned into the form
    :class:`~onnx2fpga.hw.requant.RequantCore` and
    :class:`~onnx2fpga.hw.threshold.ThresholdCore` take: 1-D parameters (thresholds: rows)
    over a period of ``channels`` stream positions (the shortest period of all parameters
    in stream order).

    Returns the stages (RequantStages and ThresholdStages as given) and ``channels``.
    """
    shape = tuple(int(d) for d in shape)
    n = int(np.prod(shape, dtype=np.int64))

    def columns(stage):
        if isinstance(stage, ThresholdStage):
            t = stage.thresholds
            return [t[:, i] for i in range(t.shape[1])]
        names = ["multiplier", "offset"]
        if stage.neg_multiplier is not None:
            names += ["neg_multiplier", "neg_offset"]
        return [getattr(stage, name) for name in names]

    rows = []
    for stage in stages:
        for param in columns(stage):
            full = np.broadcast_to(align_params(param, len(shape)), shape).reshape(-1)
            rows.append(full if order is None else full[order])
    table = np.stack(rows) if rows else np.zeros((0, n), np.int64)
    period = n
    for p in sorted({d for d in range(1, n + 1) if n % d == 0}):
        if np.array_equal(table, np.tile(table[:, :p], (1, n // p))):
            period = p
            break
    out, r = [], 0
    for stage in stages:
        cols = []
        for _ in columns(stage):
            v = table[r, :period]
            cols.append(v[:1] if np.all(v == v[0]) else v)
            r += 1
        if isinstance(stage, ThresholdStage):
            t = np.stack([np.broadcast_to(c, (period,)) for c in cols], axis=1) if cols \
                else np.zeros((1, 0), np.int64)
            if len(t) > 1 and np.all(t == t[:1]):
                t = t[:1]
            out.append(ThresholdStage(t, stage.base, stage.step, stage.out_type))
            continue
        kw = dict(zip(["multiplier", "offset", "neg_multiplier", "neg_offset"], cols))
        out.append(RequantStage(kw["multiplier"], kw["offset"], stage.shift, stage.zero_point,
                                stage.lo, stage.hi, stage.out_type, stage.in_zero_point,
                                stage.rounding, kw.get("neg_multiplier"),
                                kw.get("neg_offset")))
    return out, period


def stage_cores(stages, in_type: IntType, channels: int) -> list[tuple[str, list]]:
    """Which core computes each stage of an elementwise stage list (in stream form, see
    :func:`stream_stages`): ``[(kind, stages), ...]``, consecutive stages of one kind in one
    core, ``kind`` ``"requant"`` (:class:`~onnx2fpga.hw.requant.RequantCore`) or
    ``"threshold"`` (:class:`~onnx2fpga.hw.threshold.ThresholdCore`).

    A ThresholdStage always goes to a threshold core. A RequantStage does where it is
    monotonic over its input range (the range of ``in_type`` for the first stage, of the
    previous stage's output after that), its output takes at most 256 levels, and its
    exact thresholds (:func:`~onnx2fpga.hw.threshold.requant_as_thresholds`) are estimated
    to cost no more (:func:`onnx2fpga.plan.thresholds.threshold_is_cheaper`: in practice up to 15
    thresholds, a 4-bit output, against a multiplier of a few bits or more); the stage is
    then replaced by those thresholds, which compute the same integers.
    """
    from .thresholds import requant_as_thresholds, threshold_is_cheaper
    lo, hi = in_type.lo, in_type.hi
    runs: list[tuple[str, list]] = []
    for stage in stages:
        kind = "threshold" if isinstance(stage, ThresholdStage) else "requant"
        if kind == "requant" and stage.hi - stage.lo < 256:
            th = requant_as_thresholds(stage, lo, hi, channels)
            if th is not None and threshold_is_cheaper(stage, th, IntType.for_range(lo, hi).bits,
                                                       channels):
                kind, stage = "threshold", th
        if runs and runs[-1][0] == kind:
            runs[-1][1].append(stage)
        else:
            runs.append((kind, [stage]))
        lo, hi = stage.lo, stage.hi
    return runs


# ---------------------------------------------------------------------------------------------
# Checks


def _fits(inner: IntType, outer: IntType) -> bool:
    return outer.lo <= inner.lo and inner.hi <= outer.hi


def _check_count(what: str, value) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{what} must be a positive integer, not {value!r}")


def _check_layer(layer) -> None:
    if isinstance(layer, DenseLayer):
        for what, lanes, size in (("SIMD", layer.simd, "in_features"),
                                  ("PE", layer.pe, "out_features")):
            _check_count(f"{what} of layer {layer.name!r}", lanes)
            if getattr(layer, size) % lanes:
                raise ValueError(f"{what} of layer {layer.name!r} must divide {size}="
                                 f"{getattr(layer, size)}, not {lanes}")
        return
    if isinstance(layer, ViewLayer):
        return
    _check_count(f"Lanes of layer {layer.name!r}", layer.lanes)
    if isinstance(layer, RequantLayer):
        if layer.channels % layer.lanes:
            raise ValueError(f"Lanes of layer {layer.name!r} must divide channels="
                             f"{layer.channels}, not {layer.lanes}")
        if not layer.requant:
            raise ValueError(f"Layer {layer.name!r} must have at least one requant stage")
        return
    if isinstance(layer, (ConvLayer, PoolLayer, ResizeLayer, PadLayer)):
        c = image_shape(layer.in_shape)[0]
        if c % layer.lanes:
            raise ValueError(f"Lanes of layer {layer.name!r} must divide its {c} input "
                             f"channels, not {layer.lanes}")
    if isinstance(layer, ConvLayer):
        if not layer.depthwise:
            k = layer.matrix.shape[1]
            for what, lanes, size, total in (("SIMD", layer.simd, "window elements", k),
                                             ("PE", layer.pe, "output channels",
                                              layer.out_channels)):
                _check_count(f"{what} of layer {layer.name!r}", lanes)
                if total % lanes:
                    raise ValueError(f"{what} of layer {layer.name!r} must divide the {total} "
                                     f"{size}, not {lanes}")
        if layer.out_channels % layer.out_lanes:
            raise ValueError(f"Lanes of layer {layer.name!r} must divide its "
                             f"{layer.out_channels} output channels, not {layer.out_lanes}")
    if isinstance(layer, (AddLayer, RequantLayer)) and layer.out_size % layer.lanes:
        raise ValueError(f"Lanes of layer {layer.name!r} must divide its size "
                         f"{layer.out_size}, not {layer.lanes}")


def _check_graph(dataflow: Dataflow) -> None:
    if not isinstance(dataflow, Dataflow):
        raise TypeError(f"Dataflow must be a Dataflow, not {dataflow!r}")
    layers = list(dataflow.layers)
    if not layers:
        raise ValueError("Dataflow must have at least one layer, not none")
    for k, layer in enumerate(layers):
        if not isinstance(layer, LAYER_TYPES):
            raise TypeError(f"Layer {k} must be a dataflow layer, not {layer!r}")
    for k, depth in enumerate(dataflow.fifo_depths):
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
            raise ValueError(f"FIFO depth after layer {k} must be a non-negative integer, "
                             f"not {depth!r}")
    names = [ly.name for ly in layers]
    if len(set(names)) != len(names):
        raise ValueError(f"Layer names must be unique, not {names}")
    sizes = {dataflow.input.name: dataflow.input.size}
    types = {dataflow.input.name: dataflow.input.type}
    for layer in layers:
        _check_layer(layer)
        shapes = layer.in_shapes
        if len(layer.inputs) != len(shapes):
            raise ValueError(f"Layer {layer.name!r} must read {len(shapes)} tensors, not "
                             f"{len(layer.inputs)}")
        for k, t in enumerate(layer.inputs):
            if t not in sizes:
                raise ValueError(f"Layer {layer.name!r} reads {t!r}, which neither the input "
                                 f"port nor an earlier layer writes")
            want = int(np.prod(shapes[k], dtype=np.int64))
            if sizes[t] != want:
                src = "input port" if t == dataflow.input.name else \
                    f"layer {dataflow.producer(t).name!r}"
                raise ValueError(f"Layer {layer.name!r} must take the {sizes[t]} elements "
                                 f"{src} produces, not {want}")
        if layer.output in sizes:
            raise ValueError(f"Tensor {layer.output!r} is written twice (layer "
                             f"{layer.name!r})")
        sizes[layer.output] = layer.out_size
        types[layer.output] = layer.out_type
    out = dataflow.output
    if out.name not in sizes:
        raise ValueError(f"No layer writes the output port's tensor {out.name!r}")
    if sizes[out.name] != out.size:
        last = dataflow.producer(out.name)
        raise ValueError(f"Output port {out.name!r} must have the size of the last layer "
                         f"{last.name!r} ({last.out_size}), not {out.size}")


# ---------------------------------------------------------------------------------------------
# Per-layer cores


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


class _Builder:
    """Appends stages and invents net names."""

    def __init__(self, logic_memories=(), ice40_dsps=0):
        self.stages: list[Stage] = []
        self.logic = frozenset(logic_memories)      # "stage/memory" in soft logic
        self.ice40_dsps = int(ice40_dsps)           # SB_MAC16s not yet given to a MatVec
        self.nets: dict[str, tuple[IntType, int, int]] = {}      # net -> type, lanes, size
        self._count = 0

    def net(self, hint: str, type_: IntType, lanes: int, size: int) -> str:
        name = f"n{self._count}_{hint}"
        self._count += 1
        self.nets[name] = (type_, lanes, size)
        return name

    def add(self, kind, name, inputs, out_type, out_lanes, size, *, layer=None, params=None,
            out_net=None, outputs=None) -> str | list[str]:
        in_type, in_lanes, in_size = self.nets[inputs[0]]
        if outputs is None:
            if out_net is None:
                out_net = self.net(name, out_type, out_lanes, size)
            else:
                self.nets[out_net] = (out_type, out_lanes, size)
            outs = (out_net,)
        else:
            outs = tuple(outputs)
        self.stages.append(Stage(kind, name, in_type, out_type, in_lanes, out_lanes, size,
                                 layer, dict(params or {}), tuple(inputs), outs, in_size))
        return out_net if outputs is None else list(outs)

    # -- adapters: change lanes and types without changing values or order

    def lanes(self, net: str, lanes: int, name: str) -> str:
        t, have, size = self.nets[net]
        if have == lanes:
            return net
        if have % lanes and lanes % have:
            mid = gcd(have, lanes)
            net = self.add("convert", f"{name}a", [net], t, mid, size)
            have = mid
        return self.add("convert", name, [net], t, lanes, size)

    def cast(self, net: str, type_: IntType, name: str, what: str) -> str:
        t, lanes, size = self.nets[net]
        if t == type_:
            return net
        if not _fits(t, type_):
            raise ValueError(f"{what}: {t.name} values do not all fit {type_.name}")
        return self.add("cast", name, [net], type_, lanes, size)

    def requant(self, net, stages, shape, order, name, layer, lanes=None) -> str:
        t, have, size = self.nets[net]
        if lanes is not None:
            net = self.lanes(net, lanes, f"{name}_in")
        st, channels = stream_stages(stages, shape, order)
        t_now, lanes_now, _ = self.nets[net]
        runs = stage_cores(st, t_now, channels)
        for j, (kind, run) in enumerate(runs):
            nm = name if len(runs) == 1 else f"{name}_{j}"
            if kind == "threshold":
                nm = nm.replace("requant", "threshold", 1)
            net = self.add(kind, nm, [net], run[-1].out_type, lanes_now, size, layer=layer,
                           params={"stages": run, "channels": channels})
        return net


def matvec_arithmetic(layer: DenseLayer) -> str:
    """How the matrix-vector unit of ``layer`` multiplies
    (:class:`~onnx2fpga.hw.matvec.MatVecCore`): ``"xnor"`` (XNOR and popcount) when every
    weight is -1 or +1 and ``layer.in_bipolar`` says every input is too (the input type
    signed, at least 2 bits); ``"sign"`` (adding or subtracting each input) when every
    weight is -1 or +1; ``"multiply"`` otherwise."""
    w = np.asarray(layer.weight)
    if w.size and np.all(np.abs(w) == 1):
        t = layer.in_type
        if getattr(layer, "in_bipolar", False) and t.signed and t.bits >= 2:
            return "xnor"
        return "sign"
    return "multiply"


def _matvec_stages(b: _Builder, dense: DenseLayer, net: str, k: int, layer,
                   out_shape, order) -> str:
    """``matvec``, then the requantization of ``layer.requant`` on ``requant_lanes`` lanes
    between converters, back to ``pe`` lanes."""
    name = f"matvec_{k}"
    arithmetic = matvec_arithmetic(dense)
    # iCE40 DSPs: to the MatVecs in dataflow order whose products all fit the ones left.
    ice40_dsp = False
    dsps = ice40_matvec_dsps(dense.simd, dense.pe, dense.in_type, dense.weight_type)
    if dense.multipliers == "dsp" and arithmetic == "multiply" and 0 < dsps <= b.ice40_dsps:
        ice40_dsp = True
        b.ice40_dsps -= dsps
    net = b.add("matvec", name, [net], dense.acc_type, dense.pe, dense.out_features
                * (layer.out_size // dense.out_features), layer=layer,
                params={"layer": dense, "arithmetic": arithmetic,
                        "w_logic": f"{name}/w_mem" in b.logic,
                        "x_logic": f"{name}/x_mem" in b.logic, "ice40_dsp": ice40_dsp})
    if not layer.requant:
        return net
    d = requant_lanes(dense)
    net = b.lanes(net, d, f"serialize_{k}")
    net = b.requant(net, layer.requant, out_shape, order, f"requant_{k}", layer)
    return b.lanes(net, dense.pe, f"deserialize_{k}")


def _window_params(layer, pad_value: int, *, kernel=None, stride=(1, 1),
                   dilation=(1, 1)) -> dict:
    c, h, w = image_shape(layer.in_shape)
    return {"channels": c, "height": h, "width": w,
            "kernel": tuple(kernel or layer.kernel),
            "stride": tuple(getattr(layer, "stride", stride)),
            "dilation": tuple(getattr(layer, "dilation", dilation)),
            "pads": tuple(layer.pads), "pad_value": int(pad_value)}


def _finish(b: _Builder, net: str, out_net: str) -> str:
    """Rename the last net of a layer to the layer's output net (a wire)."""
    if net == out_net:
        return net
    # The producing stage is the last one appended: point it at out_net.
    stage = b.stages[-1]
    assert stage.outputs == (net,), "internal: the last stage must produce the layer's net"
    b.stages[-1] = Stage(**{**stage.__dict__, "outputs": (out_net,)})
    b.nets[out_net] = b.nets.pop(net)
    return out_net


def _layer_body(b: _Builder, layer, ins: list[str], orders: list, k: int, out_net: str) -> str:
    """The cores of one layer, from its (adapted) input nets to ``out_net``."""
    if isinstance(layer, DenseLayer):
        net = b.lanes(ins[0], layer.simd, f"convert_{k}")
        order = orders[0]
        dense = layer if order is None else DenseLayer(
            layer.name, layer.in_type, layer.in_zero_point, layer.weight[:, order],
            layer.weight_type, layer.bias, layer.requant, layer.simd, layer.pe,
            list(layer.nodes), in_bipolar=layer.in_bipolar, multipliers=layer.multipliers)
        net = _matvec_stages(b, dense, net, k, layer, (layer.out_features,), None)
        return _finish(b, net, out_net)
    if isinstance(layer, RequantLayer):
        net = b.lanes(ins[0], layer.lanes, f"convert_{k}")
        return _finish(b, b.requant(net, layer.requant, layer.shape, orders[0],
                                    f"requant_{k}", layer), out_net)
    if isinstance(layer, ConvLayer):
        net = b.lanes(ins[0], layer.lanes, f"convert_{k}")
        c, _, _ = layer.image
        kh, kw = layer.kernel
        pixels = layer.out_hw[0] * layer.out_hw[1]
        net = b.add("window", f"window_{k}", [net], layer.in_type, layer.lanes,
                    pixels * kh * kw * c, layer=layer,
                    params=_window_params(layer, layer.in_zero_point))
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
            return _finish(b, net, out_net)
        net = b.lanes(net, layer.simd, f"gather_{k}")
        # Padding holds the input zero point: still bipolar only if that is -1 or +1.
        bipolar = layer.in_bipolar and (not any(layer.pads) or layer.in_zero_point in (-1, 1))
        dense = DenseLayer(layer.name, layer.in_type, layer.in_zero_point, layer.matrix,
                           layer.weight_type, layer.bias, [], layer.simd, layer.pe,
                           list(layer.nodes), in_bipolar=bipolar,
                           multipliers=layer.multipliers)
        net = _matvec_stages(b, dense, net, k, layer, layer.out_shape,
                             hwc_order(layer.out_shape))
        return _finish(b, net, out_net)
    if isinstance(layer, PoolLayer):
        net = b.lanes(ins[0], layer.lanes, f"convert_{k}")
        c, h, w = layer.image
        pad_value = layer.in_type.lo if layer.op == "max" else layer.in_zero_point
        window = layer.window
        if not layer.is_global:
            oh, ow = layer.out_hw
            net = b.add("window", f"window_{k}", [net], layer.in_type, layer.lanes,
                        oh * ow * window * c, layer=layer,
                        params=_window_params(layer, pad_value))
        if layer.op == "max":
            red_type = layer.in_type
        else:
            red_type = IntType.for_range(window * layer.in_type.lo, window * layer.in_type.hi)
        net = b.add("reduce", f"reduce_{k}", [net], red_type, layer.lanes,
                    layer.out_size, layer=layer,
                    params={"op": "max" if layer.op == "max" else "sum", "channels": c,
                            "window": window})
        if not layer.requant:
            return _finish(b, net, out_net)
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
        return _finish(b, net, out_net)
    if isinstance(layer, AddLayer):
        a = b.lanes(ins[0], layer.lanes, f"convert_{k}a")
        c = b.lanes(ins[1], layer.lanes, f"convert_{k}b")
        for m in layer.multipliers:
            if m.size != 1:
                raise ValueError(f"Layer {layer.name!r}: the add core takes one multiplier "
                                 f"per input, not per-channel ones")
        net = b.add("add", f"add_{k}", [a, c], layer.sum_type, layer.lanes, layer.out_size,
                    layer=layer,
                    params={"b_type": b.nets[c][0], "zero_points": tuple(layer.in_zero_points),
                            "multipliers": tuple(int(m[0]) for m in layer.multipliers)})
        net = b.requant(net, layer.requant, layer.shape, orders[0], f"requant_{k}", layer)
        return _finish(b, net, out_net)
    if isinstance(layer, ConcatLayer):
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
        return _finish(b, net, out_net)
    if isinstance(layer, ResizeLayer):
        net = b.lanes(ins[0], layer.lanes, f"convert_{k}")
        c, h, w = image_shape(layer.in_shape)
        net = b.add("resize", f"resize_{k}", [net], layer.in_type, layer.lanes,
                    layer.out_size, layer=layer,
                    params={"channels": c, "height": h, "width": w, "rows": layer.rows,
                            "cols": layer.cols})
        if layer.requant:
            net = b.requant(net, layer.requant, layer.out_shape, hwc_order(layer.out_shape),
                            f"requant_{k}", layer)
        return _finish(b, net, out_net)
    if isinstance(layer, PadLayer):
        net = b.lanes(ins[0], layer.lanes, f"convert_{k}")
        params = _window_params(layer, layer.value, kernel=(1, 1))
        net = b.add("window", f"pad_{k}", [net], layer.in_type, layer.lanes, layer.out_size,
                    layer=layer, params=params)
        return _finish(b, net, out_net)
    raise TypeError(f"Unknown layer type {type(layer).__name__}")  # pragma: no cover


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


def layer_stages(layer, index: int = 0) -> list[Stage]:
    """The cores of one single-input layer on its own (input in the order it needs, without
    the FIFO after it). ``index`` numbers the stage names."""
    _check_layer(layer)
    b = _Builder()
    ins = []
    for k, shape in enumerate(layer.in_shapes):
        t = layer.in_types[k] if hasattr(layer, "in_types") else layer.in_type
        n = int(np.prod(shape, dtype=np.int64))
        ins.append(b.net(f"in{k}", t, layer.in_lanes, n))
    orders = [None if isinstance(_required_order(layer, k), str) else
              _required_order(layer, k) for k in range(len(ins))]
    out = f"n_out_{index}"
    _layer_body(b, layer, ins, orders, index, out)
    return b.stages


# ---------------------------------------------------------------------------------------------
# The whole graph


def plan_graph(dataflow: Dataflow, *, check_ports: bool = True) -> Plan:
    """Check ``dataflow`` and lower it into the cores of the accelerator (see the module
    docstring). With ``check_ports=False`` the ports' lane counts are not checked (folding
    plans once to learn them).

    Raises
    ------
    TypeError
        If ``dataflow`` is not a Dataflow or holds an unknown layer type.
    ValueError
        If sizes, lane counts or element types of connected layers and ports do not match.
    """
    _check_graph(dataflow)
    inp, out = dataflow.input, dataflow.output
    orders, wanted = tensor_orders(dataflow)
    b = _Builder(getattr(dataflow, "logic_memories", ()) or (),
                 getattr(dataflow, "ice40_dsps", 0) or 0)
    b.nets["in"] = (inp.type, inp.lanes, inp.size)
    tensor_net = {inp.name: "in"}
    # Readers of every tensor: (layer index, input index); the output port reads one too.
    readers: dict[str, list] = {}
    for k, layer in enumerate(dataflow.layers):
        for j, t in enumerate(layer.inputs):
            readers.setdefault(t, []).append((k, j))
    readers.setdefault(out.name, []).append(("port", 0))
    # The net each reader takes, created when the tensor is complete (fork if several).
    taps: dict[tuple, str] = {}
    layer_names: dict[str, list[str]] = {}

    def publish(tensor: str, k_label: str) -> None:
        net = tensor_net[tensor]
        rs = readers.get(tensor, [])
        if len(rs) <= 1:
            for r in rs:
                taps[(tensor, r)] = net
            return
        t, lanes, size = b.nets[net]
        outs = [b.net(f"{k_label}_b{j}", t, lanes, size) for j in range(len(rs))]
        b.add("broadcast", f"fork_{k_label}", [net], t, lanes, size,
              params={"outputs": len(rs)}, outputs=outs)
        for r, o in zip(rs, outs):
            consumer = "port" if r[0] == "port" else dataflow.layers[r[0]].name
            depth = dataflow.edge_fifos.get(f"{tensor}->{consumer}", 0)
            if depth:
                o = b.add("fifo", f"fifo_{k_label}_{consumer}", [o], t, lanes, size,
                          params={"depth": int(depth)})
            taps[(tensor, r)] = o

    publish(inp.name, "in")
    for k, layer in enumerate(dataflow.layers):
        start = len(b.stages)
        ins, in_orders = [], []
        for j, t in enumerate(layer.inputs):
            net = taps[(t, (k, j))]
            have, need = orders[t], wanted[(layer.name, j)]
            if not _same(have, need):
                net = _reorder(b, net, have, need, f"reorder_{k}_{j}", layer.name)
            want_type = layer.in_types[j] if hasattr(layer, "in_types") else layer.in_type
            src = "Input port" if t == inp.name else \
                f"Layer {dataflow.producer(t).name!r}"
            net = b.cast(net, want_type, f"cast_{k}_{j}" if len(layer.inputs) > 1 else
                         f"cast_{k}", f"{src} feeding layer {layer.name!r}")
            ins.append(net)
            in_orders.append(need)
        if isinstance(layer, ViewLayer):
            tensor_net[layer.output] = ins[0]
        else:
            depth = dataflow.fifo_depths[k]
            body_out = f"t{k}_{layer.name}" if not depth else f"t{k}_{layer.name}_pre"
            net = _layer_body(b, layer, ins, in_orders, k, body_out)
            if depth:
                t, lanes, size = b.nets[net]
                net = b.add("fifo", f"fifo_{k}", [net], t, lanes, size,
                            params={"depth": depth})
            tensor_net[layer.output] = net
        layer_names[layer.name] = [s.name for s in b.stages[start:]]
        publish(layer.output, str(k))
    net = taps[(out.name, ("port", 0))]
    last = dataflow.producer(out.name)
    net = b.cast(net, out.type, "cast_out",
                 f"Last layer {last.name!r} feeding output port {out.name!r}")
    t, lanes, size = b.nets[net]
    if check_ports and lanes != out.lanes:
        raise ValueError(f"Output port {out.name!r} must have the lanes of the last layer "
                         f"{last.name!r} ({lanes}), not {out.lanes}")
    first = dataflow.consumers(inp.name)
    if check_ports and first and not isinstance(first[0], ViewLayer) and \
            inp.lanes != first[0].in_lanes:
        raise ValueError(f"Input port {inp.name!r} must have the lanes of the first layer "
                         f"{first[0].name!r} ({first[0].in_lanes}), not {inp.lanes}")
    return Plan(b.stages, orders, "in", net, layer_names, dict(b.nets), dict(tensor_net))


def _reorder(b: _Builder, net: str, have, need, name: str, layer: str) -> str:
    t, lanes, size = b.nets[net]
    have_a = np.arange(size) if have is None else have
    need_a = np.arange(size) if need is None else need
    inv = np.empty(size, dtype=np.int64)
    inv[have_a] = np.arange(size)       # logical index -> stream position in `have`
    order = inv[need_a]                  # output position p takes input position order[p]
    # The widest lane count (dividing the stream's) whose groups the permutation moves whole:
    # a transpose of image rows and columns moves pixels, all channels together.
    width = 1
    for w in range(lanes, 0, -1):
        if lanes % w == 0 and size % w == 0:
            groups = order.reshape(-1, w)
            if np.all(groups[:, 0] % w == 0) and \
                    np.array_equal(groups, groups[:, :1] + np.arange(w)):
                width = w
                break
    net = b.lanes(net, width, f"{name}_in")
    return b.add("reorder", name, [net], t, width, size, params={"order": order})


def isolate(dataflow: Dataflow, name: str) -> Dataflow:
    """A dataflow of layer ``name`` alone, between ports of its own input and output
    (a copy; a join reads its one input port twice, so its inputs must have one shape),
    the ports in the stream orders the layer takes and gives. For measuring one layer's
    figures.

    Raises
    ------
    ValueError
        If no layer has that name, or a join's inputs differ in shape.
    """
    layer = next((ly for ly in dataflow.layers if ly.name == name), None)
    if layer is None:
        raise ValueError(f"No layer named {name!r}")
    layer = copy.deepcopy(layer)
    shapes = {tuple(s) for s in layer.in_shapes}
    if len(shapes) != 1:
        raise ValueError(f"Layer {name!r} joins tensors of shapes {sorted(shapes)}: it "
                         f"cannot run from one input port")
    types = layer.in_types if hasattr(layer, "in_types") else [layer.in_type]
    in_type = types[0]
    for t in types[1:]:
        in_type = IntType.for_range(min(in_type.lo, t.lo), max(in_type.hi, t.hi))
    layer.inputs = [f"{name}__in"] * len(layer.inputs)
    layer.output = f"{name}__out"
    lanes = 1 if isinstance(layer, ViewLayer) else layer.in_lanes
    inp = Port(layer.inputs[0], (1,) + tuple(layer.in_shapes[0]), in_type, 1.0, 0, lanes)
    out = Port(layer.output, (1,) + tuple(layer.out_shape), layer.out_type, 1.0, 0,
               lanes if isinstance(layer, ViewLayer) else layer.out_lanes)
    sub = Dataflow([layer], inp, out, fifo_depths=[0])
    orders, _ = tensor_orders(sub)
    inp.order, out.order = orders[inp.name], orders[out.name]
    return sub
