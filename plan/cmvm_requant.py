"""The requantization after a constant matrix-vector product, folded into its adder graph.

A layer's epilogue (one :class:`~onnx2fpga.ir.RequantStage` or
:class:`~onnx2fpga.ir.ThresholdStage`) maps each output's accumulator ``acc`` to the output
``y = f_c(acc)``, a monotonic step function of ``acc`` clipped to ``[lo, hi]``. The adder
graph computes ``u = acc * m_c + k_c`` by a few more adders (the canonical signed digits of
``m_c``, an odd multiplier or 0), and the core finishes with::

    y = clip((u + r_c + carry) >> s_c, lo, hi)

where ``carry`` is 0, or for a rounding half to even (``"bit"``) bit ``s_c`` of ``u``, or
for half away from zero (``"sign"``) 1 when ``u`` is not negative: the identities of
:func:`onnx2fpga.sim.golden.round_shift` (``round_shift(v, s) + zp == (v + 2**(s-1) - 1 +
zp * 2**s + carry) >> s``), with the multiplier's trailing zero bits taken out of ``v``
(``v = u * 2**j + low``, ``0 <= low < 2**j``: ``low`` and the rounding constant's low bits
only decide whether one more unit reaches bit ``j``, which is a constant or the carry).
Or, for few levels, ``y = lo + #{t in thresholds_c : acc >= t}`` (``"thresholds"``).

:func:`fuse_requant` first looks for the cheapest *floor form* (``carry`` 0): for each shift
``s`` the multipliers ``M`` for which some ``K`` reproduces ``f_c`` exactly form an interval
(each level of ``f_c`` is an interval of ``acc``, and only its two ends constrain ``M`` and
``K``), found exactly from the pairs of those ends; the multiplier with the fewest signed
digits over all shifts wins, so a scale like 14607848 / 2**36 (eight signed digits) often
needs two or three on the range the accumulator can take. Where no floor form exists (a
rounding half to even whose ties do occur makes the levels' widths irregular), the stage's
own multiplier, offset and rounding are used as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.stages import RequantStage, ThresholdStage
from ..sim import golden
from .cmvm import AdderGraph, adder_graph, csd_digits
from .requant import shift_rounding
from .stage import value_key

__all__ = ["FusedRequant", "fuse_requant", "fewest_digits", "layer_graph",
           "cached_layer_graph", "MAX_LEVELS", "MAX_THRESHOLDS", "GRAPH_CACHE_SIZE"]

#: Output levels beyond which the floor form is not searched (a wide output's function is
#: left to the stage's own multiplier).
MAX_LEVELS = 4096

_INT64_BITS = 62

#: Output levels up to which a channel may compare its accumulator with thresholds instead
#: (where that costs fewer LUTs than the multiplier's adders, or no other form exists).
MAX_THRESHOLDS = 15

#: Shifts tried past the first one at which a floor form exists (each doubles the interval
#: of multipliers, which may then hold one of fewer signed digits).
SHIFTS_PAST = 12


@dataclass(frozen=True)
class FusedRequant:
    """Per output ``c`` (see the module docstring): the graph's ``u = acc * multiplier[c] +
    offset[c]``, then ``y = clip((u + round_const[c] + carry) >> shift[c], lo, hi)`` with
    ``carry`` as ``rounding[c]`` says (``"none"``, ``"bit"``, ``"sign"``); or
    ``rounding[c] == "thresholds"``: ``y = lo + #{t in thresholds[c] : u >= t}`` (``u <=
    t`` for ``direction[c] == -1``), with ``u = acc``."""
    multiplier: tuple
    offset: tuple
    round_const: tuple
    shift: tuple
    rounding: tuple
    lo: int
    hi: int
    thresholds: tuple = ()
    direction: tuple = ()

    def graph_value(self, acc, c: int):
        """``u`` of channel ``c`` for accumulators ``acc`` (Python integers)."""
        return np.asarray(acc, dtype=object) * self.multiplier[c] + self.offset[c]

    def finish(self, u, c: int) -> np.ndarray:
        """The outputs of channel ``c`` from the graph's values ``u``, as the core computes
        them."""
        u = np.asarray(u, dtype=object)
        if self.rounding[c] == "thresholds":
            a = u.astype(np.int64)
            hits = [(a >= t) if self.direction[c] > 0 else (a <= t) for t in self.thresholds[c]]
            return self.lo + np.sum(hits, axis=0, dtype=np.int64)
        s = self.shift[c]
        carry = 0
        if self.rounding[c] == "bit":
            carry = (u >> s) & 1
        elif self.rounding[c] == "sign":
            carry = (u >= 0).astype(object)
        w = (u + self.round_const[c] + carry) >> s
        return np.array([min(max(int(q), self.lo), self.hi) for q in np.ravel(w)],
                        dtype=np.int64).reshape(u.shape)

    def apply(self, acc) -> np.ndarray:
        """The outputs of accumulators ``acc`` (``(batch, channels)``)."""
        acc = np.asarray(acc, dtype=object)
        out = np.empty(acc.shape, dtype=np.int64)
        for c in range(acc.shape[-1]):
            out[..., c] = self.finish(self.graph_value(acc[..., c], c), c)
        return out


def _odd(m: int, k: int, s: int, r: int, carry: str):
    """``(acc * m + k + r + carry) >> s`` (``carry`` taken from bit ``s`` of ``acc * m + k``,
    or its sign) with ``m``'s trailing zeros taken out: ``(m', k', r', s', carry')``."""
    if m == 0:
        return 0, k, r, s, carry
    j = min((m & -m).bit_length() - 1, s)
    if j == 0:
        return m, k, r, s, carry
    kh, kl = k >> j, k & ((1 << j) - 1)
    rh, rl = r >> j, r & ((1 << j) - 1)
    c0 = (kl + rl) >> j                       # one more unit at bit j, without the carry
    c1 = (kl + rl + 1) >> j                   # ... and with it
    return m >> j, kh, rh + c0, s - j, "none" if c0 == c1 else carry


def fewest_digits(lo: int, hi: int) -> int:
    """An integer of ``[lo, hi]`` with few nonzero signed digits (0 if the interval holds it;
    else the multiples of the highest power of two the interval holds, and their
    neighbours' multiples one power lower)."""
    lo, hi = int(lo), int(hi)
    if lo > hi:
        raise ValueError(f"empty interval [{lo}, {hi}]")
    if lo <= 0 <= hi:
        return 0
    best = None
    for k in range(max(abs(lo), abs(hi)).bit_length() + 1, -1, -1):
        step = 1 << k
        first = -(-lo // step) * step
        if first > hi:
            continue
        for m in (first, first + step) if first + step <= hi else (first,):
            key = (len(csd_digits(m)), abs(m))
            if best is None or key < best[0]:
                best = (key, m)
        if best[0][0] == 1:
            break
    return best[1]


def _levels(f, t_lo, t_hi, lo, hi):
    """``u[y - lo, c]``: the first ``t`` of ``[t_lo[c], t_hi[c]]`` with ``f(t)[c] >= y``
    (``t_hi + 1`` if none) for ``y`` in ``lo .. hi + 1``; ``f`` non-decreasing."""
    ys = np.arange(lo, hi + 2, dtype=np.int64)[:, None]
    a = np.broadcast_to(t_lo, (len(ys), len(t_lo))).astype(np.int64)
    b = np.broadcast_to(t_hi + 1, a.shape).astype(np.int64)
    while np.any(a < b):
        mid = (a + b) // 2
        ok = (f(np.minimum(mid, t_hi)) >= ys) & (mid <= t_hi)
        b = np.where(ok & (a < b), mid, b)
        a = np.where(~ok & (a < b), mid + 1, a)
    return a


def _constraints(u, t_lo, t_hi, lo, hi, c):
    """Channel ``c``'s ends of each level: ``(p, y)`` lower ends (``t*M + K >= y << s``)
    and ``(q, y)`` upper ends (``t*M + K <= ((y + 1) << s) - 1``)."""
    low, up = [], []
    for k in range(hi - lo + 1):
        y = lo + k
        p, r = max(int(u[k, c]), int(t_lo[c])), min(int(u[k + 1, c]) - 1, int(t_hi[c]))
        if p > r:
            continue
        if y > lo:
            low.append((p, y))
        if y < hi:
            up.append((r, y))
    return low, up


def _m_interval(low, up, s):
    """The multipliers ``M >= 0`` for which a ``K`` meets every constraint at shift ``s``:
    an interval ``(lo, hi)``, or None. Every pair of a lower end ``(p, y)`` and an upper end
    ``(q, z)`` bounds ``M``: ``(q - p) * M <= ((z + 1) << s) - 1 - (y << s)``."""
    if not low or not up:
        return (0, 0)
    p = np.array([t for t, _ in low], dtype=np.int64)
    lb = np.array([y for _, y in low], dtype=np.int64) << s
    q = np.array([t for t, _ in up], dtype=np.int64)
    ub = (np.array([y + 1 for _, y in up], dtype=np.int64) << s) - 1
    dq = q[None, :] - p[:, None]
    room = ub[None, :] - lb[:, None]
    if np.any((dq == 0) & (room < 0)):
        return None
    pos, neg = dq > 0, dq < 0
    m_hi = int((room[pos] // dq[pos]).min()) if pos.any() else None
    # (q - p) < 0: M >= room / (q - p) = -(room / (p - q)), rounded up
    m_lo = max(0, int((-(room[neg] // -dq[neg])).max())) if neg.any() else 0
    if m_hi is None:
        m_hi = m_lo
    return (m_lo, m_hi) if m_lo <= m_hi else None


def _k_range(low, up, m, s):
    k_lo = max(((y << s) - t * m for t, y in low), default=None)
    k_hi = min(((((y + 1) << s) - 1) - t * m for t, y in up), default=None)
    return k_lo, k_hi


def fuse_requant(stages, acc_lo, acc_hi, max_shift: int = 48) -> FusedRequant | None:
    """The folded form of ``stages`` (see the module docstring) for outputs whose
    accumulators range over ``[acc_lo[c], acc_hi[c]]``; None when the stages are not one
    requantization or threshold stage with outputs one apart, or when neither form exists."""
    if len(stages) != 1 or not isinstance(stages[0], (RequantStage, ThresholdStage)):
        return None
    stage = stages[0]
    if isinstance(stage, RequantStage) and stage.neg_multiplier is not None:
        return None
    if isinstance(stage, ThresholdStage) and abs(stage.step) != 1:
        return None
    acc_lo = np.asarray(acc_lo, dtype=np.int64)
    acc_hi = np.asarray(acc_hi, dtype=np.int64)
    channels = len(acc_lo)
    lo, hi = int(stage.lo), int(stage.hi)

    def f(acc):
        return golden.requant_stages(np.asarray(acc, np.int64).reshape(-1, channels),
                                     stages).reshape(np.shape(acc))

    ends = f(np.stack([acc_lo, acc_hi]))
    sign = np.where(ends[1] < ends[0], -1, 1)            # t = sign * acc: f non-decreasing
    t_lo = np.where(sign > 0, acc_lo, -acc_hi)
    t_hi = np.where(sign > 0, acc_hi, -acc_lo)
    floor_form = hi - lo <= MAX_LEVELS
    if floor_form:
        u = _levels(lambda t: f(t * sign), t_lo, t_hi, lo, hi)
    out = {k: [] for k in ("m", "k", "r", "s", "rounding", "t", "d")}
    for c in range(channels):
        best = None
        if floor_form:
            low, up = _constraints(u, t_lo, t_hi, lo, hi, c)
            tmax = max(abs(int(t_lo[c])), abs(int(t_hi[c])), 1)
            top = max_shift
            while top >= 0 and ((max(abs(lo), abs(hi)) + 2) << top >= 1 << _INT64_BITS
                                or tmax << top >= 1 << _INT64_BITS):
                top -= 1
            # Feasible at s means feasible at s + 1 (2M, 2K): the first feasible shift by
            # bisection, then the fewest digits over the shifts up to SHIFTS_PAST it.
            a, b = 0, top + 1
            while a < b:
                mid = (a + b) // 2
                if _m_interval(low, up, mid) is None:
                    a = mid + 1
                else:
                    b = mid
            for s in range(a, min(top, a + SHIFTS_PAST) + 1):
                iv = _m_interval(low, up, s)
                m = fewest_digits(*iv)
                if m * tmax >= 1 << _INT64_BITS:
                    break
                k_lo, k_hi = _k_range(low, up, m, s)
                k = k_lo if k_lo is not None else (k_hi if k_hi is not None else 0)
                key = (len(csd_digits(m)), s)
                if best is None or key < best[0]:
                    best = (key, int(sign[c]) * m, k, s)
                if key[0] <= 1:
                    break
        thr = _thresholds(u, t_lo, t_hi, lo, hi, c, int(sign[c])) if floor_form else None
        abits = max(int(acc_lo[c]).bit_length(), int(acc_hi[c]).bit_length()) + 1
        if best is not None:
            _, m, k, s = best
            form = _odd(m, k, s, 0, "none")
        else:
            form = _literal(stage, c)
        if thr is not None and (form is None or len(thr) * abits < _cost(form, abits)):
            form = None
        if form is None and thr is None:
            return None
        m, k, r, s, rounding = form if form is not None else (1, 0, 0, 0, "thresholds")
        if rounding == "none":              # a constant alone joins the graph's offset
            k, r = k + r, 0
        out["t"].append(tuple(thr) if form is None else ())
        out["d"].append(int(sign[c]))
        for key, v in zip("mkrs", (m, k, r, s), strict=True):
            out[key].append(int(v))
        out["rounding"].append(rounding)
    return FusedRequant(tuple(out["m"]), tuple(out["k"]), tuple(out["r"]), tuple(out["s"]),
                        tuple(out["rounding"]), lo, hi, tuple(out["t"]), tuple(out["d"]))


def _cost(form, abits: int) -> int:
    """LUTs of a multiplier form: an adder per further signed digit, as wide as the product,
    and the rounding's adder where there is a constant or carry to add."""
    m, _, r, s, rounding = form
    width = abits + abs(m).bit_length()
    return (max(0, len(csd_digits(m)) - 1) + bool(r or rounding != "none")) * width


def _thresholds(u, t_lo, t_hi, lo, hi, c, sign):
    """Channel ``c``'s thresholds in the accumulator's terms (``acc >= t``, or ``acc <= t``
    for ``sign == -1``): the first ``t`` of each level above ``lo``; None for more than
    :data:`MAX_THRESHOLDS` levels. A level no accumulator reaches needs no comparator."""
    if hi - lo > MAX_THRESHOLDS:
        return None
    firsts = [int(u[k, c]) for k in range(1, hi - lo + 1)]
    return [t if sign > 0 else -t for t in firsts if t <= int(t_hi[c])]


def _literal(stage, c):
    """The stage's own arithmetic for channel ``c`` as ``(m, k, r, s, rounding)`` (see
    :class:`FusedRequant`), or None for a rounding it has no carry for."""
    if not isinstance(stage, RequantStage) or stage.rounding not in (
            "half_even", "half_away", "floor", "ceil"):
        return None
    mults, offs = stage.multiplier.reshape(-1), stage.offset.reshape(-1)
    m = int(mults[0 if mults.size == 1 else c])
    k = int(offs[0 if offs.size == 1 else c]) - int(stage.in_zero_point) * m
    s = int(stage.shift)
    r, carry = shift_rounding(stage.rounding, s, stage.zero_point)
    return _odd(m, k, s, r, carry)


def layer_graph(weight, bias, in_lo: int, in_hi: int, in_zero_point: int = 0, stages=(),
                *, share: bool = True) -> tuple[AdderGraph, FusedRequant | None]:
    """The adder graph of a dense layer ``acc = weight @ (x - in_zero_point) + bias`` on
    inputs in ``[in_lo, in_hi]``, with its epilogue ``stages`` folded in where
    :func:`fuse_requant` finds a form: ``(graph, fused)``, the graph's outputs then the
    values ``u`` :class:`FusedRequant` finishes; else ``(graph of acc, None)``."""
    w = np.asarray(weight, dtype=np.int64)
    b = np.asarray(bias, dtype=np.int64).reshape(-1) - int(in_zero_point) * w.sum(axis=1)
    fused = None
    if stages:
        acc_lo = b + np.where(w > 0, w * in_lo, w * in_hi).sum(axis=1)
        acc_hi = b + np.where(w > 0, w * in_hi, w * in_lo).sum(axis=1)
        fused = fuse_requant(list(stages), acc_lo, acc_hi)
    if fused is None:
        return adder_graph(w, in_lo, in_hi, b, share=share), None
    m = np.array(fused.multiplier, dtype=object)
    k = np.array(fused.offset, dtype=object)
    return adder_graph(w, in_lo, in_hi, b.astype(object) * m + k, scale=m, share=share), fused


#: Layers whose graphs :func:`cached_layer_graph` keeps (the folding plans a design many
#: times; a graph takes about a second per thousand weights).
GRAPH_CACHE_SIZE = 32

_GRAPHS: dict = {}


def cached_layer_graph(weight, bias, in_lo: int, in_hi: int, in_zero_point: int = 0,
                       stages=()) -> tuple[AdderGraph, FusedRequant | None]:
    """:func:`layer_graph`, remembered for the last :data:`GRAPH_CACHE_SIZE` layers by the
    contents of its arguments."""
    key = value_key((np.asarray(weight), np.asarray(bias), int(in_lo), int(in_hi),
                     int(in_zero_point), list(stages)))
    if key not in _GRAPHS:
        if len(_GRAPHS) >= GRAPH_CACHE_SIZE:
            del _GRAPHS[next(iter(_GRAPHS))]
        _GRAPHS[key] = layer_graph(weight, bias, in_lo, in_hi, in_zero_point, stages)
    return _GRAPHS[key]
