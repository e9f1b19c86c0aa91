"""The matrix-vector core: a folded ``simd`` x ``pe`` array of products, adder trees and
accumulators, the compute unit of dense layers and convolutions.

Its cycle figures are :mod:`onnx2fpga.plan.cost`'s; its integer semantics
:func:`onnx2fpga.sim.golden.dense`, bit for bit.
"""

from __future__ import annotations

import operator

import numpy as np
from amaranth import (
    C,
    Cat,
    Module,
    Mux,
    Shape,
    Signal,
    signed,
    unsigned,
)
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..ir.layers import DenseLayer
from ..plan import matvec as timing
from ..plan.builder import matvec_arithmetic
from ..plan.checks import check_count
from ..plan.devices import (BLOCK_STYLE, ice40_paired_product, ice40_registered_product,
                            memory_mapping)
from ..plan.spram import SPRAM_BITS, spram_count
from .arith import (
    DIGIT_MIN_BITS,
    LUT_CHUNKS,
    carry_save_sum,
    digit_terms,
    ecp5_packed_products,
    ecp5_registered_product,
    is_ecp5,
    is_ice40,
    mul_chunks,
    mult18x18d,
    mult18x18d_pair,
    product,
    sb_mac16,
    sb_mac16_pair,
    times3_range,
)
from .blocks import (
    counter,
    int_shape,
    quiet_if_invalid,
    range_shape,
    registered_tree,
    skid_output,
    wrap_incr,
)
from .chains import chain_op, chain_sum, registered_pairs
from .memory import (
    LOGIC_ROM_BANK_WORDS,
    BankedRom,
    ReadPort,
    WritePort,
    banked_rom,
    double_buffer_release,
    double_buffer_writer,
    logic_rom_banks,
    rom_bank_depth,
    rom_slices,
    varying_fields,
    word_ints,
)
from .spram import weight_read_signature

__all__ = ["MatVecCore"]


#: Products per share of :class:`MatVecCore`'s data registers with an enable of their own, and
#: the most shares.
_PRODUCTS_PER_SHARE = 8
_MAX_SHARES = 32



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
    w_block : bool
        The weight ROM (or its column slices) carries
        :data:`~onnx2fpga.plan.devices.BLOCK_STYLE`, so that yosys puts it into block RAM
        where it would build it in LUTs; read a cycle ahead as every block RAM of an ECP5
        build is. The same values and cycles (the graph sets it for
        :attr:`Dataflow.block_memories <onnx2fpga.ir.Dataflow>`).
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
        ``SB_MAC16`` cells registered at both ends (:func:`sb_mac16`), one per product, or
        two per DSP in its 8 x 8 mode for operands of at most 8 bits
        (:func:`ice40_paired_product`, :func:`ice40_matvec_dsps`),
        in place of the operand and product registers; otherwise an iCE40 builds them in
        LUTs. The same values and cycles. The graph sets it within the design's budget of
        DSPs (:attr:`Dataflow.ice40_dsps <onnx2fpga.ir.Dataflow>`).
    dsp_register : bool
        A second register behind the products (the adder tree's first stage adds nothing):
        on an ECP5 the first is the ``MULT18X18D``'s own and the second is in fabric, where
        the placer can put it between a DSP and its adder tree however far apart they are.
        One more cycle of latency on every platform (the graph sets it for
        :attr:`Dataflow.ecp5_dsp_registers <onnx2fpga.ir.Dataflow>`).
    w_spram : bool
        The weights are not in a ROM of the core but read through its ``w_read`` port
        (:func:`~onnx2fpga.hw.spram.weight_read_signature`, ``weight_depth`` words of 16 bits
        per SPRAM the word takes), which the accelerator connects to the layer's SPRAMs
        (:class:`~onnx2fpga.hw.spram.SpramStore`): word ``n`` of :meth:`weight_words` at
        address ``n``, with a memory read port's timing. The same values and cycles.
    rom_stand_in : bool
        For the resource estimates only: the weight ROM (``w_mem``, or its slices
        ``w_mem_col{k}``) is a memory of its width but at most two words, holding zeros (the
        banks of ``w_logic`` hold zeros too), and the estimate takes its shape from
        :meth:`weight_rom_shapes`: the rest of the netlist is the same, and elaborating it
        takes no time with the weight count (a 256 x 256 layer's ROM took 20 s an
        estimate). Not a working core.

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
    ``d = timing.matvec_stages(simd, dsp_register)`` counts the pipeline registers (memory
    data, operand registers, products, and one adder-tree stage per two adder levels: 4 for
    ``simd <= 4``, 5 up to 16, 6 up to 64; one more with ``dsp_register``), so
    ``latency = folds + folds * groups + d`` cycles from the first input transfer to the last
    output transfer when the input arrives at one transfer per cycle. Every multiplier and
    adder-tree stage sits between registers so that a board build reaches 100 MHz on ECP5.
    Elaborated for an iCE40 platform (LUT multipliers), or on any platform when
    ``layer.multipliers`` is ``"lut"`` (no hard multiplier; folding picks it for layers a
    device's DSPs cannot hold), weights of 4 or more bits are multiplied without a
    multiplier: the input buffer also holds ``3 * x`` and ``-x``, the operand registers hold
    the multiples of ``x`` that the weight's radix-4 digits pick (0, x, 2x, 3x; -x, -2x for
    a signed top digit), and each product is their carry-save sum; the same values on the
    same cycles.
    Elaborated for an ECP5, hard products are registered ``MULT18X18D``; with one input
    transfer per vector (``folds == 1``), an unsigned input and operands that
    :func:`ecp5_packed_products` allows (6-bit inputs and weights, say), PEs ``2i`` and
    ``2i+1`` share one per input lane (:func:`mult18x18d_pair`), and the sum of the inputs,
    in an adder tree of its own, corrects their accumulators through the bias register; the
    same values on the same cycles, half the DSPs.
    The accumulator register is the output register, with a skid register behind it: an
    output the consumer does not take moves to the skid register, and the pipeline holds
    only while both are full, so that ``ready`` reaches no pipeline enable.

    Arithmetic (``arithmetic``; the default is
    :func:`onnx2fpga.plan.graph.matvec_arithmetic` of the layer), with the same pipeline and
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

    @classmethod
    def from_stage(cls, stage, *, rom_stand_in: bool = False) -> MatVecCore:
        """The core of a ``"matvec"`` :class:`~onnx2fpga.plan.stage.Stage`."""
        p = stage.params
        return cls(p["layer"], arithmetic=p.get("arithmetic"), w_logic=p.get("w_logic", False),
                   w_block=p.get("w_block", False), x_logic=p.get("x_logic", False),
                   ice40_dsp=p.get("ice40_dsp", False), w_spram=p.get("w_spram", False),
                   dsp_register=p.get("dsp_register", False), rom_stand_in=rom_stand_in)

    @quiet_if_invalid
    def __init__(self, layer: DenseLayer, *, arithmetic=None, w_logic=False, w_block=False,
                 x_logic=False, ice40_dsp=False, w_spram=False, dsp_register=False,
                 rom_stand_in=False):
        if not isinstance(layer, DenseLayer):
            raise TypeError(f"Layer must be a DenseLayer, not {layer!r}")
        simd = check_count(f"SIMD of layer {layer.name!r}", layer.simd)
        pe = check_count(f"PE of layer {layer.name!r}", layer.pe)
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
        self._w_spram = bool(w_spram)
        self._w_banks = logic_rom_banks(self.groups * self.folds) \
            if w_logic and not w_spram else 1
        self._w_block = bool(w_block) and self._w_banks == 1 and not self._w_spram
        self._x_logic = bool(x_logic)
        self._ice40_dsp = bool(ice40_dsp)
        self._dsp_register = bool(dsp_register)
        self._rom_stand_in = bool(rom_stand_in)
        self._in_shape = int_shape(layer.in_type)
        self._w_shape = int_shape(wt)
        self._acc_shape = signed(layer.acc_type.bits)
        members = {
            "i_stream": In(stream.Signature(data.ArrayLayout(self._in_shape, simd))),
            "o_stream": Out(stream.Signature(data.ArrayLayout(self._acc_shape, pe))),
        }
        if self._w_spram:
            members["w_read"] = Out(weight_read_signature(
                self.weight_depth, SPRAM_BITS * spram_count(self.weight_width)))
        super().__init__(members)

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
        return timing.matvec_latency(self.folds, self.groups, self._layer.simd,
                                     self._dsp_register)

    @property
    def w_banks(self) -> int:
        """Banks of the weight ROM: 1, or :func:`logic_rom_banks` with ``w_logic``."""
        return self._w_banks

    @property
    def w_spram(self) -> bool:
        """The weights are read through ``w_read`` (from SPRAM), not from a ROM."""
        return self._w_spram

    @property
    def weight_width(self) -> int:
        """Bits of a weight word: ``pe * simd`` weights (one bit each for ``"sign"`` and
        ``"xnor"``)."""
        bits = self._w_shape.width if self._arithmetic == "multiply" else 1
        return self._layer.pe * self._layer.simd * bits

    @property
    def weight_depth(self) -> int:
        """Weight words: ``groups * folds``."""
        return self.groups * self.folds

    def weight_words(self) -> list:
        """The weight words as ints (see :meth:`_weight_fields`' layout): what the ROM holds,
        or what a weight image writes into the core's SPRAMs."""
        return word_ints(*self._weight_fields())

    @property
    def x_logic(self) -> bool:
        """The input buffer is a pair of shift registers (``x_logic``), not a memory."""
        return self._x_logic

    def _weight_fields(self):
        """``(fields, bits)``: the weight ROM's word ``g * folds + f`` holds ``fields[g * folds
        + f, p * simd + s]`` (weight ``(g * pe + p, f * simd + s)``) in ``bits`` bits at
        ``(p * simd + s) * bits`` (:func:`word_ints`): the weight, or one bit, 1 for +1."""
        simd, pe = self._layer.simd, self._layer.pe
        w = np.asarray(self._layer.weight).reshape(self.groups, pe, self.folds, simd)
        fields = w.transpose(0, 2, 1, 3).reshape(self.groups * self.folds, pe * simd)
        if self._arithmetic != "multiply":
            return (fields > 0).astype(np.int64), 1
        return fields, self._w_shape.width

    def weight_rom_shapes(self, platform) -> dict:
        """``{memory: (width, depth)}`` of the weight ROM as yosys sees it when the core is
        elaborated for ``platform``: ``"w_mem"``, its column slices ``"w_mem_col{k}"``
        (:func:`rom_slices`) or its banks ``"w_mem_bank{n}"`` (``w_logic``), the width
        counting only the columns that vary (yosys drops the others). What
        :func:`~onnx2fpga.hw.resources.netlist_features` counts for the stand-ins of a core
        built with ``rom_stand_in``. Empty with ``w_spram`` (no ROM)."""
        if self._w_spram:
            return {}
        fields, bits = self._weight_fields()
        depth = self.groups * self.folds
        if self._w_banks != 1:
            # Banks of LOGIC_ROM_BANK_WORDS words, the last one filled with zeros.
            n = LOGIC_ROM_BANK_WORDS
            padded = np.zeros((self._w_banks * n, fields.shape[1]), dtype=np.int64)
            padded[:depth] = fields
            banks = padded.reshape(self._w_banks, n, -1)
            return {f"w_mem_bank{k}": (max(1, varying_fields(bank, bits).bit_count()), n)
                    for k, bank in enumerate(banks)}
        varying = varying_fields(fields, bits)
        cols = rom_slices(platform, varying, depth, fields.shape[1] * bits,
                          block=self._w_block)
        names = ["w_mem"] if len(cols) == 1 else [f"w_mem_col{k}" for k in range(len(cols))]
        return {name: (max(1, ((varying >> lo) & ((1 << (hi - lo)) - 1)).bit_count()), depth)
                for name, (lo, hi) in zip(names, cols)}

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
        mac16 = (self._ice40_dsp and is_ice40(platform) and not lut
                 and self._arithmetic == "multiply"
                 and ice40_registered_product(self._in_shape, self._w_shape))
        paired = mac16 and ice40_paired_product(self._in_shape, self._w_shape)
        # ECP5 LUT products: pairs of the weight's bits, each a carry chain whose LUTs also
        # pick the rows (hw.chains), then carry-chain adders: about half the LUTs of digits.
        chains = self._arithmetic == "multiply" and lut and is_ecp5(platform)
        digits = (self._arithmetic == "multiply" and self._w_shape.width >= DIGIT_MIN_BITS
                  and (lut or mul_chunks(platform) == LUT_CHUNKS) and not mac16
                  and not chains)
        # ECP5: every product in a registered MULT18X18D (all of them or none).
        dsp = mac16 or (self._arithmetic == "multiply" and not digits and not lut and
                        ecp5_registered_product(platform, self._in_shape, self._w_shape))
        # ECP5 DSPs and LUT products read block RAMs a cycle ahead (w_ahead, x_ahead below).
        ahead = (dsp and not mac16 or (digits or chains) and is_ecp5(platform)) \
            and self._w_banks == 1
        x_elem = self._in_shape
        if digits:
            x_elem = data.StructLayout({
                "x": self._in_shape, "x3": range_shape(*times3_range(self._in_shape)),
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
            x_rd = ReadPort(Signal(range(max(2 * folds, 2)), name="x_mem_addr"),
                             Signal(name="x_mem_en"))
            x_wr = WritePort(Signal(range(max(2 * folds, 2)), name="x_mem_waddr"),
                              Signal(x_width, name="x_mem_wdata"), Signal(name="x_mem_wen"))
            x_bits = Signal(x_width, name="x_mem_data", reset_less=True)
            x_rdata = x_bits if xnor else x_layout(x_bits)
        w_elem = self._w_shape if self._arithmetic == "multiply" else unsigned(simd)
        w_layout = data.ArrayLayout(w_elem, pe) if self._arithmetic != "multiply" else \
            data.ArrayLayout(data.ArrayLayout(w_elem, simd), pe)
        w_width = Shape.cast(w_layout).width
        depth = groups * folds
        fields, bits = self._weight_fields()
        if self._rom_stand_in or self._w_spram:
            # For the resource estimates: the ROM without its contents (see
            # weight_rom_shapes), so that estimating a folding takes no time with the weight
            # count.
            words = []
        else:
            words = word_ints(fields, bits)
        varying = varying_fields(fields, bits) if self._w_banks == 1 else 0
        # Column slices of the weight ROM on an ECP5 (see the end of elaborate): one range
        # when it is one memory, and their read enables.
        w_cols = rom_slices(platform, varying, depth, w_width, block=self._w_block) \
            if self._w_banks == 1 else [(0, w_width)]
        w_slice_adv = []
        # ECP5 DSPs take their weights from a fabric register, not straight from the block
        # RAMs, and so do the LUT products (a weight ROM's output into the digit pickers was
        # the autoencoder's critical path once its DSPs had the register, 11.4 ns with a
        # 4.5 ns route). So does the input buffer where it is a block RAM (the autoencoder's
        # 128-to-8 layer, one product per step), read a cycle ahead too where the writer
        # leaves room: its last word reaches the memory a cycle after the bank is full
        # (registered writes), and the reader, a cycle earlier now, reads it `folds - 1`
        # cycles later. Memories in LUTs are read in step: ahead, the stall logic reached
        # their address (the autoencoder's 640-input buffer in LUT RAM, 13.4 ns: 74.5 MHz).
        w_ahead = ahead and not self._w_spram and memory_mapping(
            max(1, varying.bit_count()), max(depth, 1), "ecp5", rom=True,
            block=self._w_block).kind == "block"
        x_ahead = ahead and not self._x_logic and folds >= 3 and memory_mapping(
            Shape.cast(x_layout).width, 2 * folds, "ecp5", rom=False).kind == "block"
        w_attrs = BLOCK_STYLE if self._w_block else None
        # A stand-in ROM: at most two words of zeros (the address's high bits unused).
        rom_depth = min(depth, 2) if self._rom_stand_in else depth
        if self._w_spram:
            # Weights in SPRAM: the read port is the core's `w_read`, with a memory read
            # port's timing (the word one enabled edge after its address).
            w_rd = ReadPort(self.w_read.addr, self.w_read.en)
            w_data = self.w_read.data[:w_width]
            w_cols = [(0, w_width)]
        elif len(w_cols) > 1:
            # Column slices of a few block RAMs each, each read with its own replica of the
            # stall state: kwsmlp_w3a3's 768-bit weight word in 22 DP16KD, all enabled by one
            # net, was a 10.1 ns critical path on an ECP5 85F (the net spread over the die).
            pieces = []
            for k, (lo, hi) in enumerate(w_cols):
                init = [(v >> lo) & ((1 << (hi - lo)) - 1) for v in words]
                adv = Signal(name=f"w_mem_col{k}_en")
                bank_depth = w_ahead and rom_bank_depth(
                    ((varying >> lo) & ((1 << (hi - lo)) - 1)).bit_count(), rom_depth,
                    block=self._w_block)
                if bank_depth:
                    rd = BankedRom(m, f"w_mem_col{k}", hi - lo, rom_depth, bank_depth, init,
                                   w_attrs)
                else:
                    mem = Memory(shape=unsigned(hi - lo), depth=rom_depth, init=init,
                                 attrs=w_attrs)
                    m.submodules[f"w_mem_col{k}"] = mem
                    rd = mem.read_port()
                m.d.comb += rd.en.eq(1 if w_ahead else adv)
                pieces.append(rd)
                w_slice_adv.append(adv)
            w_rd = ReadPort(Signal(range(max(depth, 2)), name="w_mem_addr"),
                             Signal(name="w_mem_en"))
            if not w_ahead:          # (read ahead: each slice's own address, below)
                for rd in pieces:
                    m.d.comb += rd.addr.eq(w_rd.addr)
            w_data = Cat(rd.data for rd in pieces)
        elif self._w_banks == 1:
            m.submodules.w_mem = w_mem = Memory(shape=unsigned(w_width), depth=rom_depth,
                                                init=words, attrs=w_attrs)
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
            w_rd, w_data = banked_rom(m, "w_mem", w_width, words, addr_lo=w_lo, depth=depth)

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
        full, fill = double_buffer_writer(m, i_stream, x_wr, folds, data=x_data,
                                           registered=not self._x_logic)
        full0, full1 = full

        # -- Read side: one (group g, fold f) step per cycle from bank `rb`.
        advance = Signal()      # the pipeline shifts (driven at the end)
        mem_adv = Signal()      # equal to it: the memory reads and their data registers
        rb = Signal()
        raddr = counter(2 * folds)
        waddr_w = counter(groups * folds)
        f = counter(folds)
        g = counter(groups)
        issue = Mux(rb, full1, full0) & advance
        f_last = f == folds - 1
        g_last = g == groups - 1
        done = issue & f_last & g_last     # last step on this bank: it may be refilled
        if x_ahead:
            # As the weights (below): the address raddr takes at the next step.
            raddr_nx = Mux(f_last, Mux(g_last ^ rb, folds, 0), raddr + 1)
            m.d.comb += [x_rd.addr.eq(Mux(issue, raddr_nx, raddr)), x_rd.en.eq(1)]
            x_read = Signal(x_layout, name="x_read", reset_less=True)
            with m.If(mem_adv):
                m.d.sync += x_read.eq(x_rd.data)
            x_rdata = x_read
        else:
            m.d.comb += [x_rd.addr.eq(raddr), x_rd.en.eq(mem_adv)]
        if w_ahead:
            # The weight ROM is read a cycle ahead, at the address the step counter holds
            # next (waddr_nx is its successor), every cycle: its output is the word at
            # waddr_w, which a fabric register takes where the ROM's output was: the same
            # word on the same cycles. A block RAM's output straight into a DSP's input
            # register (about 5.8 ns clock-to-out, then the route) was mnist-8's critical path
            # on the ULX3S (83.8 MHz).
            waddr_nx = Signal.like(waddr_w, name="waddr_nx", init=1 % depth)
            with m.If(issue):
                m.d.sync += waddr_nx.eq(wrap_incr(waddr_nx, depth))
            m.d.comb += [w_rd.addr.eq(Mux(issue, waddr_nx, waddr_w)), w_rd.en.eq(1)]
            if w_slice_adv:
                # Each column slice's address picks with the slice's own replica of the
                # stall state (equal to `advance`): one `issue` reaching the address of
                # every slice across the die was the autoencoder's critical path at 1,024
                # cycles (o_valid replica -> w_mem_col3, 11.3 ns: 88.3 MHz).
                take = Mux(rb, full1, full0)
                for rd, adv in zip(pieces, w_slice_adv):
                    m.d.comb += rd.addr.eq(Mux(take & adv, waddr_nx, waddr_w))
            w_read = Signal(len(w_data), name="w_read", reset_less=True)
            w_out = []
            for k, ((lo, hi), adv) in enumerate(zip(w_cols, w_slice_adv or [mem_adv])):
                if w_slice_adv and isinstance(pieces[k], BankedRom):
                    w_out.append(pieces[k].registered(adv))
                    continue
                with m.If(adv):
                    m.d.sync += w_read[lo:hi].eq(w_data[lo:hi])
                w_out.append(w_read[lo:hi])
            w_data = Cat(*w_out)
        else:
            m.d.comb += [w_rd.addr.eq(waddr_w), w_rd.en.eq(mem_adv)]
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
        double_buffer_release(m, full, fill, done, rb)
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
        # `timing.ADDER_LEVELS_PER_STAGE` levels each; its last register feeds the accumulator.
        tree_stages = timing.matvec_tree_stages(simd)
        n_stages = timing.matvec_stages(simd, self._dsp_register)
        s_valid = [Signal(name=f"s{n + 1}_valid") for n in range(n_stages)]
        s_first = [Signal(name=f"s{n + 1}_first") for n in range(n_stages)]
        s_last = [Signal(name=f"s{n + 1}_last") for n in range(n_stages)]
        s_g = [counter(groups) for _ in range(n_stages)]
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
                    values = digit_terms(x_rdata[s].x, x_rdata[s].x3, x_rdata[s].xn,
                                          w_layout(w_data)[p][s])
                    terms[p][s] = [Signal(Shape.cast(v.shape()), name=f"term_{p}_{s}_{n}",
                                          reset_less=True)
                                   for n, v in enumerate(values)]
                    with m.If(adv_of(p, s)):
                        m.d.sync += [r.eq(v) for r, v in zip(terms[p][s], values)]
        if chains:
            # S2 holds the pairs of rows, rows[p][s][n] = (shift, register).
            rows = [[registered_pairs(m, platform, x_rdata[s], w_layout(w_data)[p][s],
                                      adv_of(p, s), f"rows_{p}_{s}", f"rows_{p}_{s}")
                     for s in range(simd)] for p in range(pe)]
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
        # ECP5, one input transfer per vector: PEs 2i and 2i+1 share a MULT18X18D per input
        # lane (ecp5_packed_products), which halves the DSPs; the jet tagger's 64 x 32 layer
        # took 19,000 LUTs as LUT products where its 128 products found no DSPs. Each packed
        # product is off * x too large (off: mult18x18d_pair): its accumulator starts from
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
                outs = sb_mac16_pair(m, a0, b0, a1, b1, adv_of(p0, s0),
                                      f"mul_{p0}_{s0}")
                for (p, s), out in zip(flat[k:k + 2], outs):
                    m.d.comb += prods[p][s].eq(out)
        for p in range(pe):
            for s, (prod, value) in enumerate(zip(prods[p], prod_values[p])):
                if paired:
                    continue
                if p < 2 * pairs:
                    if p % 2 == 0:
                        lo, hi = mult18x18d_pair(m, x_rdata[s], w_layout(w_data)[p][s],
                                                  w_layout(w_data)[p + 1][s], adv_of(p, s),
                                                  f"mul_{p}_{s}")
                        m.d.comb += [prods[p][s].eq(lo), prods[p + 1][s].eq(hi)]
                    continue
                if dsp:
                    # The S2 registers and the product register are the DSP's own (fed from
                    # the S1 memory data, enabled as the fabric registers): same cycles, and
                    # the multiplier sits between registers inside the DSP.
                    hard = sb_mac16 if mac16 else mult18x18d
                    m.d.comb += prod.eq(hard(m, x_rdata[s], w_layout(w_data)[p][s],
                                             adv_of(p, s), f"mul_{p}_{s}"))
                    continue
                if digits:
                    value = carry_save_sum(m, terms[p][s], prod.shape(),
                                            f"prod_{p}_{s}_csa")
                if chains:
                    value = chain_sum(m, platform, rows[p][s], self._in_shape, self._w_shape,
                                      f"prod_{p}_{s}")
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
        per_stage = [timing.ADDER_LEVELS_PER_STAGE] * (tree_stages - 1)
        per_stage.append(max(0, levels - sum(per_stage)))
        if dsp:
            # One level behind the DSPs, the last stage the rest: a packed DSP of the jet
            # tagger's 64-term trees placed 37 columns from its adders took 4.9 ns of routing,
            # then two levels: 9.8 ns.
            per_stage.reverse()
            if tree_stages > 1:
                per_stage[0] = min(per_stage[0], 1)
        if self._dsp_register:
            per_stage.insert(0, 0)      # the products once more: a stage without adders
        sums = []
        for p in range(pe):
            if xnor:        # 2 * popcount; the -in_features sits in the bias
                terms = [prods[p][0][s] for s in range(simd)]
            else:
                terms = [t for t, z in zip(prods[p], zero[p]) if not z] or [C(0, 1)]
            terms = registered_tree(m, terms, per_stage, adv_of(p, 0),
                                     lambda n, i, p=p: f"sum{n}_{p}_{i}",
                                     None if xnor else acc_shape,
                                     op=chain_op(m, platform, f"add_{p}") if chains
                                     else operator.add)
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
            xsum = registered_tree(m, [x_word[s] for s in range(simd)],
                                    [timing.ADDER_LEVELS_PER_STAGE]
                                    * (tree_stages + self._dsp_register), advance,
                                    lambda n, i: f"xsum{n}_{i}")
            corr = xsum[0] << (w_off.bit_length() - 1)
            bias_c = [Signal(acc_shape, name=f"bias_c_{p}", reset_less=True) for p in range(pe)]
            with m.If(advance):
                m.d.sync += [b_c.eq(b - corr if p < 2 * pairs else b)
                             for p, (b_c, b) in enumerate(zip(bias_c, bias))]
            bias = bias_c

        # The output: the accumulator, and behind it a skid register (skid_output). The
        # pipeline stalls only while both are full, so `stall`, which enables every pipeline
        # register, does not depend on `o_stream.ready`.
        acc = Signal(data.ArrayLayout(acc_shape, pe), reset_less=True)
        o_valid = Signal()
        free = skid_output(m, o_stream, o_valid, acc)
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
