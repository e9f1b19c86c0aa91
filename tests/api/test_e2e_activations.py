"""End to end with activations in hardware: a QDQ model (onnxruntime's quantizer) with a
Gelu, looked up in a table, and a Sigmoid, counted by thresholds, between its Gemm layers:
Verilator under random stalls equals the golden model, which equals onnxruntime."""

import logging

import numpy as np
import onnxruntime as ort
import pytest

import onnx2fpga
from onnx2fpga.plan.graph import plan_graph
from tests.helpers.activations import ort_qdq, two_activation_mlp
from tests.helpers.models import save


@pytest.fixture(scope="module")
def design(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e_act")
    fp = save(two_activation_mlp("Gelu", "Sigmoid"), tmp / "fp.onnx")
    cal = (np.random.default_rng(1).standard_normal((64, 1, 8)) * 1.5).astype(np.float32)
    logging.getLogger().setLevel(logging.ERROR)
    q = ort_qdq(fp, tmp / "qdq.onnx", cal)
    return q, onnx2fpga.compile(q, tmp / "design")


def test_activations_are_a_table_and_thresholds_and_golden_equals_onnxruntime(design):
    q, d = design
    kinds = [st.kind for st in plan_graph(d.design.dataflow).stages]
    assert kinds.count("lut") == 1 and kinds.count("matvec") == 3
    assert "threshold" in kinds
    x = (np.random.default_rng(2).standard_normal((100, 1, 8)) * 1.5).astype(np.float32)
    s = ort.InferenceSession(q)
    want = np.stack([s.run(None, {"x": xi})[0] for xi in x])
    got = d.simulate(x, engine="golden")
    lsb = np.abs(got - want) / float(d.design.tail[-1].attrs["scale"])
    assert lsb.max() <= 1.0 + 1e-3 and np.mean(lsb < 1e-3) >= 0.99


@pytest.mark.rtl
def test_activations_rtl_equals_golden_under_backpressure(design):
    _, d = design
    x = (np.random.default_rng(3).standard_normal((20, 1, 8)) * 1.5).astype(np.float32)
    golden = d.simulate(x, engine="golden")
    for seed, stall in ((1, 0.3), (2, 0.7)):
        np.testing.assert_array_equal(
            d.simulate(x, engine="rtl", seed=seed, stall_in=stall, stall_out=stall), golden)
