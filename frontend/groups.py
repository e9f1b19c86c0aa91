"""The group: a core operator and its epilogue, the unit that becomes one hardware layer.

Both the quantizer (:mod:`onnx2fpga.frontend.quantize`, which places an activation quantizer
after every group of a float model) and the lowering (:mod:`onnx2fpga.frontend.lower`, which
turns every group of a QDQ model into one integer layer) split a graph into groups; this
module is the one definition of what a group is (:class:`Group`) and holds the two passes
that find them:

* :func:`float_groups` in a float graph;
* :func:`find_groups` in a QDQ graph, where a group ends at the ``QuantizeLinear`` of an
  activation and starts at the ``DequantizeLinear`` nodes of earlier quantized activations.

A group is ``[views] core [epilogue] [views]``: the core is MatMul / Gemm / Conv with a
constant weight, MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool, ReduceMean /
ReduceMax / ReduceSum over the spatial axes (global pools), Resize / Upsample, Pad, Add /
Sub / Mul / Min / Max of two activations, Concat, Slice / Split on the channel axis, or
nothing (an elementwise group); the epilogue is any of
constant Add / Sub / Mul / Div and BatchNormalization, then Relu / Clip / LeakyRelu; a
constant Pad in front of a convolution joins the convolution's group. A *function group* is
any other elementwise function of one quantized tensor (:data:`FUNCTION_OPS`: a Sigmoid, a
Gelu, ``x * Sigmoid(x)``, a chain of them), which becomes a table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import UnsupportedError
from ..sim import golden, host
from .ir import Graph, Node

__all__ = ["Group", "QdqGraph", "float_groups", "find_groups", "onnx_domain", "VIEW_OPS",
           "EPILOGUE_OPS", "ACTIVATION_OPS", "CORE_OPS", "FUNCTION_OPS", "HW_OPS", "QDQ",
           "REDUCE_OPS", "JOIN_OPS", "SLICE_OPS"]

#: Operators that only change the stream order or add unit axes (an Expand that copies data
#: is refused when its view is built, :func:`onnx2fpga.frontend.build.add_views`).
VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "Expand",
            "DepthToSpace", "SpaceToDepth")
EPILOGUE_OPS = ("Add", "Sub", "Mul", "Div", "BatchNormalization", "Relu", "Clip",
                "LeakyRelu")
#: The epilogue operators that end it: after one of them, only another may follow.
ACTIVATION_OPS = ("Relu", "Clip", "LeakyRelu")
#: Joins of two activations (an AddLayer with its ``op``).
JOIN_OPS = ("Add", "Sub", "Mul", "Min", "Max")
#: Channel ranges: a Slice, or one output of a Split (split by
#: :func:`~onnx2fpga.frontend.resolve.resolve_geometry` into one node per output).
SLICE_OPS = ("Slice", "Split")
#: Reductions over the spatial axes: global pools (their ``_geometry`` says so).
REDUCE_OPS = ("ReduceMean", "ReduceMax", "ReduceSum")
CORE_OPS = ("MatMul", "Gemm", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool",
            "GlobalMaxPool", "Resize", "Upsample", "Pad", "Concat") + JOIN_OPS + REDUCE_OPS + \
    SLICE_OPS
#: Elementwise operators of a *function group*: between the DequantizeLinear of one quantized
#: tensor and a QuantizeLinear, nodes of these (and QuantizeLinear / DequantizeLinear pairs)
#: reading only that tensor and constants compute a function of its integer, which the
#: hardware looks up in a table (:func:`onnx2fpga.frontend.function.function_table`).
FUNCTION_OPS = ("Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Gelu", "Erf", "Elu", "Selu",
                "Softplus", "Softsign", "Mish", "Exp", "Log", "Neg", "Abs", "Sqrt",
                "Reciprocal", "PRelu", "Min", "Max", "Pow", "Identity", "Greater", "Less",
                "GreaterOrEqual", "LessOrEqual", "Equal", "Where", "Not") + EPILOGUE_OPS
#: Every operator a group of the hardware part may hold (besides QuantizeLinear and
#: DequantizeLinear).
HW_OPS = tuple(sorted(set(VIEW_OPS + EPILOGUE_OPS + CORE_OPS + FUNCTION_OPS)))
QDQ = ("QuantizeLinear", "DequantizeLinear")


def onnx_domain(n: Node) -> bool:
    """``n`` is an operator of the default (ai.onnx) domain."""
    return n.domain in ("", "ai.onnx")


@dataclass
class Group:
    """A core operator and its epilogue: the nodes that become one hardware layer.

    The same class describes a group of a float graph (:func:`float_groups`) and of a QDQ
    graph (:func:`find_groups`); they differ in what is around the core:

    * in a float graph, views are not part of any group (they pass through), ``quant`` is
      None, ``dqs`` and ``post`` are empty, and ``pre`` is ``[[pad]]`` for a Pad merged in
      front of a convolution, else empty;
    * in a QDQ graph, ``quant`` is the QuantizeLinear that ends the group (None only for
      the accumulator of a model's last layer, see
      :func:`onnx2fpga.frontend.partition.extend_accumulator_tail`), and per core input
      ``pre`` holds the views (and a Pad in front of a convolution) after that input's
      DequantizeLinear, which ``dqs`` holds. ``after`` may also hold views that only add or
      drop unit axes after the channel axis (see :meth:`QdqGraph.channel_view`).

    Attributes
    ----------
    core : Node or None
        The core operator; None for an elementwise group (only an epilogue).
    after : list of Node
        The epilogue, in order.
    quant : Node or None
        The QuantizeLinear that ends the group (QDQ graphs).
    post : list of Node
        Views after the epilogue (QDQ graphs).
    pre : list of list of Node
        Per core input, the views or Pad in front of the core, in order.
    dqs : list of Node
        Per core input, its DequantizeLinear (QDQ graphs).
    func : list of Node
        After a MatMul / Gemm / Conv core with no quantizer on its result: the function
        operators (and what follows them) between the epilogue ``after`` and ``quant``, in
        order (a float Sigmoid on a layer's float result), computed as thresholds on the
        accumulator (:func:`onnx2fpga.frontend.function.accumulator_thresholds`).
    function : bool
        A function group (:meth:`QdqGraph.match_function`, :func:`float_groups`): ``after``
        holds every node between the input's DequantizeLinear (``dqs[0]``) and ``quant``, in
        graph order, QuantizeLinear / DequantizeLinear nodes inside included; no core.
    """
    core: Node | None = None
    after: list = field(default_factory=list)
    quant: Node | None = None
    post: list = field(default_factory=list)
    pre: list = field(default_factory=list)
    dqs: list = field(default_factory=list)
    func: list = field(default_factory=list)
    function: bool = False

    @property
    def nodes(self) -> list:
        """Every node of the group, in order (without the DequantizeLinear nodes)."""
        out = [n for chain in self.pre for n in chain]
        out += ([self.core] if self.core is not None else []) + self.after + self.func + \
            self.post
        return out + ([self.quant] if self.quant is not None else [])

    @property
    def pad(self) -> Node | None:
        """The Pad merged in front of the core (a convolution): the last Pad in front of
        its one input, or None."""
        if len(self.pre) != 1:
            return None
        pads = [n for n in self.pre[0] if n.op == "Pad"]
        return pads[-1] if pads else None

    @property
    def output(self) -> str:
        """The tensor the group computes."""
        last = self.quant or (self.post or self.func or self.after or [self.core])[-1]
        return last.outputs[0]

    def inputs(self, graph: Graph) -> list[str]:
        """The activation tensors a group of a float graph reads: the non-constant inputs
        of an Add or Concat core, else the first input of the first node (the Pad, the core
        or the first epilogue node)."""
        if self.core is not None and self.core.op in JOIN_OPS + ("Concat",):
            return [i for i in self.core.inputs if i and i not in graph.constants]
        if self.function:
            return [next(i for i in self.after[0].inputs if not _is_const(graph, i))]
        first = self.pad or (self.core if self.core is not None else self.after[0])
        return [first.inputs[0]]


# -- float graphs ---------------------------------------------------------------------------

def _is_const(graph: Graph, t: str) -> bool:
    return not t or t in graph.constants


def _is_float_core(graph: Graph, n: Node) -> bool:
    if n.domain not in ("", "ai.onnx"):
        return False
    if n.op in ("MatMul", "Gemm", "Conv"):
        return len(n.inputs) > 1 and n.inputs[1] in graph.constants and \
            not (n.op == "Gemm" and n.attrs.get("transA", 0)) and \
            not (n.op != "Conv" and graph.constants[n.inputs[1]].ndim != 2) and \
            all(_is_const(graph, i) for i in n.inputs[2:])
    if n.op in ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Resize",
                "Upsample", "Pad") + REDUCE_OPS + SLICE_OPS:
        return all(_is_const(graph, i) for i in n.inputs[1:]) and \
            len([o for o in n.outputs if o]) == 1
    if n.op in JOIN_OPS:
        return len(n.inputs) == 2 and not any(_is_const(graph, i) for i in n.inputs)
    if n.op == "Concat":
        return not any(_is_const(graph, i) for i in n.inputs)
    return False


def _is_float_epilogue(graph: Graph, n: Node) -> bool:
    if n.domain not in ("", "ai.onnx") or n.op not in EPILOGUE_OPS:
        return False
    acts = [i for i in n.inputs if i and not _is_const(graph, i)]
    return len(acts) == 1 and (n.op not in ("Div",) or n.inputs[0] == acts[0])


def _is_float_function(graph: Graph, n: Node) -> bool:
    """``n`` is a function operator (:data:`FUNCTION_OPS`) of one activation (read once
    or more: ``x * x``) and constants."""
    if n.domain not in ("", "ai.onnx") or n.op not in FUNCTION_OPS or \
            len([o for o in n.outputs if o]) != 1:
        return False
    return len({i for i in n.inputs if i and not _is_const(graph, i)}) == 1


def _float_function(graph: Graph, n: Node, cons, taken: set, dry: bool = False):
    """The function group starting at ``n``: every later function operator reading only
    the group's input, its results and constants (SiLU's ``x * Sigmoid(x)``; the legacy
    torch exporter's Gelu, ``x * (erf(x / sqrt 2) + 1) * 0.5``), as long as one tensor leaves
    the group; else ``n`` alone. ``dry``: only say whether a group starting at an epilogue
    operator holds a function operator that is not one (else it stays an epilogue group):
    the group, or None; nothing is taken."""
    src = next(i for i in n.inputs if i and not _is_const(graph, i))
    region, made = [n], {n.outputs[0]}
    grew = True
    while grew:
        grew = False
        for t in [src, *made]:
            for m in cons.get(t, []):
                if any(m is r for r in region) or id(m) in taken or \
                        m.domain not in ("", "ai.onnx") or m.op not in FUNCTION_OPS or \
                        len([o for o in m.outputs if o]) != 1:
                    continue
                acts = {i for i in m.inputs if i and not _is_const(graph, i)}
                if acts <= made | {src}:
                    region.append(m)
                    made.add(m.outputs[0])
                    grew = True
    ids = {id(m) for m in region}
    leaving = [t for t in made if t in graph.outputs or
               any(id(c) not in ids for c in cons.get(t, []))]
    if len(leaving) != 1:
        region = [n]
    if dry:
        return region if any(m.op not in EPILOGUE_OPS for m in region) else None
    order = {id(m): k for k, m in enumerate(graph.nodes)}
    region.sort(key=lambda m: order[id(m)])
    taken.update(id(m) for m in region)
    return Group(after=region, function=True)


def float_groups(graph: Graph) -> list[Group]:
    """The groups of a float graph, in topological order.

    Parameters
    ----------
    graph : Graph
        A float graph whose constants are folded.

    Returns
    -------
    list of Group
        Each core (with a constant weight where it has one) starts a group, and so does an
        epilogue node that follows no core, and a function operator (a function group:
        :func:`_float_function`, see :attr:`Group.function`); the epilogue takes the nodes
        each read only by the one before, and stops at the first non-activation after an
        activation. A Pad read only by a convolution joins the convolution's group.
    """
    cons = graph.consumers()

    def sole(t):
        c = cons.get(t, [])
        return c[0] if len(c) == 1 and t not in graph.outputs else None

    prod = graph.producers()
    groups, taken = [], set()
    for n in graph.nodes:
        if id(n) in taken:
            continue
        if _is_float_core(graph, n):
            if n.op == "Pad":
                nxt = sole(n.outputs[0])
                if nxt is not None and nxt.op == "Conv" and _is_float_core(graph, nxt) and \
                        nxt.inputs[0] == n.outputs[0]:
                    continue          # merged into the convolution's group
            grp = Group(core=n)
            prev = prod.get(n.inputs[0]) if n.op == "Conv" else None
            if prev is not None and prev.op == "Pad" and sole(prev.outputs[0]) is n and \
                    _is_float_core(graph, prev):
                grp.pre = [[prev]]
                taken.add(id(prev))
        elif _is_float_function(graph, n) and (
                not _is_float_epilogue(graph, n) or
                _float_function(graph, n, cons, taken, dry=True) is not None):
            grp = _float_function(graph, n, cons, taken)
            groups.append(grp)
            continue
        elif _is_float_epilogue(graph, n):
            grp = Group(after=[n])
        else:
            continue
        taken.add(id(n))
        activated = n.op in ACTIVATION_OPS
        t = n.outputs[0]
        while True:
            m = sole(t)
            if m is None or not _is_float_epilogue(graph, m):
                break
            is_act = m.op in ACTIVATION_OPS
            if activated and not is_act:
                break
            activated = activated or is_act
            grp.after.append(m)
            taken.add(id(m))
            t = m.outputs[0]
        groups.append(grp)
    return groups


# -- QDQ graphs -----------------------------------------------------------------------------

class QdqGraph:
    """A QDQ graph with its producer and consumer maps, which the lowering's passes query.

    The maps are taken once, from the graph as given: nodes a later pass adds
    (:func:`onnx2fpga.frontend.partition.extend_accumulator_tail`) are not in them.
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.prod = graph.producers()
        self.cons = graph.consumers()

    def shape(self, t) -> tuple:
        """The static shape of tensor ``t``; UnsupportedError if it is not known."""
        info = self.graph.tensors.get(t)
        if info is None or info.shape is None or any(not isinstance(d, int)
                                                     for d in info.shape):
            raise UnsupportedError([f"Tensor {t!r}: shape unknown after inference"])
        return tuple(int(d) for d in info.shape)

    def is_const(self, t) -> bool:
        """``t`` is absent, a constant or DequantizeLinear of one (or of QuantizeLinear of
        one: onnxruntime quantizes the constants of elementwise operators that way)."""
        return not t or t in self.graph.constants or self.dq_constant(t) is not None or \
            self.qdq_constant(t) is not None

    def qdq_constant(self, name):
        """The float value of DequantizeLinear(QuantizeLinear(constant)), or None."""
        n = self.prod.get(name)
        if n is None or n.op != "DequantizeLinear" or not onnx_domain(n):
            return None
        q = self.prod.get(n.inputs[0])
        if q is None or q.op != "QuantizeLinear" or not onnx_domain(q) or \
                q.inputs[0] not in self.graph.constants:
            return None
        try:
            env = host.run_nodes([q, n], {}, self.graph.constants)
        except host.HostOpError:
            return None
        return np.asarray(env[name], np.float64)

    def dq_constant(self, name):
        """``(int array, scale, zero_point, axis, qtype, node)`` if ``name`` is
        DequantizeLinear of a constant, else None."""
        n = self.prod.get(name)
        if n is None or n.op != "DequantizeLinear" or not onnx_domain(n) or \
                n.inputs[0] not in self.graph.constants:
            return None
        a = n.attrs
        return (np.asarray(self.graph.constants[n.inputs[0]]).astype(np.int64), a["scale"],
                a["zero_point"], a["axis"], a["qtype"], n)

    def float_constant(self, name):
        """A constant's float value (a plain initializer or DequantizeLinear of one) and the
        DequantizeLinear node (or None); ``(None, None)`` if ``name`` is no constant."""
        if not name:
            return None, None
        if name in self.graph.constants:
            return np.asarray(self.graph.constants[name], dtype=np.float64), None
        dq = self.dq_constant(name)
        if dq is not None:
            q, s, z, axis, _, node = dq
            axis = axis if axis >= 0 else axis + max(q.ndim, 1)
            return golden.dequantize_linear(q, s, z, axis if q.ndim > 1 else 0).astype(
                np.float64), node
        value = self.qdq_constant(name)
        if value is not None:
            return value, self.prod[name]
        return None, None

    def internal(self, t: str, group_nodes) -> bool:
        """``t`` is read only by ``group_nodes`` (nodes, or a set of their ``id``) and is
        no graph output."""
        ids = group_nodes if isinstance(group_nodes, (set, frozenset)) else \
            {id(n) for n in group_nodes}
        return t not in self.graph.outputs and \
            all(id(c) in ids for c in self.cons.get(t, []))

    def activation_input(self, n: Node):
        """The one non-constant input of an epilogue node, or None."""
        acts = [i for i in n.inputs if i and not self.is_const(i)]
        return acts[0] if len(acts) == 1 else None

    def channel_view(self, n: Node) -> bool:
        """A view inside an epilogue that only adds or drops unit axes after the channel
        axis (FINN's Unsqueeze -> BatchNormalization -> Squeeze), so per-channel constants
        keep their meaning."""
        try:
            a, b = self.shape(n.inputs[0]), self.shape(n.outputs[0])
        except UnsupportedError:
            return False
        if n.op == "Transpose" or len(a) < 2 or len(b) < 2 or a[:2] != b[:2]:
            return False
        return [d for d in a[2:] if d != 1] == [d for d in b[2:] if d != 1]

    def pre_chain(self, t: str, pad_ok: bool, quantized):
        """Views (and a Pad in front of a convolution) back from tensor ``t`` to the
        DequantizeLinear of a tensor in ``quantized``: ``(chain, dq)`` or None."""
        chain = []
        m = self.prod.get(t)
        while m is not None and onnx_domain(m) and (
                m.op in VIEW_OPS or (m.op == "Pad" and pad_ok)) and \
                self.activation_input(m) == m.inputs[0]:
            chain.append(m)
            t = m.inputs[0]
            m = self.prod.get(t)
        chain.reverse()
        if m is None or m.op != "DequantizeLinear" or not onnx_domain(m) or \
                m.inputs[0] not in quantized:
            return None
        return chain, m

    def match(self, q: Node, quantized) -> Group | None:
        """The group ending at QuantizeLinear ``q`` whose inputs are DequantizeLinear of
        tensors in ``quantized``, or None if there is none."""
        grp = Group(quant=q)
        t = q.inputs[0]
        n = self.prod.get(t)
        members = [q]
        while n is not None and onnx_domain(n) and n.op in VIEW_OPS and \
                self.activation_input(n) == n.inputs[0]:
            grp.post.append(n)
            members.append(n)
            t = n.inputs[0]
            n = self.prod.get(t)
        while n is not None and onnx_domain(n) and self.activation_input(n) is not None \
                and (n.op in EPILOGUE_OPS or (n.op in VIEW_OPS and self.channel_view(n)) or
                     (n.op in FUNCTION_OPS and n.op not in VIEW_OPS and
                      len([o for o in n.outputs if o]) == 1)):
            grp.after.append(n)
            members.append(n)
            t = self.activation_input(n)
            n = self.prod.get(t)
        grp.post.reverse()                 # found backwards; appended, not inserted at 0,
        grp.after.reverse()                # so that a long chain stays linear
        if n is None or not onnx_domain(n):
            return None
        # A function operator (not an epilogue's) starts `func`: only on an accumulator.
        k = next((i for i, m in enumerate(grp.after) if m.op not in EPILOGUE_OPS and
                  m.op not in VIEW_OPS), None)
        if k is not None:
            if n.op not in ("MatMul", "Gemm", "Conv"):
                return None
            grp.after, grp.func = grp.after[:k], grp.after[k:]
        if n.op == "DequantizeLinear":
            ins = [t]
        elif n.op in CORE_OPS:
            grp.core = n
            members.append(n)
            if n.op in JOIN_OPS + ("Concat",):
                ins = [i for i in n.inputs if i]
            else:
                ins = [n.inputs[0]]
        else:
            return None
        for t in ins:
            found = self.pre_chain(t, grp.core is not None and grp.core.op == "Conv",
                                   quantized)
            if found is None:
                return None
            chain, m = found
            members.extend(chain)
            grp.pre.append(chain)
            grp.dqs.append(m)
        ids = {id(node) for node in members}      # once: a long chain stays linear
        for node in members:
            if node is not q and not all(self.internal(o, ids) for o in node.outputs):
                return None
        return grp

    def match_function(self, q: Node, quantized) -> Group | None:
        """The function group ending at QuantizeLinear ``q``: nodes of
        :data:`FUNCTION_OPS` and QuantizeLinear / DequantizeLinear pairs that read, besides
        constants, only the DequantizeLinear of one tensor in ``quantized`` (SiLU
        ``x * Sigmoid(x)``, with or without onnxruntime's quantizer between the Sigmoid and
        the Mul; chains of activations), every result read only inside the group. None if
        there is no such group. Tried after :meth:`match`, which builds what it matches
        exactly, without a table."""
        for through in (True, False):
            memo: dict = {}
            found = self._trace(q.inputs[0], quantized, through, memo)
            if found is None:
                continue
            nodes, sources = found
            if len(sources) != 1:
                continue
            ids = {id(n) for n in nodes} | {id(q)}
            if not all(self.internal(o, ids) for n in nodes for o in n.outputs if o):
                continue
            ordered = [n for n in self.graph.nodes if id(n) in ids and n is not q]
            src = next(iter(sources))
            dq = next(n for n in ordered if n.op == "DequantizeLinear" and n.inputs[0] == src)
            return Group(after=[n for n in ordered if n is not dq], quant=q, pre=[[]],
                         dqs=[dq], function=True)
        return None

    def _trace(self, t, quantized, through, memo):
        """``(nodes, sources)`` computing tensor ``t`` from quantized tensors by function
        operators (see :meth:`match_function`), or None. ``through``: continue past a
        QuantizeLinear / DequantizeLinear pair wherever its input can be traced."""
        if t in memo:
            return memo[t]
        memo[t] = None                        # a cycle: no trace
        res = None
        n = self.prod.get(t)
        if self.is_const(t):
            res = ((), frozenset())
        elif n is not None and onnx_domain(n) and len([o for o in n.outputs if o]) == 1:
            if n.op == "DequantizeLinear":
                src = n.inputs[0]
                qq = self.prod.get(src)
                if through and qq is not None and qq.op == "QuantizeLinear" and \
                        onnx_domain(qq) and not self.is_const(qq.inputs[0]):
                    inner = self._trace(qq.inputs[0], quantized, through, memo)
                    if inner is not None:
                        res = (inner[0] + (qq, n), inner[1])
                if res is None and src in quantized:
                    res = ((n,), frozenset([src]))
            elif n.op in FUNCTION_OPS:
                parts = [self._trace(i, quantized, through, memo) for i in n.inputs
                         if i and not self.is_const(i)]
                if parts and all(p is not None for p in parts):
                    res = (sum((p[0] for p in parts), ()) + (n,),
                           frozenset().union(*(p[1] for p in parts)))
        memo[t] = res
        return res

    def integer_op(self, n: Node, quantized) -> bool:
        """``n`` is a view or a max pool straight on a tensor in ``quantized`` (no
        DequantizeLinear in front): it keeps the tensor's quantization."""
        if not onnx_domain(n) or not n.inputs or n.inputs[0] not in quantized:
            return False
        if any(i and not self.is_const(i) for i in n.inputs[1:]):
            return False
        if n.op in VIEW_OPS:
            return True
        return n.op in ("MaxPool", "GlobalMaxPool") and "_geometry" in n.attrs and \
            len([o for o in n.outputs if o]) == 1

    def ancestors(self, node: Node) -> list[Node]:
        """``node`` and every node it depends on, in graph order."""
        need, stack = set(), [node]
        while stack:
            n = stack.pop()
            if id(n) in need:
                continue
            need.add(id(n))
            stack.extend(self.prod[i] for i in n.inputs if i in self.prod)
        return [n for n in self.graph.nodes if id(n) in need]


def find_groups(qg: QdqGraph, entry, head: list[Node]) -> list[Group | Node]:
    """The groups of a QDQ graph, and the integer operators between them, in graph order.

    Parameters
    ----------
    qg : QdqGraph
        The graph.
    entry : Node or list of Node
        The QuantizeLinear of the first quantized activation, or one per graph input
        (:func:`onnx2fpga.frontend.partition.find_entries`).
    head : list of Node
        The host's nodes before it, which are skipped.

    Returns
    -------
    list of Group or Node
        A :class:`Group` for every activation QuantizeLinear whose group reads quantized
        tensors only (the entry's, or those of groups and integer operators before it); a
        :class:`Node` for a view or max pool straight on a quantized tensor
        (:meth:`QdqGraph.integer_op`). Nodes of no group are left out: they run on the host
        or are reported by the partition.
    """
    quantized = {e.outputs[0] for e in (entry if isinstance(entry, list) else [entry])}
    skip = {id(n) for n in head}
    found = []
    for n in qg.graph.nodes:
        if id(n) in skip:
            continue
        if n.op == "QuantizeLinear" and onnx_domain(n) and \
                n.inputs[0] not in qg.graph.constants:
            grp = qg.match(n, quantized) or qg.match_function(n, quantized)
            if grp is not None:
                if grp.function:          # groups it swallowed (their quantizers inside)
                    inner = {id(m) for m in grp.after}
                    found = [g for g in found if not isinstance(g, Group) or
                             g.quant is None or id(g.quant) not in inner]
                found.append(grp)
                quantized.add(n.outputs[0])
        elif n.op not in QDQ and qg.integer_op(n, quantized):
            found.append(n)
            quantized.add(n.outputs[0])
    return found
