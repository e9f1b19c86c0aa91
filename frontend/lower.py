"""Lower a quantized IR graph (QDQ form) into a :class:`~onnx2fpga.ir.Design`.

The graph is partitioned into three parts:

* **head** (host): everything that computes the first quantized activation from the model
  input, ending with its ``QuantizeLinear``;
* **hardware**: a graph of integer layers. Every activation ``QuantizeLinear`` ends a *group*
  (:class:`~onnx2fpga.frontend.groups.Group`): the float nodes between it and the
  ``DequantizeLinear`` nodes of earlier quantized activations, a core operator and its
  epilogue, which become one integer layer; views (Reshape, Flatten, Squeeze, Unsqueeze,
  Transpose, Identity) become :class:`~onnx2fpga.ir.ViewLayer` layers, which cost nothing in
  hardware.
* **tail** (host): everything after the hardware part's output (a float Softmax, scaling...).

:func:`lower` runs these passes, each a plain function from one artifact to the next:

0. :func:`~onnx2fpga.frontend.qdq.integer_max_pools`: a max pool of a dequantized activation
   with no quantizer after it moves in front of its DequantizeLinear (it keeps the grid);
   :func:`~onnx2fpga.frontend.qdq.exact_average_pools`: a global average pool there gets
   the quantizer that keeps it exact (its sum on the grid ``s / N``);
1. :func:`~onnx2fpga.frontend.partition.find_entries`: graph -> per input the first quantized
   activation; the head is everything they depend on;
2. :func:`~onnx2fpga.frontend.groups.find_groups`: graph -> the groups and integer operators,
   in order;
3. :func:`~onnx2fpga.frontend.build.build_layers`: groups -> the integer layers
   (:class:`~onnx2fpga.frontend.build.HardwarePart`); each group's epilogue and quantizer
   become the layer's requantization (:mod:`onnx2fpga.frontend.epilogue`);
4. :func:`~onnx2fpga.frontend.partition.extend_accumulator_tail`: a last layer without a
   quantizer joins the hardware up to its accumulator;
5. :func:`~onnx2fpga.frontend.partition.partition`: layers -> the host tail and the hardware
   part's outputs (:class:`~onnx2fpga.frontend.partition.Partition`); a compute operator
   left on the host is refused (:func:`~onnx2fpga.frontend.partition.host_compute`) unless
   allowed;
6. :func:`assemble_design`: layers and partition -> the :class:`~onnx2fpga.ir.Design`, with
   several inputs or outputs multiplexed onto the one stream each way
   (:func:`multiplex_inputs`, :func:`multiplex_outputs`), elementwise layers fused into
   the layer before them (:func:`fuse_requants`) and a pad with the zero point merged into
   the convolution after it (:func:`merge_pads`);
7. :func:`absorb_multiplier_signs` on every layer.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from ..errors import OptionError, UnsupportedError
from ..ir import (
    REQUANT_MODES,
    ConcatLayer,
    ConvLayer,
    Dataflow,
    DenseLayer,
    Design,
    HostNode,
    IntType,
    PadLayer,
    Port,
    RequantLayer,
    RequantStage,
    SliceLayer,
    ViewLayer,
)
from .build import HardwarePart, build_layers
from .epilogue import RequantOptions
from .groups import QdqGraph, find_groups
from .ir import Graph, Node, logical_shape
from .check import Onnx2FpgaWarning
from .partition import Partition, extend_accumulator_tail, find_entries, host_compute, partition
from .qdq import exact_average_pools, integer_max_pools

__all__ = ["lower", "assemble_design", "multiplex_inputs", "multiplex_outputs",
           "fuse_requants", "merge_pads", "absorb_multiplier_signs"]


def lower(graph: Graph, *, multiplier_bits: int = 16, rounding: str = "half_even",
          requant: str = "exact", allow_host_compute: bool = False) -> Design:
    """Partition and lower a normalized QDQ graph; see the module docstring.

    Convolution, pooling, resize and pad nodes must carry the ``_geometry`` attribute that
    :func:`onnx2fpga.frontend.resolve.resolve_geometry` adds. Negative requantization
    multipliers are absorbed into the weights (:func:`absorb_multiplier_signs`). The graph
    gains the host's dequantization of an accumulator the hardware part ends with (see
    :func:`~onnx2fpga.frontend.partition.extend_accumulator_tail`).

    Parameters
    ----------
    graph : Graph
        A QDQ graph (after :func:`~onnx2fpga.frontend.qdq.normalize_qdq`).
    multiplier_bits : int
        Significant bits of a requantization multiplier, 2 to 32.
    rounding : str
        The requantization's rounding where the quantizer rounds half to even.
    requant : str
        The requantization after a Conv, Gemm or MatMul (one of
        :data:`~onnx2fpga.ir.REQUANT_MODES`).
    allow_host_compute : bool
        Let a compute operator (Conv, Gemm, MatMul and their integer forms) run on the host,
        in float, with a warning that lists every such node; without it, that is an error.

    Raises
    ------
    OptionError
        ``multiplier_bits`` out of range, an unknown ``requant``.
    UnsupportedError
        Every part of the graph that can run neither in hardware nor on the host; every
        compute operator placed on the host, with the reason (unless
        ``allow_host_compute``).
    """
    if not isinstance(multiplier_bits, int) or not 2 <= multiplier_bits <= 32:
        raise OptionError(f"multiplier_bits must be an integer from 2 to 32, not "
                         f"{multiplier_bits!r}")
    # Measured on onnxruntime's QDQ MLPs (benchmarks/ort_agreement.py): 16 bits give
    # 99.875 % exact outputs and at most 2 LSB; 24 bits 99.993 % and at most 1 LSB.
    if requant not in REQUANT_MODES:
        raise OptionError(f"requant must be one of {', '.join(REQUANT_MODES)}, not "
                          f"{requant!r}")
    opts = RequantOptions(multiplier_bits, rounding, requant)
    integer_max_pools(graph)
    exact_average_pools(graph)
    qg = QdqGraph(graph)
    entries = find_entries(qg)
    head_ids = {id(n) for e in entries for n in qg.ancestors(e)}
    head = [n for n in graph.nodes if id(n) in head_ids]
    found = find_groups(qg, entries, head)
    hw = build_layers(qg, found, entries, opts)
    extend_accumulator_tail(hw, head)
    part = partition(hw, entries[0], head)
    on_host = host_compute(hw, part)
    if on_host and not allow_host_compute:
        raise UnsupportedError([f"{line}; to run it there, pass --allow-host-compute "
                                f"(allow_host_compute=True)" for line in on_host])
    if on_host:
        warnings.warn(f"{len(on_host)} compute node{'s' if len(on_host) > 1 else ''} run on "
                      f"the host in float (allowed): {'; '.join(on_host)}", Onnx2FpgaWarning,
                      stacklevel=2)
    design = assemble_design(hw, entries if len(entries) > 1 else entries[0], part)
    for layer in design.dataflow.layers:
        absorb_multiplier_signs(layer)
    return design


def assemble_design(hw: HardwarePart, entry, part: Partition) -> Design:
    """The :class:`~onnx2fpga.ir.Design` of a partitioned graph.

    Parameters
    ----------
    hw : HardwarePart
        The hardware part's layers (fused here, :func:`fuse_requants`).
    entry : Node or list of Node
        The QuantizeLinear of its input, or a list of several (one per graph input,
        multiplexed by :func:`multiplex_inputs`).
    part : Partition
        The host's head and tail, and the hardware part's outputs (several are multiplexed
        by :func:`multiplex_outputs`).

    Returns
    -------
    Design
        The dataflow between an input and an output port, the host's nodes (with an
        Identity that gives the output its ONNX name where it has another), the constants
        they read, the graph's input and every graph output (name, dtype, shape; the tail
        computes them all from the one output port), and the model's metadata.
    """
    g = hw.graph.graph
    extra = {}
    head = [_host(n) for n in part.head]
    if isinstance(entry, list):
        in_port, join = multiplex_inputs(hw, entry, extra)
        head += join
        entry = entry[0]
    else:
        qi_in = hw.qinfo[entry.outputs[0]]
        in_port = Port(entry.outputs[0], hw.graph.shape(entry.outputs[0]), qi_in.type,
                       qi_in.scale, qi_in.zero_point)
    if len(part.outputs) > 1:
        out_port, split = multiplex_outputs(hw, in_port, part.outputs, extra)
        layers = merge_pads(fuse_requants(hw.layers), {out_port.name})
        tail = split + [_host(n) for n in part.tail]
    else:
        hw_out = part.output
        layers = merge_pads(fuse_requants(hw.layers), {hw.name(hw_out)})
        qi_out = hw.qinfo[hw_out]
        out_t = hw.name(hw_out)
        out_type = next(ly.out_type for ly in layers if ly.output == out_t) \
            if out_t != entry.outputs[0] else in_port.type
        out_port = Port(out_t, hw.graph.shape(hw_out), out_type, qi_out.scale,
                        qi_out.zero_point)
        tail = [_host(n) for n in part.tail]
        if out_t != hw_out:
            # The tail reads the tensor under its ONNX name: the host gives it that name.
            tail.insert(0, HostNode("Identity", [out_t], [hw_out], {}, f"{hw_out}__alias"))
    # Outputs a pass renamed get the model's names back from the tail node computing them
    # (or an Identity where the tail computes none).
    names = {o: g.output_names[o] for o in g.outputs if o in g.output_names}
    for n in tail:
        n.inputs = [names.get(i, i) for i in n.inputs]
        n.outputs = [names.get(o, o) for o in n.outputs]
    made = {o for n in tail for o in n.outputs}
    tail += [HostNode("Identity", [o], [name], {}, f"{name}__output")
             for o, name in names.items() if name not in made]
    needed = {i for n in head + tail for i in n.inputs if i in g.constants}
    constants = {k: np.asarray(g.constants[k]) for k in sorted(needed)}
    constants.update(extra)
    return Design(
        dataflow=Dataflow(layers, in_port, out_port),
        head=head,
        tail=tail,
        constants=dict(sorted(constants.items())),
        inputs=[_io(g, name) for name in g.inputs],
        outputs=[_io(g, name, g.output_names.get(name, name)) for name in g.outputs],
        metadata=dict(g.metadata, graph_name=g.name),
    )


def multiplex_inputs(hw: HardwarePart, entries: list, constants: dict):
    """Several graph inputs enter through the hardware part's one input stream: the host
    quantizes each (its own scale and zero point), flattens it in C order and concatenates
    them in graph-input order; in hardware a :class:`~onnx2fpga.ir.SliceLayer` takes each
    one's range of the stream and a :class:`~onnx2fpga.ir.ViewLayer` gives it its shape
    again. The inputs share one integer type (:func:`~onnx2fpga.frontend.partition.
    find_entries`).

    ``hw.layers`` gains the layers in front; ``constants`` the host's reshape target.

    Returns
    -------
    tuple
        The input :class:`~onnx2fpga.ir.Port` (scale 1, zero point 0, ``parts`` describing
        the layout) and the host nodes that make the stream from the quantized inputs, for
        the head.
    """
    stream = "hardware_inputs__stream"
    typ = hw.qinfo[entries[0].outputs[0]].type
    sizes = [int(np.prod(hw.graph.shape(e.outputs[0]), dtype=np.int64)) for e in entries]
    total = sum(sizes)
    layers, parts, join = [], [], []
    constants["hardware_inputs__row"] = np.asarray([1, -1], np.int64)
    offset = 0
    for e, size in zip(entries, sizes):
        t = e.outputs[0]
        onnx_shape = [int(d) for d in hw.graph.shape(t)]
        shape = logical_shape(onnx_shape)
        qi = hw.qinfo[t]
        part = t if len(shape) == 1 else f"{t}__part"
        layers.append(SliceLayer(hw.next_name("slice"), typ, (total,), offset, offset + size,
                                 inputs=[stream], output=part))
        if part != t:
            layers.append(ViewLayer(hw.next_name("view"), typ, (size,), shape, nodes=[],
                                    inputs=[part], output=t))
        parts.append({"tensor": t, "offset": offset, "size": size, "shape": onnx_shape,
                      "type": typ.name, "scale": float(qi.scale),
                      "zero_point": int(qi.zero_point)})
        join.append(HostNode("Reshape", [t, "hardware_inputs__row"], [f"{t}__row"], {},
                             f"{t}__multiplex", "", 14))
        offset += size
    join.append(HostNode("Concat", [f"{e.outputs[0]}__row" for e in entries], [stream],
                         {"axis": 1}, "inputs__multiplex", "", 13))
    hw.layers[:0] = layers
    return Port(stream, (1, total), typ, 1.0, 0, parts=parts), join


def multiplex_outputs(hw: HardwarePart, in_port: Port, outputs: list, constants: dict):
    """Several results of the hardware part leave through its one output stream: each is
    viewed as a flat vector in its logical C order (a :class:`~onnx2fpga.ir.ViewLayer`) and
    the vectors are concatenated in ``outputs``' order (a :class:`~onnx2fpga.ir.ConcatLayer`
    without requantization, into the narrowest type holding every part's type: exact, each
    part keeps its own scale and zero point). The host splits the stream back.

    ``hw.layers`` gains the layers; ``constants`` the host's reshape targets.

    Returns
    -------
    tuple
        The output :class:`~onnx2fpga.ir.Port` (scale 1, zero point 0, ``parts`` describing
        the layout) and the host nodes that recover each ONNX tensor of ``outputs`` (a Slice
        of the stream and a Reshape to its ONNX shape) for the tail.
    """
    types = {ly.output: (ly.out_type, tuple(ly.out_shape)) for ly in hw.layers}
    types.setdefault(in_port.name, (in_port.type, logical_shape(in_port.shape)))
    flats, in_types, in_shapes, parts, split = [], [], [], [], []
    offset = 0
    stream = "hardware_outputs__stream"
    for t in outputs:
        src = hw.name(t)
        typ, shape = types[src]
        size = int(np.prod(shape, dtype=np.int64))
        flat = src
        if len(shape) != 1:
            flat = f"{t}__flat"
            hw.layers.append(ViewLayer(hw.next_name("view"), typ, shape, (size,),
                                       nodes=[], inputs=[src], output=flat))
        flats.append(flat)
        in_types.append(typ)
        in_shapes.append((size,))
        qi = hw.qinfo[t]
        onnx_shape = [int(d) for d in hw.graph.shape(t)]
        parts.append({"tensor": t, "offset": offset, "size": size, "shape": onnx_shape,
                      "type": typ.name, "scale": np.asarray(qi.scale, float).tolist(),
                      "zero_point": np.asarray(qi.zero_point).tolist()})
        constants[f"{t}__shape"] = np.asarray(onnx_shape, np.int64)
        split += [HostNode("Slice", [stream], [f"{t}__part"],
                           {"starts": [offset], "ends": [offset + size], "axes": [1]},
                           f"{t}__demultiplex", "", 1),
                  HostNode("Reshape", [f"{t}__part", f"{t}__shape"], [t], {},
                           f"{t}__demultiplex_shape", "", 14)]
        offset += size
    out_type = IntType.for_range(min(x.lo for x in in_types), max(x.hi for x in in_types))
    hw.layers.append(ConcatLayer(hw.next_name("concat"), in_types, in_shapes, 0, out_type,
                                 [[] for _ in in_types], inputs=flats, output=stream))
    return Port(stream, (1, offset), out_type, 1.0, 0, parts=parts), split


def _io(g: Graph, name, label=None):
    info = g.tensors[name]
    return {"name": label or name, "dtype": info.dtype,
            "shape": [int(d) for d in info.shape]}


def _host(n: Node) -> HostNode:
    return HostNode(n.op, list(n.inputs), list(n.outputs), dict(n.attrs), n.name, n.domain,
                    n.version)


def fuse_requants(layers: list) -> list:
    """Append an elementwise layer to the layer before it when that layer feeds only it.

    Parameters
    ----------
    layers : list
        Layers in topological order (changed in place where they fuse).

    Returns
    -------
    list
        The layers left: a :class:`~onnx2fpga.ir.RequantLayer` whose input is the output
        of a layer with a requantization (no view, pad or concatenation) and of the same
        shape, read by nothing else, becomes that layer's last requantization stage.
    """
    readers: dict[str, int] = {}
    for layer in layers:
        for t in layer.inputs:
            readers[t] = readers.get(t, 0) + 1
    by_output = {}
    out = []
    owned = set()          # layers whose stage and node lists are copies this function extends
    for layer in layers:
        if isinstance(layer, RequantLayer) and readers.get(layer.inputs[0]) == 1:
            prev = by_output.get(layer.inputs[0])
            if prev is not None and not isinstance(prev, (ViewLayer, PadLayer)) and \
                    getattr(prev, "requant", None) and prev.out_size == layer.in_size and \
                    not isinstance(prev, ConcatLayer) and \
                    tuple(prev.out_shape) == tuple(layer.shape):
                if id(prev) not in owned:     # copied once, then extended: a chain stays linear
                    prev.requant, prev.nodes = list(prev.requant), list(prev.nodes)
                    owned.add(id(prev))
                prev.requant.extend(layer.requant)
                prev.nodes.extend(layer.nodes)
                del by_output[prev.output]
                prev.output = layer.output
                by_output[prev.output] = prev
                continue
        out.append(layer)
        by_output[layer.output] = layer
    return out


def merge_pads(layers: list, outputs) -> list:
    """Merge a :class:`~onnx2fpga.ir.PadLayer` into the one convolution that reads it where
    it pads with that convolution's input zero point (what padding a convolution means):
    the convolution pads by both and reads the pad's input. onnxruntime's quantizer writes
    torch's ``nn.ZeroPad2d`` in front of a Conv so, with a quantizer between them.

    Parameters
    ----------
    layers : list
        Layers in topological order (not changed; merged convolutions are new layers).
    outputs : set of str
        Tensors that leave the hardware: a pad writing one stays.

    Returns
    -------
    list
        The layers left.
    """
    readers: dict[str, list] = {}
    for layer in layers:
        for t in layer.inputs:
            readers.setdefault(t, []).append(layer)
    pads = {}
    for layer in layers:
        conv = readers.get(layer.output, [None])[0]
        if isinstance(layer, PadLayer) and len(readers.get(layer.output, [])) == 1 and \
                layer.output not in outputs and isinstance(conv, ConvLayer) and \
                conv.inputs == [layer.output] and conv.in_type == layer.in_type and \
                conv.in_zero_point == layer.value and \
                tuple(conv.in_shape) == tuple(layer.out_shape):
            pads[id(conv)] = layer
    merged = {id(pad) for pad in pads.values()}
    out = []
    for layer in layers:
        if id(layer) in merged:
            continue
        pad = pads.get(id(layer))
        if pad is not None:
            layer = dataclasses.replace(
                layer, in_shape=pad.in_shape, inputs=list(pad.inputs),
                pads=tuple(a + b for a, b in zip(layer.pads, pad.pads)),
                nodes=list(pad.nodes) + list(layer.nodes))
        out.append(layer)
    return out


def absorb_multiplier_signs(layer) -> bool:
    """Make every multiplier of ``layer``'s first requantization non-negative by negating
    the weights and bias of the output channels whose multiplier is negative (in place).

    A channel with a negative multiplier (a batch normalization with a negative scale, a
    quantizer after a negated weight) makes the activation decreasing in that channel's
    accumulator, and a threshold core needs all channels to go the same way
    (:func:`onnx2fpga.hw.threshold.requant_as_thresholds`); without it, a low-bit activation
    falls back to a multiplier per lane. Negating the channel's accumulator and its
    multiplier computes the same value before rounding: with ``x' = -x`` and ``m' = -m``,
    ``(x' - z) * m' + off'`` equals ``(x - z) * m + off`` for ``off' = off - 2 * z * m``
    (likewise on a fused LeakyRelu's negative side, whose selection depends only on that
    value), so the layer's outputs are exactly the same. As FINN's streamlining does, this
    happens only where the negated weights stay within the weight type (a narrow-range
    type such as ``{-1, 0, 1}`` always; else no change).

    Returns True if anything changed.
    """
    if not isinstance(layer, (DenseLayer, ConvLayer)) or not layer.requant:
        return False
    stage = layer.requant[0]
    if not isinstance(stage, RequantStage):
        return False
    channels = layer.out_features if isinstance(layer, DenseLayer) else layer.out_channels
    m = np.asarray(stage.multiplier, np.int64).reshape(-1)
    if m.size != channels or not np.any(m < 0):
        return False
    flip = m < 0
    w = layer.weight.reshape(channels, -1)
    neg_w = -w[flip]
    if neg_w.size and (neg_w.min() < layer.weight_type.lo or neg_w.max() > layer.weight_type.hi):
        return False
    if stage.neg_multiplier is not None and stage.neg_multiplier.size not in (1, channels):
        return False
    sign = np.where(flip, -1, 1)
    z = int(stage.in_zero_point)

    def flipped(mult, off):
        mult = np.broadcast_to(np.asarray(mult, np.int64).reshape(-1), (channels,))
        off = np.broadcast_to(np.asarray(off, np.int64).reshape(-1), (channels,))
        return mult * sign, np.where(flip, off - 2 * z * mult, off)

    mult, off = flipped(stage.multiplier, stage.offset)
    kw = {"multiplier": mult, "offset": off}
    if stage.neg_multiplier is not None:
        kw["neg_multiplier"], kw["neg_offset"] = flipped(stage.neg_multiplier,
                                                         stage.neg_offset)
    layer.requant[0] = dataclasses.replace(stage, **kw)
    layer.weight = (w * sign[:, None]).reshape(layer.weight.shape)
    layer.bias = layer.bias * sign
    return True
