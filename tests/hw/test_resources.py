"""The resource model (hw/resources.py) against yosys 0.70 and nextpnr.

The expected DSP and block RAM counts in the unit tests were measured with YoWASP yosys 0.70
(``synth_ecp5``; ``synth_ice40``), one multiplier or memory per case
(``benchmarks/resources.py --sweep``); the synth test builds a design and compares.
"""

import os
import shutil

import numpy as np
import pytest

from onnx2fpga import api
from onnx2fpga.hw.matvec import MatVecCore
from onnx2fpga.hw.resources import dataflow_resources, netlist_features, stage_resources
from onnx2fpga.hw.top import make_core
from onnx2fpga.ir.layers import DenseLayer
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan.devices import (
    LUT_PRODUCT_MAX_BITS,
    const_multiplier_bits,
    logic_memory_cost,
    memory_mapping,
    multiplier_dsps,
)
from onnx2fpga.plan.graph import plan_graph
from tests.helpers.models import float_mlp

# ---------------------------------------------------------------------------------------------
# Multipliers: MULT18X18D per product, measured (registered a * b, one product per design)

@pytest.mark.parametrize("a, b, dsps", [
    (1, 8, 0), (2, 2, 1), (2, 8, 1), (3, 3, 1), (4, 4, 1), (6, 6, 1), (8, 8, 1),
    (11, 11, 1), (17, 17, 1), (18, 18, 1), (16, 17, 1),
    (19, 8, 1),          # 18 + 1 bits: the 1-bit piece stays in LUTs
    (24, 16, 2), (36, 16, 2), (24, 24, 4),
])
def test_ecp5_multiplier_dsps_measured(a, b, dsps):
    assert multiplier_dsps(a, b, "ecp5") == dsps
    assert multiplier_dsps(b, a, "ecp5") == dsps


@pytest.mark.parametrize("x_bits, const, dsps", [
    (8, 5, 1), (8, 100, 1), (16, 12345, 1), (24, -1000, 2), (8, 64, 0),
])
def test_ecp5_constant_multiplier_dsps_measured(x_bits, const, dsps):
    assert multiplier_dsps(x_bits, const_multiplier_bits(const), "ecp5") == dsps


@pytest.mark.parametrize("a, b", [(8, 8), (16, 16), (24, 24), (2, 2)])
def test_ice40_multipliers_without_dsp_option_are_luts(a, b):
    # Our iCE40 builds do not pass synth_ice40 -dsp (boards.build), so nothing is inferred.
    assert multiplier_dsps(a, b, "ice40") == 0


@pytest.mark.parametrize("a, b, dsps", [
    (8, 8, 1), (4, 4, 0), (6, 6, 1), (5, 6, 1), (3, 8, 1), (2, 8, 0), (2, 2, 0),
    (16, 16, 1), (17, 16, 1), (24, 16, 2), (24, 24, 4),
])
def test_ice40_dsp_option_multiplier_dsps_measured(a, b, dsps):
    # SB_MAC16 per signed product with synth_ice40 -dsp (products under 11 bits stay in LUTs).
    assert multiplier_dsps(a, b, "ice40", ice40_dsp=True) == dsps


@pytest.mark.parametrize("value, bits", [(0, 0), (1, 0), (-1, 0), (64, 0), (-64, 0),
                                         (3, 2), (5, 3), (-3, 3), (-1000, 11), (255, 8)])
def test_const_multiplier_bits(value, bits):
    assert const_multiplier_bits(value) == bits


# ---------------------------------------------------------------------------------------------
# Memories: the mapping yosys chose for one memory of width x depth with one synchronous read
# port (and one write port for a RAM), measured

@pytest.mark.parametrize("width, depth, rom, kind, cells", [
    (1, 1024, True, "logic", 0), (1, 2048, True, "block", 1),
    (3, 300, True, "logic", 0), (3, 512, True, "block", 1),
    (8, 128, True, "logic", 0), (8, 300, True, "block", 1), (8, 2048, True, "block", 4),
    (13, 128, True, "block", 1), (13, 2048, True, "block", 7),
    (18, 128, True, "block", 2), (18, 300, True, "block", 3), (36, 2048, True, "block", 18),
    (1, 64, False, "logic", 0), (1, 128, False, "block", 1),
    (3, 16, False, "logic", 0), (3, 32, False, "block", 1),
    (8, 2, False, "logic", 0), (8, 16, False, "block", 1), (8, 1024, False, "block", 2),
    (18, 16, False, "block", 2), (36, 16, False, "block", 3), (13, 2048, False, "block", 7),
    (36, 2048, False, "block", 18),
])
def test_ice40_memory_mapping_measured(width, depth, rom, kind, cells):
    mm = memory_mapping(width, depth, "ice40", rom=rom)
    assert (mm.kind, mm.cells) == (kind, cells)


@pytest.mark.parametrize("width, depth, rom, kind, cells", [
    (3, 512, True, "logic", 0), (3, 1024, True, "block", 1),
    (8, 128, True, "logic", 0), (8, 300, True, "block", 1), (8, 2048, True, "block", 1),
    (13, 128, True, "logic", 0), (13, 2048, True, "block", 2),
    (18, 128, True, "block", 1), (36, 32, True, "logic", 0), (36, 64, True, "block", 1),
    (36, 1024, True, "block", 2), (72, 64, True, "block", 2), (36, 2048, True, "block", 4),
    (1, 2, False, "logic", 0), (3, 2, False, "logic", 0), (8, 2, False, "distributed", 2),
    (1, 300, False, "distributed", 19), (1, 512, False, "block", 1),
    (8, 128, False, "distributed", 16), (8, 300, False, "block", 1),
    (13, 64, False, "distributed", 16), (13, 128, False, "block", 1),
    (18, 64, False, "distributed", 20), (36, 32, False, "distributed", 18),
    (36, 64, False, "block", 1), (36, 1024, False, "block", 2), (18, 2048, False, "block", 2),
    # Where yosys 0.70 switches between distributed and block RAM (synth_ecp5 of single RAMs).
    (24, 64, False, "distributed", 24), (25, 64, False, "block", 1),
    (27, 64, False, "block", 1), (24, 48, False, "distributed", 18),
    (10, 128, False, "distributed", 24), (12, 128, False, "block", 1),
    (56, 32, False, "distributed", 28),
])
def test_ecp5_memory_mapping_measured(width, depth, rom, kind, cells):
    mm = memory_mapping(width, depth, "ecp5", rom=rom)
    assert (mm.kind, mm.cells) == (kind, cells)


def test_async_read_memory_never_in_ice40_block_ram():
    # SB_RAM40_4K reads synchronously only; ECP5 keeps an asynchronous RAM in LUT RAM.
    assert memory_mapping(8, 256, "ice40", rom=False, sync_read=False).kind == "logic"
    assert memory_mapping(8, 16, "ecp5", rom=False, sync_read=False).kind == "distributed"


def test_bad_parameters():
    with pytest.raises(ValueError, match=r"^family must be one of \('ice40', 'ecp5'\), "
                                         r"not 'gowin'$"):
        memory_mapping(8, 16, "gowin", rom=True)
    with pytest.raises(TypeError, match=r"^width must be a positive integer, not 0$"):
        memory_mapping(0, 16, "ecp5", rom=True)
    with pytest.raises(TypeError, match=r"^depth must be a positive integer, not 2\.5$"):
        memory_mapping(8, 2.5, "ecp5", rom=True)
    with pytest.raises(TypeError, match=r"^a_bits must be a non-negative integer, not -1$"):
        multiplier_dsps(-1, 8, "ecp5")
    with pytest.raises(TypeError, match=r"^value must be an integer, not 1\.5$"):
        const_multiplier_bits(1.5)
    with pytest.raises(TypeError, match=r"^stage must be a Stage, not 3$"):
        stage_resources(3, "ecp5")


# ---------------------------------------------------------------------------------------------
# Reading a core's netlist

def _dense(in_features, out_features, simd, pe, in_bits, w_bits, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.integers(-(1 << (w_bits - 1)), 1 << (w_bits - 1),
                     size=(out_features, in_features))
    w[0, 0] = -(1 << (w_bits - 1))                # the full weight range is used
    w[0, 1] = (1 << (w_bits - 1)) - 1
    bias = rng.integers(-100, 100, size=out_features)
    return DenseLayer("fc", IntType(in_bits, True), 0, w, IntType(w_bits, True), bias, [],
                      simd=simd, pe=pe)


@pytest.mark.parametrize("simd, pe, in_bits, w_bits", [
    (4, 2, 8, 8), (8, 1, 4, 4), (2, 2, 8, 16), (1, 4, 3, 20),
])
def test_matvec_multipliers_and_memories(simd, pe, in_bits, w_bits):
    layer = _dense(16, 8, simd, pe, in_bits, w_bits)
    f = netlist_features(MatVecCore(layer), "ecp5")
    # One product per (lane, PE), of the input and weight widths; with an operand of at most
    # LUT_PRODUCT_MAX_BITS bits the core adds shifted partial products instead (no `*`, so
    # no MULT18X18D: yosys 0.70 maps none on the 4-bit MatVecs of mlp_4bit in
    # benchmarks/resources.py).
    lut = min(in_bits, w_bits) <= LUT_PRODUCT_MAX_BITS
    assert sorted(m[:2] for m in f["multipliers"]) == \
        ([] if lut else [(in_bits, w_bits)] * (simd * pe))
    assert f["dsp"] == (0 if lut else simd * pe * multiplier_dsps(in_bits, w_bits, "ecp5"))
    folds, groups = 16 // simd, 8 // pe
    mems = {(w, d, rom) for w, d, rom, _ in f["memories"]}
    assert (simd * in_bits, 2 * folds, False) in mems           # input double buffer
    assert (simd * pe * w_bits, groups * folds, True) in mems   # weights
    assert f["bram"] == sum(m.cells for *_, m in f["memories"] if m.kind == "block")


def test_requant_products_follow_the_platform():
    # The requantization multiplies by a per-channel table: 16-bit pieces for DSPs on ECP5;
    # on iCE40 radix-4 digits summed by carry-save adders, no `*` at all.
    d = api.compile(float_mlp((16, 8, 4), softmax=False), calibration=np.random.default_rng(
        0).standard_normal((32, 16)).astype(np.float32))
    stage = next(s for s in plan_graph(d.design.dataflow).stages if s.kind == "requant")
    from onnx2fpga.hw.top import make_core
    ecp5 = netlist_features(make_core(stage), "ecp5")["multipliers"]
    ice40 = netlist_features(make_core(stage), "ice40")["multipliers"]
    assert ecp5 and ice40 == []
    assert all(a <= 16 and b <= 16 for a, b, _ in ecp5)


def test_dataflow_resources_adds_up(tmp_path):
    d = api.compile(float_mlp((16, 8, 4), softmax=False), tmp_path / "d",
                    calibration=np.random.default_rng(0).standard_normal(
                        (32, 16)).astype(np.float32))
    df = d.design.dataflow
    for fam in ("ice40", "ecp5"):
        r = dataflow_resources(df, fam, wrapper=True)
        assert [e["name"] for e in r["layers"]] == [ly.name for ly in df.layers]
        for k in ("lut", "ff", "dsp", "bram"):
            assert r["total"][k] == r["edges"][k] + sum(e[k] for e in r["layers"])
            assert r["board"][k] == r["total"][k] + r["wrapper"][k]
        # The manifest carries the same figures.
        m = d.manifest
        assert m["resources"][fam]["total"] == r["total"]
        assert [ly["resources"][fam] for ly in m["layers"]] == \
            [{k: v for k, v in e.items() if k != "name"} for e in r["layers"]]
        # A layer's products and requantization are parts of it.
        for e in r["layers"]:
            for k in ("lut", "ff", "dsp", "bram"):
                assert e["products"][k] + e["requant"][k] <= e[k]
            assert e["products"]["dsp"] + e["requant"]["dsp"] == e["dsp"]


def test_stage_estimates_are_kept_by_what_the_core_is_built_from():
    """Board folding estimates a design for every rate it tries; a stage whose core is built
    from the same parameters (another name, another plan) is not elaborated again, and its
    figures are those of a fresh elaboration. Different weights are another core."""
    import dataclasses

    from onnx2fpga.hw import resources
    from onnx2fpga.hw.top import make_core

    d = api.compile(float_mlp((16, 8, 4), softmax=False), calibration=np.random.default_rng(
        0).standard_normal((32, 16)).astype(np.float32), stop_after="fold")
    stages = plan_graph(d.design.dataflow).stages
    for stage in stages:
        fresh = netlist_features(make_core(stage, rom_stand_in=True), "ecp5",
                                 stand_ins=getattr(make_core(stage, rom_stand_in=True),
                                                   "weight_rom_shapes",
                                                   lambda p: None)(resources._platform("ecp5")))
        got = resources.stage_resources(dataclasses.replace(stage, name="other"), "ecp5")
        assert (got["dsp"], got["bram"], got["ff"]) == (fresh["dsp"], fresh["bram"],
                                                        fresh["ff"])
    matvec = next(s for s in stages if s.kind == "matvec")
    layer = matvec.params["layer"]
    assert resources.stage_key(matvec) == resources.stage_key(
        dataclasses.replace(matvec, name="x", params=dict(matvec.params)))
    other = dataclasses.replace(layer, weight=layer.weight.copy())
    other.weight[0, 0] ^= 1
    assert resources.stage_key(matvec) != resources.stage_key(
        dataclasses.replace(matvec, params={**matvec.params, "layer": other}))


@pytest.mark.parametrize("kind", ["residual", "depthwise", "avgpool", "concat"])
def test_estimate_netlist_reads_as_amaranths_netlist(kind):
    """The estimates' netlist (built without the Verilog back end's checks) reads as
    Amaranth's ``build_netlist``, for both families; a core whose kind is not in
    ``PLATFORM_STAGES`` reads the same for one family whichever platform elaborated it, so
    the manifest's estimate for the other family is read from the folding's netlists:
    only the platform's cores are elaborated again, and the figures are those of a fresh
    estimate."""
    from amaranth.hdl import Fragment
    from amaranth.hdl._ir import build_netlist

    from onnx2fpga.hw import resources
    from onnx2fpga.plan.devices import FAMILIES
    from tests.helpers.models import CNN_KINDS, float_cnn

    cal = np.random.default_rng(0).standard_normal((16, *CNN_KINDS[kind])).astype(np.float32)
    df = api.compile(float_cnn(kind), calibration=cal, stop_after="fold").design.dataflow
    stages = plan_graph(df).stages
    assert {s.kind for s in stages} - resources.PLATFORM_STAGES

    def core(stage):
        c = make_core(stage, rom_stand_in=True)
        if c is not None:
            c._MustUse__used = True
        return c

    for stage in stages:
        if core(stage) is None:
            continue
        for fam in FAMILIES:
            platform = resources._platform(fam)
            stand_ins = getattr(core(stage), "weight_rom_shapes", lambda p: None)(platform)
            want = resources.read_netlist(
                build_netlist(Fragment.get(core(stage), platform), name="top"), fam,
                stand_ins=stand_ins)
            assert resources.read_netlist(resources.estimate_netlist(core(stage), fam), fam,
                                          stand_ins=stand_ins) == want
            if stage.kind not in resources.PLATFORM_STAGES:
                other = next(f for f in FAMILIES if f != fam)
                assert resources.read_netlist(resources.estimate_netlist(core(stage), other),
                                              fam, stand_ins=stand_ins) == want

    built = []

    def counting(elaboratable, family):
        built.append(family)
        return estimate_netlist(elaboratable, family)

    estimate_netlist = resources.estimate_netlist
    resources._STAGE_CACHE.clear()
    fresh = dataflow_resources(df, "ice40", wrapper=True, memories=True)
    resources._STAGE_CACHE.clear()
    try:
        resources.estimate_netlist = counting
        dataflow_resources(df, "ecp5", wrapper=True, memories=True)
        del built[:]
        assert dataflow_resources(df, "ice40", wrapper=True, memories=True) == fresh
    finally:
        resources.estimate_netlist = estimate_netlist
    assert len(built) == len({resources.stage_key(s) for s in stages
                              if s.kind in resources.PLATFORM_STAGES})


# ---------------------------------------------------------------------------------------------
# Against real builds

def _small_design(directory=None):
    """Small and quick to build (4-bit weights and activations, 8-bit requantization
    multipliers), yet with block RAM on iCE40 and DSPs on ECP5."""
    return api.compile(float_mlp((16, 8, 4), softmax=False), directory,
                       calibration=np.random.default_rng(0).standard_normal(
                           (32, 16)).astype(np.float32),
                       weight_bits=4, activation_bits=4, multiplier_bits=8)


def _have(*tools):
    from onnx2fpga.boards.build import tool_environment
    env = tool_environment()
    return all(shutil.which(env[t]) for t in tools)


@pytest.mark.synth
@pytest.mark.parametrize("board, family, tools", [
    ("icebreaker", "ice40", ("YOSYS", "NEXTPNR_ICE40", "ICEPACK")),
    ("ulx3s-85f", "ecp5", ("YOSYS", "NEXTPNR_ECP5", "ECPPACK")),
])
def test_estimate_matches_build(board, family, tools, tmp_path):
    if not _have(*tools):
        pytest.skip(f"needs {', '.join(tools)}")
    d = _small_design(os.fspath(tmp_path / "d"))
    report = d.build(board, progress=False)
    est = d.manifest["resources"][family]["board"]
    used = {k: report["resources"][k]["used"] for k in ("lut", "ff", "dsp", "bram")}
    assert est["dsp"] == used["dsp"]
    assert est["bram"] == used["bram"]
    assert abs(est["lut"] - used["lut"]) <= 0.2 * used["lut"], (est, used)


def test_logic_memories_leave_block_ram():
    """A memory named in ``logic_memories`` is costed as soft logic: its block RAMs are gone
    from the estimate, its LUTs and flip-flops added; the names are those the build sets
    ``logic_block`` on."""
    from onnx2fpga.boards.build import logic_memory_script
    from onnx2fpga.plan.devices import is_shift_register_buffer, logic_cost

    d = _small_design()
    df = d.design.dataflow
    before = dataflow_resources(df, "ice40", wrapper=True, memories=True)
    blocks = before["block_memories"]
    assert blocks and sum(b[1] for b in blocks) == before["board"]["bram"]
    df.logic_memories = [b[0] for b in blocks]
    after = dataflow_resources(df, "ice40", wrapper=True, memories=True)
    assert after["board"]["bram"] == 0 and after["block_memories"] == []
    added = [logic_cost(b[0], *b[2:]) for b in blocks]
    # The block RAMs' own read registers are gone, and so are the write registers (enable,
    # address, data) of a MatVec input buffer, which shifts its writes in at once.
    gone = sum(b[2] + (1 + (b[3] - 1).bit_length() + b[2] if is_shift_register_buffer(b[0])
                       else 0) for b in blocks)
    assert after["board"]["ff"] - before["board"]["ff"] >= sum(c["ff"] for c in added) - gone
    assert after["board"]["lut"] > before["board"]["lut"]
    script = logic_memory_script(df.logic_memories)
    for name in df.logic_memories:
        stage, _, path = name.partition("/")
        if stage != "wrapper":
            # A MatVec's input buffer in soft logic is shift registers, no memory.
            assert (f"*.accelerator.{stage}/m:{path}" in script) != (path == "x_mem")
    with pytest.raises(ValueError, match=r"^Logic memory must be 'stage/memory', not 'x'$"):
        logic_memory_script(["x"])


@pytest.mark.parametrize("width,depth,rom,luts,ffs", [
    (4, 2048, True, 1079, 4), (2, 4096, True, 1076, 2), (8, 256, True, 314, 8),
    (2, 128, False, 376, 258), (8, 15, False, 115, 128), (16, 64, False, 952, 1040),
])
def test_logic_memory_cost_measured(width, depth, rom, luts, ffs):
    # yosys 0.70 synth_ice40 of one memory with logic_block set (random ROM contents).
    c = logic_memory_cost(width, depth, rom)
    assert abs(c["lut"] - luts) <= 0.15 * luts, c
    assert c["ff"] == ffs


@pytest.mark.synth
def test_logic_memories_build_without_block_ram(tmp_path):
    """The build puts every memory named in ``logic_memories`` into soft logic: the block
    RAMs nextpnr places are exactly those the estimate keeps (none), and the LUTs stay
    within 20 % of the estimate."""
    tools = ("YOSYS", "NEXTPNR_ICE40", "ICEPACK")
    if not _have(*tools):
        pytest.skip(f"needs {', '.join(tools)}")
    d = _small_design(os.fspath(tmp_path / "d"))
    df = d.design.dataflow
    df.logic_memories = [b[0] for b in dataflow_resources(
        df, "ice40", wrapper=True, memories=True)["block_memories"]]
    assert df.logic_memories
    est = dataflow_resources(df, "ice40", wrapper=True)["board"]
    report = d.build("icebreaker", progress=False)
    used = {k: report["resources"][k]["used"] for k in ("lut", "bram")}
    assert used["bram"] == est["bram"] == 0
    assert abs(est["lut"] - used["lut"]) <= 0.2 * used["lut"], (est, used)


@pytest.mark.synth
def test_banked_weight_rom_builds_in_soft_logic(tmp_path):
    """A weight ROM named in ``logic_memories`` is read from banks (MatVecCore's
    ``w_logic``): the build puts every bank into soft logic (the block RAMs nextpnr places
    are those of the other memories, as estimated), and the LUTs stay within 20 % of the
    estimate."""
    tools = ("YOSYS", "NEXTPNR_ICE40", "ICEPACK")
    if not _have(*tools):
        pytest.skip(f"needs {', '.join(tools)}")
    # The first layer's 1024-word weight ROM: 16 banks of 64 words.
    d = api.compile(float_mlp((16, 64, 4), softmax=False), os.fspath(tmp_path / "d"),
                    calibration=np.random.default_rng(0).standard_normal(
                        (32, 16)).astype(np.float32),
                    weight_bits=4, activation_bits=4, multiplier_bits=8,
                    folding={"dense0": {"simd": 1, "pe": 1}})
    df = d.design.dataflow
    before = dataflow_resources(df, "ice40", wrapper=True, memories=True)
    w_mem = [b for b in before["block_memories"] if b[0] == "matvec_0/w_mem"]
    assert w_mem and w_mem[0][3] == 1024
    df.logic_memories = ["matvec_0/w_mem"]
    stage = next(s for s in plan_graph(df).stages if s.name == "matvec_0")
    names = netlist_features(make_core(stage), "ice40", logic={"w_mem"})["memory_names"]
    assert [n for n in names if n.startswith("w_mem")] == [f"w_mem_bank{n}" for n in range(16)]
    est = dataflow_resources(df, "ice40", wrapper=True)["board"]
    assert est["bram"] == before["board"]["bram"] - w_mem[0][1]
    report = d.build("icebreaker", progress=False)
    used = {k: report["resources"][k]["used"] for k in ("lut", "bram")}
    assert used["bram"] == est["bram"]
    assert abs(est["lut"] - used["lut"]) <= 0.2 * used["lut"], (est, used)
