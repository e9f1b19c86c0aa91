"""Fuzzing the frontend: mutated models end in a design or in one of our own errors.

The mutator works on valid seed models built here with onnx.helper: structural mutations
of the protobuf (types, shapes, data sizes, names, opsets, external data, subgraphs, ...)
and byte-level damage of the serialized file. Every mutant is written into a model folder
that also holds a valid external data file, a file outside the folder and a symbolic link
pointing at it, so that external-data mutations reach real files.

CI runs a few hundred derandomized examples; ``benchmarks/fuzz.py`` runs the same target on
10,000 and more mutants, each in a subprocess with a time limit.
"""

from __future__ import annotations

import os
import random
import time
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2fpga.errors import Onnx2FpgaError
from tests.helpers.models import float_mlp

__all__ = ["seed_models", "mutate", "make_folder", "run_frontend", "classify"]


# -- seed models -------------------------------------------------------------------------

def _qdq_mlp(sizes=(8, 6, 4), seed=0):
    """A QDQ MLP as onnxruntime's quantizer writes it, built directly (no onnxruntime)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(np.float32(0.05), "s_x"),
             numpy_helper.from_array(np.int8(0), "z_x")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["x_q"], name="q_in"),
             helper.make_node("DequantizeLinear", ["x_q", "s_x", "z_x"], ["x_dq"], name="dq_in")]
    t = "x_dq"
    for k, (a, b) in enumerate(zip(sizes, sizes[1:])):
        w = rng.integers(-127, 128, (a, b)).astype(np.int8)
        bias = rng.integers(-500, 500, b).astype(np.int32)
        inits += [numpy_helper.from_array(w, f"W{k}"),
                  numpy_helper.from_array(np.float32(0.01), f"s_w{k}"),
                  numpy_helper.from_array(np.int8(0), f"z_w{k}"),
                  numpy_helper.from_array(bias, f"B{k}"),
                  numpy_helper.from_array(np.float32(0.0005), f"s_b{k}"),
                  numpy_helper.from_array(np.int32(0), f"z_b{k}"),
                  numpy_helper.from_array(np.float32(0.1), f"s_y{k}"),
                  numpy_helper.from_array(np.int8(-128), f"z_y{k}")]
        nodes += [
            helper.make_node("DequantizeLinear", [f"W{k}", f"s_w{k}", f"z_w{k}"], [f"W{k}_dq"],
                             name=f"dq_w{k}"),
            helper.make_node("DequantizeLinear", [f"B{k}", f"s_b{k}", f"z_b{k}"], [f"B{k}_dq"],
                             name=f"dq_b{k}"),
            helper.make_node("Gemm", [t, f"W{k}_dq", f"B{k}_dq"], [f"h{k}"], name=f"fc{k}"),
            helper.make_node("QuantizeLinear", [f"h{k}", f"s_y{k}", f"z_y{k}"], [f"h{k}_q"],
                             name=f"q{k}"),
            helper.make_node("DequantizeLinear", [f"h{k}_q", f"s_y{k}", f"z_y{k}"],
                             [f"h{k}_dq"], name=f"dq{k}"),
        ]
        t = f"h{k}_dq"
    graph = helper.make_graph(
        nodes, "qdq_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, sizes[0]])],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, sizes[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="onnx2fpga-fuzz")
    model.ir_version = 8
    return model


def _with_function():
    """A float MLP whose Relu is a model-local function."""
    m = float_mlp((8, 6, 4), softmax=False)
    for n in m.graph.node:
        if n.op_type == "Relu":
            n.op_type, n.domain = "MyRelu", "local"
    fn = helper.make_function("local", "MyRelu", ["a"], ["b"],
                              [helper.make_node("Relu", ["a"], ["b"])],
                              [helper.make_opsetid("", 13)])
    m.functions.append(fn)
    m.opset_import.append(helper.make_opsetid("local", 1))
    return m


def _external(m):
    """The first initializer moved to ``w.bin`` in the model folder."""
    m = _copy(m)
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    del t.float_data[:]
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="w.bin")
    return m


def _legacy():
    """IR 3, opset 6 (converted on load), every weight also a graph input."""
    m = float_mlp((8, 6, 4), opset=13, softmax=False)
    for n in m.graph.node:
        if n.op_type == "Gemm":
            n.attribute.append(helper.make_attribute("broadcast", 1))
    m.opset_import[0].version = 6
    m.ir_version = 3
    for t in m.graph.initializer:
        m.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return m


def _sparse_and_constant():
    """W0 as a sparse initializer, W1 as a Constant node."""
    m = float_mlp((8, 6, 4), softmax=False)
    w0, w1 = m.graph.initializer[0], m.graph.initializer[2]
    dense = numpy_helper.to_array(w0)
    idx = np.flatnonzero(np.abs(dense) > 0.1).astype(np.int64)
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(dense.reshape(-1)[idx], "W0"), numpy_helper.from_array(idx),
        [8, 6]))
    m.graph.node.insert(0, helper.make_node("Constant", [], ["W1"], value=w1))
    m.graph.initializer.remove(w0)
    m.graph.initializer.remove(w1)
    return m


def _int4_qdq():
    m = _qdq_mlp()
    m.ir_version, m.opset_import[0].version = 10, 21
    for name in ("W0", "z_w0"):
        t = [x for x in m.graph.initializer if x.name == name][0]
        arr = np.clip(numpy_helper.to_array(t), -8, 7)
        t.CopyFrom(helper.make_tensor(name, TensorProto.INT4, list(t.dims), arr.reshape(-1)))
    return m


def seed_models():
    """Valid models, each compiling to a design (with calibration when float)."""
    return [float_mlp((8, 6, 4), softmax=False), float_mlp((8, 6, 4), kind="matmul"),
            _qdq_mlp(), _with_function(), _external(float_mlp((8, 6, 4), softmax=False)),
            _legacy(), _sparse_and_constant(), _int4_qdq()]


def _copy(m):
    c = onnx.ModelProto()
    c.CopyFrom(m)
    return c


def make_folder(root) -> str:
    """``root/model/`` with ``w.bin`` (the seeds' external weights), a symlink pointing at
    ``root/outside.bin``; returns the model folder."""
    root = os.fspath(root)
    folder = os.path.join(root, "model")
    os.makedirs(folder, exist_ok=True)
    w = numpy_helper.to_array(float_mlp((8, 6, 4), softmax=False).graph.initializer[0])
    with open(os.path.join(folder, "w.bin"), "wb") as f:
        f.write(w.tobytes())
    with open(os.path.join(root, "outside.bin"), "wb") as f:
        f.write(w.tobytes() * 4)
    link = os.path.join(folder, "link.bin")
    if not os.path.lexists(link):
        os.symlink(os.path.join(root, "outside.bin"), link)
    return folder


# -- the mutator --------------------------------------------------------------------------

_OPS = ["Relu", "Gemm", "MatMul", "Add", "Softmax", "Reshape", "Flatten", "Clip", "Identity",
        "QuantizeLinear", "DequantizeLinear", "Constant", "If", "Loop", "Scan", "Conv",
        "Transpose", "Cast", "Squeeze", "Unsqueeze", "Sigmoid", "NoSuchOp", "ConstantOfShape",
        "Expand", "Tile", "Concat", "ArgMax", "Div", "Mul"]
_DIMS = [-1, -7, 0, 1, 2, 3, 5, 8, 1 << 20, 1 << 31, 1 << 40, 10 ** 12, (1 << 63) - 1]
_LOCATIONS = ["w.bin", "../outside.bin", "link.bin", "/etc/passwd", "a/../../outside.bin",
              "missing.bin", "", ".", "w.bin/../w.bin", "/dev/zero", "w.bin\0x"]
_INTS = [-1, 0, 1, 2, 3, 7, 13, 255, 1 << 31, -(1 << 63)]


def _pick_value_info(m, rng):
    g = m.graph
    vis = list(g.input) + list(g.output) + list(g.value_info)
    return rng.choice(vis) if vis else None


def _all_values(m):
    g = m.graph
    names = [i.name for i in g.input] + [t.name for t in g.initializer]
    names += [o for n in g.node for o in n.output]
    return names or ["x"]


def _random_attr(rng, names):
    A = onnx.AttributeProto
    kind = rng.choice(["int", "float", "ints", "str", "tensor", "graph", "bad", "floats"])
    name = rng.choice(names)
    if kind == "int":
        return helper.make_attribute(name, rng.choice(_INTS))
    if kind == "float":
        return helper.make_attribute(name, rng.choice([0.0, -1.0, 1e38, float("nan"), 2.5]))
    if kind == "floats":
        return helper.make_attribute(name, [rng.random() for _ in range(rng.randint(0, 4))])
    if kind == "ints":
        return helper.make_attribute(name, [rng.choice(_INTS) for _ in range(rng.randint(0, 4))])
    if kind == "str":
        return helper.make_attribute(name, rng.choice(["", "NOTSET", "SAME_UPPER", "\xff"]))
    if kind == "tensor":
        return helper.make_attribute(name, numpy_helper.from_array(
            np.arange(rng.randint(0, 5), dtype=np.float32)))
    if kind == "graph":
        body = helper.make_graph([helper.make_node("Identity", ["a"], ["b"])], "body",
                                 [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])],
                                 [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])])
        return helper.make_attribute(name, body)
    a = A(name=name, type=rng.randint(0, 14))
    if rng.random() < 0.5:
        a.i = rng.choice(_INTS)
    return a


def _mutate_tensor(t, rng):
    r = rng.randrange(9)
    if r == 0:
        t.data_type = rng.randrange(0, 31)
    elif r == 1:
        del t.dims[:]
        t.dims.extend(rng.choice(_DIMS) for _ in range(rng.randint(0, 3)))
    elif r == 2 and t.raw_data:
        cut = rng.randint(0, len(t.raw_data) + 8)
        t.raw_data = (t.raw_data + os.urandom(8))[:cut]
    elif r == 3:
        data = numpy_helper.to_array(t) if rng.random() < 0.5 and t.data_type == 1 else None
        t.ClearField("raw_data")
        if data is not None:
            t.float_data.extend(data.reshape(-1).tolist()[: rng.randint(0, data.size + 1)])
        else:
            t.int32_data.extend(rng.randrange(-300, 300) for _ in range(rng.randint(0, 9)))
    elif r == 4:
        t.data_location = rng.choice([TensorProto.EXTERNAL, TensorProto.DEFAULT])
        t.ClearField("raw_data")
        for key, val in (("location", rng.choice(_LOCATIONS)),
                         ("offset", rng.choice(["0", "4", "-8", "x", "1e3", str(1 << 40)])),
                         ("length", rng.choice(["", "24", "-1", "100000", str(1 << 62)])),
                         ("checksum", rng.choice(["", "0" * 40]))):
            if rng.random() < (0.95 if key == "location" else 0.4):
                t.external_data.add(key=key, value=val)
    elif r == 5:
        t.name = rng.choice(["", "x", "h0", "W0", t.name + "_"])
    elif r == 6:
        t.segment.begin, t.segment.end = 0, 1
    elif r == 7:
        t.raw_data = os.urandom(rng.randint(0, 64))
    else:
        t.data_type = rng.choice([10, 16, 17, 19, 21, 22, 23, 25, 26, 27, 8, 14, 11, 9])
        n = int(np.prod(t.dims)) if len(t.dims) and all(0 <= d < 4096 for d in t.dims) else 1
        try:
            dt = helper.tensor_dtype_to_np_dtype(t.data_type)
            if t.data_type == TensorProto.STRING:
                t.ClearField("raw_data")
                t.string_data.extend([b"s"] * n)
            else:
                src = np.ones(n, np.float32) if t.data_type not in (14,) else np.ones(n)
                t.raw_data = numpy_helper.from_array(src.astype(dt)).raw_data
        except (KeyError, ValueError, TypeError):
            pass


def _mutate_structure(m, rng):
    g = m.graph
    r = rng.randrange(24)
    values = _all_values(m)
    if r == 0 and g.initializer:
        _mutate_tensor(rng.choice(g.initializer), rng)
    elif r == 1:
        vi = _pick_value_info(m, rng)
        if vi is not None and vi.type.HasField("tensor_type"):
            tt = vi.type.tensor_type
            if rng.random() < 0.2:
                tt.elem_type = rng.randrange(0, 31)
            elif rng.random() < 0.2:
                tt.ClearField("shape")
            else:
                dims = list(tt.shape.dim)
                if dims:
                    d = rng.choice(dims)
                    if rng.random() < 0.6:
                        d.dim_value = rng.choice(_DIMS)
                    else:
                        d.dim_param = rng.choice(["N", "M", "", "*", "batch size!"])
                else:
                    tt.shape.dim.add().dim_value = rng.choice(_DIMS)
    elif r == 2 and g.node:
        n = rng.choice(g.node)
        n.op_type = rng.choice(_OPS)
    elif r == 3 and g.node:
        n = rng.choice(g.node)
        if n.input:
            n.input[rng.randrange(len(n.input))] = rng.choice(values + ["", "nowhere"])
        else:
            n.input.append(rng.choice(values))
    elif r == 4 and g.node:
        n = rng.choice(g.node)
        if n.output:
            n.output[rng.randrange(len(n.output))] = rng.choice(values + [""])
    elif r == 5 and g.node:
        del g.node[rng.randrange(len(g.node))]
    elif r == 6 and g.node:
        g.node.append(rng.choice(g.node))
    elif r == 7 and len(g.node) > 1:
        i, j = rng.sample(range(len(g.node)), 2)
        a, b = _copy_node(g.node[i]), _copy_node(g.node[j])
        g.node[i].CopyFrom(b)
        g.node[j].CopyFrom(a)
    elif r == 8 and g.node:
        n = rng.choice(g.node)
        if n.attribute and rng.random() < 0.4:
            del n.attribute[rng.randrange(len(n.attribute))]
        else:
            n.attribute.append(_random_attr(rng, ["axis", "transB", "alpha", "to", "perm",
                                                  "value", "body", "then_branch", "bogus",
                                                  "block_size", "saturate", "min"]))
    elif r == 9:
        m.ir_version = rng.choice([0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 13, 14, 15, 99,
                                   (1 << 63) - 1])
    elif r == 10 and m.opset_import:
        o = rng.choice(m.opset_import)
        if rng.random() < 0.7:
            o.version = rng.choice([0, 1, 5, 6, 7, 9, 10, 11, 12, 13, 17, 19, 21, 23, 28, 29,
                                    1000, -1])
        else:
            o.domain = rng.choice(["", "ai.onnx", "ai.onnx.ml", "com.microsoft", "x"])
    elif r == 11:
        g.output.append(helper.make_tensor_value_info(rng.choice(values), TensorProto.FLOAT,
                                                      [1, rng.choice(_DIMS)]))
    elif r == 12 and g.input:
        del g.input[rng.randrange(len(g.input))]
    elif r == 13 and g.output:
        del g.output[rng.randrange(len(g.output))]
    elif r == 14 and g.initializer:
        t = g.initializer[rng.randrange(len(g.initializer))]
        arr = numpy_helper.to_array(t) if t.data_type == 1 else np.zeros(3, np.float32)
        flat = arr.reshape(-1)
        nz = np.flatnonzero(flat)[: rng.randint(0, 6)]
        idx = nz.copy()
        if rng.random() < 0.3 and idx.size:
            idx[0] = rng.choice([-1, flat.size, 1 << 40])
        sp = helper.make_sparse_tensor(numpy_helper.from_array(flat[nz], t.name),
                                       numpy_helper.from_array(idx.astype(np.int64)),
                                       list(arr.shape))
        g.sparse_initializer.append(sp)
        if rng.random() < 0.7:
            g.initializer.remove(t)
    elif r == 15:
        op = rng.choice(["If", "Loop", "Scan"])
        n = helper.make_node(op, [rng.choice(values)], [f"cf{rng.randrange(99)}"])
        n.attribute.append(_random_attr(random.Random(1), ["body"]))
        n.attribute[-1].name = {"If": "then_branch"}.get(op, "body")
        g.node.insert(rng.randrange(len(g.node) + 1), n)
    elif r == 16:
        key = rng.choice(["model_license", "model_author", "k", "k"])
        m.metadata_props.add(key=key, value=rng.choice(["MIT", "", "\u00e9\u4e2d", "x" * 300]))
    elif r == 17:
        m.doc_string = rng.choice(["", "*/ `timescale", "\x00\x01", "# title\n\nbody"])
        m.model_version = rng.choice(_INTS + [(1 << 48) | (2 << 32) | 3])
    elif r == 18 and g.node:
        # a cycle: a node reads the output of a node after it
        i = rng.randrange(len(g.node))
        later = [o for n in g.node[i:] for o in n.output]
        if later and g.node[i].input:
            g.node[i].input[0] = rng.choice(later)
    elif r == 19:
        c = helper.make_node("Constant", [], [rng.choice(values + ["c0"])])
        kind = rng.choice(["value_float", "value_ints", "value_string", "sparse_value",
                           "value"])
        if kind == "value_float":
            c.attribute.append(helper.make_attribute(kind, 1.5))
        elif kind == "value_ints":
            c.attribute.append(helper.make_attribute(kind, [1, -1]))
        elif kind == "value_string":
            c.attribute.append(helper.make_attribute(kind, "s"))
        elif kind == "sparse_value":
            c.attribute.append(helper.make_attribute(kind, helper.make_sparse_tensor(
                numpy_helper.from_array(np.float32([1, 2])),
                numpy_helper.from_array(np.int64([0, rng.choice([1, 5, -1])])), [3])))
        else:
            t = numpy_helper.from_array(np.ones((2, 2), np.float32))
            _mutate_tensor(t, rng)
            c.attribute.append(helper.make_attribute(kind, t))
        g.node.insert(rng.randrange(len(g.node) + 1), c)
    elif r == 20 and m.functions:
        fn = m.functions[0]
        if fn.node:
            fn.node[0].op_type = rng.choice(_OPS + ["MyRelu"])
            if rng.random() < 0.5:
                fn.node[0].domain = "local"
    elif r == 21:
        g.name = rng.choice(["", "g", "\u00e9"])
    elif r == 22:
        for t in g.initializer:
            if rng.random() < 0.5:
                _mutate_tensor(t, rng)
    else:
        g.value_info.append(helper.make_tensor_value_info(
            rng.choice(values), rng.choice([1, 7, 10, 16]),
            [rng.choice(_DIMS) for _ in range(rng.randint(0, 3))]))


def _copy_node(n):
    c = onnx.NodeProto()
    c.CopyFrom(n)
    return c


def mutate(model, rng: random.Random) -> bytes:
    """One mutant of ``model`` (a ModelProto) as file bytes: one to four structural
    mutations, then with probability 0.2 byte-level damage."""
    m = _copy(model)
    for _ in range(rng.randint(1, 4)):
        try:
            _mutate_structure(m, rng)
        except Exception:  # noqa: BLE001 - onnx.helper refused the mutation, not the target
            pass
    try:
        data = m.SerializeToString()
    except Exception:  # noqa: BLE001 - the mutator's own encoding limits, not the target
        data = model.SerializeToString()
    if rng.random() < 0.2:
        b = bytearray(data)
        kind = rng.randrange(4)
        if kind == 0 and b:
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind == 1:
            b = b[: rng.randrange(len(b) + 1)]
        elif kind == 2:
            pos = rng.randrange(len(b) + 1)
            b[pos:pos] = os.urandom(rng.randint(1, 32))
        else:
            b = bytearray(os.urandom(rng.randint(0, 256))) if rng.random() < 0.5 else b + b
        data = bytes(b)
    return data


# -- the target ---------------------------------------------------------------------------

def run_frontend(path, *, lenient=False, seed=0):
    """Load, quantize (float models, with calibration drawn for the input's shape) or take
    the QDQ model as is, lower and fold: the whole frontend of ``onnx2fpga.compile``.
    Returns the Design."""
    from onnx2fpga.frontend.load import load_model
    from onnx2fpga.frontend.lower import lower
    from onnx2fpga.frontend.qdq import normalize_qdq
    from onnx2fpga.frontend.quantize import is_quantized, quantize_graph
    from onnx2fpga.plan.fold import fold
    from onnx2fpga.steps import check_samples

    g = load_model(path, lenient=lenient)
    normalize_qdq(g)
    if not is_quantized(g):
        shape = g.tensors[g.inputs[0]].shape
        n = int(np.prod(shape)) if shape and all(isinstance(d, int) for d in shape) else 0
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((4,) + tuple(shape)) if 0 < n <= 4096 else \
            rng.standard_normal((4, 8))
        samples = check_samples(g, x.astype(np.float32), "Calibration data")
        quantize_graph(g, samples)
    design = lower(g, multiplier_bits=16)
    fold(design.dataflow)
    return design


def classify(path, **kw) -> str:
    """``"design"`` or the name of our error's class; any other exception propagates."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            try:
                run_frontend(path, **kw)
            except Onnx2FpgaError as e:
                if not str(e):
                    raise AssertionError(f"{type(e).__name__} without a message") from None
                return type(e).__name__
    return "design"


# -- tests --------------------------------------------------------------------------------

@pytest.mark.parametrize("index", range(8))
def test_seed_models_compile(tmp_path, index):
    folder = make_folder(tmp_path)
    path = os.path.join(folder, "m.onnx")
    with open(path, "wb") as f:
        f.write(seed_models()[index].SerializeToString())
    assert classify(path) == "design"


def test_fuzzed_models_end_in_a_design_or_our_error(tmp_path):
    """A fixed, derandomized sample of mutants (the benchmark runs many more)."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    folder = make_folder(tmp_path)
    seeds = seed_models()
    outcomes: dict[str, int] = {}

    @hypothesis.settings(max_examples=300, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(st.integers(0, 2 ** 32 - 1), st.booleans())
    def check(seed, lenient):
        rng = random.Random(seed)
        data = mutate(rng.choice(seeds), rng)
        path = os.path.join(folder, "m.onnx")
        with open(path, "wb") as f:
            f.write(data)
        t0 = time.monotonic()
        outcome = classify(path, lenient=lenient)
        assert time.monotonic() - t0 < 10, f"seed {seed} took over 10 s"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    check()
    # The mutants must reach every stage: some still compile, some fail in each stage.
    assert outcomes.get("design", 0) > 0, outcomes
    assert {"LoadError", "CheckError", "UnsupportedError"} <= set(outcomes), outcomes
