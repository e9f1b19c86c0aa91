"""Check an ONNX ModelProto and infer its shapes: everything between reading and importing.

:func:`check_model` validates a parsed model (in place) and returns it shape-inferred, in
stages: structural validation of sizes and versions before any of onnx's C++ code sees the
model; sparse initializers densified; the lenient repairs (``lenient=True``) or the strict
checks they replace; the ONNX checker; model-local functions inlined; the batch dimension
bound to 1; old opsets converted; strict shape inference with data propagation; a final bound
on every inferred shape. A model file is untrusted input: every tensor's stored data is
checked against its declared type and shape before numpy or onnx decode it
(:func:`tensor_to_array`, which :mod:`onnx2fpga.frontend.load` also uses to import tensors).

Lenient mode repairs the deviations that real exporters produce:

* MD-04: no ``ai.onnx`` opset import: the newest opset released with the model's IR version
  is assumed;
* ND-02: a custom domain used by nodes but not declared: version 1 is assumed (strict mode
  refuses such a node by name before the checker; QONNX exporters often omit the domain);
* GR-01: an empty graph name;
* GR-02: a node list that is not topologically sorted (re-sorted; cycles are always fatal);
* MD-02: element types or features newer than the declared IR version;
* MD-03: a domain imported twice at the same version (the duplicate dropped; at two
  different versions it is always refused, as is an ``ai.onnx`` opset newer than the
  installed onnx knows).

Every repair is reported through :class:`Onnx2FpgaWarning` naming what was repaired.
"""

from __future__ import annotations

import heapq
import warnings

import numpy as np

from ..errors import CheckError, LoadError, UnsupportedError
from .qop import expand_contrib_qoperators

__all__ = ["check_model", "Onnx2FpgaWarning", "onnx_module", "all_tensors", "tensor_to_array",
           "sparse_to_dense", "type_name", "node_label", "MAX_ELEMENTS", "MIN_IR_VERSION",
           "MIN_OPSET", "QONNX_DOMAINS", "QONNX_OPS"]


# Largest tensor the compiler will ever materialize (elements); larger ones are refused
# before any allocation so that a lying file cannot exhaust memory. 2^24 elements (64 MiB
# as float32) is far beyond any on-chip memory of the target devices (the largest, an
# ECP5-85F, has under 0.5 MiB of block RAM), so no compilable model comes near it.
MAX_ELEMENTS = 1 << 24
# The domains QONNX quantizers are exported under (QONNX, Brevitas, older FINN/QKeras
# exports) and the operators of them that frontend/qonnx.py normalizes into QDQ form. Every
# other operator of these domains (MultiThreshold, fpgadataflow layers...) is refused by name.
QONNX_DOMAINS = ("qonnx.custom_op.general", "onnx.brevitas", "finn.custom_op.general")
QONNX_OPS = ("Quant", "IntQuant", "BipolarQuant", "Trunc", "MultiThreshold")

# Bits per element of the packed sub-byte types (DT-04): two 4-bit or four 2-bit elements
# per byte, first element in the low bits; 6-bit floats are bit-packed the same way.
_PACKED_BITS = {"UINT4": 4, "INT4": 4, "FLOAT4E2M1": 4, "UINT2": 2, "INT2": 2,
                "FLOAT6E2M3": 6, "FLOAT6E3M2": 6}
# The packed integer types (DT-04) and their value ranges.
_PACKED_INT = {"INT4": (-8, 7), "UINT4": (0, 15), "INT2": (-2, 1), "UINT2": (0, 3)}
# Element types and the IR version that introduced them (MD-02; onnx.proto comments).
_TYPE_IR = {"BFLOAT16": 4, "FLOAT8E4M3FN": 9, "FLOAT8E4M3FNUZ": 9, "FLOAT8E5M2": 9,
            "FLOAT8E5M2FNUZ": 9, "UINT4": 10, "INT4": 10, "FLOAT4E2M1": 11, "FLOAT8E8M0": 12,
            "UINT2": 13, "INT2": 13, "FLOAT6E2M3": 14, "FLOAT6E3M2": 14}
# Element types that are decoded but never computed with (DT-08): refused by name.
_REFUSED_TYPES = {"STRING": "strings", "COMPLEX64": "complex numbers",
                  "COMPLEX128": "complex numbers"}
MIN_IR_VERSION = 3
# Models importing ai.onnx below this opset are converted to it with onnx.version_converter
# (OP-09): opset 7 removed the legacy `broadcast` and `consumed_inputs` attributes (Add,
# Mul, Gemm, Relu, Clip, ...) and Reshape-5 took its shape as an input; every kernel we
# have is written for the later semantics.
MIN_OPSET = 7


class Onnx2FpgaWarning(UserWarning):
    """A model was accepted after a lenient repair, or a value was treated specially."""


def onnx_module():
    """The ``onnx`` package with the submodules used here, imported on first use."""
    import onnx  # imported lazily: `hw`, `sim` and `boards` never need it
    import onnx.inliner
    import onnx.version_converter  # noqa: F401 - submodules used through `onnx.`
    return onnx


def _warn(msg: str) -> None:
    warnings.warn(msg, Onnx2FpgaWarning, stacklevel=3)


# -- tensors: checked against their declared type and shape before they are decoded -----------


def type_name(elem_type: int) -> str:
    """The name of an ONNX element type (``"FLOAT"``), or ``"#<number>"`` if it has none."""
    onnx = onnx_module()
    try:
        return onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"#{elem_type}"


def _count(dims, what: str, shown=None) -> int:
    """Element count of ``dims``, refusing negative or too large shapes without overflow
    (``shown`` is the shape as the message prints it, symbolic dimensions included)."""
    shown = list(dims) if shown is None else shown
    n = 1
    for d in dims:
        d = int(d)
        if d < 0:
            raise CheckError(f"{what}: shape {shown} has a negative dimension")
        n *= d
        if n > MAX_ELEMENTS:
            raise CheckError(f"{what}: shape {shown} has more than {MAX_ELEMENTS} "
                             f"elements (the largest tensor we materialize)")
    return n


def _check_tensor(t, what: str) -> None:
    """Refuse a tensor whose stored data does not match its declared type and shape (a
    lying file), before numpy or onnx ever decode it."""
    onnx = onnx_module()
    T = onnx.TensorProto
    where = f"{what} {t.name!r}"
    name = type_name(t.data_type)
    if t.data_type == T.UNDEFINED or name.startswith("#"):
        raise CheckError(f"{where}: element type {name if name != 'UNDEFINED' else 0} is "
                         f"not a valid ONNX element type")
    n = _count(t.dims, where)
    if t.HasField("segment"):
        raise UnsupportedError([f"{where}: segmented tensors are not supported"])
    if t.data_location == T.EXTERNAL:
        raise LoadError(f"{where}: external data was not resolved")
    if name == "STRING":
        stored, want, unit = len(t.string_data), n, "strings"
    elif len(t.raw_data):
        bits = _PACKED_BITS.get(name)
        if bits is not None:
            want = (n * bits + 7) // 8
        else:
            want = n * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        stored, unit = len(t.raw_data), "bytes of raw_data"
    else:
        field = onnx.helper.tensor_dtype_to_field(t.data_type)
        stored = len(getattr(t, field))
        per = {4: 2, 2: 4}.get(_PACKED_BITS.get(name, 0), 1)
        want = (n + per - 1) // per
        if name in ("COMPLEX64", "COMPLEX128"):
            want = 2 * n
        unit = f"values in {field}"
    if stored != want:
        raise CheckError(f"{where}: shape {list(t.dims)} of {name} needs {want} {unit}, the "
                         f"file has {stored}")


def all_tensors(model):
    """Every TensorProto of the model with a label: initializers, sparse initializers' values
    and indices, and tensors in node attributes (of the graph, nested graphs and functions)."""
    A = onnx_module().AttributeProto

    def nodes(nodelist, where):
        for n in nodelist:
            label = f"Node {n.name or (n.output[0] if n.output else '?')!r} ({n.op_type})"
            for a in n.attribute:
                at = f"{label} attribute {a.name!r}"
                if a.type == A.TENSOR or a.HasField("t"):
                    yield a.t, at
                for t in a.tensors:
                    yield t, at
                if a.type == A.SPARSE_TENSOR or a.HasField("sparse_tensor"):
                    yield a.sparse_tensor.values, at
                    yield a.sparse_tensor.indices, at
                for sp in a.sparse_tensors:
                    yield sp.values, at
                    yield sp.indices, at
                if a.HasField("g"):
                    yield from graph(a.g, at)
                for sub in a.graphs:
                    yield from graph(sub, at)

    def graph(g, where):
        for t in g.initializer:
            yield t, "Initializer"
        for sp in g.sparse_initializer:
            yield sp.values, "Sparse initializer"
            yield sp.indices, "Sparse initializer"
        yield from nodes(g.node, where)

    yield from graph(model.graph, "Graph")
    for fn in model.functions:
        yield from nodes(fn.node, f"Function {fn.name!r}")


def tensor_to_array(tensor, where: str) -> np.ndarray:
    """Decode a TensorProto (every element type, DT-04) whose size ``_check_tensor`` has
    already matched against its data."""
    from onnx import numpy_helper

    _check_tensor(tensor, where)
    name = type_name(tensor.data_type)
    if name in _REFUSED_TYPES:
        raise UnsupportedError([f"{where} {tensor.name!r}: element type {name} is not "
                                f"supported ({_REFUSED_TYPES[name]} cannot be compiled)"])
    if name in _PACKED_INT and not len(tensor.raw_data):
        # int32_data holds the packed bytes (two 4-bit or four 2-bit values each); onnx's
        # unpacking masks nothing, so an entry beyond a byte would decode to other values.
        data = np.asarray(tensor.int32_data, dtype=np.int64)
        if data.size and (data.min() < 0 or data.max() > 255):
            bad = int(data[(data < 0) | (data > 255)][0])
            raise CheckError(f"{where} {tensor.name!r}: {name} data is packed "
                             f"{8 // _PACKED_BITS[name]} values to a byte, but an int32_data "
                             f"entry is {bad}")
    try:
        arr = numpy_helper.to_array(tensor)  # onnx's own unpacking of the sub-byte types
    except (ValueError, TypeError, OverflowError) as e:
        raise CheckError(f"{where} {tensor.name!r}: cannot decode {name} data: {e}") from None
    if name in _PACKED_INT and arr.size:
        lo, hi = _PACKED_INT[name]
        v = arr.astype(np.int64)
        if v.min() < lo or v.max() > hi:
            raise CheckError(f"{where} {tensor.name!r}: {name} values outside [{lo}, {hi}]")
    return arr


def sparse_to_dense(sp, where: str) -> np.ndarray:
    """Densify a SparseTensorProto (GR-07): ``values`` [NNZ] at ``indices`` given as [NNZ]
    linear indices or [NNZ, rank] coordinates into ``dims``; every index checked."""
    shape = tuple(int(d) for d in sp.dims)
    n = _count(shape, f"{where}: sparse tensor {sp.values.name!r}")
    values = tensor_to_array(sp.values, where).reshape(-1)
    indices = tensor_to_array(sp.indices, where)
    if indices.dtype != np.int64:
        raise CheckError(f"{where}: sparse tensor {sp.values.name!r} has {indices.dtype} "
                         f"indices; ONNX requires int64")
    nnz = values.size
    if indices.ndim == 2 and indices.shape == (nnz, len(shape)) and len(shape):
        dims = np.asarray(shape, dtype=np.int64)
        if indices.size and (indices.min() < 0 or np.any(indices >= dims)):
            raise CheckError(f"{where}: sparse tensor {sp.values.name!r} has a coordinate "
                             f"outside its shape {list(shape)}")
        strides = np.cumprod(np.concatenate([dims[1:], [1]])[::-1])[::-1]
        linear = indices @ strides if nnz else np.zeros(0, np.int64)
    elif indices.ndim == 1 and indices.size == nnz:
        linear = indices
        if nnz and (linear.min() < 0 or linear.max() >= n):
            raise CheckError(f"{where}: sparse tensor {sp.values.name!r} has an index "
                             f"outside its {n} elements")
    else:
        raise CheckError(f"{where}: sparse tensor {sp.values.name!r} has indices of shape "
                         f"{list(indices.shape)} for {nnz} values of shape {list(shape)}")
    if np.unique(linear).size != linear.size:
        raise CheckError(f"{where}: sparse tensor {sp.values.name!r} has repeated indices")
    dense = np.zeros(n, dtype=values.dtype)
    dense[linear] = values
    return dense.reshape(shape)


def node_label(n, k: int) -> str:
    """What messages call the ``k``-th NodeProto ``n``: its name, else its first output,
    else ``#k``."""
    return n.name or (n.output[0] if len(n.output) and n.output[0] else f"#{k}")


# -- structural validation before any of onnx's C++ code sees the model -----------------------


def _check_value_info(vi, what: str) -> None:
    if not vi.type.HasField("tensor_type"):
        return
    tt = vi.type.tensor_type
    if tt.HasField("shape"):
        dims = [d.dim_value for d in tt.shape.dim if d.HasField("dim_value")]
        shown = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                 for d in tt.shape.dim]
        _count(dims, f"{what} {vi.name!r}", shown)


def _prevalidate(model, lenient: bool) -> None:
    """Checks onnx's checker and shape inference do not make, or make only after reading
    data that may lie: IR version range, tensor sizes against their stored data, negative
    or huge dimensions. Everything here is linear in the file size."""
    onnx = onnx_module()
    if model.ir_version < MIN_IR_VERSION:
        raise CheckError(f"IR version {model.ir_version} is not supported (IR 3, ONNX 1.0, "
                         f"introduced operator sets; supported: IR {MIN_IR_VERSION} to "
                         f"{onnx.IR_VERSION})")
    if model.ir_version > onnx.IR_VERSION:
        raise CheckError(f"IR version {model.ir_version} is newer than this onnx supports "
                         f"({onnx.IR_VERSION})")
    late = []
    for t, what in all_tensors(model):
        _check_tensor(t, what)
        need = _TYPE_IR.get(type_name(t.data_type), 0)
        if need > model.ir_version:
            late.append(f"{what} {t.name!r} is {type_name(t.data_type)} (IR {need})")
    g = model.graph
    for kind, vis in (("Input", g.input), ("Output", g.output), ("Value", g.value_info)):
        for vi in vis:
            _check_value_info(vi, kind)
            if vi.type.HasField("tensor_type"):
                need = _TYPE_IR.get(type_name(vi.type.tensor_type.elem_type), 0)
                if need > model.ir_version:
                    late.append(f"{kind} {vi.name!r} is "
                                f"{type_name(vi.type.tensor_type.elem_type)} (IR {need})")
    if len(g.sparse_initializer) and model.ir_version < 6:
        late.append("sparse_initializer (IR 6)")
    if len(model.functions) and model.ir_version < 8:
        late.append("model-local functions (IR 8)")
    if late:
        msg = (f"MD-02: IR version {model.ir_version} predates features the model uses: "
               f"{'; '.join(late[:5])}")
        if not lenient:
            raise CheckError(msg + " (--lenient accepts it)")
        _warn(msg)
    if len(model.training_info):
        _warn("TR-01: the model's training_info is ignored (inference only)")
    _check_opset_imports(model, lenient)


def _check_opset_imports(model, lenient: bool) -> None:
    """MD-03: each domain imported once (``""`` and ``"ai.onnx"`` are one domain, OP-04), and
    no ``ai.onnx`` opset newer than the installed onnx defines (its operators' semantics are
    unknown; onnx's checker accepts any number)."""
    onnx = onnx_module()
    seen, keep = {}, []
    for o in model.opset_import:
        dom = "ai.onnx" if o.domain in ("", "ai.onnx") else o.domain
        if dom not in seen:
            seen[dom] = o.version
            keep.append(o)
            continue
        if seen[dom] != o.version or not lenient:
            hint = "" if seen[dom] != o.version else " (--lenient drops the duplicate)"
            raise CheckError(f"MD-03: opset_import names domain {dom!r} twice (versions "
                             f"{seen[dom]} and {o.version}); a model imports each domain "
                             f"once{hint}")
        _warn(f"MD-03: opset_import names domain {dom!r} twice at version {o.version}; "
              f"dropped the duplicate")
    if len(keep) != len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(keep)
    newest = onnx.defs.onnx_opset_version()
    version = seen.get("ai.onnx")
    if version is not None and version > newest:
        raise CheckError(f"MD-03: ai.onnx opset {version} is newer than the installed onnx "
                         f"{onnx.__version__} knows (its newest is opset {newest}): its "
                         f"operators' semantics are unknown")
    if version is not None and version < 1:
        raise CheckError(f"MD-03: ai.onnx opset {version} does not exist (opsets start at 1)")


def _densify_sparse_initializers(model) -> None:
    """GR-07: sparse initializers become dense ones (indices checked) before the checker
    and shape inference see them: operators such as Gemm do not accept a sparse tensor."""
    from onnx import numpy_helper

    g = model.graph
    if not len(g.sparse_initializer):
        return
    dense = [numpy_helper.from_array(sparse_to_dense(sp, "Sparse initializer"),
                                     sp.values.name) for sp in g.sparse_initializer]
    names = {t.name for t in g.initializer}
    for t in dense:
        if t.name in names:
            raise CheckError(f"Sparse initializer {t.name!r} has the name of an initializer")
        names.add(t.name)
    del g.sparse_initializer[:]
    g.initializer.extend(dense)


# -- lenient repairs (strict mode refuses what they repair) -----------------------------------


def _lenient_repairs(model) -> None:
    onnx = onnx_module()
    g = model.graph
    declared = {o.domain: o.version for o in model.opset_import}
    if not g.name:
        g.name = "graph"
        _warn("GR-01: graph has no name; named it 'graph'")
    used = {n.domain for n in g.node}
    if "" not in declared and "ai.onnx" not in declared:
        # The newest ai.onnx opset released together with the model's IR version: the era
        # the exporter wrote it in (onnx.helper.VERSION_TABLE: release, IR, opset, ...).
        eligible = [row[2] for row in onnx.helper.VERSION_TABLE if row[1] <= model.ir_version]
        chosen = max(eligible) if eligible else onnx.defs.onnx_opset_version()
        model.opset_import.append(onnx.helper.make_opsetid("", chosen))
        declared[""] = chosen
        _warn(f"MD-04: model imports no ai.onnx opset; assumed opset {chosen}, the newest "
              f"released with IR version {model.ir_version}")
    for dom in sorted(used - set(declared) - {"", "ai.onnx"}):
        model.opset_import.append(onnx.helper.make_opsetid(dom, 1))
        _warn(f"ND-02: domain {dom!r} is used but not declared in opset_import; "
              f"assumed version 1")
    _toposort(model, repair=True)
    _untyped_values(model, repair=True)


def _untyped_values(model, repair: bool) -> None:
    """Value infos without a type, which the ONNX checker refuses without naming them (a
    model cut by skl2onnx's ``select_model_inputs_outputs`` or ``onnx.utils`` leaves its new
    outputs and some ``value_info`` entries untyped). With ``repair``, a ``value_info``
    entry without a type is dropped (it says nothing) and a graph output without one takes
    the type ONNX shape inference gives it; otherwise each is refused by name. A graph input
    without a type is always refused: nothing says what to feed it."""
    onnx = onnx_module()
    g = model.graph

    def untyped(vi):
        return not vi.HasField("type") or vi.type.WhichOneof("value") is None or (
            vi.type.HasField("tensor_type") and not vi.type.tensor_type.elem_type)

    for vi in g.input:
        if untyped(vi):
            raise CheckError(f"Input {vi.name!r} has no type; a graph input must declare its "
                             f"element type and shape")
    drop = [vi.name for vi in g.value_info if untyped(vi)]
    outputs = [vi.name for vi in g.output if untyped(vi)]
    if not repair:
        if drop:
            raise CheckError(f"Value {drop[0]!r}: value_info entry without a type (--lenient "
                             f"drops such entries)")
        if outputs:
            raise CheckError(f"Output {outputs[0]!r} has no type (--lenient takes it from "
                             f"shape inference)")
        return
    if drop:
        keep = [vi for vi in g.value_info if not untyped(vi)]
        del g.value_info[:]
        g.value_info.extend(keep)
        _warn(f"value_info entries without a type dropped: {', '.join(map(repr, drop))}")
    if outputs:
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except _onnx_errors() as e:
            raise CheckError(f"Output {outputs[0]!r} has no type and shape inference "
                             f"failed: {_first_line(e)}") from None
        types = {vi.name: vi.type for vi in list(inferred.graph.output) +
                 list(inferred.graph.value_info) if not untyped(vi)}
        for vi in g.output:
            if vi.name in outputs:
                if vi.name not in types:
                    raise CheckError(f"Output {vi.name!r} has no type and shape inference "
                                     f"gives it none")
                vi.type.CopyFrom(types[vi.name])
        _warn(f"graph outputs without a type typed by shape inference: "
              f"{', '.join(map(repr, outputs))}")


def _check_declared_domains(model) -> None:
    """ND-02 in strict mode: a node of a domain missing from ``opset_import`` is refused
    before the checker, naming the node and the domain (the checker names neither)."""
    declared = {o.domain for o in model.opset_import} | {"", "ai.onnx"}
    for k, n in enumerate(model.graph.node):
        if n.domain not in declared:
            raise CheckError(f"Node {node_label(n, k)!r} ({n.domain}.{n.op_type}): domain "
                             f"{n.domain!r} is not declared in opset_import (--lenient "
                             f"assumes version 1)")


def _toposort(model, repair: bool) -> None:
    """Check the node order; with ``repair``, re-sort it (GR-02). Cycles are always fatal.

    Kahn's algorithm, O((nodes + edges) log nodes): a hostile node list (reversed, or a long
    cycle) costs no more than a sorted one.
    """
    g = model.graph
    known = {i.name for i in g.input} | {t.name for t in g.initializer} | \
        {t.values.name for t in g.sparse_initializer}
    order, defined = _stable_topological(g, known)
    if len(order) < len(g.node):
        produced = {o for n in g.node for o in n.output if o}
        done = set(order)
        first = min(k for k in range(len(g.node)) if k not in done)
        n = g.node[first]
        missing = [i for i in n.input if i and i not in defined]
        undefined = [i for i in missing if i not in produced]
        if undefined:
            raise CheckError(f"Node {node_label(n, first)!r} ({n.op_type}): input "
                             f"{undefined[0]!r} is not defined (no graph input, initializer "
                             f"or node output has that name)")
        raise CheckError(f"Node {node_label(n, first)!r} ({n.op_type}): input "
                         f"{missing[0]!r} is part of a cycle")
    if order != list(range(len(g.node))):
        if not repair:
            return  # the checker reports it in strict mode
        copies = []
        for k in order:
            c = type(g.node[k])()
            c.CopyFrom(g.node[k])
            copies.append(c)
        del g.node[:]
        g.node.extend(copies)
        _warn("GR-02: node list was not topologically sorted; re-sorted")


def _stable_topological(g, known):
    """Topological order that keeps the original order wherever it can (a heap by index)."""
    missing_count, waiting = [], {}
    for k, n in enumerate(g.node):
        need = {i for i in n.input if i and i not in known}
        missing_count.append(len(need))
        for i in need:
            waiting.setdefault(i, []).append(k)
    heap = [k for k, c in enumerate(missing_count) if c == 0]
    heapq.heapify(heap)
    order, defined = [], set(known)
    while heap:
        k = heapq.heappop(heap)
        order.append(k)
        for o in g.node[k].output:
            if o and o not in defined:
                defined.add(o)
                for j in waiting.pop(o, ()):
                    missing_count[j] -= 1
                    if missing_count[j] == 0:
                        heapq.heappush(heap, j)
    return order, defined


# -- the checker, inlining, batch binding, opset conversion and shape inference ---------------


def check_model(model, lenient: bool = False):
    """Validate ``model`` (in place) and return it shape-inferred.

    Stages: structural validation of sizes and versions; lenient repairs; the ONNX
    checker; model-local functions inlined (FN-03); batch binding; conversion of opsets
    older than ``MIN_OPSET`` (OP-09); strict shape inference with data propagation; a
    final bound on every inferred shape.
    """
    onnx = onnx_module()
    _prevalidate(model, lenient)
    _densify_sparse_initializers(model)
    if lenient:
        _lenient_repairs(model)
    else:
        _check_declared_domains(model)
        _toposort(model, repair=False)
        _untyped_values(model, repair=False)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        hint = "" if lenient else " (--lenient accepts common exporter deviations)"
        raise CheckError(f"ONNX checker: {_first_line(e)}{hint}") from None
    except UnicodeDecodeError:  # the checker's message quotes a name that is not UTF-8
        raise CheckError("ONNX checker: the model is invalid and a name or string in it is "
                         "not valid UTF-8") from None
    if len(model.functions):
        _apply_function_defaults(model)
        try:
            model = onnx.inliner.inline_local_functions(model)
            onnx.checker.check_model(model)
        except _onnx_errors() as e:
            raise CheckError(f"Inlining model-local functions: {_first_line(e)}") from None
        del model.functions[:]
    # onnxruntime's QOperator contrib ops become QDQ form before shape inference, which
    # knows only ai.onnx (frontend/qop.py).
    expand_contrib_qoperators(model)
    _bind_batch(model)
    opset = {("" if o.domain == "ai.onnx" else o.domain): o.version
             for o in model.opset_import}.get("", MIN_OPSET)
    if opset < MIN_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, MIN_OPSET)
        except _onnx_errors() as e:
            raise CheckError(f"Converting opset {opset} to {MIN_OPSET}: "
                             f"{_first_line(e)}") from None
        _warn(f"OP-09: converted the model from ai.onnx opset {opset} to {MIN_OPSET}")
    proxy = _shape_proxy(model)
    if proxy is None:
        _fold_shape_subgraphs(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(proxy or model, check_type=True,
                                                     strict_mode=True, data_prop=True)
    except _onnx_errors() as e:
        raise CheckError(f"Shape inference: {_first_line(e)}") from None
    if proxy is not None:
        del model.graph.value_info[:]
        model.graph.value_info.extend(inferred.graph.value_info)
        del model.graph.output[:]
        model.graph.output.extend(inferred.graph.output)
        inferred = model
    _check_shapes(inferred)
    return inferred


def _onnx_errors():
    onnx = onnx_module()
    from onnx.version_converter import ConvertError

    # What onnx's C++ checker, inliner, converter and shape inference raise on bad models.
    return (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ConvertError,
            RuntimeError, ValueError, TypeError, IndexError, KeyError)


def _first_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def _apply_function_defaults(model) -> None:
    """FN-05: an attribute a call leaves out takes the function's default from
    ``attribute_proto`` (IR 9). onnx.inliner (1.23) omits such references instead, which
    would give the body's operator its own default; so the defaults are written onto every
    call before inlining."""
    defaults = {(f.domain, f.name, f.overload): list(f.attribute_proto)
                for f in model.functions if len(f.attribute_proto)}
    if not defaults:
        return

    def visit(nodes):
        for n in nodes:
            given = {a.name for a in n.attribute}
            for a in defaults.get((n.domain, n.op_type, n.overload), ()):
                if a.name not in given:
                    n.attribute.append(a)
            for a in n.attribute:
                if a.HasField("g"):
                    visit(a.g.node)
                for sub in a.graphs:
                    visit(sub.node)

    visit(model.graph.node)
    for f in model.functions:
        visit(f.node)


def _bind_batch(model) -> None:
    """Bind a symbolic leading (batch) dimension of graph inputs and outputs to 1 (SH-05).

    Dimension variables are global (SH-04, IR 4+): a name bound here is bound everywhere,
    so a non-leading dimension sharing the batch's name is bound too; any other symbolic
    or unknown input dimension is refused."""
    g = model.graph
    inits = {t.name for t in g.initializer} | {t.values.name for t in g.sparse_initializer}
    ios = [vi for vi in list(g.input) + list(g.output)
           if vi.name not in inits and vi.type.HasField("tensor_type")
           and vi.type.tensor_type.HasField("shape")]
    bound = {d.dim_param for vi in ios for d in vi.type.tensor_type.shape.dim[:1]
             if d.HasField("dim_param") and d.dim_param}
    inputs = {vi.name for vi in g.input}
    for vi in ios:
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            if d.HasField("dim_value") and axis > 0:  # 0: a zero-sized tensor
                if vi.name in inputs:
                    raise CheckError(f"Input {vi.name!r}: dimension {axis} is 0; empty "
                                     f"tensors are not supported")
                continue
            if axis == 0 or (d.HasField("dim_param") and d.dim_param in bound):
                d.Clear()
                d.dim_value = 1
            elif vi.name in inputs:
                what = repr(d.dim_param) if d.HasField("dim_param") else "unknown"
                raise CheckError(f"Input {vi.name!r}: dimension {axis} is symbolic ({what}); "
                                 f"only the leading batch dimension is bound (to 1)")


# ai.onnx.ml operators whose output has their input's shape, which ONNX shape inference
# does not propagate (their schemas infer the element type only): -> float32 or the same type.
_ML_SHAPE_KEEPING = {"Scaler": "float", "Normalizer": "float", "Binarizer": "same"}


def _shape_proxy(model):
    """A copy of ``model`` in which every QONNX quantizer is an ai.onnx Identity of its data
    input, and every ai.onnx.ml operator of :data:`_ML_SHAPE_KEEPING` an Identity or a Cast
    to float, or None if there is none. ONNX shape inference knows no schema for the
    former and infers no shape for the latter, and would leave every tensor after them
    without a shape; all of them keep the shape of their data input."""
    onnx = onnx_module()

    def proxied(n):
        return (n.domain in QONNX_DOMAINS and n.op_type in QONNX_OPS or
                n.domain == "ai.onnx.ml" and n.op_type in _ML_SHAPE_KEEPING) and len(n.input)

    if not any(proxied(n) for n in model.graph.node):
        return None
    proxy = onnx.ModelProto()
    proxy.CopyFrom(model)
    for n in proxy.graph.node:
        if proxied(n):
            to_float = n.domain == "ai.onnx.ml" and _ML_SHAPE_KEEPING[n.op_type] == "float"
            data = n.input[0]
            del n.input[:]
            n.input.append(data)
            del n.attribute[:]
            n.op_type, n.domain = ("Cast", "") if to_float else ("Identity", "")
            if to_float:
                n.attribute.append(onnx.helper.make_attribute("to", onnx.TensorProto.FLOAT))
    _fold_shape_arithmetic(proxy)
    return proxy


#: Operators a shape computation is made of (torch's legacy exporter writes
#: ``Shape -> Slice / Gather / Mod / Add -> Concat -> Reshape`` for ``nn.Unflatten``).
SHAPE_ARITHMETIC = ("Shape", "Size", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Add",
                    "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Reshape", "Cast", "Range",
                    "Equal", "Where", "ConstantOfShape", "Expand", "Identity", "Constant",
                    "ReduceProd", "Min", "Max", "Transpose")
_SHAPE_VALUE_LIMIT = 64         # elements: a shape, never a weight


def _fold_shape_subgraphs(model) -> None:
    """Evaluate the shape computations of a model whose input shapes are bound: ``Shape`` of
    a tensor whose inferred shape is static, and the small integer arithmetic on such values
    and on constants (:data:`SHAPE_ARITHMETIC`, results of at most 64 int64 elements) become
    initializers (in place), so that the ``Reshape`` they feed has a constant target shape.
    Repeated with a fresh (lenient) shape inference while something folds: a folded shape
    can make the next ``Shape`` static. ONNX's own data propagation stops at operators such as
    ``Mod``; the values are computed by ``onnx.reference``."""
    onnx = onnx_module()
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    opset = {("" if o.domain == "ai.onnx" else o.domain): o.version
             for o in model.opset_import}.get("", MIN_OPSET)
    # Only a Shape or Size needs inferred shapes, and only a folded one can make another
    # static: without them, one pass and no shape inference.
    reads_shapes = any(n.op_type in ("Shape", "Size") for n in model.graph.node)
    for _ in range(8 if reads_shapes else 1):
        shapes = {}
        if reads_shapes:
            try:
                inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
            except _onnx_errors():
                return
            g = inferred.graph
            for vi in list(g.input) + list(g.value_info) + list(g.output):
                tt = vi.type.tensor_type
                if vi.type.HasField("tensor_type") and tt.HasField("shape") and \
                        all(d.HasField("dim_value") for d in tt.shape.dim):
                    shapes[vi.name] = [d.dim_value for d in tt.shape.dim]
        known = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
                 if t.data_type == onnx.TensorProto.INT64 and
                 int(np.prod(t.dims, dtype=np.int64)) <= _SHAPE_VALUE_LIMIT}
        outputs = {o.name for o in model.graph.output}
        keep, added = [], []
        for n in model.graph.node:
            value = None
            if n.domain in ("", "ai.onnx") and n.op_type in SHAPE_ARITHMETIC and \
                    len(n.output) == 1 and n.output[0] not in outputs:
                ins = list(n.input)
                if n.op_type in ("Shape", "Size") and ins and ins[0] in shapes:
                    dims = np.asarray(shapes[ins[0]], np.int64)
                    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
                    value = np.asarray(dims.prod() if n.op_type == "Size" else
                                       dims[attrs.get("start", 0):attrs.get("end", None)],
                                       np.int64)
                elif n.op_type not in ("Shape", "Size") and \
                        all(not i or i in known for i in ins):
                    value = _evaluate_node(onnx, ReferenceEvaluator, n, known, opset)
            if value is None or value.dtype != np.int64 or value.size > _SHAPE_VALUE_LIMIT:
                keep.append(n)
                continue
            known[n.output[0]] = value
            added.append(numpy_helper.from_array(value, n.output[0]))
        if not added:
            return
        del model.graph.node[:]
        model.graph.node.extend(keep)
        model.graph.initializer.extend(added)
        names = {t.name for t in added}
        kept = [vi for vi in model.graph.value_info if vi.name not in names]
        del model.graph.value_info[:]
        model.graph.value_info.extend(kept)


def _evaluate_node(onnx, evaluator, n, known, opset):
    """``n`` run by onnx.reference on the constants ``known``; None if it cannot be."""
    ins = [i for i in n.input if i]
    graph = onnx.helper.make_graph(
        [n], "shape", [], [onnx.helper.make_tensor_value_info(n.output[0],
                                                            onnx.TensorProto.UNDEFINED, None)],
        [onnx.numpy_helper.from_array(np.asarray(known[i]), i) for i in dict.fromkeys(ins)])
    m = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.asarray(evaluator(m).run(None, {})[0])
    except Exception:       # noqa: BLE001 - any failure leaves the node as it is
        return None


def _fold_shape_arithmetic(model) -> None:
    """Replace ``Shape`` of a tensor of static shape, and ``Gather`` / ``Unsqueeze`` /
    ``Concat`` of such constants, by initializers (in ``model``, a shape-inference proxy).
    PyTorch exports of ``x.view(x.size(0), -1)`` compute a Reshape's target shape this way,
    and ONNX's data propagation does not follow it through these operators' old opsets."""
    from onnx import numpy_helper

    g = model.graph
    shapes = {}
    for vi in list(g.input) + list(g.value_info):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape") and \
                all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = [d.dim_value for d in tt.shape.dim]
    known = {t.name: numpy_helper.to_array(t) for t in g.initializer
             if t.data_type == onnx_module().TensorProto.INT64}
    keep, added = [], []
    for n in g.node:
        attrs = {a.name: onnx_module().helper.get_attribute_value(a) for a in n.attribute}
        ins = list(n.input)
        value = None
        try:
            if n.domain in ("", "ai.onnx") and len(n.output) == 1:
                if n.op_type == "Shape" and ins and ins[0] in shapes:
                    value = np.asarray(shapes[ins[0]], np.int64)[
                        attrs.get("start", 0):attrs.get("end", None)]
                elif n.op_type == "Gather" and len(ins) == 2 and all(i in known for i in ins):
                    value = np.take(known[ins[0]], known[ins[1]], axis=attrs.get("axis", 0))
                elif n.op_type == "Unsqueeze" and ins and ins[0] in known and \
                        (len(ins) > 1 and ins[1] in known or "axes" in attrs):
                    axes = known[ins[1]] if len(ins) > 1 else attrs["axes"]
                    value = known[ins[0]]
                    for a in sorted(int(a) % (value.ndim + len(axes)) for a in axes):
                        value = np.expand_dims(value, a)
                elif n.op_type == "Concat" and ins and all(i in known for i in ins):
                    value = np.concatenate([known[i] for i in ins], axis=attrs.get("axis", 0))
        except (ValueError, IndexError, TypeError, KeyError):
            value = None
        if value is None or value.dtype != np.int64:
            keep.append(n)
            continue
        known[n.output[0]] = value
        added.append(numpy_helper.from_array(value, n.output[0]))
    if added:
        del g.node[:]
        g.node.extend(keep)
        g.initializer.extend(added)


def _check_shapes(model) -> None:
    """After shape inference: no value may be larger than we can materialize."""
    g = model.graph
    for kind, vis in (("Input", g.input), ("Output", g.output), ("Value", g.value_info)):
        for vi in vis:
            _check_value_info(vi, kind)
