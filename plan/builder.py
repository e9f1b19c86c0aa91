"""The pieces the core graph is built from: :class:`Stage` (one core), :class:`Plan` (the whole
graph), :class:`Builder` (appends stages and invents net names, with the adapters every layer
kind uses: lane converters, casts, requantization cores), stream orders, and the helpers the
layer kinds share (:func:`add_matvec`, :func:`window_params`, :func:`finish_layer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import gcd

import numpy as np

from ..ir.layers import (
    DenseLayer,
    align_params,
    image_shape,
)
from ..ir.stages import LutStage, RequantStage, ThresholdStage
from ..ir.types import IntType
from .cmvm import CMVM_ADDER_LEVELS
from .cmvm_requant import cached_layer_graph
from .devices import ecp5_dsp_product, ice40_matvec_dsps
from .lut import lut_as_thresholds, lut_then, lut_window, prefer_thresholds
from .plumbing import FLOP_FIFO_DEPTH
from .stage import Stage
from .thresholds import requant_as_thresholds, threshold_is_cheaper

__all__ = [
    "Plan", "Builder", "hwc_order", "stream_stages", "stage_cores", "requant_lanes",
    "matvec_arithmetic", "add_matvec", "window_params", "finish_layer",
]


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


def stream_stages(stages, shape, order) -> tuple[list, int]:
    """Requantization stages with logical per-channel parameters turned into the form
    :class:`~onnx2fpga.hw.requant.RequantCore` and
    :class:`~onnx2fpga.hw.threshold.ThresholdCore` take: 1-D parameters (thresholds: rows)
    over a period of ``channels`` stream positions (the shortest period of all parameters
    in stream order).

    Returns the stages (RequantStages, ThresholdStages and LutStages as given) and
    ``channels``. A LutStage's rows are chosen by one parameter, the row index.
    """
    shape = tuple(int(d) for d in shape)
    n = int(np.prod(shape, dtype=np.int64))

    def columns(stage):
        if isinstance(stage, LutStage):
            return [np.arange(stage.table.shape[0], dtype=np.int64)]
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
        if isinstance(stage, LutStage):
            rows = stage.table[np.broadcast_to(cols[0], (period,))]
            if len(rows) > 1 and np.all(rows == rows[:1]):
                rows = rows[:1]
            out.append(LutStage(rows, stage.in_lo, stage.out_type))
            continue
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
    core, ``kind`` ``"requant"`` (:class:`~onnx2fpga.hw.requant.RequantCore`),
    ``"threshold"`` (:class:`~onnx2fpga.hw.threshold.ThresholdCore`) or ``"lut"``
    (:class:`~onnx2fpga.hw.lut.LutCore`).

    A ThresholdStage always goes to a threshold core. A RequantStage does where it is
    monotonic over its input range (the range of ``in_type`` for the first stage, of the
    previous stage's output after that), its output takes at most 256 levels, and its
    exact thresholds (:func:`~onnx2fpga.hw.threshold.requant_as_thresholds`) are estimated
    to cost no more (:func:`onnx2fpga.plan.thresholds.threshold_is_cheaper`: in practice up to 15
    thresholds, a 4-bit output, against a multiplier of a few bits or more); the stage is
    then replaced by those thresholds, which compute the same integers.

    A LutStage is cut to its input range (:func:`~onnx2fpga.plan.lut.lut_window`) and takes
    every stage after it into its table (:func:`~onnx2fpga.plan.lut.lut_then`); the result
    goes to a threshold core where it is monotonic
    (:func:`~onnx2fpga.plan.lut.lut_as_thresholds`) with at most 255 thresholds
    (:func:`~onnx2fpga.plan.lut.prefer_thresholds`), else to a table core.
    """
    lo, hi = in_type.lo, in_type.hi
    runs: list[tuple[str, list]] = []
    stages = list(stages)
    k = 0
    while k < len(stages):
        stage = stages[k]
        k += 1
        if isinstance(stage, LutStage):
            stage = lut_window(stage, lo, hi)
            while k < len(stages):
                stage = lut_then(stage, stages[k], channels)
                k += 1
            th = lut_as_thresholds(stage)
            if th is not None and prefer_thresholds(stage, th):
                kind, stage = "threshold", th
            else:
                kind = "lut"
        elif isinstance(stage, ThresholdStage):
            kind = "threshold"
        else:
            kind = "requant"
            if stage.hi - stage.lo < 256:
                th = requant_as_thresholds(stage, lo, hi, channels)
                if th is not None and threshold_is_cheaper(
                        stage, th, IntType.for_range(lo, hi).bits, channels):
                    kind, stage = "threshold", th
        if runs and runs[-1][0] == kind and kind != "lut":
            runs[-1][1].append(stage)
        else:
            runs.append((kind, [stage]))
        lo, hi = stage.lo, stage.hi
    return runs


def _fits(inner: IntType, outer: IntType) -> bool:
    return outer.lo <= inner.lo and inner.hi <= outer.hi


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


class Builder:
    """Appends stages and invents net names."""

    def __init__(self, logic_memories=(), ice40_dsps=0, spram_memories=(),
                 ecp5_dsp_registers=False, block_memories=(), bram_registers=False,
                 adder_levels=CMVM_ADDER_LEVELS):
        self.stages: list[Stage] = []
        self.logic = frozenset(logic_memories)      # "stage/memory" in soft logic
        self.block = frozenset(block_memories)      # "stage/w_mem" in block RAM
        self.ice40_dsps = int(ice40_dsps)           # SB_MAC16s not yet given to a MatVec
        self.spram = frozenset(spram_memories)      # "stage/w_mem" in SPRAM
        self.ecp5_dsp_registers = bool(ecp5_dsp_registers)
        self.bram_registers = bool(bram_registers)
        self.adder_levels = int(adder_levels)       # between registers of an adder graph
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

    def window(self, name, net, out_type, lanes, size, layer, params) -> str:
        """A ``"window"`` stage; with ``bram_registers``
        (:attr:`Dataflow.bram_registers <onnx2fpga.ir.Dataflow>`) two two-transfer FIFOs
        behind it, their ready from registers: ``{name}_rd``, into which the line buffer's
        read goes with no other consumer, so that the placer can put it beside the block RAM,
        and ``{name}_reg``, a skid buffer beside the consumer. ``{name}_rd`` takes the read
        into its registers with no multiplexer in front (``in_register``; a skid buffer's
        input multiplexer there, behind the window's pad multiplexer, was a MobileNetV1
        build's critical path at 100 MHz: block RAM -> 4.0 ns route -> two LUTs, 11.1 ns).
        (With a one-transfer register as ``{name}_rd``, whose ready follows the next one's,
        that ready ran from ``{name}_reg`` across the die into the window's issue and
        counters: a MobileNetV1 build's critical path, 10.5 ns.)"""
        if self.bram_registers:
            params = {**params, "read_register": True}
        net = self.add("window", name, [net], out_type, lanes, size, layer=layer, params=params)
        if self.bram_registers:
            for reg in ("rd", "reg"):
                net = self.add("fifo", f"{name}_{reg}", [net], out_type, lanes, size,
                               layer=layer, params={"depth": 2, "pipeline": True,
                                                    "in_register": reg == "rd"})
        return net

    def fifo(self, name, net, depth, layer=None, branch=False) -> str:
        """A ``"fifo"`` stage of ``depth`` transfers; with ``bram_registers``, one in block RAM
        (deeper than :data:`~onnx2fpga.plan.plumbing.FLOP_FIFO_DEPTH`) has an output
        register, and on a ``branch`` of a broadcast a skid buffer in front (``{name}_in``),
        so that no path runs from the queue's fill level through the broadcast, placed
        beside its other consumer, and back into the queue's write in one cycle (ResNet-8's
        skip queue: 10.3 ns, 8.3 of it routing across the die and back, at 97.3 MHz)."""
        t, lanes, size = self.nets[net]
        params = {"depth": int(depth)}
        if self.bram_registers and depth > FLOP_FIFO_DEPTH:
            params["out_register"] = True
            if branch:
                net = self.add("fifo", f"{name}_in", [net], t, lanes, size, layer=layer,
                               params={"depth": 2, "pipeline": True})
        return self.add("fifo", name, [net], t, lanes, size, layer=layer, params=params)

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
            if kind != "requant":
                nm = nm.replace("requant", kind, 1)
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


def add_matvec(b: Builder, dense: DenseLayer, net: str, k: int, layer,
                   out_shape, order) -> str:
    """``matvec``, then the requantization of ``layer.requant`` on ``requant_lanes`` lanes
    between converters, back to ``pe`` lanes; with ``"adders"`` multipliers, :func:`add_cmvm`."""
    if dense.multipliers == "adders":
        return add_cmvm(b, dense, net, k, layer, out_shape, order)
    name = f"matvec_{k}"
    arithmetic = matvec_arithmetic(dense)
    # iCE40 DSPs: to the MatVecs in dataflow order whose products all fit the ones left.
    ice40_dsp = False
    dsps = ice40_matvec_dsps(dense.simd, dense.pe, dense.in_type, dense.weight_type)
    if dense.multipliers == "dsp" and arithmetic == "multiply" and 0 < dsps <= b.ice40_dsps:
        ice40_dsp = True
        b.ice40_dsps -= dsps
    dsp_register = (b.ecp5_dsp_registers and dense.multipliers == "dsp"
                    and arithmetic == "multiply"
                    and ecp5_dsp_product(dense.in_type, dense.weight_type))
    net = b.add("matvec", name, [net], dense.acc_type, dense.pe, dense.out_features
                * (layer.out_size // dense.out_features), layer=layer,
                params={"layer": dense, "arithmetic": arithmetic,
                        "w_logic": f"{name}/w_mem" in b.logic,
                        "w_block": f"{name}/w_mem" in b.block,
                        "x_logic": f"{name}/x_mem" in b.logic, "ice40_dsp": ice40_dsp,
                        "w_spram": f"{name}/w_mem" in b.spram, "dsp_register": dsp_register})
    if not layer.requant:
        return net
    d = requant_lanes(dense)
    net = b.lanes(net, d, f"serialize_{k}")
    net = b.requant(net, layer.requant, out_shape, order, f"requant_{k}", layer)
    return b.lanes(net, dense.pe, f"deserialize_{k}")


def add_cmvm(b: Builder, dense: DenseLayer, net: str, k: int, layer, out_shape, order) -> str:
    """``cmvm``: the whole matrix as one adder graph, a vector per cycle (``dense.simd`` and
    ``dense.pe`` the whole matrix), ``layer.requant`` folded in where
    :func:`~onnx2fpga.plan.cmvm_requant.layer_graph` finds a form, else a ``requant`` stage
    of ``pe`` lanes behind it (``out_shape``, ``order`` as :func:`add_matvec`'s)."""
    graph, fused = cached_layer_graph(dense.weight, dense.bias, dense.in_type.lo,
                                      dense.in_type.hi, dense.in_zero_point, layer.requant)
    out_type = layer.requant[-1].out_type if fused is not None else dense.acc_type
    n = dense.out_features
    net = b.add("cmvm", f"cmvm_{k}", [net], out_type, n, n * (layer.out_size // n),
                layer=layer, params={"layer": dense, "graph": graph, "fused": fused,
                                     "levels_per_stage": b.adder_levels})
    if fused is None and layer.requant:
        net = b.requant(net, layer.requant, out_shape, order, f"requant_{k}", layer)
    return net


def window_params(layer, pad_value: int, *, kernel=None, stride=(1, 1),
                   dilation=(1, 1)) -> dict:
    c, h, w = image_shape(layer.in_shape)
    return {"channels": c, "height": h, "width": w,
            "kernel": tuple(kernel or layer.kernel),
            "stride": tuple(getattr(layer, "stride", stride)),
            "dilation": tuple(getattr(layer, "dilation", dilation)),
            "pads": tuple(layer.pads), "pad_value": int(pad_value)}


def finish_layer(b: Builder, net: str, out_net: str) -> str:
    """Rename the last net of a layer to the layer's output net (a wire)."""
    if net == out_net:
        return net
    # The producing stage is the last one appended: point it at out_net.
    stage = b.stages[-1]
    assert stage.outputs == (net,), "internal: the last stage must produce the layer's net"
    b.stages[-1] = Stage(**{**stage.__dict__, "outputs": (out_net,)})
    b.nets[out_net] = b.nets.pop(net)
    return out_net
