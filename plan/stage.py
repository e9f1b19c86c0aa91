"""A stage of the core graph (one core) and the base class of the cores' cycle models."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

import numpy as np

from ..ir.types import IntType

__all__ = ["Stage", "CoreKind", "value_key", "spaced", "spaced_before"]


def value_key(value):
    """A hashable key equal for equal values: numbers, strings, types, lists, tuples, dicts
    and dataclasses (every field) by their contents, arrays by shape, dtype and a digest of
    their bytes. For memoizing the planner's and the estimates' pure functions of stages and
    layers, whose parameters hold arrays. ``TypeError`` for a value of another type."""
    if value is None or isinstance(value, (bool, int, float, str, np.generic, IntType)):
        return value
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        return ("array", a.shape, a.dtype.str,
                hashlib.blake2b(a.view(np.uint8).reshape(-1), digest_size=16).digest())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *map(value_key, value))
    if isinstance(value, dict):
        return ("dict", *((k, value_key(v)) for k, v in sorted(value.items())))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__qualname__,
                *((f.name, value_key(getattr(value, f.name)))
                  for f in dataclasses.fields(value)))
    raise TypeError(f"no key for a {type(value).__name__}")


def spaced(times: np.ndarray) -> np.ndarray:
    """``times`` pushed later where needed so that consecutive transfers are at least one
    cycle apart (a stream carries one transfer per cycle): ``t[k] = max(t[k], t[k-1] + 1)``."""
    k = np.arange(len(times), dtype=np.int64)
    return np.maximum.accumulate(np.asarray(times, dtype=np.int64) - k) + k


def spaced_before(times: np.ndarray) -> np.ndarray:
    """``times`` pulled earlier where needed so that consecutive transfers are at least one
    cycle apart, the last one kept: ``t[k] = min(t[k], t[k+1] - 1)`` (deadlines)."""
    t = np.asarray(times, dtype=np.int64)
    return -spaced(-t[::-1])[::-1]


@dataclass(frozen=True)
class Stage:
    """One core of the accelerator.

    Parameters
    ----------
    kind : str
        ``"matvec"``, ``"requant"``, ``"threshold"``, ``"fifo"``, ``"convert"``, ``"cast"`` (a
        value-preserving change of element type, wires only), ``"window"``, ``"reduce"``,
        ``"depthwise"``, ``"add"``, ``"concat"``, ``"broadcast"``, ``"resize"``,
        ``"reorder"``, ``"lut"``, ``"slice"`` or ``"cmvm"``.
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
        ``dataflow.ice40_dsps``), ``w_spram`` (its weights live in SPRAM, read through the
        core's ``w_read`` port: ``w_mem`` is among ``dataflow.spram_memories``),
        ``dsp_register`` (a register behind its products, ``dataflow.ecp5_dsp_registers``
        and products that take MULT18X18Ds). ``"requant"`` (only
        RequantStages), ``"threshold"`` (only ThresholdStages) and ``"lut"`` (one
        LutStage): ``stages``, ``channels`` (:func:`stage_cores`). ``"fifo"``: ``depth``.
        ``"window"``: ``channels``, ``height``, ``width``, ``kernel``, ``stride``,
        ``dilation``, ``pads``, ``pad_value``. ``"reduce"``: ``op``, ``channels``,
        ``window``. ``"depthwise"``: ``channels``, ``window``, ``weight``, ``bias``.
        ``"add"``: ``zero_points``, ``multipliers``, ``op``. ``"concat"``: ``chunks``.
        ``"broadcast"``: ``outputs``. ``"resize"``: ``channels``, ``height``, ``width``,
        ``rows``, ``cols``. ``"reorder"``: ``order``. ``"slice"``: ``period``, ``start``,
        ``stop`` (in transfers). ``"cmvm"``: ``layer`` (as for ``"matvec"``), ``graph``
        (its :class:`~onnx2fpga.plan.cmvm.AdderGraph`), ``fused`` (the folded
        requantization or None), ``levels_per_stage``.
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


class CoreKind:
    """The cycle model of one kind of core (a :class:`Stage`'s ``kind``), in the conventions
    of :mod:`onnx2fpga.plan.cost`; each lives beside the core's other figures
    (:mod:`onnx2fpga.plan.matvec`, :mod:`.window`, ...) and
    :data:`onnx2fpga.plan.cores.CORE_KINDS` lists them.

    Attributes
    ----------
    kinds : tuple of str
        The stage kinds it models.
    paced : bool
        No inference finishes faster than :meth:`cycles` from its first input (False for
        wires, FIFOs, width converters and reorder buffers, whose output follows their input).
    plumbing : bool
        A lane converter, cast or FIFO: not a layer's own work when its cycles are reported.
    skid_out : bool
        The core's output leaves through a skid register (``ready`` and ``valid`` from
        registers, a transfer its consumer does not take held beside the last one): the
        shallowest queue behind it would add a cycle and two registers of its width but cut
        no path, and :func:`~onnx2fpga.plan.fifos.fifo_depths` leaves it out where the model
        finds the shallowest queue enough.
    """
    kinds: tuple = ()
    paced = True
    plumbing = False
    skid_out = False

    def cycles(self, stage: Stage) -> int:
        """Steady-state cycles per inference (at least the input and output transfers)."""
        return max(stage.in_beats, stage.out_beats)

    def inputs_timing(self, stage: Stage, ins: list) -> tuple[int, int]:
        """The first and last input transfer that matter, from ``(first, last)`` of every
        input: the latest of each by default."""
        return max(t[0] for t in ins), max(t[1] for t in ins)

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        """Cycles of the first and last output transfer given those of the (latest) input,
        before the pacing :func:`onnx2fpga.plan.cost.stage_timing` applies."""
        raise NotImplementedError

    def takes(self, stage: Stage, ins: list, taken=None) -> list:
        """Cycle at which the core takes every transfer of each input (one array per input,
        as ``ins``) when input transfer ``k`` is offered at ``ins[j][k]`` from an unbounded
        queue, in the schedule of :meth:`trace`, and its output transfer ``k`` is taken at
        ``taken[k]`` (``None``: as :meth:`trace` gives it, never stalled).

        By default a pipeline that never holds its input back but for a stalled output: with
        as many transfers out as in, input ``k`` no earlier than its output is held back
        (``taken[k]`` minus the core's delay); otherwise as offered. Cores that fill a buffer
        and wait for room in it (a window's line buffer, a matrix unit's vector buffer)
        override it. :func:`onnx2fpga.plan.fifos.fifo_depths` sizes the queue in front of a
        core from it."""
        ins = [np.asarray(t, dtype=np.int64) for t in ins]
        if taken is None or len(ins) != 1 or len(taken) != len(ins[0]):
            return ins
        out = self.trace(stage, ins)
        return [spaced(np.maximum(ins[0], ins[0] + np.asarray(taken) - out))]

    def deadlines(self, stage: Stage, ins: list, late=None) -> list:
        """The latest cycle at which the core can take every transfer of each input (one
        array per input, as ``ins``) without any output transfer ``k`` leaving after
        ``late[k]`` (``None``: after :meth:`trace`'s cycle), the input offered at ``ins``.

        By default, with as many transfers out as in, input ``k`` as late as its output may
        be (the core's delay kept); otherwise no later than :meth:`takes` (no slack known).
        Cores that take their input well before they use it (a window's rows, a matrix
        unit's vectors) override it."""
        ins = [np.asarray(t, dtype=np.int64) for t in ins]
        if len(ins) != 1 or stage.out_beats != len(ins[0]):
            return self.takes(stage, ins)
        if late is None:
            return ins
        return [spaced_before(ins[0] + np.asarray(late) - self.trace(stage, ins))]

    def trace(self, stage: Stage, ins: list) -> np.ndarray:
        """Cycle of every output transfer of one inference (``stage.out_beats`` increasing
        integers) given the cycle of every transfer of each input (``ins``, one array per
        input), the output never stalled.

        By default from :meth:`timing`: output transfer ``k`` follows the input transfer at the
        same share of the stream by the drain time (last output after last input); a core
        with more cycles than transfers, none before its share of the way from the first
        output to the paced last one. Kinds
        whose output depends on the input's pace in a more particular way (a window's rows, a
        matrix unit's vectors) override it; :func:`onnx2fpga.plan.cost.plan_traces` applies them."""
        first, last = self.inputs_timing(stage, [(int(t[0]), int(t[-1])) for t in ins])
        first_out, drained = self.timing(stage, first, last)
        n = stage.out_beats
        src = max(ins, key=lambda t: int(t[-1]))
        k = np.arange(n, dtype=np.int64)
        idx = ((k + 1) * len(src) + n - 1) // n - 1
        # Following the input by the drain time; a core slower than its streams (more cycles
        # than transfers) no faster than its own pace.
        pace = first_out + k
        if self.paced and self.cycles(stage) > max(stage.in_beats, stage.out_beats):
            last_out = max(drained, first + self.cycles(stage))
            pace = first_out + (k * max(last_out - first_out, 0)) // max(n - 1, 1)
        return spaced(np.maximum(src[idx] + (drained - last), pace))
