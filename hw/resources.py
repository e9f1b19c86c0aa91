"""Resource estimates (LUTs, flip-flops, DSPs, block RAMs) of the generated hardware, before
any synthesis.

Each :class:`~onnx2fpga.hw.graph.Stage` is elaborated into Amaranth's netlist (no Verilog, no
yosys) and the netlist is read the way yosys 0.70 will treat it:

- **Multipliers** (:func:`multiplier_dsps`): every ``*`` with its operand widths as yosys
  sees them after ``wreduce`` (sign and zero extensions stripped). ECP5 (``synth_ecp5``):
  ``mul2dsp`` cuts each operand into pieces of at most 18 bits from the least significant
  end and gives every pair of pieces a ``MULT18X18D`` when both pieces have at least 2 bits
  (a 1-bit piece stays in LUTs); a constant operand that is 0 or a power of two (up to sign)
  is a shift, never a DSP. iCE40: no DSP unless the build enables ``synth_ice40 -dsp``
  (:func:`~onnx2fpga.boards.build.build_bitstream` does not by default); with it, pieces of
  16 bits and products of at least 11 bits. Exact for the products our cores write.
- **Memories** (:func:`memory_mapping`): the choice ``memory_libmap`` makes, recomputed from
  its cost rule for the family's library (``ice40/brams.txt``: ``SB_RAM40_4K`` 256x16 / 512x8
  / 1024x4 / 2048x2 at cost 64; ``lattice/brams_16kd.txt``: ``DP16KD`` 1024x18 / 2048x9 /
  4096x4 / 8192x2 / 16384x1 and ``PDPW16KD`` 512x36 at cost 128; ``lutrams_trellis.txt``:
  ``TRELLIS_DPR16X4`` 16x4 at cost 4, not for ROMs). A configuration costs ``cost * cells +
  0.5 * read-mux bits + 0.5 * write-enable demux bits (+ 2 to emulate a synchronous read on
  an asynchronous RAM: a value bracketed by the sweep, between 2 and 8)``; soft logic costs
  ``width * depth`` bits for a RAM, a sixteenth of that for a ROM (truncated to an integer);
  the cheapest wins, soft logic on a tie. Exact on a sweep of 108 memories per family
  (widths 1..36, depths 2..2048, ROM and RAM: ``benchmarks/resources.py --sweep``) and on
  every stage of the benchmark's designs.
- **Flip-flops**: the netlist's flip-flop bits, plus the read registers and the storage of
  memories that end up in soft logic.
- **LUTs**: a linear model over the netlist's operators (adder, comparator and multiplexer
  bits, soft multiplier bits, soft memory bits), with one set of coefficients per family
  fitted to yosys 0.70 on the stages of a set of designs (:data:`LUT_COEFFICIENTS`; the
  fitting data and script: ``benchmarks/resources.py --fit``). An estimate, not exact.

:func:`dataflow_resources` adds the stages of every layer, the plumbing between layers (FIFOs,
width converters, broadcasts) to the layer that feeds it, and reports the board wrapper
(framed UART link, :data:`WRAPPER`) as a fixed cost of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "FAMILIES", "multiplier_dsps", "const_multiplier_bits", "MemoryMap", "memory_mapping",
    "netlist_features", "memory_path", "stage_resources", "dataflow_resources", "WRAPPER",
    "WRAPPER_RX_FIFO", "wrapper_resources", "logic_memory_cost", "logic_cost",
    "is_shift_register_buffer", "LUT_FEATURES",
    "LUT_COEFFICIENTS",
]

#: The device families the model knows.
FAMILIES = ("ice40", "ecp5")


def _check_family(family):
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, not {family!r}")


def _check_bits(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"{name} must be a non-negative integer, not {value!r}")


# ---------------------------------------------------------------------------------------------
# Multipliers


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


def _pieces(bits: int, size: int) -> list[int]:
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
    _check_family(family)
    if family == "ice40":
        if not ice40_dsp:
            return 0
        size, min_product = 16, 11
    else:
        size, min_product = 18, 0
    return sum(1 for p in _pieces(a_bits, size) for q in _pieces(b_bits, size)
               if p >= 2 and q >= 2 and p + q >= min_product)


# ---------------------------------------------------------------------------------------------
# Memories


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

#: memory_libmap's weights of the read multiplexer, the write-enable demultiplexer and an
#: emulated feature.
_FACTOR_MUX, _FACTOR_DEMUX, _FACTOR_EMU = 0.5, 0.5, 2
#: What a RAM (a write port and a synchronous read port) costs memory_libmap beyond a ROM in
#: an ECP5 block RAM, found from where yosys 0.70 switches between TRELLIS_DPR16X4 and DP16KD
#: (64 words: 24 bits distributed, 25 block; 128 words: 10 and 11 bits distributed, 12 block;
#: 32 words x 56 bits distributed): the block RAM wins from a distributed cost of 144
#: (128 + 16). Without it kwsmlp_w3a3's last input buffer (24 x 64) counted one DP16KD too many.
_BLOCK_RAM_EXTRA = {"ice40": 0, "ecp5": 16}


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
                   sync_read: bool = True) -> MemoryMap:
    """The mapping yosys 0.70's ``memory_libmap`` chooses for a memory of ``depth`` words of
    ``width`` bits with one read port (synchronous unless ``sync_read`` is false) and, unless
    ``rom``, one write port writing whole words.

    Examples: on iCE40 a 2048x8 ROM takes 4 ``SB_RAM40_4K``, a 128x8 ROM stays in LUTs
    (1024 bits / 16 = 64 is not more than one block's cost of 64), a 16x8 RAM takes a block;
    on ECP5 a 512x36 ROM takes one ``DP16KD`` (as ``PDPW16KD``), a 64x8 RAM 8
    ``TRELLIS_DPR16X4``, a 64x24 RAM 24 of them and a 64x25 RAM one ``DP16KD``.
    """
    for name, v in (("width", width), ("depth", depth)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise TypeError(f"{name} must be a positive integer, not {v!r}")
    _check_family(family)
    bits = width * depth
    logic_cost = int(bits / 16) if rom else bits
    best, best_cost = MemoryMap("logic", 0), logic_cost
    for rdef in _LIBRARY[family]:
        if rom and not rdef.rom:
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
                cost += _BLOCK_RAM_EXTRA[family]
            if not rom and mult_a != 1:
                cost += _FACTOR_DEMUX * mult_a
            if cost < best_cost:
                best_cost = cost
                best = MemoryMap(rdef.kind, repl, uw, addrs)
    return best


# ---------------------------------------------------------------------------------------------
# Reading the netlist


def _platform(family):
    """A platform object the cores elaborate for, as a board build does: the iCE40 one makes
    :class:`~onnx2fpga.hw.cores.RequantCore` cut its products for LUTs, the ECP5 one puts
    :class:`~onnx2fpga.hw.cores.MatVecCore`'s hard products in registered ``MULT18X18D``."""
    if family == "ice40":
        from amaranth_boards.icebreaker import ICEBreakerPlatform
        return ICEBreakerPlatform()
    from amaranth_boards.ulx3s import ULX3S_85F_Platform
    return ULX3S_85F_Platform()


def _operand(value):
    """``(bits, const)`` of a multiplier operand as yosys sees it: the width without the
    replicated sign bits or the zero bits on top, or the constant's value."""
    from amaranth.hdl import _nir
    nets = list(value)
    if all(n.is_const for n in nets):
        v = sum(int(n.const) << i for i, n in enumerate(nets))
        if nets and nets[-1] == _nir.Net.from_const(1):
            v -= 1 << len(nets)
        return const_multiplier_bits(v), v
    s = len(nets)
    while s > 1 and nets[s - 1] == nets[s - 2]:
        s -= 1
    u = len(nets)
    while u > 0 and nets[u - 1] == _nir.Net.from_const(0):
        u -= 1
    return min(s, u), None


#: Feature names of the LUT model, see :func:`netlist_features`.
LUT_FEATURES = ("add", "cmp", "mux", "assign", "logic", "soft_mul", "rom_bits", "ram_bits",
                "mem_cells", "ff", "one")


def varying_columns(words: list) -> int:
    """The mask of the bit columns of a ROM of ``words`` (ints) that do not hold the same
    value in every word: yosys' opt_mem drops the others, per memory (TFC_2W2A's first layer
    at simd 784: 473 of 1568 weight bits are constant over its 64 words, 31 DP16KD instead of
    44)."""
    varying = 0
    for w in words[1:]:
        varying |= w ^ words[0]
    return varying


def memory_path(netlist, cell) -> str:
    """The name of memory ``cell`` of ``netlist`` relative to the netlist's top module:
    ``"w_mem"``, or ``"fifo.storage"`` inside a submodule (the names yosys sees under the
    core's module)."""
    return ".".join(netlist.modules[cell.module_idx].name[1:] + (cell.name,))


def _unbanked(name: str) -> str:
    """The memory a bank ``{memory}_bank{n}`` is part of (see
    :func:`onnx2fpga.hw.cores.logic_rom_banks`); ``name`` if it is no bank."""
    base, sep, n = name.rpartition("_bank")
    return base if sep and n.isdigit() else name


def netlist_features(elaboratable, family: str, *, ice40_dsp: bool = False,
                     logic=frozenset()) -> dict:
    """Read what yosys will build from one elaboratable (a core): its multipliers, memories
    and flip-flops, and the operator counts the LUT model weighs.

    ``logic``: names (:func:`memory_path`) of memories the build forces into soft logic
    (yosys' ``logic_block`` attribute, see :func:`onnx2fpga.boards.build.logic_memory_script`).

    Returns
    -------
    dict
        ``dsp``: hard multipliers (:func:`multiplier_dsps`); ``bram``: block RAMs;
        ``ff``: flip-flop bits; ``memories``: a list of ``(width, depth, rom, MemoryMap)``
        and ``memory_names`` the name of each (:func:`memory_path`);
        ``multipliers``: a list of ``(a_bits, b_bits, dsps)``; and the LUT model's features
        (:data:`LUT_FEATURES`): adder bits, comparator input bits, multiplexer bits,
        conditional-assignment bits, other logic bits, soft multiplier bit products, bits of
        ROMs and RAMs left in soft logic, distributed RAM cells, flip-flop bits, and 1 (the
        core's fixed part).
    """
    from amaranth.hdl import Fragment, _nir
    from amaranth.hdl._ir import build_netlist

    from .cores import ECP5_DSP_BITS

    _check_family(family)
    frag = Fragment.get(elaboratable, _platform(family))
    netlist = build_netlist(frag, name="top")
    f = dict.fromkeys(LUT_FEATURES, 0)
    f["one"] = 1
    f.update(dsp=0, bram=0, memories=[], memory_names=[], multipliers=[], logic_memory_lut=0)
    mems = {}
    for idx, cell in enumerate(netlist.cells):
        if isinstance(cell, _nir.Memory):
            mems[idx] = {"cell": cell, "write": 0, "sync": 0, "async": 0, "rd_bits": 0}
    for cell in netlist.cells:
        if isinstance(cell, _nir.SyncWritePort):
            mems[cell.memory]["write"] += 1
        elif isinstance(cell, _nir.SyncReadPort):
            mems[cell.memory]["sync"] += 1
            mems[cell.memory]["rd_bits"] += cell.width
        elif isinstance(cell, _nir.AsyncReadPort):
            mems[cell.memory]["async"] += 1
        elif isinstance(cell, _nir.FlipFlop):
            f["ff"] += len(cell.data)
        elif isinstance(cell, _nir.Instance) and cell.type == "SB_MAC16":
            # An instantiated, registered iCE40 DSP (MatVecCore's ice40_dsp): one DSP.
            a, b = (_operand(cell.ports_i[port])[0] for port in "AB")
            f["multipliers"].append((a, b, 1))
            f["dsp"] += 1
        elif isinstance(cell, _nir.Instance) and cell.type == "MULT18X18D":
            # An instantiated, registered ECP5 multiplier: one DSP, its registers inside.
            a, b = (_operand([net for k in range(ECP5_DSP_BITS)
                              for net in cell.ports_i[f"{port}{k}"]])[0] for port in "AB")
            f["multipliers"].append((a, b, 1))
            f["dsp"] += 1
        elif isinstance(cell, _nir.AssignmentList):
            for k, a in enumerate(cell.assignments):
                f["assign" if k else "logic"] += len(a.value) if k else 0
        elif isinstance(cell, _nir.Operator):
            op, w = cell.operator, len(cell.inputs[0])
            if op == "*":
                (a, _), (b, _) = (_operand(v) for v in cell.inputs)
                n = multiplier_dsps(a, b, family, ice40_dsp=ice40_dsp)
                f["multipliers"].append((a, b, n))
                f["dsp"] += n
                if n == 0:
                    f["soft_mul"] += a * b
                else:
                    # 1-bit pieces left over by mul2dsp stay in LUTs.
                    size = 18 if family == "ecp5" else 16
                    f["soft_mul"] += sum(p * b for p in _pieces(a, size) if p < 2) + \
                        sum(p * a for p in _pieces(b, size) if p < 2)
            elif op in ("+", "-") and len(cell.inputs) == 2:
                f["add"] += w
            elif op == "-":
                f["add"] += w
            elif op in ("<<", "u>>", "s>>"):
                # Before the comparisons: "<<"[1:] is "<". A constant shift is wiring.
                if not all(n.is_const for n in cell.inputs[1]):
                    f["mux"] += w * max(1, len(cell.inputs[1]))
            elif op in ("==", "!=") or op[1:] in ("<", ">", "<=", ">="):
                f["cmp"] += w
            elif op == "m":
                f["mux"] += len(cell.inputs[1])
            elif op in ("&", "|", "^", "r|", "r&", "r^", "b"):
                f["logic"] += w
    banked = {}         # memory -> [width, depth, rom, banks] of its banks
    for m in mems.values():
        cell = m["cell"]
        rom = m["write"] == 0
        name = memory_path(netlist, cell)
        base = _unbanked(name)
        if base != name and base in logic:
            # A bank of a ROM read in two steps (MatVecCore's w_logic): the banks and the
            # multiplexers picking one cost the LUTs of the whole ROM in one piece (yosys
            # 0.70, random contents: 4096 x 2 in 64-word banks 1,029 LUTs, in one 1,080;
            # 640 x 2: 207, 200; 1024 x 8: 1,044, 1,089; 256 x 16: 565, 581), and a
            # register per bank.
            f["memories"].append((cell.width, cell.depth, rom, MemoryMap("logic", 0)))
            f["memory_names"].append(name)
            group = banked.setdefault(base, [cell.width, 0, rom, 0])
            group[1] += cell.depth
            group[3] += 1
            f["ff"] += logic_memory_cost(cell.width, cell.depth, rom)["ff"]
            continue
        if name in logic:
            # Forced into soft logic: costed by its own rule, not by the LUT model's
            # features (fitted on the small memories yosys leaves in logic by itself).
            mm = MemoryMap("logic", 0)
            f["memories"].append((cell.width, cell.depth, rom, mm))
            f["memory_names"].append(name)
            cost = logic_memory_cost(cell.width, cell.depth, rom)
            f["logic_memory_lut"] += cost["lut"]
            f["ff"] += cost["ff"]
            continue
        width = cell.width
        if rom:
            width = max(1, varying_columns([int(v) for v in cell.init]).bit_count())
        mm = memory_mapping(width, cell.depth, family, rom=rom,
                            sync_read=m["async"] == 0)
        f["memories"].append((width, cell.depth, rom, mm))
        f["memory_names"].append(name)
        if mm.kind == "block":
            f["bram"] += mm.cells
        elif mm.kind == "distributed":
            f["mem_cells"] += mm.cells
            f["ff"] += m["rd_bits"]
        else:
            f["ff"] += m["rd_bits"] + (0 if rom else width * cell.depth)
            f["rom_bits" if rom else "ram_bits"] += width * cell.depth
    for width, depth, rom, banks in banked.values():
        f["logic_memory_lut"] += logic_memory_cost(width, depth, rom)["lut"]
        f["mux"] -= (banks - 1) * width         # the bank multiplexers, counted above
    return f


# ---------------------------------------------------------------------------------------------
# Estimates

#: LUTs per unit of each :data:`LUT_FEATURES` entry, per family: non-negative least squares
#: (rows weighted by 1/sqrt(LUTs), then scaled so that the sum over all stages is right) on
#: yosys 0.70 syntheses of the single stages of ten designs (130 iCE40 and 130 ECP5 stages,
#: stored in ``benchmarks/resources_fit.jsonl``; ``benchmarks/resources.py --fit`` measures
#: them again, ``--fit --stale-from`` only the stages whose features changed, ``--fit-from``
#: refits; iCE40: SB_LUT4 cells; ECP5: LUT4 + 2 per CCU2C + 2 per TRELLIS_DPR16X4; the
#: iCE40 rows elaborate the iCE40-only digit products of RequantCore and MatVecCore, the ECP5
#: rows the registered MULT18X18D instances). Per design the fit is within -7..+5 % of the
#: synthesized total on iCE40 but for the two 4-bit MLPs (-27 % and -16 %: digit-product and
#: threshold stages are underestimated), ECP5 -9..+6 % but for the 4-bit MLPs (-16 %, -22 %)
#: and the 3-bit MLP with 256-term adder trees (-15 %); a layer's figure is rougher than a
#: design's. The features are correlated: a
#: zero weight means that another feature carries the cost, not that the operator is free.
#: ``"pnr"``: board-report LUTs over synthesized LUTs of a whole design (ECP5: nextpnr's
#: TRELLIS_COMB adds pass-through LUTs, 1627 over 1373 on the digits example; iCE40: the
#: report counts the synthesized SB_LUT4 cells).
LUT_COEFFICIENTS = {
    "ice40": {"add": 0.1476, "cmp": 0.0001, "mux": 0.7566, "assign": 0.097, "logic": 0.3009,
              "soft_mul": 0.8613, "rom_bits": 0.1376, "ram_bits": 0.5653, "mem_cells": 0.0,
              "ff": 0.1312, "one": 3.3817, "pnr": 1.0},
    "ecp5": {"add": 0.2929, "cmp": 0.1263, "mux": 1.0766, "assign": 0.0976, "logic": 0.0826,
             "soft_mul": 0.0273, "rom_bits": 0.1183, "ram_bits": 0.0, "mem_cells": 3.385,
             "ff": 0.1294, "one": 1.7272, "pnr": 1.185},
}

#: The board wrapper (framed UART host link, :mod:`onnx2fpga.boards.framed`, with its 16-byte
#: receive FIFO). FFs and block RAMs: a board build of a 1-byte loopback accelerator
#: (:class:`~onnx2fpga.boards.loopback.ByteIncrement`, its own 10 FFs taken off) plus one FF
#: per ``tdata`` bit beyond 8 on either side. LUTs: the median over the board builds of
#: ``benchmarks/resources.py`` of the board's LUTs minus the accelerator's estimate (ECP5: 6
#: builds, 364..684 but for one outlier; iCE40: 3 builds, 359, 443 and 866, one of them the
#: design of the synth test in ``tests/test_hw_resources.py``): the loopback build's
#: 206 (ECP5) and 161 (iCE40) LUTs are far below what the wrapper costs next to a real
#: accelerator, and no width term fitted. Calibrated on the benchmark's own designs: a rough
#: figure.
WRAPPER = {
    "ice40": {"lut": 443, "ff": 140, "dsp": 0, "bram": 1, "lut_per_bit": 0.0,
              "ff_per_bit": 1.0},
    "ecp5": {"lut": 580, "ff": 122, "dsp": 0, "bram": 0, "lut_per_bit": 0.0,
             "ff_per_bit": 1.0},
}


#: The wrapper's receive FIFO (``boards/link.py``, a ``SyncFIFOBuffered`` of 16 bytes): the
#: width and depth of its memory.
WRAPPER_RX_FIFO = (8, 15)


def wrapper_resources(in_tdata_width: int, in_beats: int, out_tdata_width: int,
                      family: str, *, logic=frozenset(), in_payload_width=None,
                      memories: bool = False) -> dict:
    """The board wrapper of an accelerator whose input port has ``in_beats`` transfers of
    ``in_tdata_width`` bits per tensor and whose output is ``out_tdata_width`` bits wide:
    :data:`WRAPPER` plus the input buffer (a RAM, :func:`memory_mapping`) of
    ``in_payload_width`` bits a beat (default ``in_tdata_width``; the wrapper keeps the
    elements' bits only). ``logic`` may name ``"wrapper/buffer"`` and ``"wrapper/rx_fifo"``
    (the receive FIFO, a block RAM on iCE40): in soft logic. With ``memories``, also
    ``"block_memories"`` as :func:`stage_resources` lists them."""
    _check_family(family)
    width = in_tdata_width if in_payload_width is None else in_payload_width
    w = WRAPPER[family]
    extra = max(0, in_tdata_width - 8) + max(0, out_tdata_width - 8)
    out = {"lut": w["lut"] + w["lut_per_bit"] * extra, "ff": w["ff"] + w["ff_per_bit"] * extra,
           "dsp": 0, "bram": w["bram"]}
    # The feeder's skid register (boards/framed.py): per payload bit, the output and skid
    # flip-flops and the multiplexer in front of the output.
    out["lut"] += width
    out["ff"] += 2 * width
    blocks = []
    if w["bram"] and "wrapper/rx_fifo" in logic:
        cost = logic_memory_cost(*WRAPPER_RX_FIFO, False)
        out["bram"] -= w["bram"]
        out["lut"] += cost["lut"]
        out["ff"] += cost["ff"]
    elif w["bram"]:
        blocks.append(("wrapper/rx_fifo", w["bram"], *WRAPPER_RX_FIFO, False))
    mm = memory_mapping(width, in_beats, family, rom=False)
    bits = width * in_beats
    if "wrapper/buffer" in logic:
        cost = logic_memory_cost(width, in_beats, False)
        out["lut"] += cost["lut"]
        out["ff"] += cost["ff"]
    elif mm.kind == "block":
        out["bram"] += mm.cells
        blocks.append(("wrapper/buffer", mm.cells, width, in_beats, False))
    elif mm.kind == "distributed":
        out["lut"] += LUT_COEFFICIENTS[family]["mem_cells"] * mm.cells
        out["ff"] += width
    else:
        out["lut"] += LUT_COEFFICIENTS[family]["ram_bits"] * bits
        out["ff"] += bits + width
    out = {k: int(round(v)) for k, v in out.items()}
    if memories:
        out["block_memories"] = blocks
    return out


def _estimate(feats: dict, family: str) -> dict:
    c = LUT_COEFFICIENTS[family]
    lut = (sum(c[k] * feats[k] for k in LUT_FEATURES) + feats.get("logic_memory_lut", 0)) \
        * c["pnr"]
    return {"lut": int(round(lut)), "ff": int(feats["ff"]), "dsp": int(feats["dsp"]),
            "bram": int(feats["bram"])}


def stage_resources(stage, family: str, *, ice40_dsp: bool = False, logic=frozenset(),
                    memories: bool = False) -> dict:
    """Estimated resources of one :class:`~onnx2fpga.hw.graph.Stage` on ``family``.

    The stage's core is built from its parameters (as :class:`~onnx2fpga.hw.top.Accelerator`
    does) and read by :func:`netlist_features`. ``logic``: the memories of the design in
    soft logic, ``"stage/memory"`` (:data:`Dataflow.logic_memories
    <onnx2fpga.ir.Dataflow>`); with ``memories``, also ``"block_memories"``: the
    stage's memories in block RAM, ``[(name, cells, width, depth, rom), ...]`` (``name``
    ``"stage/memory"``).

    Returns
    -------
    dict
        ``lut``, ``ff`` (estimates), ``dsp``, ``bram`` (what yosys 0.70 infers; block RAMs
        are ``SB_RAM40_4K`` on iCE40, ``DP16KD`` on ECP5).
    """
    from .graph import Stage
    from .top import _make_core

    if not isinstance(stage, Stage):
        raise TypeError(f"stage must be a Stage, not {stage!r}")
    _check_family(family)
    core = _make_core(stage)
    if core is None:                                    # a cast: wires
        return {"lut": 0, "ff": 0, "dsp": 0, "bram": 0, **({"block_memories": []}
                                                            if memories else {})}
    core._MustUse__used = True
    prefix = f"{stage.name}/"
    mine = frozenset(k[len(prefix):] for k in logic if k.startswith(prefix))
    feats = netlist_features(core, family, ice40_dsp=ice40_dsp, logic=mine)
    out = _estimate(feats, family)
    if memories:
        out["block_memories"] = [(prefix + n, mm.cells, w, d, rom) for n, (w, d, rom, mm)
                                 in zip(feats["memory_names"], feats["memories"])
                                 if mm.kind == "block"]
    return out


def _add(a: dict, b: dict) -> dict:
    return {k: a[k] + b[k] for k in ("lut", "ff", "dsp", "bram")}


def is_shift_register_buffer(name: str) -> bool:
    """``name`` (``"stage/memory"``) is a MatVec input buffer, which soft logic holds as
    shift registers (:class:`~onnx2fpga.hw.cores.MatVecCore`'s ``x_logic``), not as a
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
        return {"lut": int(round(0.131 * bits + width)), "ff": int(width)}
    return {"lut": int(round(0.89 * bits + depth)), "ff": int(bits + width)}


def dataflow_resources(dataflow, family: str, *, ice40_dsp: bool = False,
                       wrapper: bool = False, memories: bool = False) -> dict:
    """Estimated resources of the accelerator of ``dataflow`` on ``family``, the memories of
    ``dataflow.logic_memories`` in soft logic.

    Returns
    -------
    dict
        ``"layers"``: ``[{"name", "lut", "ff", "dsp", "bram"}, ...]`` in dataflow order, each
        the sum of the layer's stages (its cores and the FIFO after it); ``"edges"``: the
        stages between layers (lane converters, broadcasts, reorders, edge FIFOs);
        ``"total"``: the accelerator; with ``wrapper``, also ``"wrapper"`` (:data:`WRAPPER`)
        and ``"board"`` (total plus wrapper). With ``memories``, ``"block_memories"``: every
        memory in block RAM, ``[(name, cells, width, depth, rom), ...]`` (the wrapper's too,
        with ``wrapper``; names as in ``logic_memories``).
    """
    from .graph import plan_graph

    _check_family(family)
    plan = plan_graph(dataflow)
    zero = {"lut": 0, "ff": 0, "dsp": 0, "bram": 0}
    logic = frozenset(getattr(dataflow, "logic_memories", ()) or ())
    per_stage = {s.name: stage_resources(s, family, ice40_dsp=ice40_dsp, logic=logic,
                                         memories=True) for s in plan.stages}
    blocks = [b for r in per_stage.values() for b in r.pop("block_memories")]
    layers, owned = [], set()
    for layer in dataflow.layers:
        acc = dict(zero)
        for name in plan.layer_stages.get(layer.name, []):
            acc = _add(acc, per_stage[name])
            owned.add(name)
        layers.append({"name": layer.name, **acc})
    edges = dict(zero)
    for name, r in per_stage.items():
        if name not in owned:
            edges = _add(edges, r)
    total = edges
    for entry in layers:
        total = _add(total, entry)
    out = {"total": total, "layers": layers, "edges": edges}
    if wrapper:
        inp, outp = dataflow.input, dataflow.output
        out["wrapper"] = wrapper_resources(inp.tdata_width, inp.beats, outp.tdata_width, family,
                                           logic=logic, in_payload_width=inp.payload_width,
                                           memories=True)
        blocks += out["wrapper"].pop("block_memories")
        out["board"] = _add(total, out["wrapper"])
    if memories:
        out["block_memories"] = blocks
    return out
