"""Products and partial products: LUT products, the hard multipliers of iCE40 (``SB_MAC16``) and
ECP5 (``MULT18X18D``) with their registers inside, and the partial products and carry-save
sums that wide requantization multipliers are cut into.

Every function here builds the same value as Amaranth's ``*`` (or a documented part of it);
only how synthesis maps it differs, never a value or a cycle.
"""

from __future__ import annotations

from amaranth import (
    Array,
    C,
    Cat,
    ClockSignal,
    Instance,
    Module,
    Mux,
    Shape,
    Signal,
)

from ..plan.devices import (
    ECP5_DSP_BITS,
    ICE40_DSP_BITS,
    LUT_PRODUCT_MAX_BITS,
    const_multiplier_bits,
    ecp5_dsp_product,
    multiplier_dsps,
)
from .blocks import range_shape, tree_levels

__all__ = [
    "lut_product", "product", "is_ecp5", "ecp5_registered_product", "ecp5_packed_products",
    "is_ice40", "sb_mac16_instance", "sb_mac16", "sb_mac16_pair", "mult18x18d",
    "mult18x18d_pair", "one_dsp", "MUL_CHUNK", "LUT_MUL_CHUNK", "LUT_CHUNKS", "DIGIT_CHUNK",
    "mul_chunks", "times3_range", "digit_partial_products", "DIGIT_MIN_BITS", "digit_terms",
    "carry_save_sum", "operand_chunks", "partial_products", "partial_factors",
    "TABLE_DIGIT_BITS", "TABLE_PRODUCT_MAX_BITS", "table_product",
]

#: Bits of a digit of :func:`table_product`: a table of 16 constants is one LUT4 a bit.
TABLE_DIGIT_BITS = 4

#: Widest operand :func:`table_product` takes (two tables and one adder).
TABLE_PRODUCT_MAX_BITS = 8


def table_product(x, const: int):
    """``x * const`` for a narrow signal ``x`` and an integer constant, from tables: ``x`` cut
    into :data:`TABLE_DIGIT_BITS`-bit digits (the top one signed if ``x`` is), each digit's
    multiples of ``const`` a table of constants (one LUT4 per output bit), the tables'
    values shifted and added. An 8-bit input times a 24-bit constant is two tables and one
    carry chain: about 90 LUTs and three logic levels, where a ``*`` takes two unregistered
    ECP5 DSPs and an adder (13.3 ns on a ResNet-8 build) or, in LUTs, an adder per set bit
    of the constant."""
    n, signed_x = len(x), x.shape().signed
    total = None
    for lo in range(0, n, TABLE_DIGIT_BITS):
        width = min(TABLE_DIGIT_BITS, n - lo)
        top = signed_x and lo + width == n
        digits = [d - (1 << width) if top and d >> (width - 1) else d
                  for d in range(1 << width)]
        values = [d * int(const) for d in digits]
        shape = range_shape(min(values), max(values))
        term = Array([C(v, shape) for v in values])[x[lo:lo + width]]
        term = term << lo if lo else term
        total = term if total is None else total + term
    return total


def lut_product(a, b):
    """``a * b`` (same value and shape as Amaranth's ``*``) as a sum of shifted partial
    products selected by the bits of the narrower operand, so that synthesis never turns it
    into a hard multiplier."""
    if len(a) > len(b):
        a, b = b, a
    shape = (a * b).shape()
    n = len(a)
    if n == 0:
        return C(0, shape)
    terms = [Mux(a[i], b << i, 0) for i in range(n - 1)]
    top = Mux(a[n - 1], b << (n - 1), 0)
    total = sum(terms, C(0, 1))
    total = total - top if a.shape().signed else total + top
    bits = total[:shape.width]
    return bits.as_signed() if shape.signed else bits


def product(a, b, *, lut=False):
    """``a * b``: :func:`lut_product` if ``lut`` or if the narrower operand has at most
    :data:`LUT_PRODUCT_MAX_BITS` bits, otherwise a plain ``*``."""
    if lut or min(len(a), len(b)) <= LUT_PRODUCT_MAX_BITS:
        return lut_product(a, b)
    return a * b


def is_ecp5(platform) -> bool:
    from amaranth.vendor import LatticePlatform
    return isinstance(platform, LatticePlatform) and platform.family == "ecp5"


def ecp5_registered_product(platform, a, b) -> bool:
    """Whether :class:`MatVecCore` elaborated for ``platform`` computes ``a * b`` (operands of
    the shapes of ``a`` and ``b``) in a ``MULT18X18D`` with its input and output registers:
    on ECP5, for a product :func:`product` leaves to a hard multiplier, when both operands
    fit 18 bits (as unsigned or signed values, as they are)."""
    return is_ecp5(platform) and ecp5_dsp_product(Shape.cast(a), Shape.cast(b))


def ecp5_packed_products(platform, a, b) -> bool:
    """Whether two MatVec products ``x * w0`` and ``x * w1`` with one input ``x`` (operands of
    the shapes ``a`` and ``b``) may share one ``MULT18X18D``: on ECP5, for products that take
    a registered one (:func:`ecp5_registered_product`), when ``x`` is unsigned and
    ``x.width + 2 * w.width`` bits fit its 18-bit operand. The DSP then multiplies ``x`` by
    ``w0' + w1' * 2**k`` (``k = x.width + w.width``, ``w'`` the weight plus ``2**(w.width-1)``
    if signed, so that both fields are non-negative): the two fields of the product are
    ``x * w0'`` and ``x * w1'`` without carries between them."""
    a, b = Shape.cast(a), Shape.cast(b)
    return (ecp5_registered_product(platform, a, b) and not a.signed
            and a.width + 2 * b.width <= ECP5_DSP_BITS)


def is_ice40(platform) -> bool:
    from amaranth.vendor import LatticeICE40Platform
    return isinstance(platform, LatticeICE40Platform)


def sb_mac16_instance(m: Module, name: str, ce, signed_a: bool, signed_b: bool,
                       mode_8x8: bool):
    """An ``SB_MAC16`` with its A and B input registers and its product registers (the
    second 16 x 16 pipeline register, or in the 8 x 8 mode both 8 x 8 product registers),
    clock ``sync``, enable ``ce``: returns its A and B inputs (16 bits each, for the caller
    to drive) and its output O (32 bits, the product or products). nextpnr-ice40 times an
    SB_MAC16's ports as register ports whatever its parameters say, so only a DSP registered
    at both ends has a true Fmax (see :func:`onnx2fpga.boards.pnr.ice40_dsp_timing_gaps`);
    yosys infers them without registers, which is why inference stays off."""
    a16 = Signal(ICE40_DSP_BITS, name=f"{name}_a")
    b16 = Signal(ICE40_DSP_BITS, name=f"{name}_b")
    o32 = Signal(2 * ICE40_DSP_BITS, name=f"{name}_o")
    ports = {"i_CLK": ClockSignal("sync"), "i_CE": ce, "i_A": a16, "i_B": b16,
             "i_C": C(0, 16), "i_D": C(0, 16), "o_O": o32}
    for port in ("AHOLD", "BHOLD", "CHOLD", "DHOLD", "IRSTTOP", "IRSTBOT", "ORSTTOP",
                 "ORSTBOT", "OLOADTOP", "OLOADBOT", "ADDSUBTOP", "ADDSUBBOT", "OHOLDTOP",
                 "OHOLDBOT", "CI", "ACCUMCI", "SIGNEXTIN"):
        ports[f"i_{port}"] = C(0, 1)
    one, zero = C(1, 1), C(0, 1)
    pair = one if mode_8x8 else zero
    select = C(2 if mode_8x8 else 3, 2)         # 8 x 8 products, or the 16 x 16 product
    m.submodules[name] = Instance(
        "SB_MAC16",
        p_NEG_TRIGGER=zero, p_C_REG=zero, p_A_REG=one, p_B_REG=one, p_D_REG=zero,
        p_TOP_8x8_MULT_REG=pair, p_BOT_8x8_MULT_REG=pair,
        p_PIPELINE_16x16_MULT_REG1=zero, p_PIPELINE_16x16_MULT_REG2=zero if mode_8x8 else one,
        p_TOPOUTPUT_SELECT=select, p_TOPADDSUB_LOWERINPUT=C(0, 2),
        p_TOPADDSUB_UPPERINPUT=zero, p_TOPADDSUB_CARRYSELECT=C(0, 2),
        p_BOTOUTPUT_SELECT=select, p_BOTADDSUB_LOWERINPUT=C(0, 2),
        p_BOTADDSUB_UPPERINPUT=zero, p_BOTADDSUB_CARRYSELECT=C(0, 2),
        p_MODE_8x8=pair, p_A_SIGNED=C(int(signed_a), 1), p_B_SIGNED=C(int(signed_b), 1),
        **ports)
    return a16, b16, o32


def sb_mac16(m: Module, a, b, ce, name: str):
    """``a * b`` out of an iCE40 ``SB_MAC16`` in its 16 x 16 mode registered at both ends
    (:func:`sb_mac16_instance`): the product of the operands of two clock edges before, as
    the fabric registers ``a_r <= a; p <= a_r * b_r`` of the platform-free Verilog."""
    shape = (a * b).shape()
    a16, b16, o32 = sb_mac16_instance(m, name, ce, a.shape().signed, b.shape().signed,
                                       False)
    m.d.comb += [a16.eq(a), b16.eq(b)]      # sign- or zero-extended; A_SIGNED/B_SIGNED say
    bits = o32[:shape.width]
    return bits.as_signed() if shape.signed else bits


def sb_mac16_pair(m: Module, a0, b0, a1, b1, ce, name: str):
    """``(a0 * b0, a1 * b1)`` out of one iCE40 ``SB_MAC16`` in its 8 x 8 mode (operands of
    at most 8 bits; ``a0`` and ``a1`` of one shape, ``b0`` and ``b1`` of another): the
    bottom multiplier takes the first product, the top one the second, each registered as
    in :func:`sb_mac16`. A product of two 8-bit operands fits the 16 bits each half puts
    out (its true value, read with the product's signedness)."""
    shape = (a0 * b0).shape()
    a16, b16, o32 = sb_mac16_instance(m, name, ce, a0.shape().signed, b0.shape().signed,
                                       True)
    m.d.comb += [a16[:8].eq(a0), a16[8:].eq(a1), b16[:8].eq(b0), b16[8:].eq(b1)]
    width = min(shape.width, 16)
    outs = []
    for half in (o32[:16], o32[16:]):
        bits = half[:width]
        outs.append(bits.as_signed() if shape.signed else bits)
    return outs


def mult18x18d(m: Module, a, b, ce, name: str):
    """``a * b`` out of an ECP5 ``MULT18X18D`` whose A and B inputs and P output are
    registered in the DSP (clock ``sync``, enable ``ce``): the value is the product of the
    operands of two clock edges before, as with the registers ``a_r <= a; p <= a_r * b_r``
    in fabric, which is what the emitted, platform-free Verilog does. yosys never packs
    fabric flip-flops into an ECP5 DSP, and an unregistered one (register -> route ->
    multiplier -> route -> register) was the jet tagger's critical path at 12.4 ns."""
    shape = (a * b).shape()
    a18 = Signal(ECP5_DSP_BITS, name=f"{name}_a")
    b18 = Signal(ECP5_DSP_BITS, name=f"{name}_b")
    p36 = Signal(2 * ECP5_DSP_BITS, name=f"{name}_p")
    # Sign- or zero-extended as the operand's shape says; SIGNEDA/B tell the DSP which.
    m.d.comb += [a18.eq(a), b18.eq(b)]
    # The cascade inputs (SRIA, SRIB) and the clock and control banks 1-3 stay unconnected:
    # tied to 0 they are arcs of the constant net that general routing cannot reach (nextpnr
    # failed to route the jet tagger's design so).
    ports = {"i_SIGNEDA": int(a.shape().signed), "i_SIGNEDB": int(b.shape().signed),
             "i_SOURCEA": 0, "i_SOURCEB": 0,
             "i_CLK0": ClockSignal("sync"), "i_CE0": ce, "i_RST0": 0}
    for i in range(ECP5_DSP_BITS):
        ports.update({f"i_A{i}": a18[i], f"i_B{i}": b18[i], f"i_C{i}": 0})
    for i in range(2 * ECP5_DSP_BITS):
        ports[f"o_P{i}"] = p36[i]
    m.submodules[name] = Instance(
        "MULT18X18D",
        p_REG_INPUTA_CLK="CLK0", p_REG_INPUTA_CE="CE0", p_REG_INPUTA_RST="RST0",
        p_REG_INPUTB_CLK="CLK0", p_REG_INPUTB_CE="CE0", p_REG_INPUTB_RST="RST0",
        p_REG_INPUTC_CLK="NONE", p_REG_PIPELINE_CLK="NONE",
        p_REG_OUTPUT_CLK="CLK0", p_REG_OUTPUT_CE="CE0", p_REG_OUTPUT_RST="RST0",
        p_GSR="DISABLED", p_RESETMODE="SYNC", p_SOURCEB_MODE="B_SHIFT", p_MULT_BYPASS="DISABLED",
        p_CAS_MATCH_REG="FALSE", p_HIGHSPEED_CLK="NONE",
        p_CLK0_DIV="ENABLED", p_CLK1_DIV="ENABLED", p_CLK2_DIV="ENABLED", p_CLK3_DIV="ENABLED",
        **ports)
    bits = p36[:shape.width]
    return bits.as_signed() if shape.signed else bits


def mult18x18d_pair(m: Module, x, w0, w1, ce, name: str):
    """``(x * w0 + off * x, x * w1 + off * x)`` out of one registered ``MULT18X18D``
    (:func:`mult18x18d`), ``x`` unsigned, ``w0`` and ``w1`` of one shape that
    :func:`ecp5_packed_products` allows, ``off`` ``2**(w.width-1)`` for signed weights and 0
    for unsigned: the DSP multiplies ``x`` by ``w0' + w1' * 2**k`` with ``w' = w + off`` (the
    sign bit inverted) and ``k = x.width + w.width``, and the product's two ``k``-bit fields
    are ``x * w0'`` and ``x * w1'``, each less than ``2**k``. The caller subtracts ``off * x``
    from their sums."""
    width = len(w0)
    k = len(x) + width

    def biased(w):
        return Cat(w[:-1], ~w[-1]) if w.shape().signed else w.as_unsigned()
    a = Cat(biased(w0), C(0, k - width), biased(w1))
    p = mult18x18d(m, a, x, ce, name)
    return p[:k], p[k:2 * k]


def one_dsp(px, pm) -> bool:
    """Whether yosys gives the product ``px * pm`` (``pm`` an int for a constant, ``None``
    for no product) exactly one ECP5 multiplier: then a :func:`mult18x18d` takes its place
    with the same count (see :func:`onnx2fpga.plan.devices.multiplier_dsps`)."""
    if pm is None:
        return False
    if not isinstance(pm, int) and min(len(px), len(pm)) <= LUT_PRODUCT_MAX_BITS:
        return False                    # a LUT product (see partial_products)
    b_bits = const_multiplier_bits(pm) if isinstance(pm, int) else len(pm)
    return max(len(px), b_bits) <= ECP5_DSP_BITS and \
        multiplier_dsps(len(px), b_bits, "ecp5") == 1


#: Operand bits per partial product of :class:`RequantCore`: a 16-bit unsigned chunk or a
#: signed top chunk of at most 16 bits fits one iCE40 SB_MAC16 (16x16) and one ECP5
#: MULT18X18D (18x18 signed).
MUL_CHUNK = 16


#: Multiplier bits per partial product on iCE40, whose multipliers are built of LUTs (DSP
#: inference is opt-in there: see ``boards.build``): the whole accumulator times 8 bits of
#: the multiplier, 8 rows of a LUT multiplier per cycle instead of 16. The first stage
#: uses :data:`DIGIT_CHUNK` instead (:func:`digit_partial_products`).
LUT_MUL_CHUNK = 8


LUT_MUL_CHUNK = 8
LUT_CHUNKS = (None, LUT_MUL_CHUNK)


#: Multiplier bits per partial product of :func:`digit_partial_products`: two radix-4 digits,
#: so that a partial product is one carry chain over two selected multiples of ``x``.
DIGIT_CHUNK = 4


def mul_chunks(platform) -> tuple:
    """``(x_chunk, m_chunk)`` for :func:`partial_products` when elaborating for
    ``platform``: ``(None, 8)`` (``x`` whole) on iCE40; ``(18, 18)`` on ECP5, whose
    ``MULT18X18D`` takes 18-bit operands signed or unsigned (:func:`mult18x18d` sets
    ``SIGNEDA``/``SIGNEDB`` by the piece's shape), so that an 18-bit input times a 24-bit
    multiplier takes two DSPs instead of four; ``(16, 16)`` otherwise (the emitted
    Verilog: one iCE40 SB_MAC16 each). The pipeline is the same either way: only how a
    product is cut into partial products differs, never a value or a cycle."""
    from amaranth.vendor import LatticeICE40Platform
    if isinstance(platform, LatticeICE40Platform):
        return LUT_CHUNKS
    if is_ecp5(platform):
        return ECP5_DSP_BITS, ECP5_DSP_BITS
    return MUL_CHUNK, MUL_CHUNK


def times3_range(shape: Shape) -> tuple[int, int]:
    """The range of ``3 * x`` for ``x`` of ``shape``."""
    shape = Shape.cast(shape)
    lo = -(1 << (shape.width - 1)) if shape.signed else 0
    hi = (1 << (shape.width - 1)) - 1 if shape.signed else (1 << shape.width) - 1
    return 3 * lo, 3 * hi


def digit_partial_products(x, x3, mult):
    """``x * mult`` as ``(shift, product)`` pairs, given ``x3 == 3 * x`` (a register): every
    unsigned :data:`DIGIT_CHUNK`-bit chunk of ``mult`` gives one product, the sum of its
    radix-4 digits' multiples of ``x`` (0, x, 2x or 3x: a multiplexer each, then one carry
    chain); a signed top chunk is multiplied as in :func:`partial_products`."""
    if isinstance(mult, int):
        return partial_products(x, mult)
    products = []
    for shift, piece in operand_chunks(mult, DIGIT_CHUNK):
        if piece.shape().signed:
            products.append((shift, x * piece))
            continue
        terms = []
        for d in range(0, len(piece), 2):
            if len(piece) - d == 1:
                term = Mux(piece[d], x, 0)
            else:
                term = Mux(piece[d + 1], Mux(piece[d], x3, x << 1), Mux(piece[d], x, 0))
            terms.append(term if d == 0 else term << d)
        products.append((shift, tree_levels(terms)[0]))
    return products


#: Weights of at least this many bits are multiplied through :func:`digit_terms` on iCE40.
DIGIT_MIN_BITS = 4


def digit_terms(x, x3, x_neg, w):
    """``x * w`` as a list of terms whose sum it is, given ``x3 == 3 * x`` and
    ``x_neg == -x`` (registers): one multiplexer per radix-4 digit of ``w`` picks 0, x, 2x or
    3x (a signed top digit of two bits: 0, x, -2x or -x; of one bit: 0 or -x), shifted to the
    digit's place."""
    signed_w = w.shape().signed
    n = len(w)
    terms = []
    for d in range(0, n, 2):
        top = d + 2 >= n
        if n - d == 1:
            term = Mux(w[d], x_neg if signed_w else x, 0)
        elif top and signed_w:
            term = Mux(w[d + 1], Mux(w[d], x_neg, x_neg << 1), Mux(w[d], x, 0))
        else:
            term = Mux(w[d + 1], Mux(w[d], x3, x << 1), Mux(w[d], x, 0))
        terms.append(term if d == 0 else term << d)
    return terms


def carry_save_sum(m, terms, shape, name):
    """The sum of ``terms`` as a value of ``shape`` (which holds the exact sum): 3:2
    compressors (two LUTs per bit, no carry chain) reduce the terms to two, one adder adds
    those. Modulo ``2**shape.width`` every step is exact, and the sum fits the shape."""
    width = shape.width
    rows = []
    for n, term in enumerate(terms):
        row = Signal(width, name=f"{name}_in{n}")
        m.d.comb += row.eq(term)        # sign- or zero-extended to the full width
        rows.append(row)
    level = 0
    while len(rows) > 2:
        nxt = []
        for i in range(0, len(rows) - 2, 3):
            a, b, c = rows[i:i + 3]
            s = Signal(width, name=f"{name}_s{level}_{i // 3}")
            cy = Signal(width, name=f"{name}_c{level}_{i // 3}")
            m.d.comb += [s.eq(a ^ b ^ c), cy.eq(((a & b) | (a & c) | (b & c)) << 1)]
            nxt += [s, cy]
        nxt += rows[len(rows) - len(rows) % 3:]
        rows, level = nxt, level + 1
    total = (rows[0] + rows[1])[:width]
    return total.as_signed() if shape.signed else total


def operand_chunks(value, size):
    """``value`` cut into ``(shift, piece)`` of at most ``size`` bits (``None``: whole)
    from the least significant end; every piece is unsigned but the top one, which keeps
    the sign."""
    shape = value.shape()
    width = shape.width
    size = size or width
    pieces = []
    for lo in range(0, width, size):
        hi = min(lo + size, width)
        if lo == 0 and hi == width:
            return [(0, value)]
        piece = value[lo:hi]
        if hi == width and shape.signed:
            piece = piece.as_signed()
        pieces.append((lo, piece))
    return pieces


def partial_products(x, mult, chunks=(MUL_CHUNK, MUL_CHUNK)):
    """``x * mult`` as ``(shift, product)`` pairs whose shifted sum is the product (see
    :func:`partial_factors`); a piece times a table's piece of at most
    :data:`LUT_PRODUCT_MAX_BITS` bits (the 2-bit top of an 18-bit cut) is a LUT product
    (:func:`product`), not a hard multiplier of its own."""
    return [(shift, px if pm is None else px * C(pm) if isinstance(pm, int) else product(px, pm))
            for shift, px, pm in partial_factors(x, mult, chunks)]


def partial_factors(x, mult, chunks=(MUL_CHUNK, MUL_CHUNK)):
    """``x * mult`` as ``(shift, px, pm)`` triples whose products ``px * pm``, shifted, sum
    to it (``pm`` an int for a constant; ``None`` when ``px`` is the product itself): a
    table-read (signal) multiplier gives a product of every pair of :func:`operand_chunks` of both
    operands, cut at ``chunks = (x_chunk, m_chunk)`` bits; so does a constant (int) one
    when ``x`` is cut too (hard multipliers: a 24 x 24-bit constant product was one
    ``*`` that yosys split over four MULT18X18D joined by a carry chain in the same cycle,
    16 ns on an ECP5; its pieces now each have a register), zero pieces left out; otherwise
    a constant gives one product (none for 1 or 0: ``x`` or 0)."""
    x_chunk, m_chunk = chunks
    if isinstance(mult, int):
        if mult in (0, 1):
            return [(0, x if mult == 1 else C(0, 1), None)]
        if x_chunk is None:
            return [(0, x, mult)]
        shape = C(mult).shape()
        pieces = []
        for lo in range(0, shape.width, m_chunk):
            hi = min(lo + m_chunk, shape.width)
            top = hi == shape.width
            # The top piece keeps the sign (an arithmetic shift), the others are unsigned.
            piece = mult >> lo if top and shape.signed else (mult >> lo) & ((1 << (hi - lo)) - 1)
            if piece:
                pieces.append((lo, piece))
        return [(sx + sm, px, pm) for sx, px in operand_chunks(x, x_chunk) for sm, pm in pieces]
    return [(sx + sm, px, pm) for sx, px in operand_chunks(x, x_chunk)
            for sm, pm in operand_chunks(mult, m_chunk)]
