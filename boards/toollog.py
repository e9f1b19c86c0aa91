"""What yosys and nextpnr are doing, read from their logs while they run.

:class:`ToolProgress` follows one tool's log file (Amaranth runs yosys with ``-l top.rpt``
and nextpnr with ``--log top.tim``; both write as they go) and turns its lines into a phase,
a figure of progress and, where the log gives enough to go on, an estimate of the time left:

- yosys: the numbered pass running (``2.43. Executing ABC9 pass.``) and for how long; the
  phases are the script's top-level steps (``synth_ice40``, the JSON backend).
- nextpnr (iCE40, ECP5, Himbaechel; 0.7x): packing; placement, by the analytic placer
  (``at iteration #12, type ALL: ... legal = 21749``: with the best so far and the count of
  iterations without improvement, five of which end it) and the annealing refinement
  (``at iteration #5: temp = ..., wirelen = 16068``); routing, by router1 (its table of arcs
  still to route and its own clock: the time left is the arcs left over the rate at which they
  went in the last rows) or router2 (``iter=9 wires=... overused=193``: the time left is the
  iterations the overuse needs to reach zero at its recent rate of decrease, times the recent
  time per iteration); then the timing report and the output files.

The time spent in each phase is counted from when its first line is seen
(:meth:`ToolProgress.phase_seconds`). Nothing here changes what a build does; a log line this
module does not know is ignored.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

__all__ = ["ToolProgress", "format_seconds"]

_YOSYS_STEP = re.compile(r"^(\d+(?:\.\d+)*)\. Executing (.+?)\.?$")
_INFO = re.compile(r"^(?:Info|Warning): ?")
_HEAP_INITIAL = re.compile(r"at initial placer iter (\d+), wirelen = (\d+)")
_HEAP = re.compile(r"at iteration #(\d+), type (\S+): wirelen solved = (\d+), "
                   r"spread = (\d+), legal = (\d+)")
# The analytic placer stops after this many iterations without a better legal wirelength
# (nextpnr's placer_heap.cc), or once the solved wirelength passes 80 % of the legal one.
_HEAP_STALL = 5
_ANNEAL = re.compile(r"at iteration #(\d+): temp = [\d.e+-]+, timing cost = \d+, "
                     r"wirelen = (\d+)")
_ARCS = re.compile(r"^Routing (\d+) arcs\.")
_ROUTER1 = re.compile(r"^\s*(\d+) \|\s*\d+\s+\d+ \|\s*\d+\s+\d+ \|\s*(\d+)\|\s*[\d.]+\s+"
                      r"([\d.]+)\|")
_ROUTER2 = re.compile(r"^\s*iter=(\d+) wires=\d+ overused=(\d+) overuse=(\d+)")
# How many recent rows the router estimates look at.
_WINDOW = 5


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``1 h 2 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


class ToolProgress:
    """Progress of one run of ``tool`` (``"yosys"``, ``"nextpnr-ice40"``, ...) from its log.

    Parameters
    ----------
    tool : str
        The tool, as Amaranth's command names it; another tool is followed without progress.
    path : str or Path, optional
        The log file, read by :meth:`poll` from where the last read stopped. Without it, lines
        come through :meth:`feed` only.

    Times are clock readings (``time.monotonic()``) passed in by the caller: when a line was
    seen, not when the tool wrote it, so a phase's time is good to the interval between reads.
    """

    def __init__(self, tool: str, path=None):
        self.kind = ("yosys" if tool == "yosys" else
                     "nextpnr" if tool.startswith("nextpnr") else None)
        self.path = None if path is None else Path(path)
        self._pos, self._rest = 0, ""
        self.phase = None           # the phase running, or None before the first known line
        self.detail = ""            # where it is in it
        self.eta = None             # seconds left in the phase, where they can be estimated
        self._starts = []           # [(phase, clock when first seen), ...]
        self._step = None           # yosys: (number, name, clock when started)
        self._arcs = None           # router1: arcs to route
        self._rows = []             # recent router rows
        self._best, self._stalled = None, 0     # analytic placer: best legal wirelength

    # -- input --------------------------------------------------------------------------------

    def poll(self, now: float) -> None:
        """Read what the tool added to its log since the last call."""
        if self.path is None:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(0, 2)
                if f.tell() < self._pos:       # a new file: start again
                    self._pos, self._rest = 0, ""
                f.seek(self._pos)
                data = f.read()
        except OSError:
            return
        self._pos += len(data)
        lines = (self._rest + data.decode(errors="replace")).split("\n")
        self._rest = lines.pop()
        for line in lines:
            self.feed(line, now)

    def feed(self, line: str, now: float) -> None:
        """Take one line of the log, seen at clock reading ``now``."""
        if self.kind == "yosys":
            self._yosys(line.rstrip(), now)
        elif self.kind == "nextpnr":
            self._nextpnr(_INFO.sub("", line.rstrip(), count=1), now)

    def _enter(self, phase: str, now: float) -> None:
        if phase != self.phase:
            self.phase, self.detail, self.eta = phase, "", None
            self._starts.append((phase, now))
            self._rows = []

    def _yosys(self, line: str, now: float) -> None:
        m = _YOSYS_STEP.match(line)
        if not m:
            return
        number, what = m.group(1), m.group(2)
        name = what.split(" (")[0].split(":")[0]
        name = name[:-len(" pass")] if name.endswith(" pass") else name
        depth = number.count(".") + 1
        if depth == 1:
            self._enter(name.lower(), now)
            self._step = None
        elif depth == 2:
            self._step = (number, name, now)
        if self._step is not None:
            self.detail = f"pass {self._step[0]} {self._step[1]}"

    def _nextpnr(self, line: str, now: float) -> None:
        if line.startswith("Packing "):
            self._enter("packing", now)
        elif (line.startswith("Creating initial analytic placement")
              or line.startswith("Running main analytical placer")):
            self._enter("placement", now)
            self.detail = "analytic placer"
        elif line.startswith("Running simulated annealing placer"):
            self._enter("placement", now)
            self.detail = "annealing"
        elif line.startswith("Routing..") or line.startswith("Running router2"):
            self._enter("routing", now)
        elif line.startswith("Routing complete"):
            self.detail, self.eta = "complete", None
        elif self.phase == "routing" and (line.startswith("Critical path report")
                                          or line.startswith("Max frequency for clock")):
            self._enter("timing report", now)
        elif m := _HEAP_INITIAL.search(line):
            self.detail = f"initial placement, iteration {m[1]}"
        elif m := _HEAP.search(line):
            legal = int(m[5])
            if m[2] == "ALL":       # the last run of an iteration, which nextpnr judges by
                if self._best is None or legal < self._best:
                    self._best, self._stalled = legal, 0
                else:
                    self._stalled += 1
            self.detail = f"analytic placer iteration {m[1]}, wirelength {legal:,}"
            if self._best is not None:
                self.detail += (f", best {self._best:,} (no gain for {self._stalled} "
                                f"iterations; it stops at {_HEAP_STALL})")
        elif m := _ANNEAL.search(line):
            self.detail = f"annealing iteration {m[1]}, wirelength {int(m[2]):,}"
        elif self.phase == "routing":
            self._routing(line, now)

    def _routing(self, line: str, now: float) -> None:
        if m := _ARCS.match(line):
            self._arcs, self._rows = int(m[1]), []
        elif m := _ROUTER1.match(line):
            left, clock = int(m[2]), float(m[3])
            self._rows = (self._rows + [(clock, left)])[-_WINDOW:]
            total = f" of {self._arcs:,}" if self._arcs else ""
            self.detail = f"{left:,}{total} arcs left to route"
            (t0, a0), (t1, a1) = self._rows[0], self._rows[-1]
            self.eta = a1 * (t1 - t0) / (a0 - a1) if a1 < a0 and t1 > t0 else None
        elif m := _ROUTER2.match(line):
            iteration, overused = int(m[1]), int(m[2])
            self._rows = (self._rows + [(now, iteration, overused)])[-_WINDOW:]
            self.detail = (f"iteration {iteration}, {overused:,} "
                           f"wire{'s' if overused != 1 else ''} overused")
            self.eta = None
            (t0, i0, o0), (t1, i1, o1) = self._rows[0], self._rows[-1]
            if 0 < o1 < o0 and i1 > i0 and t1 > t0:
                ratio = (o1 / o0) ** (1 / (i1 - i0))        # decrease per iteration
                if ratio < 1:
                    self.eta = (math.log(o1) / -math.log(ratio) + 1) * (t1 - t0) / (i1 - i0)

    # -- output -------------------------------------------------------------------------------

    def phase_seconds(self, now: float) -> dict:
        """Seconds spent in each phase so far (the last one up to ``now``), in order."""
        out = {}
        ends = [t for _, t in self._starts[1:]] + [now]
        for (phase, t0), t1 in zip(self._starts, ends):
            out[phase] = out.get(phase, 0.0) + max(0.0, t1 - t0)
        return out

    def status(self, now: float) -> str | None:
        """One line: phase, progress, time left where known, time in the phase (yosys: in the
        pass); ``None`` before the log says anything this module knows. For instance
        ``routing: 2,420 of 14,805 arcs left to route, about 5 s left; 12 s in routing``."""
        if self.phase is None:
            return None
        text = self.phase + (f": {self.detail}" if self.detail else "")
        if self.eta is not None:
            text += f", about {format_seconds(self.eta)} left"
        if self.kind == "yosys" and self._step is not None:
            return text + f"; {format_seconds(now - self._step[2])} in this pass"
        return text + f"; {format_seconds(now - self._starts[-1][1])} in {self.phase}"

    def summary(self, now: float) -> str:
        """The time per phase: ``placement 21 s, routing 8 s``; empty if none was seen."""
        return ", ".join(f"{p} {format_seconds(s)}" for p, s in self.phase_seconds(now).items())
