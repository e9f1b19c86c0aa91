"""Integer and QOperator-form operators, rewritten into our QDQ form.

Two passes, one per form the operators arrive in:

* :func:`expand_contrib_qoperators` runs on the checked ModelProto, before shape inference
  (which knows only ai.onnx operators): onnxruntime's QOperator contrib operators of the
  ``com.microsoft`` domain become ``DequantizeLinear -> op -> QuantizeLinear`` with the same
  scale and zero-point tensors. Converted: QLinearAdd, QLinearAveragePool,
  QLinearGlobalAveragePool, QLinearConcat, QLinearLeakyRelu, QGemm and QLinearConv (as the
  ai.onnx operator); the others (QLinearSigmoid, QLinearMul, ...) are refused by name.
* :func:`normalize_qoperators` runs on our IR and rewrites the ai.onnx integer operators
  QLinearMatMul-10/21, QLinearConv-10, MatMulInteger-10 and ConvInteger-10 the same way
  (before :func:`~onnx2fpga.frontend.qdq.normalize_qdq`, which resolves the Q/DQ nodes made
  here like any other).

The QDQ form means the same thing as the integer operator whenever the requantization is
exact real arithmetic, which is what the lowering implements (a fixed-point multiplier per
channel): ``QLinearMatMul(a, b)`` is ``Q(DQ(a) @ DQ(b))`` with ``y_scale`` and
``y_zero_point``; QLinearConv's int32 bias is ``DQ(bias)`` on the scale ``x_scale * w_scale``
(per output channel), zero point 0.

MatMulInteger and ConvInteger produce the int32 accumulator itself. Only the static pattern
maps to hardware: ``A`` is the output of a QuantizeLinear with constant parameters (through
views), ``B`` a weight, and the int32 result is read by exactly one ``Cast`` to float (then
typically ``Mul`` by the accumulator's scale, a bias ``Add``, an activation and the next
QuantizeLinear, which the lowering folds into the requantization). It is rewritten as
``DQ(A; s_a, z_a)`` times ``DQ(B; 1 / s_a, b_zero_point)``, whose product is the accumulator
on the scale ``s_a * (1 / s_a)``, which is 1 to within one float32 ulp, and the ``Cast`` is
dropped. Dynamic quantization (``A`` from DynamicQuantizeLinear: the scale is computed at
run time), an ``a_zero_point`` other than the quantizer's and an int32 result used as an
integer are refused by node with the reason.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from .ir import Graph, Node, TensorInfo

__all__ = ["expand_contrib_qoperators", "normalize_qoperators", "QOP_OPS",
           "CONTRIB_CONVERTED", "CONTRIB_REFUSED"]

#: ai.onnx integer operators that :func:`normalize_qoperators` rewrites.
QOP_OPS = ("QLinearMatMul", "QLinearConv", "MatMulInteger", "ConvInteger")
#: com.microsoft QOperator ops :func:`expand_contrib_qoperators` rewrites into QDQ form.
CONTRIB_CONVERTED = ("QGemm", "QLinearAdd", "QLinearAveragePool", "QLinearConcat",
                     "QLinearConv", "QLinearGlobalAveragePool", "QLinearLeakyRelu")
#: com.microsoft QOperator ops refused, with the reason.
CONTRIB_REFUSED = {
    "QLinearMul": "a product of two activations has no hardware layer",
    "QLinearSigmoid": "a sigmoid has no hardware layer (only piecewise-linear activations)",
    "QLinearSoftmax": "a softmax has no hardware layer (run it on the host in float)",
    "QLinearReduceMean": "a mean over arbitrary axes has no hardware layer (only "
                         "GlobalAveragePool)",
    "QLinearWhere": "a select between activations has no hardware layer",
    "QLinearLookup": "a lookup table has no hardware layer",
    "QAttention": "attention has no hardware layer",
    "QEmbedLayerNormalization": "embedding and layer normalization have no hardware layer",
    "DynamicQuantizeMatMul": "dynamic quantization computes the activation scale at run time",
    "DynamicQuantizeLSTM": "dynamic quantization computes the activation scale at run time",
}

_VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose")
_FLOAT = 1       # TensorProto.FLOAT
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


# -- com.microsoft QOperator ops, on the ModelProto ---------------------------------------

class _Names:
    """Fresh tensor names that collide with nothing in the model."""

    def __init__(self, used):
        self.used = set(used)

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name = f"{base}_{k}"
            k += 1
        self.used.add(name)
        return name


def _proto_constants(g) -> dict:
    from onnx import numpy_helper

    out = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1:
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = numpy_helper.to_array(a.t)
    return out


def expand_contrib_qoperators(model) -> None:
    """Rewrite onnxruntime's com.microsoft QOperator ops of ``model`` (a checked ModelProto,
    in place) into ai.onnx QDQ form; see the module docstring.

    Raises
    ------
    UnsupportedError
        Listing every com.microsoft QOperator node that has no QDQ equivalent the lowering
        supports, or whose options cannot be expressed (channels-last layouts, ...).
    """
    from onnx import helper

    g = model.graph
    ms = [n for n in g.node if n.domain == "com.microsoft" and
          (n.op_type in CONTRIB_CONVERTED or n.op_type in CONTRIB_REFUSED)]
    if not ms:
        return
    opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version)
              for o in model.opset_import}
    opset = opsets.get("", 0)
    used = {i.name for i in g.input} | {o.name for o in g.output} | \
        {t.name for t in g.initializer} | {o for n in g.node for o in n.output} | \
        {i for n in g.node for i in n.input}
    ctx = _Contrib(g, opset, _Names(used), _proto_constants(g), helper)
    problems, nodes = [], []
    for k, n in enumerate(g.node):
        if not (n.domain == "com.microsoft" and
                (n.op_type in CONTRIB_CONVERTED or n.op_type in CONTRIB_REFUSED)):
            nodes.append(n)
            continue
        label = n.name or (n.output[0] if len(n.output) and n.output[0] else f"#{k}")
        where = (f"Node {label!r} (com.microsoft.{n.op_type}, opset "
                 f"{opsets.get('com.microsoft', 0)})")
        if n.op_type in CONTRIB_REFUSED:
            problems.append(f"{where}: not supported: {CONTRIB_REFUSED[n.op_type]}")
            continue
        try:
            nodes.extend(ctx.convert(n, label))
        except ValueError as e:
            problems.append(f"{where}: {e}")
    if problems:
        raise UnsupportedError(problems)
    del g.node[:]
    g.node.extend(nodes)
    for init in ctx.new_initializers:
        g.initializer.append(init)


class _Contrib:
    def __init__(self, g, opset, names, constants, helper):
        self.g, self.opset, self.names, self.constants = g, opset, names, constants
        self.helper = helper
        self.new_initializers = []

    def attrs(self, n) -> dict:
        return {a.name: self.helper.get_attribute_value(a) for a in n.attribute}

    def dq(self, x, s, z, label, role, axis=None):
        out = self.names(f"{x}__dq")
        kw = {} if axis is None else {"axis": axis}
        if axis is not None and self.opset < 13:
            raise ValueError(f"per-axis parameters of {role} need ai.onnx opset 13 or newer "
                             f"(the model imports {self.opset})")
        ins = [x, s] + ([z] if z else [])
        return self.helper.make_node("DequantizeLinear", ins, [out], name=f"{label}/dq_{role}",
                                     **kw), out

    def q(self, x, s, z, y, label):
        ins = [x, s] + ([z] if z else [])
        return self.helper.make_node("QuantizeLinear", ins, [y], name=f"{label}/q")

    def layout(self, attrs):
        if int(attrs.pop("channels_last", 0) or 0):
            raise ValueError("channels_last=1 is not supported (only NCHW tensors)")

    def const(self, name, what):
        if name not in self.constants:
            raise ValueError(f"{what} ({name!r}) must be a constant")
        return np.asarray(self.constants[name])

    def convert(self, n, label):
        ins = list(n.input) + [""] * 9
        out = n.output[0]
        attrs = self.attrs(n)
        op = n.op_type
        mk = self.helper.make_node
        if op == "QLinearConv":
            self.layout(attrs)
            return [mk("QLinearConv", list(n.input), list(n.output), name=n.name, **attrs)]
        if op == "QLinearAdd":
            da, ta = self.dq(ins[0], ins[1], ins[2], label, "a")
            db, tb = self.dq(ins[3], ins[4], ins[5], label, "b")
            t = self.names(f"{out}__add")
            return [da, db, mk("Add", [ta, tb], [t], name=f"{label}/add"),
                    self.q(t, ins[6], ins[7], out, label)]
        if op == "QLinearLeakyRelu":
            d, tx = self.dq(ins[0], ins[1], ins[2], label, "x")
            t = self.names(f"{out}__leaky_relu")
            return [d, mk("LeakyRelu", [tx], [t], name=f"{label}/leaky_relu",
                          alpha=float(attrs.get("alpha", 0.01))),
                    self.q(t, ins[3], ins[4], out, label)]
        if op in ("QLinearAveragePool", "QLinearGlobalAveragePool"):
            self.layout(attrs)
            d, tx = self.dq(ins[0], ins[1], ins[2], label, "x")
            t = self.names(f"{out}__pool")
            if op == "QLinearAveragePool":
                if self.opset < 10 and int(attrs.get("ceil_mode", 0)):
                    raise ValueError(f"ceil_mode=1 needs ai.onnx opset 10 or newer (the model "
                                     f"imports {self.opset})")
                if self.opset < 10:
                    attrs.pop("ceil_mode", None)
                pool = mk("AveragePool", [tx], [t], name=f"{label}/average_pool", **attrs)
            else:
                pool = mk("GlobalAveragePool", [tx], [t], name=f"{label}/global_average_pool")
            return [d, pool, self.q(t, ins[3], ins[4], out, label)]
        if op == "QLinearConcat":
            real = list(n.input)
            if len(real) < 5 or (len(real) - 2) % 3:
                raise ValueError(f"{len(real)} inputs; QLinearConcat takes Y_scale, "
                                 f"Y_zero_point and (X, scale, zero point) triples")
            nodes, parts = [], []
            for k in range(2, len(real), 3):
                d, tx = self.dq(real[k], real[k + 1], real[k + 2], label, f"{(k - 2) // 3}")
                nodes.append(d)
                parts.append(tx)
            t = self.names(f"{out}__concat")
            nodes.append(mk("Concat", parts, [t], name=f"{label}/concat",
                            axis=int(attrs.get("axis", 1))))
            nodes.append(self.q(t, real[0], real[1], out, label))
            return nodes
        if op == "QGemm":
            return self.qgemm(n, ins, attrs, label)
        raise AssertionError(op)  # pragma: no cover

    def qgemm(self, n, ins, attrs, label):
        from onnx import numpy_helper

        mk = self.helper.make_node
        out = n.output[0]
        alpha = float(attrs.get("alpha", 1.0))
        trans_b = int(attrs.get("transB", 0))
        s_a = self.const(ins[1], "a_scale").astype(np.float32)
        s_b = self.const(ins[4], "b_scale").astype(np.float32)
        per_col = s_b.size > 1
        da, ta = self.dq(ins[0], ins[1], ins[2], label, "a")
        db, tb = self.dq(ins[3], ins[4], ins[5], label, "b",
                         axis=(0 if trans_b else 1) if per_col else None)
        nodes = [da, db]
        gemm_in = [ta, tb]
        if ins[6]:
            # C is int32 on the scale alpha / beta * a_scale * b_scale (beta is 1), zero 0.
            scale = (np.float32(alpha) * s_a.reshape(()) * s_b).astype(np.float32)
            sname = self.names(f"{ins[6]}__scale")
            self.new_initializers.append(numpy_helper.from_array(scale, sname))
            dc, tc = self.dq(ins[6], sname, "", label, "c", axis=0 if per_col else None)
            nodes.append(dc)
            gemm_in.append(tc)
        gattrs = {k: attrs[k] for k in ("alpha", "transA", "transB") if k in attrs}
        quantized = bool(ins[7])
        t = self.names(f"{out}__gemm") if quantized else out
        nodes.append(mk("Gemm", gemm_in, [t], name=f"{label}/gemm", **gattrs))
        if quantized:
            nodes.append(self.q(t, ins[7], ins[8], out, label))
        return nodes


# -- ai.onnx integer operators, on our IR ------------------------------------------------

class _Rewriter:
    def __init__(self, graph: Graph):
        self.g = graph
        self.prod = graph.producers()
        self.cons = graph.consumers()
        self.opset = graph.opsets.get("", 0)
        used = set(graph.tensors) | set(graph.constants) | \
            {t for n in graph.nodes for t in n.inputs + n.outputs}
        self.names = _Names(used)
        self.dropped: set[int] = set()

    def version(self, op: str) -> int:
        import onnx

        try:
            return onnx.defs.get_schema(op, self.opset, "").since_version
        except onnx.defs.SchemaError:
            return 0

    def node(self, op, inputs, outputs, attrs, name) -> Node:
        return Node(op, list(inputs), list(outputs), dict(attrs), name, "", self.version(op),
                    self.opset)

    def tensor(self, base: str, shape) -> str:
        name = self.names(base)
        self.g.tensors[name] = TensorInfo("float32", None if shape is None else tuple(shape))
        return name

    def constant(self, base: str, value: np.ndarray) -> str:
        name = self.names(base)
        self.g.constants[name] = value
        self.g.tensors[name] = TensorInfo(value.dtype.name, tuple(value.shape))
        return name

    def shape(self, t):
        info = self.g.tensors.get(t)
        return None if info is None else info.shape

    def dq(self, x, s, z, label, role, axis=None) -> tuple[Node, str]:
        out = self.tensor(f"{x}__dq", self.shape(x))
        attrs = {} if axis is None else {"axis": axis}
        return self.node("DequantizeLinear", [x, s] + ([z] if z else []), [out], attrs,
                         f"{label}/dq_{role}"), out

    def q(self, x, s, z, y, label) -> Node:
        return self.node("QuantizeLinear", [x, s] + ([z] if z else []), [y], {},
                         f"{label}/q")

    def array(self, name):
        return None if not name or name not in self.g.constants else \
            np.asarray(self.g.constants[name])

    # -- the four operators -----------------------------------------------------------------
    def rewrite(self, n: Node) -> list[Node]:
        label = n.name or n.outputs[0]
        ins = list(n.inputs) + [""] * 9
        if n.op == "QLinearMatMul":
            b_scale = self.array(ins[4])
            b_shape = self.shape(ins[3])
            per_col = b_scale is not None and b_scale.size > 1
            a_scale = self.array(ins[1])
            per_row = a_scale is not None and a_scale.size > 1
            da, ta = self.dq(ins[0], ins[1], ins[2], label, "a",
                             axis=-2 if per_row else None)
            db, tb = self.dq(ins[3], ins[4], ins[5], label, "b",
                             axis=(len(b_shape) - 1 if b_shape else -1) if per_col else None)
            t = self.tensor(f"{n.outputs[0]}__matmul", self.shape(n.outputs[0]))
            return [da, db, self.node("MatMul", [ta, tb], [t], {}, f"{label}/matmul"),
                    self.q(t, ins[6], ins[7], n.outputs[0], label)]
        if n.op == "QLinearConv":
            w_scale = self.array(ins[4])
            w_zp = self.array(ins[5])
            per_ch = (w_scale is not None and w_scale.size > 1) or \
                (w_zp is not None and w_zp.size > 1)
            if w_scale is None:
                raise ValueError(f"w_scale ({ins[4]!r}) must be a constant")
            if per_ch and w_scale.size == 1:
                # a per-channel zero point with one scale: the scale repeated per channel
                ins[4] = self.constant(f"{ins[4]}__per_channel",
                                       np.full(w_zp.shape, w_scale.reshape(()), np.float32))
            dx, tx = self.dq(ins[0], ins[1], ins[2], label, "x")
            dw, tw = self.dq(ins[3], ins[4], ins[5], label, "w", axis=0 if per_ch else None)
            nodes = [dx, dw]
            conv_in = [tx, tw]
            if ins[8]:
                x_scale = self.array(ins[1])
                w_scale = self.array(ins[4])
                if x_scale is None or w_scale is None:
                    raise ValueError("x_scale and w_scale must be constants (the bias is on "
                                     "the scale x_scale * w_scale)")
                scale = (np.asarray(x_scale, np.float32).reshape(()) *
                         np.asarray(w_scale, np.float32)).astype(np.float32)
                sname = self.constant(f"{ins[8]}__scale", scale)
                db, tb = self.dq(ins[8], sname, "", label, "bias",
                                 axis=0 if scale.size > 1 else None)
                nodes.append(db)
                conv_in.append(tb)
            t = self.tensor(f"{n.outputs[0]}__conv", self.shape(n.outputs[0]))
            attrs = {k: v for k, v in n.attrs.items() if k in _CONV_ATTRS}
            nodes.append(self.node("Conv", conv_in, [t], attrs, f"{label}/conv"))
            nodes.append(self.q(t, ins[6], ins[7], n.outputs[0], label))
            return nodes
        return self.integer(n, label, ins)

    def quantizer(self, t: str):
        """The QuantizeLinear that produced activation ``t`` (through views), or a reason."""
        m = self.prod.get(t)
        while m is not None and m.domain in ("", "ai.onnx") and m.op in _VIEWS:
            m = self.prod.get(m.inputs[0])
        if m is None:
            if t in self.g.inputs:
                return None, None
            raise ValueError(f"A ({t!r}) must be a quantized activation")
        if m.op == "DynamicQuantizeLinear":
            raise ValueError(f"A ({t!r}) is quantized at run time by {m.describe()} (dynamic "
                             f"quantization); only static quantization maps to hardware "
                             f"(A from a QuantizeLinear with constant scale and zero point)")
        if m.op != "QuantizeLinear" or m.domain not in ("", "ai.onnx"):
            raise ValueError(f"A ({t!r}) comes from {m.describe()}, not from a "
                             f"QuantizeLinear; only static quantization maps to hardware")
        return m, None

    def integer(self, n: Node, label: str, ins: list) -> list[Node]:
        """MatMulInteger / ConvInteger: the static pattern of the module docstring."""
        is_conv = n.op == "ConvInteger"
        y = n.outputs[0]
        readers = self.cons.get(y, [])
        if y in self.g.outputs or len(readers) != 1 or readers[0].op != "Cast" or \
                int(readers[0].attrs.get("to", 0)) != _FLOAT:
            used = "a graph output" if y in self.g.outputs else \
                ", ".join(m.describe() for m in readers) or "nothing"
            raise ValueError(f"its int32 result is read by {used}; only one Cast to float "
                             f"(then scaled and requantized) maps to the hardware's "
                             f"requantization")
        cast = readers[0]
        q, _ = self.quantizer(ins[0])
        if q is None:       # an integer graph input: scale 1
            s_a = np.float32(1.0)
            s_name = self.constant(f"{ins[0]}__scale", np.asarray(s_a, np.float32))
            z_name = ins[2]
        else:
            if "qtype" in q.attrs:   # already resolved (our own quantizer)
                s_val = np.asarray(q.attrs["scale"], np.float32)
                z_val = np.asarray(q.attrs["zero_point"])
                s_name = self.constant(f"{ins[0]}__scale", s_val)
                z_name = self.constant(f"{ins[0]}__zero_point",
                                       z_val.astype(q.attrs["qtype"].name))
            else:
                s_name = q.inputs[1]
                z_name = q.inputs[2] if len(q.inputs) > 2 else ""
                s_val = self.array(s_name)
                z_val = self.array(z_name) if z_name else np.zeros((), np.int64)
            if s_val is None or (z_name and self.array(z_name) is None):
                raise ValueError(f"the QuantizeLinear of A ({ins[0]!r}) has a scale or zero "
                                 f"point that is not a constant")
            if s_val.size != 1:
                raise ValueError(f"A ({ins[0]!r}) is quantized per axis; only per-tensor "
                                 f"activations")
            s_a = np.float32(s_val.reshape(()))
            za = self.array(ins[2]) if ins[2] else np.zeros((), np.int64)
            if ins[2] and za is None:
                raise ValueError("a_zero_point must be a constant")
            if za.size != 1 or int(za.reshape(-1)[0]) != int(np.asarray(z_val).reshape(-1)[0]):
                raise ValueError(f"a_zero_point {za.reshape(-1).tolist()} differs from the "
                                 f"zero point {np.asarray(z_val).reshape(-1).tolist()} of "
                                 f"A's QuantizeLinear; A would not be the quantized activation")
        zb = self.array(ins[3]) if ins[3] else None
        if ins[3] and zb is None:
            raise ValueError("the weight's zero point must be a constant")
        per = zb is not None and zb.size > 1
        inv = np.float32(1.0) / s_a
        wscale = self.constant(f"{ins[1]}__scale",
                               np.full(zb.shape if per else (), inv, np.float32))
        w_shape = self.shape(ins[1])
        axis = None
        if per:
            axis = 0 if is_conv else (len(w_shape) - 1 if w_shape else -1)
        da, ta = self.dq(ins[0], s_name, z_name, label, "a")
        db, tb = self.dq(ins[1], wscale, ins[3], label, "b", axis=axis)
        out = cast.outputs[0]
        self.dropped.add(id(cast))
        if is_conv:
            attrs = {k: v for k, v in n.attrs.items() if k in _CONV_ATTRS}
            core = self.node("Conv", [ta, tb], [out], attrs, f"{label}/conv")
        else:
            core = self.node("MatMul", [ta, tb], [out], {}, f"{label}/matmul")
        return [da, db, core]


def normalize_qoperators(graph: Graph) -> Graph:
    """Rewrite every QLinearMatMul, QLinearConv, MatMulInteger and ConvInteger node of
    ``graph`` into QDQ form (in place; also returned). See the module docstring.

    Raises
    ------
    UnsupportedError
        Listing every integer operator that does not follow a pattern the hardware can run
        (dynamic quantization, an int32 result used as an integer, ...), with the reason.
    """
    rw = _Rewriter(graph)
    problems, nodes = [], []
    for n in graph.nodes:
        if id(n) in rw.dropped:
            continue
        if n.domain in ("", "ai.onnx") and n.op == "DynamicQuantizeLinear":
            problems.append(f"{n.describe()}: dynamic quantization (the scale is computed at "
                            f"run time) is not supported; quantize the model statically")
            nodes.append(n)
            continue
        if n.domain not in ("", "ai.onnx") or n.op not in QOP_OPS:
            nodes.append(n)
            continue
        try:
            nodes.extend(rw.rewrite(n))
        except ValueError as e:
            problems.append(f"{n.describe()}: {e}")
            nodes.append(n)
    if problems:
        raise UnsupportedError(problems)
    graph.nodes = nodes
    return graph
