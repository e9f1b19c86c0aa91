"""Brevitas 0.13 models with their default quantizers, exported the four ways a user does.

Imported only by tests that ``pytest.importorskip("brevitas")`` first. Each model is made
from a fixed seed and exported by Brevitas itself; its torch output is the reference.
"""

import warnings

import numpy as np

__all__ = ["EXPORTERS", "brevitas_mlp", "brevitas_cnn", "brevitas_gap_cnn",
           "brevitas_bn_tanh_cnn", "export", "torch_output"]

#: ``name -> (function name in brevitas.export, dynamo)``: QONNX and QCDQ, each through the
#: legacy TorchScript exporter and through dynamo (export_qonnx's default on torch >= 2.9).
EXPORTERS = {
    "qonnx-dynamo": ("export_qonnx", True),
    "qonnx-legacy": ("export_qonnx", False),
    "qcdq-dynamo": ("export_onnx_qcdq", True),
    "qcdq-legacy": ("export_onnx_qcdq", False),
}


def brevitas_mlp(seed=0, sizes=(64, 32, 10), bias="float", act="relu"):
    """QuantIdentity -> QuantLinear -> QuantReLU -> QuantLinear, default quantizers (8-bit
    per-tensor weights, a float bias, no output quantizer on the last layer: it leaves
    through a float bias). ``bias``: ``"float"`` (the default), ``"int32"`` (Brevitas'
    ``Int32Bias``, on the accumulator's grid) or ``None`` (no bias: torch writes the
    weight's Transpose and a MatMul). ``act``: ``"relu"``, ``"sigmoid"`` or ``"tanh"``
    (QuantSigmoid / QuantTanh quantize only their output: the first layer's float result,
    bias included, goes through the float function before it is quantized)."""
    import torch
    import torch.nn as nn
    import brevitas.nn as qnn
    from brevitas.quant import Int32Bias

    torch.manual_seed(seed)
    kw = {"bias": bias is not None}
    if bias == "int32":
        kw["bias_quant"] = Int32Bias

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = qnn.QuantIdentity(return_quant_tensor=True)
            self.fc0 = qnn.QuantLinear(sizes[0], sizes[1], **kw)
            self.relu = {"relu": qnn.QuantReLU, "sigmoid": qnn.QuantSigmoid,
                         "tanh": qnn.QuantTanh}[act](return_quant_tensor=True)
            self.fc1 = qnn.QuantLinear(sizes[1], sizes[2], **kw)

        def forward(self, x):
            return self.fc1(self.relu(self.fc0(self.inp(x))))

    return MLP().eval(), (1, sizes[0])


def brevitas_cnn(seed=0):
    """QuantConv2d -> QuantReLU -> MaxPool2d -> QuantConv2d (no requantizer between the pool
    and the convolution) -> QuantReLU -> Flatten -> QuantLinear, default quantizers."""
    import torch
    import torch.nn as nn
    import brevitas.nn as qnn

    torch.manual_seed(seed)

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = qnn.QuantIdentity(return_quant_tensor=True)
            self.conv0 = qnn.QuantConv2d(1, 4, 3, bias=True)
            self.relu0 = qnn.QuantReLU(return_quant_tensor=True)
            self.pool = nn.MaxPool2d(2)
            self.conv1 = qnn.QuantConv2d(4, 8, 3, bias=True)
            self.relu1 = qnn.QuantReLU(return_quant_tensor=True)
            self.flat = nn.Flatten()
            self.fc = qnn.QuantLinear(8 * 2 * 2, 10, bias=True)

        def forward(self, x):
            x = self.pool(self.relu0(self.conv0(self.inp(x))))
            return self.fc(self.flat(self.relu1(self.conv1(x))))

    return CNN().eval(), (1, 1, 10, 10)


def brevitas_gap_cnn(seed=0, *, pool="adaptive"):
    """QuantConv2d -> QuantReLU -> AdaptiveAvgPool2d(1) (no requantizer: a float mean) ->
    Flatten -> QuantLinear, default quantizers, on 6 x 6 inputs (16 positions pooled);
    ``pool="kernel"``: AvgPool2d(4) over the whole 4 x 4 map instead (an AveragePool)."""
    import torch
    import torch.nn as nn
    import brevitas.nn as qnn

    torch.manual_seed(seed)
    module = nn.Sequential(qnn.QuantIdentity(return_quant_tensor=True),
                           qnn.QuantConv2d(1, 4, 3, bias=True),
                           qnn.QuantReLU(return_quant_tensor=True),
                           nn.AdaptiveAvgPool2d(1) if pool == "adaptive" else nn.AvgPool2d(4),
                           nn.Flatten(), qnn.QuantLinear(4, 10, bias=True))
    return module.eval(), (1, 1, 6, 6)


def brevitas_bn_tanh_cnn(seed=0):
    """QuantConv2d (no output quantizer) -> BatchNorm2d (two channels with a negative scale)
    -> QuantTanh -> Flatten -> QuantLinear, on 8 x 8 inputs: the float convolution result,
    normalized, goes through the float Tanh before it is quantized."""
    import torch
    import torch.nn as nn
    import brevitas.nn as qnn

    torch.manual_seed(seed)
    module = nn.Sequential(qnn.QuantIdentity(return_quant_tensor=True),
                           qnn.QuantConv2d(1, 4, 3, bias=True), nn.BatchNorm2d(4),
                           qnn.QuantTanh(return_quant_tensor=True), nn.Flatten(),
                           qnn.QuantLinear(4 * 6 * 6, 10, bias=True))
    bn = module[2]
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, -0.5, 2.0, -1.0]))
        bn.running_mean.uniform_(-0.3, 0.3)
        bn.running_var.uniform_(0.5, 2.0)
    return module.eval(), (1, 1, 8, 8)


def export(module, shape, path, exporter):
    """Export ``module`` for inputs of ``shape`` to ``path`` with :data:`EXPORTERS`
    ``exporter``; returns the path."""
    import torch
    import brevitas.export as bx

    fn, dynamo = EXPORTERS[exporter]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        getattr(bx, fn)(module, torch.zeros(shape), str(path), dynamo=dynamo)
    return str(path)


def torch_output(module, x: np.ndarray) -> np.ndarray:
    """The module's own float32 output on ``x`` (a batch)."""
    import torch

    with torch.no_grad():
        y = module(torch.from_numpy(x))
    return getattr(y, "value", y).numpy()
