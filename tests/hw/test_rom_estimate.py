"""The weight ROM's estimate by its shape: a :class:`MatVecCore` built with ``rom_stand_in``
(a two-word ROM of zeros in place of the weights, the real shape from
``weight_rom_shapes``) gives the same netlist features, block RAMs and memory list as the
core with its weights, on iCE40 and ECP5; and estimating a large layer never builds its
weight memory."""

import numpy as np
import pytest
from amaranth.lib import memory as amaranth_memory

from onnx2fpga.boards.targets import get_board
from onnx2fpga.hw import memory as hw_memory
from onnx2fpga.hw.matvec import MatVecCore
from onnx2fpga.hw.resources import dataflow_resources, netlist_features
from onnx2fpga.ir.dataflow import Dataflow, Port
from onnx2fpga.ir.layers import DenseLayer
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan.devices import memory_mapping, varying_columns


def _layer(n_in, n_out, simd, pe, in_type, w_bits, *, seed=0, constant_inputs=0,
           bipolar=False, multipliers="dsp"):
    rng = np.random.default_rng(seed)
    if bipolar:
        w = rng.choice([-1, 1], size=(n_out, n_in))
    else:
        w = rng.integers(-(1 << (w_bits - 1)), 1 << (w_bits - 1), size=(n_out, n_in))
    w[:, :constant_inputs] = 0          # inputs no output uses: constant ROM columns
    layer = DenseLayer("fc", in_type, 0, w, IntType(w_bits, True),
                       rng.integers(-99, 99, size=n_out), [], simd=simd, pe=pe)
    layer.multipliers = multipliers
    return layer


#: The platform a family's estimates elaborate for (hw.resources).
BOARDS = {"ice40": "icebreaker", "ecp5": "ulx3s-85f"}

i8, u8, i4, i2 = IntType(8, True), IntType(8, False), IntType(4, True), IntType(2, True)

#: (name, layer arguments, MatVecCore options): block RAM and soft-logic ROMs of both
#: families, constant columns, one-word ROMs, sign and XNOR words, ECP5 column slices
#: (128 words of 192 bits: 6 DP16KD in slices; 256 of 768: 22 in 6 slices), banks.
CASES = [
    ("bram", (64, 32, 2, 1, i8, 8), {}),
    ("bram_constant_columns", (64, 32, 4, 2, i8, 8), {"constant": 5}),
    ("logic_rom", (16, 8, 2, 2, i8, 8), {}),
    ("one_word", (8, 4, 8, 4, i8, 4), {}),
    ("sign", (64, 16, 4, 2, i8, 2), {"bipolar": True}),
    ("xnor", (64, 16, 8, 2, i2, 2), {"bipolar": True, "arithmetic": "xnor"}),
    ("ecp5_slices", (128, 64, 32, 2, u8, 3), {}),
    ("ecp5_slices_constant", (256, 64, 32, 2, u8, 4), {"constant": 40}),
    ("wide", (768, 256, 3, 1, i4, 4), {}),
    ("lut_products", (64, 32, 4, 2, i8, 8), {"multipliers": "lut"}),
    ("banks", (320, 8, 1, 2, i8, 8), {"w_logic": True}),
    ("x_logic", (64, 32, 2, 1, i8, 8), {"x_logic": True}),
    ("spram", (64, 32, 2, 1, i8, 8), {"w_spram": True}),
]


def _core(args, opts, **kw):
    layer = _layer(*args, constant_inputs=opts.get("constant", 0),
                   bipolar=opts.get("bipolar", False),
                   multipliers=opts.get("multipliers", "dsp"))
    return MatVecCore(layer, arithmetic=opts.get("arithmetic"),
                      w_logic=opts.get("w_logic", False), x_logic=opts.get("x_logic", False),
                      w_spram=opts.get("w_spram", False), **kw)


@pytest.mark.parametrize("family", ["ice40", "ecp5"])
@pytest.mark.parametrize("name, args, opts", CASES, ids=[c[0] for c in CASES])
def test_stand_in_rom_gives_the_netlist_estimate(family, name, args, opts):
    real = netlist_features(_core(args, opts), family)
    core = _core(args, opts, rom_stand_in=True)
    shapes = core.weight_rom_shapes(get_board(BOARDS[family]).platform())
    assert netlist_features(core, family, stand_ins=shapes) == real
    # The shapes are those of the real netlist's weight memories, widths counting the
    # columns that vary.
    weights = {n: (w, d) for n, (w, d, rom, _) in zip(real["memory_names"], real["memories"])
               if n.startswith("w_mem")}
    assert shapes == weights
    if opts.get("w_logic"):
        # As a board build has them: banks of a ROM named in logic_memories.
        real = netlist_features(_core(args, opts), family, logic={"w_mem"})
        assert netlist_features(core, family, logic={"w_mem"}, stand_ins=shapes) == real
    if name.startswith("ecp5_slices") and family == "ecp5":
        assert len(shapes) > 1          # the case does slice
    if opts.get("w_spram"):             # weights read through w_read: no weight memory
        assert shapes == {} and "w_mem" not in real["memory_names"]
        assert netlist_features(_core(args, {}), family)["memory_names"].count("w_mem") == 1


def test_weight_words_are_the_layout_values():
    """The packed words (numpy) are what the weight layout's constants give, and their
    varying columns what varying_columns finds."""
    from amaranth import Const, signed, unsigned
    from amaranth.lib import data
    rng = np.random.default_rng(3)
    for bits, k, rows in ((8, 6, 9), (3, 5, 7), (1, 12, 4), (17, 2, 5), (32, 3, 3)):
        fields = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), size=(rows, k)) \
            if bits > 1 else rng.integers(0, 2, size=(rows, k))
        fields[:, 1] = fields[0, 1]
        layout = data.ArrayLayout(signed(bits) if bits > 1 else unsigned(1), k)
        want = [Const.cast(layout.const([int(v) for v in row])).value for row in fields]
        assert hw_memory.word_ints(fields, bits) == want
        assert hw_memory.varying_fields(fields, bits) == varying_columns(want)


def test_estimating_a_large_layer_builds_no_weight_memory(monkeypatch):
    """A 1024 x 1024 layer at one product (a 1 M-word weight ROM): its estimates on both
    families elaborate no memory deeper than the input buffer and pack no weight; the ROM
    counts as the block RAMs its shape takes."""
    depths = []
    real_init = amaranth_memory.Memory.__init__

    def spy(self, *args, depth, **kw):
        depths.append(depth)
        if depth > 4096:
            raise AssertionError(f"a memory of {depth} words elaborated")
        real_init(self, *args, depth=depth, **kw)

    def no_packing(*args, **kw):
        raise AssertionError("weights packed for an estimate")

    monkeypatch.setattr(amaranth_memory.Memory, "__init__", spy)
    monkeypatch.setattr("onnx2fpga.hw.matvec.word_ints", no_packing)
    layer = _layer(1024, 1024, 1, 1, i8, 8)
    df = Dataflow([layer], Port("x", (1024,), i8, 1.0, 0, lanes=1),
                  Port("y", (1024,), layer.acc_type, 1.0, 0, lanes=1), fifo_depths=[2])
    for family in ("ice40", "ecp5"):
        r = dataflow_resources(df, family, memories=True)
        rom = [b for b in r["block_memories"] if b[0].endswith("/w_mem")]
        assert rom == [(rom[0][0], memory_mapping(8, 1 << 20, family, rom=True).cells,
                        8, 1 << 20, True)]
    assert depths and max(depths) <= 4096
