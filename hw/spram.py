"""Weights in the iCE40 UP5K's ``SB_SPRAM256KA``: the primitive (a behavioural model in
simulation, the hard block on a UP5K) and the weight store that gives each layer its SPRAMs.

The layout of the weights across the SPRAMs, how many weights a core may read per cycle from
them, the weight image and its place in the flash are planned in :mod:`onnx2fpga.plan.spram`;
the loader that writes the image into the store at start-up is :mod:`.flashload`.
"""

from __future__ import annotations

from amaranth import Array, Cat, ClockSignal, Instance, Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..plan.spram import SPRAM_BITS, SPRAM_WORDS, SpramSlot, spram_depths
from .arith import is_ice40

__all__ = ["SPRAM_UNDEFINED", "is_up5k", "Spram", "weight_read_signature", "SpramStore"]


#: What the behavioural model's ``DATAOUT`` shows where the primitive's is undefined: after a
#: write and after a cycle in standby. A value a test can tell from the weights it wrote.
SPRAM_UNDEFINED = 0xDEAD


def is_up5k(platform) -> bool:
    """Whether ``platform`` is an iCE40 UltraPlus (``iCE40UP...``), which has SPRAMs."""
    return is_ice40(platform) and str(getattr(platform, "device", "")).startswith("iCE40UP")


class Spram(wiring.Component):
    """One ``SB_SPRAM256KA``: 16,384 words of 16 bits, one port, clocked by ``sync``.

    Elaborated for an iCE40 UltraPlus (:func:`is_up5k`) it is the hard block; otherwise a
    behavioural model of its documented port behaviour (Lattice TN1314, *iCE40 SPRAM Usage
    Guide*), at each rising clock edge:

    - ``sleep`` high or ``poweroff`` low (the block off): ``dataout`` is 0;
    - else ``standby`` high: ``dataout`` becomes undefined;
    - else ``chipselect`` high and ``wren`` low: ``dataout`` becomes the word at ``address``
      (the read's data one cycle after its address);
    - else ``chipselect`` and ``wren`` high: the nibbles of ``datain`` whose bit of
      ``maskwren`` is set (bit ``i``: bits ``[4 i, 4 i + 4)``) are written at ``address``,
      and ``dataout`` becomes undefined;
    - else (``chipselect`` low) ``dataout`` holds.

    Undefined is :data:`SPRAM_UNDEFINED` in the model, as are the contents at power-up
    (the hard block has no initial contents: they must be written before they are read).
    Contents lost when powered off are not modelled.

    Parameters
    ----------
    depth : int
        Words of the behavioural model (default all 16,384; fewer make a simulation lighter,
        the address's high bits then ignored). The hard block always has 16,384.

    Members
    -------
    address : ``In(14)``
    datain : ``In(16)``
    maskwren : ``In(4)``
    wren, chipselect, standby, sleep : ``In(1)``
    poweroff : ``In(1)``, active low (1: powered)
    dataout : ``Out(16)``
    """

    def __init__(self, depth: int = SPRAM_WORDS):
        if not isinstance(depth, int) or isinstance(depth, bool) or not 1 <= depth <= SPRAM_WORDS:
            raise ValueError(f"SPRAM depth must be an integer in [1, {SPRAM_WORDS}], "
                             f"not {depth!r}")
        self._depth = depth
        super().__init__({
            "address": In(14), "datain": In(SPRAM_BITS), "maskwren": In(4), "wren": In(1),
            "chipselect": In(1), "standby": In(1), "sleep": In(1), "poweroff": In(1, init=1),
            "dataout": Out(SPRAM_BITS),
        })

    @property
    def depth(self) -> int:
        return self._depth

    def elaborate(self, platform):
        m = Module()
        if is_up5k(platform):
            m.submodules.spram = Instance(
                "SB_SPRAM256KA",
                i_ADDRESS=self.address, i_DATAIN=self.datain, i_MASKWREN=self.maskwren,
                i_WREN=self.wren, i_CHIPSELECT=self.chipselect, i_CLOCK=ClockSignal("sync"),
                i_STANDBY=self.standby, i_SLEEP=self.sleep, i_POWEROFF=self.poweroff,
                o_DATAOUT=self.dataout)
            return m
        m.submodules.mem = mem = Memory(shape=unsigned(SPRAM_BITS), depth=self._depth,
                                        init=[SPRAM_UNDEFINED] * self._depth)
        abits = max(1, (self._depth - 1).bit_length())
        on = ~self.sleep & self.poweroff
        active = on & ~self.standby & self.chipselect
        wr = mem.write_port(granularity=4)
        rd = mem.read_port()
        m.d.comb += [wr.addr.eq(self.address[:abits]), wr.data.eq(self.datain),
                     wr.en.eq(Mux(active & self.wren, self.maskwren, 0)),
                     rd.addr.eq(self.address[:abits]), rd.en.eq(active & ~self.wren)]
        # What dataout shows: the read port's data (held while it is not enabled), undefined
        # after a write or standby, 0 while off.
        show = Signal(2)                 # 0: the read data, 1: undefined, 2: zero
        with m.If(~on):
            m.d.sync += show.eq(2)
        with m.Elif(self.standby | (self.chipselect & self.wren)):
            m.d.sync += show.eq(1)
        with m.Elif(self.chipselect):
            m.d.sync += show.eq(0)
        m.d.comb += self.dataout.eq(Mux(~on | (show == 2), 0,
                                        Mux(show == 1, SPRAM_UNDEFINED, rd.data)))
        return m


def weight_read_signature(depth: int, width: int) -> wiring.Signature:
    """A weight read port as the reader sees it: ``addr`` (``range(depth)``) and ``en`` out,
    ``data`` (``width`` bits) in, the word at ``addr`` one enabled clock edge after it, held
    while ``en`` is low: what a memory's synchronous read port does."""
    return wiring.Signature({"addr": Out(range(max(depth, 2))), "en": Out(1),
                             "data": In(width)})


class SpramStore(wiring.Component):
    """The SPRAMs of the layers whose weights live in SPRAM, each layer reading its own.

    Parameters
    ----------
    slots : list of :class:`~onnx2fpga.plan.spram.SpramSlot`
        :func:`~onnx2fpga.plan.spram.spram_layout`: layer ``k`` owns SPRAMs
        ``slots[k].first ..``, side by side.
    model_depth : int, optional
        Words of each behavioural model (default: as many as the most any SPRAM of the
        slots uses; the hard blocks have 16,384).

    Members
    -------
    read{k} : ``In(weight_read_signature(slots[k].depth, 16 * slots[k].cols))``
        Layer ``k``'s read port: its SPRAMs read at ``addr`` with ``en``, the word from the
        row of SPRAMs ``addr`` falls in, its first column's in the low bits.
    wr_spram : ``In(range(n))``, wr_addr : ``In(14)``, wr_data : ``In(16)``, wr_en : ``In(1)``
        The loader's writes: one 16-bit word into SPRAM ``wr_spram`` at ``wr_addr``.
    loading : ``In(1)``
        While high the SPRAMs take only the loader's writes (the readers' enables are
        ignored); the loader holds it until every weight is written.
    """

    def __init__(self, slots, *, model_depth=None):
        slots = list(slots)
        if not slots or not all(isinstance(s, SpramSlot) for s in slots):
            raise ValueError(f"SpramStore needs a non-empty list of SpramSlot, not {slots!r}")
        self._slots = slots
        self._n = sum(s.count for s in slots)
        self._model_depth = model_depth or max(spram_depths(slots))
        members = {f"read{k}": In(weight_read_signature(s.depth, SPRAM_BITS * s.cols))
                   for k, s in enumerate(slots)}
        members.update(wr_spram=In(range(max(self._n, 2))), wr_addr=In(14),
                       wr_data=In(SPRAM_BITS), wr_en=In(1), loading=In(1))
        super().__init__(members)

    @property
    def slots(self) -> list:
        return list(self._slots)

    @property
    def sprams(self) -> int:
        """SPRAMs in the store."""
        return self._n

    def elaborate(self, platform):
        m = Module()
        for k, slot in enumerate(self._slots):
            port = getattr(self, f"read{k}")
            # Row r holds words [r * 16384, (r + 1) * 16384): enabled by the address's high
            # bits, its data picked by them a cycle later (registered with the read).
            hi = port.addr[14:] if slot.rows > 1 else 0
            row_data = []
            for r in range(slot.rows):
                datas = []
                for j in range(slot.cols):
                    n = slot.first + r * slot.cols + j
                    m.submodules[f"spram{n}"] = ram = Spram(self._model_depth)
                    mine = self.wr_en & (self.wr_spram == n)
                    m.d.comb += [
                        ram.address.eq(Mux(self.loading, self.wr_addr, port.addr[:14])),
                        ram.datain.eq(self.wr_data),
                        ram.maskwren.eq(0b1111),
                        ram.wren.eq(self.loading & mine),
                        ram.chipselect.eq(Mux(self.loading, mine, port.en & (hi == r))),
                    ]
                    datas.append(ram.dataout)
                row_data.append(Cat(*datas))
            if slot.rows == 1:
                m.d.comb += port.data.eq(row_data[0])
            else:
                sel = Signal(range(slot.rows), name=f"read{k}_row")
                with m.If(port.en & ~self.loading):
                    m.d.sync += sel.eq(hi)
                m.d.comb += port.data.eq(Array(row_data)[sel])
        return m

