"""The manifest's latency is the RTL's: Verilator's latency phase (one inference, no stall on
either side, first input transfer to last output transfer) within 5 % of
``manifest["latency_cycles"]`` on networks whose layers run at different paces, where a model
of each net's first and last transfer alone was 14 % to 47 % low (``plan.cost.plan_traces``;
``benchmarks/latency_model.py`` measures more models). On a DS-CNN, whose depthwise layers
emit rows in bursts a pointwise layer takes at its own pace, within 1 %: the FIFOs between
layers are sized from the same model (``plan.fifos``)."""

import logging
import warnings

import numpy as np
import pytest

import onnx2fpga
from tests.helpers.models import CNN_KINDS, float_cnn, ort_qdq_cnn

CASES = ["residual_cnn", "conv1d_net", "resnet_like", "ds_cnn"]

#: How close the RTL's figures must be to the manifest's.
TOLERANCE = {"ds_cnn": 0.01}

#: The DS-CNN case: with 2-deep FIFOs between layers, Verilator ran it at 18,250 cycles per
#: inference and 22,959 latency against the model's 18,000 and 22,692.
DS_CNN = {"channels": 32, "blocks": 2, "max_lanes": 32}


def _compile(tmp, case):
    if case == "ds_cnn":
        pytest.importorskip("torch")
        from tests.helpers.torch_models import DS_CNN_SHAPE, ds_cnn_qdq
        _, path, _ = ds_cnn_qdq(tmp, channels=DS_CNN["channels"], blocks=DS_CNN["blocks"])
        return onnx2fpga.compile(path, tmp / "d", max_lanes=DS_CNN["max_lanes"]), DS_CNN_SHAPE
    if case == "residual_cnn":
        path, _ = ort_qdq_cnn(tmp, kind="residual", per_channel=True)
        return onnx2fpga.compile(path, tmp / "d"), CNN_KINDS["residual"]
    pytest.importorskip("torch")
    from tests.helpers.torch_models import paced_net_qdq
    path, shape = paced_net_qdq(tmp, "conv1d" if case == "conv1d_net" else "resnet", size=8)
    return onnx2fpga.compile(path, tmp / "d"), shape


@pytest.mark.rtl
@pytest.mark.parametrize("case", CASES)
def test_manifest_latency_is_the_rtl_latency(tmp_path, case):
    pytest.importorskip("onnxruntime")
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            design, shape = _compile(tmp_path, case)
    finally:
        logging.disable(logging.NOTSET)
    x = np.random.default_rng(3).standard_normal((2, 1) + tuple(shape)).astype(np.float32)
    np.testing.assert_array_equal(design.simulate(x, engine="rtl", stall_in=0, stall_out=0),
                                  design.simulate(x, engine="golden"))
    run, manifest = design.last_run, design.manifest
    rel = TOLERANCE.get(case, 0.05)
    assert run["latency_cycles"] == pytest.approx(manifest["latency_cycles"], rel=rel)
    assert run["cycles_per_inference"] == pytest.approx(manifest["cycles_per_inference"],
                                                        rel=rel)


@pytest.mark.rtl
def test_optimize_latency_is_shorter_in_rtl(tmp_path):
    """``optimize="latency"``: the same rate as the balanced plan, a shorter latency in
    Verilator, and the manifest's latency still the RTL's."""
    cal = np.random.default_rng(1).standard_normal((32, 1) + CNN_KINDS["depthwise"])
    cal = cal.astype(np.float32)
    x = cal[:2]
    runs = {}
    logging.disable(logging.WARNING)
    try:
        for optimize in ("throughput", "latency"):
            d = onnx2fpga.compile(float_cnn("depthwise"), tmp_path / optimize, calibration=cal,
                                  max_lanes=16, optimize=optimize)
            np.testing.assert_array_equal(d.simulate(x, engine="rtl", stall_in=0, stall_out=0),
                                          d.simulate(x, engine="golden"))
            assert d.manifest["folding"]["optimize"] == optimize
            assert d.last_run["latency_cycles"] == pytest.approx(d.manifest["latency_cycles"],
                                                                 rel=0.05)
            runs[optimize] = d.last_run
    finally:
        logging.disable(logging.NOTSET)
    assert runs["latency"]["cycles_per_inference"] == runs["throughput"]["cycles_per_inference"]
    assert runs["latency"]["latency_cycles"] < 0.8 * runs["throughput"]["latency_cycles"]
