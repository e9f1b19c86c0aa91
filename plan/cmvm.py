"""Constant matrix-vector products as adder graphs: ``y = W @ x`` for a constant integer
matrix ``W``, built from additions of shifted inputs only (no multiplier), for layers that
compute a whole vector per cycle.

Every weight is written in canonical signed digits (CSD: digits -1, 0, +1, no two nonzero
digits next to each other; a power of two or zero costs nothing). An output is then a sum of
*terms* ``sign * (x_i << shift)``. Common subexpressions are shared across the outputs of the
layer: the pair of terms that occurs in most outputs (``x_a + x_b << s`` or
``x_a - x_b << s``, also one input against itself shifted, ``x_a + x_a << s``) becomes one
adder, its result a new variable that replaces the pair wherever it occurs, until no pair
occurs twice (a greedy CMVM optimization, as in the Hcub / RAG-n family and da4ml). What is
left of each output is summed by a tree that adds first the terms that are ready first.

:class:`AdderGraph` is the plan: the adders (:class:`Adder`), the value range and width of
every variable, the adder levels, and each output as a variable, a shift and a sign. Its
:meth:`AdderGraph.evaluate` computes ``W @ x`` from the adders alone, which the tests compare
with numpy; :meth:`AdderGraph.schedule` places registers every ``levels_per_stage`` adder
levels and counts the LUTs and flip-flops; :class:`~onnx2fpga.hw.cmvm.ConstMatVecCore` is
built from both.

Plain Python and numpy; deterministic (ties are broken by the variables' numbers), so the
same matrix gives the same graph and the same Verilog.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from ..ir.types import IntType
from .plumbing import FLOP_FIFO_DEPTH, fifo_latency
from .stage import CoreKind, Stage

__all__ = ["CmvmTiming", "cmvm_latency", "cmvm_pipeline", "cmvm_queue_depth",
           "CMVM_ADDER_LEVELS", "MAX_ADDER_LEVELS", "READERS_PER_COPY",
           "csd_digits", "Adder", "pass_through",
           "AdderGraph", "Schedule", "adder_graph", "adder_cost", "finish_stages",
           "signed_digits", "adders_lut_floor", "ADDERS_PER_DIGIT_FLOOR", "cmvm_resources",
           "CMVM_COST", "QUEUE_COST", "queue_resources"]


#: Adder levels between two registers of a :class:`~onnx2fpga.hw.cmvm.ConstMatVecCore`
#: in a design not folded for a board (a board's family and clock set
#: :attr:`Dataflow.adder_levels <onnx2fpga.ir.Dataflow>` from
#: :func:`onnx2fpga.plan.devices.adder_levels`).
CMVM_ADDER_LEVELS = 1

#: Adders that read one register (a copy of it: :attr:`Schedule.copies`). The jet tagger's
#: layers 1-3 at two levels per stage missed 100 MHz on a net from an input register, placed
#: beside the input stream, to its adders across the die (5.2 ns of a 10.2 ns path).
READERS_PER_COPY = 8

#: The most adder levels per register stage a compile accepts (``adder_levels``); a graph
#: no deeper than that has registers only at its ends.
MAX_ADDER_LEVELS = 32


def finish_stages(fused) -> int:
    """Register stages a :class:`~onnx2fpga.hw.cmvm.ConstMatVecCore` adds after its graph
    to finish a folded requantization (:class:`~onnx2fpga.plan.cmvm_requant.FusedRequant`;
    None: none): the rounding's adder (or the threshold comparisons), then the shift and
    clip (or their count)."""
    return 0 if fused is None else 2


def csd_digits(value: int) -> list[tuple[int, int]]:
    """The nonzero canonical signed digits of ``value`` as ``(shift, sign)`` pairs, lowest
    first: ``value == sum(sign << shift)``, no two shifts adjacent, fewest nonzero digits."""
    v, out, shift = int(value), [], 0
    while v:
        if v & 1:
            digit = 2 - (v & 3)         # +1 if v % 4 == 1, -1 if v % 4 == 3
            out.append((shift, digit))
            v -= digit
        v >>= 1
        shift += 1
    return out


def signed_digits(weight) -> int:
    """Nonzero canonical signed digits of all entries of ``weight`` (the weight of the NAF
    of ``|w|`` is the population count of ``3|w| XOR |w|``)."""
    a = np.abs(np.asarray(weight, dtype=np.int64)).reshape(-1)
    x = (3 * a) ^ a
    count = np.zeros_like(x)
    while np.any(x):
        count += x & 1
        x >>= 1
    return int(count.sum())


#: The fewest adders per signed digit the common subexpression search has left on the
#: matrices measured (0.41 on a pruned ternary 784 x 64, 0.61 on the jet tagger's 6-bit
#: 64 x 32), with a margin: what :func:`adders_lut_floor` counts with.
ADDERS_PER_DIGIT_FLOOR = 0.3


def adders_lut_floor(weight, in_bits: int) -> int:
    """A lower bound on the LUTs of the adder graph of ``weight`` on ``in_bits``-bit inputs,
    without building it: :data:`ADDERS_PER_DIGIT_FLOOR` adders per signed digit, each at
    least one bit wider than the inputs. For refusing hopeless plans at once."""
    return int(ADDERS_PER_DIGIT_FLOOR * signed_digits(weight) * (in_bits + 1))


@dataclass(frozen=True)
class Adder:
    """``v = sign_a * (a << shift_a) + sign_b * (b << shift_b)``, ``min(shift_a, shift_b) ==
    0``; ``b == -1`` for a negation ``v = -a``."""
    a: int
    shift_a: int
    sign_a: int
    b: int
    shift_b: int
    sign_b: int


def pass_through(op: Adder) -> int:
    """Low bits of ``op``'s result that are its unshifted operand's bits unchanged: the other
    operand's shift, when the unshifted one is added (not subtracted); else 0."""
    if op.b < 0:
        return 0
    for s_lo, g_lo, s_hi in ((op.shift_a, op.sign_a, op.shift_b),
                             (op.shift_b, op.sign_b, op.shift_a)):
        if s_lo == 0 and g_lo > 0 and s_hi > 0:
            return s_hi
    return 0


def adder_cost(op: Adder, width: int) -> int:
    """LUTs of one adder whose result is ``width`` bits: one per bit (a carry chain), less the
    low bits that come from the unshifted operand unchanged (:func:`pass_through`)."""
    return max(1, width - pass_through(op))


@dataclass
class Schedule:
    """Registers of an :class:`AdderGraph` at ``levels_per_stage`` adder levels per stage.

    ``stage[v]``: the stage whose logic computes variable ``v`` (inputs: 0, the input
    register); ``last_use[v]``: the last stage whose registers hold ``v`` (its own register
    at ``stage[v]``, then one delay register per stage up to ``last_use[v]``); ``depth``: the
    stage of the output registers. ``copies[(v, k)]``: the copies of ``v``'s register at the
    end of stage ``k`` where more than :data:`READERS_PER_COPY` adders read it (one each
    for ``READERS_PER_COPY`` of them in turn, so that no net fans out across the die);
    ``reads[(i, j)]``: the copy that operand ``j`` (0: ``a``, 1: ``b``) of adder ``i``
    reads, for each operand read from a register; ``flip_flops`` counts every register bit
    (input, adder, delay and output registers and the copies), ``luts`` the adders' LUTs."""
    levels_per_stage: int
    stage: list[int]
    last_use: list[int]
    depth: int
    luts: int
    flip_flops: int
    copies: dict = field(default_factory=dict)
    reads: dict = field(default_factory=dict)


@dataclass
class AdderGraph:
    """The adders of ``W @ x`` (see the module docstring).

    Variables ``0 .. n_in - 1`` are the inputs, ``results[k]`` the result of ``adders[k]``.
    ``lo[v], hi[v]``: the value range of variable ``v`` over every input in the ranges given;
    ``level[v]``: adder levels from the inputs. ``outputs[o]`` is ``(v, shift, sign)``:
    output ``o`` equals ``sign * (v << shift)``, or 0 for ``v == -1`` (a zero row).
    ``consts`` maps the variables that are constants (an output's bias, added by its tree)
    to their values: no register holds them.
    """
    n_in: int
    adders: list[Adder] = field(default_factory=list)
    results: list[int] = field(default_factory=list)
    lo: list[int] = field(default_factory=list)
    hi: list[int] = field(default_factory=list)
    level: list[int] = field(default_factory=list)
    outputs: list[tuple[int, int, int]] = field(default_factory=list)
    consts: dict = field(default_factory=dict)

    def __post_init__(self):
        # Each computed variable as a linear form of the inputs, while the graph is built, and
        # the schedules asked for (attributes, not fields: the graph's value is its fields).
        self._forms: dict = {}
        self._schedules: dict = {}

    @property
    def n_out(self) -> int:
        return len(self.outputs)

    def width(self, v: int) -> int:
        """Bits of variable ``v`` (signed if it can be negative)."""
        return IntType.for_range(self.lo[v], self.hi[v]).bits

    @property
    def luts(self) -> int:
        """LUTs of the adders (:func:`adder_cost` each)."""
        return sum(adder_cost(op, self.width(v))
                   for op, v in zip(self.adders, self.results, strict=True))

    @property
    def depth(self) -> int:
        """Adder levels of the deepest output."""
        return max([self.level[v] for v, _, _ in self.outputs if v >= 0], default=0)

    def output_range(self, o: int) -> tuple[int, int]:
        v, s, g = self.outputs[o]
        if v < 0:
            return 0, 0
        lo, hi = self.lo[v] << s, self.hi[v] << s
        return (lo, hi) if g > 0 else (-hi, -lo)

    def _form(self, v: int):
        """Variable ``v`` as a linear form of the inputs: ``(coefficients, constant)``."""
        if v < self.n_in:
            c = np.zeros(self.n_in, dtype=object)
            c[v] = 1
            return c, 0
        return self._forms[v]

    def _append(self, coef, const, level) -> int:
        """A new variable of the linear form ``coef @ x + const``; its exact value range."""
        in_lo = np.array(self.lo[:self.n_in], dtype=object)
        in_hi = np.array(self.hi[:self.n_in], dtype=object)
        lo = const + int(np.sum(np.where(coef > 0, coef * in_lo, coef * in_hi)))
        hi = const + int(np.sum(np.where(coef > 0, coef * in_hi, coef * in_lo)))
        v = len(self.lo)
        self._forms[v] = (coef, const)
        self._schedules.clear()
        self.lo.append(lo)
        self.hi.append(hi)
        self.level.append(level)
        return v

    def add(self, op: Adder) -> int:
        """Append ``op``; its variable, whose value range is exact (from the linear form in
        the inputs, so ``x - x`` pairs do not widen it) and its level."""
        ca, ka = self._form(op.a)
        coef, const = ca * (op.sign_a << op.shift_a), ka * (op.sign_a << op.shift_a)
        lvl = self.level[op.a] + 1
        if op.b >= 0:
            cb, kb = self._form(op.b)
            coef = coef + cb * (op.sign_b << op.shift_b)
            const += kb * (op.sign_b << op.shift_b)
            lvl = max(lvl, self.level[op.b] + 1)
        self.adders.append(op)
        self.results.append(len(self.lo))
        return self._append(coef, const, lvl)

    def constant(self, value: int) -> int:
        """A constant variable of ``value``."""
        v = self._append(np.zeros(self.n_in, dtype=object), int(value), 0)
        self.consts[v] = int(value)
        return v

    def evaluate(self, x) -> np.ndarray:
        """``W @ x`` computed by the adders: ``x`` is ``(n_in,)`` or ``(batch, n_in)``
        integers; Python integers inside (no overflow), int64 or object out."""
        x = np.asarray(x)
        batch = x.reshape(-1, self.n_in).astype(object)
        vals = [batch[:, i] for i in range(self.n_in)]
        vals += [None] * (len(self.lo) - self.n_in)
        for v, c in self.consts.items():
            vals[v] = np.full(len(batch), c, dtype=object)
        for op, v in zip(self.adders, self.results, strict=True):
            a = op.sign_a * (vals[op.a] * (1 << op.shift_a))
            b = 0 if op.b < 0 else op.sign_b * (vals[op.b] * (1 << op.shift_b))
            vals[v] = a + b
        zero = np.zeros(len(batch), dtype=object)
        out = np.stack([zero if v < 0 else g * (vals[v] * (1 << s))
                        for v, s, g in self.outputs], axis=1) if self.outputs else \
            np.zeros((len(batch), 0), dtype=object)
        try:
            out = out.astype(np.int64)
        except OverflowError:
            pass
        return out.reshape(x.shape[:-1] + (self.n_out,))

    def schedule(self, levels_per_stage: int) -> Schedule:
        """Registers every ``levels_per_stage`` adder levels (see :class:`Schedule`); kept
        per ``levels_per_stage`` until the graph grows (the core, its cycle model and its
        estimate each ask)."""
        if levels_per_stage < 1:
            raise ValueError(f"levels_per_stage must be at least 1, not {levels_per_stage}")
        L = int(levels_per_stage)
        if L not in self._schedules:
            self._schedules[L] = self._schedule(L)
        return self._schedules[L]

    def _schedule(self, L: int) -> Schedule:
        stage = [0 if v < self.n_in else -(-self.level[v] // L) for v in range(len(self.lo))]
        depth = max([stage[v] for v, _, _ in self.outputs if v >= 0], default=0)
        last_use = [-1] * len(stage)           # -1: never registered
        for v in range(self.n_in):
            last_use[v] = 0
        for op, r in zip(self.adders, self.results, strict=True):
            s = stage[r]
            for v in (op.a, op.b):
                if v >= 0 and v not in self.consts and (v < self.n_in or stage[v] < s):
                    last_use[v] = max(last_use[v], s - 1)
        for v, _, _ in self.outputs:
            if v >= 0 and v not in self.consts:
                last_use[v] = max(depth, stage[v])
        readers: dict = {}                   # (v, k) -> adders that read its register
        reads = {}
        for i, (op, r) in enumerate(zip(self.adders, self.results, strict=True)):
            for j, v in enumerate((op.a, op.b)):
                if v >= 0 and v not in self.consts and (v < self.n_in or stage[v] < stage[r]):
                    n = readers[(v, stage[r] - 1)] = readers.get((v, stage[r] - 1), 0) + 1
                    reads[(i, j)] = (n - 1) // READERS_PER_COPY
        copies = {key: -(-n // READERS_PER_COPY) for key, n in readers.items()
                  if n > READERS_PER_COPY}
        ffs = sum(self.width(v) * (last_use[v] - stage[v] + 1)
                  for v in range(len(self.lo)) if last_use[v] >= stage[v])
        ffs += sum(self.width(v) * (n - 1) for (v, _), n in copies.items())
        return Schedule(L, stage, last_use, depth, self.luts, ffs, copies, reads)


def _pair_key(t1, t2):
    """``(key, base)`` of two terms ``(var, shift, sign)``: ``key = (a, b, ds, g)`` names the
    subexpression ``a + g * (b << ds)``, ``base = (shift, sign)`` how it stands in the row."""
    (a, s1, g1), (b, s2, g2) = t1, t2
    if (s1, a) > (s2, b):
        (a, s1, g1), (b, s2, g2) = (b, s2, g2), (a, s1, g1)
    return (a, b, s2 - s1, g1 * g2), (s1, g1)


class _Rows:
    """The outputs' terms during the common subexpression search, with the count of every
    pair (overlapping pairs counted too) and a lazy max-heap over the counts: an entry is
    pushed when a count grows; one whose count has since shrunk is pushed again with the
    new count when it reaches the top."""

    def __init__(self, rows):
        self.rows = [dict() for _ in rows]      # (var, shift) -> sign
        self.shifts = [dict() for _ in rows]    # var -> {shift}
        self.count: dict = {}
        self.building = True
        for r, terms in enumerate(rows):
            for t in terms:
                self.insert(r, t)
        self.building = False
        self.heap = [(-c, key[2], key) for key, c in self.count.items() if c >= 2]
        heapq.heapify(self.heap)

    def _bump(self, key, d):
        c = self.count.get(key, 0) + d
        if c:
            self.count[key] = c
        else:
            del self.count[key]
        if d > 0 and c >= 2 and not self.building:
            heapq.heappush(self.heap, (-c, key[2], key))

    def remove(self, r, t):
        row = self.rows[r]
        v, s = t[:2]
        del row[(v, s)]
        self.shifts[r][v].discard(s)
        for (u, su), gu in row.items():
            self._bump(_pair_key(t, (u, su, gu))[0], -1)

    def insert(self, r, t):
        """Add term ``t`` to row ``r``, merging it with a term of the same variable and
        shift (``x + x == x << 1``; ``x - x == 0``)."""
        v, s, g = t
        row = self.rows[r]
        if (v, s) in row:
            g2 = row[(v, s)]
            self.remove(r, (v, s, g2))
            if g2 == g:
                self.insert(r, (v, s + 1, g))
            return
        for (u, su), gu in row.items():
            self._bump(_pair_key(t, (u, su, gu))[0], 1)
        row[(v, s)] = g
        self.shifts[r].setdefault(v, set()).add(s)

    def best(self):
        """The pair that occurs in most places (at least two), or None."""
        while self.heap:
            c, _, key = self.heap[0]
            now = self.count.get(key, 0)
            if now == -c and now >= 2:
                return key
            heapq.heappop(self.heap)
            if 2 <= now < -c:               # shrunk since pushed (a grown one is pushed)
                heapq.heappush(self.heap, (-now, key[2], key))
        return None

    def occurrences(self, r, key):
        """Non-overlapping occurrences of ``key`` in row ``r``: ``[(t1, t2, base)]``."""
        a, b, ds, g = key
        row, used, out = self.rows[r], set(), []
        for s in sorted(self.shifts[r].get(a, ())):
            if (a, s) in used:
                continue
            g1 = row[(a, s)]
            other = (b, s + ds)
            if other in row and other not in used and other != (a, s) \
                    and row[other] == g1 * g:
                used.update({(a, s), other})
                out.append(((a, s, g1), (b, s + ds, g1 * g), (s, g1)))
        return out


def adder_graph(weight, in_lo, in_hi, bias=None, *, scale=None,
                share: bool = True) -> AdderGraph:
    """The :class:`AdderGraph` of ``(weight @ x) * scale + bias`` (``weight`` of shape
    ``(n_out, n_in)``, integers; ``bias`` and ``scale`` ``(n_out,)`` or None for 0 and 1)
    for inputs ``x[i]`` in ``[in_lo[i], in_hi[i]]`` (scalars apply to all): ``scale`` by
    its signed digits after each output's sum. ``share=False`` skips the common
    subexpression search (one tree per output, for comparison)."""
    w = np.asarray(weight)
    if w.ndim != 2:
        raise ValueError(f"weight must be 2-D, not {w.shape}")
    n_out, n_in = w.shape
    lo = np.broadcast_to(np.asarray(in_lo, dtype=object), (n_in,))
    hi = np.broadcast_to(np.asarray(in_hi, dtype=object), (n_in,))
    g = AdderGraph(n_in, lo=[int(v) for v in lo], hi=[int(v) for v in hi], level=[0] * n_in)
    rows = [[(i, s, d) for i in range(n_in) for s, d in csd_digits(int(w[o, i]))]
            for o in range(n_out)]
    state = _Rows(rows)
    while share:
        key = state.best()
        if key is None:
            break
        a, b, ds, sign = key
        v = g.add(Adder(a, 0, 1, b, ds, sign))
        for r in range(n_out):
            for t1, t2, (s, g1) in state.occurrences(r, key):
                state.remove(r, t1)
                state.remove(r, t2)
                state.insert(r, (v, s, g1))
    bias = _per_output(bias, n_out, 0, "bias")
    scale = _per_output(scale, n_out, 1, "scale")
    for r in range(n_out):
        terms = [(v, s, sg) for (v, s), sg in sorted(state.rows[r].items())]
        if scale[r] != 1:
            v, s0, sg = _sum_tree(g, terms)
            terms = [] if v < 0 else [(v, s0 + s, sg * d) for s, d in csd_digits(scale[r])]
        if bias[r]:
            terms.append((g.constant(bias[r]), 0, 1))
        g.outputs.append(_sum_tree(g, terms))
    return g


def _per_output(values, n: int, default: int, what: str) -> list[int]:
    if values is None:
        return [default] * n
    a = np.asarray(values).reshape(-1)
    if a.shape != (n,):
        raise ValueError(f"{what} must have {n} entries, not {a.shape}")
    return [int(v) for v in a]


def _sum_tree(g: AdderGraph, terms):
    """Sum ``terms`` by adders, the two terms ready first (lowest level, then narrowest)
    first; returns the output's ``(var, shift, sign)``."""
    if not terms:
        return (-1, 0, 1)
    heap = [(g.level[v], g.width(v), n, (v, s, sg)) for n, (v, s, sg) in enumerate(terms)]
    heapq.heapify(heap)
    n = len(heap)
    while len(heap) > 1:
        *_, t1 = heapq.heappop(heap)
        *_, t2 = heapq.heappop(heap)
        (a, sa, ga), (b, sb, gb) = t1, t2
        s0 = min(sa, sb)
        if ga < 0 and gb < 0:            # -(a + b)
            sign, ga, gb = -1, 1, 1
        else:
            sign = 1
        if ga < 0:                       # the positive operand first
            (a, sa, ga), (b, sb, gb) = (b, sb, gb), (a, sa, ga)
        v = g.add(Adder(a, sa - s0, ga, b, sb - s0, gb))
        heapq.heappush(heap, (g.level[v], g.width(v), n, (v, s0, sign)))
        n += 1
    v, s, sign = heap[0][3]
    if sign < 0:
        v = g.add(Adder(v, 0, -1, -1, 0, 1))
        sign = 1
    return (v, s, sign)


def cmvm_pipeline(graph: AdderGraph, levels_per_stage: int, fused=None) -> int:
    """Register stages of a :class:`~onnx2fpga.hw.cmvm.ConstMatVecCore`'s pipeline: the input
    register, the graph's stages, :func:`finish_stages`."""
    return graph.schedule(levels_per_stage).depth + 1 + finish_stages(fused)


def cmvm_queue_depth(graph: AdderGraph, levels_per_stage: int, fused=None) -> int:
    """Transfers the output queue of a :class:`~onnx2fpga.hw.cmvm.ConstMatVecCore` holds:
    its pipeline runs without enables, so every transfer it has taken and not yet given out
    must find room there. A transfer spends ``pipeline + queue latency`` cycles in the core
    and ``i_stream.ready`` is a register, so one more row keeps it at one transfer per
    cycle."""
    pipe = cmvm_pipeline(graph, levels_per_stage, fused)
    depth = pipe + fifo_latency(FLOP_FIFO_DEPTH) + 1
    return depth if depth <= FLOP_FIFO_DEPTH else pipe + fifo_latency(depth) + 1


def cmvm_latency(graph: AdderGraph, levels_per_stage: int, fused=None) -> int:
    """Cycles from an input transfer of a :class:`~onnx2fpga.hw.cmvm.ConstMatVecCore` to its
    output transfer: :func:`cmvm_pipeline`, then the output queue's latency."""
    return cmvm_pipeline(graph, levels_per_stage, fused) + \
        fifo_latency(cmvm_queue_depth(graph, levels_per_stage, fused))


class CmvmTiming(CoreKind):
    """A :class:`~onnx2fpga.hw.cmvm.ConstMatVecCore`: one vector per cycle,
    :func:`cmvm_latency` cycles through."""
    kinds = ("cmvm",)
    skid_out = True

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        p = stage.params
        d = cmvm_latency(p["graph"], p["levels_per_stage"], p.get("fused"))
        return first + d, last + d


#: How the adder graph's figures become LUTs, per family, measured on yosys 0.70 and nextpnr
#: 0.11 builds of ConstMatVecCores: an ECP5 adder takes ``ceil((bits + 1) / 2)`` CCU2C of two
#: LUTs each (``bits`` without the low bits that pass through) and nextpnr puts a feed-in
#: CCU2C (two TRELLIS_COMB, ``per_chain``) before each chain to set its carry in (its pass-out
#: CCU2C after the chain is gone: :mod:`onnx2fpga.boards.carry`); a flip-flop with no LUT of
#: its own takes no TRELLIS_COMB (the jet tagger's layers 1-3 at two levels per stage: 21,903
#: LUT4s from yosys, 1,873 chains, 25,849 TRELLIS_COMB with 4,243 such flip-flops). yosys maps
#: adders of up to ``narrow`` result bits to LUTs instead (its CCU2C map refuses them), ``luts``
#: by width: on the UNSW-NB15 MLP's first layer (2-bit inputs; 398 such adders of 3 bits, 390
#: of 4) the chain figure was 28 % over nextpnr's count. An iCE40 adder takes an SB_LUT4 per
#: bit beside its SB_CARRY and yosys adds about a third more (2,962 SB_LUT4 for 2,164 adder
#: bits); a comparison with a constant is a tree of LUTs, about one per three bits.
CMVM_COST = {"ecp5": {"per_bit": None, "per_chain": 2, "narrow": 4,
                      "luts": {1: 1, 2: 2, 3: 3, 4: 6}},
             "ice40": {"per_bit": 1.37, "per_chain": 0, "narrow": 0, "luts": {}}}


def adder_luts(width: int, family: str) -> int:
    """LUTs of one adder of ``width`` result bits on ``family`` (:data:`CMVM_COST`)."""
    cost = CMVM_COST[family]
    if width <= cost["narrow"]:
        return cost["luts"][max(1, width)]
    if cost["per_bit"] is None:          # CCU2C: two LUTs per two bits, one more bit
        return 2 * (-(-(width + 1) // 2)) + cost["per_chain"]
    return cost["per_bit"] * width + cost["per_chain"]


def cmvm_resources(graph: AdderGraph, levels_per_stage: int, out_bits: int, family: str,
                   fused=None) -> dict:
    """Estimated LUTs and flip-flops of a :class:`~onnx2fpga.hw.cmvm.ConstMatVecCore` on
    ``family`` from its graph (:data:`CMVM_COST`): the adders, the finishing stages of a
    folded requantization (per output a rounding adder and a clip, or a comparison with
    each threshold and their count), the registers of :meth:`AdderGraph.schedule`, the
    valid bits, and the output queue (:func:`cmvm_queue_depth` rows of the live outputs,
    :func:`queue_resources`). Outputs that are constants (no weights, or none left) take
    nothing: yosys removes their registers, and the queue does not hold them."""
    sch = graph.schedule(levels_per_stage)
    luts = sum(adder_luts(adder_cost(op, graph.width(v)), family) for op, v in
               zip(graph.adders, graph.results, strict=True))
    live = [c for c, (v, _, _) in enumerate(graph.outputs)
            if v >= 0 and v not in graph.consts]
    ff = sch.flip_flops + sch.depth + 3
    if fused is not None:
        ff += 2
        for c in live:
            w = graph.width(graph.outputs[c][0])
            if fused.rounding[c] == "thresholds":
                n = len(fused.thresholds[c])
                luts += n * (-(-w // 3)) + out_bits
                ff += n + out_bits
                continue
            if fused.rounding[c] != "none" or fused.round_const[c]:
                luts += adder_luts(w, family)
            luts += out_bits                                    # the clip
            ff += w + out_bits
    queue = queue_resources(len(live) * out_bits,
                            cmvm_queue_depth(graph, levels_per_stage, fused), family)
    return {"lut": int(round(luts)) + queue["lut"], "ff": ff + queue["ff"],
            "bram": queue["bram"]}


#: A :class:`~onnx2fpga.hw.plumbing.StreamFIFO` over 4 deep, as yosys 0.70 and nextpnr 0.11
#: build it: on ECP5 its rows in distributed RAM (``TRELLIS_DPR16X4``: 16 rows of 4 bits,
#: packed by nextpnr as 4 RAM LUTs and 2 write LUTs), on iCE40 in ``SB_RAM40_4K`` (256 rows
#: of 16 bits); on both the read port's register in flip-flops (48 bits, 9 deep: 59
#: TRELLIS_FF and 12 DPR16X4; 112 iCE40 flip-flops and 3 SB_RAM40_4K).
QUEUE_COST = {"ecp5": {"rows": 16, "bits": 4, "lut": 6, "bram": 0},
              "ice40": {"rows": 256, "bits": 16, "lut": 0, "bram": 1}}


def queue_resources(width: int, depth: int, family: str) -> dict:
    """Estimated LUTs, flip-flops and block RAMs of a
    :class:`~onnx2fpga.hw.plumbing.StreamFIFO` of ``depth`` transfers of ``width`` bits
    (without ``out_register``) on ``family``: up to :data:`~onnx2fpga.plan.plumbing.
    FLOP_FIFO_DEPTH` rows of flip-flops and a multiplexer, deeper ones :data:`QUEUE_COST`."""
    if width <= 0 or depth <= 0:
        return {"lut": 0, "ff": 0, "bram": 0}
    ctrl = 4 * max(1, (depth + 1).bit_length())
    if depth <= FLOP_FIFO_DEPTH:
        return {"lut": width * (depth // 2) + ctrl, "ff": width * depth + ctrl, "bram": 0}
    cost = QUEUE_COST[family]
    units = -(-width // cost["bits"]) * -(-(depth - 1) // cost["rows"])
    return {"lut": units * cost["lut"] + ctrl, "ff": width + ctrl, "bram": units * cost["bram"]}
