"""Layers whose weights are constants of one adder graph (``multipliers="adders"``, issue 24)
end to end: models as onnxruntime's ``quantize_static`` and Brevitas write them, every dense
and convolution layer so realized, in Verilator under random stalls equal to the golden model
at one vector per cycle; the folding options that do not fit it are refused in one line."""

import numpy as np
import pytest

import onnx2fpga
from onnx2fpga.errors import OptionError
from onnx2fpga.plan.cmvm import MAX_ADDER_LEVELS
from onnx2fpga.plan.graph import plan_graph
from tests.helpers.models import ort_qdq_cnn, ort_qdq_mlp


def _adders(d, *, skip_depthwise=True):
    return {ly.name: {"multipliers": "adders"} for ly in d.design.dataflow.layers
            if getattr(ly, "multipliers", None) is not None
            and not (skip_depthwise and getattr(ly, "depthwise", False))}


def _compile_adders(path, out, **kw):
    plain = onnx2fpga.compile(path, out / "plain", **kw)
    return onnx2fpga.compile(path, out / "adders", folding=_adders(plain), **kw)


@pytest.mark.rtl
@pytest.mark.filterwarnings("ignore:Please consider")
def test_ort_mlp_one_vector_per_cycle(tmp_path):
    """onnxruntime's QDQ MLP (float32 requantization): both layers are adder graphs with
    their requantization folded in (no requant core, no matrix unit), one inference per
    cycle, bit-exact under stalls; the second reads the first's skid register with no queue
    between them, and the RTL's latency is the manifest's."""
    path, cal = ort_qdq_mlp(tmp_path, sizes=(16, 12, 6), seed=3)
    d = _compile_adders(path, tmp_path)
    stages = plan_graph(d.design.dataflow).stages
    kinds = [s.kind for s in stages]
    assert kinds.count("cmvm") == 2 and "matvec" not in kinds and "requant" not in kinds
    first, second = (s for s in stages if s.kind == "cmvm")
    assert second.inputs == first.outputs
    m = d.manifest
    assert m["cycles_per_inference"] == 1
    assert all(ly["multipliers"] == "adders" for ly in m["layers"] if "multipliers" in ly)
    assert m["resources"]["ecp5"]["total"]["dsp"] == 0
    x = np.random.default_rng(4).standard_normal((24, 1, 16)).astype(np.float32)
    x[0] *= 40                                   # saturating inputs too
    golden = d.simulate(x, engine="golden")
    np.testing.assert_array_equal(
        d.simulate(x, engine="rtl", seed=5, stall_in=0.4, stall_out=0.4), golden)
    np.testing.assert_array_equal(d.simulate(x, engine="rtl"), golden)
    assert d.last_run["latency_cycles"] == m["latency_cycles"]
    plain = onnx2fpga.load(tmp_path / "plain")
    np.testing.assert_array_equal(plain.simulate(x, engine="golden"), golden)


@pytest.mark.rtl
@pytest.mark.filterwarnings("ignore:Please consider")
def test_adder_levels_option(tmp_path):
    """``adder_levels``: three adder levels per register stage instead of one; fewer cycles
    of latency and flip-flops, the same one inference per cycle, still bit-exact under
    stalls."""
    path, _ = ort_qdq_mlp(tmp_path, sizes=(16, 12, 6), seed=3)
    plain = onnx2fpga.compile(path, tmp_path / "plain")
    one, three = (onnx2fpga.compile(path, tmp_path / f"l{n}", folding=_adders(plain),
                                    adder_levels=n) for n in (1, 3))
    assert [d.manifest["folding"]["adder_levels"] for d in (one, three)] == [1, 3]
    assert three.manifest["cycles_per_inference"] == 1
    assert three.manifest["latency_cycles"] < one.manifest["latency_cycles"]
    ff = [d.manifest["resources"]["ecp5"]["total"]["ff"] for d in (one, three)]
    assert ff[1] < ff[0]
    x = np.random.default_rng(9).standard_normal((16, 1, 16)).astype(np.float32)
    np.testing.assert_array_equal(
        three.simulate(x, engine="rtl", seed=10, stall_in=0.4, stall_out=0.4),
        plain.simulate(x, engine="golden"))


@pytest.mark.rtl
@pytest.mark.filterwarnings("ignore:Please consider")
def test_ort_cnn_conv_and_dense_as_adders(tmp_path):
    """A convolution (its window vector per cycle) and a dense layer as adder graphs in a
    CNN with a pool between them."""
    path, cal = ort_qdq_cnn(tmp_path, kind="basic", samples=32)
    d = _compile_adders(path, tmp_path)
    assert [s.kind for s in plan_graph(d.design.dataflow).stages].count("cmvm") == 2
    x = cal[:3]
    np.testing.assert_array_equal(
        d.simulate(x, engine="rtl", seed=6, stall_in=0.3, stall_out=0.3),
        d.simulate(x, engine="golden"))


@pytest.mark.rtl
@pytest.mark.filterwarnings("ignore:GR-05")
def test_brevitas_mlp_as_adders(tmp_path):
    pytest.importorskip("brevitas")
    pytest.importorskip("onnxoptimizer")
    from tests.helpers.brevitas_models import brevitas_mlp, export
    module, shape = brevitas_mlp(seed=2, sizes=(16, 8, 4))
    path = export(module, shape, tmp_path / "mlp.onnx", "qcdq-legacy")
    d = _compile_adders(path, tmp_path)
    assert d.manifest["cycles_per_inference"] == 1
    x = np.random.default_rng(7).uniform(-1, 1, (16, 1, 16)).astype(np.float32)
    np.testing.assert_array_equal(
        d.simulate(x, engine="rtl", seed=8, stall_in=0.5, stall_out=0.5),
        d.simulate(x, engine="golden"))


@pytest.mark.filterwarnings("ignore:Please consider")
def test_adders_folding_errors(tmp_path):
    path, _ = ort_qdq_mlp(tmp_path, sizes=(16, 12, 6), seed=3)
    with pytest.raises(OptionError, match=r"^Layer 'dense0': multipliers 'adders' compute "
                                          r"the whole matrix per cycle \(simd=16, pe=12\), "
                                          r"not simd=4$"):
        onnx2fpga.compile(path, tmp_path / "a",
                          folding={"dense0": {"multipliers": "adders", "simd": 4}})
    for bad in (0, 2.5, "2", MAX_ADDER_LEVELS + 1):
        with pytest.raises(OptionError, match=rf"^adder_levels must be an integer from 1 to "
                                              rf"{MAX_ADDER_LEVELS}, not {bad!r}$"):
            onnx2fpga.compile(path, tmp_path / "l", adder_levels=bad)
    assert not (tmp_path / "l").exists()
    path, _ = ort_qdq_cnn(tmp_path, kind="depthwise", samples=8)
    plain = onnx2fpga.compile(path, tmp_path / "dw")
    dw = next(ly.name for ly in plain.design.dataflow.layers if getattr(ly, "depthwise", 0))
    with pytest.raises(OptionError, match=rf"^Layer '{dw}' \(ConvLayer\) has no 'adders' "
                                          r"realization"):
        onnx2fpga.compile(path, tmp_path / "b", folding={dw: {"multipliers": "adders"}})


@pytest.mark.synth
def test_adders_estimate_matches_build(tmp_path):
    """The adder graphs' LUT and flip-flop estimate (plan.cmvm.cmvm_resources, with the board
    wrapper) within 20 % of nextpnr on the ULX3S-85F, for a float MLP calibrated with
    power-of-two scales whose two layers are adder graphs (measured: 7,511 against 7,513
    TRELLIS_COMB, 8,275 against 8,270 flip-flops)."""
    import shutil

    from onnx2fpga.boards.build import tool_environment
    from tests.helpers.models import float_mlp, save
    env = tool_environment()
    if not all(shutil.which(env[t]) for t in ("YOSYS", "NEXTPNR_ECP5", "ECPPACK")):
        pytest.skip("needs yosys, nextpnr-ecp5 and ecppack")
    path = save(float_mlp((16, 12, 6), softmax=False), tmp_path / "m.onnx")
    cal = np.random.default_rng(0).standard_normal((100, 1, 16)).astype(np.float32)
    fold = {"dense0": {"multipliers": "adders"}, "dense1": {"multipliers": "adders"}}
    d = onnx2fpga.compile(path, tmp_path / "d", calibration=cal, folding=fold,
                          pow2_scales=True)
    est = d.manifest["resources"]["ecp5"]["board"]
    report = d.build("ulx3s-85f", progress=False)
    assert "--placer" not in report["nextpnr_opts"]       # small: nextpnr's default placer
    used = {k: report["resources"][k]["used"] for k in ("lut", "ff", "dsp")}
    assert est["dsp"] == used["dsp"] == 0
    for k in ("lut", "ff"):
        assert abs(est[k] - used[k]) <= 0.2 * used[k], (est, used)
