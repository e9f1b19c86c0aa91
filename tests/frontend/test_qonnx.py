"""QONNX quantizers (Quant, BipolarQuant, Trunc) and the QCDQ pattern, judged against the
``qonnx`` package's executor (and onnxruntime for QCDQ). Every model is built here with
onnx.helper from a fixed seed; nothing reads ../shared."""

import re
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx2fpga
from onnx2fpga.errors import CheckError, UnsupportedError
from onnx2fpga.frontend.load import Onnx2FpgaWarning, load_model
from onnx2fpga.frontend.lower import lower
from onnx2fpga.frontend.qdq import normalize_qdq
from onnx2fpga.frontend.qonnx import normalize_qonnx
from onnx2fpga.frontend.quantize import is_quantized
from onnx2fpga.frontend.resolve import resolve_geometry
from onnx2fpga.ir.stages import ThresholdStage
from onnx2fpga.ir.types import IntType
from onnx2fpga.sim import host
from onnx2fpga.sim.model import run_design

QDOM = "qonnx.custom_op.general"
DOMAINS = ["qonnx.custom_op.general", "onnx.brevitas", "finn.custom_op.general"]


# -- model building ----------------------------------------------------------------------------

class Builder:
    def __init__(self, domain=QDOM):
        self.nodes, self.inits, self.domain = [], [], domain

    def const(self, name, value, dtype=np.float32):
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def quant(self, x, out, scale, zp, bits, *, signed=1, narrow=0, rounding="ROUND"):
        ins = [x, self.const(f"{out}_s", scale), self.const(f"{out}_z", zp),
               self.const(f"{out}_b", bits)]
        self.nodes.append(helper.make_node("Quant", ins, [out], name=out, domain=self.domain,
                                           signed=signed, narrow=narrow,
                                           rounding_mode=rounding))
        return out

    def bipolar(self, x, out, scale):
        self.nodes.append(helper.make_node("BipolarQuant", [x, self.const(f"{out}_s", scale)],
                                           [out], name=out, domain=self.domain))
        return out

    def node(self, op, ins, out, **attrs):
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def model(self, in_shape, out, out_shape, *, declare=True, qonnx_opset=1):
        g = helper.make_graph(self.nodes, "qonnx_test",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT,
                                                             out_shape)], self.inits)
        opsets = [helper.make_opsetid("", 13)]
        if declare:
            opsets.append(helper.make_opsetid(self.domain, qonnx_opset))
        m = helper.make_model(g, opset_imports=opsets, producer_name="onnx2fpga-tests")
        m.ir_version = 8
        return m


def _act_scale(v, bits, signed):
    top = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
    return np.float32(max(float(np.abs(v).max()), 1e-3) / max(top, 1))


def qonnx_mlp(sizes=(12, 10, 8, 6), *, wbits=4, wsigned=True, narrow=0, per_channel=False,
              abits=4, bn=True, relu=True, transpose=False, bipolar=False, domain=QDOM,
              declare=True, seed=0):
    """A TFC-like MLP: Quant on the input, on every weight and after every layer (a
    BatchNormalization and Relu between MatMul and the activation's Quant); the last layer
    ends in an 8-bit signed Quant. ``bipolar``: BipolarQuant input, weights and hidden
    activations (some BatchNormalization scales negative). Scales come from a float pass on
    random data so that the integers use their range."""
    rng = np.random.default_rng(seed)
    calib = rng.standard_normal((256, sizes[0])).astype(np.float32)
    b = Builder(domain)
    if bipolar:
        t = b.bipolar("x", "xq", 1.0)
        v = np.where(calib >= 0, 1.0, -1.0).astype(np.float32)
    else:
        s = _act_scale(calib, 8, True)
        t = b.quant("x", "xq", s, 0, 8)
        v = np.clip(np.rint(calib / s), -128, 127) * s
    for k, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        last = k == len(sizes) - 2
        w = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
        if bipolar:
            wq = b.bipolar(b.const(f"W{k}", w if transpose else w.T), f"wq{k}", 1.0)
            wv = np.where(w >= 0, 1.0, -1.0)
        else:
            top = (1 << (wbits - 1)) - 1 if wsigned else (1 << wbits) - 1 - narrow
            amax = np.abs(w).max(axis=1, keepdims=True) if per_channel else np.abs(w).max()
            scale = (amax / max(top, 1) * (1.0 if wsigned else 2.0)).astype(np.float32)
            zp = 0 if wsigned or wbits == 1 else 1 << (wbits - 1)
            if not transpose:
                scale = scale.T if per_channel else scale
            wq = b.quant(b.const(f"W{k}", w if transpose else w.T), f"wq{k}", scale, zp, wbits,
                         signed=int(wsigned), narrow=narrow)
            s_w = scale if transpose else (scale.T if per_channel else scale)
            lo = (-(1 << (wbits - 1)) + narrow) if wsigned else 0
            hi = (1 << (wbits - 1)) - 1 if wsigned else (1 << wbits) - 1 - narrow
            wv = (np.clip(np.rint(w / s_w + zp), lo, hi) - zp) * s_w
        if transpose:
            wq = b.node("Transpose", [wq], f"wt{k}", perm=[1, 0])
        t = b.node("MatMul", [t, wq], f"mm{k}")
        v = v @ wv.T
        if bn and not last:
            gamma = rng.uniform(0.5, 1.5, n_out) * (rng.choice([-1, 1], n_out) if bipolar else 1)
            beta, mean = rng.standard_normal(n_out) * 0.2, v.mean(axis=0)
            var = v.var(axis=0) + 0.1
            ins = [t] + [b.const(f"bn{k}_{p}", a) for p, a in
                         (("g", gamma), ("b", beta), ("m", mean), ("v", var))]
            t = b.node("BatchNormalization", ins, f"bn{k}")
            v = (v - mean) / np.sqrt(var + 1e-5) * gamma + beta
        if last:
            t = b.quant(t, "y", _act_scale(v, 8, True), 0, 8)
        elif bipolar:
            t = b.bipolar(t, f"a{k}", 0.5)
            v = np.where(v >= 0, 0.5, -0.5)
        else:
            if relu:
                t = b.node("Relu", [t], f"r{k}")
                v = np.maximum(v, 0)
            s = _act_scale(v, abits, not relu)
            t = b.quant(t, f"a{k}", s, 0, abits, signed=int(not relu))
            v = np.clip(np.rint(v / s), 0 if relu else -(1 << (abits - 1)),
                        ((1 << abits) - 1) if relu else (1 << (abits - 1)) - 1) * s
    return b.model([1, sizes[0]], "y", [1, sizes[-1]], declare=declare)


def qonnx_reference(model, x):
    """The qonnx package's executor, one sample at a time."""
    pytest.importorskip("qonnx")
    from qonnx.core.modelwrapper import ModelWrapper
    from qonnx.core.onnx_exec import execute_onnx
    from qonnx.util.cleanup import cleanup_model

    m = ModelWrapper(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = cleanup_model(m)
    name_in, name_out = m.graph.input[0].name, m.graph.output[0].name
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    return np.stack([execute_onnx(m, {name_in: xi.reshape(shape)})[name_out] for xi in x])


def _initializer(model, name):
    return float(numpy_helper.to_array(next(t for t in model.graph.initializer
                                            if t.name == name)))


def _lowered(model, lenient=False):
    g = load_model(model, lenient=lenient)
    normalize_qdq(g)
    normalize_qonnx(g)
    resolve_geometry(g)
    return lower(g, multiplier_bits=24)


def _agreement(got, ref, step):
    """(fraction of outputs equal to the reference, largest difference in output steps)."""
    diff = np.abs(np.asarray(got, np.float64) - np.asarray(ref, np.float64)) / step
    return float(np.mean(diff < 1e-3)), float(diff.max())


# -- single quantizers against the qonnx executor ---------------------------------------------

def _ties(scale, shape, rng):
    """Values x / scale that are exact halves (ties), integers and random, both signs."""
    k = rng.integers(-20, 20, size=shape).astype(np.float32)
    frac = rng.choice(np.float32([0.0, 0.5, 0.25, 0.75]), size=shape)
    return ((k + frac) * scale).astype(np.float32)


# (bits, signed, narrow, rounding, per_channel, zero point)
QUANT_CASES = [
    (8, 1, 0, "ROUND", False, 0), (8, 1, 1, "ROUND", True, 0), (8, 0, 0, "ROUND", False, 4),
    (4, 1, 1, "FLOOR", True, 0), (4, 0, 1, "CEIL", False, 5), (3, 1, 0, "DOWN", False, 0),
    (3, 0, 0, "HALF_UP", True, 0), (2, 1, 1, "HALF_EVEN", False, 0), (2, 0, 0, "FLOOR", False, 1),
    (1, 1, 0, "ROUND", False, 0), (1, 0, 0, "ROUND", True, 0), (16, 1, 0, "CEIL", True, -300),
    (5, 1, 0, "DOWN", False, 0), (6, 0, 1, "ROUND", False, 0), (7, 0, 0, "FLOOR", False, 3),
]


@pytest.mark.parametrize("bits,signed,narrow,rounding,per_channel,zp", QUANT_CASES)
def test_quant_matches_qonnx_on_activations_and_constants(bits, signed, narrow, rounding,
                                                          per_channel, zp):
    rng = np.random.default_rng(bits * 7 + signed)
    scale = (rng.uniform(0.05, 0.4, (1, 5)) if per_channel else np.float32(0.125)) \
        .astype(np.float32)
    b = Builder()
    b.quant("x", "qx", scale, zp, bits, signed=signed, narrow=narrow, rounding=rounding)
    w = b.const("w", _ties(scale, (3, 5), rng))
    b.quant(w, "qw", scale, zp, bits, signed=signed, narrow=narrow, rounding=rounding)
    b.node("Add", ["qx", "qw"], "y")
    model = b.model([3, 5], "y", [3, 5])
    x = np.stack([_ties(scale, (3, 5), rng) for _ in range(6)])
    g = load_model(model)
    normalize_qdq(g)
    normalize_qonnx(g)
    assert [n.op for n in g.nodes] == ["QuantizeLinear", "DequantizeLinear", "DequantizeLinear",
                                       "Add"]
    got = np.stack([host.run_nodes(g.nodes, {"x": xi}, g.constants)["y"] for xi in x])
    np.testing.assert_array_equal(got, qonnx_reference(model, x))


@pytest.mark.parametrize("per_channel", [False, True])
def test_bipolar_quant_matches_qonnx(per_channel):
    rng = np.random.default_rng(5)
    scale = (rng.uniform(0.5, 2, (1, 4)) if per_channel else np.float32(0.75)).astype(np.float32)
    b = Builder("onnx.brevitas")
    b.bipolar("x", "qx", scale)
    w = b.const("w", rng.standard_normal((2, 4)))
    b.bipolar(w, "qw", scale)
    b.node("Add", ["qx", "qw"], "y")
    model = b.model([2, 4], "y", [2, 4])
    x = rng.standard_normal((5, 2, 4)).astype(np.float32)
    x[0, 0, :2] = [0.0, -0.0]
    g = load_model(model)
    normalize_qdq(g)
    normalize_qonnx(g)
    weights = [g.constants[n.inputs[0]] for n in g.nodes if n.op == "DequantizeLinear"
               and n.inputs[0] in g.constants]
    assert len(weights) == 1 and set(np.unique(weights[0])) <= {-1, 1}
    got = np.stack([host.run_nodes(g.nodes, {"x": xi}, g.constants)["y"] for xi in x])
    np.testing.assert_array_equal(got, qonnx_reference(model, x))


# -- whole models: compile, golden model vs qonnx ---------------------------------------------

# (wbits, wsigned, narrow, per_channel, abits, bn, relu, transpose)
MLP_CASES = [
    (1, True, 0, False, 2, True, False, True),      # 1-bit signed weights are bipolar (TFC)
    (2, True, 1, False, 2, True, False, True),      # TFC_2W2A: narrow 2-bit everywhere
    (3, True, 1, True, 3, True, True, True),        # kwsmlp: per-channel 3-bit weights
    (4, False, 0, False, 4, True, True, False),     # unsigned weights with a zero point
    (6, True, 0, False, 6, False, True, False),     # qkeras jet tagger style, no BN
    (8, True, 1, True, 8, True, True, False),
    (5, False, 1, True, 3, False, False, True),
]


@pytest.mark.parametrize("wbits,wsigned,narrow,per_channel,abits,bn,relu,transpose", MLP_CASES)
def test_mlp_compiles_and_agrees_with_qonnx(tmp_path, wbits, wsigned, narrow, per_channel,
                                            abits, bn, relu, transpose):
    model = qonnx_mlp(wbits=wbits, wsigned=wsigned, narrow=narrow, per_channel=per_channel,
                      abits=abits, bn=bn, relu=relu, transpose=transpose, seed=wbits)
    x = np.random.default_rng(1).standard_normal((64, 1, 12)).astype(np.float32)
    design = onnx2fpga.compile(model, tmp_path / "d")
    got = design.simulate(x, engine="golden")
    ref = qonnx_reference(model, x)
    step = _initializer(model, "y_s")
    exact, worst = _agreement(got.reshape(ref.shape), ref, step)
    # Integer requantization with 24-bit multipliers against qonnx's float32 graph: the two
    # round differently only where a float32 result lies within a few ulp of a tie.
    assert worst <= 1 and exact >= 0.99, (exact, worst)
    dense = [ly for ly in design.design.dataflow.layers if type(ly).__name__ == "DenseLayer"]
    assert len(dense) == 3
    assert dense[1].in_type == IntType(abits, not relu)


def test_bipolar_mlp_lowers_to_thresholds_and_agrees_with_qonnx(tmp_path):
    model = qonnx_mlp(bipolar=True, seed=3)
    compiled = onnx2fpga.compile(model, tmp_path / "d")
    # The bipolar outputs go to threshold cores (hw.threshold) in the manifest's layers.
    assert [st for ly in compiled.manifest["layers"] for st in ly.get("requant", [])
            if "thresholds" in st] == [{"thresholds": 1, "per_channel": True, "base": -1,
                                        "step": 2, "clip": [-1, 1]}] * 2
    design = _lowered(model)
    stages = [st for ly in design.dataflow.layers for st in getattr(ly, "requant", [])]
    assert sum(isinstance(st, ThresholdStage) for st in stages) == 2
    assert design.dataflow.input.type == IntType(2, True)
    x = np.random.default_rng(2).standard_normal((64, 1, 12)).astype(np.float32)
    got = run_design(design, x)
    ref = qonnx_reference(model, x)
    step = _initializer(model, "y_s")
    exact, worst = _agreement(got.reshape(ref.shape), ref, step)
    assert worst <= 1 and exact >= 0.99, (exact, worst)


def _trunc_model(version, rounding, *, after="AveragePool", declare=True):
    """x -> 8-bit Quant -> [2x2 average pool -> Mul 4 | MatMul | nothing] -> Trunc."""
    b = Builder()
    s = np.float32(0.0625)
    t = b.quant("x", "xq", s, 0, 8, signed=1)
    if after == "AveragePool":
        t = b.node("AveragePool", [t], "pool", kernel_shape=[2, 2], strides=[2, 2])
        t = b.node("Mul", [t, b.const("four", 4.0)], "sum")
        in_bits, out_shape = 10, [1, 2, 3, 3]
    elif after == "MatMul":
        t = b.node("MatMul", [t, b.const("w", np.eye(6, dtype=np.float32))], "mm")
        in_bits, out_shape = 8, [1, 2, 6, 6]
    else:
        in_bits, out_shape = 8, [1, 2, 6, 6]
    ins = [t, b.const("ts", s), b.const("tz", 0.0), b.const("tib", in_bits)]
    if version == 2:
        ins.append(b.const("tos", s * 4))
    ins.append(b.const("tob", in_bits - 2))
    b.nodes.append(helper.make_node("Trunc", ins, ["y"], name="trunc", domain=QDOM,
                                    rounding_mode=rounding))
    return b.model([1, 2, 6, 6], "y", out_shape, declare=declare, qonnx_opset=version)


@pytest.mark.parametrize("version,rounding,after", [
    (1, "FLOOR", "AveragePool"), (2, "FLOOR", "AveragePool"), (2, "ROUND", "AveragePool"),
    (1, "CEIL", "AveragePool"), (2, "FLOOR", None), (1, "ROUND", None)])
def test_trunc_after_average_pool_or_alone_agrees_with_qonnx(tmp_path, version, rounding,
                                                             after):
    model = _trunc_model(version, rounding, after=after)
    design = onnx2fpga.compile(model, tmp_path / "d")
    rounds = [st.rounding for ly in design.design.dataflow.layers
              for st in getattr(ly, "requant", [])]
    want = {"FLOOR": "floor", "CEIL": "ceil", "ROUND": "half_even"}[rounding]
    assert rounds == [want]
    rng = np.random.default_rng(version)
    x = (rng.integers(-128, 128, (16, 1, 2, 6, 6)) * 0.0625).astype(np.float32)
    x[:8] += rng.uniform(-0.03, 0.03, x[:8].shape).astype(np.float32)   # off the input grid
    got = design.simulate(x, engine="golden")
    ref = qonnx_reference(model, x)
    np.testing.assert_array_equal(got.reshape(ref.shape), ref)


def test_trunc_after_matmul_is_refused_by_name():
    with pytest.raises(UnsupportedError, match=r"^Node 'trunc' \(QuantizeLinear, opset 13\): "
                                               r"a Trunc after MatMul is not supported \(only "
                                               r"after an average pool or on its own\)$"):
        _lowered(_trunc_model(2, "FLOOR", after="MatMul"))


# -- QCDQ -------------------------------------------------------------------------------------

def qcdq_mlp(seed=0, wclip=(-7, 7), aclip=(0, 15)):
    """QuantizeLinear -> Clip -> DequantizeLinear around weights (per channel, int8 zero
    points) and activations, as QONNX's QuantToQCDQ writes them."""
    rng = np.random.default_rng(seed)
    b = Builder()
    sizes = (10, 8, 6)

    def qcd(x, out, scale, zp, lo, hi, axis=None):
        kw = {} if axis is None else {"axis": axis}
        s_name = b.const(f"{out}_s", scale)
        z_name = b.const(f"{out}_z", zp, np.int8 if lo < 0 else np.uint8)
        q = b.node("QuantizeLinear", [x, s_name, z_name], f"{out}_q", **kw)
        c = b.node("Clip", [q, b.const(f"{out}_lo", lo, np.int8 if lo < 0 else np.uint8),
                            b.const(f"{out}_hi", hi, np.int8 if lo < 0 else np.uint8)],
                   f"{out}_c")
        return b.node("DequantizeLinear", [c, s_name, z_name], out, **kw)

    t = qcd("x", "xq", np.float32(0.05), np.int8(0), -127, 127)
    for k, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        sw = (np.abs(w).max(axis=0) / wclip[1]).astype(np.float32)
        wq = qcd(b.const(f"W{k}", w), f"wq{k}", sw, np.zeros(n_out, np.int8), *wclip, axis=1)
        t = b.node("MatMul", [t, wq], f"mm{k}")
        if k == 0:
            t = b.node("Relu", [t], "r0")
            t = qcd(t, "a0", np.float32(0.08), np.uint8(0), *aclip)
        else:
            t = qcd(t, "y", np.float32(0.05), np.int8(0), -127, 127)
    return b.model([1, sizes[0]], "y", [1, sizes[-1]], declare=False)


def test_qcdq_clips_fold_into_narrow_quantizers_and_agree_with_onnxruntime(tmp_path):
    import onnxruntime as ort

    model = qcdq_mlp()
    design = onnx2fpga.compile(model, tmp_path / "d")
    dense = [ly for ly in design.design.dataflow.layers if type(ly).__name__ == "DenseLayer"]
    # int8 Clip(-7, 7) weights are int4, uint8 Clip(0, 15) activations uint4.
    assert [ly.weight_type for ly in dense] == [IntType(4, True)] * 2
    assert dense[1].in_type == IntType(4, False)
    assert dense[0].requant[0].hi == 15
    x = np.random.default_rng(4).standard_normal((64, 1, 10)).astype(np.float32)
    got = design.simulate(x, engine="golden")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts)
    ref = np.concatenate([sess.run(None, {"x": xi})[0] for xi in x])
    exact, worst = _agreement(got.reshape(ref.shape), ref, 0.05)
    assert worst <= 1 and exact >= 0.99, (exact, worst)


def test_quantize_linear_of_a_constant_is_evaluated():
    g = load_model(qcdq_mlp())
    normalize_qdq(g)
    normalize_qonnx(g)
    ops = [n.op for n in g.nodes]
    assert "Clip" not in ops and ops.count("QuantizeLinear") == 3   # x, a0, y: no weight
    w = g.constants["wq0_c"]
    assert w.dtype == np.int8 and w.min() >= -7 and w.max() <= 7


# -- domains, declared and not ----------------------------------------------------------------

@pytest.mark.parametrize("domain", DOMAINS)
def test_every_domain_declared_or_lenient(domain):
    declared = qonnx_mlp(domain=domain, seed=1)
    bare = qonnx_mlp(domain=domain, declare=False, seed=1)
    assert not any(o.domain == domain for o in bare.opset_import)
    dom = re.escape(domain)
    with pytest.raises(CheckError, match=rf"^Node 'xq' \({dom}\.Quant\): domain '{dom}' is "
                                         rf"not declared in opset_import \(--lenient assumes "
                                         rf"version 1\)$"):
        load_model(bare)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        lenient = _lowered(bare, lenient=True)
    assert [str(r.message) for r in rec if issubclass(r.category, Onnx2FpgaWarning)] == \
        [f"ND-02: domain '{domain}' is used but not declared in opset_import; assumed "
         f"version 1"]
    x = np.random.default_rng(0).standard_normal((16, 1, 12)).astype(np.float32)
    np.testing.assert_array_equal(run_design(lenient, x), run_design(_lowered(declared), x))


def test_is_quantized_sees_qonnx_quantizers_before_normalization():
    g = load_model(qonnx_mlp())
    assert is_quantized(g)
    assert not any(n.op in ("QuantizeLinear", "DequantizeLinear") for n in g.nodes)


# -- refusals -----------------------------------------------------------------------------------

def _one_quant(**kw):
    b = Builder()
    args = dict(scale=np.float32(0.1), zp=0.0, bits=4)
    args.update({k: v for k, v in kw.items() if k in args})
    opts = {k: v for k, v in kw.items() if k not in args}
    b.quant("x", "q", args["scale"], args["zp"], args["bits"], **opts)
    b.node("Relu", ["q"], "y")
    return b.model([1, 4], "y", [1, 4])


@pytest.mark.parametrize("kw,message", [
    (dict(bits=2.5), r"bit width \[2\.5\] is not an integer"),
    (dict(bits=17), r"bit width 17 is not supported \(integers 1 to 16; up to 32 for a "
                    r"constant\)"),
    (dict(zp=0.5), r"zero point \[0\.5\] is not an integer"),
    (dict(rounding="UP"), r"rounding_mode 'UP' is not supported \(supported: ROUND, HALF_EVEN, "
                          r"HALF_UP, FLOOR, CEIL, DOWN\)"),
    (dict(zp=2.0, rounding="DOWN"), r"rounding_mode 'DOWN' with a non-zero zero point is not "
                                    r"supported \(the rounding would see the zero point\)"),
    (dict(scale=np.ones((2, 4), np.float32)), r"scale or zero point of shape \[2, 4\] varies "
                                              r"along more than one axis"),
])
def test_quant_parameters_are_refused_by_name(kw, message):
    g = load_model(_one_quant(**kw))
    normalize_qdq(g)
    with pytest.raises(UnsupportedError, match=rf"^Node 'q' \(qonnx\.custom_op\.general\.Quant, "
                                               rf"opset 1\): {message}$"):
        normalize_qonnx(g)


def test_non_constant_scale_is_refused_by_name():
    b = Builder()
    b.node("Abs", ["x"], "s")
    b.nodes.append(helper.make_node("Quant", ["x", "s", b.const("z", 0.0), b.const("b", 4.0)],
                                    ["y"], name="q", domain=QDOM, signed=1, narrow=0))
    g = load_model(b.model([1, 4], "y", [1, 4]))
    with pytest.raises(UnsupportedError, match=r"^Node 'q' \(qonnx\.custom_op\.general\.Quant, "
                                               r"opset 1\): scale 's' is not a constant$"):
        normalize_qonnx(g)
