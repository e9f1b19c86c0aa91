"""ECP5 hard products: MatVecCore and RequantCore elaborated for an ECP5 put every hard
product (a requantization's partial products that take one DSP each) in a MULT18X18D with its
input and output registers. The emitted Verilog (with a behavioural model
of the DSP from Lattice's documentation, tests/data/mult18x18d_model.v) runs in Verilator
under stalls and must equal the golden model, with the cycle figures of the platform-free
design."""


import numpy as np
import pytest
from amaranth import signed, unsigned

from onnx2fpga.boards.targets import get_board
from onnx2fpga.hw.arith import ecp5_registered_product
from onnx2fpga.hw.emit import emit_verilog
from onnx2fpga.ir.dataflow import Dataflow, Port
from onnx2fpga.ir.layers import DenseLayer
from onnx2fpga.ir.stages import RequantStage
from onnx2fpga.ir.types import IntType
from tests.helpers.hard_products import check_against_plain, ds_block, lut_dense
from tests.helpers.paths import DATA

MODEL = DATA / "mult18x18d_model.v"


def _dataflow(seed=0):
    """uint8 x int8 (DSPs, simd 8, pe 2: a two-stage adder tree), int8 x int3 (LUTs), int16 x
    int6 (DSPs, simd 2, pe 2; 22-bit products, so the DSP's signedness matters) whose
    accumulators are the output, so that output stalls reach its DSPs.

    Requantization: fc1's 19-bit accumulators are cut into an 18-bit and a signed 1-bit
    piece (ECP5's 18-bit operands), each times a 7-bit per-channel multiplier from a table,
    on both sides of a LeakyRelu (2 DSPs for the 18-bit pieces; the 1-bit ones are LUT
    logic); the lut layer's has a table multiplier, then a second stage whose constant
    multiplier 70001 is an 18-bit piece (a DSP fed from the first stage's clip)."""
    rng = np.random.default_rng(seed)
    u8, i8, i16 = IntType(8, False), IntType(8, True), IntType(16, True)
    fc1 = DenseLayer("fc1", u8, 3, rng.integers(-128, 128, size=(6, 16)), i8,
                     rng.integers(-999, 999, size=6),
                     [RequantStage(rng.integers(40, 120, size=6), [-900], 15, 0, -128, 127,
                                   i8, neg_multiplier=rng.integers(5, 30, size=6),
                                   neg_offset=[-100])], simd=8, pe=2)
    lut = DenseLayer("lut", i8, 0, rng.integers(-4, 4, size=(6, 6)), IntType(3, True),
                     rng.integers(-9, 9, size=6),
                     [RequantStage(rng.integers(40, 120, size=6), [0], 4, 0, -32768, 32767,
                                   i16),
                      RequantStage([70001], [5000], 17, 0, -32768, 32767, i16)],
                     simd=2, pe=1)
    fc2 = DenseLayer("fc2", i16, 0, rng.integers(-32, 32, size=(4, 6)), IntType(6, True),
                     rng.integers(-99, 99, size=4), [], simd=2, pe=2)
    return Dataflow([fc1, lut, fc2], Port("x", (16,), u8, 1.0, 3, lanes=8),
                    Port("y", (4,), fc2.acc_type, 1.0, 0, lanes=2), fifo_depths=[2, 2, 2])


def test_which_products_go_to_registered_dsps():
    ecp5 = get_board("ulx3s-85f").platform()
    ice40 = get_board("icebreaker").platform()
    assert ecp5_registered_product(ecp5, unsigned(8), signed(8))
    assert ecp5_registered_product(ecp5, signed(18), unsigned(18))
    assert not ecp5_registered_product(ecp5, signed(19), signed(8))      # yosys splits it
    assert not ecp5_registered_product(ecp5, signed(16), signed(4))      # LUT product
    assert not ecp5_registered_product(ice40, signed(8), signed(8))
    assert not ecp5_registered_product(None, signed(8), signed(8))


@pytest.mark.rtl
def test_registered_dsps_equal_golden_with_the_same_cycles(tmp_path):
    df = _dataflow()
    ecp5_v = emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    plain_v = emit_verilog(df)
    # fc1: 8 x 2 products, fc2: 2 x 2; the 3-bit weights stay in LUTs. Requantization:
    # 2 + 1 + 1 (see _dataflow).
    assert ecp5_v.count("MULT18X18D ") == 24 and "MULT18X18D" not in plain_v
    assert emit_verilog(df, platform=get_board("ulx3s-85f").platform()) == ecp5_v
    check_against_plain(tmp_path, df, ecp5_v, MODEL.read_text())


@pytest.mark.rtl
def test_requantization_of_four_partial_products_equals_golden(tmp_path):
    """A 23-bit multiplier on 23-bit accumulators whose outputs change over their whole range
    (no clamp narrows them; a 10-bit output, so no threshold core): four partial products
    (DSPs, 18-bit pieces) per lane, whose sum the ECP5 build splits over two stages (one
    adder level behind the DSPs); values and cycles as in the platform-free design."""
    rng = np.random.default_rng(5)
    u8, i10, i12 = IntType(8, False), IntType(10, True), IntType(12, True)
    fc = DenseLayer("fc", u8, 3, rng.integers(-2048, 2048, size=(6, 16)), i12,
                    rng.integers(-999, 999, size=6),
                    [RequantStage(rng.integers(2 ** 22, 2 ** 23, size=6), [-9000], 40, 0,
                                  i10.lo, i10.hi, i10)], simd=8, pe=2)
    assert fc.acc_type.bits > 20
    df = Dataflow([fc], Port("x", (16,), u8, 1.0, 3, lanes=8),
                  Port("fc", (6,), i10, 1.0, 0, lanes=2), fifo_depths=[2])
    ecp5_v = emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    # 16 products, and 4 partial products in the requantization's one lane.
    assert ecp5_v.count("MULT18X18D ") == 16 + 4
    assert "m0_prod0_1" in ecp5_v and "m0_prod0_1" not in emit_verilog(df)
    check_against_plain(tmp_path, df, ecp5_v, MODEL.read_text())


@pytest.mark.rtl
def test_float32_requantization_equals_golden(tmp_path):
    """onnxruntime's requantization (a stage rounding "float32") on 28-bit accumulators:
    the accumulator rounded to 24 significant bits first, so the DSPs' input registers take
    the rounded value the register before them loads; values and cycles as in the
    platform-free design. A 10-bit output: more levels than a threshold core takes."""
    from onnx2fpga.frontend.epilogue import float32_params
    rng = np.random.default_rng(7)
    u8, i10 = IntType(8, False), IntType(10, True)
    m, shift = float32_params((rng.uniform(0.5, 1, 6) * 2.0 ** -rng.integers(21, 24, 6))
                              .astype(np.float32))
    fc = DenseLayer("fc", u8, 3, rng.integers(-32768, 32768, size=(6, 16)),
                    IntType(16, True), rng.integers(-999, 999, size=6),
                    [RequantStage(m, [0], shift, 0, i10.lo, i10.hi, i10, rounding="float32")],
                    simd=8, pe=2)
    assert fc.acc_type.bits > 26
    df = Dataflow([fc], Port("x", (16,), u8, 1.0, 3, lanes=8),
                  Port("fc", (6,), i10, 1.0, 0, lanes=2), fifo_depths=[2])
    ecp5_v = emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    assert ecp5_v.count("MULT18X18D ") > 16 and "xmask0" in ecp5_v    # the matvec's 16
    check_against_plain(tmp_path, df, ecp5_v, MODEL.read_text())


@pytest.mark.rtl
def test_lut_products_read_their_memories_ahead_with_the_same_cycles(tmp_path):
    """LUT products of 8-bit weights (carry chains, hw.chains) on an ECP5 take their weights
    and inputs from fabric registers read a cycle ahead where those memories are block RAMs
    (128 words of 64 and of 32 bits here): values and cycles as in the platform-free design,
    which reads them in step. Memories in LUTs are read in step (test_ecp5_chains)."""
    df = lut_dense(np.random.default_rng(9), 256, 4, simd=4, pe=2, zero_point=3, bias=999)
    ecp5_v = emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    plain_v = emit_verilog(df)
    assert "MULT18X18D" not in ecp5_v
    assert "w_read" in ecp5_v and "x_read" in ecp5_v and "w_read" not in plain_v
    check_against_plain(tmp_path, df, ecp5_v, (DATA / "ccu2c_model.v").read_text())


@pytest.mark.rtl
def test_fabric_registers_behind_the_dsps_take_one_cycle_per_layer(tmp_path):
    """``Dataflow.ecp5_dsp_registers``: fc1 and fc2, whose products take MULT18X18Ds, have
    one more pipeline stage (a fabric register behind each DSP); the layer of 3-bit weights
    (LUT products) does not. The model's latency grows by 2, and so does the RTL's; the
    ECP5 Verilog equals golden under stalls with the platform-free design's cycles."""
    from onnx2fpga.plan import cost
    from onnx2fpga.sim.rtl import simulate_rtl

    before, df = _dataflow(), _dataflow()
    df.ecp5_dsp_registers = True
    old, new = cost.dataflow_cycles(before), cost.dataflow_cycles(df)
    assert [ly["latency"] - o["latency"] for ly, o in zip(new["layers"], old["layers"])] \
        == [1, 0, 1]
    assert new["latency_cycles"] == old["latency_cycles"] + 2
    assert new["cycles_per_inference"] == old["cycles_per_inference"]
    ecp5_v = emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    assert ecp5_v.count("MULT18X18D ") == 24
    check_against_plain(tmp_path, df, ecp5_v, MODEL.read_text())
    x = np.zeros((2, df.input.size), np.int64)
    for name, d in (("old", before), ("new", df)):
        (tmp_path / f"{name}.v").write_text(emit_verilog(d))
        res = simulate_rtl(tmp_path / f"{name}.v", d.input, d.output, x,
                           build_dir=tmp_path / f"b-{name}", progress=False)
        figures = old if name == "old" else new
        assert res.latency_cycles == figures["latency_cycles"]
        assert res.cycles_per_inference == figures["cycles_per_inference"]


@pytest.mark.rtl
@pytest.mark.parametrize("lanes", [2, 6])
def test_depthwise_dsps_equal_golden_with_the_same_cycles(tmp_path, lanes):
    """A depthwise 3x3 (uint8 input, int8 weights) on DSPs, then a pointwise 1x1: the
    depthwise core's products in registered MULT18X18Ds, their weights from a register the
    ROM fills two steps ahead (three folds, and one). Values equal golden under stalls, the
    cycles the platform-free design's."""
    df = ds_block({"lanes": lanes}, {"simd": 3, "pe": 2})
    ecp5_v = emit_verilog(df, platform=get_board("ulx3s-85f").platform())
    assert "w_cur" in ecp5_v and "w_cur" not in emit_verilog(df)
    assert ecp5_v.count("MULT18X18D ") >= lanes + 6
    check_against_plain(tmp_path, df, ecp5_v, MODEL.read_text())
