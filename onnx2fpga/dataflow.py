"""The dataflow graph: what the frontend hands to the hardware generator and the golden model.

Plain data only (numpy arrays and Python scalars): ``hw`` and ``sim`` import this module and
never see ONNX. Every layer is a streaming core; layers form a chain from the accelerator's
input port to its output port. The integer semantics of each layer are defined by the golden
model in :mod:`onnx2fpga.sim.golden`.

Stream conventions
------------------
A tensor crosses a stream as a flat vector in C order (row-major over the tensor's shape with
the batch dimension bound to 1). A stream with ``lanes`` elements per transfer carries
elements ``k*lanes .. k*lanes+lanes-1`` in transfer ``k``; element ``j`` of a transfer sits
at bits ``[j*bits, (j+1)*bits)`` of the payload (little-endian lane order).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "IntType", "RequantStage", "DenseLayer", "RequantLayer", "Port", "Dataflow",
    "HostNode", "Design", "acc_type_for", "save_design", "load_design",
]


@dataclass(frozen=True)
class IntType:
    """A fixed-width integer type.

    Parameters
    ----------
    bits : int
        Width in bits, 1..64.
    signed : bool
        Two's complement if true.
    """
    bits: int
    signed: bool

    def __post_init__(self):
        if not isinstance(self.bits, int) or isinstance(self.bits, bool) or \
                not 1 <= self.bits <= 64:
            raise ValueError(f"Integer width must be an integer from 1 to 64, not {self.bits!r}")

    @property
    def lo(self) -> int:
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def hi(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    @property
    def name(self) -> str:
        return f"{'int' if self.signed else 'uint'}{self.bits}"

    @classmethod
    def for_range(cls, lo: int, hi: int) -> IntType:
        """The narrowest type holding every integer in ``[lo, hi]``."""
        lo, hi = int(lo), int(hi)
        if lo > hi:
            raise ValueError(f"Empty range [{lo}, {hi}]")
        if lo >= 0:
            return cls(max(1, hi.bit_length()), False)
        bits = max((-lo - 1).bit_length(), hi.bit_length()) + 1
        return cls(bits, True)

    def to_json(self):
        return self.name

    @classmethod
    def parse(cls, text: str) -> IntType:
        if text.startswith("uint"):
            return cls(int(text[4:]), False)
        if text.startswith("int"):
            return cls(int(text[3:]), True)
        raise ValueError(f"Integer type must be 'intN' or 'uintN', not {text!r}")


@dataclass
class RequantStage:
    """One requantization step, per channel ``c``::

        y = clip(round_shift((x - in_zero_point) * multiplier[c] + offset[c], shift)
                 + zero_point, lo, hi)

    ``round_shift(v, s)`` divides by ``2**s`` and rounds to the nearest integer, ties to even
    (``rounding="half_even"``, as ONNX QuantizeLinear) or away from zero (``"half_away"``).
    ``multiplier`` and ``offset`` have one entry per channel or a single entry for all.
    A fused ReLU is ``lo = zero_point``.
    """
    multiplier: np.ndarray
    offset: np.ndarray
    shift: int
    zero_point: int
    lo: int
    hi: int
    out_type: IntType
    in_zero_point: int = 0
    rounding: str = "half_even"

    def __post_init__(self):
        self.multiplier = np.asarray(self.multiplier, dtype=np.int64).reshape(-1)
        self.offset = np.asarray(self.offset, dtype=np.int64).reshape(-1)
        if self.rounding not in ("half_even", "half_away"):
            raise ValueError(f"Rounding must be 'half_even' or 'half_away', not {self.rounding!r}")
        if not (self.out_type.lo <= self.lo <= self.hi <= self.out_type.hi):
            raise ValueError(f"Clip range [{self.lo}, {self.hi}] must lie within "
                             f"{self.out_type.name}")
        if self.shift < 0:
            raise ValueError(f"Shift must be non-negative, not {self.shift!r}")

    def channel_params(self, channels: int) -> tuple[np.ndarray, np.ndarray]:
        """Multiplier and offset broadcast to ``channels`` entries."""
        return (np.broadcast_to(self.multiplier, (channels,)).copy(),
                np.broadcast_to(self.offset, (channels,)).copy())


@dataclass
class DenseLayer:
    """A fully connected layer with requantization: the matrix-vector core.

    ``acc[o] = sum_i (x[i] - in_zero_point) * weight[o, i] + bias[o]``, then every stage of
    ``requant`` in order. ``simd`` input elements and ``pe`` output channels are processed per
    cycle; ``in_features % simd == 0`` and ``out_features % pe == 0``.
    """
    name: str
    in_type: IntType
    in_zero_point: int
    weight: np.ndarray
    weight_type: IntType
    bias: np.ndarray
    requant: list[RequantStage]
    simd: int = 1
    pe: int = 1
    nodes: list[str] = field(default_factory=list)

    kind = "dense"

    def __post_init__(self):
        self.weight = np.asarray(self.weight, dtype=np.int64)
        self.bias = np.asarray(self.bias, dtype=np.int64).reshape(-1)
        if self.weight.ndim != 2:
            raise ValueError(f"Weight of layer {self.name!r} must be 2-D, not {self.weight.shape}")
        if self.bias.shape != (self.out_features,):
            raise ValueError(f"Bias of layer {self.name!r} must have shape "
                             f"({self.out_features},), not {self.bias.shape}")

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[1])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def in_size(self) -> int:
        return self.in_features

    @property
    def out_size(self) -> int:
        return self.out_features

    @property
    def out_type(self) -> IntType:
        return self.requant[-1].out_type if self.requant else self.acc_type

    @property
    def in_lanes(self) -> int:
        return self.simd

    @property
    def out_lanes(self) -> int:
        return self.pe

    @property
    def folded_bias(self) -> np.ndarray:
        """Bias with the input zero point folded in: ``acc = x @ weight.T + folded_bias``."""
        return self.bias - self.in_zero_point * self.weight.sum(axis=1)

    @property
    def acc_type(self) -> IntType:
        """Exact accumulator type of ``x @ weight.T + folded_bias`` over the input range."""
        return acc_type_for(self.weight, self.folded_bias, self.in_type)

    @property
    def cycles(self) -> int:
        """Cycles per input vector in steady state."""
        return (self.in_features // self.simd) * (self.out_features // self.pe)


@dataclass
class RequantLayer:
    """An elementwise requantization layer (a ReLU or a per-channel affine map on integers).

    ``channels`` is the size of the vector; stage parameters are per element.
    """
    name: str
    in_type: IntType
    channels: int
    requant: list[RequantStage]
    lanes: int = 1
    nodes: list[str] = field(default_factory=list)

    kind = "requant"

    @property
    def in_size(self) -> int:
        return self.channels

    @property
    def out_size(self) -> int:
        return self.channels

    @property
    def out_type(self) -> IntType:
        return self.requant[-1].out_type

    @property
    def in_lanes(self) -> int:
        return self.lanes

    @property
    def out_lanes(self) -> int:
        return self.lanes

    @property
    def cycles(self) -> int:
        return self.channels // self.lanes


def acc_type_for(weight: np.ndarray, bias: np.ndarray, in_type: IntType) -> IntType:
    """Narrowest type holding ``x @ weight.T + bias`` for every ``x`` in ``in_type``'s range."""
    w = np.asarray(weight, dtype=object)
    lo_terms = np.minimum(w * in_type.lo, w * in_type.hi)
    hi_terms = np.maximum(w * in_type.lo, w * in_type.hi)
    b = np.asarray(bias, dtype=object)
    lo = int(min(lo_terms.sum(axis=1) + b)) if w.size else int(min(b))
    hi = int(max(hi_terms.sum(axis=1) + b)) if w.size else int(max(b))
    lo, hi = min(lo, 0), max(hi, 0)
    t = IntType.for_range(lo, hi)
    return t if t.signed else IntType(t.bits + 1, True)


@dataclass
class Port:
    """One accelerator port: a tensor of integers crossing an AXI-Stream.

    ``scale`` and ``zero_point`` say what the integers mean (``real = (q - zero_point) *
    scale``); ``lanes`` elements travel per transfer, packed as in the module docstring.
    """
    name: str
    shape: tuple[int, ...]
    type: IntType
    scale: float
    zero_point: int
    lanes: int = 1

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def beats(self) -> int:
        return self.size // self.lanes

    @property
    def tdata_width(self) -> int:
        """Payload width on the AXI-Stream: the elements rounded up to whole bytes."""
        return -(-self.lanes * self.type.bits // 8) * 8


@dataclass
class Dataflow:
    """The hardware part: a chain of layers with FIFOs between them.

    ``fifo_depths[k]`` is the depth of the FIFO after layer ``k`` (0: a direct connection).
    """
    layers: list
    input: Port
    output: Port
    fifo_depths: list[int] = field(default_factory=list)

    def __post_init__(self):
        if not self.fifo_depths:
            self.fifo_depths = [2] * len(self.layers)
        if len(self.fifo_depths) != len(self.layers):
            raise ValueError("One FIFO depth per layer is required")


@dataclass
class HostNode:
    """An operator that runs on the host in numpy (see :mod:`onnx2fpga.sim.host`)."""
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict
    name: str = ""
    domain: str = ""
    version: int = 0


@dataclass
class Design:
    """Everything needed to run a compiled model: host head, hardware, host tail.

    ``head`` turns the model inputs into the integers of ``dataflow.input`` (the tensor named
    ``dataflow.input.name``); ``tail`` turns ``dataflow.output`` into the model's outputs.
    ``constants`` holds the float tensors the host nodes read.
    """
    dataflow: Dataflow
    head: list[HostNode]
    tail: list[HostNode]
    constants: dict[str, np.ndarray]
    inputs: list[dict]
    outputs: list[dict]
    metadata: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Serialization: a JSON document plus one .npz with every array, both deterministic.

def _encode(obj, arrays: dict, path: str):
    if isinstance(obj, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = obj
        return {"__array__": key}
    if isinstance(obj, IntType):
        return {"__int__": obj.name}
    if dataclasses.is_dataclass(obj):
        out = {"__type__": type(obj).__name__}
        for f in dataclasses.fields(obj):
            out[f.name] = _encode(getattr(obj, f.name), arrays, f"{path}.{f.name}")
        return out
    if isinstance(obj, dict):
        return {str(k): _encode(v, arrays, f"{path}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v, arrays, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if obj is None or isinstance(obj, (int, float, str, bool)):
        return obj
    raise TypeError(f"Cannot serialize {type(obj).__name__} at {path}")


_TYPES = {cls.__name__: cls for cls in
          (RequantStage, DenseLayer, RequantLayer, Port, Dataflow, HostNode, Design)}


def _decode(obj, arrays):
    if isinstance(obj, dict):
        if "__array__" in obj:
            return arrays[obj["__array__"]]
        if "__int__" in obj:
            return IntType.parse(obj["__int__"])
        if "__type__" in obj:
            cls = _TYPES[obj["__type__"]]
            kwargs = {k: _decode(v, arrays) for k, v in obj.items() if k != "__type__"}
            if cls is Port:
                kwargs["shape"] = tuple(kwargs["shape"])
            return cls(**kwargs)
        return {k: _decode(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v, arrays) for v in obj]
    return obj


def save_design(design: Design, json_path, npz_path) -> None:
    """Write ``design`` as JSON plus an ``.npz`` of its arrays (byte-identical for equal input)."""
    arrays: dict[str, np.ndarray] = {}
    doc = _encode(design, arrays, "design")
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    # np.savez writes zip entries with a fixed timestamp, so the file is deterministic.
    with open(npz_path, "wb") as f:
        np.savez(f, **arrays)


def load_design(json_path, npz_path) -> Design:
    with open(json_path) as f:
        doc = json.load(f)
    with np.load(npz_path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return _decode(doc, arrays)
