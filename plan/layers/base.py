"""What every layer kind tells the planner: the base class of the kinds in :mod:`.`.

A kind holds what is specific to one IR layer dataclass (:mod:`onnx2fpga.ir.layers`): its
checks, the stream orders it takes and gives, the cores it becomes
(:class:`~onnx2fpga.plan.builder.Builder` stages), its foldings, when its output can leave
(for FIFO depths), and its manifest fields. :func:`onnx2fpga.plan.layers.kind_of` finds the kind
of a layer; nothing else dispatches on the layer's type.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ...errors import OptionError
from ...ir.layers import image_shape
from ...ir.stages import LutStage, ThresholdStage
from ..builder import Builder, hwc_order
from ..window import WindowGeometry

__all__ = ["LayerKind", "check_positive", "check_adders", "divisors", "window_cycles_of",
           "window_need", "stage_json"]


def check_positive(what: str, value) -> None:
    """``value`` is a positive integer, or ``ValueError`` naming ``what``."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{what} must be a positive integer, not {value!r}")


def check_adders(layer, inputs: int, outputs: int) -> None:
    """A layer whose products are ``"adders"`` (one adder graph, a vector per cycle) takes
    its whole matrix at once: ``simd == inputs`` and ``pe == outputs``, or ``ValueError``."""
    if layer.multipliers == "adders" and (layer.simd, layer.pe) != (inputs, outputs):
        raise ValueError(f"Layer {layer.name!r}: multipliers 'adders' compute the whole "
                         f"matrix per cycle: simd={inputs} and pe={outputs}, not "
                         f"simd={layer.simd} and pe={layer.pe}")


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


@lru_cache(maxsize=4096)
def _window_cycles(c, h, w, kernel, stride, dilation, pads, lanes) -> int:
    g = WindowGeometry.make(c, h, w, kernel, stride, dilation, pads, lanes)
    return max(g.cycles, g.in_beats, g.out_beats)


def window_cycles_of(layer, lanes: int, kernel=None) -> int:
    """Cycles per inference of the sliding window a windowed ``layer`` (or a pad, as a 1x1
    window with ``kernel=(1, 1)``) needs at ``lanes`` lanes, its transfers included."""
    c, h, w = image_shape(layer.in_shape)
    return _window_cycles(c, h, w, tuple(kernel or layer.kernel),
                          tuple(getattr(layer, "stride", (1, 1))),
                          tuple(getattr(layer, "dilation", (1, 1))), tuple(layer.pads), lanes)


def window_need(layer, out_channels: int, kernel, stride, dilation, pads) -> np.ndarray:
    """Input elements a windowed layer has taken (whole rows: the window core releases an
    output row once the last input row it reads is complete) before output element ``k``
    can leave, for every ``k`` of one inference in channels-last order."""
    c, h, w = image_shape(layer.in_shape)
    g = WindowGeometry.make(c, h, w, kernel, stride, dilation, pads, 1)
    rows = np.array([max(g.row_span(oh)[1], 1) for oh in range(g.out_height)], np.int64)
    per_row = g.out_width * out_channels
    return np.repeat(rows * w * c, per_row)


def stage_json(st) -> dict:
    """The manifest's summary of one requantization, threshold or table stage."""
    if isinstance(st, LutStage):
        return {"table": int(st.table.shape[1]), "per_channel": st.per_element,
                "in_lo": st.in_lo, "clip": [st.lo, st.hi]}
    if isinstance(st, ThresholdStage):
        return {"thresholds": int(st.thresholds.shape[1]), "per_channel": st.per_element,
                "base": st.base, "step": st.step, "clip": [st.lo, st.hi]}
    return {"shift": st.shift,
            "multiplier_bits": int(max(int(np.abs(st.multiplier).max()), 1)).bit_length(),
            "per_channel": bool(st.per_element), "zero_point": st.zero_point,
            "clip": [st.lo, st.hi], "rounding": st.rounding,
            "leaky": st.neg_multiplier is not None}


class LayerKind:
    """The planner's knowledge of one layer kind; subclasses override what differs.

    Attributes
    ----------
    layer_type : type
        The IR dataclass of the kind.
    is_view : bool
        A view (reshape, transpose) changes only the stream order: no core, no lanes.
    """
    layer_type: type = None
    is_view = False

    def check(self, layer) -> None:
        """Raise ``ValueError`` if the layer's folding cannot be built (lanes that do not
        divide what they split)."""
        check_positive(f"Lanes of layer {layer.name!r}", layer.lanes)

    def check_image_lanes(self, layer) -> None:
        """The lanes of an image layer divide its input channels."""
        c = image_shape(layer.in_shape)[0]
        if c % layer.lanes:
            raise ValueError(f"Lanes of layer {layer.name!r} must divide its {c} input "
                             f"channels, not {layer.lanes}")

    def check_size_lanes(self, layer) -> None:
        """The lanes of an elementwise layer divide its size."""
        if layer.out_size % layer.lanes:
            raise ValueError(f"Lanes of layer {layer.name!r} must divide its size "
                             f"{layer.out_size}, not {layer.lanes}")

    def required_order(self, layer, k: int):
        """The stream order input ``k`` must arrive in: an array, ``None`` (C order),
        ``"any"`` (whatever the tensor has) or ``"first"`` (the order of input 0)."""
        return hwc_order(layer.in_shapes[k])

    def output_order(self, layer, in_orders):
        """The stream order of the output, given the orders the inputs arrive in."""
        return hwc_order(layer.out_shape)

    def stages(self, b: Builder, layer, ins: list[str], orders: list, k: int,
               out_net: str) -> str:
        """Append the layer's cores to ``b``, from the (adapted) input nets ``ins`` in
        ``orders`` to ``out_net``; ``k`` numbers the stage names. Returns the output net."""
        raise NotImplementedError

    def options(self, layer) -> list[tuple[int, int, dict]]:
        """The foldings of ``layer``: ``(cycles, cost, params)``, where ``params`` are the
        attributes to set (``simd``/``pe``/``lanes``) and ``cost`` counts multiply lanes."""
        raise NotImplementedError

    def full_folding(self, layer) -> dict:
        """The folding that takes the layer's whole matrix per cycle (for ``"adders"``
        multipliers); none for kinds without a matrix."""
        return {}

    def set_folding(self, layer, params: dict) -> None:
        """Apply a user's folding override ``params`` (``simd``, ``pe``, ``lanes``), or raise
        ``OptionError`` for a value none of :meth:`options` has."""
        allowed = {p for _, _, opts in self.options(layer) for p in opts.items()}
        for key, value in params.items():
            values = sorted({v for k, v in allowed if k == key})
            if not values:
                takes = sorted({k for k, _ in allowed})
                raise OptionError(f"Layer {layer.name!r} ({layer.kind}) takes "
                                  f"{' and '.join(takes) or 'no folding'}, not {key}")
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
                    (key, int(value)) not in allowed:
                raise OptionError(f"Layer {layer.name!r}: {key}={value} is not a valid "
                                  f"folding (possible: {values})")
            setattr(layer, key, int(value))

    def need(self, layer) -> list[np.ndarray]:
        """For each input: ``need[k]``, the input elements (stream order) the layer must
        have taken before its output element ``k`` (stream order) can leave."""
        raise NotImplementedError

    def row_delay(self, layer) -> int:
        """Input elements that arrive, at the pipeline's rate, while the layer emits one
        output row (0 for layers that do not work row by row)."""
        return 0

    def requant_stages(self, layer) -> list:
        """The layer's elementwise epilogue, in order."""
        return list(getattr(layer, "requant", []))

    def weight_bits(self, layer) -> int:
        """Bits of memory the layer's weights take at least
        (:func:`~onnx2fpga.plan.checks.weight_rom_bits`); 0 for a layer without weights."""
        return 0

    def manifest(self, layer) -> dict:
        """The fields of the layer's manifest entry beyond the common ones."""
        return {"in_lanes": layer.in_lanes, "out_lanes": layer.out_lanes,
                "requant": [stage_json(st) for st in self.requant_stages(layer)]}
