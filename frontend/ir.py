"""Our own graph IR: what the importer produces from an ONNX ModelProto.

No protobuf objects live here: attributes are Python values, constants numpy arrays. Nodes
are kept in topological order and keyed by position, never by their (optional) names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["TensorInfo", "Node", "Graph", "logical_shape"]


@dataclass
class TensorInfo:
    """Element type (numpy dtype name, or the ONNX type name where numpy has none) and shape."""
    dtype: str
    shape: tuple


@dataclass
class Node:
    """One operator application.

    ``version`` is the operator's since_version resolved from the model's opset imports
    (0 when the operator has no registered schema, e.g. an unknown custom domain).
    ``opset`` is the imported opset version of ``domain``.
    """
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)
    name: str = ""
    domain: str = ""
    version: int = 0
    opset: int = 0

    def describe(self) -> str:
        """``Node 'name' (Op, opset N)`` for error messages."""
        label = self.name or (self.outputs[0] if self.outputs else "?")
        dom = f"{self.domain}." if self.domain not in ("", "ai.onnx") else ""
        return f"Node {label!r} ({dom}{self.op}, opset {self.opset})"


@dataclass
class Graph:
    """A whole model: nodes in topological order, constants, typed values, metadata.

    ``output_names`` maps a graph output a pass renamed (the quantizer's ``t__dq`` of an
    output ``t``) to the model's name for it, which the design's outputs keep."""
    name: str
    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    constants: dict[str, np.ndarray]
    tensors: dict[str, TensorInfo]
    opsets: dict[str, int]
    metadata: dict = field(default_factory=dict)
    output_names: dict = field(default_factory=dict)

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    out.setdefault(i, []).append(n)
        return out


def logical_shape(shape) -> tuple:
    """The logical shape of a tensor: ``shape`` without its batch dimension (bound to 1).

    A shape of rank 2 or more whose first dimension is 1 loses it; any other shape is
    returned as it is, as a tuple of ints. The hardware part's layers and ports see tensors
    this way.
    """
    shape = tuple(int(d) for d in shape)
    return shape[1:] if len(shape) >= 2 and shape[0] == 1 else shape
