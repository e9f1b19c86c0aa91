"""Cycle figures of the generated hardware, as the cores in :mod:`onnx2fpga.hw.cores` behave.

Conventions: a *latency* is the difference between the clock cycle of the last output transfer
and the cycle of the first input transfer of one vector, with the input arriving at one
transfer per cycle, ``ready`` high downstream and the core idle before. *Cycles* (per vector
or per inference) is the steady-state initiation interval: the number of cycles between the
starts of consecutive vectors when inputs come as fast as the core takes them and the output
never stalls.

The per-core formulas:

- :class:`~onnx2fpga.hw.cores.MatVecCore`: ``folds = in_features // simd``,
  ``groups = out_features // pe``; cycles ``folds * groups``; latency
  ``folds + folds * groups + 3`` (computing starts the cycle after the last input transfer;
  one (group, fold) step per cycle; memory read, multiply, adder tree and accumulate add 4).
- :class:`~onnx2fpga.hw.cores.RequantCore` with ``n`` stages: one transfer per cycle; an
  element leaves ``1 + 3 * n`` cycles after it enters.
- :class:`~onnx2fpga.hw.cores.StreamFIFO`: 1 cycle through (depth up to 4), 2 (deeper).
- :class:`~onnx2fpga.hw.cores.WidthConverter`: gathering ``k`` transfers: 1 cycle after the
  last; splitting into ``k``: the last piece ``k`` cycles after the input transfer.
"""

from __future__ import annotations

from ..dataflow import Dataflow, DenseLayer, RequantLayer

__all__ = [
    "matvec_latency", "requant_latency", "fifo_latency", "layer_cycles", "layer_latency",
    "dataflow_cycles",
]


def matvec_latency(folds: int, groups: int) -> int:
    """Latency of a :class:`~onnx2fpga.hw.cores.MatVecCore` with ``folds`` input transfers and
    ``groups`` output transfers per vector: ``folds + folds * groups + 3``."""
    return folds + folds * groups + 3


def requant_latency(stages: int) -> int:
    """Latency of a :class:`~onnx2fpga.hw.cores.RequantCore` of ``stages`` stages
    (``1 + 3 * stages``; 0 for no stage, when no core is built)."""
    return 1 + 3 * stages if stages else 0


def fifo_latency(depth: int) -> int:
    """Cycles from a write into a :class:`~onnx2fpga.hw.cores.StreamFIFO` of ``depth`` to the
    earliest read (0 for depth 0, which is a plain connection)."""
    if depth <= 0:
        return 0
    return 1 if depth <= 4 else 2


def _check_layer(layer):
    if not isinstance(layer, (DenseLayer, RequantLayer)):
        raise TypeError(f"Layer must be a DenseLayer or a RequantLayer, not {layer!r}")


def layer_cycles(layer) -> int:
    """Steady-state cycles per vector of ``layer``'s cores.

    ``(in_features // simd) * (out_features // pe)`` for a DenseLayer (its requantization runs
    alongside at one transfer per cycle); ``channels // lanes`` for a RequantLayer.
    """
    _check_layer(layer)
    if isinstance(layer, DenseLayer):
        return (layer.in_features // layer.simd) * (layer.out_features // layer.pe)
    return layer.channels // layer.lanes


def layer_latency(layer) -> int:
    """Cycles from the first input transfer to the last output transfer of one vector.

    The input is assumed to arrive at one transfer per cycle and the output never to stall.
    DenseLayer with ``folds = in_features // simd``, ``groups = out_features // pe`` and
    ``n = len(requant)``: ``folds + folds * groups + 3`` without requantization; with it,
    plus ``1 + 3 * n``, plus, when the requantization core has ``d < pe`` lanes (see
    :func:`onnx2fpga.hw.chain.requant_lanes`), ``pe // d`` (serializing) ``+ 1`` (gathering).
    RequantLayer: ``channels // lanes - 1 + 1 + 3 * n``.
    """
    _check_layer(layer)
    from .chain import layer_stages

    first, last = 0, layer.in_size // layer.in_lanes - 1
    for stage in layer_stages(layer):
        first, last = _stage_timing(stage, first, last)
    return last


def _stage_timing(stage, first: int, last: int) -> tuple[int, int]:
    """Cycles of the first and last output transfer of ``stage`` given those of its input."""
    if stage.kind == "matvec":
        layer = stage.layer
        folds = layer.in_features // layer.simd
        groups = layer.out_features // layer.pe
        first_out, last_out = last + folds + 4, last + folds * groups + 4
    elif stage.kind == "requant":
        d = requant_latency(len(stage.params["stages"]))
        first_out, last_out = first + d, last + d
    elif stage.kind == "fifo":
        d = fifo_latency(stage.params["depth"])
        first_out, last_out = first + d, last + d
    elif stage.kind == "convert":
        if stage.out_lanes > stage.in_lanes:
            k = stage.out_lanes // stage.in_lanes
            first_out, last_out = first + k, last + 1
        elif stage.out_lanes < stage.in_lanes:
            k = stage.in_lanes // stage.out_lanes
            first_out, last_out = first + 1, last + k
        else:
            first_out, last_out = first, last
    else:                                   # "cast": wires
        first_out, last_out = first, last
    # A stream carries at most one transfer per cycle.
    return first_out, max(last_out, first_out + stage.out_beats - 1)


def dataflow_cycles(dataflow: Dataflow) -> dict:
    """Cycle figures of the whole accelerator, for the manifest.

    Returns
    -------
    dict
        ``cycles_per_inference``: steady-state cycles between consecutive inferences, the
        maximum of every layer's :func:`layer_cycles` and of the input and output port
        transfer counts (``beats``). ``latency_cycles``: cycles from the first ``s_axis``
        transfer of an input tensor to the last ``m_axis`` transfer (``tlast``) of its output
        tensor, for an idle accelerator fed at one transfer per cycle with ``m_axis_tready``
        high. It is exact where no core throttles its upstream (a splitting width converter
        slower than its producer makes it approximate). ``layers``: per layer, ``name``,
        ``cycles`` and ``latency``.

    Raises
    ------
    TypeError, ValueError
        As :func:`onnx2fpga.hw.chain.plan_chain`.
    """
    from .chain import plan_chain

    chain = plan_chain(dataflow)
    cycles = max([dataflow.input.beats, dataflow.output.beats]
                 + [layer_cycles(layer) for layer in dataflow.layers])
    first, last = 0, dataflow.input.beats - 1
    for stage in chain:
        first, last = _stage_timing(stage, first, last)
    return {
        "cycles_per_inference": int(cycles),
        "latency_cycles": int(last),
        "layers": [{"name": layer.name, "cycles": layer_cycles(layer),
                    "latency": layer_latency(layer)} for layer in dataflow.layers],
    }
