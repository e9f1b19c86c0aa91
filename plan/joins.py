"""Cycle model of the join cores (:mod:`onnx2fpga.hw.joins`: broadcast, add, concat), in the
conventions of :mod:`onnx2fpga.plan.cost`.
"""

from __future__ import annotations

import numpy as np

from .checks import check_count
from .stage import CoreKind, Stage, spaced

__all__ = [
    "BROADCAST_LATENCY", "ADD_LATENCY", "CONCAT_LATENCY", "broadcast_cycles",
    "broadcast_latency", "add_cycles", "add_latency", "concat_cycles", "concat_latency",
    "ForkTiming", "AddTiming",
]


#: Cycles from an input transfer to the output transfers of the same data, no output stalled.
BROADCAST_LATENCY = 1


#: Cycles from an input transfer (both inputs take part in the same cycle) to its output.
ADD_LATENCY = 3


#: Cycles from an input transfer of any input to its output transfer.
CONCAT_LATENCY = 1


def check_chunks(chunks) -> tuple[int, ...]:
    if not isinstance(chunks, (list, tuple)):
        raise TypeError(f"Chunks must be a list of integers, not {chunks!r}")
    if len(chunks) < 2:
        raise ValueError(f"Chunks must have at least 2 entries, not {chunks!r}")
    return tuple(check_count(f"Chunk {k}", c) for k, c in enumerate(chunks))


def broadcast_cycles(transfers: int) -> int:
    """Steady-state cycles per tensor of ``transfers`` transfers through a
    :class:`BroadcastCore`: ``transfers`` (one per cycle when every output is ready).

    Raises
    ------
    TypeError, ValueError
        If ``transfers`` is not a positive integer.
    """
    return check_count("Transfers", transfers)


def broadcast_latency(transfers: int = 1) -> int:
    """Cycles from the first input transfer to the last output transfer of a tensor of
    ``transfers`` transfers: ``transfers - 1 + BROADCAST_LATENCY``, the same on every output.

    Raises
    ------
    TypeError, ValueError
        If ``transfers`` is not a positive integer.
    """
    return check_count("Transfers", transfers) - 1 + BROADCAST_LATENCY


def add_cycles(transfers: int) -> int:
    """Steady-state cycles per tensor of ``transfers`` transfers (on each input) through an
    :class:`AddCore`: ``transfers``.

    Raises
    ------
    TypeError, ValueError
        If ``transfers`` is not a positive integer.
    """
    return check_count("Transfers", transfers)


def add_latency(transfers: int = 1) -> int:
    """Cycles from the first input transfer to the last output transfer of a tensor of
    ``transfers`` transfers: ``transfers - 1 + ADD_LATENCY``.

    Raises
    ------
    TypeError, ValueError
        If ``transfers`` is not a positive integer.
    """
    return check_count("Transfers", transfers) - 1 + ADD_LATENCY


def concat_cycles(chunks, rounds: int = 1) -> int:
    """Steady-state cycles of ``rounds`` rounds through a :class:`ConcatCore`:
    ``rounds * sum(chunks)``, one output transfer per cycle (a round is ``chunks[k]`` transfers
    from every input ``k`` in turn: one pixel of a channel concatenation, or a whole tensor
    of a concatenation of vectors).

    Raises
    ------
    TypeError, ValueError
        If ``chunks`` is not a list of at least two positive integers or ``rounds`` is not a
        positive integer.
    """
    chunks = check_chunks(chunks)
    return check_count("Rounds", rounds) * sum(chunks)


def concat_latency(chunks, rounds: int = 1) -> int:
    """Cycles from the first input transfer (of input 0) to the last output transfer of
    ``rounds`` rounds: ``rounds * sum(chunks) - 1 + CONCAT_LATENCY``, with every input valid in
    every cycle (each input is then taken only in its turn) and the output never stalled.

    Raises
    ------
    TypeError, ValueError
        As :func:`concat_cycles`.
    """
    return concat_cycles(chunks, rounds) - 1 + CONCAT_LATENCY


class ForkTiming(CoreKind):
    """A broadcast or a concat: one register through."""
    kinds = ("broadcast", "concat")

    def inputs_timing(self, stage: Stage, ins: list) -> tuple[int, int]:
        first, last = super().inputs_timing(stage, ins)
        # A concat starts with its first input's first chunk.
        return (ins[0][0] if stage.kind == "concat" else first), last

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        return first + 1, last + 1

    def trace(self, stage: Stage, ins: list) -> np.ndarray:
        if stage.kind == "broadcast" and len(ins[0]) == stage.out_beats:
            return ins[0] + BROADCAST_LATENCY
        chunks = stage.params.get("chunks")
        if stage.kind == "concat" and chunks and len(chunks) == len(ins):
            # Round r takes chunks[k] transfers from input k in turn.
            rounds = {len(t) // c for t, c in zip(ins, chunks)}
            if len(rounds) == 1 and sum(len(t) for t in ins) == stage.out_beats:
                n = rounds.pop()
                parts = [t.reshape(n, c) for t, c in zip(ins, chunks)]
                return spaced(np.concatenate(parts, axis=1).reshape(-1) + CONCAT_LATENCY)
        return super().trace(stage, ins)


class AddTiming(CoreKind):
    """An add: :data:`ADD_LATENCY` cycles through."""
    kinds = ("add",)

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        return first + ADD_LATENCY, last + ADD_LATENCY

    def trace(self, stage: Stage, ins: list) -> np.ndarray:
        """Each output transfer :data:`ADD_LATENCY` cycles after the later of its inputs'."""
        if len({len(t) for t in ins}) != 1 or len(ins[0]) != stage.out_beats:
            return super().trace(stage, ins)
        return spaced(np.maximum.reduce(ins) + ADD_LATENCY)
