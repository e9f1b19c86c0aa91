"""Building blocks of the stream cores: parameter checks, shapes, counters, output and skid
registers, balanced (registered) trees.

The public library the cores of :mod:`onnx2fpga.hw` and the board wrapper build on; every
name here is imported by its public name, never a private one. The blocks follow the rules of
:mod:`amaranth.lib.stream` where they touch a stream: ``valid`` never waits on ``ready`` and a
payload holds until it is transferred.
"""

from __future__ import annotations

import functools
import operator

from amaranth import (
    C,
    Module,
    Mux,
    Shape,
    Signal,
    Value,
    signed,
    unsigned,
)
from amaranth.lib import data

from ..ir.types import IntType
from ..plan.checks import check_count, check_lanes  # the cores' parameter checks, re-exported

__all__ = [
    "check_count", "check_lanes", "quiet_if_invalid", "int_shape", "shape_range",
    "range_shape", "tree_sum", "tree_levels", "registered_tree", "counter", "wrap_incr",
    "output_register", "skid_output", "skid_output_shares",
]


def quiet_if_invalid(init):
    """Decorate a component's ``__init__`` so that a rejected parameter (or a missing optional
    package) raises without an ``UnusedElaboratable`` warning later: an object that failed
    to construct is no design."""
    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except Exception:
            self._MustUse__used = True      # the flag amaranth._unused.MustUse checks
            raise
    return wrapper


def int_shape(value) -> Shape:
    """The Amaranth shape of an :class:`~onnx2fpga.ir.IntType` or integer shape.

    Parameters
    ----------
    value : IntType or shape-castable
        ``IntType(8, True)`` gives ``signed(8)``; an Amaranth integer shape passes through.

    Raises
    ------
    TypeError
        If ``value`` is neither an ``IntType`` nor a plain integer shape.
    """
    if isinstance(value, IntType):
        return Shape(value.bits, value.signed)
    if isinstance(value, (data.Layout, bool)):
        raise TypeError(f"Element shape must be an IntType or an integer shape, not {value!r}")
    try:
        shape = Shape.cast(value)
    except TypeError:
        raise TypeError(f"Element shape must be an IntType or an integer shape, "
                        f"not {value!r}") from None
    if shape.width == 0:
        raise ValueError(f"Element shape must be at least 1 bit wide, not {value!r}")
    return shape


def shape_range(shape: Shape) -> tuple[int, int]:
    if shape.signed:
        return -(1 << (shape.width - 1)), (1 << (shape.width - 1)) - 1
    return 0, (1 << shape.width) - 1


def range_shape(lo: int, hi: int) -> Shape:
    """The narrowest shape holding every integer of ``[lo, hi]``."""
    if lo >= 0:
        return unsigned(max(1, hi.bit_length()))
    return signed(max((-lo - 1).bit_length(), hi.bit_length()) + 1)


def tree_sum(terms: list, op=operator.add):
    """Combine ``terms`` with ``op`` (a sum by default) as a balanced tree (log depth instead
    of a chain)."""
    return tree_levels(terms, op=op)[0]


def tree_levels(terms: list, levels=None, op=operator.add) -> list:
    """``levels`` levels of a balanced tree of ``op`` (an adder tree by default) over
    ``terms`` (all of them for ``None``): the partial results, fewer terms than before."""
    while len(terms) > 1 and (levels is None or levels > 0):
        pairs = [op(terms[i], terms[i + 1]) for i in range(0, len(terms) - 1, 2)]
        if len(terms) % 2:
            pairs.append(terms[-1])
        terms = pairs
        if levels is not None:
            levels -= 1
    return terms


def registered_tree(m: Module, terms: list, per_stage: list, en, name, one_shape=None,
                    op=operator.add) -> list:
    """An adder tree over ``terms`` in ``len(per_stage)`` register stages, each loaded while
    ``en``: stage ``n`` adds ``per_stage[n]`` levels, the last stage the rest. The registers
    of stage ``n`` are named ``name(n, i)``; where a stage leaves one term, its register takes
    ``one_shape`` if given (modular sums in an accumulator's width); ``op`` adds two terms.
    Returns the last stage's registers."""
    for n, levels in enumerate(per_stage):
        terms = tree_levels(terms, levels if n < len(per_stage) - 1 else None, op)
        regs = [Signal(one_shape if one_shape is not None and len(terms) == 1
                       else Shape.cast(t.shape()), name=name(n, i), reset_less=True)
                for i, t in enumerate(terms)]
        with m.If(en):
            m.d.sync += [r.eq(t) for r, t in zip(regs, terms)]
        terms = regs
    return terms


def counter(modulo: int) -> Signal:
    """A counter register for ``0 .. modulo-1``, at least 1 bit wide (no zero-width wires in
    the Verilog when ``modulo`` is 1)."""
    return Signal(range(max(modulo, 2)), src_loc_at=1)     # named after the caller's variable


def wrap_incr(counter: Signal, modulo: int):
    """``counter + 1`` modulo ``modulo``."""
    if modulo <= 1:
        return C(0, 1)
    return Mux(counter == modulo - 1, 0, counter + 1)


def output_register(m: Module, o_stream, o_valid: Signal, layout) -> Signal:
    """An output register that holds its transfer until it is taken.

    ``o_valid`` and the returned payload register (of ``layout``) drive ``o_stream``;
    ``o_valid`` falls when the transfer happens. The caller loads the register: it sets
    ``o_valid`` to 1 and the payload in statements added after this call, which take
    precedence (a transfer and a load in the same cycle leave it full).
    """
    o_payload = Signal(layout)
    m.d.comb += [o_stream.valid.eq(o_valid), o_stream.payload.eq(o_payload)]
    with m.If(o_stream.ready):
        m.d.sync += o_valid.eq(0)
    return o_payload


def skid_output(m: Module, o_stream, valid, payload, free_copy=False):
    """Drive ``o_stream`` from a pipeline's last register (``valid``, ``payload``) through a
    skid register that takes the transfer the consumer did not.

    Returns ``free``, a function of registers only: the last register may be loaded this
    cycle (its transfer leaves it, to the consumer or the skid register, unless the skid
    register is still full). Pipelines that shift on ``free`` never see ``o_stream.ready`` in
    their enables, so a long ready chain between cores ends here (kwsmlp_w3a3's critical
    path on an ECP5 was a ready chain from two cores downstream into a MatVec's pipeline
    enables: 12.1 ns). With a consumer that is always ready the skid stays empty and the
    cycles are those of a plain output register. With ``free_copy``, ``free`` comes from a
    copy of the skid register's flag (updated as the flag, so equal to it on every cycle),
    which then reaches only the caller's enables, not the output multiplexer of every
    payload bit: in the jet tagger's lane converter after its first layer, the flag's net
    reaching both was 3.5 ns of a 10.4 ns path into the gathered word's enables.
    """
    return skid_output_shares(m, o_stream, valid, payload, 1 if free_copy else 0)[0]


def skid_output_shares(m: Module, o_stream, valid, payload, shares: int) -> list:
    """:func:`skid_output` whose ``free`` comes in ``shares`` copies, each from its own copy
    of the skid register's flag (updated as the flag, so all are equal on every cycle): a
    pipeline of thousands of flip-flops gives each copy a share of its enables, so that no
    enable net reaches them all. ``shares == 0``: one ``free`` from the flag itself.
    """
    skid_full = Signal()
    bits = Value.cast(payload)
    skid = Signal(len(bits), reset_less=True)
    m.d.comb += [
        o_stream.valid.eq(valid | skid_full),
        o_stream.payload.eq(Mux(skid_full, skid, bits)),
    ]
    # The skid register follows the payload while it is empty (so `ready` enables only the
    # flag, not a word of flip-flops) and holds once the flag is set.
    with m.If(~skid_full):
        m.d.sync += skid.eq(bits)
    flags = [skid_full] + [Signal(name="skid_full_copy" + (f"{k}" if k else ""))
                           for k in range(shares)]
    for flag in flags:
        with m.If(flag):
            with m.If(o_stream.ready):
                m.d.sync += flag.eq(0)
        with m.Elif(valid & ~o_stream.ready):
            m.d.sync += flag.eq(1)
    return [~(valid & f) for f in (flags[1:] or flags)]
