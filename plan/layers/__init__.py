"""The layer kinds: per IR layer dataclass, one module holding what the planner knows of it
(checks, stream orders, cores, foldings, when its output can leave, manifest fields), found
through :data:`KINDS` and :func:`kind_of`, the one list of them.

A new layer kind is a module here with a :class:`~.base.LayerKind` subclass, and one line in
:data:`KINDS`.
"""

from __future__ import annotations

from .add import Add
from .base import LayerKind
from .concat import Concat
from .conv import Conv
from .dense import Dense
from .pad import Pad
from .pool import Pool
from .requant import Requant
from .resize import Resize
from .slice import Slice
from .view import View

__all__ = ["KINDS", "kind_of", "LayerKind", "at_full_folding"]

#: IR layer dataclass -> its kind, in the order of ``onnx2fpga.ir.LAYER_TYPES``.
KINDS = {kind.layer_type: kind for kind in (
    Dense(), Requant(), Conv(), Pool(), Add(), Concat(), Resize(), Pad(), View(), Slice())}


def kind_of(layer) -> LayerKind:
    """The kind of ``layer``, or ``TypeError`` for an object no kind describes."""
    for cls in type(layer).__mro__:
        if cls in KINDS:
            return KINDS[cls]
    raise TypeError(f"Unknown layer type {type(layer).__name__}")


def at_full_folding(layer, params=None) -> bool:
    """True if ``layer`` is folded to take its whole matrix per cycle (the folding an
    ``"adders"`` realization has; :meth:`LayerKind.full_folding`), or would be with the
    folding ``params`` applied."""
    full = kind_of(layer).full_folding(layer)
    params = params or {}
    return bool(full) and all(params.get(k, getattr(layer, k)) == v for k, v in full.items())
