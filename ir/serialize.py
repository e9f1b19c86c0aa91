"""Serialization of a design: a JSON document plus one .npz with every array, both
deterministic (the same design gives byte-identical files)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from .dataflow import Dataflow, Design, HostNode, Port
from .layers import LAYER_TYPES
from .stages import LutStage, RequantStage, ThresholdStage
from .types import IntType

__all__ = ["save_design", "load_design"]


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
          (RequantStage, ThresholdStage, LutStage, *LAYER_TYPES, Port, Dataflow, HostNode,
           Design)}


def _decode(obj, arrays):
    if isinstance(obj, dict):
        if "__array__" in obj:
            return arrays[obj["__array__"]]
        if "__int__" in obj:
            return IntType.parse(obj["__int__"])
        if "__type__" in obj:
            cls = _TYPES[obj["__type__"]]
            kwargs = {k: _decode(v, arrays) for k, v in obj.items() if k != "__type__"}
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
    """The design written by :func:`save_design`.

    Raises
    ------
    ValueError
        The files do not hold a design.
    """
    with open(json_path) as f:
        doc = json.load(f)
    with np.load(npz_path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    design = _decode(doc, arrays)
    if not isinstance(design, Design) or not isinstance(design.dataflow, Dataflow):
        raise ValueError(f"{json_path} does not hold a design")
    return design
