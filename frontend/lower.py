"""Lower a quantized IR graph (QDQ form) into a :class:`~onnx2fpga.dataflow.Design`.

The graph is partitioned into three parts:

* **head** (host): everything that computes the first quantized activation from the model
  input, ending with its ``QuantizeLinear``;
* **hardware**: a chain of integer layers, each ``DequantizeLinear -> core -> epilogue ->
  QuantizeLinear`` where the core is MatMul / Gemm with a quantized constant weight (or
  nothing, for an elementwise layer) and the epilogue is any of a constant Add (bias), Relu,
  Clip, and order-preserving reshapes;
* **tail** (host): everything after the last quantized activation of the chain, starting
  with its ``DequantizeLinear`` (a float Softmax, scaling, ...).

Float scales become exact integer requantization: ``M = s_in * s_w[c] / s_out`` is turned into
a multiplier of ``multiplier_bits`` significant bits and a common right shift; float biases
that are not on the accumulator's scale become a per-channel offset on the same scale.
"""

from __future__ import annotations

import math

import numpy as np

from ..dataflow import (
    Dataflow,
    DenseLayer,
    Design,
    HostNode,
    IntType,
    Port,
    RequantLayer,
    RequantStage,
)
from ..errors import UnsupportedError
from ..sim import golden, host
from .ir import Graph, Node

__all__ = ["lower", "HW_OPS"]

HW_OPS = ("MatMul", "Gemm", "Add", "Relu", "Clip", "Reshape", "Flatten", "Squeeze",
          "Unsqueeze", "Identity")
_PASS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


def _requant_params(scale: np.ndarray, multiplier_bits: int):
    """Multipliers and a common shift with ``m = round(scale * 2**shift)``, the largest
    multiplier having exactly ``multiplier_bits`` significant bits."""
    scale = np.asarray(scale, dtype=np.float64).reshape(-1)
    top = float(scale.max())
    if top <= 0:
        return np.zeros(scale.shape, np.int64), 0
    shift = multiplier_bits - 1 - math.floor(math.log2(top))
    shift = max(0, min(shift, 48))
    m = np.rint(scale * 2.0 ** shift).astype(np.int64)
    if m.max() >= (1 << multiplier_bits) and shift > 0:  # rounding carried into a new bit
        shift -= 1
        m = np.rint(scale * 2.0 ** shift).astype(np.int64)
    return m, shift


def _f32_ratio(num, den) -> np.ndarray:
    """``num / den`` evaluated in float32, as onnxruntime's integer kernels compute their
    requantization scale (``a_scale * b_scale / y_scale``); matching it keeps the golden
    model's rounding decisions equal to onnxruntime's except at float32 product ties."""
    return (np.asarray(num, np.float32) / np.float32(den)).astype(np.float32).reshape(-1)


class _Chain:
    """The nodes between a DequantizeLinear and the next QuantizeLinear, matched."""

    def __init__(self):
        self.nodes: list[Node] = []
        self.core: Node | None = None
        self.weight = None        # int (out, in), zero point removed
        self.w_scale = None       # float64 (out,)
        self.alpha = 1.0
        self.int_bias = None      # int (out,) on the accumulator scale
        self.float_bias = None    # float64 (out,) or scalar, real units
        self.lo = -math.inf       # real-valued clip bounds from Relu / Clip
        self.hi = math.inf
        self.quant: Node | None = None


class _Lowerer:
    def __init__(self, graph: Graph, multiplier_bits: int, rounding: str):
        # Measured on onnxruntime's QDQ MLPs (benchmarks/ort_agreement.py): 16 bits give
        # 99.875 % exact outputs and at most 2 LSB; 24 bits 99.993 % and at most 1 LSB.
        self.g = graph
        self.mbits = multiplier_bits
        self.rounding = rounding
        self.prod = graph.producers()
        self.cons = graph.consumers()

    # -- helpers ---------------------------------------------------------------------------
    def const(self, name):
        return self.g.constants.get(name)

    def sole_consumer(self, tensor) -> Node | None:
        c = self.cons.get(tensor, [])
        if len(c) != 1 or tensor in self.g.outputs:
            return None
        return c[0]

    def dq_constant(self, name):
        """``(int array, scale, zero_point, axis, qtype)`` if ``name`` is DQ(constant)."""
        n = self.prod.get(name)
        if n is None or n.op != "DequantizeLinear" or n.domain not in ("", "ai.onnx") or \
                n.inputs[0] not in self.g.constants:
            return None
        a = n.attrs
        return (np.asarray(self.g.constants[n.inputs[0]]).astype(np.int64), a["scale"],
                a["zero_point"], a["axis"], a["qtype"], n)

    def float_constant(self, name):
        if name in self.g.constants:
            return np.asarray(self.g.constants[name], dtype=np.float64), None
        dq = self.dq_constant(name)
        if dq is not None:
            q, s, z, axis, _, node = dq
            return golden.dequantize_linear(q, s, z, axis if q.ndim > 1 else 0).astype(
                np.float64), node
        return None, None

    def size(self, tensor) -> int:
        info = self.g.tensors.get(tensor)
        if info is None or info.shape is None or any(not isinstance(d, int)
                                                     for d in info.shape):
            raise UnsupportedError([f"Tensor {tensor!r}: shape unknown after inference"])
        return int(np.prod(info.shape)) if info.shape else 1

    # -- matching --------------------------------------------------------------------------
    def match(self, f: str, in_size: int) -> _Chain | None:
        """Match the chain from float tensor ``f`` to the next QuantizeLinear."""
        ch = _Chain()
        t = f
        stage = "core"
        while True:
            n = self.sole_consumer(t)
            if n is None or n.domain not in ("", "ai.onnx"):
                return None
            if n.op == "QuantizeLinear":
                ch.quant = n
                ch.nodes.append(n)
                return ch
            if n.op in _PASS:
                ch.nodes.append(n)
                t = n.outputs[0]
                continue
            if stage == "core" and n.op in ("MatMul", "Gemm") and n.inputs[0] == t:
                if not self.match_core(ch, n, in_size):
                    return None
                stage = "bias"
            elif stage in ("core", "bias") and n.op == "Add":
                other = n.inputs[1] if n.inputs[0] == t else n.inputs[0]
                val, dqn = self.float_constant(other)
                if val is None:
                    return None
                if dqn is not None:
                    ch.nodes.append(dqn)
                if not self.add_bias(ch, val, dqn, other):
                    return None
                stage = "act"
            elif n.op == "Relu":
                ch.lo = max(ch.lo, 0.0)
                stage = "act"
            elif n.op == "Clip":
                lo, hi = self.clip_bounds(n)
                if lo is None:
                    return None
                ch.lo, ch.hi = max(ch.lo, lo), min(ch.hi, hi)
                stage = "act"
            else:
                return None
            ch.nodes.append(n)
            t = n.outputs[0]

    def clip_bounds(self, n):
        if n.version < 11:
            return float(n.attrs.get("min", -math.inf)), float(n.attrs.get("max", math.inf))
        vals = []
        for k, default in ((1, -math.inf), (2, math.inf)):
            name = n.inputs[k] if len(n.inputs) > k else ""
            if not name:
                vals.append(default)
                continue
            v, _ = self.float_constant(name)
            if v is None or v.size != 1:
                return None, None
            vals.append(float(v.reshape(())))
        return vals[0], vals[1]

    def match_core(self, ch: _Chain, n: Node, in_size: int) -> bool:
        wname = n.inputs[1]
        dq = self.dq_constant(wname)
        if dq is None:
            return False
        q, s, z, axis, _, dqn = dq
        if q.ndim != 2:
            return False
        if n.op == "Gemm":
            if n.attrs.get("transA", 0):
                return False
            trans = bool(n.attrs.get("transB", 0))
            ch.alpha = float(n.attrs.get("alpha", 1.0))
        else:
            trans = False
        out_axis = 0 if trans else 1
        w = q.T if not trans else q  # (out, in)
        axis = axis if axis >= 0 else axis + 2
        s = np.asarray(s, np.float64).reshape(-1)
        z = np.asarray(z, np.int64).reshape(-1)
        out = w.shape[0]
        if s.size == 1:
            s_out, z_out = np.full(out, s[0]), np.full(out, z[0])
        elif axis == out_axis and s.size == out:
            s_out, z_out = s, z
        else:
            return False  # scales along the reduction axis cannot be factored out
        if w.shape[1] != in_size:
            return False
        ch.core = n
        ch.weight = w - z_out[:, None]
        ch.w_scale = s_out
        ch.nodes.append(dqn)
        if n.op == "Gemm" and len(n.inputs) > 2 and n.inputs[2]:
            val, cdq = self.float_constant(n.inputs[2])
            if val is None:
                return False
            if cdq is not None:
                ch.nodes.append(cdq)
            beta = float(n.attrs.get("beta", 1.0))
            if not self.add_bias(ch, val * beta, cdq, n.inputs[2], factor=beta):
                return False
        return True

    def add_bias(self, ch: _Chain, val, dqn, name, factor=1.0) -> bool:
        """A constant added after the core (or to the input of an elementwise layer)."""
        val = np.asarray(val, dtype=np.float64)
        if ch.core is not None:
            out = ch.weight.shape[0]
            if val.size not in (1, out):
                return False
            val = np.broadcast_to(val.reshape(-1), (out,)).copy()
            # Integer bias when it sits exactly on the accumulator's scale (ORT's int32 bias).
            if dqn is not None and ch.int_bias is None and ch.float_bias is None:
                q, s, z, _, _, _ = self.dq_constant(name)
                # kept with its scale; `build` uses it only if that scale is the acc's
                ch.int_bias = (np.broadcast_to((q - z).reshape(-1), (out,)).astype(np.int64),
                               np.broadcast_to(np.asarray(s, np.float64).reshape(-1) * factor,
                                               (out,)))
                ch.float_bias = val
                return True
        ch.float_bias = val if ch.float_bias is None else ch.float_bias + val
        ch.int_bias = None
        return True

    # -- building layers -------------------------------------------------------------------
    def build(self, ch: _Chain, dq: Node, in_type: IntType, size: int, index: int):
        s_in = float(np.asarray(dq.attrs["scale"]).reshape(-1)[0])
        z_in = int(np.asarray(dq.attrs["zero_point"]).reshape(-1)[0])
        qa = ch.quant.attrs
        if np.asarray(qa["scale"]).size != 1:
            raise UnsupportedError([f"{ch.quant.describe()}: per-axis activation quantization "
                                    f"is not supported"])
        s_out = float(np.asarray(qa["scale"]).reshape(()))
        z_out = int(np.asarray(qa["zero_point"]).reshape(()))
        qtype = qa["qtype"]
        lo, hi = qtype.lo, qtype.hi
        if ch.lo > -math.inf:
            lo = max(lo, int(golden.quantize_linear(np.float32(ch.lo), s_out, z_out, lo, hi)))
        if ch.hi < math.inf:
            hi = min(hi, int(golden.quantize_linear(np.float32(ch.hi), s_out, z_out, lo, hi)))
        hi = max(hi, lo)
        names = [n.name or n.outputs[0] for n in [dq] + ch.nodes]
        if ch.core is None:
            # elementwise: y = q(s_in * (x - z_in) + bias)
            m, shift = _requant_params(_f32_ratio(np.float32(s_in), s_out), self.mbits)
            off = np.zeros(1, np.int64)
            if ch.float_bias is not None:
                off = np.rint(np.asarray(ch.float_bias).reshape(-1) / s_out * 2.0 ** shift
                              ).astype(np.int64)
                if off.size not in (1, size):
                    return None
            stage = RequantStage(m, off, shift, z_out, lo, hi, qtype, in_zero_point=z_in,
                                 rounding=self.rounding)
            return RequantLayer(f"eltwise{index}", in_type, size, [stage], nodes=names)
        out = ch.weight.shape[0]
        acc_scale = ch.alpha * s_in * ch.w_scale            # real value of one acc unit
        bias = np.zeros(out, np.int64)
        offset_real = np.zeros(out)
        if ch.int_bias is not None:
            qb, sb = ch.int_bias
            if np.allclose(sb, acc_scale, rtol=1e-6, atol=0):
                bias = qb
            else:
                offset_real = ch.float_bias
        elif ch.float_bias is not None:
            offset_real = ch.float_bias
        m, shift = _requant_params(_f32_ratio(np.float32(ch.alpha) * np.float32(s_in)
                                              * ch.w_scale.astype(np.float32), s_out),
                                   self.mbits)
        off = np.rint(np.asarray(offset_real) / s_out * 2.0 ** shift).astype(np.int64)
        if not np.any(off):
            off = np.zeros(1, np.int64)
        if np.all(m == m[0]):
            m = m[:1]
        stage = RequantStage(m, off, shift, z_out, lo, hi, qtype, rounding=self.rounding)
        wtype = IntType.for_range(min(int(ch.weight.min()), 0), max(int(ch.weight.max()), 0))
        if not wtype.signed:
            wtype = IntType(wtype.bits + 1, True)
        return DenseLayer(f"dense{index}", in_type, z_in, ch.weight, wtype, bias, [stage],
                          nodes=names)

    # -- the whole graph -------------------------------------------------------------------
    def run(self) -> Design:
        g = self.g
        if len(g.inputs) != 1 or len(g.outputs) != 1:
            raise UnsupportedError([f"Graph {g.name!r}: {len(g.inputs)} inputs and "
                                    f"{len(g.outputs)} outputs; exactly one of each is "
                                    f"supported"])
        # Entry: the first QuantizeLinear whose data input is computed from the model input.
        entry = None
        for n in g.nodes:
            if n.op == "QuantizeLinear" and n.domain in ("", "ai.onnx") and \
                    n.inputs[0] not in g.constants:
                entry = n
                break
        if entry is None:
            raise UnsupportedError([f"Graph {g.name!r}: no quantized activation found; "
                                    f"quantize the model or pass calibration data"])
        head = self.ancestors(entry)
        cur = entry.outputs[0]
        in_type = entry.attrs["qtype"]
        size = self.size(cur)
        q_entry = entry
        layers, used = [], set(id(n) for n in head)
        while True:
            dq = self.sole_consumer(cur)
            if dq is None or dq.op != "DequantizeLinear":
                break
            ch = self.match(dq.outputs[0], size)
            if ch is None:
                break
            layer = self.build(ch, dq, in_type, size, len(layers))
            if layer is None:
                break
            layers.append(layer)
            used.update(id(n) for n in [dq] + ch.nodes)
            cur = ch.quant.outputs[0]
            in_type = ch.quant.attrs["qtype"]
            size = self.size(cur)
            q_exit = ch.quant
        if not layers:
            raise UnsupportedError(self.unsupported_report(cur))
        tail = [n for n in g.nodes if id(n) not in used]
        self.check_tail(tail, cur)
        layers = _fuse(layers)
        sa = q_entry.attrs
        in_port = Port(entry.outputs[0],
                       self.shape(entry.outputs[0]), layers[0].in_type,
                       float(np.asarray(sa["scale"]).reshape(-1)[0]),
                       int(np.asarray(sa["zero_point"]).reshape(-1)[0]))
        qa = q_exit.attrs
        out_port = Port(cur, self.shape(cur), layers[-1].out_type,
                        float(np.asarray(qa["scale"]).reshape(-1)[0]),
                        int(np.asarray(qa["zero_point"]).reshape(-1)[0]))
        needed = {i for n in head + tail for i in n.inputs if i in g.constants}
        return Design(
            dataflow=Dataflow(layers, in_port, out_port),
            head=[_host(n) for n in head],
            tail=[_host(n) for n in tail],
            constants={k: np.asarray(g.constants[k]) for k in sorted(needed)},
            inputs=[self.io(g.inputs[0])],
            outputs=[self.io(g.outputs[0])],
            metadata=dict(g.metadata, graph_name=g.name),
        )

    def shape(self, t):
        info = self.g.tensors.get(t)
        return tuple(int(d) for d in info.shape) if info and info.shape is not None else \
            (self.size(t),)

    def io(self, name):
        info = self.g.tensors[name]
        return {"name": name, "dtype": info.dtype, "shape": [int(d) for d in info.shape]}

    def ancestors(self, node: Node) -> list[Node]:
        need, stack = set(), [node]
        while stack:
            n = stack.pop()
            if id(n) in need:
                continue
            need.add(id(n))
            stack.extend(self.prod[i] for i in n.inputs if i in self.prod)
        return [n for n in self.g.nodes if id(n) in need]

    def check_tail(self, tail, hw_out):
        problems = []
        for n in tail:
            if not host.supported(n.op, n.domain):
                problems.append(f"{n.describe()}: not supported on the host and not part of a "
                                f"quantized chain the hardware can run (hardware ops: "
                                f"{', '.join(HW_OPS)} between DequantizeLinear and "
                                f"QuantizeLinear)")
        produced = {o for n in tail for o in n.outputs}
        for n in tail:
            for i in n.inputs:
                if i and i not in produced and i not in self.g.constants and i != hw_out:
                    problems.append(f"{n.describe()}: reads {i!r} from inside the hardware "
                                    f"part; only one stream leaves the accelerator")
        if problems:
            raise UnsupportedError(problems)

    def unsupported_report(self, cur) -> list[str]:
        problems = []
        for n in self.g.nodes:
            if n.op in QDQ or host.supported(n.op, n.domain) and n.op in HW_OPS:
                continue
            problems.append(f"{n.describe()}: not supported in hardware (supported: "
                            f"{', '.join(HW_OPS)} between DequantizeLinear and QuantizeLinear)")
        if not problems:
            problems.append(f"Graph {self.g.name!r}: no layer after tensor {cur!r} maps to "
                            f"hardware (expected DequantizeLinear -> MatMul/Gemm with a "
                            f"quantized constant weight -> QuantizeLinear)")
        return problems


QDQ = ("QuantizeLinear", "DequantizeLinear")


def _host(n: Node) -> HostNode:
    return HostNode(n.op, list(n.inputs), list(n.outputs), dict(n.attrs), n.name, n.domain,
                    n.version)


def _fuse(layers):
    """Append elementwise layers to the layer before them (same element order and count)."""
    out = []
    for layer in layers:
        if out and isinstance(layer, RequantLayer) and out[-1].out_size == layer.in_size:
            prev = out[-1]
            prev.requant = list(prev.requant) + list(layer.requant)
            prev.nodes = list(prev.nodes) + list(layer.nodes)
            continue
        out.append(layer)
    return out


def lower(graph: Graph, *, multiplier_bits: int = 16, rounding: str = "half_even") -> Design:
    """Partition and lower a normalized QDQ graph; see the module docstring."""
    if not isinstance(multiplier_bits, int) or not 2 <= multiplier_bits <= 32:
        raise ValueError(f"multiplier_bits must be an integer from 2 to 32, not "
                         f"{multiplier_bits!r}")
    return _Lowerer(graph, multiplier_bits, rounding).run()
