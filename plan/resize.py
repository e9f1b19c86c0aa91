"""Geometry and cycle model of the resize and reorder cores (:mod:`onnx2fpga.hw.resize`): the
index maps of nearest-neighbour resizing, the loop nests of a reorder, and their cycles and
latency in the conventions of :mod:`onnx2fpga.plan.cost`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .checks import check_count, check_lanes
from .stage import CoreKind, Stage

__all__ = [
    "ResizeGeometry", "resize_cycles", "resize_latency", "affine_loops", "ResizeTiming",
    "ReorderTiming",
]


def int_sequence(name: str, value) -> np.ndarray:
    """A non-empty sequence of integers (not booleans) as a one-dimensional integer array."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a sequence of integers, not {value!r}")
    arr = np.asarray(value)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu") or \
            any(isinstance(v, bool) for v in value):
        raise TypeError(f"{name} must be a sequence of integers, not {value!r}")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty")
    return arr


def _check_index_map(name: str, value, size: int) -> tuple[int, ...]:
    """A non-empty, non-decreasing sequence of integers in ``[0, size)``."""
    seq = tuple(int(v) for v in int_sequence(name, value))
    if min(seq) < 0 or max(seq) >= size:
        bad = next(v for v in seq if not 0 <= v < size)
        raise ValueError(f"{name} must be indices from 0 to {size - 1}, not {bad}")
    for k in range(1, len(seq)):
        if seq[k] < seq[k - 1]:
            raise ValueError(f"{name} must be non-decreasing, not {seq[k - 1]} followed by "
                             f"{seq[k]} at position {k}")
    return seq


def _settled_period(ends) -> int | None:
    """The constant difference of the last few entries of ``ends``, if they agree."""
    diffs = np.diff(ends)
    if len(diffs) >= 3 and len(set(diffs[-3:].tolist())) == 1:
        return int(diffs[-1])
    return None


@dataclass(frozen=True)
class ResizeGeometry:
    """Validated parameters of a :class:`ResizeCore` (without the element shape) and the
    figures derived from them; build one with :meth:`make`."""

    channels: int
    height: int
    width: int
    rows: tuple[int, ...]
    cols: tuple[int, ...]
    lanes: int
    buffer_rows: int

    @classmethod
    def make(cls, channels, height, width, rows, cols, lanes=1,
             buffer_rows=None) -> ResizeGeometry:
        """Check the parameters; ``buffer_rows=None`` is :attr:`full_rows`.

        Raises
        ------
        TypeError
            If a count is not an integer or a map is not a sequence of integers.
        ValueError
            If a count is out of range, ``lanes`` does not divide ``channels``, or a map is
            empty, decreasing or indexes outside the image.
        """
        channels = check_count("Channels", channels)
        height = check_count("Height", height)
        width = check_count("Width", width)
        lanes = check_lanes(lanes, channels)
        rows = _check_index_map("Rows", rows, height)
        cols = _check_index_map("Cols", cols, width)
        geom = cls(channels, height, width, rows, cols, lanes, 2)
        if buffer_rows is None:
            return replace(geom, buffer_rows=geom.full_rows)
        return replace(geom, buffer_rows=check_count("Buffer rows", buffer_rows))

    # -- Sizes

    @property
    def folds(self) -> int:
        """Transfers per pixel, ``channels // lanes``."""
        return self.channels // self.lanes

    @property
    def out_height(self) -> int:
        return len(self.rows)

    @property
    def out_width(self) -> int:
        return len(self.cols)

    @property
    def in_beats(self) -> int:
        """Input transfers per inference, ``height * width * folds``."""
        return self.height * self.width * self.folds

    @property
    def out_beats(self) -> int:
        """Output transfers per inference, ``len(rows) * len(cols) * folds``."""
        return self.out_height * self.out_width * self.folds

    @property
    def used_rows(self) -> tuple[int, ...]:
        """The input rows some output row reads, in order (the others are dropped)."""
        return tuple(sorted(set(self.rows)))

    @property
    def row_words(self) -> int:
        """Words of one buffered row, ``width * folds``."""
        return self.width * self.folds

    @property
    def buffer_depth(self) -> int:
        """Words of the row buffer, ``buffer_rows * width * folds``."""
        return self.buffer_rows * self.row_words

    @property
    def full_rows(self) -> int:
        """The default buffer rows: the fewest with which the core runs as fast as with
        ``2 * len(used_rows) + 1`` rows (whole images double buffered), which is
        ``max(in_beats, out_beats)`` cycles per inference.

        Usually two; one where the reader always finishes a row before the writer needs its
        slot (downsampling); three for some maps that upsample one dimension and downsample
        the other, where the writer must run a row further ahead (see :class:`ResizeCore`).
        """
        hi = 2 * len(self.used_rows) + 1
        best = self.with_buffer_rows(hi).cycles
        lo = 0                        # cycles do not grow with more rows: bisect
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.with_buffer_rows(mid).cycles == best:
                hi = mid
            else:
                lo = mid
        return hi

    # -- Timing model

    def timeline(self, inferences: int) -> tuple[list, list]:
        """Cycle of the last transfer of every input row and of every output row.

        Models the core with full-rate input from cycle 0 and an output that never stalls, for
        ``inferences`` inferences back to back. Input row ``g`` (counted over all inferences)
        is taken in ``width * folds`` consecutive cycles, starting as soon as the previous row
        is taken and, if some output row reads it (it is the ``u``-th such row, counted over
        all inferences), as soon as the last output row reading used row ``u - buffer_rows``
        has been issued. Output row ``j`` is issued in ``len(cols) * folds`` consecutive
        cycles, starting as soon as the previous output row is issued and the input row it
        reads has been taken completely; each output transfer leaves one cycle after its issue.

        Returns
        -------
        in_end : list of int
            Cycle of the last input transfer of each input row.
        out_end : list of int
            Cycle of the last output transfer of each output row.
        """
        height, oh_count, slots = self.height, self.out_height, self.buffer_rows
        row_in, row_out = self.row_words, self.out_width * self.folds
        used = self.used_rows
        n_used = len(used)
        index = {r: k for k, r in enumerate(used)}
        out_used = [index[r] for r in self.rows]              # used row of each output row
        last_reader = [0] * n_used                              # last output row reading it
        for i, u in enumerate(out_used):
            last_reader[u] = i

        in_end, issue_end = [], []
        n_in, n_out = inferences * height, inferences * oh_count
        while len(issue_end) < n_out or len(in_end) < n_in:
            while len(in_end) < n_in:
                n, h = divmod(len(in_end), height)
                start = in_end[-1] + 1 if in_end else 0
                if h in index:
                    u = n * n_used + index[h] - slots          # the used row whose slot it takes
                    if u >= 0:
                        j = u // n_used * oh_count + last_reader[u % n_used]
                        if j >= len(issue_end):
                            break                               # still read
                        start = max(start, issue_end[j] + 1)
                in_end.append(start + row_in - 1)
            if len(issue_end) == n_out:
                continue
            n, i = divmod(len(issue_end), oh_count)
            g = n * height + self.rows[i]
            if g >= len(in_end):
                raise AssertionError("resize timing model deadlocked")  # pragma: no cover
            start = max(issue_end[-1] + 1 if issue_end else 0, in_end[g] + 1)
            issue_end.append(start + row_out - 1)
        return in_end, [t + 1 for t in issue_end]

    @property
    def latency(self) -> int:
        """See :func:`resize_latency`."""
        _, out_end = self.timeline(1)
        return out_end[-1]

    @property
    def cycles(self) -> int:
        """See :func:`resize_cycles`."""
        # A max-plus recurrence over identical inferences: the cycles between consecutive
        # inferences become constant once the start-up transient has passed. Simulate until
        # the last differences agree.
        count = self.buffer_rows // len(self.used_rows) + 6
        while True:
            _, out_end = self.timeline(count)
            period = _settled_period(out_end[self.out_height - 1::self.out_height])
            if period is not None:
                return period
            if count > 1000:                    # pragma: no cover - periodic, not constant
                ends = out_end[self.out_height - 1::self.out_height]
                half = len(ends) // 2
                return -(-(ends[-1] - ends[-1 - half]) // half)
            count *= 2

    def with_buffer_rows(self, buffer_rows: int) -> ResizeGeometry:
        return replace(self, buffer_rows=check_count("Buffer rows", buffer_rows))


def resize_cycles(channels, height, width, rows, cols, lanes=1, buffer_rows=None) -> int:
    """Steady-state cycles per inference of a :class:`ResizeCore`.

    With full-rate input and an output that never stalls, consecutive inferences leave exactly
    this many cycles apart. It is at least ``max(in_beats, out_beats)`` (each side moves one
    transfer per cycle at most), and equal to it with the default buffer
    (:attr:`ResizeGeometry.full_rows`); with fewer ``buffer_rows`` it may be larger. Computed
    by running the row-level model of :meth:`ResizeGeometry.timeline` until the cycles between
    inferences settle; the model is exact, because the writer and the reader each move one
    transfer per cycle and wait only at row boundaries.

    Raises
    ------
    TypeError, ValueError
        As :class:`ResizeCore`.
    """
    return ResizeGeometry.make(channels, height, width, rows, cols, lanes, buffer_rows).cycles


def resize_latency(channels, height, width, rows, cols, lanes=1, buffer_rows=None) -> int:
    """Cycles from the first input transfer to the last output transfer of one inference.

    For an idle core fed at one transfer per cycle with the output never stalled; typically
    (when the output is the slower side) ``(rows[0] + 1) * width * folds + out_beats``: the
    first output row waits for its input row, then the reader runs without a gap. In general
    it is computed by the model of :meth:`ResizeGeometry.timeline` (exact).

    Raises
    ------
    TypeError, ValueError
        As :class:`ResizeCore`.
    """
    return ResizeGeometry.make(channels, height, width, rows, cols, lanes, buffer_rows).latency


def affine_loops(perm) -> list[tuple[int, int]] | None:
    """Nested loops that generate ``perm``, if there are any.

    Returns ``[(count_0, stride_0), (count_1, stride_1), ...]``, innermost loop first, such
    that ``perm[p] = sum_k d_k * stride_k`` where ``d_0, d_1, ...`` are the digits of ``p`` in
    the mixed radix ``count_0, count_1, ...`` (``d_0`` the fastest), or None when ``perm`` has
    no such form. Every transpose of a C-order tensor (of any rank) has one; so does the
    identity (one loop). Adjacent loops that merge into one (``stride_{k+1} == count_k *
    stride_k``) come merged.

    Parameters
    ----------
    perm : sequence of int
        A permutation of ``range(len(perm))``.
    """
    a = np.asarray(perm, dtype=np.int64)
    n = len(a)
    if n == 0 or a[0] != 0:
        return None
    loops = []
    while True:
        if n == 1:
            return loops or [(1, 1)]
        stride = int(a[1] - a[0])
        run = 1                   # the longest prefix a[p] == p * stride
        while run < n and a[run] == run * stride:
            run += 1
        if n % run:
            return None
        blocks = a.reshape(n // run, run)
        if not np.array_equal(blocks, blocks[:, :1] + np.arange(run) * stride):
            return None
        loops.append((run, stride))
        a = blocks[:, 0]
        n = len(a)
        if n == 1:
            return loops


class ResizeTiming(CoreKind):
    """A :class:`~onnx2fpga.hw.resize.ResizeCore`: :func:`resize_cycles` and
    :func:`resize_latency`."""
    kinds = ("resize",)

    def cycles(self, stage: Stage) -> int:
        p = stage.params
        return resize_cycles(p["channels"], p["height"], p["width"], p["rows"], p["cols"],
                             stage.in_lanes)

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        p = stage.params
        row = p["width"] * p["channels"] // stage.in_lanes
        first_out = first + (int(p["rows"][0]) + 1) * row + 1
        latency = resize_latency(p["channels"], p["height"], p["width"], p["rows"], p["cols"],
                                 stage.in_lanes)
        return first_out, last + latency - (stage.in_beats - 1)


class ReorderTiming(CoreKind):
    """A :class:`~onnx2fpga.hw.resize.ReorderCore`: the whole tensor buffered, then read out
    in the new order."""
    kinds = ("reorder",)
    paced = False

    def cycles(self, stage: Stage) -> int:
        return stage.out_beats

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        first_out = last + 2
        return first_out, first_out
