"""The layer-sequential engine: one multiply-accumulate unit that runs a dataflow's layers
one after another (:mod:`onnx2fpga.plan.engine` plans the program), for devices too small
for a core per layer.

:class:`SerialRequant` computes a requantization over a few dozen cycles with one adder
(shift-and-add products, rounding by shifting with guard and sticky bits), exactly the
golden model's ``"half_even"`` and ``"float32"`` stages. :class:`LayerEngine` holds the
activations in two SPRAMs (an ``SB_SPRAM256KA`` on a UP5K, a behavioural model elsewhere),
the weight records in a third (loaded from SPI flash at start-up) or a ROM, and streams one
input tensor in, runs every layer, and streams the last layer's values out.
"""

from __future__ import annotations

from amaranth import Array, C, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..plan.engine import (
    ACC_BITS,
    HEADER_WORDS,
    MULT_BITS,
    OFFSET_BITS,
    EngineProgram,
    engine_slot,
    layer_requant_cycles,
)
from .flashload import WAKE_CYCLES, SpiFlashModel, SpramLoader
from .spram import Spram

__all__ = ["SerialRequant", "LayerEngine", "Q_BITS"]

#: Bits of the requantizer's signed result before the zero point and clip (saturated).
Q_BITS = 18
_R_BITS = 72        # the work register: a product of 32 x 32 bits plus a 48-bit offset
_SIG = 24           # float32 significant bits
_MAX_PAD = -(1 << 10)   # below every centred 8-bit value


class SerialRequant(wiring.Component):
    """One requantization over several cycles (see the module docstring).

    ``start`` (one cycle, while not ``busy``) takes ``acc``, ``mult``, ``offset``, ``shift``,
    ``float32`` and ``cycles``; ``done`` rises for one cycle with ``q``, ``cycles`` cycles
    after ``start`` (or when the result is ready, if later: see
    :func:`~onnx2fpga.plan.engine.requant_cycles`), and ``busy`` falls:

    - ``float32``: ``q = rne(f32(f32(acc) * mult / 2**shift))`` (``mult > 0``);
    - else ``q = round_half_even((acc * mult + offset) / 2**shift)``;

    ``q`` saturated to :data:`Q_BITS` bits.
    """

    def __init__(self):
        super().__init__({
            "start": In(1), "acc": In(signed(ACC_BITS)), "mult": In(signed(MULT_BITS)),
            "offset": In(signed(OFFSET_BITS)), "shift": In(range(64)), "float32": In(1),
            "cycles": In(range(256)), "busy": Out(1), "done": Out(1),
            "q": Out(signed(Q_BITS)),
        })

    def elaborate(self, platform):
        m = Module()
        r = Signal(signed(_R_BITS))          # the value being rounded or shifted
        a = Signal(unsigned(_R_BITS))        # the multiplicand, shifted left as it goes
        a3 = Signal(unsigned(_R_BITS))       # 3 * a
        mr = Signal(unsigned(MULT_BITS))     # multiplier bits still to take, two a step
        neg = Signal()
        exp = Signal(signed(8))              # float32: r's value is r * 2**exp
        left = Signal(signed(9))             # final shift still to make (negative: left)
        g, s = Signal(), Signal()            # guard and sticky bits of the shifts
        f32 = Signal()
        shift = Signal(range(64))
        offset = Signal(signed(OFFSET_BITS))
        hold = Signal(range(256))            # cycles done must wait for
        elapsed = Signal(range(256))         # cycles since start
        with m.If(self.busy & (elapsed != 255)):
            m.d.sync += elapsed.eq(elapsed + 1)
        q_max, q_min = (1 << (Q_BITS - 1)) - 1, -(1 << (Q_BITS - 1))

        def shift_right(n):
            """r >> n (arithmetic), the last bit out to g, the ones before to s."""
            return [r.eq(r >> n), g.eq(r[n - 1]), s.eq(s | g | (r[:n - 1] != 0 if n > 1
                                                                  else 0))]

        rnd = g & (s | r[0])
        m.d.sync += self.done.eq(0)
        with m.FSM(name="requant"):
            with m.State("IDLE"):
                with m.If(self.start):
                    mag = Mux(self.acc < 0, -self.acc, self.acc)
                    m.d.sync += [
                        r.eq(mag), neg.eq((self.acc < 0) ^ (self.mult < 0)),
                        mr.eq(Mux(self.mult < 0, -self.mult, self.mult)),
                        f32.eq(self.float32), shift.eq(self.shift), offset.eq(self.offset),
                        exp.eq(0), g.eq(0), s.eq(0), self.busy.eq(1),
                        hold.eq(self.cycles), elapsed.eq(1),
                    ]
                    m.next = "ROUND1"
            with m.State("ROUND1"):
                # float32: f32(acc), r to 24 significant bits (the magnitude); then the
                # product. half_even: straight to the product.
                with m.If(f32 & (r >= 1 << (_SIG + 3))):
                    m.d.sync += [*shift_right(4), exp.eq(exp + 4)]
                with m.Elif(f32 & (r >= 1 << _SIG)):
                    m.d.sync += [*shift_right(1), exp.eq(exp + 1)]
                with m.Else():
                    v = Mux(f32, r + rnd, r)
                    m.d.sync += [a.eq(v), a3.eq(v + (v << 1)), r.eq(0), g.eq(0), s.eq(0)]
                    m.next = "MUL"
            with m.State("MUL"):
                with m.If(mr == 0):
                    with m.If(f32):
                        m.next = "ROUND2"
                    with m.Else():
                        m.d.sync += [r.eq(Mux(neg, -r, r) + offset), left.eq(shift)]
                        m.next = "SHIFT"
                with m.Else():
                    digit = mr[:2]
                    add = Mux(digit == 3, a3, Mux(digit == 2, a << 1, Mux(digit == 1, a, 0)))
                    m.d.sync += [r.eq(r + add), a.eq(a << 2), a3.eq(a3 << 2), mr.eq(mr >> 2)]
            with m.State("ROUND2"):
                # float32: the product to 24 significant bits, then signed, its exponent
                # against the shift.
                with m.If(r >= 1 << (_SIG + 3)):
                    m.d.sync += [*shift_right(4), exp.eq(exp + 4)]
                with m.Elif(r >= 1 << _SIG):
                    m.d.sync += [*shift_right(1), exp.eq(exp + 1)]
                with m.Else():
                    v = r + rnd
                    m.d.sync += [r.eq(Mux(neg, -v, v)), g.eq(0), s.eq(0),
                                 left.eq(shift - exp)]
                    m.next = "SHIFT"
            with m.State("SHIFT"):
                # r * 2**-left rounded half to even (r's sign kept: floor shifts, then the
                # guard and sticky bits decide); left < 0 (a float32 value past the shift):
                # r * 2**-left exactly, saturating.
                big = (r > q_max) | (r < q_min)
                with m.If(left >= 4):
                    m.d.sync += [*shift_right(4), left.eq(left - 4)]
                with m.Elif(left > 0):
                    m.d.sync += [*shift_right(1), left.eq(left - 1)]
                with m.Elif((left < 0) & ~big):
                    m.d.sync += [r.eq(r << 1), left.eq(left + 1)]
                with m.Else():
                    v = Mux(left < 0, r, r + rnd)
                    m.d.sync += self.q.eq(Mux(v > q_max, q_max, Mux(v < q_min, q_min, v)))
                    m.next = "HOLD"
            with m.State("HOLD"):
                # The result leaves after the layer's fixed duration, so that no cycle count
                # depends on the data.
                with m.If(elapsed + 1 >= hold):
                    m.d.sync += [self.done.eq(1), self.busy.eq(0)]
                    m.next = "IDLE"
        return m


def _const_array(values, shape):
    return Array(Const(int(v), shape) for v in values)


class LayerEngine(wiring.Component):
    """The engine running ``program`` (:func:`~onnx2fpga.plan.engine.engine_program`).

    Members are the AXI4-Stream ports of :class:`~onnx2fpga.hw.top.Accelerator` with one
    8-bit element per transfer, in C order: ``s_axis_*`` takes ``program.in_size``
    transfers per inference (``tlast`` ignored), ``m_axis_*`` gives ``program.out_size``
    (``tlast`` on the last). With ``weights="spram"`` and no ``flash_image``, also the
    flash's SPI lines ``flash_sck``, ``flash_cs_n``, ``flash_copi``, ``flash_cipo``; the
    input is not ready until the weights are loaded.

    Parameters
    ----------
    program : EngineProgram
    weights : ``"spram"`` or ``"rom"``
        Where the weight records live: an SPRAM loaded from SPI flash at start-up
        (:func:`~onnx2fpga.plan.engine.engine_image` at
        :data:`~onnx2fpga.plan.spram.FLASH_OFFSET`), or a ROM
        (block RAM).
    flash_image : bytes, optional
        For simulation: a flash model holding these bytes inside the engine.
    """

    def __init__(self, program: EngineProgram, *, weights: str = "spram", flash_image=None,
                 wake_cycles: int = WAKE_CYCLES):
        if weights not in ("spram", "rom"):
            raise ValueError(f"weights must be 'spram' or 'rom', not {weights!r}")
        self._program = program
        self._weights = weights
        self._slot = engine_slot(program)
        self._flash_image = None if flash_image is None else bytes(flash_image)
        self._wake = wake_cycles
        members = {
            "s_axis_tdata": In(8), "s_axis_tvalid": In(1), "s_axis_tready": Out(1),
            "s_axis_tlast": In(1),
            "m_axis_tdata": Out(8), "m_axis_tvalid": Out(1), "m_axis_tready": In(1),
            "m_axis_tlast": Out(1),
        }
        if weights == "spram" and flash_image is None:
            members.update({"flash_sck": Out(1), "flash_cs_n": Out(1, init=1),
                            "flash_copi": Out(1), "flash_cipo": In(1)})
        super().__init__(members)

    @property
    def program(self) -> EngineProgram:
        return self._program

    def elaborate(self, platform):
        m = Module()
        prog = self._program
        lys = prog.layers
        n = len(lys)
        m.submodules.req = req = SerialRequant()

        # -- Weight records: (w_addr, w_en) -> w_data a cycle later.
        w_addr = Signal(14)
        w_en = Signal()
        w_data = Signal(16)
        ready_w = Signal()
        if self._weights == "rom":
            m.submodules.wrom = wrom = Memory(shape=16, depth=max(len(prog.image), 2),
                                              init=[int(w) for w in prog.image])
            rd = wrom.read_port()
            m.d.comb += [rd.addr.eq(w_addr), rd.en.eq(w_en), w_data.eq(rd.data),
                         ready_w.eq(1)]
        else:
            m.submodules.wram = wram = Spram(depth=max(len(prog.image), 1))
            m.submodules.loader = loader = SpramLoader([self._slot], wake_cycles=self._wake)
            if self._flash_image is not None:
                m.submodules.flash = flash = SpiFlashModel(self._flash_image)
                m.d.comb += [flash.sck.eq(loader.sck), flash.cs_n.eq(loader.cs_n),
                             flash.copi.eq(loader.copi), loader.cipo.eq(flash.cipo)]
            else:
                m.d.comb += [self.flash_sck.eq(loader.sck), self.flash_cs_n.eq(loader.cs_n),
                             self.flash_copi.eq(loader.copi), loader.cipo.eq(self.flash_cipo)]
            loading = loader.loading
            m.d.comb += [
                wram.poweroff.eq(1),
                wram.address.eq(Mux(loading, loader.wr_addr, w_addr)),
                wram.datain.eq(loader.wr_data), wram.maskwren.eq(0b1111),
                wram.wren.eq(loading & loader.wr_en),
                wram.chipselect.eq(Mux(loading, loader.wr_en, w_en)),
                w_data.eq(wram.dataout), ready_w.eq(loader.done),
            ]

        # -- Activation buffers: two SPRAMs of bytes, two a word.
        depth = max((prog.buffer_bytes + 1) // 2, 1)
        bufs = [Spram(depth=depth), Spram(depth=depth)]
        m.submodules.act0, m.submodules.act1 = bufs
        rd_addr = Signal(15)        # byte address read (the layer's input buffer)
        rd_en = Signal()
        wr_addr = Signal(15)        # byte address written (the output buffer)
        wr_byte = Signal(8)
        wr_en = Signal()
        rd_buf = Signal()           # which buffer the current layer reads
        for k, b in enumerate(bufs):
            reading = rd_buf == k
            m.d.comb += [
                b.poweroff.eq(1),
                b.address.eq(Mux(reading, rd_addr[1:], wr_addr[1:])),
                b.datain.eq(Cat(wr_byte, wr_byte)),
                b.maskwren.eq(Mux(wr_addr[0], 0b1100, 0b0011)),
                b.wren.eq(~reading & wr_en),
                b.chipselect.eq(Mux(reading, rd_en, wr_en)),
            ]
        rd_word = Mux(rd_buf, bufs[1].dataout, bufs[0].dataout)

        # -- Per-layer constants, selected by the layer index.
        li = Signal(range(max(n, 2)))

        def table(field, shape):
            return _const_array([getattr(ly, field) for ly in lys], shape)[li]

        def derived(fn, shape):
            return _const_array([fn(ly) for ly in lys], shape)[li]

        geo = signed(18)
        L = {f: table(f, geo) for f in ("in_h", "in_w", "out_c", "out_h", "out_w", "kh",
                                        "kw", "sh", "sw", "top", "left", "in_zero_point",
                                        "zero_point", "lo", "hi")}
        hw_in = derived(lambda ly: ly.in_h * ly.in_w, geo)
        sh_w = derived(lambda ly: ly.sh * ly.in_w, geo)
        rbase0 = derived(lambda ly: -ly.top * ly.in_w, geo)
        cin_g = derived(lambda ly: ly.cin_group, geo)
        rec_base = table("record_base", unsigned(15))
        rec_words = table("record_words", unsigned(15))
        dw = table("depthwise", 1)
        unit = table("unit", 1)
        maxp = table("max_pool", 1)
        in_signed = table("in_signed", 1)
        f32 = table("float32", 1)
        shift = table("shift", unsigned(6))
        req_cycles = _const_array([layer_requant_cycles(ly, prog.image) for ly in lys],
                                  unsigned(8))[li]
        last_layer = li == n - 1

        # -- Loop state.
        oc, oh, ow = Signal(geo), Signal(geo), Signal(geo)
        ic, ki, kj = Signal(geo), Signal(geo), Signal(geo)
        ih0, iw0 = Signal(geo), Signal(geo)            # oh*sh - top, ow*sw - left
        rbase = Signal(signed(24))                     # ih0 * W
        rowk = Signal(signed(24))                      # (ih0 + ki) * W
        cbase = Signal(signed(24))                     # input channel * H * W
        ocbase = Signal(signed(24))                    # oc * H * W (depthwise)
        rec = Signal(unsigned(15))                     # the channel's record
        k = Signal(range(1 << 15))                     # tap index
        oaddr = Signal(unsigned(15))                   # output byte index
        bias = Signal(signed(ACC_BITS))
        mult = Signal(signed(MULT_BITS))
        offset = Signal(signed(OFFSET_BITS))
        hdr = Signal(range(HEADER_WORDS + 2))
        acc = Signal(signed(ACC_BITS))
        count = Signal(range(max(prog.in_size, prog.out_size) + 1))

        ih = ih0 + ki
        iw = iw0 + kj
        inside = (ih >= 0) & (ih < L["in_h"]) & (iw >= 0) & (iw < L["in_w"])

        # The MAC pipeline: issue (addresses) -> data (product) -> accumulate.
        issue = Signal()
        last_tap = Signal()
        v1, in1, sel_x1, sel_w1, last1 = (Signal(name=f"{s}_1") for s in
                                          ("valid", "inside", "sel_x", "sel_w", "last"))
        v2, last2 = Signal(name="valid_2"), Signal(name="last_2")
        prod = Signal(signed(20))
        x_addr = Signal(signed(24))
        m.d.comb += x_addr.eq(Mux(dw, ocbase, cbase) + rowk + iw)
        m.d.comb += [rd_addr.eq(x_addr[:15]), rd_en.eq(issue & inside),
                     w_addr.eq(Mux(issue, rec + HEADER_WORDS + (k >> 1), rec + hdr)),
                     w_en.eq(1)]
        m.d.sync += [v1.eq(issue), in1.eq(inside), sel_x1.eq(x_addr[0]), sel_w1.eq(k[0]),
                     last1.eq(issue & last_tap)]
        xb = Mux(sel_x1, rd_word[8:], rd_word[:8])
        xv = Mux(in_signed, xb.as_signed(), xb.as_unsigned())
        # A max pool's padding never wins: a value below every input's.
        xc = Mux(in1, xv - L["in_zero_point"], Mux(maxp, _MAX_PAD, 0))
        wb = Mux(sel_w1, w_data[8:], w_data[:8]).as_signed()
        wv = Mux(unit, 1, wb)
        m.d.sync += [prod.eq(xc * wv), v2.eq(v1), last2.eq(last1)]
        with m.If(v2):
            m.d.sync += acc.eq(Mux(maxp, Mux(prod > acc, prod, acc), acc + prod))

        # Requantization: start with the finished accumulator; its result written (or sent).
        q_out = Signal(signed(Q_BITS + 2))
        m.d.comb += q_out.eq(req.q + L["zero_point"])
        y = Mux(q_out < L["lo"], L["lo"], Mux(q_out > L["hi"], L["hi"], q_out))
        pend = Signal()          # a result waits to be written or sent
        pend_addr = Signal(15)
        pend_y = Signal(8)
        pend_last = Signal()     # of the last layer: to the stream
        req_addr = Signal(15)
        req_last = Signal()
        with m.If(req.done):
            m.d.sync += [pend.eq(1), pend_y.eq(y[:8]), pend_addr.eq(req_addr),
                         pend_last.eq(req_last)]
        m.d.comb += [wr_addr.eq(pend_addr), wr_byte.eq(pend_y),
                     wr_en.eq(pend & ~pend_last),
                     self.m_axis_tdata.eq(pend_y), self.m_axis_tvalid.eq(pend & pend_last),
                     self.m_axis_tlast.eq(pend_addr == prog.out_size - 1)]
        with m.If(pend & (~pend_last | self.m_axis_tready)):
            m.d.sync += pend.eq(0)
        req_idle = ~req.busy & ~pend & ~req.done
        m.d.comb += [req.acc.eq(acc), req.mult.eq(mult), req.offset.eq(offset),
                     req.shift.eq(shift), req.float32.eq(f32), req.cycles.eq(req_cycles)]

        taps_last = (ic == cin_g - 1) & (ki == L["kh"] - 1) & (kj == L["kw"] - 1)
        m.d.comb += last_tap.eq(taps_last)
        px_last = (ow == L["out_w"] - 1) & (oh == L["out_h"] - 1)

        with m.FSM(name="engine"):
            with m.State("LOAD"):
                m.d.comb += self.s_axis_tready.eq(ready_w)
                take = self.s_axis_tvalid & ready_w
                m.d.comb += [bufs[0].address.eq(count[1:]),
                             bufs[0].maskwren.eq(Mux(count[0], 0b1100, 0b0011)),
                             bufs[0].datain.eq(Cat(self.s_axis_tdata, self.s_axis_tdata)),
                             bufs[0].wren.eq(take), bufs[0].chipselect.eq(take)]
                with m.If(take):
                    m.d.sync += count.eq(count + 1)
                    with m.If(count == prog.in_size - 1):
                        m.d.sync += [count.eq(0), li.eq(0), rd_buf.eq(0)]
                        m.next = "LAYER"
            with m.State("LAYER"):
                m.d.sync += [oc.eq(0), rec.eq(rec_base), ocbase.eq(0), oaddr.eq(0), hdr.eq(0)]
                m.next = "HEADER"
            with m.State("HEADER"):
                # Reads rec + hdr (w_addr), the word of the read before arriving.
                m.d.sync += hdr.eq(hdr + 1)
                for j, (reg, lo) in enumerate([(bias, 0), (bias, 16), (mult, 0), (mult, 16),
                                               (offset, 0), (offset, 16), (offset, 32)]):
                    with m.If(hdr == j + 1):
                        m.d.sync += reg[lo:lo + 16].eq(w_data)
                with m.If(hdr == HEADER_WORDS):
                    m.d.sync += [oh.eq(0), ow.eq(0), ih0.eq(-L["top"]), iw0.eq(-L["left"]),
                                 rbase.eq(rbase0)]
                    m.next = "PIXEL"
            with m.State("PIXEL"):
                m.d.sync += [acc.eq(Mux(maxp, _MAX_PAD, bias)), ic.eq(0), ki.eq(0), kj.eq(0),
                             k.eq(0), rowk.eq(rbase), cbase.eq(0)]
                m.next = "TAPS"
            with m.State("TAPS"):
                m.d.comb += issue.eq(1)
                m.d.sync += k.eq(k + 1)
                with m.If(kj != L["kw"] - 1):
                    m.d.sync += kj.eq(kj + 1)
                with m.Else():
                    m.d.sync += kj.eq(0)
                    with m.If(ki != L["kh"] - 1):
                        m.d.sync += [ki.eq(ki + 1), rowk.eq(rowk + L["in_w"])]
                    with m.Else():
                        m.d.sync += [ki.eq(0), rowk.eq(rbase), ic.eq(ic + 1),
                                     cbase.eq(cbase + hw_in)]
                with m.If(taps_last):
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                # The last product reaches the accumulator two cycles after its issue.
                with m.If(~v1 & ~v2 & req_idle):
                    m.d.comb += req.start.eq(1)
                    m.d.sync += [req_addr.eq(oaddr), req_last.eq(last_layer),
                                 oaddr.eq(oaddr + 1)]
                    with m.If(~px_last):
                        with m.If(ow != L["out_w"] - 1):
                            m.d.sync += [ow.eq(ow + 1), iw0.eq(iw0 + L["sw"])]
                        with m.Else():
                            m.d.sync += [ow.eq(0), iw0.eq(-L["left"]), oh.eq(oh + 1),
                                         ih0.eq(ih0 + L["sh"]), rbase.eq(rbase + sh_w)]
                        m.next = "PIXEL"
                    with m.Elif(oc != L["out_c"] - 1):
                        m.d.sync += [oc.eq(oc + 1), rec.eq(rec + rec_words),
                                     ocbase.eq(ocbase + hw_in), hdr.eq(0)]
                        m.next = "HEADER"
                    with m.Else():
                        m.next = "FINISH"
            with m.State("FINISH"):
                with m.If(req_idle):
                    with m.If(last_layer):
                        m.next = "LOAD"
                    with m.Else():
                        m.d.sync += [li.eq(li + 1), rd_buf.eq(~rd_buf)]
                        m.next = "LAYER"
        return m
