"""End to end: ONNX model -> design -> Verilator (random stalls) == golden model -> bitstream.

Two ways in, as a user has them: a model quantized by onnxruntime (QDQ) and a float model
with our own calibration.
"""

import json

import numpy as np
import pytest

import onnx2fpga
from tests.helpers.models import float_mlp, ort_qdq_mlp, save


@pytest.fixture(scope="module")
def designs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    out = {}
    qdq, _ = ort_qdq_mlp(tmp, kind="matmul", opset=21, activation="uint8", per_channel=True,
                         sizes=(16, 12, 6), softmax=True)
    out["qdq"] = onnx2fpga.compile(qdq, tmp / "qdq")
    qdq13, _ = ort_qdq_mlp(tmp, kind="gemm", opset=13, activation="int8", sizes=(16, 8, 4))
    out["qdq13"] = onnx2fpga.compile(qdq13, tmp / "qdq13")
    fm = save(float_mlp((20, 10, 5), seed=3), tmp / "float.onnx")
    cal = np.random.default_rng(3).standard_normal((100, 1, 20)).astype(np.float32)
    out["float"] = onnx2fpga.compile(fm, tmp / "float", calibration=cal, weight_bits=6,
                                     activation_bits=5, max_lanes=4)
    return out


def _inputs(design, n, seed):
    shape = design.design.inputs[0]["shape"]
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)


@pytest.mark.rtl
@pytest.mark.parametrize("which", ["qdq", "qdq13", "float"])
def test_rtl_equals_golden_under_backpressure(designs, which):
    d = designs[which]
    x = _inputs(d, 40, 11)
    golden = d.simulate(x, engine="golden")
    for seed, stall in ((1, 0.3), (2, 0.7)):
        rtl = d.simulate(x, engine="rtl", seed=seed, stall_in=stall, stall_out=stall)
        np.testing.assert_array_equal(rtl, golden)
    # The manifest's cycle figures are what the RTL does (within 5 %).
    run = d.last_run
    assert run["cycles_per_inference"] == pytest.approx(d.manifest["cycles_per_inference"],
                                                        rel=0.05)
    assert run["latency_cycles"] == pytest.approx(d.manifest["latency_cycles"], rel=0.05)


@pytest.mark.rtl
def test_reloaded_design_simulates_the_same(designs):
    d = designs["qdq"]
    again = onnx2fpga.load(d.directory)
    x = _inputs(d, 8, 5)
    np.testing.assert_array_equal(again.simulate(x, engine="rtl"),
                                  d.simulate(x, engine="golden"))


@pytest.mark.rtl
def test_simulate_json_reports_the_simulation(designs, tmp_path, capsys):
    """``simulate --json``: outputs equal the golden model's over two simulator processes,
    and the figures say how much was simulated how fast."""
    from onnx2fpga.cli import main
    d = designs["qdq"]
    x = _inputs(d, 10, 7)
    np.save(tmp_path / "x.npy", x)
    code = main(["simulate", d.directory, "--inputs", str(tmp_path / "x.npy"), "--outputs",
                 str(tmp_path / "y.npy"), "--json", "--jobs", "2", "--check"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["golden_match"] == "10/10"
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), d.simulate(x, engine="golden"))
    assert out["jobs"] == 2 and out["sim_seconds"] > 0
    assert out["total_cycles"] > 10 * out["cycles_per_inference"]
    assert out["cycles_per_second"] == pytest.approx(out["total_cycles"] / out["sim_seconds"],
                                                     rel=0.05)


def test_manifest_describes_ports_and_partition(designs):
    m = designs["qdq"].manifest
    s_axis = m["ports"]["s_axis"]
    assert (s_axis["type"], s_axis["shape"]) == ("uint8", [1, 16])
    assert s_axis["tdata_width"] == -(-s_axis["lanes"] * 8 // 8) * 8
    assert s_axis["beats"] * s_axis["lanes"] == 16
    part = m["partition"]
    assert part["host_head"] == ["x_QuantizeLinear"] or len(part["host_head"]) == 1
    assert any("Softmax" in n or "softmax" in n.lower() for n in part["host_tail"])
    assert sum(ly["macs"] for ly in m["layers"]) == 16 * 12 + 12 * 6


def test_multiplier_width_follows_the_quantization_source(designs):
    assert designs["qdq"].manifest["quantization"]["multiplier_bits"] == 24
    assert designs["float"].manifest["quantization"]["multiplier_bits"] == 16
    for d, bits in ((designs["qdq"], 24), (designs["float"], 16)):
        for stage in (st for ly in d.design.dataflow.layers for st in ly.requant):
            if stage.rounding == "float32":
                # onnxruntime's requantization (the default for its models): float32
                # mantissas, zero-padded to the layer's common shift.
                for m in map(int, stage.multiplier):
                    assert (m >> ((m & -m).bit_length() - 1) if m else 0).bit_length() <= 24
            else:
                assert int(stage.multiplier.max()).bit_length() <= bits


@pytest.mark.synth
# The MatMul+Add QDQ model has two 24-bit requantizations per layer (onnxruntime requantizes
# between MatMul and Add); as LUT multipliers they exceed the UP5K (5,635 of 5,280 cells), so
# the iCE40 builds use the Gemm QDQ model (one requantization per layer).
@pytest.mark.parametrize("which,board", [("qdq13", "icebreaker"), ("qdq", "ulx3s-85f"),
                                         ("float", "icebreaker"), ("float", "ulx3s-85f")])
def test_bitstream_and_report(designs, which, board):
    d = designs[which]
    report = d.build(board, progress=False)
    path = f"{d.directory}/build/{board}/report.json"
    with open(path) as f:
        assert json.load(f) == json.loads(json.dumps(report))
    assert report["board"] == board
    assert report["fmax_mhz"] > 0
    assert report["timing_met"] == (report["fmax_mhz"] >= report["clock_mhz"]
                                    and report.get("timing_complete", True))
    for key in ("lut", "ff", "dsp", "bram", "spram"):
        r = report["resources"][key]
        assert 0 <= r["used"] <= r["available"] or (r["available"] == 0 and r["used"] == 0)
    assert report["resources"]["lut"]["used"] > 100   # the accelerator is really in there
    # The framed wrapper's state machines: one-hot on iCE40, binary on ECP5.
    with open(f"{d.directory}/build/{board}/top.il") as f:
        rtlil = f.read()
    one_hot = board == "icebreaker"
    assert ("\\rx_sync_0" in rtlil) == one_hot and ("\\rx_state" in rtlil) != one_hot
    assert report["cycles_per_inference"] == d.manifest["cycles_per_inference"]
    suffix = ".bin" if board == "icebreaker" else ".bit"
    assert report["bitstream"].endswith(suffix)
