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
What each layer kind becomes (its cores, the orders it takes and gives, its checks) is its
kind's business: :mod:`onnx2fpga.plan.layers`, one module per kind, found by
:func:`~onnx2fpga.plan.layers.kind_of`. Wherever a layer's stage list becomes cores,
:func:`~onnx2fpga.plan.builder.stage_cores` splits it into ``requant`` and ``threshold``
cores: ThresholdStages always on thresholds, RequantStages there too when they are monotonic
and the thresholds cost less.

Between layers: a ``fifo`` after each layer (``Dataflow.fifo_depths``), a ``broadcast`` where a
tensor feeds several layers and an edge ``fifo`` on the branches that need one
(``Dataflow.edge_fifos``), and on every edge the ``reorder``, ``cast`` and ``convert`` (lane
count) stages the consumer needs.
"""

from __future__ import annotations

import copy

import numpy as np

from ..ir.dataflow import Dataflow, Port
from ..ir.layers import (
    LAYER_TYPES,
)
from ..ir.types import IntType
from .builder import Builder, Plan
from .layers import kind_of
from .stage import Stage

__all__ = ["plan_graph", "layer_stages", "tensor_orders", "isolate"]


# ---------------------------------------------------------------------------------------------
# Stream orders


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return np.array_equal(a, b)


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
                need = kind_of(layer).required_order(layer, k)
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
            need = kind_of(layer).required_order(layer, k)
            have = orders[t]
            if isinstance(need, str):
                need = have if need == "any" else ins[0]
            wanted[(layer.name, k)] = need
            ins.append(need)
        orders[layer.output] = kind_of(layer).output_order(layer, ins)
    return orders, wanted


# ---------------------------------------------------------------------------------------------
# Checks


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
        kind_of(layer).check(layer)
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


def layer_stages(layer, index: int = 0, *, ecp5_dsp_registers: bool = False) -> list[Stage]:
    """The cores of one single-input layer on its own (input in the order it needs, without
    the FIFO after it). ``index`` numbers the stage names; ``ecp5_dsp_registers`` as the
    :class:`~onnx2fpga.ir.Dataflow`'s."""
    kind_of(layer).check(layer)
    b = Builder(ecp5_dsp_registers=ecp5_dsp_registers)
    ins = []
    for k, shape in enumerate(layer.in_shapes):
        t = layer.in_types[k] if hasattr(layer, "in_types") else layer.in_type
        n = int(np.prod(shape, dtype=np.int64))
        ins.append(b.net(f"in{k}", t, layer.in_lanes, n))
    orders = [None if isinstance(kind_of(layer).required_order(layer, k), str) else
              kind_of(layer).required_order(layer, k) for k in range(len(ins))]
    out = f"n_out_{index}"
    kind_of(layer).stages(b, layer, ins, orders, index, out)
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
    b = Builder(getattr(dataflow, "logic_memories", ()) or (),
                 getattr(dataflow, "ice40_dsps", 0) or 0,
                 getattr(dataflow, "spram_memories", ()) or (),
                 bool(getattr(dataflow, "ecp5_dsp_registers", False)),
                 getattr(dataflow, "block_memories", ()) or (),
                 bool(getattr(dataflow, "bram_registers", False)),
                 int(getattr(dataflow, "adder_levels", 1) or 1))
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
                o = b.fifo(f"fifo_{k_label}_{consumer}", o, depth, branch=True)
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
        if kind_of(layer).is_view:
            tensor_net[layer.output] = ins[0]
        else:
            depth = dataflow.fifo_depths[k]
            body_out = f"t{k}_{layer.name}" if not depth else f"t{k}_{layer.name}_pre"
            net = kind_of(layer).stages(b, layer, ins, in_orders, k, body_out)
            if depth:
                net = b.fifo(f"fifo_{k}", net, depth)
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
    if check_ports and first and not kind_of(first[0]).is_view and \
            inp.lanes != first[0].in_lanes:
        raise ValueError(f"Input port {inp.name!r} must have the lanes of the first layer "
                         f"{first[0].name!r} ({first[0].in_lanes}), not {inp.lanes}")
    return Plan(b.stages, orders, "in", net, layer_names, dict(b.nets), dict(tensor_net))


def _reorder(b: Builder, net: str, have, need, name: str, layer: str) -> str:
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
    view = kind_of(layer).is_view
    lanes = 1 if view else layer.in_lanes
    inp = Port(layer.inputs[0], (1,) + tuple(layer.in_shapes[0]), in_type, 1.0, 0, lanes)
    out = Port(layer.output, (1,) + tuple(layer.out_shape), layer.out_type, 1.0, 0,
               lanes if view else layer.out_lanes)
    sub = Dataflow([layer], inp, out, fifo_depths=[0])
    orders, _ = tensor_orders(sub)
    inp.order, out.order = orders[inp.name], orders[out.name]
    return sub
