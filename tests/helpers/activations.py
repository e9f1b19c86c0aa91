"""Models with an elementwise activation between two dense layers, as exporters write them:
onnx.helper reproductions, onnxruntime ``quantize_static`` (QDQ) of them, and torch exports.

Nothing here needs ../shared: every model is made from a fixed seed.
"""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["ACTIVATIONS", "act_mlp", "ort_qdq", "TORCH_ACTIVATIONS", "torch_act_mlp",
           "two_activation_mlp", "act_cnn"]

SIZES = (8, 6, 4)


def _nodes(op, **attrs):
    return lambda: ([helper.make_node(op, ["h"], ["a"], **attrs)], [])


def _chain(*ops):
    """``h -> ops[0] -> ops[1] -> ... -> a``; an op is a name or ``(name, constant)`` (a
    binary operator with a constant second input)."""
    def make():
        nodes, inits, t = [], [], "h"
        for k, op in enumerate(ops):
            out = "a" if k == len(ops) - 1 else f"t{k}"
            if isinstance(op, tuple):
                name, value = op
                c = f"c{k}"
                inits.append(numpy_helper.from_array(np.asarray(value, np.float32), c))
                nodes.append(helper.make_node(name, [t, c], [out]))
            else:
                nodes.append(helper.make_node(op, [t], [out]))
            t = out
        return nodes, inits
    return make


def _silu():
    return [helper.make_node("Sigmoid", ["h"], ["s"]),
            helper.make_node("Mul", ["h", "s"], ["a"])], []


def _prelu():
    slope = np.linspace(-0.3, 0.4, SIZES[1]).astype(np.float32)
    return [helper.make_node("PRelu", ["h", "slope"], ["a"])], \
        [numpy_helper.from_array(slope, "slope")]


#: name -> (opset, nodes and initializers from ``h`` to ``a``, monotonic)
ACTIVATIONS = {
    "Sigmoid": (13, _nodes("Sigmoid"), True),
    "Tanh": (13, _nodes("Tanh"), True),
    "HardSigmoid": (13, _nodes("HardSigmoid", alpha=0.25, beta=0.4), True),
    "HardSwish": (14, _nodes("HardSwish"), False),
    "Gelu": (20, _nodes("Gelu"), False),
    "Gelu-tanh": (20, _nodes("Gelu", approximate="tanh"), False),
    "Erf": (13, _nodes("Erf"), True),
    "Elu": (13, _nodes("Elu", alpha=0.7), True),
    "Selu": (13, _nodes("Selu"), True),
    "Softplus": (13, _nodes("Softplus"), True),
    "Softsign": (13, _nodes("Softsign"), True),
    "Mish": (18, _nodes("Mish"), False),
    "SiLU": (13, _silu, False),
    "Exp": (13, _nodes("Exp"), True),
    "Neg": (13, _nodes("Neg"), True),
    "Abs": (13, _nodes("Abs"), False),
    "Softplus-Log": (13, _chain("Softplus", "Log"), True),
    "Abs-Sqrt": (13, _chain("Abs", "Sqrt"), False),
    "Reciprocal": (13, _chain("Abs", ("Add", 1.0), "Reciprocal"), False),
    "PRelu": (16, _prelu, False),
    "Min": (13, _chain(("Min", 0.5)), True),
    "Max": (13, _chain(("Max", -0.25)), True),
    "Sub": (13, _chain(("Sub", 0.3), "Tanh"), True),
    "Pow": (13, _chain(("Pow", 2.0)), False),
    "Sigmoid-Tanh": (13, _chain("Sigmoid", "Tanh"), True),
}


def act_mlp(name, *, seed=0):
    """``Gemm -> activation -> Gemm`` (8 -> 6 -> 4) with the activation ``name`` of
    :data:`ACTIVATIONS`, at its opset."""
    opset, make, _ = ACTIVATIONS[name]
    rng = np.random.default_rng(seed)
    a, b, c = SIZES
    w0 = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
    b0 = (rng.standard_normal(b) * 0.1).astype(np.float32)
    w1 = (rng.standard_normal((b, c)) / np.sqrt(b)).astype(np.float32)
    nodes, inits = make()
    nodes = [helper.make_node("Gemm", ["x", "W0", "B0"], ["h"], name="fc0")] + nodes + \
        [helper.make_node("Gemm", ["a", "W1"], ["y"], name="fc1")]
    for k, n in enumerate(nodes[1:-1]):
        n.name = n.name or f"act{k}"
    graph = helper.make_graph(
        nodes, "act_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", a])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", c])],
        [numpy_helper.from_array(w0, "W0"), numpy_helper.from_array(b0, "B0"),
         numpy_helper.from_array(w1, "W1")] + inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="onnx2fpga-tests")
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def ort_qdq(model_path, out_path, cal, *, activation="int8"):
    """quantize_static (QDQ, MinMax, int8 weights) of the model at ``model_path`` with the
    calibration inputs ``cal`` (``(samples, 1, features)``, fed one at a time)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    name = onnx.load(str(model_path)).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({name: c} for c in cal)

        def get_next(self):
            return next(self.it, None)

    types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8, "int16": QuantType.QInt16}
    quantize_static(str(model_path), str(out_path), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=types[activation], weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)
    return str(out_path)


#: torch.nn activation modules by name (constructed lazily: torch is optional).
TORCH_ACTIVATIONS = ("Sigmoid", "Tanh", "GELU", "GELU-tanh", "SiLU", "Hardswish",
                     "Hardsigmoid", "ELU", "SELU", "Softplus", "Softsign", "Mish", "PReLU")


def torch_act_mlp(name, path, *, dynamo=False, seed=0):
    """``Linear -> activation -> Linear`` (8 -> 6 -> 4) exported by torch (legacy exporter
    with ``dynamo=False``, else the dynamo one) to ``path``."""
    import torch
    nn = torch.nn
    torch.manual_seed(seed)
    acts = {"GELU-tanh": lambda: nn.GELU(approximate="tanh"),
            "PReLU": lambda: nn.PReLU(SIZES[1], init=0.2)}
    act = acts[name]() if name in acts else getattr(nn, name)()
    model = nn.Sequential(nn.Linear(SIZES[0], SIZES[1]), act,
                          nn.Linear(SIZES[1], SIZES[2])).eval()
    x = torch.zeros(1, SIZES[0])
    kw = {"dynamo": True} if dynamo else {"dynamo": False, "opset_version": 17}
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), input_names=["x"], output_names=["y"],
                          **kw)
    return str(path)


def two_activation_mlp(first="Gelu", second="Sigmoid", *, seed=0):
    """``Gemm -> first -> Gemm -> second -> Gemm`` (8 -> 6 -> 6 -> 4), opset 20."""
    rng = np.random.default_rng(seed)
    sizes = (8, 6, 6, 4)
    inits, nodes, t = [], [], "x"
    for k, (a, b) in enumerate(zip(sizes, sizes[1:])):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        bias = (rng.standard_normal(b) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{k}"), numpy_helper.from_array(bias, f"B{k}")]
        nodes.append(helper.make_node("Gemm", [t, f"W{k}", f"B{k}"], [f"h{k}"], name=f"fc{k}"))
        t = f"h{k}"
        if k < 2:
            op = (first, second)[k]
            nodes.append(helper.make_node(op, [t], [f"a{k}"], name=f"{op.lower()}{k}"))
            t = f"a{k}"
    graph = helper.make_graph(
        nodes, "two_act", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, ["N", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)],
                              producer_name="onnx2fpga-tests")
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def act_cnn(op="PRelu", *, seed=0):
    """``Conv 3x3 (2 -> 4) -> op -> Conv 1x1 (4 -> 3)`` on ``float32[N, 2, 6, 6]``, opset 16;
    a PRelu has one slope per channel (``(4, 1, 1)``)."""
    rng = np.random.default_rng(seed)
    w0 = (rng.standard_normal((4, 2, 3, 3)) / 4).astype(np.float32)
    b0 = (rng.standard_normal(4) * 0.1).astype(np.float32)
    w1 = (rng.standard_normal((3, 4, 1, 1)) / 2).astype(np.float32)
    inits = [numpy_helper.from_array(w0, "W0"), numpy_helper.from_array(b0, "B0"),
             numpy_helper.from_array(w1, "W1")]
    ins = ["h"]
    if op == "PRelu":
        slope = np.array([-0.2, 0.1, 0.3, 0.5], np.float32).reshape(4, 1, 1)
        inits.append(numpy_helper.from_array(slope, "slope"))
        ins.append("slope")
    nodes = [helper.make_node("Conv", ["x", "W0", "B0"], ["h"], name="conv0", pads=[1] * 4),
             helper.make_node(op, ins, ["a"], name="act"),
             helper.make_node("Conv", ["a", "W1"], ["y"], name="conv1")]
    graph = helper.make_graph(
        nodes, "act_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)],
                              producer_name="onnx2fpga-tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model
