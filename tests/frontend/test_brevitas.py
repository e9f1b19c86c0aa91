"""Brevitas 0.13 models with their default quantizers, exported as QONNX and QCDQ through
both torch exporters: every Conv / Gemm / MatMul in hardware, and the result equal to
Brevitas' own torch output within the float32 rounding of the host's epilogue."""

import numpy as np
import pytest

import onnx2fpga
from onnx2fpga.sim.model import run_design

pytest.importorskip("brevitas")
pytest.importorskip("onnxoptimizer")        # brevitas.export needs it
pytestmark = pytest.mark.filterwarnings("ignore:GR-05")   # exporters list initializers as inputs

from tests.helpers.brevitas_models import (  # noqa: E402
    EXPORTERS,
    brevitas_bn_tanh_cnn,
    brevitas_cnn,
    brevitas_gap_cnn,
    brevitas_mlp,
    export,
    torch_output,
)

COMPUTE = ("Conv", "Gemm", "MatMul", "ConvInteger", "MatMulInteger", "QLinearConv",
           "QLinearMatMul")
# The CNN has a MaxPool between a QuantReLU and the next QuantConv2d; "nobias" is a bias-free
# QuantLinear (its weight's Transpose, behind a Clip of the int8 weight in QCDQ); "int32bias"
# a bias quantized by Int32Bias (a 32-bit QONNX Quant of a constant); "gap" a float
# AdaptiveAvgPool2d(1) between a QuantReLU and a QuantLinear (GlobalAveragePool; dynamo
# writes ReduceMean instead), "gapk" the same as an AvgPool2d over the whole map. QCDQ
# through dynamo refuses quantized biases (Brevitas 0.13).
# "sigmoid" / "tanh": QuantSigmoid / QuantTanh after the first QuantLinear, which has no
# output quantizer: its float result (bias included) goes through the float function, then
# the activation's quantizer; the hardware counts thresholds on the exact accumulator.
# "bntanh": the same after a QuantConv2d and a BatchNorm2d with negative scales.
CASES = [("mlp", e) for e in EXPORTERS] + [
    ("cnn", "qonnx-dynamo"), ("cnn", "qcdq-legacy"), ("nobias", "qcdq-legacy"),
    ("int32bias", "qonnx-legacy"), ("gap", "qcdq-legacy"), ("gapk", "qcdq-legacy"),
    ("sigmoid", "qonnx-legacy"),
    ("sigmoid", "qcdq-legacy"), ("tanh", "qonnx-dynamo"), ("tanh", "qcdq-dynamo"),
    ("bntanh", "qcdq-legacy")]
KINDS = {"mlp": ["dense", "dense"], "cnn": ["conv", "pool", "conv", "view", "dense"],
         "gap": ["conv", "pool", "view", "dense"], "gapk": ["conv", "pool", "view", "dense"],
         "bntanh": ["conv", "view", "dense"]}
MODELS = {"mlp": brevitas_mlp, "cnn": brevitas_cnn, "gap": brevitas_gap_cnn,
          "gapk": lambda: brevitas_gap_cnn(pool="kernel"),
          "nobias": lambda: brevitas_mlp(bias=None),
          "int32bias": lambda: brevitas_mlp(bias="int32"),
          "sigmoid": lambda: brevitas_mlp(act="sigmoid"),
          "tanh": lambda: brevitas_mlp(act="tanh"), "bntanh": brevitas_bn_tanh_cnn}
#: The host's share: the accumulator's DequantizeLinear, and the Add of a float bias.
TAILS = {"nobias": ["DequantizeLinear"], "int32bias": ["DequantizeLinear"]}


@pytest.mark.parametrize("model,exporter", CASES)
def test_brevitas_defaults_run_in_hardware_and_equal_torch(tmp_path, model, exporter):
    module, shape = MODELS[model]()
    path = export(module, shape, tmp_path / f"{model}.onnx", exporter)
    c = onnx2fpga.compile(path, tmp_path / "out", stop_after="lower")
    d = c.design
    assert [ly.kind for ly in d.dataflow.layers] == KINDS.get(model, KINDS["mlp"])
    assert not [n.op for n in d.head + d.tail if n.op in COMPUTE]
    # The last layer ends in its exact accumulator; the host dequantizes it and adds the
    # float bias (Brevitas' default QuantLinear: no output quantizer).
    assert [n.op for n in d.tail] == TAILS.get(model, ["DequantizeLinear", "Add"])
    assert d.dataflow.output.type == d.dataflow.layers[-1].acc_type
    if model in ("sigmoid", "tanh", "bntanh"):
        assert [type(st).__name__ for st in d.dataflow.layers[0].requant] == \
            ["ThresholdStage"]
    x = np.random.default_rng(5).standard_normal((50, *shape[1:])).astype(np.float32)
    want = torch_output(module, x)
    got = run_design(d, x[:, None]).reshape(want.shape)
    # Brevitas sums float32 products of the dequantized operands; the host scales the exact
    # integer accumulator in float32. Both are the same real number up to float32 rounding
    # (measured: under 0.02 of one accumulator step, 1e-7 absolute; 0.033 after QuantSigmoid
    # and 0.016 after QuantTanh on 2000 inputs: the thresholds gave every hidden code
    # Brevitas computes, 64000 of 64000); one accumulator step
    # wrong (s_in * s_w, about 5e-6 here) would fail. After the 16-position average pool the
    # step is 16 times finer (the pool's sum on the grid s_in / 16; measured 0.28 step,
    # 1.2e-7 absolute, one float32 rounding at the outputs' size): there one step, and one
    # unit wrong in a pooled sum moves the accumulator by a weight, tens of steps.
    step = np.asarray(d.tail[0].attrs["scale"], np.float64).reshape(-1)
    assert np.max(np.abs(got - want) / step) <= (1.0 if model in ("gap", "gapk") else 0.1)
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def test_compile_prints_the_partition(tmp_path, capsys):
    module, shape = brevitas_mlp()
    path = export(module, shape, tmp_path / "mlp.onnx", "qcdq-legacy")
    onnx2fpga.compile(path, tmp_path / "out", verbose=True, stop_after="lower")
    err = capsys.readouterr().err
    assert "[onnx2fpga] partition: host: Add (tail); hardware: 2 layers\n" in err
