"""The manifest's latency is the RTL's: Verilator's latency phase (one inference, no stall on
either side, first input transfer to last output transfer) within 5 % of
``manifest["latency_cycles"]`` on networks whose layers run at different paces, where a model
of each net's first and last transfer alone was 14 % to 47 % low (``plan.cost.plan_traces``;
``benchmarks/latency_model.py`` measures more models)."""

import logging
import warnings

import numpy as np
import pytest

import onnx2fpga
from tests.helpers.models import CNN_KINDS, ort_qdq_cnn

CASES = ["residual_cnn", "conv1d_net", "resnet_like"]


def _compile(tmp, case):
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
    assert run["latency_cycles"] == pytest.approx(manifest["latency_cycles"], rel=0.05)
    assert run["cycles_per_inference"] == pytest.approx(manifest["cycles_per_inference"],
                                                        rel=0.05)
