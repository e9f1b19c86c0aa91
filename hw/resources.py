"""Resource estimates (LUTs, flip-flops, DSPs, block RAMs) of the generated hardware, before
any synthesis.

Each :class:`~onnx2fpga.plan.graph.Stage` is elaborated into Amaranth's netlist (no Verilog, no
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

from amaranth import Elaboratable, Module

from ..plan.devices import (
    BLOCK_STYLE,
    ECP5_DSP_BITS,
    FAMILIES,
    NO_RW_CHECK,
    MemoryMap,
    carries,
    check_family,
    const_multiplier_bits,
    logic_memory_cost,
    memory_mapping,
    multiplier_dsps,
    operand_pieces,
    varying_columns,
)
from ..plan.cmvm import cmvm_resources
from ..plan.graph import plan_graph
from ..plan.stage import Stage, value_key
from .chains import CCU2C_LUTS
from .collect import fewer_collections
from ..plan.engine import ENGINE_SPRAMS
from ..plan.spram import spram_layout, weight_memories
from .flashload import SpramLoader
from .spram import SpramStore
from .engine import LayerEngine
from .top import make_core

__all__ = [
    "netlist_features", "memory_path", "stage_resources", "dataflow_resources", "WRAPPER",
    "WRAPPER_RX_FIFO", "wrapper_resources", "LUT_FEATURES", "LUT_COEFFICIENTS", "stage_key",
    "STAGE_CACHE_SIZE", "PRODUCT_STAGES", "PLATFORM_STAGES", "estimate_netlist",
    "read_netlist", "REQUANT_STAGES", "stage_part", "spram_loader_resources",
    "logic_weight_roms", "BLOCK_ROM_MIN_WORDS", "elaboratable_resources", "engine_resources",
]


# ---------------------------------------------------------------------------------------------
# Multipliers


# ---------------------------------------------------------------------------------------------
# Memories


# ---------------------------------------------------------------------------------------------
# Reading the netlist


def _platform(family):
    """A platform object the cores elaborate for, as a board build does: the iCE40 one makes
    :class:`~onnx2fpga.hw.requant.RequantCore` cut its products for LUTs, the ECP5 one puts
    :class:`~onnx2fpga.hw.matvec.MatVecCore`'s hard products in registered ``MULT18X18D``."""
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


def memory_path(netlist, cell) -> str:
    """The name of memory ``cell`` of ``netlist`` relative to the netlist's top module:
    ``"w_mem"``, or ``"fifo.storage"`` inside a submodule (the names yosys sees under the
    core's module)."""
    return ".".join(netlist.modules[cell.module_idx].name[1:] + (cell.name,))


def _unbanked(name: str) -> str:
    """The memory a bank ``{memory}_bank{n}`` is part of (see
    :func:`onnx2fpga.hw.memory.logic_rom_banks`); ``name`` if it is no bank."""
    base, sep, n = name.rpartition("_bank")
    return base if sep and n.isdigit() else name


def netlist_features(elaboratable, family: str, *, ice40_dsp: bool = False,
                     logic=frozenset(), stand_ins=None) -> dict:
    """Read what yosys will build from one elaboratable (a core): its multipliers, memories
    and flip-flops, and the operator counts the LUT model weighs.

    ``logic``: names (:func:`memory_path`) of memories the build forces into soft logic
    (yosys' ``logic_block`` attribute, see :func:`onnx2fpga.boards.build.logic_memory_script`).
    ``stand_ins``: ``{name: (width, depth)}`` of ROMs elaborated as stand-ins (a core's
    ``rom_stand_in``), counted with that shape (``width``: the columns that vary) instead of
    the stand-in's.

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
    check_family(family)
    return read_netlist(estimate_netlist(elaboratable, family), family, ice40_dsp=ice40_dsp,
                        logic=logic, stand_ins=stand_ins)


def estimate_netlist(elaboratable, family: str):
    """Amaranth's netlist of ``elaboratable`` elaborated for ``family``'s platform, as
    ``build_netlist`` makes it but without what only the Verilog back end needs: the
    combinational-loop check, net flows and port directions (a third of its time on the
    MLPerf Tiny designs). The cells, their nets resolved, are the same; the Verilog emission
    of the whole design still runs every check."""
    from amaranth.hdl import Fragment, _ir, _nir

    check_family(family)
    platform = _platform(family)
    # ECP5 carry-chain cells (hw.chains) are counted, not instantiated.
    platform.chain_cells = [0]
    design = Fragment.get(elaboratable, platform).prepare(hierarchy=("top",))
    netlist = _nir.Netlist()
    _ir._emit_netlist(netlist, design, all_undef_to_ff=False)
    for cell in netlist.cells:
        cell.resolve_nets(netlist)
    netlist.chain_cells = platform.chain_cells[0]
    return netlist


def read_netlist(netlist, family: str, *, ice40_dsp: bool = False, logic=frozenset(),
                 stand_ins=None) -> dict:
    """:func:`netlist_features` of a netlist already built (:func:`estimate_netlist`), read
    for ``family``: a core whose elaboration does not depend on the platform is built once
    and read for both families."""
    from amaranth.hdl import _nir

    check_family(family)
    stand_ins = stand_ins or {}
    f = dict.fromkeys(LUT_FEATURES, 0)
    f["one"] = 1
    f.update(dsp=0, bram=0, memories=[], memory_names=[], multipliers=[], logic_memory_lut=0,
             ccu2c=getattr(netlist, "chain_cells", 0))
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
        elif isinstance(cell, _nir.Instance) and cell.type == "CCU2C":
            # Two bits of an ECP5 carry chain (hw.chains): two LUTs, whatever they compute.
            f["ccu2c"] += 1
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
                    f["soft_mul"] += sum(p * b for p in operand_pieces(a, size) if p < 2) + \
                        sum(p * a for p in operand_pieces(b, size) if p < 2)
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
        # A stand-in's real depth (its width is the real one).
        depth = stand_ins[name][1] if name in stand_ins else cell.depth
        if name in logic:
            # Forced into soft logic: costed by its own rule, not by the LUT model's
            # features (fitted on the small memories yosys leaves in logic by itself).
            mm = MemoryMap("logic", 0)
            f["memories"].append((cell.width, depth, rom, mm))
            f["memory_names"].append(name)
            cost = logic_memory_cost(cell.width, depth, rom)
            f["logic_memory_lut"] += cost["lut"]
            f["ff"] += cost["ff"]
            continue
        width = cell.width
        if name in stand_ins:
            width = stand_ins[name][0]
        elif rom:
            # Two's complement bit patterns: a signed ROM (a LutCore's table of a signed
            # type) holds negative words, whose XOR would count sign bits without end.
            mask = (1 << cell.width) - 1
            width = max(1, varying_columns([int(v) & mask for v in cell.init]).bit_count())
        block = rom and carries(cell.attributes, BLOCK_STYLE)
        rw_check = not carries(cell.attributes, NO_RW_CHECK)
        mm = memory_mapping(width, depth, family, rom=rom, sync_read=m["async"] == 0,
                            block=block, rw_check=rw_check)
        f["memories"].append((width, depth, rom, mm))
        f["memory_names"].append(name)
        if mm.kind == "block":
            f["bram"] += mm.cells
        elif mm.kind == "distributed":
            f["mem_cells"] += mm.cells
            f["ff"] += m["rd_bits"]
        else:
            f["ff"] += m["rd_bits"] + (0 if rom else width * depth)
            f["rom_bits" if rom else "ram_bits"] += width * depth
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


#: Input buffer rows per memory bank of the board wrapper (``boards/framed.py``): an ECP5
#: DP16KD holds 2,048 rows of up to 9 bits, so a bank of any width is a row of block RAMs
#: side by side, with no multiplexer behind them; a longer input takes several banks, whose
#: outputs are registered before one is chosen.
WRAPPER_BANK_BEATS = 2048

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
    check_family(family)
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
    # (The buffer carries NO_RW_CHECK: boards.framed.)
    mm = memory_mapping(width, in_beats, family, rom=False, rw_check=False)
    bits = width * in_beats
    banks = -(-in_beats // WRAPPER_BANK_BEATS)
    if banks > 1:
        # Each bank's output register, the chosen bank's register and its multiplexer.
        out["ff"] += (banks + 1) * width
        out["lut"] += width * -(-(banks - 1) // 3)
    if "wrapper/buffer" in logic:
        cost = logic_memory_cost(width, in_beats, False)
        out["lut"] += cost["lut"]
        out["ff"] += cost["ff"]
    elif mm.kind == "block":
        depths = [min(WRAPPER_BANK_BEATS, in_beats - b * WRAPPER_BANK_BEATS)
                  for b in range(banks)]
        cells = sum(memory_mapping(width, d, family, rom=False, rw_check=False).cells
                    for d in depths)
        out["bram"] += cells
        blocks.append(("wrapper/buffer", cells, width, in_beats, False))
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


def elaboratable_resources(elaboratable, family: str) -> dict:
    """Estimated ``lut``, ``ff``, ``dsp`` and ``bram`` of a whole elaboratable (the layer
    engine) on ``family``, read from its netlist as a core's are."""
    return _estimate(netlist_features(elaboratable, family), family)


def engine_resources(program, family: str, weights: str) -> dict:
    """The layer engine of ``program`` (its weights in ``"spram"`` or a ``"rom"``) on
    ``family``: ``"total"`` (read from its netlist), ``"wrapper"`` (the board wrapper of its
    one-byte ports) and ``"board"`` (both; on iCE40 with weights in SPRAM also ``"spram"``,
    the SPRAMs it takes)."""
    top = LayerEngine(program, weights=weights)
    top._MustUse__used = True           # built for its figures, never elaborated here
    total = elaboratable_resources(top, family)
    wrap = wrapper_resources(8, program.in_size, 8, family)
    wrap = {k: wrap[k] for k in total}
    board = {k: total[k] + wrap[k] for k in total}
    if weights == "spram" and family == "ice40":
        board["spram"] = ENGINE_SPRAMS
    return {"total": total, "wrapper": wrap, "board": board}


def _estimate(feats: dict, family: str) -> dict:
    c = LUT_COEFFICIENTS[family]
    lut = (sum(c[k] * feats[k] for k in LUT_FEATURES) + feats.get("logic_memory_lut", 0)
           + CCU2C_LUTS * feats.get("ccu2c", 0)) * c["pnr"]
    return {"lut": int(round(lut)), "ff": int(feats["ff"]), "dsp": int(feats["dsp"]),
            "bram": int(feats["bram"])}


def stage_resources(stage, family: str, *, ice40_dsp: bool = False, logic=frozenset(),
                    memories: bool = False) -> dict:
    """Estimated resources of one :class:`~onnx2fpga.plan.graph.Stage` on ``family``.

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

    if not isinstance(stage, Stage):
        raise TypeError(f"stage must be a Stage, not {stage!r}")
    check_family(family)
    prefix = f"{stage.name}/"
    mine = frozenset(k[len(prefix):] for k in logic if k.startswith(prefix))
    key = stage_key(stage)
    if key is not None:
        out = _STAGE_CACHE.get((key, family, ice40_dsp, mine))
        if out is None:
            # Both families' estimates of a core that elaborates alike on both are read
            # from one netlist: the manifest's estimate for the other family then finds
            # them here.
            for fam, est in _stage_estimate(stage, family, ice40_dsp, mine).items():
                _STAGE_CACHE[(key, fam, ice40_dsp, mine)] = est
            out = _STAGE_CACHE[(key, family, ice40_dsp, mine)]
            while len(_STAGE_CACHE) > STAGE_CACHE_SIZE:
                del _STAGE_CACHE[next(iter(_STAGE_CACHE))]      # the oldest
    else:
        out = _stage_estimate(stage, family, ice40_dsp, mine)[family]
    res = {k: out[k] for k in ("lut", "ff", "dsp", "bram")}
    if memories:
        res["block_memories"] = [(prefix + n, *rest) for n, *rest in out["block_memories"]]
    return res


#: Stage estimates kept (:func:`stage_resources`): board folding estimates a design for
#: every rate it tries, and most of its cores (plumbing, the layers whose folding did not
#: change) come back unchanged from one try to the next.
STAGE_CACHE_SIZE = 20000
_STAGE_CACHE: dict = {}


def stage_key(stage) -> tuple | None:
    """What the core of ``stage`` is built from (:func:`~onnx2fpga.hw.top.make_core`): its
    kind, types, lanes, sizes and parameters, arrays by their contents (a digest); not its
    name, nets or layer. ``None`` if a parameter is of a type this does not know."""
    try:
        return (stage.kind, stage.in_type, stage.out_type, stage.in_lanes, stage.out_lanes,
                stage.size, stage.in_size, value_key(stage.params))
    except TypeError:
        return None


def _stage_estimate(stage, family, ice40_dsp, mine) -> dict:
    """The estimate of one stage, its block memories named relative to the stage:
    ``{family: estimate}``, with the other family's too when the core's elaboration does not
    depend on the platform (its kind is not in :data:`PLATFORM_STAGES`)."""
    if stage.kind == "cmvm":          # from the adder graph itself (plan.cmvm.CMVM_COST)
        p = stage.params
        return {fam: {"dsp": 0, "block_memories": [],
                      **cmvm_resources(p["graph"], p["levels_per_stage"], stage.out_type.bits,
                                       fam, p.get("fused"))} for fam in FAMILIES}
    core = make_core(stage, rom_stand_in=True)
    if core is None:                                    # a cast: wires
        return {family: {"lut": 0, "ff": 0, "dsp": 0, "bram": 0, "block_memories": []}}
    core._MustUse__used = True
    stand_ins = core.weight_rom_shapes(_platform(family)) \
        if hasattr(core, "weight_rom_shapes") else None
    families = (family,) if stage.kind in PLATFORM_STAGES else FAMILIES
    out = {}
    with fewer_collections():
        netlist = estimate_netlist(core, family)
        for fam in families:
            feats = read_netlist(netlist, fam, ice40_dsp=ice40_dsp, logic=mine,
                                 stand_ins=stand_ins)
            est = out[fam] = _estimate(feats, fam)
            est["block_memories"] = [(n, mm.cells, w, d, rom) for n, (w, d, rom, mm)
                                     in zip(feats["memory_names"], feats["memories"])
                                     if mm.kind == "block"]
    return out


#: Stage kinds whose cores elaborate differently per platform (:mod:`onnx2fpga.hw.arith`'s
#: ``is_ecp5``, ``is_ice40``, ``mul_chunks``; :func:`~onnx2fpga.hw.memory.rom_slices`): their
#: estimate is elaborated for each family; every other core is built once for both.
PLATFORM_STAGES = frozenset({"matvec", "requant", "depthwise"})

#: Stage kinds that compute a layer's products: what ``multipliers="lut"`` (a layer's
#: :func:`~onnx2fpga.ir.product_mapping`) moves into LUTs.
PRODUCT_STAGES = frozenset({"matvec", "depthwise"})
#: Stage kinds of a layer's requantization (its epilogue, however it is computed): their hard
#: multipliers stay where they are when the layer's products move into LUTs.
REQUANT_STAGES = frozenset({"requant", "threshold", "lut"})


def stage_part(kind: str) -> str | None:
    """Which part of its layer a stage of ``kind`` is: ``"products"``
    (:data:`PRODUCT_STAGES`), ``"requant"`` (:data:`REQUANT_STAGES`) or ``None`` (windows,
    reductions, joins, plumbing). :func:`dataflow_resources` counts each layer's parts with
    it; a new kind of requantization core adds its stage kind to :data:`REQUANT_STAGES`."""
    if kind in PRODUCT_STAGES:
        return "products"
    return "requant" if kind in REQUANT_STAGES else None


def _add(a: dict, b: dict) -> dict:
    return {k: a[k] + b[k] for k in ("lut", "ff", "dsp", "bram")}


class _WeightLoad(Elaboratable):
    """The SPRAM store and its loader, joined as the accelerator joins them (estimates)."""

    def __init__(self, slots):
        self.slots = slots

    def elaborate(self, platform):
        m = Module()
        m.submodules.store = store = SpramStore(self.slots)
        m.submodules.loader = loader = SpramLoader(self.slots)
        m.d.comb += [store.wr_spram.eq(loader.wr_spram), store.wr_addr.eq(loader.wr_addr),
                     store.wr_data.eq(loader.wr_data), store.wr_en.eq(loader.wr_en),
                     store.loading.eq(loader.loading)]
        for k in range(len(self.slots)):
            port = getattr(store, f"read{k}")
            m.d.sync += port.addr.eq(port.addr + 1)         # readers, as the cores drive them
            m.d.comb += port.en.eq(loader.done)
        return m


#: The fewest words of a weight ROM worth moving into block RAM (:func:`logic_weight_roms`):
#: yosys shares the LUTs of a shallow ROM's equal columns (a 4-word ROM has 16 distinct
#: columns at most; with 219 varying columns of 4 words in LUTs, a layer took 231 LUT4 in
#: all, 235 with the ROM in 7 DP16KD), where 32 words of 144 bits take 288 LUT4.
BLOCK_ROM_MIN_WORDS = 16


def logic_weight_roms(dataflow, family: str) -> list:
    """The MatVec weight ROMs of ``dataflow`` that yosys builds in LUTs on ``family`` (a ROM of
    few words, however wide), of at least :data:`BLOCK_ROM_MIN_WORDS` words, not yet named in
    ``dataflow.block_memories``:
    ``[(name, luts, blocks), ...]``, ``name`` ``"stage/w_mem"``, ``luts`` the ROM's part of the
    estimate (its bits at :data:`LUT_COEFFICIENTS`' ``rom_bits``, times ``pnr``; the design's
    estimate falls by less, as the core then reads the block RAMs through registers) and
    ``blocks`` the block RAMs it takes with :data:`~onnx2fpga.plan.devices.BLOCK_STYLE`."""
    check_family(family)
    c = LUT_COEFFICIENTS[family]
    skip = {*dataflow.logic_memories, *dataflow.spram_memories, *dataflow.block_memories}
    out = []
    for stage in plan_graph(dataflow).stages:
        name = f"{stage.name}/w_mem"
        if stage.kind != "matvec" or name in skip:
            continue
        core = make_core(stage, rom_stand_in=True)
        core._MustUse__used = True
        shapes = core.weight_rom_shapes(_platform(family))
        if list(shapes) != ["w_mem"]:
            continue                        # column slices: in block RAM already
        width, depth = shapes["w_mem"]
        if depth < BLOCK_ROM_MIN_WORDS or \
                memory_mapping(width, depth, family, rom=True).kind != "logic":
            continue
        blocks = memory_mapping(width, depth, family, rom=True, block=True).cells
        out.append((name, int(round(c["rom_bits"] * width * depth * c["pnr"])), blocks))
    return out


def spram_loader_resources(slots, family: str) -> dict:
    """``lut``, ``ff``, ``dsp``, ``bram`` of the SPRAM store of ``slots`` and its loader from
    flash (:class:`~onnx2fpga.hw.spram.SpramStore`, :class:`~onnx2fpga.hw.flashload.
    SpramLoader`): on iCE40 the SPRAMs are hard blocks, counted apart
    (``dataflow_resources``' ``"spram"``)."""
    feats = netlist_features(_WeightLoad(list(slots)), family)
    return _estimate(feats, family)


def dataflow_resources(dataflow, family: str, *, ice40_dsp: bool = False,
                       wrapper: bool = False, memories: bool = False) -> dict:
    """Estimated resources of the accelerator of ``dataflow`` on ``family``, the memories of
    ``dataflow.logic_memories`` in soft logic.

    Returns
    -------
    dict
        ``"layers"``: ``[{"name", "lut", "ff", "dsp", "bram", "products", "requant"}, ...]``
        in dataflow order, each the sum of the layer's stages (its cores and the FIFO after
        it), with ``"products"`` and ``"requant"`` the part of it in the stages
        :func:`stage_part` names so (each ``{"lut", "ff", "dsp", "bram"}``); ``"edges"``: the
        stages between layers (lane converters, broadcasts, reorders, edge FIFOs);
        ``"total"``: the accelerator (with weights in SPRAM, its store and loader too, also
        given apart as ``"spram_loader"``); with ``wrapper``, also ``"wrapper"``
        (:data:`WRAPPER`) and ``"board"`` (total plus wrapper; on iCE40 with weights in
        SPRAM, ``"spram"``: the SPRAMs they take). With ``memories``, ``"block_memories"``: every
        memory in block RAM, ``[(name, cells, width, depth, rom), ...]`` (the wrapper's too,
        with ``wrapper``; names as in ``logic_memories``).
    """

    check_family(family)
    plan = plan_graph(dataflow)
    zero = {"lut": 0, "ff": 0, "dsp": 0, "bram": 0}
    logic = frozenset(getattr(dataflow, "logic_memories", ()) or ())
    per_stage = {s.name: stage_resources(s, family, ice40_dsp=ice40_dsp, logic=logic,
                                         memories=True) for s in plan.stages}
    blocks = [b for r in per_stage.values() for b in r.pop("block_memories")]
    kinds = {s.name: s.kind for s in plan.stages}
    layers, owned = [], set()
    for layer in dataflow.layers:
        acc = dict(zero)
        parts = {"products": dict(zero), "requant": dict(zero)}
        for name in plan.layer_stages.get(layer.name, []):
            acc = _add(acc, per_stage[name])
            part = stage_part(kinds[name])
            if part is not None:
                parts[part] = _add(parts[part], per_stage[name])
            owned.add(name)
        layers.append({"name": layer.name, **acc, **parts})
    edges = dict(zero)
    for name, r in per_stage.items():
        if name not in owned:
            edges = _add(edges, r)
    total = edges
    for entry in layers:
        total = _add(total, entry)
    out = {"total": total, "layers": layers, "edges": edges}
    spram = list(getattr(dataflow, "spram_memories", ()) or ())
    if spram:
        slots = spram_layout([m for m in weight_memories(plan.stages) if m[0] in spram])
        out["spram_loader"] = spram_loader_resources(slots, family)
        total = out["total"] = _add(total, out["spram_loader"])
    if wrapper:
        inp, outp = dataflow.input, dataflow.output
        out["wrapper"] = wrapper_resources(inp.tdata_width, inp.beats, outp.tdata_width, family,
                                           logic=logic, in_payload_width=inp.payload_width,
                                           memories=True)
        blocks += out["wrapper"].pop("block_memories")
        out["board"] = _add(total, out["wrapper"])
        if spram and family == "ice40":
            out["board"]["spram"] = sum(s.count for s in slots)
    if memories:
        out["block_memories"] = blocks
    return out
