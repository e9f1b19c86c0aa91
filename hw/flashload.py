"""Loading the weight image from the board's SPI flash into the SPRAMs at start-up, and a
model of the flash for simulation.

:class:`SpramLoader` is an SPI master (mode 0: the clock idles low, the flash samples on its
rising edge and shifts out after its falling one) at half the system clock. After reset it
wakes the flash (``0xAB``, *release from deep power-down*, then ``wake_cycles`` with chip
select high: the flash's tRES1 is 3 us at most), then reads from
:data:`~onnx2fpga.plan.spram.FLASH_OFFSET` with the standard ``0x03`` READ command (24-bit
address, most significant bit first; the flash streams bytes from there for as long as the
clock runs, each most significant bit first), checks the image's magic and writes its 16-bit
words into the :class:`~onnx2fpga.hw.spram.SpramStore`, SPRAM after SPRAM. ``done`` rises
after the last word; a wrong magic (an erased flash reads ``0xFF``) raises ``error`` instead
and the loader stops: the accelerator stays not ready. The image's layout is
:func:`onnx2fpga.plan.spram.weight_image`'s.

:class:`SpiFlashModel` is the flash for simulation (Amaranth's simulator or the emitted
Verilog in Verilator): it answers ``0xAB`` and ``0x03`` from an image placed at an offset,
``0xFF`` elsewhere, sampling the SPI lines at each system clock edge.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..plan.spram import FLASH_OFFSET, IMAGE_MAGIC, SPRAM_BITS, spram_depths

__all__ = ["CMD_READ", "CMD_WAKE", "WAKE_CYCLES", "SpramLoader", "SpiFlashModel",
           "load_cycles"]

#: The SPI flash READ command (24-bit address, no dummy cycles).
CMD_READ = 0x03
#: *Release from deep power-down* (the flash ignores every other command while powered down).
CMD_WAKE = 0xAB
#: The accelerator's wait between waking the flash and reading it: 3.2 us at 100 MHz (the
#: flash's tRES1 is at most 3 us), 27 us at the iCEBreaker's 12 MHz.
WAKE_CYCLES = 320


def load_cycles(slots, wake_cycles: int = WAKE_CYCLES) -> int:
    """System clock cycles from reset to :class:`SpramLoader`'s ``done`` (two per SPI bit):
    the wake command (8 bits), ``wake_cycles``, the READ command (32 bits), the magic and
    the image's words, a cycle to start and one to finish."""
    data_bits = 8 * (len(IMAGE_MAGIC) + 2 * sum(spram_depths(slots)))
    return 2 * (8 + 32 + data_bits) + wake_cycles + 2


class SpramLoader(wiring.Component):
    """Reads the weight image from SPI flash and writes it into a
    :class:`~onnx2fpga.hw.spram.SpramStore` (see the module docstring).

    Parameters
    ----------
    slots : list of :class:`~onnx2fpga.plan.spram.SpramSlot`
        The store's layout: how many words each SPRAM takes, in image order.
    offset : int
        Byte address of the image in the flash (:data:`~onnx2fpga.plan.spram.FLASH_OFFSET`).
    wake_cycles : int
        System clock cycles between the wake command and the READ (at least 3 us: 36 at
        12 MHz).

    Members
    -------
    sck, cs_n, copi : ``Out(1)``; cipo : ``In(1)``
        The SPI lines (``cs_n`` high after reset).
    wr_spram, wr_addr, wr_data, wr_en, loading : ``Out``
        The store's write side (:class:`~onnx2fpga.hw.spram.SpramStore`); ``loading`` is
        high from reset until ``done``.
    done, error : ``Out(1)``
        Every word written; or the image's magic was wrong (the loader stops, ``loading``
        stays high).
    """

    def __init__(self, slots, *, offset: int = FLASH_OFFSET,
                 wake_cycles: int = WAKE_CYCLES):
        self._depths = spram_depths(slots)
        if not isinstance(offset, int) or not 0 <= offset < (1 << 24):
            raise ValueError(f"Flash offset must be an integer in [0, 2**24), not {offset!r}")
        if not isinstance(wake_cycles, int) or wake_cycles < 1:
            raise ValueError(f"wake_cycles must be a positive integer, not {wake_cycles!r}")
        self._offset = offset
        self._wake = wake_cycles
        n = len(self._depths)
        super().__init__({
            "sck": Out(1), "cs_n": Out(1, init=1), "copi": Out(1), "cipo": In(1),
            "wr_spram": Out(range(max(n, 2))), "wr_addr": Out(14), "wr_data": Out(SPRAM_BITS),
            "wr_en": Out(1), "loading": Out(1, init=1), "done": Out(1), "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        depths = self._depths
        sck, cs_n, copi = self.sck, self.cs_n, self.copi
        out_sr = Signal(32)             # bits still to send, the next one at the top
        in_sr = Signal(7)               # bits of the byte being received
        bit = Signal(range(33))         # command bits sent
        nbit = Signal(3)                # bits of the byte being received
        nbyte = Signal(range(len(IMAGE_MAGIC) + 1))
        low = Signal(8)                 # the low byte of the word being received
        half = Signal()                 # the low byte is in `low`
        addr = Signal(14)               # where the next word goes
        spram = Signal(range(max(len(depths), 2)))
        wait = Signal(range(self._wake + 1))
        last_addr = Array(Const(d - 1, 14) for d in depths)
        magic = Array(Const(b, 8) for b in IMAGE_MAGIC)
        fall = Signal()                 # the SPI clock falls at this edge: a bit is done
        m.d.comb += fall.eq(~cs_n & sck)
        m.d.sync += self.wr_en.eq(0)

        def send(last):
            """Clock out ``out_sr``: the clock rises, then falls with the next bit on
            ``copi``; true at the edge that ends bit ``last``."""
            m.d.sync += sck.eq(~sck)
            with m.If(fall):
                m.d.sync += [out_sr.eq(out_sr << 1), copi.eq(out_sr[30]), bit.eq(bit + 1)]
            return fall & (bit == last)

        def start(value, bits):
            m.d.sync += [cs_n.eq(0), out_sr.eq(value << (32 - bits)),
                         copi.eq(value >> (bits - 1)), bit.eq(0)]

        with m.FSM():
            with m.State("WAKE_START"):
                start(CMD_WAKE, 8)
                m.next = "WAKE"
            with m.State("WAKE"):
                with m.If(send(7)):
                    m.d.sync += [cs_n.eq(1), wait.eq(self._wake)]
                    m.next = "GAP"
            with m.State("GAP"):
                m.d.sync += wait.eq(wait - 1)
                with m.If(wait == 1):
                    start((CMD_READ << 24) | self._offset, 32)
                    m.next = "COMMAND"
            with m.State("COMMAND"):
                with m.If(send(31)):
                    m.d.sync += [nbit.eq(0), nbyte.eq(0), half.eq(0), addr.eq(0),
                                 spram.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                m.d.sync += sck.eq(~sck)
                byte = Cat(self.cipo, in_sr)
                with m.If(fall):
                    m.d.sync += [in_sr.eq(byte[:7]), nbit.eq(nbit + 1)]
                    with m.If(nbit == 7):
                        with m.If(nbyte < len(IMAGE_MAGIC)):
                            m.d.sync += nbyte.eq(nbyte + 1)
                            with m.If(byte != magic[nbyte]):
                                m.d.sync += [cs_n.eq(1), sck.eq(0), self.error.eq(1)]
                                m.next = "ERROR"
                        with m.Elif(~half):
                            m.d.sync += [low.eq(byte), half.eq(1)]
                        with m.Else():
                            end = addr == last_addr[spram]
                            m.d.sync += [self.wr_data.eq(Cat(low, byte)), self.wr_en.eq(1),
                                         self.wr_addr.eq(addr), self.wr_spram.eq(spram),
                                         half.eq(0), addr.eq(Mux(end, 0, addr + 1)),
                                         spram.eq(spram + end)]
                            with m.If(end & (spram == len(depths) - 1)):
                                m.d.sync += [cs_n.eq(1), sck.eq(0)]
                                m.next = "FINISH"
            with m.State("FINISH"):
                # The last word reaches its SPRAM at this edge; reads may start after it.
                m.d.sync += [self.loading.eq(0), self.done.eq(1)]
                m.next = "DONE"
            with m.State("DONE"):
                pass
            with m.State("ERROR"):
                pass
        return m


class SpiFlashModel(wiring.Component):
    """An SPI flash for simulation, holding ``image`` at byte address ``offset`` (``0xFF``
    elsewhere, as erased flash).

    It samples its lines at each rising edge of the system clock (the master's SPI clock at
    most half of it): on a rising ``sck`` it shifts ``copi`` into the command, on a falling
    one it drives the next data bit on ``cipo``. Chip select high ends a command. Commands:
    ``0xAB`` (*release from deep power-down*) and ``0x03`` (READ: 24 address bits, most
    significant first, then the bytes from there, each most significant bit first, for as
    long as the clock runs; the address wraps at 2**24). Powered down (``asleep``), it
    ignores everything but ``0xAB``, as a flash does.

    Members
    -------
    sck, cs_n, copi : ``In(1)``; cipo : ``Out(1)``
    reads : ``Out(16)``
        READ commands answered (for tests).
    """

    def __init__(self, image: bytes, *, offset: int = FLASH_OFFSET, asleep: bool = False):
        image = bytes(image)
        if not image:
            raise ValueError("The flash model needs a non-empty image")
        if not isinstance(offset, int) or not 0 <= offset or offset + len(image) > (1 << 24):
            raise ValueError(f"Image of {len(image)} bytes at offset {offset!r} does not fit "
                             f"a 16 MB flash")
        self._image, self._offset, self._asleep = image, offset, bool(asleep)
        super().__init__({"sck": In(1), "cs_n": In(1, init=1), "copi": In(1),
                          "cipo": Out(1), "reads": Out(16)})

    def elaborate(self, platform):
        m = Module()
        n = len(self._image)
        m.submodules.mem = mem = Memory(shape=unsigned(8), depth=n, init=list(self._image))
        rd = mem.read_port(domain="comb")
        prev = Signal()
        awake = Signal(init=int(not self._asleep))
        cmd = Signal(32)
        count = Signal(range(33))
        reading = Signal()
        addr = Signal(24)
        bit = Signal(3)
        rel = Signal(25)
        m.d.comb += [rel.eq(addr - self._offset), rd.addr.eq(rel)]
        inside = (addr >= self._offset) & (rel < n)
        byte = Mux(inside, rd.data, 0xFF)
        m.d.sync += prev.eq(self.sck)
        with m.If(self.cs_n):
            m.d.sync += [count.eq(0), reading.eq(0)]
        with m.Elif(self.sck & ~prev & ~reading):
            nxt = Cat(self.copi, cmd[:31])
            m.d.sync += [cmd.eq(nxt), count.eq(count + 1)]
            with m.If((count == 7) & (nxt[:8] == CMD_WAKE)):
                m.d.sync += awake.eq(1)
            with m.If((count == 31) & (nxt[24:] == CMD_READ) & awake):
                m.d.sync += [reading.eq(1), addr.eq(nxt[:24]), bit.eq(7),
                             self.reads.eq(self.reads + 1)]
        with m.Elif(~self.sck & prev & reading):
            m.d.sync += [self.cipo.eq(byte.bit_select(bit, 1)), bit.eq(bit - 1)]
            with m.If(bit == 0):
                m.d.sync += addr.eq(addr + 1)
        return m
