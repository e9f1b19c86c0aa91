"""Shared check of the hard-product tests (test_hw_ecp5_dsp.py, test_hw_ice40_dsp.py): the
Verilog emitted for a device, with a behavioural model of its DSP, against the golden model
and against the platform-free Verilog's cycle figures."""

import numpy as np

from onnx2fpga.hw.emit import emit_verilog
from onnx2fpga.sim.golden import run_dataflow
from onnx2fpga.sim.rtl import simulate_rtl


def check_against_plain(tmp_path, df, device_v: str, model_v: str,
                        stall_in: float = 0.4) -> None:
    """Simulate ``device_v`` (with ``model_v`` appended) and the platform-free Verilog of
    ``df`` in Verilator under random stalls (``stall_in`` on the input, 0.6 on the output)
    on 24 inputs (the first all 0, the second all 255): the device's outputs equal the
    golden model's, its cycles per inference and latency the platform-free design's."""
    (tmp_path / "device.v").write_text(device_v + "\n" + model_v)
    (tmp_path / "plain.v").write_text(emit_verilog(df))
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=(24, df.input.size))
    x[0] = 0
    x[1] = 255
    results = {}
    for name in ("device", "plain"):
        results[name] = simulate_rtl(tmp_path / f"{name}.v", df.input, df.output, x,
                                     build_dir=tmp_path / f"build-{name}",
                                     stall_prob_in=stall_in,
                                     stall_prob_out=0.6, seed=3, progress=False)
    np.testing.assert_array_equal(results["device"].outputs, run_dataflow(df, x))
    assert results["device"].cycles_per_inference == results["plain"].cycles_per_inference
    assert results["device"].latency_cycles == results["plain"].latency_cycles


def lut_dense(rng, n_in: int, n_out: int, *, simd: int, pe: int, zero_point: int,
              bias: int):
    """One uint8 x int8 dense layer (weights and biases in ``[-bias, bias)`` drawn from
    ``rng``) with LUT products, its accumulators the output, as a folded Dataflow."""
    from onnx2fpga.ir.dataflow import Dataflow, Port
    from onnx2fpga.ir.layers import DenseLayer
    from onnx2fpga.ir.types import IntType
    u8, i8 = IntType(8, False), IntType(8, True)
    fc = DenseLayer("fc", u8, zero_point, rng.integers(-128, 128, size=(n_out, n_in)), i8,
                    rng.integers(-bias, bias, size=n_out), [], simd=simd, pe=pe,
                    multipliers="lut")
    return Dataflow([fc], Port("x", (n_in,), u8, 1.0, zero_point, lanes=simd),
                    Port("y", (n_out,), fc.acc_type, 1.0, 0, lanes=pe), fifo_depths=[2])


def ds_block(dw_overrides: dict, pw_overrides: dict):
    """DS-CNN's block as a folded Dataflow: depthwise 3x3 (uint8 input, int8 weights, 6
    channels of 5x5, padding 1) then pointwise 1x1 (int8), each requantized to int8, with
    the folding overrides given for ``dw`` and ``pw``."""
    from onnx2fpga.ir.dataflow import Dataflow, Port
    from onnx2fpga.ir.layers import ConvLayer
    from onnx2fpga.ir.types import IntType
    from onnx2fpga.plan.fold import fold
    from onnx2fpga.sim import golden
    from tests.plan.test_graph import fit_stage
    rng = np.random.default_rng(4)
    c, h, w = 6, 5, 5
    u8, i8 = IntType(8, False), IntType(8, True)
    probe = rng.integers(0, 256, size=(16, c, h, w))
    dw = ConvLayer("dw", u8, 131, (c, h, w), rng.integers(-128, 128, size=(c, 1, 3, 3)), i8,
                   rng.integers(-99, 99, c), [], pads=(1, 1, 1, 1), group=c, inputs=["x"],
                   output="a")
    dw.requant.append(fit_stage(rng, golden.run_layer(dw, probe), i8, relu=True))
    pw = ConvLayer("pw", i8, 0, (c, h, w), rng.integers(-128, 128, size=(c, c, 1, 1)), i8,
                   rng.integers(-99, 99, c), [], inputs=["a"], output="y")
    pw.requant.append(fit_stage(rng, golden.run_layer(pw, golden.run_layer(dw, probe)), i8))
    return fold(Dataflow([dw, pw], Port("x", (1, c, h, w), u8, 0.1, 131),
                         Port("y", (1, c, h, w), i8, 0.1, 0)),
                overrides={"dw": dw_overrides, "pw": pw_overrides})
