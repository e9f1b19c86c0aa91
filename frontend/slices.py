"""Exact channel ranges of the ONNX Slice and Split operators on the channel axis.

Pure functions from an operator's attributes, version, input shape and constant inputs to
the channel ranges ``(start, stop)`` the :class:`~onnx2fpga.ir.SliceLayer` takes (ONNX
operator specification, sections Slice and Split). Numpy only; no onnx import. Errors:
:class:`ValueError` whose message starts with the operator and version (``"Slice-13: ..."``);
:func:`onnx2fpga.frontend.resolve.resolve_geometry` prefixes the node.
"""

from __future__ import annotations

import numpy as np

__all__ = ["slice_channels", "split_channels", "SPLIT_INPUT_VERSION"]

#: The first Split version that takes the sizes as an input.
SPLIT_INPUT_VERSION = 13
_SUPPORTED = "only a slice of the channel axis 1 with step 1"


def _ints(name, what, v) -> list[int]:
    a = np.asarray(v)
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name}: {what} must be integers, not {a.tolist()!r}")
    return [int(x) for x in a.reshape(-1)]


def _clamp(v: int, dim: int) -> int:
    v = v + dim if v < 0 else v
    return min(max(v, 0), dim)


def slice_channels(attrs, in_shape, version, *, starts=None, ends=None, axes=None,
                   steps=None) -> tuple[int, int]:
    """The channel range ``(start, stop)`` of an ONNX ``Slice`` (1, 10, 11, 13) of an
    ``(N, C, ...)`` tensor that keeps every other axis whole. Slice-1 takes ``starts``,
    ``ends`` and ``axes`` as attributes, later versions as inputs (with ``steps``); starts
    and ends are clamped to the axis as the specification says (negative ones count from
    the end).

    Raises
    ------
    ValueError
        A slice of another axis, a step other than 1, an empty range.
    """
    name = f"Slice-{version}"
    shape = [int(d) for d in in_shape]
    rank = len(shape)
    if version < 10:
        starts, ends, axes = attrs.get("starts"), attrs.get("ends"), attrs.get("axes")
    if starts is None or ends is None:
        raise ValueError(f"{name}: starts and ends are required")
    starts, ends = _ints(name, "starts", starts), _ints(name, "ends", ends)
    axes = list(range(len(starts))) if axes is None else _ints(name, "axes", axes)
    steps = [1] * len(starts) if steps is None else _ints(name, "steps", steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(f"{name}: starts, ends, axes and steps must have one entry per axis")
    start, stop = 0, shape[1] if rank >= 2 else 0
    for b, e, a, s in zip(starts, ends, axes, steps):
        axis = a + rank if a < 0 else a
        if not 0 <= axis < rank:
            raise ValueError(f"{name}: axis {a} outside a rank-{rank} input")
        lo, hi = _clamp(b, shape[axis]), _clamp(e, shape[axis])
        if axis == 1 and s == 1 and rank >= 2:
            start, stop = lo, hi
        elif not (s == 1 and lo == 0 and hi == shape[axis]):
            raise ValueError(f"{name}: axes={axes}, starts={starts}, ends={ends}, "
                             f"steps={steps} on shape {tuple(shape)} is unsupported; "
                             f"{_SUPPORTED}")
    if stop <= start:
        raise ValueError(f"{name}: the slice of channels {start}..{stop} is empty; a layer "
                         f"needs at least one channel")
    return start, stop


def split_channels(attrs, in_shape, version, outputs: int, *, split=None) \
        -> list[tuple[int, int]]:
    """The channel range of every output of an ONNX ``Split`` (1, 2, 11, 13, 18) of an
    ``(N, C, ...)`` tensor along ``axis=1``: sizes from the ``split`` attribute (before
    Split-13) or input, else equal parts (Split-18's ``num_outputs``: the last part the
    smaller one when they do not divide).

    Raises
    ------
    ValueError
        Another axis, sizes that do not add up to the channels, an empty part.
    """
    name = f"Split-{version}"
    shape = [int(d) for d in in_shape]
    rank = len(shape)
    axis = int(attrs.get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if axis != 1 or rank < 2:
        raise ValueError(f"{name}: axis={attrs.get('axis', 0)} of a rank-{rank} input is "
                         f"unsupported; only a split of the channel axis 1")
    c = shape[1]
    if version < SPLIT_INPUT_VERSION:
        split = attrs.get("split", split)
    if split is not None and np.size(split):
        sizes = _ints(name, "split", split)
    else:
        n = int(attrs.get("num_outputs", outputs))
        part = -(-c // n)
        sizes = [min(part, c - k * part) for k in range(n)]
    if len(sizes) != outputs or sum(sizes) != c or min(sizes) < 1:
        raise ValueError(f"{name}: split={sizes} into {outputs} outputs of {c} channels is "
                         f"unsupported; only parts of at least one channel that add up to "
                         f"the channels")
    ends = np.cumsum(sizes).tolist()
    return [(e - s, e) for s, e in zip(sizes, ends)]
