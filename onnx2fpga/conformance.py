"""The ONNX backend node tests, run through our golden model and, where they compile, the RTL.

``onnx.backend.test.loader.load_model_tests(kind="node")`` builds every node test of the
installed onnx (a one-node model and ``test_data_set_*`` inputs and expected outputs). For each
test of an operator we claim (:data:`CLAIMED_OPS`, or the operators asked for):

* **golden**: the model is loaded by :func:`onnx2fpga.frontend.load.load_model` with every
  input after the first bound to its test value as a constant (weights, scales and zero points
  are constants in a compiled design; most node tests feed them as graph inputs), Q/DQ
  parameters are resolved (:func:`~onnx2fpga.frontend.qdq.normalize_qdq`), geometry resolved,
  and every node is evaluated by its golden / host function (:mod:`onnx2fpga.sim.host`, which
  calls :mod:`onnx2fpga.sim.golden` for the integer operators).
* **rtl**: the same bound model goes through :func:`onnx2fpga.compile` and
  ``simulate(engine="rtl")`` (Verilator with random stalls). Most node tests do not compile
  to hardware (float models, integer results that are not requantized, batches of matrices):
  those are reported "golden only" with the compiler's reason.

Results: ``exact`` (bit-identical), ``within one LSB`` (integer outputs differing by at most
one step), ``within tolerance`` (float outputs inside the test's own ``rtol`` / ``atol``),
``failed`` (why) and ``unsupported`` (why: an element type or option we do not claim, refused
by the frontend with its own message). Only our deliberate refusals count as unsupported; any
other error is a failure.
"""

from __future__ import annotations

import functools
import os
import tempfile
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["QUANT_OPS", "CLAIMED_OPS", "Result", "run_conformance", "format_table",
           "node_tests"]

#: The quantization operators whose every node test must pass (or be refused by type).
QUANT_OPS = ("QuantizeLinear", "DequantizeLinear", "QLinearMatMul", "QLinearConv",
             "MatMulInteger", "ConvInteger")
#: The operators ``onnx2fpga conformance`` runs by default: the quantization operators and the
#: float operators of the hardware layers that the host model implements.
CLAIMED_OPS = QUANT_OPS + ("Conv", "MaxPool", "AveragePool", "GlobalAveragePool",
                           "GlobalMaxPool", "Gemm", "MatMul", "Relu", "LeakyRelu", "Add",
                           "Concat", "Flatten", "Reshape", "Transpose", "Identity")


@dataclass
class Result:
    """One node test through one or two engines.

    ``result`` is ``"exact"``, ``"within one LSB"``, ``"within tolerance"``, ``"failed"`` or
    ``"unsupported"`` (the golden model's result, or the RTL's where it ran and is worse);
    ``reason`` says why for the last two; ``engine`` is ``"golden"`` or ``"golden+rtl"``;
    ``rtl`` is the RTL's own result, or why the test did not compile (``"golden only: ..."``).
    """
    test: str
    op: str
    result: str
    reason: str = ""
    engine: str = "golden"
    rtl: str = ""
    details: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.result in ("exact", "within one LSB", "within tolerance")

    def to_json(self) -> dict:
        return asdict(self)


_RANK = {"exact": 0, "within tolerance": 1, "within one LSB": 1, "failed": 3,
         "unsupported": 2}


@functools.lru_cache(maxsize=1)
def _all_node_tests() -> tuple:
    # Building every node test takes seconds; the test cases are never modified (models are
    # copied before binding), so one process builds them once.
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # the test generators' own numpy warnings
        return tuple(load_model_tests(kind="node"))


def node_tests(ops=None) -> list:
    """The onnx backend node tests of one-node models whose operator is in ``ops`` (every
    operator if None), sorted by name; ``_expanded`` variants (function bodies) are left out."""
    out = []
    for t in _all_node_tests():
        if t.model is None or t.name.endswith("_expanded"):
            continue
        nodes = [n for n in t.model.graph.node]
        if len(nodes) != 1 or (ops is not None and nodes[0].op_type not in ops):
            continue
        out.append(t)
    return sorted(out, key=lambda t: t.name)


def _bind(model, inputs):
    """A copy of ``model`` with every graph input after the first (that has a test value)
    turned into an initializer holding that value."""
    import onnx
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = []
    for k, vi in enumerate(m.graph.input):
        if k == 0 or k >= len(inputs):
            keep.append(vi)
            continue
        value = inputs[k]
        if hasattr(value, "SerializeToString"):      # a TensorProto (types numpy lacks)
            t = onnx.TensorProto()
            t.CopyFrom(value)
            t.name = vi.name
        else:
            t = numpy_helper.from_array(np.asarray(value), vi.name)
        m.graph.initializer.append(t)
    del m.graph.input[:]
    m.graph.input.extend(keep)
    return m


def _array(v) -> np.ndarray:
    if hasattr(v, "SerializeToString"):
        from onnx import numpy_helper
        return numpy_helper.to_array(v)
    return np.asarray(v)


def _compare(got, want, rtol, atol, dtype=None) -> tuple[str, str]:
    """Compare an output with the expected one. ``dtype`` is the element type our model
    declares for it (the host model keeps integer tensors as int64 values)."""
    got = np.asarray(got)
    want = _array(want)
    dtype = got.dtype.name if dtype is None else dtype
    if got.shape != want.shape:
        return "failed", f"shape {list(got.shape)}, expected {list(want.shape)}"
    if dtype != want.dtype.name:
        return "failed", f"element type {dtype}, expected {want.dtype.name}"
    if want.dtype.kind in "iub" or want.dtype.name in ("int4", "uint4", "int2", "uint2"):
        g, w = got.astype(np.int64), want.astype(np.int64)
        if np.array_equal(g, w):
            return "exact", ""
        diff = int(np.abs(g - w).max(initial=0))
        n = int(np.sum(g != w))
        if diff <= 1:
            return "within one LSB", f"{n} of {w.size} values one step off"
        return "failed", f"{n} of {w.size} values differ, by up to {diff}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    if np.array_equal(g, w, equal_nan=True):
        return "exact", ""
    if np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
        err = float(np.nanmax(np.abs(g - w)))
        return "within tolerance", f"max |error| {err:.3g} (rtol {rtol:g}, atol {atol:g})"
    err = float(np.nanmax(np.abs(g - w)))
    return "failed", f"max |error| {err:.3g} beyond rtol {rtol:g}, atol {atol:g}"


def _worst(results):
    return max(results, key=lambda r: _RANK[r[0]])


def _golden(test, op) -> tuple[Result, list]:
    from .errors import CheckError, LoadError, UnsupportedError
    from .frontend.load import load_model
    from .frontend.qdq import normalize_qdq
    from .frontend.resolve import resolve_geometry
    from .sim import host

    outcomes, bound = [], []
    for inputs, outputs in test.data_sets:
        model = _bind(test.model, inputs)
        bound.append((model, inputs, outputs))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graph = load_model(model)
                normalize_qdq(graph)
                resolve_geometry(graph)
        except UnsupportedError as e:
            return Result(test.name, op, "unsupported", str(e)), []
        except (LoadError, CheckError) as e:
            return Result(test.name, op, "failed", f"{type(e).__name__}: {e}"), []
        missing = [n.op for n in graph.nodes if not host.supported(n.op, n.domain)]
        if missing:
            return Result(test.name, op, "unsupported", f"no golden or host function for "
                          f"{', '.join(sorted(set(missing)))}"), []
        env = {graph.inputs[0]: _array(inputs[0])} if graph.inputs else {}
        try:
            env = host.run_nodes(graph.nodes, env, graph.constants)
        except host.HostOpError as e:
            return Result(test.name, op, "failed", str(e)), []
        for name, want in zip(graph.outputs, outputs):
            outcomes.append(_compare(env[name], want, test.rtol, test.atol,
                                     graph.tensors[name].dtype))
    result, reason = _worst(outcomes) if outcomes else ("failed", "no test data")
    return Result(test.name, op, result, reason), bound


def _rtl(res: Result, bound, workdir) -> None:
    from . import compile as compile_
    from .errors import Onnx2FpgaError

    outcomes = []
    for k, (model, inputs, outputs) in enumerate(bound):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                d = compile_(model, os.path.join(workdir, f"{res.test}_{k}"))
        except Onnx2FpgaError as e:
            res.rtl = f"golden only: {e}"
            return
        if len(outputs) != 1:
            res.rtl = "golden only: several outputs"
            return
        x, want = _array(inputs[0]), _array(outputs[0])
        y = d.simulate(x[None], engine="rtl", seed=k)
        outcomes.append(_compare(y.reshape(want.shape), want, 0.0, 0.0,
                                 d.design.outputs[0]["dtype"]))
        res.details["rtl_cycles_per_inference"] = d.last_run["cycles_per_inference"]
    result, reason = _worst(outcomes)
    res.engine = "golden+rtl"
    res.rtl = result + (f" ({reason})" if reason else "")
    if _RANK[result] > _RANK[res.result]:
        res.result, res.reason = result, f"rtl: {reason}"


def run_conformance(ops=None, *, rtl: bool = True, progress=None) -> list[Result]:
    """Run the node tests of ``ops`` (default :data:`CLAIMED_OPS`); see the module docstring.

    Parameters
    ----------
    ops : sequence of str, optional
        ONNX operator names, spelled as ONNX does.
    rtl : bool
        Also compile each test that passes the golden model and simulate it in Verilator.
    progress : callable, optional
        Called with one line per test.

    Raises
    ------
    TypeError
        ``ops`` is not a sequence of names, or ``rtl`` not a bool.
    ValueError
        An operator without any node test.
    """
    if isinstance(ops, str) or not (ops is None or all(isinstance(o, str) for o in ops)):
        raise TypeError(f"ops must be a sequence of operator names, not {ops!r}")
    if not isinstance(rtl, bool):
        raise TypeError(f"rtl must be a bool, not {rtl!r}")
    ops = tuple(CLAIMED_OPS if ops is None else ops)
    tests = node_tests(ops)
    found = {t.model.graph.node[0].op_type for t in tests}
    missing = [op for op in ops if op not in found]
    if missing:
        raise ValueError(f"ops must be operators with node tests, not {missing!r}")
    results = []
    with tempfile.TemporaryDirectory(prefix="onnx2fpga-conformance-") as workdir:
        for t in tests:
            op = t.model.graph.node[0].op_type
            res, bound = _golden(t, op)
            if rtl and res.passed:
                _rtl(res, bound, workdir)
            results.append(res)
            if progress is not None:
                progress(f"{res.test}: {res.result}")
    return results


def format_table(results) -> str:
    """The results as a text table and a summary line."""
    rows = [("test", "op", "result", "engine", "why / rtl")]
    for r in results:
        why = r.reason or ""
        if r.rtl and r.engine == "golden":
            why = (why + "; " if why else "") + r.rtl
        rows.append((r.test, r.op, r.result, r.engine, why))
    widths = [max(len(row[k]) for row in rows) for k in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4]
             for row in rows]
    counts = {}
    for r in results:
        counts[r.result] = counts.get(r.result, 0) + 1
    lines.append("")
    lines.append(f"{len(results)} tests: " + ", ".join(f"{n} {k}" for k, n in sorted(
        counts.items(), key=lambda kv: _RANK[kv[0]])))
    return "\n".join(lines)
