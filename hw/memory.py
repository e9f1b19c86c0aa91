"""Memories of the cores: weight ROMs in soft logic read from banks in two steps, ECP5 weight
ROMs in column slices, flat memories of a layout, and double buffers.
"""

from __future__ import annotations

import numpy as np
from amaranth import (
    Array,
    Const,
    Module,
    Mux,
    Shape,
    Signal,
    Value,
    unsigned,
)
from amaranth.lib.memory import Memory

from ..plan.devices import memory_mapping, varying_columns
from .arith import is_ecp5
from .blocks import counter, wrap_incr

__all__ = [
    "LOGIC_ROM_BANK_WORDS", "logic_rom_banks", "banked_rom", "WritePort", "ReadPort",
    "ROM_SLICE_BLOCKS", "rom_columns", "rom_slices", "flat_memory", "word_ints",
    "varying_fields", "double_buffer_writer", "double_buffer_release", "rom_bank_depth",
    "BankedRom",
]


#: Words per bank of a weight ROM in soft logic (:func:`banked_rom`): a LUT4 holds 16
#: words and each further address bit is a level of 2:1 multiplexers (iCE40 has no wider
#: multiplexer primitive), so a bank is read through 3 LUT levels. TFC_2W2A's 4096 x 2
#: weight ROM on an iCE40 UP5K read in one
#: step (9 levels) closed at 31.6 MHz; in banks of 256 words (5 levels) at 36.4 MHz, the
#: bank read still its critical path (27.5 ns, 15 of them routing: each address bit reaches
#: hundreds of LUTs).
LOGIC_ROM_BANK_WORDS = 64



def logic_rom_banks(depth: int) -> int:
    """Banks of a ``depth``-word ROM in soft logic read in two steps by :func:`banked_rom`:
    ``ceil(depth / LOGIC_ROM_BANK_WORDS)`` banks of :data:`LOGIC_ROM_BANK_WORDS` words (the
    second step picks one through a level of 2:1 multiplexers per bit of the bank number,
    a short path from registers nearby); 1 (one step) up to twice that many words."""
    if depth <= 2 * LOGIC_ROM_BANK_WORDS:
        return 1
    return -(-depth // LOGIC_ROM_BANK_WORDS)



def banked_rom(m: Module, name: str, width: int, words: list, addr_lo=(), depth=None):
    """A ROM of ``words`` (ints of ``width`` bits; ``depth`` words, default ``len(words)``:
    the rest zeros) in :func:`logic_rom_banks` memories
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
    depth = len(words) if depth is None else depth
    banks = logic_rom_banks(depth)
    addr = Signal(range(max(depth, 2)), name=f"{name}_addr")
    en = Signal(name=f"{name}_en")
    hi = Signal(range(max(banks, 2)), name=f"{name}_hi")
    with m.If(en):
        m.d.sync += hi.eq(addr >> bank_bits)
    datas = []
    for n in range(banks):
        mem = Memory(shape=unsigned(width), depth=bank_words,
                     init=words[n * bank_words:(n + 1) * bank_words])
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
    return ReadPort(addr, en), datas[0]



class WritePort:
    """The ``addr``, ``data`` and ``en`` of a write port that is no memory's."""

    def __init__(self, addr, data, en):
        self.addr, self.data, self.en = addr, data, en



class ReadPort:
    """The ``addr`` and ``en`` of a read port that is no memory's (:func:`banked_rom`)."""

    def __init__(self, addr, en):
        self.addr, self.en = addr, en


#: Block RAMs per column slice of a MatVec weight ROM on an ECP5 (:func:`rom_columns`).
ROM_SLICE_BLOCKS = 4



def rom_columns(platform, words: list, width: int) -> list:
    """:func:`rom_slices` of a weight ROM of ``words`` (ints of ``width`` bits)."""
    if not words:
        return [(0, width)]
    return rom_slices(platform, varying_columns(words), len(words), width)



def rom_slices(platform, varying: int, depth: int, width: int, *, block: bool = False) -> list:
    """Bit ranges ``[(lo, hi), ...]`` of the column slices a weight ROM of ``depth`` words of
    ``width`` bits, the columns of mask ``varying`` not the same in every word
    (:func:`~onnx2fpga.plan.devices.varying_columns`), is built from: on an ECP5, when yosys
    would put it in more than :data:`ROM_SLICE_BLOCKS` block RAMs, slices of that many
    blocks' native width counted in the columns that vary (yosys drops a ROM's constant
    columns, per memory), the last slice the rest (joined to the one before where it would
    be left to LUTs); otherwise one range. Only when every slice still takes block RAMs and
    all of them no more than the whole ROM: TFC_2W2A's 64-word ROMs cut by plain bit ranges
    fell into LUTs (27 fewer DP16KD, 3,500 more LUTs). With ``block``, the ROM and its slices
    carry :data:`~onnx2fpga.plan.devices.BLOCK_STYLE`: each takes block RAMs."""
    whole = [(0, width)]
    if not is_ecp5(platform) or not depth:
        return whole
    mm = memory_mapping(max(1, varying.bit_count()), depth, "ecp5", rom=True, block=block)
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
        if memory_mapping(max(1, rest), depth, "ecp5", rom=True, block=block).kind != "block":
            cols[-2:] = [(cols[-2][0], width)]
    cells = 0
    for c_lo, c_hi in cols:
        bits = ((varying >> c_lo) & ((1 << (c_hi - c_lo)) - 1)).bit_count()
        part = memory_mapping(max(1, bits), depth, "ecp5", rom=True, block=block)
        if part.kind != "block" and bits:
            return whole
        cells += part.cells
    return cols if cells <= mm.cells else whole



def rom_bank_depth(bits: int, depth: int, *, block: bool = False) -> int:
    """Words per bank of an ECP5 block-RAM ROM of ``depth`` words of ``bits`` varying bits
    that yosys would split by depth (a block's words multiplexed behind the blocks: 36 x
    4096 takes 8 DP16KD as 2048 x 9, two deep), or 0 where it would not. Built as
    :class:`BankedRom` instead, each bank's read has a register of its own (the block RAM's
    output register, :mod:`onnx2fpga.boards.outreg`) and the multiplexer follows them."""
    mm = memory_mapping(max(1, bits), depth, "ecp5", rom=True, block=block)
    return mm.depth if mm.kind == "block" and mm.depth < depth else 0


class BankedRom:
    """A ROM of ``depth`` words of ``width`` bits as banks of ``bank_depth`` words
    (memories ``{name}_bank{n}``), with a read port's ``addr``, ``en`` and ``data`` (the word
    one enabled edge after its address, as a memory's), and :meth:`registered`: that word a
    stage later, from one register per bank (no reset, nothing in front) and a multiplexer
    behind them."""

    def __init__(self, m: Module, name: str, width: int, depth: int, bank_depth: int, init,
                 attrs=None):
        self._m = m
        low = bank_depth.bit_length() - 1
        banks = -(-depth // bank_depth)
        self.addr = Signal(range(max(depth, 2)), name=f"{name}_addr")
        self.en = Signal(name=f"{name}_ren")
        self._sel = Signal(range(max(banks, 2)), name=f"{name}_sel")
        with m.If(self.en):
            m.d.sync += self._sel.eq(self.addr[low:])
        self._datas = []
        for n in range(banks):
            mem = Memory(shape=unsigned(width), depth=min(bank_depth, depth - n * bank_depth),
                         init=list(init[n * bank_depth:(n + 1) * bank_depth]), attrs=attrs)
            m.submodules[f"{name}_bank{n}"] = mem
            rd = mem.read_port()
            m.d.comb += [rd.addr.eq(self.addr[:low]), rd.en.eq(self.en)]
            self._datas.append(rd.data)
        self.data = Array(self._datas)[self._sel]
        self._name = name

    def registered(self, load) -> Value:
        """The word of :attr:`data` taken with ``load`` (registers of every bank and of the
        bank's number, loaded together)."""
        m = self._m
        regs = [Signal.like(d, name=f"{self._name}_bank{n}_read", reset_less=True)
                for n, d in enumerate(self._datas)]
        sel = Signal.like(self._sel, name=f"{self._name}_sel_read")
        with m.If(load):
            m.d.sync += [r.eq(d) for r, d in zip(regs, self._datas)]
            m.d.sync += sel.eq(self._sel)
        return Array(regs)[sel]


def flat_memory(layout, depth: int, init) -> Memory:
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



#: Fields packed per step of :func:`word_ints` (bounds its temporary arrays).
_PACK_CHUNK = 1 << 20


def word_ints(fields, bits: int) -> list:
    """The words of a ROM whose word ``n`` holds ``fields[n, k]`` (integers, two's complement
    when negative) in bits ``[k * bits, (k + 1) * bits)``, as ints: the values
    ``Const.cast(layout.const(...)).value`` gives for an ``ArrayLayout`` of ``bits``-bit
    elements, packed with numpy (1 M 8-bit weights in words of 8: 0.26 s, where converting
    them through the layout took 22 s)."""
    fields = np.asarray(fields)
    rows, k = fields.shape
    mask = (1 << bits) - 1
    shifts = np.arange(bits, dtype=np.uint64)
    out = []
    step = max(1, _PACK_CHUNK // max(1, k * bits))
    for lo in range(0, rows, step):
        u = (fields[lo:lo + step].astype(np.int64) & mask).astype(np.uint64)
        b = ((u[:, :, None] >> shifts) & np.uint64(1)).astype(np.uint8)
        packed = np.packbits(b.reshape(len(u), k * bits), axis=1, bitorder="little")
        out += [int.from_bytes(row.tobytes(), "little") for row in packed]
    return out


def varying_fields(fields, bits: int) -> int:
    """:func:`~onnx2fpga.plan.devices.varying_columns` of the words :func:`word_ints` packs
    from ``fields``, from the fields themselves: the bits of field ``k`` that differ from
    word 0's in some word."""
    fields = np.asarray(fields)
    if len(fields) < 2:
        return 0
    u = fields.astype(np.int64) & ((1 << bits) - 1)
    diff = np.bitwise_or.reduce(u ^ u[0], axis=0)
    return word_ints(diff[None, :], bits)[0]



def double_buffer_writer(m: Module, i_stream, wr, words: int, data=None, registered=False):
    """The write side of a double buffer: a memory of two banks of ``words`` words (bank 0 at
    ``[0, words)``, bank 1 at ``[words, 2*words)``) that ``i_stream`` fills in turn.

    Each transfer is written through the write port ``wr`` (its payload, or ``data`` computed
    from it); ``i_stream.ready`` is high while
    the bank being written is not full. A bank becomes full with its last word and empty when
    the reader is done with it (:func:`double_buffer_release`, added once the reader is built).
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
    waddr = counter(2 * words)                 # the address over both banks
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
        m.d.sync += waddr.eq(wrap_incr(waddr, 2 * words))
        with m.If(set0):
            m.d.sync += wb.eq(1)
        with m.If(set1):
            m.d.sync += wb.eq(0)
    return (full0, full1), (set0, set1)



def double_buffer_release(m: Module, full, fill, done, rb):
    """The ``full`` flags of :func:`double_buffer_writer`: bank ``b`` becomes full with
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
