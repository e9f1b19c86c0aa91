"""Weights in SPRAM inside the accelerator: the emitted Verilog, with a model of the SPI flash
holding the weight image, loads the weights at start-up (the input not ready until then) and
then runs bit-exactly against the golden model under random stalls, at the cycles per
inference of the same design with its weights in ROMs."""

import numpy as np
import pytest

from onnx2fpga.hw.emit import emit_verilog
from onnx2fpga.hw.top import Accelerator, weight_image_of
from onnx2fpga.ir.dataflow import Dataflow, Port
from onnx2fpga.ir.layers import DenseLayer
from onnx2fpga.ir.stages import RequantStage
from onnx2fpga.ir.types import IntType
from onnx2fpga.plan.spram import IMAGE_MAGIC
from onnx2fpga.sim.golden import run_dataflow
from onnx2fpga.sim.rtl import simulate_rtl
from onnx2fpga.sim.verilator_build import RtlSimulationError


def spram_dataflow(spram=()):
    """int8 x int8 (simd 2, pe 1: 16 bits a word, one SPRAM), int8 x int3 (simd 3, pe 2:
    18 bits, two SPRAMs), a +-1 layer (sign arithmetic, simd 4: 4 bits) last."""
    rng = np.random.default_rng(0)
    u8, i8 = IntType(8, False), IntType(8, True)
    fc1 = DenseLayer("fc1", u8, 3, rng.integers(-128, 128, size=(6, 16)), i8,
                     rng.integers(-999, 999, size=6),
                     [RequantStage(rng.integers(40, 120, size=6), [-900], 15, 0, -128, 127,
                                   i8)], simd=2, pe=1)
    fc2 = DenseLayer("fc2", i8, 0, rng.integers(-4, 4, size=(4, 6)), IntType(3, True),
                     rng.integers(-9, 9, size=4),
                     [RequantStage(rng.integers(40, 120, size=4), [0], 8, 0, -128, 127,
                                   i8)], simd=3, pe=2)
    fc3 = DenseLayer("fc3", i8, 0, rng.choice([-1, 1], size=(3, 4)), IntType(2, True),
                     rng.integers(-99, 99, size=3), [], simd=4, pe=1)
    df = Dataflow([fc1, fc2, fc3], Port("x", (16,), u8, 1.0, 3, lanes=2),
                  Port("y", (3,), fc3.acc_type, 1.0, 0, lanes=1), fifo_depths=[2, 2, 2])
    df.spram_memories = list(spram)
    return df


SPRAM = ["matvec_0/w_mem", "matvec_1/w_mem", "matvec_2/w_mem"]


def test_weights_loaded_from_flash_run_bit_exactly(tmp_path):
    df = spram_dataflow(SPRAM)
    acc = Accelerator(df)
    acc._MustUse__used = True
    assert [(s.first, s.count, s.width, s.depth) for s in acc.spram_slots] == \
        [(0, 1, 16, 48), (1, 2, 18, 4), (3, 1, 4, 3)]
    image = weight_image_of(df)
    assert image == acc.weight_image
    assert image[:4] == IMAGE_MAGIC and len(image) == 4 + 2 * (48 + 4 + 4 + 3)
    assert {"flash_sck", "flash_cs_n", "flash_copi", "flash_cipo"} <= set(acc.signature.members)
    (tmp_path / "spram.v").write_text(emit_verilog(df, flash_image=image))
    (tmp_path / "plain.v").write_text(emit_verilog(spram_dataflow()))
    # The weights come from the flash: one weight byte changed changes the results.
    wrong = bytearray(image)
    wrong[4] ^= 0x5A
    (tmp_path / "wrong.v").write_text(emit_verilog(df, flash_image=bytes(wrong)))
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=(20, 16))
    results = {}
    for name in ("spram", "plain", "wrong"):
        results[name] = simulate_rtl(tmp_path / f"{name}.v", df.input, df.output, x,
                                     build_dir=tmp_path / f"build-{name}", stall_prob_in=0.3,
                                     stall_prob_out=0.5, seed=3, progress=False)
    np.testing.assert_array_equal(results["spram"].outputs, run_dataflow(df, x))
    assert results["spram"].cycles_per_inference == results["plain"].cycles_per_inference
    assert not np.array_equal(results["wrong"].outputs, run_dataflow(df, x))


def test_a_wrong_image_is_not_computed_with(tmp_path):
    """A flash without the image (erased): the input is never taken."""
    df = spram_dataflow(SPRAM[:1])
    image = weight_image_of(df)
    (tmp_path / "erased.v").write_text(emit_verilog(df, flash_image=b"\xff" * len(image)))
    x = np.zeros((1, 16), dtype=np.int64)
    with pytest.raises(RtlSimulationError, match="accepted 0 of 8 input beats"):
        simulate_rtl(tmp_path / "erased.v", df.input, df.output, x, build_dir=tmp_path / "b",
                     progress=False, max_cycles_per_inference=5_000, jobs=1)


def test_a_layer_two_sprams_deep(tmp_path):
    """1,040 x 16 int8 weights one a cycle: 16,640 words, two SPRAMs deep (the second holds
    256); the last words, in the second SPRAM, are read as the first."""
    rng = np.random.default_rng(5)
    u8, i8 = IntType(8, False), IntType(8, True)
    fc = DenseLayer("fc", u8, 0, rng.integers(-128, 128, size=(16, 1040)), i8,
                    rng.integers(-999, 999, size=16), [], simd=1, pe=1)
    df = Dataflow([fc], Port("x", (1040,), u8, 1.0, 0, lanes=1),
                  Port("y", (16,), fc.acc_type, 1.0, 0, lanes=1), fifo_depths=[2])
    df.spram_memories = ["matvec_0/w_mem"]
    image = weight_image_of(df)
    assert len(image) == 4 + 2 * 16 * 1040
    (tmp_path / "deep.v").write_text(emit_verilog(df, flash_image=image))
    x = rng.integers(0, 256, size=(3, 1040))
    res = simulate_rtl(tmp_path / "deep.v", df.input, df.output, x, build_dir=tmp_path / "b",
                       stall_prob_in=0.2, stall_prob_out=0.3, progress=False, jobs=1,
                       timing_runs=0, max_cycles_per_inference=700_000)
    np.testing.assert_array_equal(res.outputs, run_dataflow(df, x))


def test_verilog_is_deterministic():
    """The same design gives the same text, with the flash ports or with the flash model."""
    df = spram_dataflow(SPRAM)
    image = weight_image_of(df)
    assert emit_verilog(df) == emit_verilog(spram_dataflow(SPRAM))
    with_model = emit_verilog(df, flash_image=image)
    assert with_model == emit_verilog(spram_dataflow(SPRAM), flash_image=image)
    assert "flash_cipo" in emit_verilog(df) and "flash_cipo" not in with_model
