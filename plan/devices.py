"""Device rules of the resource estimates, as yosys 0.70 applies them: which products take hard
multipliers (iCE40 ``SB_MAC16``, ECP5 ``MULT18X18D``) and how many, how ``memory_libmap`` maps a
memory onto block RAM, distributed RAM or soft logic, and what a memory moved into soft logic
costs.

Plain Python: the cores of :mod:`onnx2fpga.hw` make their choices from these rules and
:mod:`onnx2fpga.hw.resources` counts with them, so that the two cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "FAMILIES", "const_multiplier_bits", "multiplier_dsps", "MemoryMap", "memory_mapping",
    "varying_columns", "is_shift_register_buffer", "logic_cost", "logic_memory_cost",
    "LUT_PRODUCT_MAX_BITS", "ECP5_DSP_BITS", "ICE40_DSP_BITS", "ecp5_dsp_product",
    "ice40_registered_product",
    "ice40_paired_product", "ice40_matvec_dsps", "LOGIC_ROM_LUTS_PER_BIT", "logic_cells",
    "BLOCK_STYLE", "NO_RW_CHECK", "carries", "block_ram_shapes", "ADDER_DELAYS",
    "adder_stage_ns", "adder_levels", "ADDER_TIMING_MARGIN", "PLANNING_CLOCK_MHZ",
]


#: The device families the model knows.
FAMILIES = ("ice40", "ecp5")


def logic_cells(res: dict) -> int:
    """Logic cells of an estimate: LUTs plus half the flip-flops (an iCE40 logic cell holds
    one of each; flip-flops that do not pack with their LUT take cells of their own)."""
    return res["lut"] + res["ff"] // 2


def check_family(family):
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, not {family!r}")


def _check_bits(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"{name} must be a non-negative integer, not {value!r}")


def const_multiplier_bits(value: int) -> int:
    """Operand width yosys keeps for a constant multiplier ``value``: 0 when the product is a
    shift or nothing (``value`` is 0 or plus or minus a power of two), else the bits of the
    constant (two's complement for a negative one)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"value must be an integer, not {value!r}")
    a = abs(value)
    if a == 0 or a & (a - 1) == 0:
        return 0
    return value.bit_length() if value > 0 else (~value).bit_length() + 1


def operand_pieces(bits: int, size: int) -> list[int]:
    return [min(size, bits - lo) for lo in range(0, bits, size)]


def multiplier_dsps(a_bits: int, b_bits: int, family: str, *, ice40_dsp: bool = False) -> int:
    """Hard multipliers yosys 0.70 uses for an ``a_bits`` x ``b_bits`` product.

    Parameters
    ----------
    a_bits, b_bits : int
        Operand widths after yosys' ``wreduce`` (0 for a constant that is a shift, see
        :func:`const_multiplier_bits`).
    family : str
        ``"ice40"`` or ``"ecp5"``.
    ice40_dsp : bool
        The iCE40 build runs ``synth_ice40 -dsp`` (off in our builds; the SB_MAC16s a design
        instantiates, MatVecCore's ``ice40_dsp``, are counted from the netlist).

    Returns
    -------
    int
        ECP5: the pairs of 18-bit pieces of both operands with at least 2 bits each.
        iCE40: 0 without ``-dsp``; with it, the pairs of 16-bit pieces of at least 2 bits
        whose product has at least 11 bits.
    """
    _check_bits("a_bits", a_bits)
    _check_bits("b_bits", b_bits)
    check_family(family)
    if family == "ice40":
        if not ice40_dsp:
            return 0
        size, min_product = 16, 11
    else:
        size, min_product = 18, 0
    return sum(1 for p in operand_pieces(a_bits, size) for q in operand_pieces(b_bits, size)
               if p >= 2 and q >= 2 and p + q >= min_product)


@dataclass(frozen=True)
class _RamDef:
    name: str
    kind: str            # "block" or "distributed"
    abits: int
    dbits: tuple
    cost: int
    byte: int            # write-enable granularity (0: whole word)
    rom: bool            # may hold a ROM
    sync_read: bool      # native synchronous read (else emulated with a flip-flop)
    async_read: bool
    wr_widths: tuple     # indices into dbits the write port takes (None: all)


_LIBRARY = {
    "ice40": (
        _RamDef("SB_RAM40_4K", "block", 11, (2, 4, 8, 16), 64, 0, True, True, False, (0, 1, 2)),
        _RamDef("SB_RAM40_4K", "block", 11, (2, 4, 8, 16), 64, 1, True, True, False, None),
    ),
    "ecp5": (
        _RamDef("DP16KD", "block", 14, (1, 2, 4, 9, 18), 128, 9, True, True, False, None),
        _RamDef("DP16KD", "block", 14, (1, 2, 4, 9, 18, 36), 128, 9, True, True, False,
                (3, 4, 5)),
        _RamDef("TRELLIS_DPR16X4", "distributed", 4, (4,), 4, 0, False, False, True, None),
    ),
}


def block_ram_shapes(family: str) -> tuple:
    """``((width, rows), ...)`` of one block RAM of ``family`` in each of its data widths,
    narrowest first (ECP5: 16,384 x 1 to 512 x 36), from :data:`_LIBRARY`."""
    widest = max((r for r in _LIBRARY[family] if r.kind == "block"), key=lambda r: len(r.dbits))
    return tuple((bits, 1 << (widest.abits - i)) for i, bits in enumerate(widest.dbits))


#: memory_libmap's weights of the read multiplexer, the write-enable demultiplexer and an
#: emulated feature.
_FACTOR_MUX, _FACTOR_DEMUX, _FACTOR_EMU = 0.5, 0.5, 2


#: What a RAM (a write port and a synchronous read port) costs memory_libmap beyond a ROM in
#: an ECP5 block RAM, found from where yosys 0.70 switches between TRELLIS_DPR16X4 and DP16KD
#: (64 words: 24 bits distributed, 25 block; 128 words: 10 and 11 bits distributed, 12 block;
#: 32 words x 56 bits distributed): the block RAM wins from a distributed cost of 144
#: (128 + 16). Without it kwsmlp_w3a3's last input buffer (24 x 64) counted one DP16KD too many.
_BLOCK_RAM_EXTRA = {"ice40": 0, "ecp5": 16}
#: The same for a RAM with :data:`NO_RW_CHECK`: yosys 0.70 then emulates no read-before-write
#: behaviour (an emulation score of 1 instead of 7, at 2 each), and the block RAM wins from a
#: distributed cost of 130 (64 words: 20 bits distributed, 21 block; 128 words: 8 and 9).
_BLOCK_RAM_EXTRA_NO_RW_CHECK = {"ice40": 0, "ecp5": 2}

#: The attribute that promises yosys a RAM's read port never reads, in a cycle both ports
#: are enabled, the word its write port writes. Without it, yosys 0.70 builds the
#: read-before-write behaviour of a non-transparent read port (Amaranth's default), which
#: ECP5 and iCE40 block RAMs lack across ports, from soft logic behind the block RAM: a
#: register of the write data, an address comparator, and a multiplexer of the RAM's output
#: (on ECP5 that multiplexer, behind a block RAM's 5.8 ns clock-to-out, was a MobileNetV1
#: build's critical path at 100 MHz). With it, a collision reads an undefined word.
#: :func:`onnx2fpga.hw.testing.simulate` checks the promise on every cycle of a simulation.
NO_RW_CHECK = {"no_rw_check": 1}


def carries(attributes, style: dict) -> bool:
    """Whether a memory's ``attributes`` hold every item of ``style`` (:data:`BLOCK_STYLE`,
    :data:`NO_RW_CHECK`)."""
    return all(attributes.get(k) == v for k, v in style.items())


@dataclass(frozen=True)
class MemoryMap:
    """Where yosys puts one memory.

    Attributes
    ----------
    kind : str
        ``"block"`` (block RAM), ``"distributed"`` (ECP5 LUT RAM) or ``"logic"`` (flip-flops
        for a RAM, LUTs for a ROM).
    cells : int
        Primitive cells: block RAMs (``SB_RAM40_4K`` / ``DP16KD``), ``TRELLIS_DPR16X4``, or 0.
    width, depth : int
        The block's data width and depth in the chosen configuration (0 for logic).
    """
    kind: str
    cells: int
    width: int = 0
    depth: int = 0


def memory_mapping(width: int, depth: int, family: str, *, rom: bool,
                   sync_read: bool = True, block: bool = False,
                   rw_check: bool = True) -> MemoryMap:
    """The mapping yosys 0.70's ``memory_libmap`` chooses for a memory of ``depth`` words of
    ``width`` bits with one read port (synchronous unless ``sync_read`` is false) and, unless
    ``rom``, one write port writing whole words. With ``block``, the memory carries the
    attribute :data:`BLOCK_STYLE` (``rom_style = "block"``): the cheapest block RAM mapping
    whatever soft logic would cost. Without ``rw_check``, the RAM carries :data:`NO_RW_CHECK`
    and a block RAM costs yosys less (no read-before-write emulation).

    Examples: on iCE40 a 2048x8 ROM takes 4 ``SB_RAM40_4K``, a 128x8 ROM stays in LUTs
    (1024 bits / 16 = 64 is not more than one block's cost of 64), a 16x8 RAM takes a block;
    on ECP5 a 512x36 ROM takes one ``DP16KD`` (as ``PDPW16KD``), a 64x8 RAM 8
    ``TRELLIS_DPR16X4``, a 64x24 RAM 24 of them and a 64x25 RAM one ``DP16KD``.
    """
    for name, v in (("width", width), ("depth", depth)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise TypeError(f"{name} must be a positive integer, not {v!r}")
    check_family(family)
    bits = width * depth
    logic_cost = int(bits / 16) if rom else bits
    best, best_cost = MemoryMap("logic", 0), float("inf") if block else logic_cost
    for rdef in _LIBRARY[family]:
        if (rom and not rdef.rom) or (block and rdef.kind != "block"):
            continue
        if not sync_read and not rdef.async_read:
            continue
        emu = _FACTOR_EMU if (sync_read and not rdef.sync_read) else 0
        wr = rdef.wr_widths if (not rom and rdef.wr_widths is not None) else \
            tuple(range(len(rdef.dbits)))
        byte_log2 = max((i for i, d in enumerate(rdef.dbits) if d <= rdef.byte), default=0) \
            if rdef.byte else 0
        for base in range(len(rdef.dbits)):
            unit = min(base, max(wr)) if not rom else base
            if unit != base:
                break
            if not rom and base < min(wr) and not (rdef.byte and base >= byte_log2):
                continue
            uw = rdef.dbits[unit]
            eff = 1 if rom else (rdef.byte if 0 < rdef.byte <= uw else uw)
            swz = -(-width // eff) * eff
            addrs = 1 << (rdef.abits - base)
            mult_a = -(-depth // addrs)
            repl = -(-(mult_a * swz) // uw)
            cost = rdef.cost * repl + _FACTOR_MUX * (mult_a - 1) * width + emu
            if not rom and rdef.kind == "block":
                cost += (_BLOCK_RAM_EXTRA if rw_check else _BLOCK_RAM_EXTRA_NO_RW_CHECK)[family]
            if not rom and mult_a != 1:
                cost += _FACTOR_DEMUX * mult_a
            if cost < best_cost:
                best_cost = cost
                best = MemoryMap(rdef.kind, repl, uw, addrs)
    return best


#: The attribute that puts a ROM into block RAM where yosys would build it in LUTs (a weight
#: ROM of few words: yosys 0.70 builds 32 words of 144 bits from 288 LUT4, or 4 DP16KD),
#: honoured by yosys' ``memory_libmap``. Board folding sets it where LUTs run short and
#: block RAMs do not (:attr:`Dataflow.block_memories <onnx2fpga.ir.Dataflow>`).
BLOCK_STYLE = {"rom_style": "block"}


def varying_columns(words: list) -> int:
    """The mask of the bit columns of a ROM of ``words`` (ints) that do not hold the same
    value in every word: yosys' opt_mem drops the others, per memory (TFC_2W2A's first layer
    at simd 784: 473 of 1568 weight bits are constant over its 64 words, 31 DP16KD instead of
    44)."""
    varying = 0
    for w in words[1:]:
        varying |= w ^ words[0]
    return varying


def is_shift_register_buffer(name: str) -> bool:
    """``name`` (``"stage/memory"``) is a MatVec input buffer, which soft logic holds as
    shift registers (:class:`~onnx2fpga.hw.matvec.MatVecCore`'s ``x_logic``), not as a
    memory."""
    stage, _, path = str(name).partition("/")
    return stage.startswith("matvec_") and path == "x_mem"


def logic_cost(name: str, width: int, depth: int, rom: bool) -> dict:
    """Estimated ``lut`` and ``ff`` of the block memory ``name`` moved into soft logic:
    :func:`logic_memory_cost`, or for a MatVec input buffer (two banks of ``depth // 2``
    words in shift registers) a flip-flop per bit, the read register, and LUTs for the
    bank fronts' multiplexers and the read multiplexer."""
    if is_shift_register_buffer(name):
        return {"lut": 3 * width + 2, "ff": width * depth + width}
    return logic_memory_cost(width, depth, rom)


#: LUTs per bit of a ROM forced into soft logic (:func:`logic_memory_cost`).
LOGIC_ROM_LUTS_PER_BIT = 0.131


def logic_memory_cost(width: int, depth: int, rom: bool) -> dict:
    """Estimated ``lut`` and ``ff`` of a ``depth`` x ``width`` memory forced into soft logic
    (:attr:`Dataflow.logic_memories <onnx2fpga.ir.Dataflow>`), from yosys 0.70
    ``synth_ice40`` of single memories with ``logic_block`` set: a ROM is a tree of LUTs
    over its address, ``0.131 * bits + width`` LUTs (2048x4, 4096x2 and 512x16 ROMs: 1,075
    to 1,079 LUTs; 256x8: 314; 64x22: 201); a RAM a flip-flop per bit plus write decoding
    and read multiplexers, ``0.89 * bits + depth`` LUTs (128x2: 376; 15x8: 115; 64x16: 952;
    1568x2: 4,395; 784x8: 6,392), ``bits + width`` flip-flops. Used for both families (an
    ECP5 keeps its memories in block or distributed RAM unless told otherwise)."""
    bits = width * depth
    if rom:
        return {"lut": int(round(LOGIC_ROM_LUTS_PER_BIT * bits + width)), "ff": int(width)}
    return {"lut": int(round(0.89 * bits + depth)), "ff": int(bits + width)}


#: A product whose narrower operand has at most this many bits is built from shifted partial
#: products (adders in LUTs) instead of a ``*``, which yosys would give a hard multiplier
#: (ECP5 maps every product of at least 2 x 2 bits to a MULT18X18D). Low-bit layers then
#: take LUTs, and the device's multipliers stay for wide products.
LUT_PRODUCT_MAX_BITS = 4


#: Operand width of an ECP5 ``MULT18X18D``.
ECP5_DSP_BITS = 18


#: Operand bits of an iCE40 ``SB_MAC16`` in its 16 x 16 mode.
ICE40_DSP_BITS = 16


def _width(operand) -> int:
    """The bit width of an operand given as an IR :class:`~onnx2fpga.ir.IntType`, an Amaranth
    shape (anything with ``width``) or a plain number of bits."""
    if hasattr(operand, "bits"):
        return int(operand.bits)
    if hasattr(operand, "width"):
        return int(operand.width)
    return int(operand)


def ecp5_dsp_product(a, b) -> bool:
    """Whether a MatVec product ``a * b`` (operands of the shapes of ``a`` and ``b``) takes a
    registered ``MULT18X18D`` on an ECP5 when its layer's products are on DSPs: a product
    :func:`product` leaves to a hard multiplier (both operands wider than
    :data:`LUT_PRODUCT_MAX_BITS`) whose operands fit 18 bits."""
    a, b = _width(a), _width(b)
    return min(a, b) > LUT_PRODUCT_MAX_BITS and max(a, b) <= ECP5_DSP_BITS


def ice40_registered_product(a, b) -> bool:
    """Whether a MatVec product ``a * b`` (operands of the shapes of ``a`` and ``b``) may go
    to a registered ``SB_MAC16`` (:class:`MatVecCore`'s ``ice40_dsp``): a product
    :func:`product` leaves to a hard multiplier (both operands wider than
    :data:`LUT_PRODUCT_MAX_BITS`) whose operands fit 16 bits and whose value fits 24 bits.
    The bound keeps to what the DSP's models agree on: yosys' simulation model of the 16 x 16
    mode adds its 8 x 8 partial products without sign-extending them to 32 bits, so its top
    byte differs from the true product's when a partial product is negative."""
    a, b = _width(a), _width(b)
    return min(a, b) > LUT_PRODUCT_MAX_BITS and \
        max(a, b) <= ICE40_DSP_BITS and a + b <= 24


def ice40_paired_product(a, b) -> bool:
    """Whether two such products share one ``SB_MAC16`` in its 8 x 8 mode (its top and
    bottom 8 x 8 multipliers, each with its own product register): both operands fit 8
    bits. The DSPs a MatVec of ``n`` products takes are then ``ceil(n / 2)``."""
    a, b = _width(a), _width(b)
    return ice40_registered_product(a, b) and max(a, b) <= 8


def ice40_matvec_dsps(simd: int, pe: int, a, b) -> int:
    """SB_MAC16s of a MatVec of ``simd * pe`` products of operands of the shapes ``a`` and
    ``b`` with ``ice40_dsp`` (0 if its products may not take them)."""
    n = simd * pe
    if not ice40_registered_product(a, b):
        return 0
    return -(-n // 2) if ice40_paired_product(a, b) else n


# ---------------------------------------------------------------------------------------------
# Carry-chain adders between registers (the adder graphs of "adders" layers)

#: Delays (ns) of a register-to-register path through carry-chain adders, as nextpnr 0.11
#: times them. ECP5 (speed 6; read from the critical path reports of ULX3S-85F builds):
#: a flip-flop's clock-to-out 0.52, into the first CCU2C of a chain 0.45, 0.07 per further
#: CCU2C (two bits), out of the chain's last sum 0.44, into the flip-flop beside it 0.13;
#: ``route`` is the net from one adder (or register) to the next adder across the fabric.
#: iCE40 (UP5K; read from nextpnr-ice40's report on registered 16-bit adders): clock-to-out
#: 1.39, a net between logic cells 1.76, into the first SB_CARRY 0.68 (I1 to COUT), 0.28
#: per further bit (CIN to COUT), into the last sum's LUT 0.66 and through it into the
#: flip-flop 0.82 (setup with the LUT).
ADDER_DELAYS = {
    "ecp5": {"clk_to_q": 0.52, "carry_in": 0.45, "per_cell": 0.07, "bits_per_cell": 2,
             "carry_out": 0.44, "to_ff": 0.13, "route": 2.0},
    "ice40": {"clk_to_q": 1.39, "carry_in": 0.68, "per_cell": 0.28, "bits_per_cell": 1,
              "carry_out": 0.66, "to_ff": 0.82, "route": 1.76},
}

#: The clock a design folded for a board of the family is planned for when the compile
#: names none (``clock_mhz``): what builds for these boards aim at.
PLANNING_CLOCK_MHZ = {"ecp5": 100.0, "ice40": 48.0}

#: Share of the clock period :func:`adder_levels` fills at most (placement varies by seed).
ADDER_TIMING_MARGIN = 0.8


def adder_stage_ns(family: str, levels: int, width: int) -> float:
    """Nanoseconds of a register stage of ``levels`` ``width``-bit adders in series, by the
    measured delays of :data:`ADDER_DELAYS`."""
    check_family(family)
    d = ADDER_DELAYS[family]
    cells = -(-(int(width) + 1) // d["bits_per_cell"])
    one = d["route"] + d["carry_in"] + d["per_cell"] * (cells - 1) + d["carry_out"]
    return d["clk_to_q"] + levels * one + d["to_ff"]


def adder_levels(family: str, clock_mhz: float, width: int = 24) -> int:
    """The most adder levels of ``width`` bits (at least 1) whose register stage
    (:func:`adder_stage_ns`) fits :data:`ADDER_TIMING_MARGIN` of the clock period."""
    budget = ADDER_TIMING_MARGIN * 1000.0 / float(clock_mhz)
    levels = 1
    while adder_stage_ns(family, levels + 1, width) <= budget:
        levels += 1
    return levels
