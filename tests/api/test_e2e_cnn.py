"""End to end for convolutional networks: ONNX -> design -> Verilator with random stalls on
both AXI-Stream sides == golden model, and the manifest's cycles are what the RTL does.

Models: onnxruntime QDQ CNNs with per-channel weights (a residual block with its skip FIFO,
a depthwise convolution), float CNNs with our calibration (a channel concatenation, a nearest
resize, a pad before a convolution, a 1-D convolution), and the bundled digits CNN example.
"""

import logging
import os
import warnings

import numpy as np
import pytest

import onnx2fpga
from tests.helpers.models import CNN_KINDS, float_cnn, ort_qdq_cnn, qdq_requant_ties
from tests.helpers.paths import EXAMPLES

EXAMPLE = os.path.join(EXAMPLES,
                       "cnn_digits")

CASES = [("residual", "qdq"), ("depthwise", "qdq"), ("concat", "float"), ("resize", "float"),
         ("pad", "float"), ("conv1d", "float")]


@pytest.fixture(scope="module")
def designs(tmp_path_factory):
    logging.disable(logging.WARNING)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind, how in CASES:
            tmp = tmp_path_factory.mktemp(f"{kind}-{how}")
            if how == "qdq":
                path, _ = ort_qdq_cnn(tmp, kind=kind, per_channel=True)
                out[kind, how] = onnx2fpga.compile(path, tmp / "d")
            else:
                cal = np.random.default_rng(1).standard_normal(
                    (64, 1) + CNN_KINDS[kind]).astype(np.float32)
                out[kind, how] = onnx2fpga.compile(float_cnn(kind), tmp / "d", calibration=cal,
                                                   max_lanes=6)
    logging.disable(logging.NOTSET)
    return out


@pytest.mark.rtl
@pytest.mark.parametrize("kind, how", CASES)
def test_cnn_rtl_equals_golden_under_backpressure(designs, kind, how):
    d = designs[kind, how]
    x = np.random.default_rng(7).standard_normal((6, 1) + CNN_KINDS[kind]).astype(np.float32)
    golden = d.simulate(x, engine="golden")
    for seed, stall in ((1, 0.3), (2, 0.6)):
        rtl = d.simulate(x, engine="rtl", seed=seed, stall_in=stall, stall_out=stall)
        np.testing.assert_array_equal(rtl, golden)
    assert d.last_run["cycles_per_inference"] == pytest.approx(
        d.manifest["cycles_per_inference"], rel=0.05)
    if kind == "residual":
        # The skip branch has the FIFO the planner computed, and the run did not deadlock.
        assert d.manifest["edge_fifos"]
    # onnxruntime's models get onnxruntime's requantization (float32 stages), ours not.
    assert d.manifest["quantization"]["requant"] == ("onnxruntime" if how == "qdq" else
                                                     "exact")


@pytest.mark.rtl
@pytest.mark.parametrize("op, activation, big", [("conv", "uint8", True),
                                                 ("gemm", "int8", True)])
def test_requant_ties_rtl_equals_onnxruntime(tmp_path, op, activation, big):
    # The layer whose requantization falls next to ties (see qdq_requant_ties): the RTL's
    # float32 stage gives onnxruntime's integers, accumulators beyond 2**24 included.
    import onnxruntime as ort
    logging.disable(logging.WARNING)
    model, x = qdq_requant_ties(op, activation=activation, big=big, channels=8)
    logging.disable(logging.NOTSET)
    x = x[:64] if op == "gemm" else x
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    d = onnx2fpga.compile(model, tmp_path / "d")
    rtl = d.simulate(x, engine="rtl", seed=3, stall_in=0.3, stall_out=0.3)
    np.testing.assert_array_equal(np.asarray(rtl).reshape(ref.shape), ref)
    exact = onnx2fpga.compile(model, tmp_path / "e", requant="exact")
    assert np.any(np.asarray(exact.simulate(x, engine="golden")).reshape(ref.shape) != ref)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    cal = np.load(os.path.join(EXAMPLE, "calibration.npy"))
    return onnx2fpga.compile(os.path.join(EXAMPLE, "model.onnx"),
                             tmp_path_factory.mktemp("cnn_digits") / "d", calibration=cal)


def test_example_accuracy(example):
    import onnxruntime as ort
    x = np.load(os.path.join(EXAMPLE, "test_x.npy"))
    y = np.load(os.path.join(EXAMPLE, "test_y.npy"))
    sess = ort.InferenceSession(os.path.join(EXAMPLE, "model.onnx"))
    acc_float = np.mean(np.argmax(sess.run(None, {"x": x})[0], 1) == y)
    got = example.simulate(x, engine="golden").reshape(len(x), -1)
    acc = np.mean(np.argmax(got, 1) == y)
    assert acc >= acc_float - 0.01
    kinds = [ly["kind"] for ly in example.manifest["layers"]]
    assert {"conv", "pool", "add", "view", "dense"} <= set(kinds)


@pytest.mark.rtl
def test_example_rtl_equals_golden(example):
    x = np.load(os.path.join(EXAMPLE, "test_x.npy"))[:12]
    np.testing.assert_array_equal(example.simulate(x, engine="rtl", seed=3),
                                  example.simulate(x, engine="golden"))
    assert example.last_run["cycles_per_inference"] == pytest.approx(
        example.manifest["cycles_per_inference"], rel=0.05)


@pytest.mark.synth
def test_example_builds_for_ulx3s_85f(example):
    """The digits CNN (a residual join, pools, BatchNormalization folded) through yosys and
    nextpnr-ecp5: timing met, multipliers in MULT18X18D."""
    report = example.build("ulx3s-85f", progress=False)
    assert report["timing_met"] is True and report["device"] == "LFE5U-85F-BG381"
    assert report["resources"]["dsp"]["used"] > 0
    assert report["cycles_per_inference"] == example.manifest["cycles_per_inference"]
