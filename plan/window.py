"""Geometry and cycle model of the sliding-window core
(:class:`~onnx2fpga.hw.window.SlidingWindowCore`): the exact row-level schedule of
:class:`WindowGeometry`, and its cycles and latency in the conventions of
:mod:`onnx2fpga.plan.cost`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .checks import check_count, check_lanes
from .stage import CoreKind, Stage, spaced, spaced_before

__all__ = ["WindowGeometry", "window_cycles", "window_latency", "WindowTiming"]


def _check_pair(name: str, value, minimum: int) -> tuple[int, int]:
    if not isinstance(value, (tuple, list)) or len(value) != 2 or any(
            not isinstance(v, (int, np.integer)) or isinstance(v, bool) for v in value):
        raise TypeError(f"{name} must be a pair of integers (height, width), not {value!r}")
    if min(value) < minimum:
        raise ValueError(f"{name} must be at least {minimum} in both dimensions, not {value!r}")
    return int(value[0]), int(value[1])


def _check_pads(value) -> tuple[int, int, int, int]:
    if not isinstance(value, (tuple, list)) or len(value) != 4 or any(
            not isinstance(v, (int, np.integer)) or isinstance(v, bool) for v in value):
        raise TypeError(f"Pads must be four integers (top, left, bottom, right), "
                        f"not {value!r}")
    if min(value) < 0:
        raise ValueError(f"Pads must not be negative, not {value!r}")
    return tuple(int(v) for v in value)


def _clip(value: int, hi: int) -> int:
    return min(max(value, 0), hi)


@dataclass(frozen=True)
class WindowGeometry:
    """Validated parameters of a sliding window and the figures derived from them.

    The parameters are those of :class:`SlidingWindowCore` without the element shape and the
    pad value (see there); build one with :meth:`make`.
    """

    channels: int
    height: int
    width: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pads: tuple[int, int, int, int]
    lanes: int
    rows: int                       # line buffer rows R

    @classmethod
    def make(cls, channels, height, width, kernel, stride=(1, 1), dilation=(1, 1),
             pads=(0, 0, 0, 0), lanes=1, buffer_rows=None) -> WindowGeometry:
        """Check the parameters and derive the geometry.

        Raises
        ------
        TypeError
            If a count is not an integer or a pair / the pads are malformed.
        ValueError
            If a count is out of range, ``lanes`` does not divide ``channels``, the output
            would be empty, or ``buffer_rows`` is below :attr:`min_rows`.
        """
        channels = check_count("Channels", channels)
        height = check_count("Height", height)
        width = check_count("Width", width)
        kernel = _check_pair("Kernel", kernel, 1)
        stride = _check_pair("Stride", stride, 1)
        dilation = _check_pair("Dilation", dilation, 1)
        pads = _check_pads(pads)
        lanes = check_lanes(lanes, channels)
        top, left, bottom, right = pads
        for what, size, before, after, k, d, s in (
                ("height", height, top, bottom, kernel[0], dilation[0], stride[0]),
                ("width", width, left, right, kernel[1], dilation[1], stride[1])):
            extent = (k - 1) * d + 1
            if size + before + after < extent:
                out = (size + before + after - extent) // s + 1
                raise ValueError(
                    f"Output {what} must be at least 1, not {out}: kernel {what} extent {extent} "
                    f"(kernel {k}, dilation {d}) exceeds the padded input {what} "
                    f"{size} + {before} + {after}")
        geom = cls(channels, height, width, kernel, stride, dilation, pads, lanes, 0)
        if buffer_rows is None:
            rows = geom.full_rows
        else:
            rows = check_count("Buffer rows", buffer_rows)
            if rows < geom.min_rows:
                raise ValueError(f"Buffer rows must be at least {geom.min_rows} (the input rows "
                                 f"one output row reads), not {rows}")
        return cls(channels, height, width, kernel, stride, dilation, pads, lanes, rows)

    # -- Sizes

    @property
    def folds(self) -> int:
        """Transfers per pixel, ``channels // lanes``."""
        return self.channels // self.lanes

    @property
    def extent(self) -> tuple[int, int]:
        """Kernel extent ``((kh-1)*dh + 1, (kw-1)*dw + 1)`` in input pixels."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilation))

    @property
    def out_height(self) -> int:
        top, _, bottom, _ = self.pads
        return (self.height + top + bottom - self.extent[0]) // self.stride[0] + 1

    @property
    def out_width(self) -> int:
        _, left, _, right = self.pads
        return (self.width + left + right - self.extent[1]) // self.stride[1] + 1

    @property
    def in_beats(self) -> int:
        """Input transfers per inference, ``height * width * folds``."""
        return self.height * self.width * self.folds

    @property
    def row_beats(self) -> int:
        """Output transfers per output row, ``out_width * kh * kw * folds``."""
        return self.out_width * self.kernel[0] * self.kernel[1] * self.folds

    @property
    def out_beats(self) -> int:
        """Output transfers per inference, ``out_height * out_width * kh * kw * folds``."""
        return self.out_height * self.row_beats

    # -- Rows an output row reads

    def row_span(self, oh: int) -> tuple[int, int]:
        """Input rows ``[lo, hi)`` output row ``oh`` reads, clipped to the image (the window
        rows ``oh*sh - top .. oh*sh - top + extent - 1``; empty, ``lo == hi``, when they all lie
        in the padding)."""
        first = oh * self.stride[0] - self.pads[0]
        return _clip(first, self.height), _clip(first + self.extent[0], self.height)

    @property
    def min_rows(self) -> int:
        """The fewest line buffer rows that work: the widest :meth:`row_span` (at least 1)."""
        return max([1] + [hi - lo for lo, hi in map(self.row_span, range(self.out_height))])

    @property
    def span_rows(self) -> int:
        """The most input rows from the first row an output row reads through the last row the
        next output row reads (after the last output row: the next inference's first one). With
        that many rows the writer can fill the next output row's rows while the current one is
        read: ``kh_extent + sh`` in the usual layers, ``2 * height`` for a window as tall as
        the image."""
        spans = [self.row_span(oh) for oh in range(self.out_height)]
        pairs = [spans[oh + 1][1] - spans[oh][0] for oh in range(self.out_height - 1)]
        pairs.append(self.height + spans[0][1] - spans[-1][0])
        return max([self.min_rows] + pairs)

    @property
    def full_rows(self) -> int:
        """The default line buffer rows: the fewest rows, at least :attr:`span_rows`, with
        which the core runs as fast as with ``2 * height`` rows more.

        That is :attr:`span_rows` in the usual layers, where it reaches
        ``max(in_beats, out_beats)`` cycles per inference. Small images whose edge windows read
        few rows (some output rows then take as long to read as others but free fewer rows)
        need a row or two more for the writer to run further ahead.
        """
        rows = self.span_rows
        if self._with_rows(rows).cycles == max(self.in_beats, self.out_beats):
            return rows
        # Cycles do not grow with more rows: find the fewest reaching the best, by bisection.
        lo, hi = rows - 1, rows + 2 * self.height
        best = self._with_rows(hi).cycles
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._with_rows(mid).cycles == best:
                hi = mid
            else:
                lo = mid
        return hi

    def _with_rows(self, rows: int) -> WindowGeometry:
        return replace(self, rows=rows)

    @property
    def buffer_depth(self) -> int:
        """Words of the line buffer, ``rows * width * folds``."""
        return self.rows * self.width * self.folds

    # -- Timing model

    def timeline(self, inferences: int, offered=None, starts: list | None = None,
                 taken=None) -> tuple[list, list]:
        """Cycle of the last transfer of every input row and of every output row.

        Models the core with full-rate input from cycle 0 and an output that never stalls, for
        ``inferences`` inferences back to back. Input row ``g`` (counted over all inferences)
        is written in ``width * folds`` consecutive cycles, starting as soon as the previous
        row is written and the output row that last reads row ``g - rows`` has been issued.
        Output row ``j`` is issued in :attr:`row_beats` consecutive cycles, starting as soon as
        the previous output row is issued and the last input row it reads has been written (a
        row wholly in the top padding: the last row of the previous inference); each output
        transfer leaves one cycle after its issue. With ``offered`` (one cycle per input row),
        row ``g`` is written no earlier than its last transfer is offered at ``offered[g]``.
        With ``starts`` (a list), the cycle from which each input row's slot is free (its
        first transfer can be written) is appended to it. With ``taken`` (one cycle per output
        row), output row ``j`` is issued no earlier than the cycle before its last transfer is
        taken downstream at ``taken[j]`` (a stalled output).

        Returns
        -------
        in_end : list of int
            Cycle of the last input transfer of each input row.
        out_end : list of int
            Cycle of the last output transfer of each output row.
        """
        height, oh_count, rows = self.height, self.out_height, self.rows
        row_in = self.width * self.folds
        row_out = self.row_beats
        spans = [self.row_span(oh) for oh in range(oh_count)]

        def first_row(j):                       # first input row output row j reads, global
            n, oh = divmod(j, oh_count)
            return n * height + spans[oh][0]

        in_end, issue_end = [], []
        n_in, n_out = inferences * height, inferences * oh_count
        freeing = 0         # the first output row whose first row is above g - rows
        while len(issue_end) < n_out or len(in_end) < n_in:
            while len(in_end) < n_in:
                g = len(in_end)
                while first_row(freeing) + rows <= g:
                    freeing += 1
                if freeing > len(issue_end):
                    break                       # the slot of row g - rows is still read
                start = in_end[-1] + 1 if in_end else 0
                if freeing:
                    start = max(start, issue_end[freeing - 1] + 1)
                end = start + row_in - 1
                if starts is not None:
                    starts.append(start)
                in_end.append(end if offered is None else max(end, int(offered[g])))
            if len(issue_end) == n_out:
                continue
            j = len(issue_end)
            n, oh = divmod(j, oh_count)
            need = n * height + spans[oh][1]    # input rows written before output row j
            if need > len(in_end):
                raise AssertionError("window timing model deadlocked")  # pragma: no cover
            start = issue_end[-1] + 1 if issue_end else 0
            if need:
                start = max(start, in_end[need - 1] + 1)
            end = start + row_out - 1
            issue_end.append(end if taken is None else max(end, int(taken[j]) - 1))
        return in_end, [t + 1 for t in issue_end]

    def follow(self, arrival: np.ndarray) -> np.ndarray:
        """Cycle of every output transfer of one inference, the core idle before, when input
        transfer ``k`` is offered at cycle ``arrival[k]`` (``in_beats`` of them) and the output
        never stalls: :meth:`timeline`'s schedule with each input row written no earlier than
        its last transfer is offered."""
        row_in, row_out = self.width * self.folds, self.row_beats
        _, out_end = self.timeline(1, np.asarray(arrival, dtype=np.int64)[row_in - 1::row_in])
        starts = np.asarray(out_end, dtype=np.int64) - row_out
        return (starts[:, None] + 1 + np.arange(row_out, dtype=np.int64)[None, :]).reshape(-1)

    def takes(self, arrival: np.ndarray, taken=None) -> np.ndarray:
        """Cycle at which every input transfer of one inference is written (taken), the core
        idle before, input transfer ``k`` offered at ``arrival[k]`` and output transfer ``k``
        taken at ``taken[k]`` (``None``: never stalled): each row from the cycle its slot in
        the line buffer is free (:meth:`timeline`), one transfer per cycle, none before it is
        offered."""
        row_in = self.width * self.folds
        arrival = np.asarray(arrival, dtype=np.int64)
        starts: list = []
        rows_taken = None if taken is None else \
            np.asarray(taken, dtype=np.int64)[self.row_beats - 1::self.row_beats]
        self.timeline(1, arrival[row_in - 1::row_in], starts, rows_taken)
        free = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(row_in)[None, :]
        return spaced(np.maximum(arrival, free.reshape(-1)))

    def deadlines(self, arrival: np.ndarray, late=None) -> np.ndarray:
        """The latest cycle at which every input transfer of one inference can be written
        without output transfer ``k`` leaving after ``late[k]`` (``None``: after
        :meth:`follow`'s cycle): each input row the cycle before the first output row that
        reads it is issued, the output rows issued as late as their transfers may leave."""
        row_in, row_out = self.width * self.folds, self.row_beats
        late = self.follow(arrival) if late is None else np.asarray(late, dtype=np.int64)
        issue = (late.reshape(-1, row_out) - 1 - np.arange(row_out)[None, :]).min(axis=1)
        j = np.arange(len(issue), dtype=np.int64) * row_out
        issue = np.minimum.accumulate((issue - j)[::-1])[::-1] + j
        need = np.array([self.row_span(oh)[1] for oh in range(self.out_height)])
        first = np.searchsorted(need, np.arange(self.height), side="right")
        rows = np.where(first < len(issue), issue[np.minimum(first, len(issue) - 1)] - 1,
                        issue[-1] + row_out)
        return spaced_before((rows[:, None] - row_in + 1
                              + np.arange(row_in)[None, :]).reshape(-1))

    @property
    def latency(self) -> int:
        """See :func:`window_latency`."""
        _, out_end = self.timeline(1)
        return out_end[-1]

    @property
    def cycles(self) -> int:
        """See :func:`window_cycles`."""
        # The model is a max-plus recurrence over identical inferences: the cycles between
        # consecutive inferences become constant once the start-up transient has passed, which
        # takes at most as many inferences as the line buffer reaches back (rows / height) plus
        # a few. Simulate until the last differences agree.
        count = self.rows // self.height + 6
        while True:
            _, out_end = self.timeline(count)
            ends = out_end[self.out_height - 1::self.out_height]
            diffs = np.diff(ends)
            if len(set(diffs[-3:].tolist())) == 1:
                return int(diffs[-1])
            if count > 1000:                    # pragma: no cover - periodic, not constant
                period = len(diffs) // 2
                return -(-(ends[-1] - ends[-1 - period]) // period)
            count *= 2


def window_cycles(channels, height, width, kernel, stride=(1, 1), dilation=(1, 1),
                  pads=(0, 0, 0, 0), lanes=1, buffer_rows=None) -> int:
    """Steady-state cycles per inference of a :class:`SlidingWindowCore`.

    The parameters are those of the core without the element shape and the pad value. With
    full-rate input (one transfer per cycle whenever the core takes it) and an output that
    never stalls, consecutive inferences then leave exactly this many cycles apart.

    It is at least ``max(in_beats, out_beats)`` (each side moves one transfer per cycle at
    most), and equal to it with the default line buffer (:attr:`WindowGeometry.full_rows`): so
    in the usual layers and in all of some 140 000 geometries of an exhaustive sweep of the
    vertical parameters (heights up to 8, kernel heights up to 5, strides up to 3, dilations up
    to 2, top and bottom pads up to 5) over a range of row widths. With fewer
    ``buffer_rows`` it is larger. It is computed by running the row-level model of
    :meth:`WindowGeometry.timeline` until the cycles between inferences settle; the model is
    exact, because the writer and the reader each move one transfer per cycle and wait only at
    row boundaries.

    Raises
    ------
    TypeError, ValueError
        As :class:`SlidingWindowCore`.
    """
    return WindowGeometry.make(channels, height, width, kernel, stride, dilation, pads, lanes,
                               buffer_rows).cycles


def window_latency(channels, height, width, kernel, stride=(1, 1), dilation=(1, 1),
                   pads=(0, 0, 0, 0), lanes=1, buffer_rows=None) -> int:
    """Cycles from the first input transfer to the last output transfer of one inference.

    For an idle core fed at one transfer per cycle with the output never stalled. Typically
    (the reader slower than the writer) ``rows0 * width * folds + out_beats``, where
    ``rows0 = min(height, kh_extent - top)`` input rows precede the first window: the first
    output is issued the cycle after the last transfer of those rows and leaves one cycle
    later, and the last one leaves ``out_beats - 1`` cycles after that. In general it is
    computed by the model of :meth:`WindowGeometry.timeline` (exact).

    Raises
    ------
    TypeError, ValueError
        As :class:`SlidingWindowCore`.
    """
    return WindowGeometry.make(channels, height, width, kernel, stride, dilation, pads, lanes,
                               buffer_rows).latency


def _geometry(stage: Stage):
    p = stage.params
    return WindowGeometry.make(p["channels"], p["height"], p["width"], p["kernel"],
                               p["stride"], p["dilation"], p["pads"], stage.in_lanes)


class WindowTiming(CoreKind):
    """A :class:`~onnx2fpga.hw.window.SlidingWindowCore`: the row-level schedule of
    :class:`WindowGeometry`; the first window once its rows are in, the last one the output
    rows that read the last input row after it. With ``read_register`` (a second register
    stage behind the line buffer's read) every output transfer one cycle later."""
    kinds = ("window",)

    @staticmethod
    def _delay(stage: Stage) -> int:
        return int(bool(stage.params.get("read_register", False)))

    def cycles(self, stage: Stage) -> int:
        return max(stage.in_beats, stage.out_beats, _geometry(stage).cycles)

    def timing(self, stage: Stage, first: int, last: int) -> tuple[int, int]:
        g, d = _geometry(stage), self._delay(stage)
        rows0 = g.row_span(0)[1]
        first_out = first + rows0 * g.width * g.folds + 1
        # After the last input row, only the output rows that read it remain.
        last_rows = sum(1 for oh in range(g.out_height) if g.row_span(oh)[1] == g.height)
        return first_out + d, last + max(last_rows, 1) * g.row_beats + 1 + d

    def trace(self, stage: Stage, ins: list) -> np.ndarray:
        g = _geometry(stage)
        if len(ins[0]) != g.in_beats:
            return super().trace(stage, ins)
        return g.follow(ins[0]) + self._delay(stage)

    def takes(self, stage: Stage, ins: list, taken=None) -> list:
        g = _geometry(stage)
        if len(ins[0]) != g.in_beats or (taken is not None and len(taken) != g.out_beats):
            return super().takes(stage, ins, taken)
        if taken is not None:
            taken = np.asarray(taken, dtype=np.int64) - self._delay(stage)
        return [g.takes(ins[0], taken)]

    def deadlines(self, stage: Stage, ins: list, late=None) -> list:
        g = _geometry(stage)
        if len(ins[0]) != g.in_beats or (late is not None and len(late) != g.out_beats):
            return super().deadlines(stage, ins, late)
        if late is not None:
            late = np.asarray(late, dtype=np.int64) - self._delay(stage)
        return [g.deadlines(ins[0], late)]
