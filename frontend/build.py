"""Build the integer layers of a QDQ graph's groups: the hardware part before partitioning.

:func:`build_layers` turns every group that :func:`~onnx2fpga.frontend.groups.find_groups`
found into one integer layer (a MatMul / Gemm into a :class:`~onnx2fpga.ir.DenseLayer`, a
Conv into a :class:`~onnx2fpga.ir.ConvLayer`, ...), its epilogue and quantizer into the
layer's requantization (:mod:`onnx2fpga.frontend.epilogue`), and views into
:class:`~onnx2fpga.ir.ViewLayer` layers (or plain renames where a vector stays a vector).
Float scales become exact integer requantization: ``M = s_in * s_w[c] / s_out`` (times the
epilogue's per-channel factors) is turned into a multiplier of ``multiplier_bits``
significant bits and a common right shift; float biases that are not on the accumulator's
scale become a per-channel offset on the same scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import UnsupportedError
from ..ir import (
    AddLayer,
    ConcatLayer,
    ConvLayer,
    DenseLayer,
    IntType,
    PadLayer,
    PoolLayer,
    RequantLayer,
    RequantStage,
    ResizeLayer,
    SliceLayer,
    ThresholdStage,
    ViewLayer,
    image_shape,
)
from ..sim import golden
from ..sim.host import block_view
from .epilogue import (
    Epilogue,
    QuantInfo,
    RequantOptions,
    acc_stage,
    bipolar_flips,
    compact,
    compact_axes,
    f32_ratio,
    float32_stage,
    integer_bias,
    is_identity,
    match_epilogue,
    out_info,
    out_quant,
    out_rounding,
    output_bounds,
    requant_params,
    requant_stage,
)
from .function import accumulator_flips, accumulator_thresholds, function_table
from .groups import JOIN_OPS, REDUCE_OPS, SLICE_OPS, VIEW_OPS, Group, QdqGraph
from .ir import Node, logical_shape

__all__ = ["HardwarePart", "build_layers", "build_group", "add_views", "dense_layer",
           "conv_layer", "weight_type", "ADD_MULTIPLIER_BITS",
           "MINMAX_MULTIPLIER_BITS"]

#: Significant bits of the two multipliers of an add of activations (see :func:`_add_layer`).
ADD_MULTIPLIER_BITS = 12
#: The same for a minimum or maximum: the comparison of two terms is exact only if both are
#: on the output grid to well within a step (measured on onnxruntime QDQ models: 12 bits gave
#: 99.2 % exact outputs, 16 bits 100 %).
MINMAX_MULTIPLIER_BITS = 16


@dataclass
class HardwarePart:
    """The integer layers built so far from a QDQ graph, and what they compute.

    Attributes
    ----------
    graph : QdqGraph
        The graph the layers come from.
    options : RequantOptions
        How requantization stages are built.
    layers : list
        The layers, in topological order.
    qinfo : dict of str to QuantInfo
        Every integer tensor the layers read or write (under its ONNX name).
    alias : dict of str to str
        ONNX tensors that are another tensor under a new name (a view that moves nothing).
    used : set of int
        The ids of the graph's nodes that the layers compute.
    count : int
        Layers named so far: names are ``<kind><count>``.
    accumulator : tuple or None
        After a dense or convolution layer built without a quantizer: the accumulator's
        real scale per channel and the float bias left for the host.
    host_reasons : dict of int to str
        Why a MatMul / Gemm / Conv core and its function of the accumulator
        (:attr:`~onnx2fpga.frontend.groups.Group.func`), by ``id``, could not be built
        (see :func:`~onnx2fpga.frontend.partition.host_compute`).
    """
    graph: QdqGraph
    options: RequantOptions
    layers: list = field(default_factory=list)
    qinfo: dict = field(default_factory=dict)
    alias: dict = field(default_factory=dict)
    used: set = field(default_factory=set)
    count: int = 0
    accumulator: tuple | None = None
    host_reasons: dict = field(default_factory=dict)

    def name(self, t) -> str:
        """The tensor that carries ONNX tensor ``t``."""
        return self.alias.get(t, t)

    def next_name(self, kind: str) -> str:
        """A new layer name."""
        name = f"{kind}{self.count}"
        self.count += 1
        return name


def build_layers(qg: QdqGraph, found: list, entry, opts: RequantOptions) -> HardwarePart:
    """Build the layers of every group and integer operator, in order.

    Parameters
    ----------
    qg : QdqGraph
        The graph.
    found : list of Group or Node
        What :func:`~onnx2fpga.frontend.groups.find_groups` found.
    entry : Node or list of Node
        The QuantizeLinear of the hardware part's input (one per graph input).
    opts : RequantOptions
        How requantization stages are built.

    Returns
    -------
    HardwarePart
        The layers. A group reading the result of a group that could not be built is left
        out (its problems would only repeat the first one's).

    Raises
    ------
    UnsupportedError
        Every group that cannot be built, each with its reason, all at once; or the first
        view whose shape is unknown.
    """
    hw = HardwarePart(qg, opts)
    for e in entry if isinstance(entry, list) else [entry]:
        qa = e.attrs
        hw.qinfo[e.outputs[0]] = QuantInfo(qa["qtype"],
                                           float(np.asarray(qa["scale"]).reshape(())),
                                           int(np.asarray(qa["zero_point"]).reshape(())))
    problems = []
    for item in found:
        if isinstance(item, Group):
            if any(dq.inputs[0] not in hw.qinfo for dq in item.dqs):
                continue
            try:
                build_group(hw, item)
            except UnsupportedError as e:
                if item.func:       # on the host, refused there unless asked (with why)
                    for m in [item.core] + item.func:
                        hw.host_reasons[id(m)] = "; ".join(e.problems)
                else:
                    problems.extend(e.problems)
                continue
            hw.used.update(id(m) for m in item.nodes)
        elif item.inputs[0] in hw.qinfo:
            _integer_op(hw, item)
            hw.used.add(id(item))
    if problems:
        raise UnsupportedError(problems)
    _use_constant_quantizers(hw)
    return hw


def _use_constant_quantizers(hw: HardwarePart) -> None:
    """Mark as computed by the layers the QuantizeLinear / DequantizeLinear nodes of a
    constant (onnxruntime quantizes an elementwise operator's constant operand) that only
    the layers' nodes read: the layers hold their values."""
    qg = hw.graph
    for op in ("DequantizeLinear", "QuantizeLinear"):
        for n in reversed(qg.graph.nodes):
            if n.op != op or id(n) in hw.used or n.outputs[0] in qg.graph.outputs or \
                    not (qg.is_const(n.outputs[0]) if op == "DequantizeLinear" else
                         n.inputs[0] in qg.graph.constants):
                continue
            readers = qg.cons.get(n.outputs[0], [])
            if readers and all(id(c) in hw.used for c in readers):
                hw.used.add(id(n))


def add_views(hw: HardwarePart, chain, src: str, qi: QuantInfo, names: list) -> str:
    """ViewLayers for the views of ``chain`` on the integer tensor ``src`` (a Pad in it is
    the convolution's, see :attr:`Group.pad <onnx2fpga.frontend.groups.Group.pad>`);
    returns the tensor after them. The node names go to ``names``."""
    for n in chain:
        if n.op != "Pad":
            src = _add_view(hw, n, src, qi, names)
    return src


def _add_view(hw: HardwarePart, n: Node, src: str, qi: QuantInfo, names: list) -> str:
    in_shape, out_shape = hw.graph.shape(n.inputs[0]), hw.graph.shape(n.outputs[0])
    if n.op == "Expand" and np.prod(in_shape, dtype=np.int64) != np.prod(out_shape,
                                                                         dtype=np.int64):
        raise UnsupportedError([f"{n.describe()}: expanding {in_shape} to {out_shape} copies "
                                f"data; only an Expand that keeps the elements (adds unit "
                                f"axes) is supported"])
    if n.op in ("DepthToSpace", "SpaceToDepth"):
        return _add_block_view(hw, n, src, qi, names)
    perm = None
    if n.op == "Transpose":
        perm = tuple(int(p) for p in n.attrs.get("perm", range(len(in_shape))[::-1]))
        if perm == tuple(range(len(in_shape))):
            perm = None
    lin, lout = logical_shape(in_shape), logical_shape(out_shape)
    if perm is not None and perm[0] == 0 and len(in_shape) >= 2 and in_shape[0] == 1:
        perm = tuple(p - 1 for p in perm[1:])
    elif perm is not None:
        lin = in_shape
    out = n.outputs[0]
    if perm is None and (lin == lout or (len(lin) <= 1 and len(lout) <= 1)):
        hw.alias[out] = src                       # a vector stays a vector: wires
    else:
        layer = ViewLayer(hw.next_name("view"), qi.type, lin, lout, perm,
                          nodes=[n.name or out], inputs=[src], output=out)
        hw.layers.append(layer)
        src = out
    hw.qinfo[out] = qi
    names.append(n.name or out)
    return src


def _add_block_view(hw: HardwarePart, n: Node, src: str, qi: QuantInfo, names: list) -> str:
    """A DepthToSpace or SpaceToDepth as the spec writes it: a view of the image as blocks
    (a reshape), then a view transposing the blocks into the output (stream orders, a
    reorder buffer where the next layer needs another)."""
    in_shape = hw.graph.shape(n.inputs[0])
    blocksize, mode = n.attrs.get("blocksize"), n.attrs.get("mode", "DCR")
    try:
        if len(in_shape) != 4 or in_shape[0] != 1:
            raise ValueError(f"an input of shape {tuple(in_shape)}; only (1, C, H, W)")
        if blocksize is None:
            raise ValueError("the blocksize attribute is required")
        blocks, perm, out_shape = block_view(n.op, in_shape, blocksize, mode)
    except ValueError as e:
        raise UnsupportedError([f"{n.describe()}: {e}"]) from None
    mid, out = f"{n.outputs[0]}__blocks", n.outputs[0]
    label = n.name or out
    hw.layers.append(ViewLayer(hw.next_name("view"), qi.type, logical_shape(in_shape),
                               blocks[1:], nodes=[label], inputs=[src], output=mid))
    hw.layers.append(ViewLayer(hw.next_name("view"), qi.type, blocks[1:], out_shape[1:],
                               tuple(p - 1 for p in perm[1:]), nodes=[label], inputs=[mid],
                               output=out))
    hw.qinfo[mid] = hw.qinfo[out] = qi
    names.append(label)
    return out


def build_group(hw: HardwarePart, grp: Group) -> None:
    """Append the layers of one group: the views in front of its core, the core's layer
    with its requantization (none where the group changes nothing), the views after it.

    Raises
    ------
    UnsupportedError
        What the group's layer cannot compute (see the messages).
    """
    qg = hw.graph
    core = grp.core
    names = []
    srcs, infos = [], []
    for chain, dq in zip(grp.pre, grp.dqs):
        qi = hw.qinfo[dq.inputs[0]]
        names.append(dq.name or dq.outputs[0])
        srcs.append(add_views(hw, chain, hw.name(dq.inputs[0]), qi, names))
        infos.append(qi)
    out = grp.quant.outputs[0]
    op = core.op if core is not None else None
    if "trunc_shift" in grp.quant.attrs and op not in (None, "AveragePool",
                                                       "GlobalAveragePool", "ReduceMean"):
        raise UnsupportedError([f"{grp.quant.describe()}: a Trunc after {op} is not "
                                f"supported (only after an average pool or on its own)"])
    core_shape = qg.shape(core.outputs[0]) if core is not None else \
        qg.shape(grp.dqs[0].outputs[0])
    aff = match_epilogue(qg, grp, core_shape) if not grp.function else None
    tail_views = grp.post
    final = out if not tail_views else f"{out}__pre_view"
    nodes = names + [n.name or n.outputs[0] for n in
                     ([core] if core else []) + grp.after + grp.func]
    if grp.function:
        layer = _function_layer(hw, grp, srcs[0], infos[0], final)
    elif op in ("MatMul", "Gemm"):
        layer = dense_layer(hw, grp, srcs[0], infos[0], aff, final)
    elif op == "Conv":
        layer = conv_layer(hw, grp, srcs[0], infos[0], aff, final)
    elif op in ("MaxPool", "GlobalMaxPool", "AveragePool", "GlobalAveragePool") + REDUCE_OPS:
        layer = _pool_layer(hw, grp, srcs[0], infos[0], aff, final)
    elif op in JOIN_OPS:
        layer = _add_layer(hw, grp, srcs, infos, aff, final)
    elif op == "Concat":
        layer = _concat_layer(hw, grp, srcs, infos, aff, final)
    elif op in ("Resize", "Upsample"):
        layer = _resize_layer(hw, grp, srcs[0], infos[0], aff, final)
    elif op == "Pad":
        layer = _pad_layer(hw, grp, srcs[0], infos[0], aff, final)
    elif op in SLICE_OPS:
        layer = _slice_layer(hw, grp, srcs[0], infos[0], aff, final)
    else:
        layer = _eltwise_layer(hw, grp, srcs[0], infos[0], aff, final)
    if layer is None:
        hw.alias[final] = srcs[0]
    else:
        layer.nodes = nodes + [grp.quant.name or out]
        hw.layers.append(layer)
    qi = out_info(grp)
    hw.qinfo[final] = qi
    src = hw.name(final)
    for n in tail_views:
        src = _add_view(hw, n, src, qi, [])
    if src != out:
        hw.alias[out] = src
    hw.qinfo[out] = qi


def _integer_op(hw: HardwarePart, n: Node) -> None:
    """A view or max pool straight on a quantized tensor: it keeps the tensor's
    parameters (see :meth:`~onnx2fpga.frontend.groups.QdqGraph.integer_op`)."""
    qi = hw.qinfo[n.inputs[0]]
    src = hw.name(n.inputs[0])
    if n.op in VIEW_OPS:
        _add_view(hw, n, src, qi, [])
        return
    geo = n.attrs["_geometry"]
    layer = PoolLayer(hw.next_name("pool"), "max", qi.type,
                      logical_shape(hw.graph.shape(n.inputs[0])), tuple(geo["kernel"]),
                      tuple(geo["stride"]), tuple(geo["dilation"]),
                      tuple(geo["pads"]), qi.zero_point, [],
                      nodes=[n.name or n.outputs[0]], inputs=[src],
                      output=n.outputs[0])
    hw.layers.append(layer)
    hw.qinfo[n.outputs[0]] = qi


def weight_type(weight: np.ndarray) -> IntType:
    """The signed type of a layer's integer weights (zero included)."""
    wtype = IntType.for_range(min(int(weight.min()), 0), max(int(weight.max()), 0))
    return wtype if wtype.signed else IntType(wtype.bits + 1, True)


def _bias(qg: QdqGraph, core, index, n_out, acc_scale, beta=1.0):
    """An integer bias on the accumulator's scale and the real bias left over."""
    bias_int = np.zeros(n_out, np.int64)
    bias_real = np.zeros(n_out)
    if index is None or len(core.inputs) <= index or not core.inputs[index]:
        return bias_int, bias_real
    name = core.inputs[index]
    dq = qg.dq_constant(name)
    if dq is not None and beta == 1.0:
        q, s, z, _, _, _ = dq
        sb = np.broadcast_to(np.asarray(s, np.float64).reshape(-1), (n_out,))
        if np.allclose(sb, acc_scale, rtol=1e-6, atol=0):
            return np.broadcast_to((q - z).reshape(-1), (n_out,)).astype(np.int64), \
                bias_real
    val, _ = qg.float_constant(name)
    if val is None:
        raise UnsupportedError([f"{core.describe()}: bias {name!r} is not a constant"])
    if val.size not in (1, n_out):
        raise UnsupportedError([f"{core.describe()}: bias of shape {val.shape} for "
                                f"{n_out} outputs"])
    return bias_int, np.broadcast_to(val.reshape(-1) * beta, (n_out,)).copy()


def _finish_core(hw: HardwarePart, layer, acc_scale, bias_real, aff, grp, channels,
                 flip=None):
    """The requantization after an accumulator; without a quantizer after the core (a
    model's last layer), the accumulator itself leaves the hardware and
    ``hw.accumulator`` keeps its real scale and float bias for the host."""
    if grp.quant is None:
        hw.accumulator = (acc_scale, bias_real)
        return layer
    if grp.func:
        return _function_of_accumulator(hw, layer, acc_scale, bias_real, grp, channels)
    folded = integer_bias(hw.graph, grp, acc_scale, aff, channels) \
        if hw.options.requant == "onnxruntime" and flip is None else None
    if folded is not None:          # a bias Add after a MatMul: onnxruntime's QGemm adds it
        layer.bias, aff = layer.bias + folded[0], folded[1]
    layer.requant = [acc_stage(acc_scale, bias_real, aff, grp, hw.options, channels, flip,
                               value_range=(layer.acc_type.lo, layer.acc_type.hi))]
    return layer


def _function_of_accumulator(hw, layer, acc_scale, bias_real, grp, channels):
    """A function operator on the float result (thresholds on the accumulator, see
    :func:`~onnx2fpga.frontend.function.accumulator_thresholds`); channels where it falls
    get their weights and bias negated first."""
    qg = hw.graph
    rank = len(qg.shape(grp.core.outputs[0]))
    acc = layer.acc_type
    flip = accumulator_flips(qg, grp, acc_scale, bias_real, channels, rank, (acc.lo, acc.hi))
    if flip is not None:
        sel = flip.reshape((-1,) + (1,) * (layer.weight.ndim - 1))
        layer.weight = np.where(sel, -layer.weight, layer.weight)
        layer.weight_type = weight_type(layer.weight)
        layer.bias = np.where(flip, -layer.bias, layer.bias)
        acc = layer.acc_type
    layer.requant = [accumulator_thresholds(qg, grp, acc_scale, bias_real, channels, rank,
                                            (acc.lo, acc.hi), flip)]
    return layer


def dense_layer(hw: HardwarePart, grp: Group, src: str, qi: QuantInfo, aff: Epilogue,
                out: str) -> DenseLayer:
    """The :class:`~onnx2fpga.ir.DenseLayer` of a MatMul or Gemm core on ``src``."""
    qg = hw.graph
    core = grp.core
    where = core.describe()
    dq = qg.dq_constant(core.inputs[1])
    if dq is None:
        raise UnsupportedError([f"{where}: the weight is not a quantized constant "
                                f"(DequantizeLinear of an initializer)"])
    q, s, z, axis, _, _ = dq
    if q.ndim != 2:
        raise UnsupportedError([f"{where}: weight of rank {q.ndim}; only 2-D weights"])
    alpha, trans = 1.0, False
    if core.op == "Gemm":
        if core.attrs.get("transA", 0):
            raise UnsupportedError([f"{where}: transA=1 is not supported"])
        trans = bool(core.attrs.get("transB", 0))
        alpha = float(core.attrs.get("alpha", 1.0))
    in_shape = logical_shape(qg.shape(core.inputs[0]))
    if len(in_shape) != 1:
        raise UnsupportedError([f"{where}: input of shape {qg.shape(core.inputs[0])}; "
                                f"only a batch of vectors"])
    out_axis = 0 if trans else 1
    w = q.T if not trans else q                     # (out, in)
    axis = axis if axis >= 0 else axis + 2
    s = np.asarray(s, np.float64).reshape(-1)
    zz = np.asarray(z, np.int64).reshape(-1)
    n_out = w.shape[0]
    if s.size == 1:
        s_w, z_w = np.full(n_out, s[0]), np.full(n_out, zz[0])
    elif axis == out_axis and s.size == n_out:
        s_w, z_w = s, zz
    else:
        raise UnsupportedError([f"{where}: weight scales along the reduction axis "
                                f"cannot be factored out"])
    weight = w - z_w[:, None]
    bias_int, bias_real = _bias(qg, core, 2 if core.op == "Gemm" else None, n_out,
                                alpha * qi.scale * s_w, float(core.attrs.get("beta", 1.0)))
    acc_scale = f32_ratio(np.float32(alpha) * np.float32(qi.scale) *
                          s_w.astype(np.float32), 1.0).astype(np.float64)
    flip = bipolar_flips(grp, acc_scale, aff, n_out)
    if flip is not None:
        weight = np.where(flip[:, None], -weight, weight)
        bias_int = np.where(flip, -bias_int, bias_int)
    layer = DenseLayer(hw.next_name("dense"), qi.type, qi.zero_point, weight,
                       weight_type(weight), bias_int, [], inputs=[src], output=out)
    return _finish_core(hw, layer, acc_scale, bias_real, aff, grp, n_out, flip)


def conv_layer(hw: HardwarePart, grp: Group, src: str, qi: QuantInfo, aff: Epilogue,
               out: str) -> ConvLayer:
    """The :class:`~onnx2fpga.ir.ConvLayer` of a Conv core on ``src``; a zero Pad in front
    of it (``grp.pad``) joins its padding."""
    qg = hw.graph
    core = grp.core
    pad = grp.pad
    where = core.describe()
    dq = qg.dq_constant(core.inputs[1])
    if dq is None:
        raise UnsupportedError([f"{where}: the weight is not a quantized constant "
                                f"(DequantizeLinear of an initializer)"])
    q, s, z, axis, _, _ = dq
    geo = core.attrs["_geometry"]
    n_out = q.shape[0]
    s = np.asarray(s, np.float64).reshape(-1)
    zz = np.asarray(z, np.int64).reshape(-1)
    axis = axis if axis >= 0 else axis + q.ndim
    if s.size == 1:
        s_w, z_w = np.full(n_out, s[0]), np.full(n_out, zz[0])
    elif axis == 0 and s.size == n_out:
        s_w, z_w = s, zz
    else:
        raise UnsupportedError([f"{where}: weight scales must be per tensor or per "
                                f"output channel (axis 0)"])
    weight = q - z_w.reshape((-1,) + (1,) * (q.ndim - 1))
    if weight.ndim == 3:
        weight = weight[:, :, None, :]
    pads = tuple(geo["pads"])
    in_shape = logical_shape(qg.shape(core.inputs[0]))
    if pad is not None:
        pgeo = pad.attrs["_geometry"]
        value = float(pgeo["value"])
        if value != 0.0:
            raise UnsupportedError([f"{pad.describe()}: a constant pad of {value} before "
                                    f"a convolution (only zero merges into it)"])
        pads = tuple(a + b for a, b in zip(pads, pgeo["pads"]))
        in_shape = logical_shape(qg.shape(pad.inputs[0]))
    bias_int, bias_real = _bias(qg, core, 2, n_out, qi.scale * s_w)
    acc_scale = f32_ratio(np.float32(qi.scale) * s_w.astype(np.float32), 1.0)
    flip = bipolar_flips(grp, acc_scale, aff, n_out)
    if flip is not None:
        weight = np.where(flip.reshape((-1,) + (1,) * (weight.ndim - 1)), -weight, weight)
        bias_int = np.where(flip, -bias_int, bias_int)
    layer = ConvLayer(hw.next_name("conv"), qi.type, qi.zero_point, in_shape, weight,
                      weight_type(weight), bias_int, [], stride=tuple(geo["stride"]),
                      dilation=tuple(geo["dilation"]), pads=pads, group=int(geo["group"]),
                      inputs=[src], output=out)
    return _finish_core(hw, layer, acc_scale.astype(np.float64), bias_real, aff, grp,
                        n_out, flip)


def _pool_layer(hw, grp, src, qi, aff, out):
    core = grp.core
    geo = core.attrs["_geometry"]
    in_shape = logical_shape(hw.graph.shape(core.inputs[0]))
    _, s_out, _ = out_quant(grp)
    is_max = core.op in ("MaxPool", "GlobalMaxPool", "ReduceMax")
    common = dict(kernel=tuple(geo["kernel"]), stride=tuple(geo["stride"]),
                  dilation=tuple(geo["dilation"]), pads=tuple(geo["pads"]),
                  inputs=[src], output=out)
    if is_max:
        if np.any(np.asarray(aff.a) <= 0):
            raise UnsupportedError([f"{core.describe()}: a negative scale after a max "
                                    f"pool does not commute with it"])
        requant = [] if is_identity(qi, grp, aff) else [
            requant_stage(f32_ratio(np.float32(qi.scale) * np.asarray(aff.a, np.float32),
                                    s_out), aff.b / s_out, aff, grp, hw.options,
                          in_zero_point=qi.zero_point)]
        return PoolLayer(hw.next_name("pool"), "max", qi.type, in_shape,
                         in_zero_point=qi.zero_point, requant=requant, **common)
    counts = np.asarray(geo["counts"], np.float64)
    c = in_shape[0]
    a = np.broadcast_to(np.asarray(aff.a, np.float64), (c,)).reshape(c, 1, 1)
    mult = f32_ratio(np.float32(qi.scale) * a.astype(np.float32) /
                     counts.astype(np.float32)[None], s_out).astype(np.float64)
    mult = compact_axes(mult)
    off = np.broadcast_to(np.asarray(aff.b, np.float64), (c,)) / s_out
    # onnxruntime's QLinearAveragePool averages in float32 and quantizes the result: its
    # exact ties (a sum of 3 over a border count of 6) land on half, rounded to even, as the
    # float32 stage rounds them (a multiplier rounded to 24 bits would round them up: 3 %
    # of a padded pool's outputs). QLinearGlobalAveragePool is integer, as requant_stage's.
    st = float32_stage(mult, off, aff, grp, hw.options) if core.op == "AveragePool" else None
    st = st or requant_stage(mult, off, aff, grp, hw.options)
    return PoolLayer(hw.next_name("pool"), "avg", qi.type, in_shape,
                     in_zero_point=qi.zero_point, requant=[st], **common)


def _add_layer(hw, grp, srcs, infos, aff, out):
    """The :class:`~onnx2fpga.ir.AddLayer` of an Add, Sub, Mul, Min or Max of two
    activations of the same shape."""
    core = grp.core
    if len(srcs) != 2:
        raise UnsupportedError([f"{core.describe()}: a {core.op} of {len(srcs)} inputs; only "
                                f"of two"])
    shapes = [logical_shape(hw.graph.shape(i)) for i in core.inputs]
    if shapes[0] != shapes[1]:
        srcs, shapes = _broadcast_channels(hw, core, srcs, infos, shapes)
    a = np.asarray(aff.a).reshape(-1)
    if a.size != 1:
        raise UnsupportedError([f"{core.describe()}: a per-channel scale after an "
                                f"{core.op} is not supported"])
    if grp.quant.attrs.get("bipolar") or "trunc_shift" in grp.quant.attrs:
        raise UnsupportedError([f"{grp.quant.describe()}: a bipolar quantizer or a Trunc "
                                f"after an {core.op} of activations is not supported"])
    qtype, s_out, z_out = out_quant(grp)
    if core.op == "Mul":
        return _mul_layer(hw, grp, srcs, infos, aff, out, shapes[0], s_out)
    reals = [float(f32_ratio(np.float32(qi.scale) * np.float32(a[0]), s_out)[()])
             for qi in infos]
    if core.op == "Sub":
        reals[1] = -reals[1]
    op = {"Add": "add", "Sub": "add", "Min": "min", "Max": "max"}[core.op]
    if a[0] < 0 and op != "add":
        op = "max" if op == "min" else "min"       # a negative scale swaps them
    # The add core multiplies by constants in logic: 12 significant bits keep each term
    # within 1/16 LSB over an 8-bit input range at a fraction of the 16-24 bit cost.
    bits = ADD_MULTIPLIER_BITS if op == "add" else MINMAX_MULTIPLIER_BITS
    if hw.options.requant == "onnxruntime":     # its float32 kernels: match them closely
        bits = hw.options.multiplier_bits
    ms, shift = requant_params(np.array(reals), min(hw.options.multiplier_bits, bits))
    # v = (a - za) * ma + (b - zb) * mb is the output on a scale of 2**shift; the stage
    # adds the offset, rounds, shifts and clips. A LeakyRelu slope rides on the stage's
    # own multiplier as a k-bit fixed-point number.
    k = 0 if aff.alpha is None else 12
    off = np.asarray(aff.b, np.float64).reshape(-1) / s_out * 2.0 ** (shift + k)
    lo, hi = output_bounds(aff, grp)
    neg_m = neg_off = None
    if aff.alpha is not None:
        neg_m = np.array([round(aff.alpha * (1 << k))])
        neg_off = compact(np.rint(off * aff.alpha).astype(np.int64))
    st = RequantStage(np.array([1 << k]), compact(np.rint(off).astype(np.int64)),
                      shift + k, z_out, lo, hi, qtype,
                      rounding=out_rounding(grp, hw.options.rounding),
                      neg_multiplier=neg_m, neg_offset=neg_off)
    return AddLayer(hw.next_name("add"), [qi.type for qi in infos],
                    [qi.zero_point for qi in infos], shapes[0],
                    [int(ms[0]), int(ms[1])], [st], inputs=srcs, output=out, op=op)


def _broadcast_channels(hw, core, srcs, infos, shapes):
    """A join of an image ``(C, H, W)`` (or ``(C, W)``) with one value per channel
    (``(C, 1, 1)``, ``(C, 1)``; a squeeze-and-excitation scale): the per-channel tensor is
    repeated over the image by a nearest :class:`~onnx2fpga.ir.ResizeLayer` of its 1 x 1
    image, appended here, before the join."""
    big = 0 if int(np.prod(shapes[0])) >= int(np.prod(shapes[1])) else 1
    small = 1 - big
    s, b = shapes[small], shapes[big]
    if len(s) != len(b) or len(b) not in (2, 3) or s[0] != b[0] or any(d != 1 for d in s[1:]):
        raise UnsupportedError([f"{core.describe()}: broadcasting {shapes[0]} and "
                                f"{shapes[1]} is not supported; only two tensors of the same "
                                f"shape, or an image and one value per channel"])
    _, h, w = image_shape(b)
    out = f"{core.outputs[0]}__broadcast{small}"
    hw.layers.append(ResizeLayer(hw.next_name("resize"), infos[small].type, s,
                                 np.zeros(h, np.int64), np.zeros(w, np.int64),
                                 nodes=[core.name or core.outputs[0]], inputs=[srcs[small]],
                                 output=out))
    hw.qinfo[out] = infos[small]
    srcs = list(srcs)
    srcs[small] = out
    return srcs, [b, b]


def _mul_layer(hw, grp, srcs, infos, aff, out, shape, s_out):
    """A product of two activations: ``v = (a - za) * (b - zb)`` on the scale
    ``s_a * s_b``, requantized like an accumulator (ONNX Mul of the dequantized inputs)."""
    layer = AddLayer(hw.next_name("mul"), [qi.type for qi in infos],
                     [qi.zero_point for qi in infos], shape, [1, 1],
                     [RequantStage([1], [0], 0, 0, 0, 0, infos[0].type)], inputs=srcs,
                     output=out, op="mul")
    scale = np.float32(infos[0].scale) * np.float32(infos[1].scale)
    mult = f32_ratio(scale * np.asarray(aff.a, np.float32), s_out).astype(np.float64)
    st = requant_stage(mult.reshape(-1), np.asarray(aff.b, np.float64).reshape(-1) / s_out,
                       aff, grp, hw.options,
                       value_range=(layer.sum_type.lo, layer.sum_type.hi))
    if np.asarray(st.multiplier if isinstance(st, RequantStage) else [1]).size != 1:
        raise UnsupportedError([f"{grp.core.describe()}: a per-channel scale after a Mul "
                                f"is not supported"])
    layer.requant = [st]
    return layer


def _concat_layer(hw, grp, srcs, infos, aff, out):
    core = grp.core
    rank = len(hw.graph.shape(core.outputs[0]))
    axis = int(core.attrs.get("axis", 1))
    axis = axis + rank if axis < 0 else axis
    shapes = [hw.graph.shape(i) for i in core.inputs]
    if axis == 0 or shapes[0][0] != 1:
        raise UnsupportedError([f"{core.describe()}: concatenation along the batch axis "
                                f"is not supported"])
    qtype, s_out, z_out = out_quant(grp)
    stages = []
    for qi in infos:
        if is_identity(qi, grp, aff):
            stages.append([])
        else:
            a = np.asarray(aff.a).reshape(-1)
            if a.size != 1:
                raise UnsupportedError([f"{core.describe()}: a per-channel scale after "
                                        f"a concatenation is not supported"])
            stages.append([requant_stage(f32_ratio(np.float32(qi.scale) * np.float32(a[0]),
                                                   s_out), np.asarray(aff.b) / s_out, aff,
                                         grp, hw.options, in_zero_point=qi.zero_point)])
    return ConcatLayer(hw.next_name("concat"), [qi.type for qi in infos],
                       [logical_shape(s) for s in shapes], axis - 1, qtype, stages,
                       inputs=srcs, output=out)


def _resize_layer(hw, grp, src, qi, aff, out):
    core = grp.core
    geo = core.attrs["_geometry"]
    _, s_out, _ = out_quant(grp)
    requant = [] if is_identity(qi, grp, aff) else [
        requant_stage(f32_ratio(np.float32(qi.scale) * np.asarray(aff.a, np.float32), s_out),
                      np.asarray(aff.b) / s_out, aff, grp, hw.options,
                      in_zero_point=qi.zero_point)]
    return ResizeLayer(hw.next_name("resize"), qi.type,
                       logical_shape(hw.graph.shape(core.inputs[0])), geo["rows"],
                       geo["cols"], requant, inputs=[src], output=out)


def _pad_layer(hw, grp, src, qi, aff, out):
    core = grp.core
    geo = core.attrs["_geometry"]
    if not is_identity(qi, grp, aff):
        raise UnsupportedError([f"{core.describe()}: a pad that also requantizes is not "
                                f"supported (the same scale and zero point before and "
                                f"after)"])
    value = int(golden.quantize_linear(np.float32(geo["value"]), qi.scale, qi.zero_point,
                                       qi.type.lo, qi.type.hi))
    return PadLayer(hw.next_name("pad"), qi.type,
                    logical_shape(hw.graph.shape(core.inputs[0])), tuple(geo["pads"]), value,
                    inputs=[src], output=out)


def _slice_layer(hw, grp, src, qi, aff, out):
    core = grp.core
    if not is_identity(qi, grp, aff):
        raise UnsupportedError([f"{core.describe()}: a channel slice that also requantizes is "
                                f"not supported (the same scale and zero point before and "
                                f"after)"])
    geo = core.attrs["_geometry"]
    return SliceLayer(hw.next_name("slice"), qi.type,
                      logical_shape(hw.graph.shape(core.inputs[0])), geo["start"], geo["stop"],
                      inputs=[src], output=out)


def _eltwise_layer(hw, grp, src, qi, aff, out):
    if is_identity(qi, grp, aff):
        return None
    shape = logical_shape(hw.graph.shape(grp.dqs[0].outputs[0]))
    c = shape[0] if shape else 1
    _, s_out, _ = out_quant(grp)
    a = np.asarray(aff.a, np.float64).reshape(-1)
    mult = f32_ratio(np.float32(qi.scale) * a.astype(np.float32), s_out)
    st = requant_stage(mult.astype(np.float64), np.asarray(aff.b).reshape(-1) / s_out, aff,
                       grp, hw.options, in_zero_point=qi.zero_point,
                       value_range=(qi.type.lo, qi.type.hi))
    params = (st.thresholds[:, 0],) if isinstance(st, ThresholdStage) else \
        (st.multiplier, st.offset)
    for arr in params:
        if arr.size not in (1, c):
            raise UnsupportedError([f"{grp.quant.describe()}: parameters of {arr.size} "
                                    f"entries for {c} channels"])
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    return RequantLayer(hw.next_name("eltwise"), qi.type, n, [st], inputs=[src],
                        output=out, shape=shape or (1,))


def _function_layer(hw, grp, src, qi, out):
    """A function group as a :class:`~onnx2fpga.ir.RequantLayer` of one table
    (:func:`~onnx2fpga.frontend.function.function_table`)."""
    shape = logical_shape(hw.graph.shape(grp.dqs[0].outputs[0]))
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    return RequantLayer(hw.next_name("function"), qi.type, n,
                        [function_table(hw.graph, grp, qi)], inputs=[src], output=out,
                        shape=shape or (1,))
