"""Weights in SPRAM: the SB_SPRAM256KA model against the primitive's documented port
behaviour (Lattice TN1314), and the loader reading a weight image from a flash model into the
store, read back through the layers' read ports."""

import numpy as np
import pytest
from amaranth import ClockDomain, Module
from amaranth.sim import Simulator

from onnx2fpga.hw.flashload import SpiFlashModel, SpramLoader, load_cycles
from onnx2fpga.hw.spram import SPRAM_UNDEFINED, Spram, SpramStore
from onnx2fpga.hw.testing import simulate
from onnx2fpga.plan.spram import FLASH_OFFSET, spram_layout, weight_image

DEPTH = 64


def _reference(ops):
    """dataout after each op, by the documented rules, written from TN1314's table: off
    (SLEEP or not POWEROFF) 0; STANDBY undefined; CS and not WREN read; CS and WREN nibble
    write, output undefined; otherwise hold. Contents start undefined."""
    mem = [SPRAM_UNDEFINED] * DEPTH
    out, outs = 0, []
    for addr, din, mask, wren, cs, standby, sleep, power in ops:
        if sleep or not power:
            out = 0
        elif standby:
            out = SPRAM_UNDEFINED
        elif cs and not wren:
            out = mem[addr % DEPTH]
        elif cs:
            for i in range(4):
                if mask >> i & 1:
                    keep = ~(0xF << 4 * i) & 0xFFFF
                    mem[addr % DEPTH] = mem[addr % DEPTH] & keep | din & (0xF << 4 * i)
            out = SPRAM_UNDEFINED
        outs.append(out if not (sleep or not power) else 0)
    return outs


def test_spram_model_follows_the_documented_port_behaviour():
    rng = np.random.default_rng(0)
    n = 3000
    ops = []
    for k in range(n):
        wren = int(rng.random() < (0.6 if k < 300 else 0.3))
        ops.append((int(rng.integers(0, DEPTH)), int(rng.integers(0, 1 << 16)),
                    int(rng.integers(0, 16)), wren, int(rng.random() < 0.8),
                    int(rng.random() < 0.03), int(rng.random() < 0.03),
                    int(rng.random() > 0.03)))
    want = _reference(ops)
    dut = Spram(DEPTH)
    got = []

    async def tb(ctx):
        for op in ops:
            for sig, v in zip((dut.address, dut.datain, dut.maskwren, dut.wren,
                               dut.chipselect, dut.standby, dut.sleep, dut.poweroff), op):
                ctx.set(sig, v)
            await ctx.tick()
            got.append(ctx.get(dut.dataout))

    simulate(dut, tb)
    assert got == want
    # The sequence exercised every rule: reads of written words, undefined words, zeros.
    assert len({w for w in want} - {0, SPRAM_UNDEFINED}) > 100
    assert want.count(SPRAM_UNDEFINED) > 100 and want.count(0) > 50


def test_spram_is_the_hard_block_on_a_up5k():
    from amaranth.back import rtlil
    from amaranth_boards.icebreaker import ICEBreakerPlatform
    text = rtlil.convert(Spram(), platform=ICEBreakerPlatform())
    assert "SB_SPRAM256KA" in text
    assert "SB_SPRAM256KA" not in rtlil.convert(Spram(DEPTH))


def _run_load(slots, image, *, flash_image=None, asleep=False, wake=40, max_cycles=None):
    """Load ``image`` into a store through the loader from a flash model holding
    ``flash_image`` (default ``image``) at FLASH_OFFSET; then read every word of every slot.
    Returns (done cycle or None, loading seen, words read per slot, error)."""
    m = Module()
    m.domains.sync = ClockDomain()
    m.submodules.store = store = SpramStore(slots)
    m.submodules.loader = loader = SpramLoader(slots, wake_cycles=wake)
    m.submodules.flash = flash = SpiFlashModel(flash_image or image, asleep=asleep)
    m.d.comb += [flash.sck.eq(loader.sck), flash.cs_n.eq(loader.cs_n),
                 flash.copi.eq(loader.copi), loader.cipo.eq(flash.cipo),
                 store.wr_spram.eq(loader.wr_spram), store.wr_addr.eq(loader.wr_addr),
                 store.wr_data.eq(loader.wr_data), store.wr_en.eq(loader.wr_en),
                 store.loading.eq(loader.loading)]
    result = {"done": None, "read": [], "error": 0}
    limit = max_cycles or load_cycles(slots, wake) + 50

    async def tb(ctx):
        for k in range(len(slots)):
            ctx.set(getattr(store, f"read{k}").en, 1)      # readers do not wait
        cycle = 0
        while cycle < limit:
            await ctx.tick()
            cycle += 1
            assert ctx.get(loader.loading) == (not ctx.get(loader.done))
            if ctx.get(loader.done):
                result["done"] = cycle
                break
        result["error"] = ctx.get(loader.error)
        if result["done"] is None:
            return
        for k, slot in enumerate(slots):
            port = getattr(store, f"read{k}")
            words = []
            for a in range(slot.depth):
                ctx.set(port.addr, a)
                ctx.set(port.en, 1)
                await ctx.tick()
                ctx.set(port.en, 0)
                await ctx.tick()          # the data holds while en is low
                words.append(ctx.get(port.data) & ((1 << slot.width) - 1))
            result["read"].append(words)

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    return result


@pytest.mark.parametrize("asleep", [False, True])
def test_loader_writes_the_image_from_flash_into_the_store(asleep):
    rng = np.random.default_rng(1)
    layers = [("a", 20, 13), ("b", 16, 9), ("c", 5, 6)]
    slots = spram_layout(layers)
    assert [(s.first, s.count) for s in slots] == [(0, 2), (2, 1), (3, 1)]
    words = [[int(v) for v in rng.integers(0, 1 << w, size=d)] for _, w, d in layers]
    image = weight_image(slots, words)
    r = _run_load(slots, image, asleep=asleep)
    assert r["error"] == 0
    assert r["done"] == load_cycles(slots, 40)
    assert r["read"] == words


def test_loader_refuses_an_erased_flash():
    slots = spram_layout([("a", 8, 4)])
    image = weight_image(slots, [[1, 2, 3, 4]])
    r = _run_load(slots, image, flash_image=b"\xff" * len(image),
                  max_cycles=load_cycles(slots, 40) + 50)
    assert r["done"] is None and r["error"] == 1


def test_flash_model_serves_bytes_at_the_offset():
    """A READ from just before the image: 0xFF, then the image's bytes in order."""
    image = bytes(range(7, 47))
    dut = SpiFlashModel(image, offset=FLASH_OFFSET)
    got = []

    async def tb(ctx):
        async def clock_byte(value):
            out = 0
            for i in range(8):
                ctx.set(dut.copi, (value >> (7 - i)) & 1)
                await ctx.tick()
                ctx.set(dut.sck, 1)
                await ctx.tick().repeat(2)
                out = out << 1 | ctx.get(dut.cipo)
                ctx.set(dut.sck, 0)
                await ctx.tick()
            return out
        ctx.set(dut.cs_n, 0)
        start = FLASH_OFFSET - 2
        for b in (0x03, start >> 16 & 0xFF, start >> 8 & 0xFF, start & 0xFF):
            await clock_byte(b)
        for _ in range(12):
            got.append(await clock_byte(0))
        ctx.set(dut.cs_n, 1)

    simulate(dut, tb)
    assert got == [0xFF, 0xFF, *image[:10]]
