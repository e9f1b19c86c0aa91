"""Load, check and import an ONNX model into our IR.

``load_model(path, lenient=False)`` is the only place that touches protobuf; it returns an
:class:`~onnx2fpga.frontend.ir.Graph`. A model file is untrusted input: every size, shape,
name and external-data location is validated before onnx's C++ checker and shape inference,
numpy or the file system act on it, and every failure is one of our own errors naming the
tensor, node or value (``docs/onnx-conformance.md`` lists the stages and, for each item of
``shared/spec/onnx-consumer-checklist.md``, what is done and which test shows it).

Strict mode accepts what the ONNX checker and strict shape inference accept. Lenient mode
additionally repairs the deviations that real exporters produce:

* MD-04: no ``ai.onnx`` opset import: the newest opset released with the model's IR version
  is assumed;
* ND-02: a custom domain used by nodes but not declared: version 1 is assumed (strict mode
  refuses such a node by name before the checker; QONNX exporters often omit the domain);
* GR-01: an empty graph name;
* GR-02: a node list that is not topologically sorted (re-sorted; cycles are always fatal);
* MD-02: element types or features newer than the declared IR version.

Every repair is reported through :class:`Onnx2FpgaWarning` naming what was repaired.

Besides ai.onnx, the QONNX quantizers (:data:`QONNX_OPS` in :data:`QONNX_DOMAINS`) are
imported as they are; :mod:`onnx2fpga.frontend.qonnx` turns them into QDQ form.
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings

import numpy as np

from ..errors import CheckError, LoadError, UnsupportedError
from .ir import Graph, Node, TensorInfo

__all__ = ["Onnx2FpgaWarning", "load_model", "import_model", "check_model", "QONNX_DOMAINS",
           "QONNX_OPS"]

# Largest tensor the compiler will ever materialize (elements); larger ones are refused
# before any allocation so that a lying file cannot exhaust memory. 2^24 elements (64 MiB
# as float32) is far beyond any on-chip memory of the target devices (the largest, an
# ECP5-85F, has under 0.5 MiB of block RAM), so no compilable model comes near it.
MAX_ELEMENTS = 1 << 24
# Protobuf cannot parse messages of 2 GiB or more.
MAX_FILE_BYTES = (1 << 31) - 1


class Onnx2FpgaWarning(UserWarning):
    """A model was accepted after a lenient repair, or a value was treated specially."""


def _onnx():
    import onnx  # imported lazily: `hw`, `sim` and `boards` never need it
    import onnx.inliner
    import onnx.version_converter  # noqa: F401 - submodules used through `onnx.`
    return onnx


def _read(path) -> object:
    """Parse a file (or copy a ModelProto) and resolve its external data (ED-01)."""
    onnx = _onnx()
    if hasattr(path, "SerializeToString"):
        model = onnx.ModelProto()
        model.CopyFrom(path)  # never mutate the caller's ModelProto
        _check_external_data(model, None, "Model")
        return model
    path = os.fspath(path)
    if not os.path.exists(path):
        raise LoadError(f"{path}: no such file")
    if not os.path.isfile(path):  # also refuses FIFOs and devices, which could block
        raise LoadError(f"{path}: not a file")
    size = os.path.getsize(path)
    if size > MAX_FILE_BYTES:
        raise LoadError(f"{path}: {size} bytes is larger than protobuf's 2 GiB limit; "
                        f"not an ONNX model")
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if not data:
        raise LoadError(f"{path}: empty file, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except _decode_errors() as e:  # DecodeError (upb, python) or RuntimeError (cpp backend)
        raise LoadError(f"{path}: not an ONNX model (protobuf parse failed: {e})") from None
    if not model.HasField("graph") or model.ir_version == 0:
        raise LoadError(f"{path}: not an ONNX model (no graph or no ir_version)")
    _check_strings(model, path)
    _check_external_data(model, os.path.dirname(os.path.abspath(path)), path)
    return model


def _check_strings(model, path: str) -> None:
    """Refuse string fields that are not valid UTF-8 (protobuf's Python runtime hands them
    over as ``bytes``, which no code downstream expects)."""
    from google.protobuf.descriptor import FieldDescriptor

    STRING, MESSAGE = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE
    stack = [model]
    while stack:
        msg = stack.pop()
        for field, value in msg.ListFields():
            if field.type == MESSAGE:
                if field.is_repeated:
                    stack.extend(value)
                else:
                    stack.append(value)
            elif field.type == STRING:
                values = value if field.is_repeated else [value]
                if any(not isinstance(v, str) for v in values):
                    raise LoadError(f"{path}: field {field.full_name!r} holds a string that "
                                    f"is not valid UTF-8")


def _decode_errors():
    from google.protobuf.message import DecodeError
    return (DecodeError, RuntimeError, ValueError)


def _all_tensors(model):
    """Every TensorProto of the model with a label: initializers, sparse initializers' values
    and indices, and tensors in node attributes (of the graph, nested graphs and functions)."""
    A = _onnx().AttributeProto

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


def _check_external_data(model, base_dir: str | None, path: str) -> None:
    """Load external tensor data, refusing any location outside the model's folder.

    The location is resolved with every symbolic link followed, and the resolved file must
    lie inside the (resolved) folder of the model file: ``../`` escapes, absolute paths and
    symbolic links pointing outside are refused before anything is opened. A model given as
    a ModelProto has no folder, so its external data is refused.
    """
    onnx = _onnx()
    base = os.path.realpath(base_dir) if base_dir is not None else None
    for tensor, what in _all_tensors(model):
        external = tensor.data_location == onnx.TensorProto.EXTERNAL
        if not external:
            if len(tensor.external_data):
                raise CheckError(f"{path}: {what} tensor {tensor.name!r} has external_data "
                                 f"entries but its data_location is not EXTERNAL")
            continue
        info = {e.key: e.value for e in tensor.external_data}
        loc = info.get("location", "")
        if base is None:
            raise LoadError(f"{path}: tensor {tensor.name!r} has external data at {loc!r}; "
                            f"load the model from its file so that the location can be "
                            f"resolved inside the model's folder")
        if not loc:
            raise LoadError(f"{path}: tensor {tensor.name!r} has external data without a "
                            f"location")
        if "\0" in loc:
            raise LoadError(f"{path}: tensor {tensor.name!r} has an external data location "
                            f"with a NUL character")
        target = os.path.realpath(os.path.join(base, loc))
        if os.path.isabs(loc) or os.path.commonpath([base, target]) != base:
            raise LoadError(f"{path}: tensor {tensor.name!r} has external data at {loc!r}, "
                            f"outside the model's folder")
        if not os.path.isfile(target):
            raise LoadError(f"{path}: tensor {tensor.name!r}: external data file {loc!r} "
                            f"not found")
        try:
            offset = int(info.get("offset", "0") or 0)
            length = int(info["length"]) if info.get("length") else None
        except ValueError:
            raise LoadError(f"{path}: tensor {tensor.name!r}: external data offset "
                            f"{info.get('offset')!r} or length {info.get('length')!r} is "
                            f"not an integer") from None
        size = os.path.getsize(target)
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise LoadError(f"{path}: tensor {tensor.name!r}: external data range "
                            f"[{offset}, {offset + length}) is past the end of {loc!r} "
                            f"({size} bytes)")
        if length > MAX_ELEMENTS * 8:
            raise LoadError(f"{path}: tensor {tensor.name!r}: external data of {length} bytes "
                            f"is too large")
        with open(target, "rb") as f:
            f.seek(offset)
            data = f.read(length)
        if "checksum" in info and hashlib.sha1(data).hexdigest() != info["checksum"].lower():
            raise LoadError(f"{path}: tensor {tensor.name!r}: external data in {loc!r} does "
                            f"not match its SHA-1 checksum")
        tensor.raw_data = data
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT


def _warn(msg: str) -> None:
    warnings.warn(msg, Onnx2FpgaWarning, stacklevel=3)


def _lenient_repairs(model) -> None:
    onnx = _onnx()
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
            raise CheckError(f"Node {_node_label(n, first)!r} ({n.op_type}): input "
                             f"{undefined[0]!r} is not defined (no graph input, initializer "
                             f"or node output has that name)")
        raise CheckError(f"Node {_node_label(n, first)!r} ({n.op_type}): input "
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


def _node_label(n, k: int) -> str:
    return n.name or (n.output[0] if len(n.output) and n.output[0] else f"#{k}")


def _stable_topological(g, known):
    """Topological order that keeps the original order wherever it can (a heap by index)."""
    import heapq

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


# Operator domains the passes and kernels implement ("" is ai.onnx).
SUPPORTED_DOMAINS = ("",)
# The domains QONNX quantizers are exported under (QONNX, Brevitas, older FINN/QKeras
# exports) and the operators of them that frontend/qonnx.py normalizes into QDQ form. Every
# other operator of these domains (MultiThreshold, fpgadataflow layers...) is refused by name.
QONNX_DOMAINS = ("qonnx.custom_op.general", "onnx.brevitas", "finn.custom_op.general")
QONNX_OPS = ("Quant", "IntQuant", "BipolarQuant", "Trunc", "MultiThreshold")


# -- structural validation before any of onnx's C++ code sees the model ------------------

# Bits per element of the packed sub-byte types (DT-04): two 4-bit or four 2-bit elements
# per byte, first element in the low bits; 6-bit floats are bit-packed the same way.
_PACKED_BITS = {"UINT4": 4, "INT4": 4, "FLOAT4E2M1": 4, "UINT2": 2, "INT2": 2,
                "FLOAT6E2M3": 6, "FLOAT6E3M2": 6}
# Element types and the IR version that introduced them (MD-02; onnx.proto comments).
_TYPE_IR = {"BFLOAT16": 4, "FLOAT8E4M3FN": 9, "FLOAT8E4M3FNUZ": 9, "FLOAT8E5M2": 9,
            "FLOAT8E5M2FNUZ": 9, "UINT4": 10, "INT4": 10, "FLOAT4E2M1": 11, "FLOAT8E8M0": 12,
            "UINT2": 13, "INT2": 13, "FLOAT6E2M3": 14, "FLOAT6E3M2": 14}
MIN_IR_VERSION = 3
# Models importing ai.onnx below this opset are converted to it with onnx.version_converter
# (OP-09): opset 7 removed the legacy `broadcast` and `consumed_inputs` attributes (Add,
# Mul, Gemm, Relu, Clip, ...) and Reshape-5 took its shape as an input; every kernel we
# have is written for the later semantics.
MIN_OPSET = 7


def _type_name(elem_type: int) -> str:
    onnx = _onnx()
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
    onnx = _onnx()
    T = onnx.TensorProto
    where = f"{what} {t.name!r}"
    name = _type_name(t.data_type)
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
    onnx = _onnx()
    if model.ir_version < MIN_IR_VERSION:
        raise CheckError(f"IR version {model.ir_version} is not supported (IR 3, ONNX 1.0, "
                         f"introduced operator sets; supported: IR {MIN_IR_VERSION} to "
                         f"{onnx.IR_VERSION})")
    if model.ir_version > onnx.IR_VERSION:
        raise CheckError(f"IR version {model.ir_version} is newer than this onnx supports "
                         f"({onnx.IR_VERSION})")
    late = []
    for t, what in _all_tensors(model):
        _check_tensor(t, what)
        need = _TYPE_IR.get(_type_name(t.data_type), 0)
        if need > model.ir_version:
            late.append(f"{what} {t.name!r} is {_type_name(t.data_type)} (IR {need})")
    g = model.graph
    for kind, vis in (("Input", g.input), ("Output", g.output), ("Value", g.value_info)):
        for vi in vis:
            _check_value_info(vi, kind)
            if vi.type.HasField("tensor_type"):
                need = _TYPE_IR.get(_type_name(vi.type.tensor_type.elem_type), 0)
                if need > model.ir_version:
                    late.append(f"{kind} {vi.name!r} is "
                                f"{_type_name(vi.type.tensor_type.elem_type)} (IR {need})")
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


def _check_shapes(model) -> None:
    """After shape inference: no value may be larger than we can materialize."""
    g = model.graph
    for kind, vis in (("Input", g.input), ("Output", g.output), ("Value", g.value_info)):
        for vi in vis:
            _check_value_info(vi, kind)


def _onnx_errors():
    onnx = _onnx()
    from onnx.version_converter import ConvertError

    # What onnx's C++ checker, inliner, converter and shape inference raise on bad models.
    return (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ConvertError,
            RuntimeError, ValueError, TypeError, IndexError, KeyError)


def _first_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def _densify_sparse_initializers(model) -> None:
    """GR-07: sparse initializers become dense ones (indices checked) before the checker
    and shape inference see them: operators such as Gemm do not accept a sparse tensor."""
    from onnx import numpy_helper

    g = model.graph
    if not len(g.sparse_initializer):
        return
    dense = [numpy_helper.from_array(_sparse_to_dense(sp, "Sparse initializer"),
                                     sp.values.name) for sp in g.sparse_initializer]
    names = {t.name for t in g.initializer}
    for t in dense:
        if t.name in names:
            raise CheckError(f"Sparse initializer {t.name!r} has the name of an initializer")
        names.add(t.name)
    del g.sparse_initializer[:]
    g.initializer.extend(dense)


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


def check_model(model, lenient: bool = False):
    """Validate ``model`` (in place) and return it shape-inferred.

    Stages: structural validation of sizes and versions; lenient repairs; the ONNX
    checker; model-local functions inlined (FN-03); batch binding; conversion of opsets
    older than ``MIN_OPSET`` (OP-09); strict shape inference with data propagation; a
    final bound on every inferred shape.
    """
    onnx = _onnx()
    _prevalidate(model, lenient)
    _densify_sparse_initializers(model)
    if lenient:
        _lenient_repairs(model)
    else:
        _check_declared_domains(model)
        _toposort(model, repair=False)
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
    from .qop import expand_contrib_qoperators
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
    proxy = _qonnx_shape_proxy(model)
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


def _check_declared_domains(model) -> None:
    """ND-02 in strict mode: a node of a domain missing from ``opset_import`` is refused
    before the checker, naming the node and the domain (the checker names neither)."""
    declared = {o.domain for o in model.opset_import} | {"", "ai.onnx"}
    for k, n in enumerate(model.graph.node):
        if n.domain not in declared:
            raise CheckError(f"Node {_node_label(n, k)!r} ({n.domain}.{n.op_type}): domain "
                             f"{n.domain!r} is not declared in opset_import (--lenient "
                             f"assumes version 1)")


def _qonnx_shape_proxy(model):
    """A copy of ``model`` in which every QONNX quantizer is an ai.onnx Identity of its data
    input, or None if there is none. ONNX shape inference knows no schema for them and would
    leave every tensor after them without a shape; all of them keep the shape (and element
    type) of their data input."""
    onnx = _onnx()
    if not any(n.domain in QONNX_DOMAINS and n.op_type in QONNX_OPS for n in model.graph.node):
        return None
    proxy = onnx.ModelProto()
    proxy.CopyFrom(model)
    for n in proxy.graph.node:
        if n.domain in QONNX_DOMAINS and n.op_type in QONNX_OPS and len(n.input):
            data = n.input[0]
            del n.input[:]
            n.input.append(data)
            del n.attribute[:]
            n.op_type, n.domain = "Identity", ""
    _fold_shape_arithmetic(proxy)
    return proxy


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
             if t.data_type == _onnx().TensorProto.INT64}
    keep, added = [], []
    for n in g.node:
        attrs = {a.name: _onnx().helper.get_attribute_value(a) for a in n.attribute}
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


def _attr_value(attr, where: str):
    onnx = _onnx()

    t = attr.type
    A = onnx.AttributeProto
    if t in (A.GRAPH, A.GRAPHS):
        raise UnsupportedError([f"{where}: attribute {attr.name!r} holds a subgraph "
                                f"(control flow is not supported)"])
    if t in (A.TYPE_PROTO, A.TYPE_PROTOS):
        raise UnsupportedError([f"{where}: attribute {attr.name!r} holds a type (optional or "
                                f"sequence types are not supported)"])
    what = f"{where} attribute {attr.name!r}"
    if t == A.TENSOR:
        return _to_array(attr.t, what)
    if t == A.TENSORS:
        return [_to_array(x, what) for x in attr.tensors]
    if t == A.SPARSE_TENSOR:
        return _sparse_to_dense(attr.sparse_tensor, what)
    if t == A.SPARSE_TENSORS:
        return [_sparse_to_dense(x, what) for x in attr.sparse_tensors]
    value = onnx.helper.get_attribute_value(attr)
    if t in (A.FLOAT, A.FLOATS):
        bad = [v for v in (value if t == A.FLOATS else [value]) if not math.isfinite(v)]
        # Clip-6 takes its bounds as attributes, and an infinite bound means "none".
        if bad and not (attr.name in ("min", "max") and not any(map(math.isnan, bad))):
            raise CheckError(f"{where}: attribute {attr.name!r} is {bad[0]}; a finite value "
                             f"is required")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
    return value


def _sparse_to_dense(sp, where: str) -> np.ndarray:
    """Densify a SparseTensorProto (GR-07): ``values`` [NNZ] at ``indices`` given as [NNZ]
    linear indices or [NNZ, rank] coordinates into ``dims``; every index checked."""
    shape = tuple(int(d) for d in sp.dims)
    n = _count(shape, f"{where}: sparse tensor {sp.values.name!r}")
    values = _to_array(sp.values, where).reshape(-1)
    indices = _to_array(sp.indices, where)
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


def _tensor_info(vi) -> TensorInfo | None:
    onnx = _onnx()
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)).name
    except (KeyError, ValueError, TypeError):
        dtype = _type_name(tt.elem_type).lower()
    shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                  for d in tt.shape.dim) if tt.HasField("shape") else None
    return TensorInfo(dtype, shape)


# Element types that are decoded but never computed with (DT-08): refused by name.
_REFUSED_TYPES = {"STRING": "strings", "COMPLEX64": "complex numbers",
                  "COMPLEX128": "complex numbers"}


def _to_array(tensor, where: str) -> np.ndarray:
    """Decode a TensorProto (every element type, DT-04) whose size ``_check_tensor`` has
    already matched against its data."""
    from onnx import numpy_helper

    _check_tensor(tensor, where)
    name = _type_name(tensor.data_type)
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


# The packed integer types (DT-04) and their value ranges.
_PACKED_INT = {"INT4": (-8, 7), "UINT4": (0, 15), "INT2": (-2, 1), "UINT2": (0, 3)}


def _check_default(vi, value: np.ndarray) -> None:
    """GR-05: an initializer that is also a graph input is that input's default value, so
    it must have the declared type and shape (the checker does not compare them)."""
    info = _tensor_info(vi)
    if info is None:
        return
    if info.dtype != value.dtype.name:
        raise CheckError(f"Input {vi.name!r} is declared {info.dtype} but its initializer "
                         f"(default value) is {value.dtype.name}")
    if info.shape is not None and (len(info.shape) != value.ndim or any(
            isinstance(d, int) and d != v for d, v in zip(info.shape, value.shape))):
        raise CheckError(f"Input {vi.name!r} is declared with shape {list(info.shape)} but "
                         f"its initializer (default value) has shape {list(value.shape)}")


_BROADCAST_OPS = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Equal",
                  "Greater", "Less", "And", "Or", "Xor", "PRelu", "Where")


def _check_broadcasts(nodes, tensors) -> None:
    """Shapes that ONNX shape inference does not compare (Gemm's C is never checked against
    the product) or compares only when it knows them: refused here, before any numpy code
    computes with them."""
    def shape(name):
        info = tensors.get(name)
        if not name or info is None or info.shape is None or \
                not all(isinstance(d, int) for d in info.shape):
            return None
        return tuple(info.shape)

    for node in nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        shapes = [shape(i) for i in node.inputs]
        try:
            if node.op == "Gemm" and len(shapes) >= 2 and None not in shapes[:2]:
                a, b = shapes[0], shapes[1]
                if len(a) != 2 or len(b) != 2:
                    raise ValueError(f"A {list(a)} and B {list(b)} must be matrices")
                a = a[::-1] if node.attrs.get("transA", 0) else a
                b = b[::-1] if node.attrs.get("transB", 0) else b
                if a[1] != b[0]:
                    raise ValueError(f"A {list(a)} and B {list(b)} do not multiply")
                if len(shapes) > 2 and shapes[2] is not None:
                    c = shapes[2]
                    ok = len(c) <= 2 and all(
                        x in (1, y) for x, y in zip(c[::-1], (b[1], a[0])))
                    if not ok:
                        raise ValueError(f"C {list(c)} does not broadcast to "
                                         f"{[a[0], b[1]]}")
            elif node.op == "MatMul" and len(shapes) == 2 and None not in shapes:
                a, b = shapes
                if not a or not b:
                    raise ValueError("scalars cannot be multiplied as matrices")
                k_a = a[-1]
                k_b = b[0] if len(b) == 1 else b[-2]
                if k_a != k_b:
                    raise ValueError(f"{list(a)} and {list(b)} do not multiply")
                np.broadcast_shapes(a[:-2], b[:-2])
            elif node.op in _BROADCAST_OPS:
                known = [s for s in shapes if s is not None]
                if known:
                    np.broadcast_shapes(*known)
        except ValueError as e:
            raise CheckError(f"{node.describe()}: input shapes "
                             f"{[list(s) if s is not None else '?' for s in shapes]}: "
                             f"{e}") from None


def _semver(v: int) -> str | None:
    """MD-07: a model_version whose top 4 bytes are non-zero is SemVer packed as
    major (2 bytes), minor (2 bytes), patch (4 bytes)."""
    if v >> 32 == 0 or v < 0:
        return None
    return f"{(v >> 48) & 0xFFFF}.{(v >> 32) & 0xFFFF}.{v & 0xFFFFFFFF}"


def import_model(model) -> Graph:
    """Turn a checked, shape-inferred ModelProto into our IR (no protobuf beyond this point)."""
    onnx = _onnx()
    g = model.graph
    opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version)
              for o in model.opset_import}
    constants: dict[str, np.ndarray] = {}
    problems = []
    for t in g.initializer:
        try:
            constants[t.name] = _to_array(t, "Initializer")
        except UnsupportedError as e:
            problems.extend(e.problems)
    for sp in g.sparse_initializer:
        try:
            constants[sp.values.name] = _sparse_to_dense(sp, "Sparse initializer")
        except UnsupportedError as e:
            problems.extend(e.problems)
    inputs = []
    for vi in g.input:
        if vi.name in constants:
            _check_default(vi, constants[vi.name])
            warnings.warn(f"GR-05: input {vi.name!r} has an initializer (an overridable "
                          f"default); it is treated as a constant and baked into the design",
                          Onnx2FpgaWarning, stacklevel=3)
        else:
            inputs.append(vi.name)
    tensors = {}
    # Graph inputs and outputs are the authority on their own types: a value_info entry
    # for the same name never overrides them.
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        info = _tensor_info(vi)
        if info is not None:
            tensors[vi.name] = info
        elif vi.name not in constants:
            kind = vi.type.WhichOneof("value") or "untyped"
            problems.append(f"Value {vi.name!r}: {kind} values are not supported (tensors "
                            f"only)")
    for name, arr in constants.items():
        tensors[name] = TensorInfo(arr.dtype.name, tuple(arr.shape))
    nodes = []
    for k, n in enumerate(g.node):
        domain = "" if n.domain == "ai.onnx" else n.domain
        label = _node_label(n, k)
        opset = opsets.get(domain, 0)
        try:
            version = onnx.defs.get_schema(n.op_type, opset, domain).since_version
        except onnx.defs.SchemaError:
            version = 0
        where = f"Node {label!r} ({n.op_type}, opset {opset})"
        if domain in QONNX_DOMAINS and n.op_type not in QONNX_OPS:
            problems.append(f"Node {label!r} ({domain}.{n.op_type}, opset {opset}): operator "
                            f"{n.op_type!r} of domain {domain!r} is not supported (of this "
                            f"domain only {', '.join(QONNX_OPS)})")
            continue
        if domain not in SUPPORTED_DOMAINS and domain not in QONNX_DOMAINS:
            # MD-03 / OP-06: an implementation supports every operator of a domain or
            # rejects the model. Besides ai.onnx, only the QONNX quantizers are implemented
            # (frontend/qonnx.py); their domains' other operators are refused above.
            problems.append(f"Node {label!r} ({domain}.{n.op_type}, opset {opset}): domain "
                            f"{domain!r} is not supported (only ai.onnx operators; "
                            f"model-local functions are inlined)")
            continue
        try:
            attrs = {a.name: _attr_value(a, where) for a in n.attribute}
            if n.op_type == "Constant" and domain == "" and len(n.output) == 1:
                arr = _constant_value(attrs, where)
                constants[n.output[0]] = arr
                tensors[n.output[0]] = TensorInfo(arr.dtype.name, tuple(arr.shape))
                continue
        except UnsupportedError as e:
            problems.extend(e.problems)
            continue
        nodes.append(Node(n.op_type, list(n.input), list(n.output), attrs, n.name, domain,
                          version, opset))
    if problems:
        raise UnsupportedError(problems)
    if not inputs or not len(g.output):
        raise UnsupportedError([f"Graph {g.name!r}: {len(inputs)} inputs without an "
                                f"initializer and {len(g.output)} outputs; a design needs at "
                                f"least one of each"])
    for name in inputs + [o.name for o in g.output]:
        info = tensors.get(name)
        if info is not None and info.shape is None and name not in constants:
            # SH-01 / GR-08: the main graph's inputs and outputs must have a rank.
            raise CheckError(f"Value {name!r}: graph input or output without a shape; the "
                             f"top-level graph must declare the rank of its inputs and "
                             f"outputs")
    _check_broadcasts(nodes, tensors)
    props = {p.key: p.value for p in model.metadata_props}
    meta = {
        "ir_version": int(model.ir_version),
        "producer_name": model.producer_name,
        "producer_version": model.producer_version,
        "domain": model.domain,
        "model_version": int(model.model_version),
        "doc_string": model.doc_string,
        "graph_doc_string": g.doc_string,
        "model_author": props.get("model_author", ""),
        "model_license": props.get("model_license", ""),
        "metadata_props": props,
        "opset_import": {(d or "ai.onnx"): v for d, v in sorted(opsets.items())},
    }
    semver = _semver(int(model.model_version))
    if semver is not None:
        meta["model_version_semver"] = semver
    return Graph(g.name, nodes, inputs, [o.name for o in g.output], constants, tensors,
                 opsets, meta)


def _constant_value(attrs: dict, where: str) -> np.ndarray:
    """ND-10: a Constant node is an initializer (value, sparse_value, value_float(s),
    value_int(s)); string constants are refused by name."""
    for key in ("value", "sparse_value"):
        if key in attrs:
            return np.asarray(attrs[key])
    for key, dtype in (("value_float", np.float32), ("value_int", np.int64),
                       ("value_floats", np.float32), ("value_ints", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key], dtype=dtype)
    raise UnsupportedError([f"{where}: Constant with attributes {sorted(attrs)} is not "
                            f"supported (string constants cannot be compiled)"])


def load_model(path, lenient: bool = False) -> Graph:
    """Read ``path`` (or a ModelProto), check it, infer shapes, bind the batch dimension to 1
    and import it into our IR.

    Raises
    ------
    LoadError, CheckError, UnsupportedError
    """
    model = _read(path)  # a copy when given a ModelProto: the caller's is never mutated
    model = check_model(model, lenient=lenient)
    return import_model(model)
