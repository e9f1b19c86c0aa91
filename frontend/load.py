"""Load an ONNX model: read it, check it, import it into our IR.

``load_model(path, lenient=False)`` is the only place that touches protobuf; it returns an
:class:`~onnx2fpga.frontend.ir.Graph`. It runs three stages, each a function of its own:

1. read: parse the file (or copy a ModelProto) and resolve its external data, refusing any
   location outside the model's folder;
2. :func:`~onnx2fpga.frontend.check.check_model`: validation, the lenient repairs, the ONNX
   checker and strict shape inference (see :mod:`onnx2fpga.frontend.check`);
3. :func:`import_model`: the checked ModelProto becomes our IR.

A model file is untrusted input: every size, shape, name and external-data location is
validated before onnx's C++ checker and shape inference, numpy or the file system act on it,
and every failure is one of our own errors naming the tensor, node or value
(``docs/onnx-conformance.md`` lists the stages and, for each item of
``shared/spec/onnx-consumer-checklist.md``, what is done and which test shows it).

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
from ..sim.host import ML_DOMAIN, ML_HOST_OPS
from .check import (
    MAX_ELEMENTS,
    QONNX_DOMAINS,
    QONNX_OPS,
    Onnx2FpgaWarning,
    all_tensors,
    check_model,
    node_label,
    onnx_module,
    sparse_to_dense,
    tensor_to_array,
    type_name,
)
from .ir import Graph, Node, TensorInfo
from .sklearn import REWRITTEN_ML_OPS

# check_model, Onnx2FpgaWarning, MAX_ELEMENTS and the QONNX names are defined in
# frontend/check.py and offered here too: they belong to the loader's interface.
__all__ = ["Onnx2FpgaWarning", "load_model", "import_model", "check_model", "QONNX_DOMAINS",
           "QONNX_OPS", "MAX_ELEMENTS", "MAX_FILE_BYTES", "SUPPORTED_DOMAINS"]

# Protobuf cannot parse messages of 2 GiB or more.
MAX_FILE_BYTES = (1 << 31) - 1


def _read(path) -> object:
    """Parse a file (or copy a ModelProto) and resolve its external data (ED-01)."""
    onnx = onnx_module()
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
    # Read what the size says (plus one byte, to see a file that grew): a read of
    # MAX_FILE_BYTES + 1 reserved 2 GiB for every model, however small.
    with open(path, "rb") as f:
        data = f.read(size + 1)
    if len(data) > size:
        raise LoadError(f"{path}: changed while being read; not loaded")
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
                if is_repeated(field):
                    stack.extend(value)
                else:
                    stack.append(value)
            elif field.type == STRING:
                values = value if is_repeated(field) else [value]
                if any(not isinstance(v, str) for v in values):
                    raise LoadError(f"{path}: field {field.full_name!r} holds a string that "
                                    f"is not valid UTF-8")


def is_repeated(field) -> bool:
    """Whether a protobuf ``FieldDescriptor`` is a repeated field, on every protobuf that
    ``onnx>=1.16`` admits: ``is_repeated`` exists from protobuf 6.31 on, where ``label`` is
    deprecated (and later gone); older versions have ``label`` only."""
    flag = getattr(field, "is_repeated", None)
    if flag is not None:
        return bool(flag)
    return field.label == field.LABEL_REPEATED


def _decode_errors():
    from google.protobuf.message import DecodeError
    return (DecodeError, RuntimeError, ValueError)




def _check_external_data(model, base_dir: str | None, path: str) -> None:
    """Load external tensor data, refusing any location outside the model's folder.

    The location is resolved with every symbolic link followed, and the resolved file must
    lie inside the (resolved) folder of the model file: ``../`` escapes, absolute paths and
    symbolic links pointing outside are refused before anything is opened. A model given as
    a ModelProto has no folder, so its external data is refused.
    """
    onnx = onnx_module()
    base = os.path.realpath(base_dir) if base_dir is not None else None
    for tensor, what in all_tensors(model):
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




# Operator domains the passes and kernels implement ("" is ai.onnx); of ai.onnx.ml only the
# host operators of :data:`onnx2fpga.sim.host.ML_HOST_OPS` and the linear models
# frontend/sklearn.py rewrites.
SUPPORTED_DOMAINS = ("", ML_DOMAIN)

# ZipMap turns a tensor into a sequence of maps, which no design can output.
_ZIPMAP_HINT = ("ZipMap outputs a sequence of maps, which cannot be compiled; export the "
                "classifier without it (skl2onnx: to_onnx(model, X, options={'zipmap': "
                "False}), which outputs the probabilities as a tensor)")


def _attr_value(attr, where: str):
    onnx = onnx_module()

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
        return tensor_to_array(attr.t, what)
    if t == A.TENSORS:
        return [tensor_to_array(x, what) for x in attr.tensors]
    if t == A.SPARSE_TENSOR:
        return sparse_to_dense(attr.sparse_tensor, what)
    if t == A.SPARSE_TENSORS:
        return [sparse_to_dense(x, what) for x in attr.sparse_tensors]
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




def _tensor_info(vi) -> TensorInfo | None:
    onnx = onnx_module()
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)).name
    except (KeyError, ValueError, TypeError):
        dtype = type_name(tt.elem_type).lower()
    shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                  for d in tt.shape.dim) if tt.HasField("shape") else None
    return TensorInfo(dtype, shape)




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
    onnx = onnx_module()
    g = model.graph
    opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version)
              for o in model.opset_import}
    constants: dict[str, np.ndarray] = {}
    problems = []
    for t in g.initializer:
        try:
            constants[t.name] = tensor_to_array(t, "Initializer")
        except UnsupportedError as e:
            problems.extend(e.problems)
    for sp in g.sparse_initializer:
        try:
            constants[sp.values.name] = sparse_to_dense(sp, "Sparse initializer")
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
    zipmaps = {o for n in g.node if n.op_type == "ZipMap" and n.domain == ML_DOMAIN
               for o in n.output}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        info = _tensor_info(vi)
        if info is not None:
            tensors[vi.name] = info
        elif vi.name not in constants and vi.name not in zipmaps:  # ZipMap: said below
            kind = vi.type.WhichOneof("value") or "untyped"
            problems.append(f"Value {vi.name!r}: {kind} values are not supported (tensors "
                            f"only)")
    for name, arr in constants.items():
        tensors[name] = TensorInfo(arr.dtype.name, tuple(arr.shape))
    nodes = []
    for k, n in enumerate(g.node):
        domain = "" if n.domain == "ai.onnx" else n.domain
        label = node_label(n, k)
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
        if domain == ML_DOMAIN and n.op_type not in ML_HOST_OPS and \
                n.op_type not in REWRITTEN_ML_OPS:
            why = _ZIPMAP_HINT if n.op_type == "ZipMap" else (
                f"operator {n.op_type!r} of domain {domain!r} is not supported (of this "
                f"domain only {', '.join(ML_HOST_OPS)} on the host, and "
                f"{', '.join(REWRITTEN_ML_OPS)} as a Gemm)")
            problems.append(f"Node {label!r} ({domain}.{n.op_type}, opset {opset}): {why}")
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
