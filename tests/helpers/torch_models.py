"""Small PyTorch models exported the way users export them (``torch.onnx.export``, legacy or
dynamo) and quantized by onnxruntime's ``quantize_static`` (QDQ, MinMax, per-channel int8
weights), for the operators exporters write around convolutions: reductions, channel
splits and slices, joins of two activations.

Import only inside a test that has called ``pytest.importorskip("torch")``.
"""

import logging
import warnings

import numpy as np

from .models import ort_quantized_tensors

__all__ = ["TORCH_PATTERNS", "SHAPE", "torch_model", "export", "ort_quantize", "torch_qdq",
           "ort_quantized_tensors", "tf_same", "DS_CNN_SHAPE", "ds_cnn", "ds_cnn_qdq",
           "output_step", "paced_net", "paced_net_qdq"]

#: The input shape (without the batch) of every model here.
SHAPE = (3, 6, 6)


def _modules():
    import torch
    from torch import nn

    class Reduce(nn.Module):
        """Conv, Relu, a global reduction (``mode``), Linear."""

        def __init__(self, mode):
            super().__init__()
            self.c, self.fc, self.mode = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 5), mode
            self.pool = nn.AdaptiveAvgPool2d(1)

        def forward(self, x):
            h = torch.relu(self.c(x))
            if self.mode == "adaptive":
                h = torch.flatten(self.pool(h), 1)
            elif self.mode == "mean":
                h = h.mean((2, 3))
            elif self.mode == "amax":
                h = h.amax((2, 3))
            else:
                h = h.sum((2, 3))
            return self.fc(h)

    class Split(nn.Module):
        """Conv, Relu, split 3 + 5 channels, a 1x1 Conv on each, Concat, mean, Linear."""

        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 8, 3, padding=1)
            self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(5, 4, 1)
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            h = torch.relu(self.c(x))
            p, q = torch.split(h, [3, 5], dim=1)
            h = torch.cat([torch.relu(self.a(p)), torch.relu(self.b(q))], 1)
            return self.fc(h.mean((2, 3)))

    class Slice(nn.Module):
        """Conv, Relu, channels 2..5, a 1x1 Conv, Flatten, Linear."""

        def __init__(self):
            super().__init__()
            self.c, self.a = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(4, 4, 1)
            self.fc = nn.Linear(4 * 36, 5)

        def forward(self, x):
            h = torch.relu(self.c(x))
            return self.fc(torch.flatten(torch.relu(self.a(h[:, 2:6])), 1))

    class Join(nn.Module):
        """Two Convs (one with Relu) joined by ``op``, Flatten, Linear."""

        def __init__(self, op):
            super().__init__()
            self.c, self.d = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 3, padding=1)
            self.fc, self.op = nn.Linear(8 * 36, 5), op

        def forward(self, x):
            a, b = torch.relu(self.c(x)), self.d(x)
            y = {"mul": lambda: a * b, "sub": lambda: a - b,
                 "min": lambda: torch.minimum(a, b), "max": lambda: torch.maximum(a, b)}
            return self.fc(torch.flatten(y[self.op](), 1))

    class SqueezeExcite(nn.Module):
        """Conv, Relu, x * relu(fc(relu(fc(pool(x))))) (squeeze-and-excitation with a
        broadcast), mean, Linear."""

        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 8, 3, padding=1)
            self.f1, self.f2 = nn.Conv2d(8, 4, 1), nn.Conv2d(4, 8, 1)
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            h = torch.relu(self.c(x))
            w = torch.nn.functional.adaptive_avg_pool2d(h, 1)
            w = torch.relu(self.f2(torch.relu(self.f1(w))))
            return self.fc((h * w).mean((2, 3)))

    class SpaceToDepth(nn.Module):
        """Conv, Relu, space-to-depth by 2 as torch code writes it (Reshape to 6-D,
        Transpose, Reshape: 8x6x6 -> 32x3x3), a 1x1 Conv, Relu, mean, Linear."""

        def __init__(self):
            super().__init__()
            self.c, self.d = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(32, 8, 1)
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            h = torch.relu(self.c(x))
            n, c, hh, ww = h.shape
            h = h.reshape(n, c, hh // 2, 2, ww // 2, 2).permute(0, 3, 5, 1, 2, 4)
            h = h.reshape(n, c * 4, hh // 2, ww // 2)
            return self.fc(torch.relu(self.d(h)).mean((2, 3)))

    return {"adaptive": lambda: Reduce("adaptive"), "mean": lambda: Reduce("mean"),
            "amax": lambda: Reduce("amax"), "sum": lambda: Reduce("sum"), "split": Split,
            "slice": Slice, "mul": lambda: Join("mul"), "sub": lambda: Join("sub"),
            "min": lambda: Join("min"), "max": lambda: Join("max"), "se": SqueezeExcite,
            "s2d": SpaceToDepth}


#: The patterns :func:`torch_model` builds.
TORCH_PATTERNS = ("adaptive", "mean", "amax", "sum", "split", "slice", "mul", "sub", "min",
                  "max", "se", "s2d")


def torch_model(pattern: str, *, seed: int = 0):
    """The module of ``pattern`` (one of :data:`TORCH_PATTERNS`), seeded, in eval mode."""
    import torch

    torch.manual_seed(seed)
    return _modules()[pattern]().eval()


def export(module, path, *, dynamo: bool) -> str:
    """``torch.onnx.export`` of ``module`` on a ``(1, *SHAPE)`` input named ``x`` (output
    ``y``): the dynamo exporter (its default opset) or the legacy one at opset 13."""
    import torch

    x = torch.randn(1, *SHAPE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(module, (x,), str(path), dynamo=True, input_names=["x"],
                              output_names=["y"], verbose=False)
        else:
            torch.onnx.export(module, (x,), str(path), dynamo=False, input_names=["x"],
                              output_names=["y"], opset_version=13)
    return str(path)


def ort_quantize(fp: str, path, calibration: np.ndarray) -> str:
    """onnxruntime ``quantize_static`` of ``fp``: QDQ, MinMax, int8 activations and
    per-channel int8 weights, one calibration sample at a time."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"x": c} for c in calibration)

        def get_next(self):
            return next(self.it, None)

    logging.disable(logging.WARNING)
    try:
        quantize_static(fp, str(path), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        per_channel=True, calibrate_method=CalibrationMethod.MinMax)
    finally:
        logging.disable(logging.NOTSET)
    return str(path)


def torch_qdq(tmp_path, pattern: str, *, dynamo: bool, samples: int = 32):
    """Export ``pattern`` and quantize it: ``(float path, QDQ path, calibration inputs
    (samples, 1, *SHAPE))``."""
    tag = f"{pattern}_{'dynamo' if dynamo else 'legacy'}"
    fp = export(torch_model(pattern), tmp_path / f"{tag}_fp.onnx", dynamo=dynamo)
    cal = np.random.default_rng(1).standard_normal((samples, 1) + SHAPE).astype(np.float32)
    return fp, ort_quantize(fp, tmp_path / f"{tag}_qdq.onnx", cal), cal


def tf_same(path, *, auto_pad: str | None = None) -> str:
    """Rewrite the float model at ``path`` in place to the padding TensorFlow's converters
    write (tf2onnx, TFLite): every Conv gets SAME padding, ``ceil(in / stride)`` outputs
    and the odd pad at the end (explicit ``pads``, or ``auto_pad`` when given:
    ``"SAME_UPPER"`` / ``"SAME_LOWER"``), and every AveragePool then covers its whole input
    map (the global pool as a TFLite ``AVERAGE_POOL_2D``). torch writes neither: its pads
    are symmetric and its pool is the kernel it was given."""
    import onnx
    from onnx import helper, shape_inference

    def infer(m):
        del m.graph.value_info[:]
        m = shape_inference.infer_shapes(m)
        return m, {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                   for v in [*m.graph.value_info, *m.graph.input, *m.graph.output]}

    def set_ints(node, name, values):
        kept = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend(kept + ([helper.make_attribute(name, list(values))]
                                      if values is not None else []))

    m, shapes = infer(onnx.load(str(path)))
    for n in m.graph.node:
        if n.op_type != "Conv":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        size, kernel = shapes[n.input[0]][2:], attrs["kernel_shape"]
        strides = attrs.get("strides", [1] * len(size))
        if auto_pad is not None:
            set_ints(n, "pads", None)
            n.attribute.append(helper.make_attribute("auto_pad", auto_pad))
            continue
        begin, end = [], []
        for i, k, s in zip(size, kernel, strides):
            total = max(0, (-(-i // s) - 1) * s + k - i)
            begin.append(total // 2)
            end.append(total - total // 2)
        set_ints(n, "pads", begin + end)
    m, shapes = infer(m)
    for n in m.graph.node:
        if n.op_type == "AveragePool":
            set_ints(n, "kernel_shape", shapes[n.input[0]][2:])
    del m.graph.value_info[:]
    onnx.save(m, str(path))
    return str(path)


#: The flat input of :func:`ds_cnn` (49 x 10 MFCC features, as MLPerf Tiny's KWS).
DS_CNN_SHAPE = (490,)


def ds_cnn(channels: int = 8, classes: int = 12, *, seed: int = 0, zero_pad: bool = False,
           blocks: int = 1):
    """A small DS-CNN shaped as MLPerf Tiny's keyword spotter: the flat input reshaped to
    49x10x1, a 10x4 stride-2 convolution (torch pads 4, 1: the 24x5 map; :func:`tf_same`
    makes it TensorFlow's 25x5; ``zero_pad``: TensorFlow's pads written the way torch can,
    ``nn.ZeroPad2d`` in front of an unpadded convolution), one depthwise 3x3 + pointwise
    1x1 block (``blocks`` of them: MLPerf's has 4 of 64 channels), an average pool over the
    whole map, a Linear and Softmax; seeded, in eval mode."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    first = [nn.ZeroPad2d((1, 1, 4, 5)), nn.Conv2d(1, channels, (10, 4), 2)] if zero_pad \
        else [nn.Conv2d(1, channels, (10, 4), 2, (4, 1))]

    class DSCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(
                *first, nn.ReLU(),
                *[m for _ in range(blocks) for m in (
                    nn.Conv2d(channels, channels, 3, 1, 1, groups=channels), nn.ReLU(),
                    nn.Conv2d(channels, channels, 1), nn.ReLU())],
                nn.AvgPool2d((25 if zero_pad else 24, 5)), nn.Flatten(),
                nn.Linear(channels, classes))

        def forward(self, x):
            return torch.softmax(self.body(x.reshape(-1, 1, 49, 10)), dim=1)

    return DSCNN().eval()


def ds_cnn_qdq(tmp_path, *, padding: str = "pads", samples: int = 32, channels: int = 8,
               blocks: int = 1):
    """:func:`ds_cnn` exported by the legacy exporter (opset 17), its padding made
    TensorFlow's by :func:`tf_same` (``padding``: ``"pads"`` explicit, ``"SAME_UPPER"`` or
    ``"SAME_LOWER"``; ``"ZeroPad2d"``: torch's own Pad in front of the convolution;
    ``"torch"`` leaves torch's; ``channels`` and ``blocks`` as :func:`ds_cnn`), quantized by
    :func:`ort_quantize`:
    ``(float path, QDQ path, calibration inputs (samples, 1, 490))``."""
    import torch

    tag = f"ds_cnn_{padding}" + ("" if (channels, blocks) == (8, 1) else f"_{channels}x{blocks}")
    fp = str(tmp_path / f"{tag}_fp.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(ds_cnn(channels, zero_pad=padding == "ZeroPad2d", blocks=blocks),
                          (torch.zeros(1, *DS_CNN_SHAPE),), fp, dynamo=False,
                          opset_version=17, input_names=["x"], output_names=["y"])
    if padding not in ("torch", "ZeroPad2d"):
        tf_same(fp, auto_pad=None if padding == "pads" else padding)
    cal = np.random.default_rng(1).standard_normal((samples, 1) + DS_CNN_SHAPE)
    cal = cal.astype(np.float32)
    return fp, ort_quantize(fp, tmp_path / f"{tag}_qdq.onnx", cal), cal


def output_step(path) -> float:
    """The scale of the DequantizeLinear writing the first output of the QDQ model at
    ``path``: one step of its quantized result (onnxruntime's Softmax: 1/255)."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path))
    last = next(n for n in m.graph.node if n.output[0] == m.graph.output[0].name)
    return float(next(numpy_helper.to_array(t) for t in m.graph.initializer
                      if t.name == last.input[1]))


def paced_net(kind: str, *, size: int = 16, seed: int = 0):
    """A network whose layers run at different paces, for the latency model: ``(module in eval
    mode, input shape without the batch)``.

    ``"resnet"``: on ``(3, size, size)``, ResNet-8's shape at small scale: Conv 3x3 (8), Relu,
    a residual stack of two 3x3 convolutions (8) with an identity shortcut, one with the first
    convolution at stride 2 (16) and a 1x1 stride-2 projection shortcut, AvgPool over the
    whole map, Linear(16, 10). ``"conv1d"``: on ``(2, 4 * size)``: Conv1d(2->8, kernel 5,
    stride 2, pads 2), Relu, Conv1d(8->16, kernel 3, pads 1), Relu, MaxPool1d(2),
    Conv1d(16->16, kernel 3, pads 1), Relu, AvgPool1d over the whole map, Linear(16, 4).
    """
    import torch
    from torch import nn

    class Stack(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.a = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.ReLU())
            self.b = nn.Conv2d(cout, cout, 3, 1, 1)
            self.short = nn.Conv2d(cin, cout, 1, stride) if stride != 1 else nn.Identity()

        def forward(self, x):
            return nn.functional.relu(self.b(self.a(x)) + self.short(x))

    torch.manual_seed(seed)
    if kind == "resnet":
        net = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.ReLU(), Stack(8, 8, 1),
                            Stack(8, 16, 2), nn.AvgPool2d(size // 2), nn.Flatten(),
                            nn.Linear(16, 10))
        return net.eval(), (3, size, size)
    if kind == "conv1d":
        net = nn.Sequential(nn.Conv1d(2, 8, 5, 2, 2), nn.ReLU(), nn.Conv1d(8, 16, 3, 1, 1),
                            nn.ReLU(), nn.MaxPool1d(2), nn.Conv1d(16, 16, 3, 1, 1), nn.ReLU(),
                            nn.AvgPool1d(size), nn.Flatten(), nn.Linear(16, 4))
        return net.eval(), (2, 4 * size)
    raise ValueError(f"Kind must be 'resnet' or 'conv1d', not {kind!r}")


def paced_net_qdq(tmp_path, kind: str, *, size: int = 16, samples: int = 32):
    """:func:`paced_net` exported by the legacy exporter (opset 17) and quantized by
    :func:`ort_quantize`: ``(QDQ path, input shape without the batch)``."""
    import torch

    net, shape = paced_net(kind, size=size)
    fp = str(tmp_path / f"paced_{kind}_{size}_fp.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.zeros(1, *shape),), fp, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"])
    cal = np.random.default_rng(1).standard_normal((samples, 1) + shape).astype(np.float32)
    return ort_quantize(fp, tmp_path / f"paced_{kind}_{size}_qdq.onnx", cal), shape
