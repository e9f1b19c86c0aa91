"""Small ONNX models for the tests, built with onnx.helper and quantized by onnxruntime.

Nothing here needs ../shared: every model is made from a fixed seed.
"""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["float_mlp", "ort_qdq_mlp", "save"]


def float_mlp(sizes=(16, 12, 6), *, kind="gemm", opset=13, softmax=True, seed=0,
              trans_b=False):
    """A float MLP: Gemm (or MatMul + Add) layers with Relu between, optional Softmax."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    t = "x"
    for k, (a, b) in enumerate(zip(sizes, sizes[1:])):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        bias = (rng.standard_normal(b) * 0.1).astype(np.float32)
        if trans_b:
            w = np.ascontiguousarray(w.T)
        inits += [numpy_helper.from_array(w, f"W{k}"), numpy_helper.from_array(bias, f"B{k}")]
        if kind == "gemm":
            nodes.append(helper.make_node("Gemm", [t, f"W{k}", f"B{k}"], [f"h{k}"],
                                          name=f"fc{k}", transB=int(trans_b)))
        else:
            nodes.append(helper.make_node("MatMul", [t, f"W{k}"], [f"m{k}"], name=f"mm{k}"))
            nodes.append(helper.make_node("Add", [f"m{k}", f"B{k}"], [f"h{k}"], name=f"add{k}"))
        t = f"h{k}"
        if k < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [t], [f"r{k}"], name=f"relu{k}"))
            t = f"r{k}"
    if softmax:
        nodes.append(helper.make_node("Softmax", [t], ["y"], name="softmax", axis=-1))
        t = "y"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", sizes[0]])],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, ["N", sizes[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="onnx2fpga-tests")
    model.ir_version = 8 if opset < 21 else 10
    onnx.checker.check_model(model, full_check=True)
    return model


def save(model, path):
    onnx.save(model, str(path))
    return str(path)


def ort_qdq_mlp(tmp_path, *, sizes=(16, 12, 6), kind="gemm", opset=13, activation="int8",
                per_channel=False, seed=0, softmax=False):
    """quantize_static (QDQ, MinMax) of :func:`float_mlp`; returns (path, calibration)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    rng = np.random.default_rng(seed + 100)
    cal = rng.standard_normal((128, 1, sizes[0])).astype(np.float32)
    fp = save(float_mlp(sizes, kind=kind, opset=opset, softmax=softmax, seed=seed),
              tmp_path / f"fp_{kind}_{opset}.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"x": c} for c in cal)

        def get_next(self):
            return next(self.it, None)

    q = str(tmp_path / f"qdq_{kind}_{opset}_{activation}_{int(per_channel)}.onnx")
    quantize_static(fp, q, Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8 if activation == "int8" else
                    QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=per_channel,
                    calibrate_method=CalibrationMethod.MinMax)
    return q, cal
