"""LUT products and adders on ECP5 carry chains (``CCU2C``), for products that find no DSP.

An ECP5 ``CCU2C`` is two bits of an adder: per bit a 4-input LUT ``F(A, B, C, D)`` (the
propagate), a 2-input function of ``A, B`` (its table's first four entries, ``F(A, B, 0, 0)``:
the generate), the sum ``F ^ carry_in`` and the carry out ``F ? carry_in : generate``
(Lattice's ECP5 family data sheet, "PFU" and "carry chain"). A bit whose LUT computes
``u(A, B) ^ v(C, D)`` is then one bit of ``u + v`` whenever ``v(0, 0) == 0``: where the two
operand bits are equal, the generate ``u(A, B) = F(A, B, 0, 0)`` is their value. So each bit
of ``(x & w_i) + ((x & w_j) << 1)`` -- two rows of an array multiplier -- takes one LUT,
where yosys gives the AND gates LUTs of their own and maps a sum of many terms to 3:2
compressors in LUTs (about two LUTs a bit) instead of carry chains.

:func:`chain_product` builds ``x * w`` so: the weight's bits in pairs, each pair one carry chain
whose LUTs also do the AND gates (a signed weight's top row subtracted: ``-(x & w_t) ==
(~x & w_t) + w_t``), then the pairs added on carry chains. :func:`chain_add` is a plain adder
on a carry chain. Elaborated for another platform, each is the same value as Amaranth
arithmetic: the emitted, platform-free Verilog simulates what the ECP5 build computes.
"""

from __future__ import annotations

from amaranth import C, Cat, Const, Instance, Module, Mux, Shape, Signal, signed, unsigned

from .arith import is_ecp5
from .blocks import range_shape, shape_range

__all__ = ["chain_pairs", "registered_pairs", "chain_add", "chain_product", "chain_sum",
           "chain_op", "CCU2C_LUTS", "chain_pair_shape"]

#: LUTs of one ``CCU2C`` (two bits of a carry chain).
CCU2C_LUTS = 2

_AND, _ANDN = "and", "andn"


def _table(u_kind: str, v_kind: str) -> int:
    """The 16-bit LUT table of ``u(A, B) ^ v(C, D)``, ``AND`` (``a & b``) or ``ANDN``
    (``~a & b``) each; entry ``A + 2B + 4C + 8D``."""
    def f(kind, a, b):
        return (a & b) if kind == _AND else ((1 - a) & b)
    init = 0
    for i in range(16):
        a, b, c, d = i & 1, (i >> 1) & 1, (i >> 2) & 1, (i >> 3) & 1
        init |= (f(u_kind, a, b) ^ f(v_kind, c, d)) << i
    return init


def _bit(value, j: int):
    """Bit ``j`` of ``value`` extended (sign or zero) to any width."""
    if j < len(value):
        return value[j]
    return value[-1] if value.shape().signed and len(value) else C(0, 1)


def _chain(m: Module, platform, name: str, width: int, u, v, cin, u_kind=_AND,
           v_kind=_AND):
    """``width`` bits of ``u + v + cin`` (modulo ``2**width``) on ``CCU2C`` cells: ``u`` and
    ``v`` are lists of ``width`` pairs of 1-bit values ``(A, B)`` and ``(C, D)``, the bit of
    the operand ``kind(A, B)``. Returns an unsigned Signal of ``width`` bits.

    Elaborated for a resource estimate (a platform with a ``chain_cells`` list, see
    :func:`~onnx2fpga.hw.resources.estimate_netlist`), the cells are only counted there and
    the Signal is left undriven: tens of thousands of instances took most of a ResNet-8
    compile's time in the estimates of its foldings."""
    out = Signal(width, name=name)
    count = getattr(platform, "chain_cells", None)
    if count is not None:
        count[0] += (width + 1) // 2
        return out
    init = _table(u_kind, v_kind)
    carry = cin
    zero = C(0, 1)
    for k in range(0, width, 2):
        cout = Signal(name=f"{name}_c{k // 2}")
        ports = {"i_CIN": carry, "o_COUT": cout}
        for half in (0, 1):
            b = k + half
            if b < width:
                (a_, b_), (c_, d_) = u[b], v[b]
                ports[f"o_S{half}"] = out[b]
            else:
                a_ = b_ = c_ = d_ = zero
                ports[f"o_S{half}"] = Signal(name=f"{name}_x{k // 2}")
            ports.update({f"i_A{half}": a_, f"i_B{half}": b_, f"i_C{half}": c_,
                          f"i_D{half}": d_})
        m.submodules[f"{name}_cc{k // 2}"] = Instance(
            "CCU2C", p_INIT0=Const(init, 16), p_INIT1=Const(init, 16),
            p_INJECT1_0="NO", p_INJECT1_1="NO", **ports)
        carry = cout
    return out


def _as(value, shape: Shape):
    shape = Shape.cast(shape)
    return value.as_signed() if shape.signed else value.as_unsigned()


def chain_add(m: Module, platform, a, b, name: str, shift: int = 0, shape=None):
    """``a + (b << shift)`` as a value of ``shape`` (default Amaranth's shape of the sum; a
    narrower one must hold the exact sum): on ECP5 the bits below ``shift`` are ``a``'s and
    the rest one carry chain (a LUT a bit); elsewhere Amaranth's ``+``."""
    total = a + (b << shift)
    shape = Shape.cast(shape if shape is not None else total.shape())
    if not is_ecp5(platform):
        return _as(total[:shape.width], shape)
    one = C(1, 1)
    n = shape.width - shift
    hi = _chain(m, platform, name, n, [(_bit(a, shift + j), one) for j in range(n)],
                [(_bit(b, j), one) for j in range(n)], C(0, 1))
    return _as(Cat(a.as_unsigned()[:shift], hi) if shift else hi, shape)


def chain_pair_shape(x_shape: Shape, signed_top: bool) -> Shape:
    """The shape of one pair of rows ``x * d`` for ``d`` in ``0..3`` (``-2..1`` when the
    pair holds a signed weight's top bit)."""
    lo, hi = shape_range(Shape.cast(x_shape))
    values = [x * d for x in (lo, hi) for d in ((-2, -1, 0, 1) if signed_top else (0, 1, 2, 3))]
    return range_shape(min(values), max(values))


def chain_pairs(m: Module, platform, x, w, name: str) -> list:
    """``x * w`` as ``(shift, value)`` pairs whose shifted sum it is: one per two bits of
    ``w`` (the last alone if ``w``'s width is odd), ``x`` times those bits, each one carry
    chain on ECP5 whose LUTs also pick the rows (see the module's text)."""
    wsigned = w.shape().signed
    n = len(w)
    out = []
    for lo in range(0, n, 2):
        pair = lo + 1 < n
        top = wsigned and lo + (2 if pair else 1) >= n
        row_lo = Mux(w[lo], x, 0)
        if not pair:
            # One row alone: an AND, or the negated top row of a signed weight.
            out.append((lo, -row_lo if top else row_lo))
            continue
        shape = chain_pair_shape(x.shape(), top)
        if not is_ecp5(platform):
            row_hi = Mux(w[lo + 1], x, 0) << 1
            value = row_lo - row_hi if top else row_lo + row_hi
            out.append((lo, _as(value[:shape.width], shape)))
            continue
        width = shape.width
        u = [(_bit(x, j), w[lo]) for j in range(width)]
        t = w[lo + 1]
        if top:
            # -(x & t) << 1 == ((~x & t) << 1) + (t << 1): the rows of ~x (ANDN), and t added
            # twice at bit 0: as its v bit (~0 & t) and as the carry in.
            v = [(C(0, 1), t)] + [(_bit(x, j - 1), t) for j in range(1, width)]
            bits = _chain(m, platform, f"{name}_r{lo}", width, u, v, t, _AND, _ANDN)
        else:
            v = [(C(0, 1), C(0, 1))] + [(_bit(x, j - 1), t) for j in range(1, width)]
            bits = _chain(m, platform, f"{name}_r{lo}", width, u, v, C(0, 1))
        out.append((lo, _as(bits, shape)))
    return out


def registered_pairs(m: Module, platform, x, w, en, name: str, rows: str) -> list:
    """:func:`chain_pairs` of ``x * w`` (cells named after ``name``) in registers loaded
    while ``en``, named ``rows_0``, ``rows_1``, ...: ``(shift, register)`` pairs for
    :func:`chain_sum` a stage later."""
    values = chain_pairs(m, platform, x, w, name)
    regs = [(shift, Signal(Shape.cast(v.shape()), name=f"{rows}_{n}", reset_less=True))
            for n, (shift, v) in enumerate(values)]
    with m.If(en):
        m.d.sync += [r.eq(v) for (_, r), (_, v) in zip(regs, values)]
    return regs


def chain_product(m: Module, platform, x, w, name: str):
    """``x * w`` (Amaranth's shape): :func:`chain_pairs` added by :func:`chain_sum`."""
    return chain_sum(m, platform, chain_pairs(m, platform, x, w, name), x.shape(), w.shape(),
                     name)


def chain_sum(m: Module, platform, pairs: list, x_shape, w_shape, name: str):
    """``x * w`` (Amaranth's shape) from its :func:`chain_pairs` ``pairs`` (or registers
    holding them), ``x`` and ``w`` of shapes ``x_shape`` and ``w_shape``: added on carry
    chains (:func:`chain_add`, each as wide as its partial sum's range needs), one level of
    adders per halving."""
    x_shape, w_shape = Shape.cast(x_shape), Shape.cast(w_shape)
    shape = (Signal(x_shape) * Signal(w_shape)).shape()
    xr = shape_range(x_shape)
    terms = []
    for shift, value in pairs:
        # The weight bits' part: their value range, times x's.
        n = min(2, w_shape.width - shift)
        wr = shape_range(signed(n) if w_shape.signed and shift + n >= w_shape.width
                         else unsigned(n))
        ends = [a * b for a in xr for b in wr]
        terms.append((shift, value, min(ends), max(ends)))
    level = 0
    while len(terms) > 1:
        nxt = []
        for i in range(0, len(terms) - 1, 2):
            (sa, a, alo, ahi), (sb, b, blo, bhi) = terms[i], terms[i + 1]
            d = sb - sa
            lo, hi = alo + (blo << d), ahi + (bhi << d)
            total = chain_add(m, platform, a, b, f"{name}_a{level}_{i // 2}", shift=d,
                              shape=range_shape(lo, hi))
            nxt.append((sa, total, lo, hi))
        if len(terms) % 2:
            nxt.append(terms[-1])
        terms, level = nxt, level + 1
    shift, value = terms[0][:2]
    total = value << shift
    return _as(total[:shape.width], shape)


def chain_op(m: Module, platform, name: str):
    """A two-term adder for :func:`~onnx2fpga.hw.blocks.tree_levels`: :func:`chain_add`,
    each call's cells named ``{name}_{n}``."""
    count = [0]

    def add(a, b):
        count[0] += 1
        return chain_add(m, platform, a, b, f"{name}_{count[0] - 1}")
    return add
