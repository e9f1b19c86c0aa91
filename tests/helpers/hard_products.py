"""Shared check of the hard-product tests (test_hw_ecp5_dsp.py, test_hw_ice40_dsp.py): the
Verilog emitted for a device, with a behavioural model of its DSP, against the golden model
and against the platform-free Verilog's cycle figures."""

import numpy as np

from onnx2fpga.hw.emit import emit_verilog
from onnx2fpga.sim.golden import run_dataflow
from onnx2fpga.sim.rtl import simulate_rtl


def check_against_plain(tmp_path, df, device_v: str, model_v: str) -> None:
    """Simulate ``device_v`` (with ``model_v`` appended) and the platform-free Verilog of
    ``df`` in Verilator under random stalls on 24 inputs (the first all 0, the second all
    255): the device's outputs equal the golden model's, its cycles per inference and latency
    the platform-free design's."""
    (tmp_path / "device.v").write_text(device_v + "\n" + model_v)
    (tmp_path / "plain.v").write_text(emit_verilog(df))
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=(24, df.input.size))
    x[0] = 0
    x[1] = 255
    results = {}
    for name in ("device", "plain"):
        results[name] = simulate_rtl(tmp_path / f"{name}.v", df.input, df.output, x,
                                     build_dir=tmp_path / f"build-{name}", stall_prob_in=0.4,
                                     stall_prob_out=0.6, seed=3, progress=False)
    np.testing.assert_array_equal(results["device"].outputs, run_dataflow(df, x))
    assert results["device"].cycles_per_inference == results["plain"].cycles_per_inference
    assert results["device"].latency_cycles == results["plain"].latency_cycles
