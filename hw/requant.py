"""The requantization core: every :class:`~onnx2fpga.ir.RequantStage` of a layer's epilogue,
pipelined, exactly as :func:`onnx2fpga.sim.golden.requant`.
"""

from __future__ import annotations

from math import gcd

import numpy as np
from amaranth import (
    C,
    Cat,
    Module,
    Mux,
    Shape,
    Signal,
)
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..ir.stages import RequantStage
from ..plan import requant as timing
from ..plan.requant import (
    FLOAT32_BITS,
    clamp_bounds,
    float32_input_rounds,
    round_significant,
    shift_rounding,
    stage_latency,
)
from ..plan.checks import check_count
from ..plan.devices import memory_mapping
from ..plan.thresholds import affine_range, sign_split
from .arith import (
    LUT_CHUNKS,
    carry_save_sum,
    digit_partial_products,
    is_ecp5,
    mul_chunks,
    mult18x18d,
    one_dsp,
    partial_factors,
    partial_products,
    times3_range,
)
from .blocks import (
    int_shape,
    quiet_if_invalid,
    range_shape,
    shape_range,
    skid_output_shares,
    tree_levels,
    wrap_incr,
)

__all__ = ["RequantCore", "significant_mask", "mask_carry", "round_to_mask"]


def significant_mask(m: Module, value, bits: int = FLOAT32_BITS, *, name: str = "mask"):
    """The bits of integer ``value`` below its ``bits`` most significant ones, as a mask
    (unsigned, ``len(value) - bits`` bits, aligned with ``value``'s lowest bits): the
    suffix OR of the magnitude's bits from ``bits`` up (``~value`` stands for a negative
    value's magnitude: it is one less, which moves the top bit only for a power of two, whose
    lower bits are all zero anyway). None if ``value`` never has more than ``bits``.

    Each doubling step of the suffix OR is a combinational signal of ``m`` (named
    ``name``): as one expression every step would copy the previous one twice, ``2**steps``
    copies of the magnitude in the netlist (yosys merges them; the netlist-based LUT
    estimate counted 8,712 bits of logic for one 46-bit lane instead of 156)."""
    w = len(value)
    signed = value.shape().signed
    if w - signed <= bits:
        return None
    t = Signal(w - bits, name=f"{name}_mag")
    mag = value.as_unsigned() ^ value[-1].replicate(w) if signed else value.as_unsigned()
    m.d.comb += t.eq(mag[bits:])
    d = 1
    while d < len(t):
        nxt = Signal(len(t), name=f"{name}_or{d}")
        m.d.comb += nxt.eq(t | (t >> d))
        t = nxt
        d *= 2
    return t


def mask_carry(value, mask):
    """The carry-in of :func:`round_to_mask`: bit ``q`` of ``value`` where ``q > 0``."""
    n = len(mask)
    lsb = Cat(C(1, 1), mask) & ~Cat(mask, C(0, 1))          # bit q, one-hot
    return (value.as_unsigned()[:n + 1] & lsb).any() & mask[0]


def round_to_mask(value, mask, cin):
    """``value`` with the bits under ``mask`` (all ones below some position ``q``, from
    :func:`significant_mask`) rounded off, to the nearest multiple of ``2**q``, ties to even:
    ``(value + 2**(q-1) - 1 + cin) & ~mask`` with ``cin`` from :func:`mask_carry` (computed a
    step earlier, with the mask, so that this step is one adder)."""
    n = len(mask)
    total = value + (mask >> 1) + cin
    out = Cat(total.as_unsigned()[:n] & ~mask, total.as_unsigned()[n:])
    return out.as_signed() if value.shape().signed else out


class _StagePlan:
    """Compile-time constants and value ranges of one requantization stage.

    ``params`` maps each per-channel parameter of the multiply step (``"m"`` and ``"off"``;
    ``"nm"`` and ``"noff"`` for the negative side of a fused LeakyRelu) to its table
    ``[lane][transfer % period]``, with the input zero point folded into the offsets.
    """

    def __init__(self, stage: RequantStage, channels: int, lanes: int, x_lo: int, x_hi: int):
        izp = int(stage.in_zero_point)
        # float32 (onnxruntime): the input rounded to 24 significant bits where it can
        # exceed 2**24, the product too; both roundings are monotonic, so the rounded
        # extremes bound the rounded values.
        self.float32 = stage.rounding == "float32"
        self.x_rounds = self.float32 and float32_input_rounds(x_lo, x_hi)
        self.latency = stage_latency(stage, x_lo, x_hi)
        if self.x_rounds:
            x_lo, x_hi = round_significant(x_lo), round_significant(x_hi)
            self.x_shape = range_shape(x_lo, x_hi)

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
            pos_ranges = [affine_range(mm, o, x_lo, x_hi) for mm, o in zip(m_all, off_all)]
        else:
            nm_all = per_channel(stage.neg_multiplier)
            noff_all = [o - izp * mm for o, mm in
                        zip(per_channel(stage.neg_offset), nm_all, strict=True)]
            for mm, o, nm, no in zip(m_all, off_all, nm_all, noff_all, strict=True):
                neg, pos = sign_split(mm, o, x_lo, x_hi)
                if pos is not None:
                    pos_ranges.append(affine_range(mm, o, *pos))
                if neg is not None:
                    neg_ranges.append(affine_range(nm, no, *neg))
            # A side that no input reaches needs no hardware.
            self.use_pos, self.use_neg = bool(pos_ranges), bool(neg_ranges)
            if self.use_neg:
                values["nm"], values["noff"] = nm_all, noff_all
            if not self.use_pos:
                del values["m"], values["off"]
        ranges = pos_ranges + neg_ranges
        v_lo = min(lo for lo, _ in ranges)
        v_hi = max(hi for _, hi in ranges)
        self.v_shape = range_shape(v_lo, v_hi)
        if self.float32:        # the rounding step works on the product rounded to 24 bits
            v_lo, v_hi = round_significant(v_lo), round_significant(v_hi)
            self.p_shape = range_shape(v_lo, v_hi)

        period = channels // gcd(channels, lanes)
        self.period = period
        # Lane j of transfer t (modulo the period) is channel (t*lanes + j) % channels.
        self.tables = {name: [[vals[(t * lanes + j) % channels] for t in range(period)]
                              for j in range(lanes)] for name, vals in values.items()}
        self.varies = {name: any(len(set(row)) > 1 for row in table)
                       for name, table in self.tables.items()}
        self.shapes = {name: range_shape(min(vals), max(vals)) for name, vals in values.items()}
        self.v_signed = v_lo < 0

        s = int(stage.shift)
        self.shift = s
        # float32: after the rounding to 24 bits, an integer rounding half to even.
        self.rounding = "half_even" if self.float32 else stage.rounding
        # round_shift(v) + zp == (v + const + cin) >> s, cin = bit s of v (half_even) or
        # v >= 0 (half_away); to_zero: floor for v >= 0, ceil for v < 0 (2**s - 1 added only
        # to negative v). See plan.requant.shift_rounding and golden.round_shift.
        self.const, carry = shift_rounding(self.rounding, s, stage.zero_point)
        extra = int(carry != "none")                # what the carry may add
        if s and self.rounding == "to_zero" and v_lo < 0:
            extra = (1 << s) - 1
        w_lo, w_hi = v_lo + self.const, v_hi + self.const + extra
        r_lo, r_hi = w_lo >> s, w_hi >> s
        self.r_shape = range_shape(r_lo, r_hi)
        self.lo, self.hi = int(stage.lo), int(stage.hi)
        self.clip_lo = r_lo < self.lo
        self.clip_hi = r_hi > self.hi
        self.out_shape = int_shape(stage.out_type)
        self.out_lo, self.out_hi = self.lo, self.hi


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

    @classmethod
    def from_stage(cls, stage) -> RequantCore:
        """The core of a ``"requant"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        return cls(stage.params["stages"], stage.params["channels"], stage.in_lanes,
                   stage.in_type)

    @quiet_if_invalid
    def __init__(self, stages, channels, lanes, in_shape):
        if not isinstance(stages, (list, tuple)) or not stages:
            raise ValueError(f"Stages must be a non-empty list of RequantStage, not {stages!r}")
        for k, stage in enumerate(stages):
            if not isinstance(stage, RequantStage):
                raise TypeError(f"Stage {k} must be a RequantStage, not {stage!r}")
        channels = check_count("Channels", channels)
        lanes = check_count("Lanes", lanes)
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
        # The input clamped to the range beyond which no output changes where that saves
        # multiplier pieces (see plan.requant.clamp_bounds): the same outputs.
        self._sat = clamp_bounds(self._stages, *shape_range(shape))
        x_lo, x_hi = self._sat
        self._sat_shape = range_shape(x_lo, x_hi)
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
        return 2 + sum(plan.latency for plan in self._plans)

    def elaborate(self, platform):
        m = Module()
        lanes = self._lanes
        i_stream, o_stream = self.i_stream, self.o_stream
        # One transfer counter serves every stage: they share channels and lanes, and so the
        # period after which the channel pattern repeats.
        period = self._plans[0].period
        t_shape = range(max(period, 2))

        # The pipeline shifts (see blocks.skid_output); `take`, equal to it on every cycle, from a
        # copy of the skid flag: the input's ready and what the input transfer decides, so
        # that the ready's logic, placed toward the core before, is not also the enable of
        # every register here (ResNet-8 at 100 MHz: the flag routed to it across the die and
        # back into the pipeline's enables, 10.9 ns with one LUT).
        advance, take = Signal(), Signal()
        m.d.comb += i_stream.ready.eq(take)

        t_in = Signal(t_shape)
        with m.If(i_stream.valid & take):
            m.d.sync += t_in.eq(wrap_incr(t_in, period))

        chunks = mul_chunks(platform)
        lut_mul = chunks == LUT_CHUNKS
        # Input register, then a second one: each stage's parameters come from its ROM
        # through a register of their own (a block RAM's output is too slow to meet a
        # multiplier in the same cycle), read two stages ahead of their use; `ts[-n]` is the
        # transfer slot of the elements in the register `n - 1` stages before `x`.
        x = Signal(data.ArrayLayout(self._in_shape, lanes), reset_less=True)
        valid = Signal()
        t_cur = Signal(t_shape)
        # The clamp to the saturation bounds: its comparisons are registered with the input
        # (flags `xgt`, `xlt`), so that between the input register and the hard multipliers'
        # input registers (fed from `x_next`, below) lies one LUT level, not a comparator's
        # carry chain (the digits example's critical path on the ULX3S with the whole clamp
        # there: 10.5 ns, 95 MHz where it had closed at 120).
        full_lo, full_hi = shape_range(self._in_shape)
        sat_lo, sat_hi = self._sat
        sat = self._sat_shape
        x_sat = []
        for j in range(lanes):
            v = x[j][:sat.width].as_signed() if sat.signed else x[j][:sat.width]
            if sat_lo > full_lo:
                lt = Signal(name=f"xlt_{j}", reset_less=True)
                with m.If(advance):
                    m.d.sync += lt.eq(i_stream.payload[j] < sat_lo)
                v = Mux(lt, sat_lo, v)
            if sat_hi < full_hi:
                gt = Signal(name=f"xgt_{j}", reset_less=True)
                with m.If(advance):
                    m.d.sync += gt.eq(i_stream.payload[j] > sat_hi)
                v = Mux(gt, sat_hi, v)
            # A signal, so that every partial product and the register share one clamp.
            clamped = Signal(sat, name=f"xsat_{j}")
            m.d.comb += clamped.eq(v)
            x_sat.append(clamped)
        x1 = Signal(data.ArrayLayout(sat, lanes), name="x1", reset_less=True)
        valid1 = Signal()
        t1 = Signal(t_shape)
        with m.If(advance):
            m.d.sync += [x.eq(i_stream.payload), valid.eq(i_stream.valid), t_cur.eq(t_in),
                         valid1.eq(valid), t1.eq(t_cur)]
            m.d.sync += [x1[j].eq(x_sat[j]) for j in range(lanes)]
        # LUT multipliers (iCE40): the second input register also holds 3 * x, so that the
        # first stage's products are sums of shifted 0, x, 2x or 3x (radix-4 digits of the
        # multiplier) instead of full LUT multipliers.
        x3 = None
        digits = lut_mul and not self._plans[0].x_rounds
        if digits:
            x3 = [Signal(range_shape(*times3_range(self._sat_shape)), name=f"x3_{j}",
                         reset_less=True) for j in range(lanes)]
            with m.If(advance):
                m.d.sync += [x3[j].eq(x_sat[j] + (x_sat[j] << 1)) for j in range(lanes)]
        # ECP5: partial products that take one hard multiplier are registered MULT18X18D
        # whose input registers take the place of the registers in front of them (the
        # second input register or the previous stage's output, and the parameter
        # register), so they are fed from the values those registers load: `x_next`,
        # `p_next`. An inferred DSP has no registers (yosys packs none into it), and its
        # route in and out was the jet tagger's critical path on an ECP5 (12.1 ns).
        dsp = is_ecp5(platform)
        x_next = x_sat
        x, valid, ts = x1, valid1, [t_in, t_cur, t1]

        for k, plan in enumerate(self._plans):
            if plan.x_rounds:
                # float32: the input rounded to 24 significant bits first (two registers:
                # the input and its mask, then the rounded input).
                xm = [Signal(Shape.cast(x[j].shape()), name=f"xm{k}_{j}", reset_less=True)
                      for j in range(lanes)]
                masks = [significant_mask(m, x[j], name=f"xsig{k}_{j}") for j in range(lanes)]
                mk = [Signal(Shape.cast(masks[j].shape()), name=f"xmask{k}_{j}",
                             reset_less=True) for j in range(lanes)]
                ck = [Signal(name=f"xcarry{k}_{j}", reset_less=True) for j in range(lanes)]
                xr = Signal(data.ArrayLayout(plan.x_shape, lanes), name=f"xr{k}",
                            reset_less=True)
                xr_next = [round_to_mask(xm[j], mk[j], ck[j]) for j in range(lanes)]
                pre_valid = [Signal(name=f"valid{k}_x{n}") for n in range(2)]
                pre_slot = [Signal(t_shape, name=f"t{k}_x{n}") for n in range(2)]
                with m.If(advance):
                    m.d.sync += [xm[j].eq(x[j]) for j in range(lanes)]
                    m.d.sync += [mk[j].eq(masks[j]) for j in range(lanes)]
                    m.d.sync += [ck[j].eq(mask_carry(x[j], masks[j])) for j in range(lanes)]
                    m.d.sync += [xr[j].eq(xr_next[j]) for j in range(lanes)]
                    m.d.sync += [pre_valid[0].eq(valid), pre_valid[1].eq(pre_valid[0]),
                                 pre_slot[0].eq(ts[-1]), pre_slot[1].eq(pre_slot[0])]
                x, x_next, valid = xr, xr_next, pre_valid[1]
                ts = ts + pre_slot
            # Parameters for this stage, read two stages early and registered in `p_word`.
            fields = {name: plan.shapes[name] for name in plan.tables if plan.varies[name]}
            if fields:
                word = data.StructLayout(fields)
                init = [[{name: plan.tables[name][j][t] for name in fields}
                         for j in range(lanes)] for t in range(period)]
                rom = Memory(shape=data.ArrayLayout(word, lanes), depth=period, init=init)
                m.submodules[f"params_{k}"] = rom
                rd = rom.read_port()
                p_word = Signal.like(rd.data, name=f"p{k}", reset_less=True)
                p_data = rd.data
                block = memory_mapping(Shape.cast(rom.shape).width, period, "ecp5",
                                       rom=True).kind == "block"
                if dsp and block:
                    # ECP5: the ROM is read a cycle ahead, at the address `ts[-3]` holds next
                    # (the slot before it, or the input counter's successor), every cycle, and
                    # its word taken into a register where its output was: the same words on
                    # the same cycles, and no block RAM output goes straight into the DSPs'
                    # input registers (5.6 ns clock-to-out, then the route: the matrix unit's
                    # weights into its DSPs were a 12.5 ns path of MLPerf Tiny's autoencoder).
                    if len(ts) > 3:
                        ahead = Mux(advance, ts[-4], ts[-3])
                    else:
                        t_nx = Signal(t_shape, name="t_nx", init=1 % period)
                        with m.If(i_stream.valid & take):
                            m.d.sync += t_nx.eq(wrap_incr(t_nx, period))
                        ahead = Mux(i_stream.valid & take, t_nx, t_in)
                    m.d.comb += [rd.addr.eq(ahead), rd.en.eq(1)]
                    p_data = Signal.like(rd.data, name=f"p{k}_read", reset_less=True)
                    with m.If(advance):
                        m.d.sync += p_data.eq(rd.data)
                else:
                    # A ROM in LUTs is read in step, its register enabled by the stall
                    # state: read ahead, the input transfer (from the core before) picked its
                    # address, which was the DS-CNN's critical path at 16,000 cycles
                    # (requant skid flag -> matvec -> address -> ROM register, 11.0 ns).
                    m.d.comb += [rd.addr.eq(ts[-3]), rd.en.eq(advance)]
                with m.If(advance):
                    m.d.sync += p_word.eq(p_data)

            def lane_params(word, plan=plan):
                """Per lane, each parameter: a field of `word` or the constant."""
                return [{name: (getattr(word[j], name) if plan.varies[name] else table[j][0])
                         for name, table in plan.tables.items()} for j in range(lanes)]
            params = lane_params(p_word if fields else None)
            p_next = lane_params(p_data if fields else None)

            v = [Signal(plan.v_shape, name=f"v{k}_{j}", reset_less=True) for j in range(lanes)]
            r = [Signal(plan.r_shape, name=f"r{k}_{j}", reset_less=True) for j in range(lanes)]
            y = Signal(data.ArrayLayout(plan.out_shape, lanes), name=f"y{k}", reset_less=True)
            y_next = []                     # the values `y` loads, per lane
            # Stages a..e (float32: a..g), each with the valid flag and transfer slot of its
            # contents.
            steps = "abcdefg" if plan.float32 else "abcde"
            valids = [Signal(name=f"valid{k}_{n}") for n in steps]
            slots = [Signal(t_shape, name=f"t{k}_{n}") for n in steps]
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
                    if digits and k == 0:
                        products = digit_partial_products(x[j], x3[j], p[mult])
                    else:
                        products = partial_products(x[j], p[mult], chunks)
                        if dsp:
                            factors = partial_factors(x_next[j], p_next[j][mult], chunks)
                    for n, (shift, value) in enumerate(products):
                        name = f"{mult}{k}_part{j}_{n}"
                        if dsp and one_dsp(*factors[n][1:]):
                            _, px, pm = factors[n]
                            part = mult18x18d(m, px, C(pm) if isinstance(pm, int) else pm,
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
                        terms = tree_levels(parts, 1)
                    else:
                        value = tree_levels(parts)[0]
                        if lut_mul and len(parts) > 2:
                            # Carry-save: one carry chain instead of a tree of them.
                            value = carry_save_sum(m, parts, Shape.cast(value.shape()),
                                                    f"{mult}{k}_csa{j}")
                        terms = [value]
                    prod = [Signal(Shape.cast(t.shape()), name=f"{mult}{k}_prod{j}"
                                   + (f"_{i}" if len(terms) > 1 else ""), reset_less=True)
                            for i, t in enumerate(terms)]
                    with m.If(advance):
                        m.d.sync += [r_.eq(t) for r_, t in zip(prod, terms)]
                    prod = tree_levels(prod)[0]
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
                src = v[j]
                if plan.float32:
                    # float32, two more steps: the mask of the product's bits beyond 24
                    # significant ones, then the product rounded to 24 bits (half to even),
                    # which d rounds again to an integer.
                    mask = significant_mask(m, v[j], name=f"p{k}_sig{j}")
                    p1 = Signal(plan.v_shape, name=f"p{k}_m{j}", reset_less=True)
                    src = Signal(plan.p_shape, name=f"p{k}_r{j}", reset_less=True)
                    with m.If(advance):
                        m.d.sync += p1.eq(v[j])
                        if mask is None:
                            m.d.sync += src.eq(p1)
                        else:
                            mreg = Signal(Shape.cast(mask.shape()), name=f"p{k}_mask{j}",
                                          reset_less=True)
                            creg = Signal(name=f"p{k}_carry{j}", reset_less=True)
                            m.d.sync += [mreg.eq(mask), creg.eq(mask_carry(v[j], mask)),
                                         src.eq(round_to_mask(p1, mreg, creg))]
                # d: round and add the zero point, r = (src + const + carry) >> shift; and
                # whether r is above hi or below lo, from src in parallel (e: clip): with
                # the comparisons of r in front of y, a spread placement of MobileNetV1 put
                # r, the comparator's carry chain and y's clip across the die (12.0 ns).
                s, const = plan.shift, plan.const
                hi_at, lo_at = ((plan.hi + 1) << s) - const, (plan.lo << s) - const
                if s == 0 or plan.rounding in ("floor", "ceil") or \
                        (plan.rounding == "to_zero" and not plan.v_signed):
                    r_next = (src + C(const)) >> s if s else src + const
                    above, below = src >= hi_at, src < lo_at
                elif plan.rounding == "to_zero":
                    bias = Mux(src[-1], C((1 << s) - 1), C(0))
                    r_next = (src + C(const) + bias) >> s
                    neg = (1 << s) - 1
                    above = Mux(src[-1], src >= hi_at - neg, src >= hi_at)
                    below = Mux(src[-1], src < lo_at - neg, src < lo_at)
                else:
                    if plan.rounding == "half_even":
                        cin = src[s] if s < len(src) else \
                            (src[-1] if plan.v_signed else C(0, 1))
                    else:
                        cin = ~src[-1] if plan.v_signed else C(1, 1)
                    r_next = (src + C(const) + cin) >> s
                    above = (src >= hi_at) | (cin & (src == hi_at - 1))
                    below = Mux(cin, src < lo_at - 1, src < lo_at)
                flags = {}
                for clip, name, test in ((plan.clip_hi, "above", above),
                                         (plan.clip_lo, "below", below)):
                    if clip:
                        flags[name] = Signal(name=f"{name}{k}_{j}", reset_less=True)
                        with m.If(advance):
                            m.d.sync += flags[name].eq(test)
                with m.If(advance):
                    m.d.sync += [v[j].eq(value), r[j].eq(r_next)]
                    clipped = r[j]
                    if plan.clip_hi:
                        clipped = Mux(flags["above"], plan.hi, clipped)
                    if plan.clip_lo:
                        clipped = Mux(flags["below"], plan.lo, clipped)
                    m.d.sync += y[j].eq(clipped)
                y_next.append(clipped)
            x, x_next, valid = y, y_next, valids[-1]
            ts += slots

        frees = skid_output_shares(m, o_stream, valid, x, 2)
        m.d.comb += [take.eq(frees[0]), advance.eq(frees[1])]
        return m
