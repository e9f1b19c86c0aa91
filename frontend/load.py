"""Load, check and import an ONNX model into our IR.

``load_model(path, lenient=False)`` is the only place that touches protobuf; it returns an
:class:`~onnx2fpga.frontend.ir.Graph`. Strict mode accepts what the ONNX checker and strict
shape inference accept. Lenient mode additionally repairs the deviations that real exporters
produce (ids from ``shared/spec/onnx-consumer-checklist.md``):

* MD-04: no ``ai.onnx`` opset import: the newest opset released with the model's IR version
  is assumed;
* ND-02: a custom domain used by nodes but not declared: version 1 is assumed;
* GR-01: an empty graph name;
* GR-02: a node list that is not topologically sorted (re-sorted; cycles are always fatal).

Every repair is reported through :class:`Onnx2FpgaWarning` naming what was repaired.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from ..errors import CheckError, LoadError, UnsupportedError
from .ir import Graph, Node, TensorInfo

__all__ = ["Onnx2FpgaWarning", "load_model", "import_model", "check_model"]

# Largest tensor the compiler will ever materialize (elements); larger ones are refused
# before any allocation so that a lying file cannot exhaust memory.
MAX_ELEMENTS = 1 << 28


class Onnx2FpgaWarning(UserWarning):
    """A model was accepted after a lenient repair, or a value was treated specially."""


def _onnx():
    import onnx  # imported lazily: `hw`, `sim` and `boards` never need it
    return onnx


def _read(path) -> object:
    onnx = _onnx()
    if hasattr(path, "SerializeToString"):
        return path  # already a ModelProto
    path = os.fspath(path)
    if not os.path.exists(path):
        raise LoadError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise LoadError(f"{path}: not a file")
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise LoadError(f"{path}: empty file, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf raises DecodeError or RuntimeError by backend
        raise LoadError(f"{path}: not an ONNX model (protobuf parse failed: {e})") from None
    if not model.HasField("graph") or model.ir_version == 0:
        raise LoadError(f"{path}: not an ONNX model (no graph or no ir_version)")
    _load_external_data(model, os.path.dirname(os.path.abspath(path)), path)
    return model


def _load_external_data(model, base_dir: str, path: str) -> None:
    """Load external tensor data, refusing any location outside the model's folder."""
    onnx = _onnx()
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    base = os.path.realpath(base_dir)
    for tensor in _get_all_tensors(model):
        if not uses_external_data(tensor):
            continue
        info = {e.key: e.value for e in tensor.external_data}
        loc = info.get("location", "")
        target = os.path.realpath(os.path.join(base, loc))
        if not loc or os.path.isabs(loc) or os.path.commonpath([base, target]) != base:
            raise LoadError(f"{path}: tensor {tensor.name!r} has external data at {loc!r}, "
                            f"outside the model's folder")
        if not os.path.isfile(target):
            raise LoadError(f"{path}: tensor {tensor.name!r}: external data file {loc!r} "
                            f"not found")
        offset = int(info.get("offset", 0) or 0)
        size = os.path.getsize(target)
        length = int(info["length"]) if "length" in info else size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise LoadError(f"{path}: tensor {tensor.name!r}: external data range "
                            f"[{offset}, {offset + length}) is past the end of {loc!r} "
                            f"({size} bytes)")
        if length > MAX_ELEMENTS * 8:
            raise LoadError(f"{path}: tensor {tensor.name!r}: external data of {length} bytes "
                            f"is too large")
        with open(target, "rb") as f:
            f.seek(offset)
            tensor.raw_data = f.read(length)
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
    """Check the node order; with ``repair``, re-sort it (GR-02). Cycles are always fatal."""
    g = model.graph
    known = {i.name for i in g.input} | {t.name for t in g.initializer} | \
        {t.values.name for t in g.sparse_initializer}
    order, pending = [], list(range(len(g.node)))
    produced_by = {o: k for k, n in enumerate(g.node) for o in n.output if o}
    progressed = True
    while pending and progressed:
        progressed = False
        rest = []
        for k in pending:
            n = g.node[k]
            if all((not i) or i in known for i in n.input):
                order.append(k)
                known.update(o for o in n.output if o)
                progressed = True
            else:
                rest.append(k)
        pending = rest
    if pending:
        n = g.node[pending[0]]
        missing = [i for i in n.input if i and i not in known]
        kind = "a cycle" if all(i in produced_by for i in missing) else "an undefined input"
        raise CheckError(f"Node {n.name or n.output[0]!r} ({n.op_type}): input "
                         f"{missing[0]!r} is {kind.split(' ', 1)[1]} ({kind})")
    if order != sorted(order):
        if not repair:
            return  # the checker reports it in strict mode
        nodes = [g.node[k] for k in order]
        del g.node[:]
        g.node.extend(nodes)
        _warn("GR-02: node list was not topologically sorted; re-sorted")


def _bind_batch(model) -> None:
    """Bind a symbolic leading (batch) dimension of graph inputs and outputs to 1."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    for vi in list(g.input) + list(g.output):
        if vi.name in inits or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            if axis == 0:
                d.Clear()
                d.dim_value = 1
            elif vi in g.input:
                what = repr(d.dim_param) if d.HasField("dim_param") else "unknown"
                raise CheckError(f"Input {vi.name!r}: dimension {axis} is symbolic ({what}); "
                                 f"only the leading batch dimension is bound (to 1)")


def check_model(model, lenient: bool = False):
    """Run the ONNX checker and strict shape inference; return the inferred model."""
    onnx = _onnx()
    if model.ir_version > onnx.IR_VERSION:
        raise CheckError(f"IR version {model.ir_version} is newer than this onnx supports "
                         f"({onnx.IR_VERSION})")
    if lenient:
        _lenient_repairs(model)
    else:
        _toposort(model, repair=False)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0]
        hint = "" if lenient else " (--lenient accepts common exporter deviations)"
        raise CheckError(f"ONNX checker: {first}{hint}") from None
    _bind_batch(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                     data_prop=True)
    except Exception as e:  # InferenceError, or a checker error from deep inside
        first = str(e).strip().splitlines()[0]
        raise CheckError(f"Shape inference: {first}") from None
    return inferred


def _attr_value(attr, where: str):
    onnx = _onnx()
    from onnx import numpy_helper

    t = attr.type
    A = onnx.AttributeProto
    if t in (A.GRAPH, A.GRAPHS):
        raise UnsupportedError([f"{where}: attribute {attr.name!r} holds a subgraph "
                                f"(control flow is not supported)"])
    if t == A.TENSOR:
        return numpy_helper.to_array(attr.t)
    if t == A.TENSORS:
        return [numpy_helper.to_array(x) for x in attr.tensors]
    if t == A.SPARSE_TENSOR:
        return _sparse_to_dense(attr.sparse_tensor, where)
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
    return value


def _sparse_to_dense(sp, where: str) -> np.ndarray:
    from onnx import numpy_helper

    shape = tuple(int(d) for d in sp.dims)
    n = int(np.prod(shape)) if shape else 1
    if any(d < 0 for d in shape) or n > MAX_ELEMENTS:
        raise CheckError(f"{where}: sparse tensor shape {shape} is invalid or too large")
    values = numpy_helper.to_array(sp.values)
    indices = numpy_helper.to_array(sp.indices).astype(np.int64)
    dense = np.zeros(n, dtype=values.dtype)
    if indices.ndim == 2:
        indices = np.ravel_multi_index(indices.T, shape)
    if indices.size and (indices.min() < 0 or indices.max() >= n):
        raise CheckError(f"{where}: sparse tensor index out of range")
    dense[indices.reshape(-1)] = values.reshape(-1)
    return dense.reshape(shape)


def _tensor_info(vi) -> TensorInfo | None:
    onnx = _onnx()
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)).name
    except Exception:
        dtype = onnx.TensorProto.DataType.Name(tt.elem_type).lower()
    shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                  for d in tt.shape.dim) if tt.HasField("shape") else None
    return TensorInfo(dtype, shape)


def _to_array(tensor, where: str) -> np.ndarray:
    from onnx import numpy_helper

    n = int(np.prod([int(d) for d in tensor.dims])) if len(tensor.dims) else 1
    if any(int(d) < 0 for d in tensor.dims) or n > MAX_ELEMENTS:
        raise CheckError(f"{where}: tensor {tensor.name!r} has an invalid or too large shape "
                         f"{list(tensor.dims)}")
    try:
        return numpy_helper.to_array(tensor)
    except Exception as e:
        raise CheckError(f"{where}: tensor {tensor.name!r} cannot be decoded: {e}") from None


def import_model(model) -> Graph:
    """Turn a checked, shape-inferred ModelProto into our IR (no protobuf beyond this point)."""
    onnx = _onnx()
    g = model.graph
    opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version)
              for o in model.opset_import}
    constants: dict[str, np.ndarray] = {}
    for t in g.initializer:
        constants[t.name] = _to_array(t, "Initializer")
    for sp in g.sparse_initializer:
        constants[sp.values.name] = _sparse_to_dense(sp, f"Sparse initializer "
                                                     f"{sp.values.name!r}")
    inputs = []
    for vi in g.input:
        if vi.name in constants:
            warnings.warn(f"GR-05: input {vi.name!r} has an initializer (an overridable "
                          f"default); it is treated as a constant and baked into the design",
                          Onnx2FpgaWarning, stacklevel=2)
        else:
            inputs.append(vi.name)
    tensors = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        info = _tensor_info(vi)
        if info is not None:
            tensors[vi.name] = info
    for name, arr in constants.items():
        tensors[name] = TensorInfo(arr.dtype.name, tuple(arr.shape))
    nodes = []
    problems = []
    for k, n in enumerate(g.node):
        domain = "" if n.domain == "ai.onnx" else n.domain
        label = n.name or (n.output[0] if n.output else f"#{k}")
        opset = opsets.get(domain, 0)
        try:
            version = onnx.defs.get_schema(n.op_type, opset, domain).since_version
        except onnx.defs.SchemaError:
            version = 0
        where = f"Node {label!r} ({n.op_type}, opset {opset})"
        try:
            attrs = {a.name: _attr_value(a, where) for a in n.attribute}
        except UnsupportedError as e:
            problems.extend(e.problems)
            continue
        if n.op_type == "Constant" and domain == "" and len(n.output) == 1:
            constants[n.output[0]] = _constant_value(attrs, where)
            arr = constants[n.output[0]]
            tensors[n.output[0]] = TensorInfo(arr.dtype.name, tuple(arr.shape))
            continue
        nodes.append(Node(n.op_type, list(n.input), list(n.output), attrs, n.name, domain,
                          version, opset))
    if problems:
        raise UnsupportedError(problems)
    meta = {
        "ir_version": int(model.ir_version),
        "producer_name": model.producer_name,
        "producer_version": model.producer_version,
        "domain": model.domain,
        "model_version": int(model.model_version),
        "doc_string": model.doc_string,
        "metadata_props": {p.key: p.value for p in model.metadata_props},
        "opset_import": {(d or "ai.onnx"): v for d, v in sorted(opsets.items())},
    }
    return Graph(g.name, nodes, inputs, [o.name for o in g.output], constants, tensors,
                 opsets, meta)


def _constant_value(attrs: dict, where: str) -> np.ndarray:
    if "value" in attrs:
        return np.asarray(attrs["value"])
    for key, dtype in (("value_float", np.float32), ("value_int", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key], dtype=dtype)
    for key, dtype in (("value_floats", np.float32), ("value_ints", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key], dtype=dtype)
    raise UnsupportedError([f"{where}: Constant with attributes {sorted(attrs)} is not "
                            f"supported"])


def load_model(path, lenient: bool = False) -> Graph:
    """Read ``path`` (or a ModelProto), check it, infer shapes, bind the batch dimension to 1
    and import it into our IR.

    Raises
    ------
    LoadError, CheckError, UnsupportedError
    """
    model = _read(path)
    if hasattr(path, "SerializeToString"):
        model = type(model)()
        model.CopyFrom(path)  # never mutate the caller's ModelProto
    model = check_model(model, lenient=lenient)
    return import_model(model)
