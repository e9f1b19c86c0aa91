"""The layer-sequential engine (plan/engine.py, hw/engine.py): its serial requantizer
against the golden model value by value, and whole networks in Verilator against the golden
model, under stalls, with the weights loaded from a flash model, at the cycles its model
gives."""

import dataclasses

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.sim import Simulator

import onnx2fpga
from onnx2fpga.frontend.epilogue import float32_params
from onnx2fpga.hw.engine import LayerEngine, SerialRequant
from onnx2fpga.ir import IntType, RequantStage
from onnx2fpga.plan.engine import (
    EngineError,
    engine_cycles,
    engine_image,
    engine_program,
    requant_cycles,
)
from onnx2fpga.sim import golden
from onnx2fpga.sim.rtl import simulate_rtl
from tests.helpers.models import ort_qdq_cnn, ort_qdq_mlp
from tests.helpers.torch_models import ds_cnn_qdq

I16 = IntType(16, True)


def _run_requant(cases):
    """``(q, cycles from start to done)`` of each ``(acc, mult, offset, shift, float32,
    hold)``, one after another."""
    dut = SerialRequant()
    out = []

    async def bench(ctx):
        for acc, mult, off, shift, f32, hold in cases:
            for sig, v in ((dut.acc, acc), (dut.mult, mult), (dut.offset, off),
                           (dut.shift, shift), (dut.float32, f32), (dut.cycles, hold),
                           (dut.start, 1)):
                ctx.set(sig, v)
            await ctx.tick()
            ctx.set(dut.start, 0)
            n = 1
            while not ctx.get(dut.done):
                await ctx.tick()
                n += 1
            out.append((ctx.get(dut.q), n))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return out


def _cases(rng, f32: bool, n: int):
    cases = []
    for k in range(n):
        if f32:
            scale = np.float32(rng.uniform(0.5, 1) * 2.0 ** -int(rng.integers(-2, 22)))
            if k % 4 == 0:                       # exact ties: a power of two, an odd acc
                scale = np.float32(2.0 ** -int(rng.integers(1, 6)))
            m, shift = float32_params(np.array([scale], np.float32))
            mult, off = int(m[0]), 0
        else:
            shift = int(rng.integers(0, 49))
            mult = int(rng.integers(-(1 << 30), 1 << 30)) >> int(rng.integers(0, 28))
            off = int(rng.integers(-(1 << 46), 1 << 46)) >> int(rng.integers(0, 46))
        acc = int(rng.integers(-(1 << 30), 1 << 30)) >> int(rng.integers(0, 31))
        cases.append((acc, mult, off, shift, f32))
    return cases


@pytest.mark.parametrize("f32", [False, True])
def test_serial_requant_equals_golden_at_its_cycles(f32):
    """Random accumulators from 0 to 30 bits, multipliers, offsets and shifts (ties among
    them), each done exactly at the cycles requant_cycles gives for its accumulator's
    bits: they bound the work (a hold of fewer would show as more cycles)."""
    rng = np.random.default_rng(5 + f32)
    cases = _cases(rng, f32, 120)
    holds = [requant_cycles(abs(a).bit_length(), m, s, f) for a, m, _, s, f in cases]
    got = _run_requant([(*c, h) for c, h in zip(cases, holds)])
    for (acc, mult, off, shift, _), (q, n), hold in zip(cases, got, holds):
        st = RequantStage([mult], [off], shift, 0, I16.lo, I16.hi, I16,
                          rounding="float32" if f32 else "half_even")
        want = int(golden.requant(np.array([acc]), st)[0])
        assert max(I16.lo, min(I16.hi, q)) == want, (acc, mult, off, shift)
        assert n == hold


def _engine_run(df, tmp_path, x, *, weights="spram", stall=0.3):
    prog = engine_program(df)
    image = engine_image(prog) if weights == "spram" else None
    top = LayerEngine(prog, weights=weights, flash_image=image, wake_cycles=8)
    path = tmp_path / f"engine_{weights}.v"
    path.write_text(verilog.convert(top, name="top", emit_src=False))
    inp = dataclasses.replace(df.input, lanes=1, order=None)
    out = dataclasses.replace(df.output, lanes=1, order=None)
    fig = engine_cycles(prog)
    res = simulate_rtl(path, inp, out, x, stall_prob_in=stall, stall_prob_out=stall,
                       max_cycles_per_inference=2 * fig["cycles_per_inference"] + 100_000,
                       progress=False, timing_runs=2)
    return np.asarray(res.outputs), res, fig


def _inputs(df, n, seed):
    t = df.input.type
    return np.random.default_rng(seed).integers(
        t.lo, t.hi + 1, size=(n, int(np.prod(df.input.shape[1:]))))


@pytest.mark.rtl
@pytest.mark.parametrize("weights", ["spram", "rom"])
def test_engine_ds_cnn_equals_golden(tmp_path, weights):
    """A DS-CNN as the MLPerf Tiny file is written (input reshaped, a 10x4 stride-2 conv
    with TensorFlow's SAME padding, depthwise and pointwise convs, the global average pool,
    Gemm), quantized by onnxruntime: its float32 requantizations, under stalls, the weights
    loaded from the flash model first; without stalls at exactly the model's cycles."""
    _, qp, _ = ds_cnn_qdq(tmp_path, channels=8)
    df = onnx2fpga.compile(qp, stop_after="lower").design.dataflow
    x = _inputs(df, 3, 1)
    got, res, fig = _engine_run(df, tmp_path, x, weights=weights)
    np.testing.assert_array_equal(got, golden.run_dataflow(df, x))
    assert res.cycles_per_inference == fig["cycles_per_inference"]
    assert res.latency_cycles == fig["latency_cycles"]
    kinds = [(ly.depthwise, ly.unit, ly.kh) for ly in engine_program(df).layers]
    assert kinds == [(False, False, 10), (True, False, 3), (False, False, 1), (True, True, 25),
                     (False, False, 1)]


@pytest.mark.rtl
@pytest.mark.parametrize("how", ["mlp-exact-uint8", "depthwise-uint8"])
def test_engine_other_networks_equal_golden(tmp_path, how):
    """The exact requantization (integer multipliers, offsets, half to even) of an MLP with
    uint8 activations; a CNN of convs, a depthwise conv with padding, a max pool and a
    dense layer with uint8 activations."""
    if how == "mlp-exact-uint8":
        path, _ = ort_qdq_mlp(tmp_path, sizes=(20, 16, 7), activation="uint8",
                              per_channel=True)
        df = onnx2fpga.compile(path, stop_after="lower", requant="exact").design.dataflow
        assert {st.rounding for ly in df.layers for st in ly.requant} == {"half_even"}
    else:
        path, _ = ort_qdq_cnn(tmp_path, kind="depthwise", activation="uint8")
        df = onnx2fpga.compile(path, stop_after="lower").design.dataflow
        assert any(getattr(ly, "group", 1) > 1 for ly in df.layers)
        assert any(getattr(ly, "op", "") == "max" for ly in df.layers)
    x = _inputs(df, 4, 2)
    got, res, fig = _engine_run(df, tmp_path, x, stall=0.5)
    np.testing.assert_array_equal(got, golden.run_dataflow(df, x))
    assert res.cycles_per_inference == fig["cycles_per_inference"]


def test_engine_refuses_what_it_cannot_run(tmp_path):
    path, _ = ort_qdq_cnn(tmp_path, kind="residual")
    df = onnx2fpga.compile(path, stop_after="lower").design.dataflow
    with pytest.raises(EngineError, match=r"^Layer '\w+': the engine runs a chain of layers, "
                                          r"each reading the one before$"):
        engine_program(df)
    path, _ = ort_qdq_cnn(tmp_path, kind="avgpool")
    df = onnx2fpga.compile(path, stop_after="lower").design.dataflow
    with pytest.raises(EngineError, match=r"^Layer 'pool\d+': multipliers per pixel; the "
                                          r"engine takes them per channel$"):
        engine_program(df)
    path, _ = ort_qdq_mlp(tmp_path, sizes=(200, 180, 10))
    df = onnx2fpga.compile(path, stop_after="lower").design.dataflow
    # Per output channel 7 header words and the weights, two a word.
    words = 180 * (7 + 200 // 2) + 10 * (7 + 180 // 2)
    with pytest.raises(EngineError, match=rf"^The engine's weight records take {words:,} words "
                                          r"of 16 bits; it holds 16,384 \(one SPRAM\)$"):
        engine_program(df)
