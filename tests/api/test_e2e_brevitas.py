"""End to end for a Brevitas model: a QCDQ export of a small MLP with Brevitas' default last
layer (a float bias, no output quantizer) in Verilator under random stalls equals the golden
model, and both equal Brevitas' torch output within the float32 rounding of the host's
epilogue."""

import numpy as np
import pytest

import onnx2fpga

pytest.importorskip("brevitas")
pytest.importorskip("onnxoptimizer")        # brevitas.export needs it

from tests.helpers.brevitas_models import brevitas_mlp, export, torch_output  # noqa: E402


@pytest.mark.rtl
@pytest.mark.filterwarnings("ignore:GR-05")
def test_brevitas_mlp_rtl_equals_golden_under_stalls(tmp_path):
    module, shape = brevitas_mlp(seed=1, sizes=(16, 8, 4))
    path = export(module, shape, tmp_path / "mlp.onnx", "qcdq-legacy")
    d = onnx2fpga.compile(path, tmp_path / "out")
    assert [ly.kind for ly in d.design.dataflow.layers] == ["dense", "dense"]
    x = np.random.default_rng(2).uniform(-1, 1, (20, 1, 16)).astype(np.float32)
    golden = d.simulate(x, engine="golden")
    rtl = d.simulate(x, engine="rtl", seed=3, stall_in=0.5, stall_out=0.5)
    np.testing.assert_array_equal(rtl, golden)
    want = torch_output(module, x[:, 0])
    step = np.asarray(d.design.tail[0].attrs["scale"], np.float64).reshape(-1)
    assert np.max(np.abs(golden.reshape(want.shape) - want) / step) <= 0.1
