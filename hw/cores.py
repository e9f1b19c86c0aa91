"""Streaming operator cores: matrix-vector unit, requantization, FIFO, width converter.

Every core is a :class:`amaranth.lib.wiring.Component` with an ``i_stream`` and an ``o_stream``
port built from :class:`amaranth.lib.stream.Signature` with an
:class:`~amaranth.lib.data.ArrayLayout` payload of ``lanes`` elements (element ``j`` of a
transfer is lane ``j``). All follow the rules of :mod:`amaranth.lib.stream`: ``valid`` never
waits on ``ready`` and the payload holds until it is transferred, so they take any stall
pattern on either side without losing or duplicating data.

The integer semantics are those of :mod:`onnx2fpga.sim.golden`, bit for bit. The cycle figures
documented here are the ones :mod:`onnx2fpga.hw.cost` reports.
"""

from __future__ import annotations

import functools
import operator
from math import gcd

import numpy as np
from amaranth import (
    C,
    Cat,
    ClockSignal,
    Const,
    Instance,
    Module,
    Mux,
    Shape,
    Signal,
    Value,
    signed,
    unsigned,
)
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..ir import DenseLayer, IntType, RequantStage
from . import cost

__all__ = ["MatVecCore", "RequantCore", "StreamFIFO", "WidthConverter", "int_shape"]


def _quiet_if_invalid(init):
    """Decorate a component's ``__init__`` so that a rejected parameter raises without an
    ``UnusedElaboratable`` warning later: an object that failed to construct is no design."""
    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except (TypeError, ValueError):
            self._MustUse__used = True      # the flag amaranth._unused.MustUse checks
            raise
    return wrapper


# ---------------------------------------------------------------------------------------------
# Helpers


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


def _shape_range(shape: Shape) -> tuple[int, int]:
    if shape.signed:
        return -(1 << (shape.width - 1)), (1 << (shape.width - 1)) - 1
    return 0, (1 << shape.width) - 1


def _range_shape(lo: int, hi: int) -> Shape:
    """The narrowest shape holding every integer of ``[lo, hi]``."""
    if lo >= 0:
        return unsigned(max(1, hi.bit_length()))
    return signed(max((-lo - 1).bit_length(), hi.bit_length()) + 1)


def _check_count(name: str, value, minimum: int = 1) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {value!r}")
    return int(value)


def _check_lanes(lanes, channels: int) -> int:
    """``lanes`` checked as a count that divides ``channels`` (already checked)."""
    lanes = _check_count("Lanes", lanes)
    if channels % lanes:
        raise ValueError(f"Lanes must divide channels={channels}, not {lanes}")
    return lanes


def _tree_sum(terms: list, op=operator.add):
    """Combine ``terms`` with ``op`` (a sum by default) as a balanced tree (log depth instead
    of a chain)."""
    return _tree_levels(terms, op=op)[0]


def _tree_levels(terms: list, levels=None, op=operator.add) -> list:
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


def _registered_tree(m: Module, terms: list, per_stage: list, en, name, one_shape=None) -> list:
    """An adder tree over ``terms`` in ``len(per_stage)`` register stages, each loaded while
    ``en``: stage ``n`` adds ``per_stage[n]`` levels, the last stage the rest. The registers
    of stage ``n`` are named ``name(n, i)``; where a stage leaves one term, its register takes
    ``one_shape`` if given (modular sums in an accumulator's width). Returns the last stage's
    registers."""
    for n, levels in enumerate(per_stage):
        terms = _tree_levels(terms, levels if n < len(per_stage) - 1 else None)
        regs = [Signal(one_shape if one_shape is not None and len(terms) == 1
                       else Shape.cast(t.shape()), name=name(n, i), reset_less=True)
                for i, t in enumerate(terms)]
        with m.If(en):
            m.d.sync += [r.eq(t) for r, t in zip(regs, terms)]
        terms = regs
    return terms


#: A product whose narrower operand has at most this many bits is built from shifted partial
#: products (adders in LUTs) instead of a ``*``, which yosys would give a hard multiplier
#: (ECP5 maps every product of at least 2 x 2 bits to a MULT18X18D). Low-bit layers then
#: take LUTs, and the device's multipliers stay for wide products.
LUT_PRODUCT_MAX_BITS = 4


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


#: Products per share of :class:`MatVecCore`'s data registers with an enable of their own, and
#: the most shares.
_PRODUCTS_PER_SHARE = 8
_MAX_SHARES = 32


#: Operand width of an ECP5 ``MULT18X18D``.
ECP5_DSP_BITS = 18


def _is_ecp5(platform) -> bool:
    from amaranth.vendor import LatticePlatform
    return isinstance(platform, LatticePlatform) and platform.family == "ecp5"


def ecp5_registered_product(platform, a, b) -> bool:
    """Whether :class:`MatVecCore` elaborated for ``platform`` computes ``a * b`` (operands of
    the shapes of ``a`` and ``b``) in a ``MULT18X18D`` with its input and output registers:
    on ECP5, for a product :func:`product` leaves to a hard multiplier, when both operands
    fit 18 bits (as unsigned or signed values, as they are)."""
    a, b = Shape.cast(a), Shape.cast(b)
    return (_is_ecp5(platform) and min(a.width, b.width) > LUT_PRODUCT_MAX_BITS
            and max(a.width, b.width) <= ECP5_DSP_BITS)


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


#: Operand bits of an iCE40 ``SB_MAC16`` in its 16 x 16 mode.
ICE40_DSP_BITS = 16


def _is_ice40(platform) -> bool:
    from amaranth.vendor import LatticeICE40Platform
    return isinstance(platform, LatticeICE40Platform)


def ice40_registered_product(a, b) -> bool:
    """Whether a MatVec product ``a * b`` (operands of the shapes of ``a`` and ``b``) may go
    to a registered ``SB_MAC16`` (:class:`MatVecCore`'s ``ice40_dsp``): a product
    :func:`product` leaves to a hard multiplier (both operands wider than
    :data:`LUT_PRODUCT_MAX_BITS`) whose operands fit 16 bits and whose value fits 24 bits.
    The bound keeps to what the DSP's models agree on: yosys' simulation model of the 16 x 16
    mode adds its 8 x 8 partial products without sign-extending them to 32 bits, so its top
    byte differs from the true product's when a partial product is negative."""
    a, b = Shape.cast(a), Shape.cast(b)
    return min(a.width, b.width) > LUT_PRODUCT_MAX_BITS and \
        max(a.width, b.width) <= ICE40_DSP_BITS and a.width + b.width <= 24


def ice40_paired_product(a, b) -> bool:
    """Whether two such products share one ``SB_MAC16`` in its 8 x 8 mode (its top and
    bottom 8 x 8 multipliers, each with its own product register): both operands fit 8
    bits. The DSPs a MatVec of ``n`` products takes are then ``ceil(n / 2)``."""
    a, b = Shape.cast(a), Shape.cast(b)
    return ice40_registered_product(a, b) and max(a.width, b.width) <= 8


def ice40_matvec_dsps(simd: int, pe: int, a, b) -> int:
    """SB_MAC16s of a MatVec of ``simd * pe`` products of operands of the shapes ``a`` and
    ``b`` with ``ice40_dsp`` (0 if its products may not take them)."""
    n = simd * pe
    if not ice40_registered_product(a, b):
        return 0
    return -(-n // 2) if ice40_paired_product(a, b) else n


def _sb_mac16_instance(m: Module, name: str, ce, signed_a: bool, signed_b: bool,
                       mode_8x8: bool):
    """An ``SB_MAC16`` with its A and B input registers and its product registers (the
    second 16 x 16 pipeline register, or in the 8 x 8 mode both 8 x 8 product registers),
    clock ``sync``, enable ``ce``: returns its A and B inputs (16 bits each, for the caller
    to drive) and its output O (32 bits, the product or products). nextpnr-ice40 times an
    SB_MAC16's ports as register ports whatever its parameters say, so only a DSP registered
    at both ends has a true Fmax (see :func:`onnx2fpga.boards.build._ice40_dsp_timing_gaps`);
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


def _sb_mac16(m: Module, a, b, ce, name: str):
    """``a * b`` out of an iCE40 ``SB_MAC16`` in its 16 x 16 mode registered at both ends
    (:func:`_sb_mac16_instance`): the product of the operands of two clock edges before, as
    the fabric registers ``a_r <= a; p <= a_r * b_r`` of the platform-free Verilog."""
    shape = (a * b).shape()
    a16, b16, o32 = _sb_mac16_instance(m, name, ce, a.shape().signed, b.shape().signed,
                                       False)
    m.d.comb += [a16.eq(a), b16.eq(b)]      # sign- or zero-extended; A_SIGNED/B_SIGNED say
    bits = o32[:shape.width]
    return bits.as_signed() if shape.signed else bits


def _sb_mac16_pair(m: Module, a0, b0, a1, b1, ce, name: str):
    """``(a0 * b0, a1 * b1)`` out of one iCE40 ``SB_MAC16`` in its 8 x 8 mode (operands of
    at most 8 bits; ``a0`` and ``a1`` of one shape, ``b0`` and ``b1`` of another): the
    bottom multiplier takes the first product, the top one the second, each registered as
    in :func:`_sb_mac16`. A product of two 8-bit operands fits the 16 bits each half puts
    out (its true value, read with the product's signedness)."""
    shape = (a0 * b0).shape()
    a16, b16, o32 = _sb_mac16_instance(m, name, ce, a0.shape().signed, b0.shape().signed,
                                       True)
    m.d.comb += [a16[:8].eq(a0), a16[8:].eq(a1), b16[:8].eq(b0), b16[8:].eq(b1)]
    width = min(shape.width, 16)
    outs = []
    for half in (o32[:16], o32[16:]):
        bits = half[:width]
        outs.append(bits.as_signed() if shape.signed else bits)
    return outs


def _mult18x18d(m: Module, a, b, ce, name: str):
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


def _mult18x18d_pair(m: Module, x, w0, w1, ce, name: str):
    """``(x * w0 + off * x, x * w1 + off * x)`` out of one registered ``MULT18X18D``
    (:func:`_mult18x18d`), ``x`` unsigned, ``w0`` and ``w1`` of one shape that
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
    p = _mult18x18d(m, a, x, ce, name)
    return p[:k], p[k:2 * k]


def _one_dsp(px, pm) -> bool:
    """Whether yosys gives the product ``px * pm`` (``pm`` an int for a constant, ``None``
    for no product) exactly one ECP5 multiplier: then a :func:`_mult18x18d` takes its place
    with the same count (see :func:`onnx2fpga.hw.resources.multiplier_dsps`)."""
    from .resources import const_multiplier_bits, multiplier_dsps
    if pm is None:
        return False
    b_bits = const_multiplier_bits(pm) if isinstance(pm, int) else len(pm)
    return max(len(px), b_bits) <= ECP5_DSP_BITS and \
        multiplier_dsps(len(px), b_bits, "ecp5") == 1


#: Words per bank of a weight ROM in soft logic (:func:`_banked_rom`): a LUT4 holds 16
#: words and each further address bit is a level of 2:1 multiplexers (iCE40 has no wider
#: multiplexer primitive), so a bank is read through 3 LUT levels. TFC_2W2A's 4096 x 2
#: weight ROM on an iCE40 UP5K read in one
#: step (9 levels) closed at 31.6 MHz; in banks of 256 words (5 levels) at 36.4 MHz, the
#: bank read still its critical path (27.5 ns, 15 of them routing: each address bit reaches
#: hundreds of LUTs).
LOGIC_ROM_BANK_WORDS = 64


def logic_rom_banks(depth: int) -> int:
    """Banks of a ``depth``-word ROM in soft logic read in two steps by :func:`_banked_rom`:
    ``ceil(depth / LOGIC_ROM_BANK_WORDS)`` banks of :data:`LOGIC_ROM_BANK_WORDS` words (the
    second step picks one through a level of 2:1 multiplexers per bit of the bank number,
    a short path from registers nearby); 1 (one step) up to twice that many words."""
    if depth <= 2 * LOGIC_ROM_BANK_WORDS:
        return 1
    return -(-depth // LOGIC_ROM_BANK_WORDS)


def _banked_rom(m: Module, name: str, layout, words: list, addr_lo=()):
    """A ROM of ``words`` (values of ``layout``) in :func:`logic_rom_banks` memories
    ``{name}_bank{n}`` of :data:`LOGIC_ROM_BANK_WORDS` words each (the last one filled with
    zeros), read in two register steps: returns ``(rd, data)``,
    where ``rd`` takes ``addr`` and ``en`` as a memory read port does, and ``data`` is the
    word one enabled clock edge later as from a read port, but picked among the banks' read
    data by registered high address bits: the caller registers it (the second step).
    ``addr_lo``: copies of ``addr``'s low bits (the address in a bank) that the caller keeps
    equal to them on every cycle, each reaching a share of the banks instead of one address
    reaching all of them.
    """
    bank_words = LOGIC_ROM_BANK_WORDS
    bank_bits = bank_words.bit_length() - 1
    depth = len(words)
    banks = logic_rom_banks(depth)
    addr = Signal(range(max(depth, 2)), name=f"{name}_addr")
    en = Signal(name=f"{name}_en")
    hi = Signal(range(max(banks, 2)), name=f"{name}_hi")
    with m.If(en):
        m.d.sync += hi.eq(addr >> bank_bits)
    datas = []
    for n in range(banks):
        mem = _flat_memory(layout, bank_words, words[n * bank_words:(n + 1) * bank_words])
        m.submodules[f"{name}_bank{n}"] = mem
        rd = mem.read_port()
        lo = addr_lo[n * len(addr_lo) // banks] if addr_lo else addr[:bank_bits]
        m.d.comb += [rd.addr.eq(lo), rd.en.eq(en)]
        datas.append(rd.data)
    level = 0
    while len(datas) > 1:       # a balanced tree of 2:1 multiplexers on the bits of `hi`
        datas = [Mux(hi[level], datas[i + 1], datas[i]) if i + 1 < len(datas) else datas[i]
                 for i in range(0, len(datas), 2)]
        level += 1
    return _ReadPort(addr, en), datas[0]


class _WritePort:
    """The ``addr``, ``data`` and ``en`` of a write port that is no memory's."""

    def __init__(self, addr, data, en):
        self.addr, self.data, self.en = addr, data, en


class _ReadPort:
    """The ``addr`` and ``en`` of a read port that is no memory's (:func:`_banked_rom`)."""

    def __init__(self, addr, en):
        self.addr, self.en = addr, en


def _counter(modulo: int) -> Signal:
    """A counter register for ``0 .. modulo-1``, at least 1 bit wide (no zero-width wires in
    the Verilog when ``modulo`` is 1)."""
    return Signal(range(max(modulo, 2)), src_loc_at=1)     # named after the caller's variable


def _wrap_incr(counter: Signal, modulo: int):
    """``counter + 1`` modulo ``modulo``."""
    if modulo <= 1:
        return C(0, 1)
    return Mux(counter == modulo - 1, 0, counter + 1)


def _output_register(m: Module, o_stream, o_valid: Signal, layout) -> Signal:
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


def _skid_output(m: Module, o_stream, valid, payload, free_copy=False):
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
    flags = [skid_full]
    if free_copy:
        flags.append(Signal(name="skid_full_copy"))
    for flag in flags:
        with m.If(flag):
            with m.If(o_stream.ready):
                m.d.sync += flag.eq(0)
        with m.Elif(valid & ~o_stream.ready):
            m.d.sync += flag.eq(1)
    return ~(valid & flags[-1])


#: Block RAMs per column slice of a MatVec weight ROM on an ECP5 (:func:`_rom_columns`).
ROM_SLICE_BLOCKS = 4


def _rom_columns(platform, words: list, width: int) -> list:
    """Bit ranges ``[(lo, hi), ...]`` of the column slices a weight ROM of ``words`` (ints of
    ``width`` bits) is built from: on an ECP5, when yosys would put it in more than
    :data:`ROM_SLICE_BLOCKS` block RAMs, slices of that many blocks' native width counted in
    the columns that vary (yosys drops a ROM's constant columns, per memory), the last slice
    the rest (joined to the one before where it would be left to LUTs); otherwise one
    range. Only when every slice still takes block RAMs and all of
    them no more than the whole ROM: TFC_2W2A's 64-word ROMs cut by plain bit ranges fell
    into LUTs (27 fewer DP16KD, 3,500 more LUTs)."""
    whole = [(0, width)]
    if not _is_ecp5(platform) or not words:
        return whole
    from .resources import memory_mapping, varying_columns
    varying = varying_columns(words)
    depth = len(words)
    mm = memory_mapping(max(1, varying.bit_count()), depth, "ecp5", rom=True)
    if mm.kind != "block" or mm.cells <= ROM_SLICE_BLOCKS:
        return whole
    step = ROM_SLICE_BLOCKS * mm.width
    cols, lo, count = [], 0, 0
    for bit in range(width):
        count += (varying >> bit) & 1
        if count == step:
            cols.append((lo, bit + 1))
            lo, count = bit + 1, 0
    if lo < width:
        cols.append((lo, width))
    if len(cols) > 1:
        # A narrow rest would fall into LUTs alone: it joins the slice before it.
        rest = (varying >> cols[-1][0]).bit_count()
        if memory_mapping(max(1, rest), depth, "ecp5", rom=True).kind != "block":
            cols[-2:] = [(cols[-2][0], width)]
    cells = 0
    for c_lo, c_hi in cols:
        bits = ((varying >> c_lo) & ((1 << (c_hi - c_lo)) - 1)).bit_count()
        part = memory_mapping(max(1, bits), depth, "ecp5", rom=True)
        if part.kind != "block" and bits:
            return whole
        cells += part.cells
    return cols if cells <= mm.cells else whole


def _flat_memory(layout, depth: int, init) -> Memory:
    """A ROM of plain ``unsigned(width)`` words holding the values ``init`` of ``layout``
    (read its data through ``layout(port.data)``).

    A memory of a nested :class:`~amaranth.lib.data.ArrayLayout` gets per-field alias wires
    named like ``data[0][3]``, which collide with bit 3 of the alias ``data[0]`` when yosys
    0.70 re-imports the netlist from ABC: a block RAM output bit ending up on two nets made
    the ECP5 build fail ("multiple conflicting drivers") once the data went straight into
    flip-flops. Plain words have no aliases.
    """
    width = Shape.cast(layout).width
    return Memory(shape=unsigned(width), depth=depth,
                  init=[Const.cast(layout.const(v)).value for v in init])


def _double_buffer_writer(m: Module, i_stream, wr, words: int, data=None, registered=False):
    """The write side of a double buffer: a memory of two banks of ``words`` words (bank 0 at
    ``[0, words)``, bank 1 at ``[words, 2*words)``) that ``i_stream`` fills in turn.

    Each transfer is written through the write port ``wr`` (its payload, or ``data`` computed
    from it); ``i_stream.ready`` is high while
    the bank being written is not full. A bank becomes full with its last word and empty when
    the reader is done with it (:func:`_double_buffer_release`, added once the reader is built).
    With ``registered``, the write reaches the memory a cycle later, from registers (enable,
    address, data), so that the transfer's enable net does not reach every cell of a memory
    in LUTs: for a reader that reads a full bank's words in order from its first, one a cycle
    at the earliest, which then finds its last word written when ``words >= 2``, and
    otherwise through a read port transparent to ``wr``.

    Returns
    -------
    full : (Signal, Signal)
        ``full[b]``: bank ``b`` holds a whole block the reader has not finished (the registers
        ``full0`` and ``full1``).
    fill : (Value, Value)
        ``fill[b]``: the last word of bank ``b`` is written in this cycle.
    """
    full0 = Signal()
    full1 = Signal()
    wb = Signal()                               # the bank being written
    waddr = _counter(2 * words)                 # the address over both banks
    m.d.comb += i_stream.ready.eq(~Mux(wb, full1, full0))
    write = i_stream.valid & i_stream.ready
    wr_data = i_stream.payload if data is None else data
    if registered:
        en_r = Signal()
        addr_r = Signal.like(waddr)
        data_r = Signal(len(Value.cast(wr_data)), reset_less=True)
        m.d.sync += [en_r.eq(write), addr_r.eq(waddr), data_r.eq(wr_data)]
        m.d.comb += [wr.addr.eq(addr_r), wr.data.eq(data_r), wr.en.eq(en_r)]
    else:
        m.d.comb += [wr.addr.eq(waddr), wr.data.eq(wr_data), wr.en.eq(write)]
    set0 = write & (waddr == words - 1)
    set1 = write & (waddr == 2 * words - 1)
    with m.If(write):
        m.d.sync += waddr.eq(_wrap_incr(waddr, 2 * words))
        with m.If(set0):
            m.d.sync += wb.eq(1)
        with m.If(set1):
            m.d.sync += wb.eq(0)
    return (full0, full1), (set0, set1)


def _double_buffer_release(m: Module, full, fill, done, rb):
    """The ``full`` flags of :func:`_double_buffer_writer`: bank ``b`` becomes full with
    ``fill[b]`` and empty when the reader, reading bank ``rb``, is ``done`` with it."""
    (full0, full1), (set0, set1) = full, fill
    with m.If(set0):
        m.d.sync += full0.eq(1)
    with m.Elif(done & ~rb):
        m.d.sync += full0.eq(0)
    with m.If(set1):
        m.d.sync += full1.eq(1)
    with m.Elif(done & rb):
        m.d.sync += full1.eq(0)


# ---------------------------------------------------------------------------------------------
# Matrix-vector unit


class MatVecCore(wiring.Component):
    """Folded matrix-vector unit of a :class:`~onnx2fpga.ir.DenseLayer`.

    Computes ``acc = x @ layer.weight.T + layer.folded_bias`` on the raw input integers (the
    input zero point is folded into the bias). ``layer.requant`` is not applied here: see
    :class:`RequantCore`.

    The weights live in a ROM (:class:`~amaranth.lib.memory.Memory`) with one word per
    (output group ``g``, input fold ``f``) holding the ``pe * simd`` weights
    ``weight[g*pe + p, f*simd + s]``; the folded bias in a second ROM with one word per group.
    The input vector is written into one of two banks of an input buffer while the other bank
    is being computed on (ping-pong), so loading vector ``n+1`` overlaps computing vector ``n``.

    Parameters
    ----------
    layer : DenseLayer
        The layer. ``in_features % simd == 0`` and ``out_features % pe == 0``; the weights must
        lie within ``layer.weight_type``.
    arithmetic : str, optional
        See below.
    w_logic : bool
        The weights go into soft logic (a board build sets yosys' ``logic_block``): a ROM of
        more than 128 words is then :func:`logic_rom_banks` memories ``w_mem_bank{n}`` of
        :data:`LOGIC_ROM_BANK_WORDS` words, read
        in two steps (the banks at the low address bits, then one picked by the high bits
        into the operand register), instead of one ``w_mem`` whose read is one deep LUT
        tree. The same values and cycles.
    x_logic : bool
        The input buffer goes into soft logic: it is then no memory but two shift registers
        of ``folds`` words, one per bank of the double buffer. A bank shifts a word in at
        each input transfer and rotates by one word at each step of the reader, which
        reads its last word: no read multiplexer and no write decoding, a flip-flop per
        bit and a few LUTs where a RAM in flip-flops takes about one LUT per bit (TFC_2W2A's
        128 x 2 buffers on an iCE40: 376 LUTs each, and a 7-level read that was its
        critical path). The same values and cycles.
    ice40_dsp : bool
        Elaborated for an iCE40, the products (when :func:`ice40_registered_product`) go to
        ``SB_MAC16`` cells registered at both ends (:func:`_sb_mac16`), one per product, or
        two per DSP in its 8 x 8 mode for operands of at most 8 bits
        (:func:`ice40_paired_product`, :func:`ice40_matvec_dsps`),
        in place of the operand and product registers; otherwise an iCE40 builds them in
        LUTs. The same values and cycles. The graph sets it within the design's budget of
        DSPs (:attr:`Dataflow.ice40_dsps <onnx2fpga.ir.Dataflow>`).

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(in_shape, simd)))``
        The input vector, ``simd`` elements of ``layer.in_type`` per transfer, in feature order:
        transfer ``f`` carries ``x[f*simd .. f*simd+simd-1]``.
    o_stream : ``Out(stream.Signature(data.ArrayLayout(signed(acc_bits), pe)))``
        The accumulators, ``pe`` channels per transfer in channel order: transfer ``g`` carries
        channels ``g*pe .. g*pe+pe-1``. ``acc_bits`` is ``layer.acc_type.bits``.

    Timing: with ``folds = in_features // simd`` and ``groups = out_features // pe``, the core
    takes one (group, fold) step per cycle; the steady-state initiation interval is
    ``folds * groups`` cycles (``layer.cycles``) when the output is not stalled. Computing
    starts once a whole vector is buffered; the last output transfer of a vector comes
    ``folds * groups + 1 + d`` cycles after its last input transfer, where
    ``d = cost.matvec_stages(simd)`` counts the pipeline registers (memory data, operand
    registers, products, and one adder-tree stage per two adder levels: 4 for
    ``simd <= 4``, 5 up to 16, 6 up to 64), so ``latency = folds + folds * groups + d``
    cycles from the first input transfer to the last output transfer when the input arrives
    at one transfer per cycle. Every multiplier and adder-tree stage sits between registers
    so that a board build reaches 100 MHz on ECP5. Elaborated for an iCE40 platform (LUT
    multipliers), or on any platform when ``layer.multipliers`` is ``"lut"`` (no hard
    multiplier; folding picks it for layers a device's DSPs cannot hold), weights of 4 or
    more bits are multiplied without a multiplier: the input
    buffer also holds ``3 * x`` and ``-x``, the operand registers hold the multiples of ``x``
    that the weight's radix-4 digits pick (0, x, 2x, 3x; -x, -2x for a signed top digit), and
    each product is their carry-save sum; the same values on the same cycles.
    Elaborated for an ECP5, hard products are registered ``MULT18X18D``; with one input
    transfer per vector (``folds == 1``), an unsigned input and operands that
    :func:`ecp5_packed_products` allows (6-bit inputs and weights, say), PEs ``2i`` and
    ``2i+1`` share one per input lane (:func:`_mult18x18d_pair`), and the sum of the inputs,
    in an adder tree of its own, corrects their accumulators through the bias register; the
    same values on the same cycles, half the DSPs.
    The accumulator register is the output register, with a skid register behind it: an
    output the consumer does not take moves to the skid register, and the pipeline holds
    only while both are full, so that ``ready`` reaches no pipeline enable.

    Arithmetic (``arithmetic``; the default is
    :func:`onnx2fpga.hw.graph.matvec_arithmetic` of the layer), with the same pipeline and
    the same cycle figures in every case:

    - ``"multiply"``: ``simd * pe`` multipliers ``x * w``.
    - ``"sign"``: every weight is -1 or +1 (stored as one bit, 1 for +1): ``x * w`` is
      ``x`` or ``-x``, a multiplexer and a negation instead of a multiplier.
    - ``"xnor"``: weights and inputs are all -1 or +1 (``layer.in_bipolar``; the input
      type signed, at least 2 bits): an input is buffered as one bit (1 for +1, its sign
      bit inverted), a (group, fold) step is ``pe`` XNORs of ``simd`` bits and their
      popcounts, and ``sum_i x_i * w_i = 2 * popcount(xnor(x, w)) - in_features`` (the
      ``- in_features`` is folded into the bias). An input other than -1 or +1 gives a
      wrong result.
    """

    @_quiet_if_invalid
    def __init__(self, layer: DenseLayer, *, arithmetic=None, w_logic=False, x_logic=False,
                 ice40_dsp=False):
        if not isinstance(layer, DenseLayer):
            raise TypeError(f"Layer must be a DenseLayer, not {layer!r}")
        simd = _check_count(f"SIMD of layer {layer.name!r}", layer.simd)
        pe = _check_count(f"PE of layer {layer.name!r}", layer.pe)
        if layer.in_features < 1 or layer.out_features < 1:
            raise ValueError(f"Weight of layer {layer.name!r} must not be empty, "
                             f"not of shape {layer.weight.shape}")
        if layer.in_features % simd:
            raise ValueError(f"SIMD of layer {layer.name!r} must divide in_features="
                             f"{layer.in_features}, not {simd}")
        if layer.out_features % pe:
            raise ValueError(f"PE of layer {layer.name!r} must divide out_features="
                             f"{layer.out_features}, not {pe}")
        wt = layer.weight_type
        if wt.bits > 32:
            raise ValueError(f"Weight type of layer {layer.name!r} must be at most 32 bits wide, "
                             f"not {wt.name}")
        if layer.weight.min() < wt.lo or layer.weight.max() > wt.hi:
            raise ValueError(f"Weights of layer {layer.name!r} must lie within {wt.name}, not "
                             f"[{int(layer.weight.min())}, {int(layer.weight.max())}]")
        from .graph import matvec_arithmetic
        if arithmetic is None:
            arithmetic = matvec_arithmetic(layer)
        if arithmetic not in ("multiply", "sign", "xnor"):
            raise ValueError(f"Arithmetic must be 'multiply', 'sign' or 'xnor', "
                             f"not {arithmetic!r}")
        if arithmetic != "multiply" and not np.all(np.abs(layer.weight) == 1):
            raise ValueError(f"Weights of layer {layer.name!r} must all be -1 or +1 for "
                             f"arithmetic={arithmetic!r}")
        if arithmetic == "xnor" and not (layer.in_type.signed and layer.in_type.bits >= 2):
            raise ValueError(f"Input type of layer {layer.name!r} must be signed and at least "
                             f"2 bits wide for arithmetic='xnor', not {layer.in_type.name}")
        self._arithmetic = arithmetic
        self._layer = layer
        self._w_banks = logic_rom_banks(self.groups * self.folds) if w_logic else 1
        self._x_logic = bool(x_logic)
        self._ice40_dsp = bool(ice40_dsp)
        self._in_shape = int_shape(layer.in_type)
        self._w_shape = int_shape(wt)
        self._acc_shape = signed(layer.acc_type.bits)
        super().__init__({
            "i_stream": In(stream.Signature(data.ArrayLayout(self._in_shape, simd))),
            "o_stream": Out(stream.Signature(data.ArrayLayout(self._acc_shape, pe))),
        })

    @property
    def layer(self) -> DenseLayer:
        return self._layer

    @property
    def arithmetic(self) -> str:
        """``"multiply"``, ``"sign"`` or ``"xnor"`` (see the class docstring)."""
        return self._arithmetic

    @property
    def folds(self) -> int:
        """Input transfers per vector, ``in_features // simd``."""
        return self._layer.in_features // self._layer.simd

    @property
    def groups(self) -> int:
        """Output transfers per vector, ``out_features // pe``."""
        return self._layer.out_features // self._layer.pe

    @property
    def latency(self) -> int:
        """Cycles from the first input transfer to the last output transfer of one vector."""
        return cost.matvec_latency(self.folds, self.groups, self._layer.simd)

    @property
    def w_banks(self) -> int:
        """Banks of the weight ROM: 1, or :func:`logic_rom_banks` with ``w_logic``."""
        return self._w_banks

    @property
    def x_logic(self) -> bool:
        """The input buffer is a pair of shift registers (``x_logic``), not a memory."""
        return self._x_logic

    def _weight_words(self) -> list:
        w = self._layer.weight
        simd, pe = self._layer.simd, self._layer.pe
        if self._arithmetic != "multiply":       # one bit per weight, 1 for +1
            return [[sum(1 << s for s in range(simd) if w[g * pe + p, f * simd + s] > 0)
                     for p in range(pe)]
                    for g in range(self.groups) for f in range(self.folds)]
        return [[[int(w[g * pe + p, f * simd + s]) for s in range(simd)] for p in range(pe)]
                for g in range(self.groups) for f in range(self.folds)]

    def elaborate(self, platform):
        m = Module()
        simd, pe = self._layer.simd, self._layer.pe
        folds, groups = self.folds, self.groups
        acc_shape = self._acc_shape
        i_stream, o_stream = self.i_stream, self.o_stream

        xnor = self._arithmetic == "xnor"
        # Input buffer: bank 0 at [0, folds), bank 1 at [folds, 2*folds). XNOR: one bit per
        # element, 1 for +1.
        # LUT multipliers (iCE40), weights of 4 or more bits: the buffer also holds 3x and -x,
        # and the multiples of x that the weight's radix-4 digits pick (0, x, 2x, 3x; -x, -2x
        # for a signed top digit) are registered straight from the memories; the product is
        # their carry-save sum. No multiplier, and no more logic levels per stage.
        lut = self._layer.multipliers == "lut"
        # iCE40 with ice40_dsp: every product in a registered SB_MAC16.
        mac16 = (self._ice40_dsp and _is_ice40(platform) and not lut
                 and self._arithmetic == "multiply"
                 and ice40_registered_product(self._in_shape, self._w_shape))
        paired = mac16 and ice40_paired_product(self._in_shape, self._w_shape)
        digits = (self._arithmetic == "multiply" and self._w_shape.width >= _DIGIT_MIN_BITS
                  and (lut or _mul_chunks(platform) == _LUT_CHUNKS) and not mac16)
        x_elem = self._in_shape
        if digits:
            x_elem = data.StructLayout({
                "x": self._in_shape, "x3": _range_shape(*_times3_range(self._in_shape)),
                "xn": signed(self._in_shape.width + 1)})
        x_layout = unsigned(simd) if xnor else data.ArrayLayout(x_elem, simd)
        if not self._x_logic:
            m.submodules.x_mem = x_mem = Memory(shape=x_layout, depth=2 * folds, init=[])
            x_wr = x_mem.write_port()
            # Writes reach the buffer a cycle late from registers (see below); with one word
            # per bank the reader may read a word in the cycle it is written, so the read is
            # transparent to the write.
            x_rd = x_mem.read_port(transparent_for=(x_wr,) if folds == 1 else ())
            x_rdata = x_rd.data
        else:
            x_width = Shape.cast(x_layout).width
            x_rd = _ReadPort(Signal(range(max(2 * folds, 2)), name="x_mem_addr"),
                             Signal(name="x_mem_en"))
            x_wr = _WritePort(Signal(range(max(2 * folds, 2)), name="x_mem_waddr"),
                              Signal(x_width, name="x_mem_wdata"), Signal(name="x_mem_wen"))
            x_bits = Signal(x_width, name="x_mem_data", reset_less=True)
            x_rdata = x_bits if xnor else x_layout(x_bits)
        w_elem = self._w_shape if self._arithmetic == "multiply" else unsigned(simd)
        w_layout = data.ArrayLayout(w_elem, pe) if self._arithmetic != "multiply" else \
            data.ArrayLayout(data.ArrayLayout(w_elem, simd), pe)
        words = self._weight_words()
        # Read enables of the weight ROM's column slices on an ECP5 (see the end of
        # elaborate): [] when it is one memory.
        w_slice_adv = []
        # (The words as ints only where they may be sliced.)
        flat = [Const.cast(w_layout.const(v)).value for v in words] \
            if self._w_banks == 1 and _is_ecp5(platform) else []
        w_cols = _rom_columns(platform, flat, Shape.cast(w_layout).width)
        if len(w_cols) > 1:
            # Column slices of a few block RAMs each, each read with its own replica of the
            # stall state: kwsmlp_w3a3's 768-bit weight word in 22 DP16KD, all enabled by one
            # net, was a 10.1 ns critical path on an ECP5 85F (the net spread over the die).
            pieces = []
            for k, (lo, hi) in enumerate(w_cols):
                mem = Memory(shape=unsigned(hi - lo), depth=groups * folds,
                             init=[(v >> lo) & ((1 << (hi - lo)) - 1) for v in flat])
                m.submodules[f"w_mem_col{k}"] = mem
                rd = mem.read_port()
                adv = Signal(name=f"w_mem_col{k}_en")
                m.d.comb += rd.en.eq(adv)
                pieces.append(rd)
                w_slice_adv.append(adv)
            w_rd = _ReadPort(Signal(range(max(groups * folds, 2)), name="w_mem_addr"),
                             Signal(name="w_mem_en"))
            for rd in pieces:
                m.d.comb += rd.addr.eq(w_rd.addr)
            w_data = Cat(rd.data for rd in pieces)
        elif self._w_banks == 1:
            m.submodules.w_mem = w_mem = _flat_memory(w_layout, groups * folds, words)
            w_rd = w_mem.read_port()
            w_data = w_rd.data
        else:
            # Weights in soft logic, read in two steps: S1 reads every bank at the address's
            # low bits, S2 (the operand register) picks one by its high bits.
            # The address counter's low bits in copies, each reaching 8 banks: one register
            # reaching all 64 banks of TFC_2W2A's 4096 x 2 weights on an iCE40 UP5K took
            # 4.7 ns of routing of its critical path (26.4 ns).
            w_lo = [Signal(LOGIC_ROM_BANK_WORDS.bit_length() - 1, name=f"w_mem_lo_{k}")
                    for k in range(-(-self._w_banks // 8))]
            w_rd, w_data = _banked_rom(m, "w_mem", w_layout, words, addr_lo=w_lo)

        # -- Write side: fill the banks in turn; full0/full1: a whole vector not yet consumed.
        # XNOR stores the sign bits (1 for +1).
        x_data = Cat(~i_stream.payload[s][-1] for s in range(simd)) if xnor else \
            i_stream.payload
        if digits:
            x_data = Cat(Cat(v, (v + (v << 1))[:x_elem["x3"].shape.width],
                             (-v)[:x_elem["xn"].shape.width])
                         for v in (i_stream.payload[s] for s in range(simd)))
        # Registered writes: the transfer's enable reaching every write enable of an input
        # buffer in LUT RAM was 3.3 ns of the jet tagger's full0 -> full1 path (10.6 ns), and
        # of its flip-flops (one word per bank) 3.8 ns of wb -> full0 (10.9 ns).
        # A shift register takes its writes at once: a bank is read from its last word,
        # which the last write puts there.
        full, fill = _double_buffer_writer(m, i_stream, x_wr, folds, data=x_data,
                                           registered=not self._x_logic)
        full0, full1 = full

        # -- Read side: one (group g, fold f) step per cycle from bank `rb`.
        advance = Signal()      # the pipeline shifts (driven at the end)
        mem_adv = Signal()      # equal to it: the memory reads and their data registers
        rb = Signal()
        raddr = _counter(2 * folds)
        waddr_w = _counter(groups * folds)
        f = _counter(folds)
        g = _counter(groups)
        issue = Mux(rb, full1, full0) & advance
        f_last = f == folds - 1
        g_last = g == groups - 1
        done = issue & f_last & g_last     # last step on this bank: it may be refilled
        m.d.comb += [
            x_rd.addr.eq(raddr), x_rd.en.eq(mem_adv),
            w_rd.addr.eq(waddr_w), w_rd.en.eq(mem_adv),
        ]
        if self._w_banks > 1:
            with m.If(issue):
                for lo in w_lo:
                    m.d.sync += lo.eq(Mux(f_last & g_last, 0, lo + 1))
        with m.If(issue):
            with m.If(f_last):
                m.d.sync += f.eq(0)
                with m.If(g_last):
                    m.d.sync += [g.eq(0), rb.eq(~rb), raddr.eq(Mux(rb, 0, folds)),
                                 waddr_w.eq(0)]
                with m.Else():
                    m.d.sync += [g.eq(g + 1), raddr.eq(Mux(rb, folds, 0)),
                                 waddr_w.eq(waddr_w + 1)]
            with m.Else():
                m.d.sync += [f.eq(f + 1), raddr.eq(raddr + 1), waddr_w.eq(waddr_w + 1)]
        _double_buffer_release(m, full, fill, done, rb)
        if self._x_logic:
            # Bank b holds its words with fold 0 last: a write shifts one in at the front, a
            # step of the reader (fold f, reading the last word) rotates the last word to the
            # front, so that fold f+1 comes last. A bank is written only while it is not
            # full and read only while it is: never both at once. `folds` rotations (one
            # output group) leave the words as they were.
            x_banks = [[Signal(x_width, name=f"x_buf{b}_{i}", reset_less=True)
                        for i in range(folds)] for b in range(2)]
            for b, buf in enumerate(x_banks):
                write = x_wr.en & ((x_wr.addr >= folds) if b else (x_wr.addr < folds))
                with m.If(write | (issue & (rb == b))):
                    m.d.sync += [buf[i].eq(buf[i - 1]) for i in range(1, folds)]
                    m.d.sync += buf[0].eq(Mux(write, x_wr.data, buf[-1]))
            # The read register, as a memory read port's: loaded while the reads advance.
            with m.If(x_rd.en):
                m.d.sync += x_bits.eq(Mux(rb, x_banks[1][-1], x_banks[0][-1]))

        # -- Pipeline: S1 memory data, S2 the same in registers (a block RAM's output is slow:
        # about 5.8 ns clock-to-out on ECP5, more than a multiplier leaves of a 10 ns cycle),
        # S3 products (a multiplier between registers, which yosys or the DSP can retime),
        # then the adder tree in `tree_stages` register stages of at most
        # `cost.ADDER_LEVELS_PER_STAGE` levels each; its last register feeds the accumulator.
        tree_stages = cost.matvec_tree_stages(simd)
        n_stages = 3 + tree_stages
        s_valid = [Signal(name=f"s{n + 1}_valid") for n in range(n_stages)]
        s_first = [Signal(name=f"s{n + 1}_first") for n in range(n_stages)]
        s_last = [Signal(name=f"s{n + 1}_last") for n in range(n_stages)]
        s_g = [_counter(groups) for _ in range(n_stages)]
        # Data registers have no reset (here and below): only the valid flags and counters
        # need one, and a reset net reaching every data flip-flop was the jet tagger's
        # critical path on an ECP5 (13 ns from the power-on counter).
        x_word = Signal.like(x_rdata, name="x_word", reset_less=True)
        w_bits = Signal(len(w_data), name="w_word", reset_less=True)
        w_word = w_layout(w_bits)
        # Enables of the data registers: `advance` reaching every one of them (about 10,000
        # in the jet tagger's LUT-product layers) was a net of 11-12 ns on an ECP5. A wide
        # core splits its products into shares of _PRODUCTS_PER_SHARE, each enabled by its own
        # replica of the stall state (see the end of elaborate): equal to `advance` on every
        # cycle, but a net of a few hundred flip-flops.
        n_shares = min(_MAX_SHARES, pe * simd // _PRODUCTS_PER_SHARE)
        share_adv = [Signal(name=f"advance_{k}") for k in range(n_shares)] \
            if n_shares > 1 else [advance]

        def adv_of(p, s):
            return share_adv[(p * simd + s) * len(share_adv) // (pe * simd)]
        if digits:
            # S2 holds the picked multiples, terms[p][s][n] (digit n of weight (p, s)).
            terms = [[None] * simd for _ in range(pe)]
            for p in range(pe):
                for s in range(simd):
                    values = _digit_terms(x_rdata[s].x, x_rdata[s].x3, x_rdata[s].xn,
                                          w_layout(w_data)[p][s])
                    terms[p][s] = [Signal(Shape.cast(v.shape()), name=f"term_{p}_{s}_{n}",
                                          reset_less=True)
                                   for n, v in enumerate(values)]
                    with m.If(adv_of(p, s)):
                        m.d.sync += [r.eq(v) for r, v in zip(terms[p][s], values)]
        if self._arithmetic == "multiply":
            xs = [x_word[s].x if digits else x_word[s] for s in range(simd)]
            prod_values = [[product(xs[s], w_word[p][s], lut=lut) for s in range(simd)]
                           for p in range(pe)]
        elif self._arithmetic == "sign":
            neg_shape = signed(self._in_shape.width + 1)
            prod_values = [[Mux(w_word[p][s], x_word[s], -x_word[s]) for s in range(simd)]
                           for p in range(pe)]
        else:
            prod_values = [[~(x_word ^ w_word[p])] for p in range(pe)]
        # ECP5: every product in a registered MULT18X18D (all of them or none).
        dsp = mac16 or (self._arithmetic == "multiply" and not digits and not lut and
                        ecp5_registered_product(platform, self._in_shape, self._w_shape))
        # ECP5, one input transfer per vector: PEs 2i and 2i+1 share a MULT18X18D per input
        # lane (ecp5_packed_products), which halves the DSPs; the jet tagger's 64 x 32 layer
        # took 19,000 LUTs as LUT products where its 128 products found no DSPs. Each packed
        # product is off * x too large (off: _mult18x18d_pair): its accumulator starts from
        # the bias less off times the sum of the inputs.
        pairs = pe // 2 if (dsp and not mac16 and folds == 1 and
                            ecp5_packed_products(platform, self._in_shape,
                                                 self._w_shape)) else 0
        w_off = (1 << (self._w_shape.width - 1)) if pairs and self._w_shape.signed else 0
        prods = [[Signal(neg_shape if self._arithmetic == "sign" else
                         (xs[s] * w_word[p][s]).shape() if self._arithmetic == "multiply"
                         else Shape.cast(v.shape()), name=f"prod_{p}_{s}", reset_less=True)
                  for s, v in enumerate(row)]
                 for p, row in enumerate(prod_values)]
        # Products in fabric whose weight is 0 in every word (an input no output uses, such
        # as the border pixels of an MNIST image: 231 of TFC_2W2A's 784) are left out of the
        # adder tree. yosys drops them anyway; left in, they made the LUT estimate of
        # TFC_2W2A's first layer 30 % too high.
        zero = [[False] * simd for _ in range(pe)]
        if self._arithmetic == "multiply" and not dsp and not digits:
            wz = (self._layer.weight.reshape(groups, pe, folds, simd) == 0).all(axis=(0, 2))
            zero = [[bool(wz[p, s]) for s in range(simd)] for p in range(pe)]
        for p in range(2 * pairs):      # a packed product's field: x * (w + off) >= 0
            prods[p] = [Signal(self._in_shape.width + self._w_shape.width, name=f"prod_{p}_{s}",
                               reset_less=True) for s in range(simd)]
        if w_slice_adv:
            # Each slice's part of the operand register loads with the slice's own enable.
            with m.If(mem_adv):
                m.d.sync += x_word.eq(x_rdata)
            for (lo, hi), adv in zip(w_cols, w_slice_adv):
                with m.If(adv):
                    m.d.sync += w_bits[lo:hi].eq(w_data[lo:hi])
        else:
            with m.If(mem_adv):
                m.d.sync += [x_word.eq(x_rdata), w_bits.eq(w_data)]
        with m.If(advance):
            m.d.sync += [s_valid[0].eq(issue), s_first[0].eq(f == 0), s_last[0].eq(f_last),
                         s_g[0].eq(g)]
            for n in range(1, n_stages):
                m.d.sync += [s_valid[n].eq(s_valid[n - 1]), s_first[n].eq(s_first[n - 1]),
                             s_last[n].eq(s_last[n - 1]), s_g[n].eq(s_g[n - 1])]
        if paired:
            # Two products per SB_MAC16 (its 8 x 8 mode), in (p, s) order; an odd last one
            # takes the bottom half with zero operands on top.
            flat = [(p, s) for p in range(pe) for s in range(simd)]
            for k in range(0, len(flat), 2):
                (p0, s0), *rest = flat[k:k + 2]
                a0, b0 = x_rdata[s0], w_layout(w_data)[p0][s0]
                a1, b1 = ((x_rdata[rest[0][1]], w_layout(w_data)[rest[0][0]][rest[0][1]])
                          if rest else (C(0, a0.shape()), C(0, b0.shape())))
                outs = _sb_mac16_pair(m, a0, b0, a1, b1, adv_of(p0, s0),
                                      f"mul_{p0}_{s0}")
                for (p, s), out in zip(flat[k:k + 2], outs):
                    m.d.comb += prods[p][s].eq(out)
        for p in range(pe):
            for s, (prod, value) in enumerate(zip(prods[p], prod_values[p])):
                if paired:
                    continue
                if p < 2 * pairs:
                    if p % 2 == 0:
                        lo, hi = _mult18x18d_pair(m, x_rdata[s], w_layout(w_data)[p][s],
                                                  w_layout(w_data)[p + 1][s], adv_of(p, s),
                                                  f"mul_{p}_{s}")
                        m.d.comb += [prods[p][s].eq(lo), prods[p + 1][s].eq(hi)]
                    continue
                if dsp:
                    # The S2 registers and the product register are the DSP's own (fed from
                    # the S1 memory data, enabled as the fabric registers): same cycles, and
                    # the multiplier sits between registers inside the DSP.
                    hard = _sb_mac16 if mac16 else _mult18x18d
                    m.d.comb += prod.eq(hard(m, x_rdata[s], w_layout(w_data)[p][s],
                                             adv_of(p, s), f"mul_{p}_{s}"))
                    continue
                if digits:
                    value = _carry_save_sum(m, terms[p][s], prod.shape(),
                                            f"prod_{p}_{s}_csa")
                if zero[p][s]:
                    continue
                with m.If(adv_of(p, s)):
                    m.d.sync += prod.eq(value)
        # Sums and the accumulator wrap modulo 2**acc_bits: exact, because the final value
        # lies within acc_type (two's complement addition is modular).
        # Adder levels per tree stage: ADDER_LEVELS_PER_STAGE, the last stage the rest. Fed
        # by DSPs the first stage takes the rest instead (one level where the level count is
        # odd): the route out of a DSP block is long (7.3 ns of the jet tagger's 10.8 ns
        # critical path, DSP output -> two adder levels). The same stages and cycles.
        levels = (simd - 1).bit_length()
        per_stage = [cost.ADDER_LEVELS_PER_STAGE] * (tree_stages - 1)
        per_stage.append(max(0, levels - sum(per_stage)))
        if dsp:
            # One level behind the DSPs, the last stage the rest: a packed DSP of the jet
            # tagger's 64-term trees placed 37 columns from its adders took 4.9 ns of routing,
            # then two levels: 9.8 ns.
            per_stage.reverse()
            if tree_stages > 1:
                per_stage[0] = min(per_stage[0], 1)
        sums = []
        for p in range(pe):
            if xnor:        # 2 * popcount; the -in_features sits in the bias
                terms = [prods[p][0][s] for s in range(simd)]
            else:
                terms = [t for t, z in zip(prods[p], zero[p]) if not z] or [C(0, 1)]
            terms = _registered_tree(m, terms, per_stage, adv_of(p, 0),
                                     lambda n, i, p=p: f"sum{n}_{p}_{i}",
                                     None if xnor else acc_shape)
            sums.append(Cat(C(0, 1), terms[0]) if xnor else terms[0])
        s3_valid, s3_first, s3_last = s_valid[-1], s_first[-1], s_last[-1]

        bias_words = self._layer.folded_bias.reshape(groups, pe)
        if xnor:
            bias_words = bias_words - self._layer.in_features
        if groups > 1:
            # Read one stage early and registered, so that no block RAM output meets the adder
            # (two stages early with packed products: their correction takes one more).
            m.submodules.b_mem = b_mem = Memory(
                shape=data.ArrayLayout(acc_shape, pe), depth=groups,
                init=[[int(v) for v in row] for row in bias_words])
            b_rd = b_mem.read_port()
            m.d.comb += [b_rd.addr.eq(s_g[-4] if w_off else s_g[-3]), b_rd.en.eq(mem_adv)]
            b_word = Signal.like(b_rd.data, name="b_word", reset_less=True)
            with m.If(mem_adv):
                m.d.sync += b_word.eq(b_rd.data)
            bias = [b_word[p] for p in range(pe)]
        else:
            bias = [C(int(v), acc_shape) for v in bias_words[0]]
        if w_off:
            # The packed products' correction: the sum of the inputs in an adder tree beside
            # the products' (from the operand register, so one stage shorter), registered
            # with the bias, less off times it, in front of the accumulator.
            xsum = _registered_tree(m, [x_word[s] for s in range(simd)],
                                    [cost.ADDER_LEVELS_PER_STAGE] * tree_stages, advance,
                                    lambda n, i: f"xsum{n}_{i}")
            corr = xsum[0] << (w_off.bit_length() - 1)
            bias_c = [Signal(acc_shape, name=f"bias_c_{p}", reset_less=True) for p in range(pe)]
            with m.If(advance):
                m.d.sync += [b_c.eq(b - corr if p < 2 * pairs else b)
                             for p, (b_c, b) in enumerate(zip(bias_c, bias))]
            bias = bias_c

        # The output: the accumulator, and behind it a skid register (_skid_output). The
        # pipeline stalls only while both are full, so `stall`, which enables every pipeline
        # register, does not depend on `o_stream.ready`.
        acc = Signal(data.ArrayLayout(acc_shape, pe), reset_less=True)
        o_valid = Signal()
        free = _skid_output(m, o_stream, o_valid, acc)
        with m.If(o_valid & free):           # the accumulator left: sent, or to the skid
            m.d.sync += o_valid.eq(0)
        # The stall state's replicas: the pipeline stalls on s3_valid & o_valid & skid_full;
        # each replica holds its own copies of the three flags, updated as the originals are
        # (so they are equal on every cycle, and synthesis does not merge them: each feeds
        # back on itself). A wide core's control (counters, bank flags, memory enables, valid
        # flags) takes one too, so that `o_valid`, which also drives the output, reaches only
        # the output and its skid register: o_valid -> advance -> rb was the jet tagger's
        # critical path once its requantization DSPs were registered (10.4 ns). The memory
        # reads (every output bit of a ROM in LUTs has the enable) take another: the control
        # replica's enable net reaching them was 3.2 ns of the next critical path (11.9 ns).
        if n_shares <= 1 and not w_slice_adv:
            m.d.comb += [advance.eq(~(s3_valid & ~free)), mem_adv.eq(advance)]
        else:
            replicas = [*share_adv, advance, mem_adv] if n_shares > 1 else [advance, mem_adv]
            for k, adv in enumerate([*replicas, *w_slice_adv]):
                v3, ov, sf = (Signal(name=f"{n}_{k}") for n in ("s3_valid", "o_valid",
                                                                    "skid_full"))
                m.d.comb += adv.eq(~(v3 & ov & sf))
                m.d.sync += [v3.eq(Mux(adv, s_valid[-2], v3)),
                             ov.eq((v3 & adv & s3_last) | (ov & sf)),
                             sf.eq(~o_stream.ready & (sf | ov))]
        with m.If(s3_valid & advance):
            for p in range(pe):
                base = bias[p] if folds == 1 else Mux(s3_first, bias[p], acc[p])
                m.d.sync += acc[p].eq(base + sums[p])
            with m.If(s3_last):
                m.d.sync += o_valid.eq(1)
        return m


# ---------------------------------------------------------------------------------------------
# Requantization


class _StagePlan:
    """Compile-time constants and value ranges of one requantization stage.

    ``params`` maps each per-channel parameter of the multiply step (``"m"`` and ``"off"``;
    ``"nm"`` and ``"noff"`` for the negative side of a fused LeakyRelu) to its table
    ``[lane][transfer % period]``, with the input zero point folded into the offsets.
    """

    def __init__(self, stage: RequantStage, channels: int, lanes: int, x_lo: int, x_hi: int):
        izp = int(stage.in_zero_point)

        def per_channel(arr):
            return [int(v) for v in np.broadcast_to(np.asarray(arr).reshape(-1), (channels,))]

        # (x - in_zero_point) * m + off == x * m + (off - in_zero_point * m)
        m_all = per_channel(stage.multiplier)
        off_all = [o - izp * mm for o, mm in zip(per_channel(stage.offset), m_all, strict=True)]
        values = {"m": m_all, "off": off_all}

        # Value range of the product per channel. With negative-side parameters, the input
        # range splits where x * m + off changes sign: the positive side covers one part, the
        # negative side the other (both are intervals: the product is affine in x).
        pos_ranges, neg_ranges = [], []
        if stage.neg_multiplier is None:
            self.use_pos, self.use_neg = True, False
            pos_ranges = [_affine_range(mm, o, x_lo, x_hi) for mm, o in zip(m_all, off_all)]
        else:
            nm_all = per_channel(stage.neg_multiplier)
            noff_all = [o - izp * mm for o, mm in
                        zip(per_channel(stage.neg_offset), nm_all, strict=True)]
            for mm, o, nm, no in zip(m_all, off_all, nm_all, noff_all, strict=True):
                neg, pos = _sign_split(mm, o, x_lo, x_hi)
                if pos is not None:
                    pos_ranges.append(_affine_range(mm, o, *pos))
                if neg is not None:
                    neg_ranges.append(_affine_range(nm, no, *neg))
            # A side that no input reaches needs no hardware.
            self.use_pos, self.use_neg = bool(pos_ranges), bool(neg_ranges)
            if self.use_neg:
                values["nm"], values["noff"] = nm_all, noff_all
            if not self.use_pos:
                del values["m"], values["off"]
        ranges = pos_ranges + neg_ranges
        v_lo = min(lo for lo, _ in ranges)
        v_hi = max(hi for _, hi in ranges)

        period = channels // gcd(channels, lanes)
        self.period = period
        # Lane j of transfer t (modulo the period) is channel (t*lanes + j) % channels.
        self.tables = {name: [[vals[(t * lanes + j) % channels] for t in range(period)]
                              for j in range(lanes)] for name, vals in values.items()}
        self.varies = {name: any(len(set(row)) > 1 for row in table)
                       for name, table in self.tables.items()}
        self.shapes = {name: _range_shape(min(vals), max(vals)) for name, vals in values.items()}
        self.v_shape = _range_shape(v_lo, v_hi)
        self.v_signed = v_lo < 0

        s = int(stage.shift)
        self.shift = s
        self.rounding = stage.rounding
        zp = int(stage.zero_point)
        if s == 0:
            self.const = zp
            w_lo, w_hi = v_lo + zp, v_hi + zp
        elif self.rounding in ("half_even", "half_away"):
            # round_shift(v) + zp == (v + 2**(s-1) - 1 + zp * 2**s + cin) >> s, with
            # cin = bit s of v (half_even) or v >= 0 (half_away); see golden.round_shift.
            self.const = (1 << (s - 1)) - 1 + (zp << s)
            w_lo, w_hi = v_lo + self.const, v_hi + self.const + 1
        else:
            # floor: (v + zp * 2**s) >> s; ceil: (v + 2**s - 1 + zp * 2**s) >> s; to_zero:
            # floor for v >= 0, ceil for v < 0 (the 2**s - 1 is added only to negative v).
            self.const = (zp << s) + ((1 << s) - 1 if self.rounding == "ceil" else 0)
            extra = (1 << s) - 1 if self.rounding == "to_zero" and v_lo < 0 else 0
            w_lo, w_hi = v_lo + self.const, v_hi + self.const + extra
        r_lo, r_hi = w_lo >> s, w_hi >> s
        self.r_shape = _range_shape(r_lo, r_hi)
        self.lo, self.hi = int(stage.lo), int(stage.hi)
        self.clip_lo = r_lo < self.lo
        self.clip_hi = r_hi > self.hi
        self.out_shape = int_shape(stage.out_type)
        self.out_lo, self.out_hi = self.lo, self.hi


def _affine_range(m: int, off: int, lo: int, hi: int) -> tuple[int, int]:
    """The range of ``x * m + off`` for ``x`` in ``[lo, hi]``."""
    return min(lo * m, hi * m) + off, max(lo * m, hi * m) + off


def _sign_split(m: int, off: int, lo: int, hi: int):
    """The parts of ``[lo, hi]`` where ``x * m + off`` is negative and where it is not:
    ``(negative, non_negative)``, each an interval ``(lo, hi)`` or None if empty."""
    if m > 0:
        t = (-off - 1) // m             # the largest x with x * m + off < 0
        neg, pos = (lo, min(hi, t)), (max(lo, t + 1), hi)
    elif m < 0:
        t = off // -m                   # the largest x with x * m + off >= 0
        neg, pos = (max(lo, t + 1), hi), (lo, min(hi, t))
    else:
        neg, pos = ((lo, hi), (1, 0)) if off < 0 else ((1, 0), (lo, hi))
    return (neg if neg[0] <= neg[1] else None), (pos if pos[0] <= pos[1] else None)


class RequantCore(wiring.Component):
    """Pipelined elementwise requantization: every :class:`~onnx2fpga.ir.RequantStage`
    of ``stages`` in order, exactly as :func:`onnx2fpga.sim.golden.requant`::

        y = clip(round_shift((x - in_zero_point) * multiplier[c] + offset[c], shift)
                 + zero_point, lo, hi)

    with ``round_shift`` rounding half to even, half away from zero, down, up or towards
    zero. A stage with
    ``neg_multiplier`` and ``neg_offset`` (a fused LeakyRelu) uses
    ``(x - in_zero_point) * neg_multiplier[c] + neg_offset[c]`` wherever the product above is
    negative: both products are computed side by side in the multiply steps and the sign of
    the first (with its offset) selects one in the offset step, so the pipeline keeps its
    length.
    Per-channel parameters cycle through the channels in stream order: lane ``j`` of
    transfer ``g`` is channel ``(g*lanes + j) % channels`` (a transfer counter restarts every
    ``channels // gcd(channels, lanes)`` transfers). Per-channel tables live in a small ROM per
    stage; parameters equal for every channel of a lane are constants.

    Parameters
    ----------
    stages : list of RequantStage
        At least one stage. ``multiplier`` and ``offset`` (and ``neg_multiplier`` and
        ``neg_offset`` if given) have one entry or ``channels``.
    channels : int
        Number of channels the parameters cycle through.
    lanes : int
        Elements per transfer.
    in_shape : IntType or Amaranth integer shape
        Type of the input elements (for example ``signed(acc_bits)`` after a
        :class:`MatVecCore`).

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(in_shape, lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(out_shape, lanes)))``
        ``out_shape`` is the shape of ``stages[-1].out_type``.

    Timing: one transfer per cycle; latency ``2 + 5 * len(stages)`` cycles (two input
    registers, then per stage: partial products of at most 16x16 bits, their sum, add the
    offset, round and add the zero point, clip; the per-channel parameters reach the
    multipliers from a register, so every multiplier sits between registers). Elaborated
    for an iCE40 platform (LUT multipliers), the first stage's partial products are sums of
    0, x, 2x or 3x picked by the radix-4 digits of 4-bit chunks of the multiplier (``3 * x``
    is registered with the input), a later stage's are the whole input times 8 bits of the
    multiplier, and the partial products are summed in carry-save form; the same values and
    cycles. An
    output that is not taken moves to a skid register; the pipeline stalls as a whole while
    both hold one, and ``i_stream.ready`` is a function of registers only.
    """

    @_quiet_if_invalid
    def __init__(self, stages, channels, lanes, in_shape):
        if not isinstance(stages, (list, tuple)) or not stages:
            raise ValueError(f"Stages must be a non-empty list of RequantStage, not {stages!r}")
        for k, stage in enumerate(stages):
            if not isinstance(stage, RequantStage):
                raise TypeError(f"Stage {k} must be a RequantStage, not {stage!r}")
        channels = _check_count("Channels", channels)
        lanes = _check_count("Lanes", lanes)
        shape = int_shape(in_shape)
        for k, stage in enumerate(stages):
            for what, arr in (("multiplier", stage.multiplier), ("offset", stage.offset),
                              ("neg_multiplier", stage.neg_multiplier),
                              ("neg_offset", stage.neg_offset)):
                if arr is not None and arr.size not in (1, channels):
                    raise ValueError(f"Stage {k} {what} must have 1 or {channels} entries, "
                                     f"not {arr.size}")
            if not isinstance(stage.shift, (int, np.integer)) or stage.shift > 64:
                raise ValueError(f"Stage {k} shift must be an integer from 0 to 64, "
                                 f"not {stage.shift!r}")
        self._stages = list(stages)
        self._channels = channels
        self._lanes = lanes
        self._in_shape = shape
        x_lo, x_hi = _shape_range(shape)
        self._plans = []
        for stage in self._stages:
            plan = _StagePlan(stage, channels, lanes, x_lo, x_hi)
            self._plans.append(plan)
            x_lo, x_hi = plan.out_lo, plan.out_hi
        self._out_shape = self._plans[-1].out_shape
        super().__init__({
            "i_stream": In(stream.Signature(data.ArrayLayout(shape, lanes))),
            "o_stream": Out(stream.Signature(data.ArrayLayout(self._out_shape, lanes))),
        })

    @property
    def stages(self) -> list:
        return list(self._stages)

    @property
    def channels(self) -> int:
        return self._channels

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def in_shape(self) -> Shape:
        return self._in_shape

    @property
    def out_shape(self) -> Shape:
        return self._out_shape

    @property
    def latency(self) -> int:
        """Cycles from an input transfer to the output transfer of the same elements."""
        return cost.requant_latency(len(self._stages))

    def elaborate(self, platform):
        m = Module()
        lanes = self._lanes
        i_stream, o_stream = self.i_stream, self.o_stream
        # One transfer counter serves every stage: they share channels and lanes, and so the
        # period after which the channel pattern repeats.
        period = self._plans[0].period
        t_shape = range(max(period, 2))

        advance = Signal()                  # the pipeline shifts (see _skid_output)
        m.d.comb += i_stream.ready.eq(advance)

        t_in = Signal(t_shape)
        with m.If(i_stream.valid & advance):
            m.d.sync += t_in.eq(_wrap_incr(t_in, period))

        chunks = _mul_chunks(platform)
        lut_mul = chunks == _LUT_CHUNKS
        # Input register, then a second one: each stage's parameters come from its ROM
        # through a register of their own (a block RAM's output is too slow to meet a
        # multiplier in the same cycle), read two stages ahead of their use; `ts[-n]` is the
        # transfer slot of the elements in the register `n - 1` stages before `x`.
        x = Signal(data.ArrayLayout(self._in_shape, lanes), reset_less=True)
        valid = Signal()
        t_cur = Signal(t_shape)
        x1 = Signal.like(x, name="x1", reset_less=True)
        valid1 = Signal()
        t1 = Signal(t_shape)
        with m.If(advance):
            m.d.sync += [x.eq(i_stream.payload), valid.eq(i_stream.valid), t_cur.eq(t_in),
                         x1.eq(x), valid1.eq(valid), t1.eq(t_cur)]
        # LUT multipliers (iCE40): the second input register also holds 3 * x, so that the
        # first stage's products are sums of shifted 0, x, 2x or 3x (radix-4 digits of the
        # multiplier) instead of full LUT multipliers.
        x3 = None
        if lut_mul:
            x3 = [Signal(_range_shape(*_times3_range(self._in_shape)), name=f"x3_{j}",
                         reset_less=True) for j in range(lanes)]
            with m.If(advance):
                m.d.sync += [x3[j].eq(x[j] + (x[j] << 1)) for j in range(lanes)]
        # ECP5: partial products that take one hard multiplier are registered MULT18X18D
        # whose input registers take the place of the registers in front of them (the
        # second input register or the previous stage's output, and the parameter
        # register), so they are fed from the values those registers load: `x_next`,
        # `p_next`. An inferred DSP has no registers (yosys packs none into it), and its
        # route in and out was the jet tagger's critical path on an ECP5 (12.1 ns).
        dsp = _is_ecp5(platform)
        x_next = x
        x, valid, ts = x1, valid1, [t_in, t_cur, t1]

        for k, plan in enumerate(self._plans):
            # Parameters for this stage, read two stages early and registered in `p_word`.
            fields = {name: plan.shapes[name] for name in plan.tables if plan.varies[name]}
            if fields:
                word = data.StructLayout(fields)
                init = [[{name: plan.tables[name][j][t] for name in fields}
                         for j in range(lanes)] for t in range(period)]
                rom = Memory(shape=data.ArrayLayout(word, lanes), depth=period, init=init)
                m.submodules[f"params_{k}"] = rom
                rd = rom.read_port()
                m.d.comb += [rd.addr.eq(ts[-3]), rd.en.eq(advance)]
                p_word = Signal.like(rd.data, name=f"p{k}", reset_less=True)
                with m.If(advance):
                    m.d.sync += p_word.eq(rd.data)

            def lane_params(word):
                """Per lane, each parameter: a field of `word` or the constant."""
                return [{name: (getattr(word[j], name) if plan.varies[name] else table[j][0])
                         for name, table in plan.tables.items()} for j in range(lanes)]
            params = lane_params(p_word if fields else None)
            p_next = lane_params(rd.data if fields else None)

            v = [Signal(plan.v_shape, name=f"v{k}_{j}", reset_less=True) for j in range(lanes)]
            r = [Signal(plan.r_shape, name=f"r{k}_{j}", reset_less=True) for j in range(lanes)]
            y = Signal(data.ArrayLayout(plan.out_shape, lanes), name=f"y{k}", reset_less=True)
            y_next = []                     # the values `y` loads, per lane
            # Stages a..e, each with the valid flag and transfer slot of its contents.
            valids = [Signal(name=f"valid{k}_{n}") for n in "abcde"]
            slots = [Signal(t_shape, name=f"t{k}_{n}") for n in "abcde"]
            with m.If(advance):
                m.d.sync += [a.eq(b) for a, b in zip(valids, [valid] + valids[:-1])]
                m.d.sync += [a.eq(b) for a, b in zip(slots, [ts[-1]] + slots[:-1])]
            for j in range(lanes):
                p = params[j]
                # a: partial products of at most 16x16 bits (one DSP each); b: their sum.
                # The offsets follow in step, to meet the product in c.
                sides = []
                two_sided = plan.use_pos and plan.use_neg
                for use, mult, off in ((plan.use_pos, "m", "off"), (plan.use_neg, "nm", "noff")):
                    if not use:
                        continue
                    parts = []
                    if lut_mul and k == 0:
                        products = _digit_partial_products(x[j], x3[j], p[mult])
                    else:
                        products = _partial_products(x[j], p[mult], chunks)
                        if dsp:
                            factors = _partial_factors(x_next[j], p_next[j][mult], chunks)
                    for n, (shift, value) in enumerate(products):
                        name = f"{mult}{k}_part{j}_{n}"
                        if dsp and _one_dsp(*factors[n][1:]):
                            _, px, pm = factors[n]
                            part = _mult18x18d(m, px, C(pm) if isinstance(pm, int) else pm,
                                               advance, name)
                        else:
                            part = Signal(Shape.cast(value.shape()), name=name,
                                          reset_less=True)
                            with m.If(advance):
                                m.d.sync += part.eq(value)
                        parts.append(part if shift == 0 else part << shift)
                    if dsp and len(parts) > 2 and not two_sided:
                        # ECP5: b takes one adder level behind the DSPs, c the rest with the
                        # offset. DSPs placed far from their adders (the jet tagger's
                        # requantization with 122 of 156 DSPs in use: a 6.9 ns route) left
                        # no time for two levels: 12.9 ns.
                        terms = _tree_levels(parts, 1)
                    else:
                        value = _tree_levels(parts)[0]
                        if lut_mul and len(parts) > 2:
                            # Carry-save: one carry chain instead of a tree of them.
                            value = _carry_save_sum(m, parts, Shape.cast(value.shape()),
                                                    f"{mult}{k}_csa{j}")
                        terms = [value]
                    prod = [Signal(Shape.cast(t.shape()), name=f"{mult}{k}_prod{j}"
                                   + (f"_{i}" if len(terms) > 1 else ""), reset_less=True)
                            for i, t in enumerate(terms)]
                    with m.If(advance):
                        m.d.sync += [r_.eq(t) for r_, t in zip(prod, terms)]
                    prod = _tree_levels(prod)[0]
                    off_b = p[off]
                    if not isinstance(off_b, int):
                        for n in "ab":
                            reg = Signal.like(p[off], name=f"{off}{k}_{n}{j}", reset_less=True)
                            with m.If(advance):
                                m.d.sync += reg.eq(off_b)
                            off_b = reg
                    sides.append(prod + (C(off_b) if isinstance(off_b, int) else off_b))
                # c: add the offset; with both sides, the sign of the first chooses.
                value = Mux(sides[0] < 0, sides[1], sides[0]) if len(sides) == 2 else sides[0]
                with m.If(advance):
                    m.d.sync += v[j].eq(value)
                    # d: round and add the zero point.
                    if plan.shift == 0:
                        m.d.sync += r[j].eq(v[j] + plan.const)
                    elif plan.rounding in ("floor", "ceil") or \
                            (plan.rounding == "to_zero" and not plan.v_signed):
                        m.d.sync += r[j].eq((v[j] + C(plan.const)) >> plan.shift)
                    elif plan.rounding == "to_zero":
                        bias = Mux(v[j][-1], C((1 << plan.shift) - 1), C(0))
                        m.d.sync += r[j].eq((v[j] + C(plan.const) + bias) >> plan.shift)
                    else:
                        if plan.rounding == "half_even":
                            cin = v[j][plan.shift] if plan.shift < len(v[j]) else \
                                (v[j][-1] if plan.v_signed else C(0, 1))
                        else:
                            cin = ~v[j][-1] if plan.v_signed else C(1, 1)
                        m.d.sync += r[j].eq((v[j] + C(plan.const) + cin) >> plan.shift)
                    # e: clip.
                    clipped = r[j]
                    if plan.clip_hi:
                        clipped = Mux(clipped > plan.hi, plan.hi, clipped)
                    if plan.clip_lo:
                        clipped = Mux(r[j] < plan.lo, plan.lo, clipped)
                    m.d.sync += y[j].eq(clipped)
                y_next.append(clipped)
            x, x_next, valid = y, y_next, valids[-1]
            ts += slots

        m.d.comb += advance.eq(_skid_output(m, o_stream, valid, x))
        return m


#: Operand bits per partial product of :class:`RequantCore`: a 16-bit unsigned chunk or a
#: signed top chunk of at most 16 bits fits one iCE40 SB_MAC16 (16x16) and one ECP5
#: MULT18X18D (18x18 signed).
_MUL_CHUNK = 16
#: Multiplier bits per partial product on iCE40, whose multipliers are built of LUTs (DSP
#: inference is opt-in there: see ``boards.build``): the whole accumulator times 8 bits of
#: the multiplier, 8 rows of a LUT multiplier per cycle instead of 16. The first stage
#: uses :data:`_DIGIT_CHUNK` instead (:func:`_digit_partial_products`).
_LUT_MUL_CHUNK = 8
_LUT_CHUNKS = (None, _LUT_MUL_CHUNK)
#: Multiplier bits per partial product of :func:`_digit_partial_products`: two radix-4 digits,
#: so that a partial product is one carry chain over two selected multiples of ``x``.
_DIGIT_CHUNK = 4


def _mul_chunks(platform) -> tuple:
    """``(x_chunk, m_chunk)`` for :func:`_partial_products` when elaborating for
    ``platform``: ``(None, 8)`` (``x`` whole) on iCE40, ``(16, 16)`` otherwise (the emitted
    Verilog, ECP5). The pipeline is the same either way: only how a product is cut into
    partial products differs, never a value or a cycle."""
    from amaranth.vendor import LatticeICE40Platform
    if isinstance(platform, LatticeICE40Platform):
        return _LUT_CHUNKS
    return _MUL_CHUNK, _MUL_CHUNK


def _times3_range(shape: Shape) -> tuple[int, int]:
    """The range of ``3 * x`` for ``x`` of ``shape``."""
    shape = Shape.cast(shape)
    lo = -(1 << (shape.width - 1)) if shape.signed else 0
    hi = (1 << (shape.width - 1)) - 1 if shape.signed else (1 << shape.width) - 1
    return 3 * lo, 3 * hi


def _digit_partial_products(x, x3, mult):
    """``x * mult`` as ``(shift, product)`` pairs, given ``x3 == 3 * x`` (a register): every
    unsigned :data:`_DIGIT_CHUNK`-bit chunk of ``mult`` gives one product, the sum of its
    radix-4 digits' multiples of ``x`` (0, x, 2x or 3x: a multiplexer each, then one carry
    chain); a signed top chunk is multiplied as in :func:`_partial_products`."""
    if isinstance(mult, int):
        return _partial_products(x, mult)
    products = []
    for shift, piece in _chunks(mult, _DIGIT_CHUNK):
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
        products.append((shift, _tree_levels(terms)[0]))
    return products


#: Weights of at least this many bits are multiplied through :func:`_digit_terms` on iCE40.
_DIGIT_MIN_BITS = 4


def _digit_terms(x, x3, x_neg, w):
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


def _carry_save_sum(m, terms, shape, name):
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


def _chunks(value, size):
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


def _partial_products(x, mult, chunks=(_MUL_CHUNK, _MUL_CHUNK)):
    """``x * mult`` as ``(shift, product)`` pairs whose shifted sum is the product (see
    :func:`_partial_factors`)."""
    return [(shift, px if pm is None else px * (C(pm) if isinstance(pm, int) else pm))
            for shift, px, pm in _partial_factors(x, mult, chunks)]


def _partial_factors(x, mult, chunks=(_MUL_CHUNK, _MUL_CHUNK)):
    """``x * mult`` as ``(shift, px, pm)`` triples whose products ``px * pm``, shifted, sum
    to it (``pm`` an int for a constant; ``None`` when ``px`` is the product itself): a
    table-read (signal) multiplier gives a product of every pair of :func:`_chunks` of both
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
        return [(sx + sm, px, pm) for sx, px in _chunks(x, x_chunk) for sm, pm in pieces]
    return [(sx + sm, px, pm) for sx, px in _chunks(x, x_chunk)
            for sm, pm in _chunks(mult, m_chunk)]


# ---------------------------------------------------------------------------------------------
# Plumbing


class StreamFIFO(wiring.Component):
    """A first-in first-out queue of ``lanes``-wide transfers.

    Depth 1 is a single pipeline register (full throughput; ``i_stream.ready`` follows
    ``o_stream.ready`` combinationally while it is full); depths 2..4 use
    :class:`amaranth.lib.fifo.SyncFIFO` (storage in flip-flops, latency 1); deeper queues use
    :class:`amaranth.lib.fifo.SyncFIFOBuffered` (storage in block RAM, latency 2).

    Parameters
    ----------
    shape : IntType or Amaranth integer shape
        Element shape.
    lanes : int
        Elements per transfer.
    depth : int
        Number of transfers the queue holds, at least 1.

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(shape, lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(shape, lanes)))``
        One transfer per cycle on each side; ``latency`` cycles from a write to its read.
    """

    @_quiet_if_invalid
    def __init__(self, shape, lanes, depth):
        self._shape = int_shape(shape)
        self._lanes = _check_count("Lanes", lanes)
        self._depth = _check_count("FIFO depth", depth)
        layout = data.ArrayLayout(self._shape, self._lanes)
        super().__init__({
            "i_stream": In(stream.Signature(layout)),
            "o_stream": Out(stream.Signature(layout)),
        })

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def latency(self) -> int:
        """Cycles from a write to the earliest read of that transfer."""
        return cost.fifo_latency(self._depth)

    def elaborate(self, platform):
        m = Module()
        i_stream, o_stream = self.i_stream, self.o_stream
        if self._depth == 1:
            full = Signal()
            m.d.comb += [
                i_stream.ready.eq(~full | o_stream.ready),
                o_stream.valid.eq(full),
            ]
            with m.If(o_stream.ready):
                m.d.sync += full.eq(0)
            with m.If(i_stream.valid & i_stream.ready):
                m.d.sync += [full.eq(1), o_stream.payload.eq(i_stream.payload)]
            return m
        width = self._shape.width * self._lanes
        cls = fifo.SyncFIFO if self._depth <= 4 else fifo.SyncFIFOBuffered
        m.submodules.fifo = q = cls(width=width, depth=self._depth)
        m.d.comb += [
            q.w_data.eq(i_stream.payload),
            q.w_en.eq(i_stream.valid),
            i_stream.ready.eq(q.w_rdy),
            o_stream.payload.eq(q.r_data),
            o_stream.valid.eq(q.r_rdy),
            q.r_en.eq(o_stream.ready),
        ]
        return m


class WidthConverter(wiring.Component):
    """Regroup a stream of ``in_lanes``-wide transfers into ``out_lanes``-wide transfers.

    One lane count must divide the other. Element order is kept: the elements of consecutive
    input transfers are concatenated (lane 0 first) and cut into output transfers.

    Parameters
    ----------
    shape : IntType or Amaranth integer shape
        Element shape.
    in_lanes, out_lanes : int
        Elements per input and per output transfer.

    Members
    -------
    i_stream : ``In(stream.Signature(data.ArrayLayout(shape, in_lanes)))``
    o_stream : ``Out(stream.Signature(data.ArrayLayout(shape, out_lanes)))``

    Timing: equal lane counts are a wire. Gathering (``out_lanes = k * in_lanes``) outputs one
    cycle after the ``k``-th input transfer and accepts an input every cycle. Splitting
    (``in_lanes = k * out_lanes``) outputs the ``k`` pieces in the ``k`` cycles after the input
    transfer and accepts the next input in the cycle its last piece leaves. In both cases an
    output that is not taken moves to a skid register, so that ``o_stream.ready`` enables no
    data register and ``i_stream.ready`` is a function of registers only.
    """

    @_quiet_if_invalid
    def __init__(self, shape, in_lanes, out_lanes):
        self._shape = int_shape(shape)
        self._in_lanes = _check_count("Input lanes", in_lanes)
        self._out_lanes = _check_count("Output lanes", out_lanes)
        if self._in_lanes % self._out_lanes and self._out_lanes % self._in_lanes:
            raise ValueError(f"One lane count must divide the other, not in_lanes="
                             f"{in_lanes} and out_lanes={out_lanes}")
        super().__init__({
            "i_stream": In(stream.Signature(data.ArrayLayout(self._shape, self._in_lanes))),
            "o_stream": Out(stream.Signature(data.ArrayLayout(self._shape, self._out_lanes))),
        })

    @property
    def in_lanes(self) -> int:
        return self._in_lanes

    @property
    def out_lanes(self) -> int:
        return self._out_lanes

    def elaborate(self, platform):
        m = Module()
        i_stream, o_stream = self.i_stream, self.o_stream
        n_in, n_out = self._in_lanes, self._out_lanes
        bits = self._shape.width
        if n_in == n_out:
            wiring.connect(m, wiring.flipped(i_stream), wiring.flipped(o_stream))
            return m
        if n_out > n_in:                   # gather k inputs into one output
            k = n_out // n_in
            buf = Signal(n_out * bits)
            count = _counter(k)
            o_valid = Signal()
            free = _skid_output(m, o_stream, o_valid, buf, free_copy=True)
            m.d.comb += i_stream.ready.eq(free)
            with m.If(o_valid & free):     # the word left: sent, or to the skid register
                m.d.sync += o_valid.eq(0)
            with m.If(i_stream.valid & i_stream.ready):
                with m.Switch(count):
                    for c in range(k):
                        with m.Case(c):
                            m.d.sync += buf.word_select(c, n_in * bits).eq(i_stream.payload)
                m.d.sync += count.eq(_wrap_incr(count, k))
                with m.If(count == k - 1):
                    m.d.sync += o_valid.eq(1)
            return m
        k = n_in // n_out                   # split one input into k outputs
        word = Signal(n_in * bits)
        count = _counter(k)
        full = Signal()
        last = count == k - 1
        free = _skid_output(m, o_stream, full, word[:n_out * bits], free_copy=True)
        m.d.comb += i_stream.ready.eq(~full | (free & last))
        with m.If(full & free):            # a piece left: sent, or to the skid register
            m.d.sync += [word.eq(word >> (n_out * bits)), count.eq(_wrap_incr(count, k))]
            with m.If(last):
                m.d.sync += full.eq(0)
        with m.If(i_stream.valid & i_stream.ready):
            m.d.sync += [word.eq(i_stream.payload), full.eq(1)]
        return m
