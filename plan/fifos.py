"""FIFO depths between layers, from the cycle model: each queue holds what its producer has
written and its consumer not yet taken when both run as :func:`onnx2fpga.plan.cost.plan_traces`
says.

Layers of different paces throttle each other through shallow queues: a depthwise layer that
emits its rows in bursts, then a pointwise one whose matrix unit takes a pixel and computes on
it for a while. With the queue deep enough for the burst, neither waits for the other and the
hardware runs at the modelled rate and latency: a DS-CNN of 32 channels and two blocks ran at
18,250 cycles per inference and 22,959 latency in Verilator with 2-deep queues against the
model's 18,000 and 22,692, and at the model's figures with queues of 11 before its pointwise
layers.

For the queue after a layer (``Dataflow.fifo_depths``) and on a fork's branch
(``Dataflow.edge_fifos``): the producer's output trace (the cycle of every transfer written
into the queue) against the cycles at which its readers take each transfer, as early as they
can (:meth:`~onnx2fpga.plan.stage.CoreKind.takes`) and as late as they may without delaying
their own output (:meth:`~onnx2fpga.plan.stage.CoreKind.deadlines`), through casts, width
converters and forks to the next queue (the output port takes every transfer as it comes).
The producer is held back as long as that delays no transfer past its reader's latest take
(:func:`latest_writes`), the reader takes each as soon as it can after that; for two
inferences, the second one initiation interval after the first. The largest number held
(:func:`fifo_occupancy`) is the depth, at least :data:`MIN_DEPTH`; above :data:`SMALL_DEPTH`,
plus :data:`MARGIN`, at most :data:`MAX_DEPTH`. The model errs on the deep side: a producer
held back is assumed never to catch up.

A layer's own queue is left out (depth 0) where the shallowest one would do and its producer's
output is a skid register (:attr:`~onnx2fpga.plan.stage.CoreKind.skid_out`): an adder graph's
whole output vector would otherwise pass through two more registers of its width (the UNSW-NB15
MLP at one cycle per inference: 1,024 flip-flops after its first layer, whose load enable, the
first graph's valid through the queue to all of them, was its critical path at 91.9 MHz on an
ECP5).
"""

from __future__ import annotations

import numpy as np

from ..ir.dataflow import Dataflow
from .builder import Plan
from .cores import core_kind
from .cost import plan_traces, stage_cycles
from .layers import kind_of
from .plumbing import FLOP_FIFO_DEPTH, fifo_latency
from .stage import spaced, spaced_before

__all__ = ["MIN_DEPTH", "SMALL_DEPTH", "MARGIN", "MAX_DEPTH", "fifo_occupancy", "latest_writes",
           "fifo_depths", "fifo_bits"]

#: The shallowest queue, the depth every layer had before: a 2-deep
#: :class:`~onnx2fpga.hw.plumbing.StreamFIFO` passes one transfer per cycle in flip-flops with
#: its ``ready`` registered (a 1-deep one passes its reader's ``ready`` through).
MIN_DEPTH = 2

#: The deepest queue of flip-flops (1 cycle through, :func:`~onnx2fpga.plan.plumbing.fifo_latency`):
#: an occupancy up to it is the depth.
SMALL_DEPTH = FLOP_FIFO_DEPTH

#: Transfers added to a larger occupancy: a queue deeper than :data:`SMALL_DEPTH` takes a cycle
#: longer through (memory), which the model's traces, computed with 2-deep queues, do not
#: count.
MARGIN = 2

#: The deepest queue sized from the model: 1024 transfers (a few 18-kbit block RAMs at the
#: usual widths). Where the model asks for more, the design may run slower than the model.
MAX_DEPTH = 1024


def fifo_occupancy(written: np.ndarray, taken: np.ndarray) -> int:
    """The most transfers a queue holds when transfer ``k`` is written at cycle ``written[k]``
    and taken out at ``taken[k]`` (both increasing), counting the one being written: the
    depth a :class:`~onnx2fpga.hw.plumbing.StreamFIFO` needs (it takes a write only while it
    is not full, whatever is read in the same cycle) so that no write waits.

    ``max_k (k + 1 - #{j : taken[j] < written[k]})``; 0 for no transfers.

    Raises
    ------
    ValueError
        If the arrays differ in length or a transfer is taken before it is written.
    """
    written = np.asarray(written, dtype=np.int64)
    taken = np.asarray(taken, dtype=np.int64)
    if written.shape != taken.shape or written.ndim != 1:
        raise ValueError(f"Written and taken cycles must be two arrays of one length, not "
                         f"shapes {written.shape} and {taken.shape}")
    if not len(written):
        return 0
    if (taken < written).any():
        k = int(np.argmax(taken < written))
        raise ValueError(f"Transfer {k} is taken at cycle {int(taken[k])}, before it is "
                         f"written at {int(written[k])}")
    k = np.arange(len(written), dtype=np.int64)
    return int((k + 1 - np.searchsorted(taken, written, side="left")).max())


def latest_writes(written: np.ndarray, taken: np.ndarray, latency: int) -> np.ndarray:
    """When a producer that would write transfer ``k`` at ``written[k]`` writes it when held
    back by a full queue, as late as it can without delaying any transfer its reader takes
    at ``taken`` (``latency`` cycles through the queue): ``written[k] + min over j >= k of
    (taken[j] - latency - written[j])``, at least ``written[k]``. A producer held back is
    assumed never to catch up (its gaps between transfers do not shrink): a producer faster
    than its reader needs no room for what it would run ahead, only for its bursts."""
    written = np.asarray(written, dtype=np.int64)
    slack = np.asarray(taken, dtype=np.int64) - latency - written
    return written + np.maximum(np.minimum.accumulate(slack[::-1])[::-1], 0)


_NEVER = np.iinfo(np.int64).min // 4


def _taken(net: str, traces: dict, readers: dict, memo: dict) -> tuple:
    """``(earliest, latest)``: the cycles at which every transfer of ``net`` is taken by its
    readers in the model of one inference, and the latest at which they could be without
    delaying any output: each reader's :meth:`~onnx2fpga.plan.stage.CoreKind.takes` and
    :meth:`~onnx2fpga.plan.stage.CoreKind.deadlines` given the same of its own output, back
    to the next queue (which takes as offered: it is sized on its own) or the output port
    (never stalled)."""
    if net in memo:
        return memo[net]
    offered = traces[net]
    early, late = offered, None
    for stage, j in readers.get(net, []):
        if stage.kind == "fifo" and not stage.params.get("pipeline"):
            e, d = offered, offered
        else:
            after = [_taken(o, traces, readers, memo) for o in stage.outputs]
            if stage.kind == "broadcast":
                e = np.maximum.reduce([a[0] for a in after])
                d = np.minimum.reduce([a[1] for a in after])
            elif stage.kind == "cast":
                e, d = after[0]
            elif stage.kind == "convert" and stage.out_lanes > stage.in_lanes:
                # Gathering k transfers into one word (out 1 cycle after its last piece): the
                # next word gathers while the previous one waits in the output register.
                k = stage.out_lanes // stage.in_lanes
                e = np.repeat(np.concatenate([[_NEVER], after[0][0][:-1]]), k)
                d = (np.repeat(after[0][1] - 1, k) - np.tile(np.arange(k)[::-1], len(after[0][1])))
            elif stage.kind == "convert" and stage.out_lanes < stage.in_lanes:
                # Splitting one word into k pieces (piece i out i + 1 cycles after it): the
                # next word once the previous one's last piece has left.
                k = stage.in_lanes // stage.out_lanes
                e = np.concatenate([[_NEVER], after[0][0][k - 1:-1:k]])
                d = (after[0][1].reshape(-1, k) - 1 - np.arange(k)[None, :]).min(axis=1)
            else:
                kind = core_kind(stage)
                ins = [traces[n] for n in stage.inputs]
                one = len(after) == 1
                e = kind.takes(stage, ins, after[0][0] if one else None)[j]
                d = kind.deadlines(stage, ins, after[0][1] if one else None)[j]
        early = np.maximum(early, e)
        late = d if late is None else np.minimum(late, d)
    early = spaced(early)
    late = early if late is None else np.maximum(spaced_before(late), early)
    memo[net] = early, late
    return memo[net]


def fifo_depths(dataflow: Dataflow, plan: Plan, *, cycles: int | None = None,
                margin: int = MARGIN, cap: int = MAX_DEPTH) -> tuple[list, dict]:
    """Depths of the queues of ``plan`` (the core graph of ``dataflow`` with its current
    queues) from its traces, see the module docstring.

    Parameters
    ----------
    cycles : int, optional
        The initiation interval: the second inference is offered this many cycles after the
        first (default: the design's cycles per inference).
    margin, cap : int
        Added to an occupancy above :data:`MIN_DEPTH`; the largest depth.

    Returns
    -------
    (list of int, dict)
        The depth after every layer (as ``dataflow.fifo_depths`` where it has none, and for a
        view) and ``"tensor->layer"`` -> the depth of each of ``dataflow.edge_fifos``.
    """
    in_beats = dataflow.input.beats
    if cycles is None:
        cycles = max([in_beats, dataflow.output.beats]
                     + [stage_cycles(s) for s in plan.stages])
    # Each core's model is of one inference: the second's transfers are the first's one
    # initiation interval later, after the first's on every stream. A producer held back in
    # one inference is not in the next: it starts each on its own input.
    traces = plan_traces(plan, in_beats)
    readers: dict = {}
    for stage in plan.stages:
        for j, n in enumerate(stage.inputs):
            readers.setdefault(n, []).append((stage, j))
    queues = {s.outputs[0]: s for s in plan.stages
              if s.kind == "fifo" and not s.params.get("pipeline")}
    memo: dict = {}

    def twice(t):
        return spaced(np.concatenate([t, t + cycles]))

    def depth(net):
        queue = queues[net]
        early, late = _taken(net, traces, readers, memo)
        lat = fifo_latency(queue.params["depth"], queue.params.get("out_register", False))
        written = latest_writes(traces[queue.inputs[0]], late, lat)
        taken = spaced(np.maximum(early, written + lat))
        held = fifo_occupancy(twice(written), twice(taken))
        if held <= SMALL_DEPTH:
            return max(held, MIN_DEPTH)
        return min(held + margin, cap)

    producers = {o: s for s in plan.stages for o in s.outputs}

    def own_depth(net):
        """A layer's own queue: none behind a skid register where the shallowest would do."""
        d = depth(net)
        skid = core_kind(producers[queues[net].inputs[0]]).skid_out
        return 0 if d == MIN_DEPTH and skid else d

    after = []
    for k, layer in enumerate(dataflow.layers):
        net = plan.tensor_nets.get(layer.output)
        own = dataflow.fifo_depths[k] and not kind_of(layer).is_view and net in queues
        after.append(own_depth(net) if own else dataflow.fifo_depths[k])
    labels = {dataflow.input.name: "in"}
    labels.update({ly.output: str(k) for k, ly in enumerate(dataflow.layers)})
    edges = {}
    for key, old in dataflow.edge_fifos.items():
        tensor, consumer = key.split("->")
        name = f"fifo_{labels[tensor]}_{consumer}"
        stage = next((s for s in plan.stages if s.name == name), None)
        edges[key] = old if stage is None else max(old, depth(stage.outputs[0]))
    return after, edges


def fifo_bits(plan: Plan) -> int:
    """Bits of storage of every queue of ``plan``: depth times the transfer's width."""
    return sum(s.params["depth"] * s.out_lanes * s.out_type.bits
               for s in plan.stages if s.kind == "fifo")
