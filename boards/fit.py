"""Does a compiled design fit a board's device? ``build`` asks before synthesis.

The figures are the manifest's resource estimate of the design with the board wrapper
(``manifest["resources"][family]["board"]``, written by compile, the same estimate
``compile --board`` folds against) and the device's full capacity (:class:`~.targets.
DeviceLimits`), not compile's ``--utilization`` target: a design the estimate puts at 95 % of a
device still builds. On iCE40 the limit on logic is the device's logic cells, of which each
holds one LUT and one flip-flop (:func:`onnx2fpga.plan.devices.logic_cells`).
"""

from __future__ import annotations

from ..errors import SizeError
from ..log import get_logger
from ..plan.devices import logic_cells
from .targets import BoardTarget, get_board, list_boards

__all__ = ["estimate_for", "overflows", "check_fit"]

_log = get_logger(__name__)

# What each resource is called in a message, and its limit on the device.
_LIMITS = {"logic cells": lambda lim: lim.lut, "lut": lambda lim: lim.lut,
           "ff": lambda lim: lim.ff, "dsp": lambda lim: lim.dsp, "bram": lambda lim: lim.bram,
           "spram": lambda lim: lim.spram}
_WORDS = {"logic cells": "logic cells", "lut": "LUTs", "ff": "flip-flops",
          "dsp": "hard multipliers", "bram": "block RAMs", "spram": "SPRAMs"}


def estimate_for(resources: dict, family: str) -> dict | None:
    """The estimate of the design and board wrapper on ``family`` (``lut``, ``ff``, ``dsp``,
    ``bram``, ``spram``: 0 without weights in SPRAM) from ``resources`` (the manifest's), or
    ``None`` where it has none (a Gowin device; an older manifest)."""
    try:
        board = resources[family]["board"]
        out = {k: int(board[k]) for k in ("lut", "ff", "dsp", "bram")}
        out["spram"] = int(board.get("spram", 0))
        return out
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def overflows(estimate: dict, target: BoardTarget) -> list[tuple[str, int, int]]:
    """``(resource, estimated, available)`` for every resource of ``estimate`` beyond the
    device of ``target``; on iCE40, logic cells replace LUTs."""
    used = dict(estimate)
    used.setdefault("spram", 0)
    names = ["lut", "ff", "dsp", "bram", "spram"]
    if target.family == "ice40":
        used["logic cells"] = logic_cells(estimate)
        names[0] = "logic cells"
    out = []
    for name in names:
        available = _LIMITS[name](target.limits)
        if used[name] > available:
            out.append((name, used[name], available))
    return out


def check_fit(resources: dict, board, folded_for: str | None = None) -> None:
    """Refuse, before any tool runs, a design whose estimate exceeds the board's device.

    ``resources`` is the manifest's ``resources`` (per family, ``"board"``: the design with
    the board wrapper); ``folded_for`` the board the design was compiled for (the manifest's
    ``folding["board"]``), which changes the advice.

    Raises
    ------
    SizeError
        One line: the board and device, each resource over (estimated and available), and
        what to do: compile with ``--board`` for this board (which folds the design until its
        estimate fits), or a larger board of the family where one fits, or building anyway.
    """
    target = get_board(board)
    estimate = estimate_for(resources, target.family)
    if estimate is None:
        _log.debug("%s: no %s resource estimate in the manifest; fit not checked",
                   target.name, target.family)
        return
    over = overflows(estimate, target)
    _log.debug("%s: estimated %s; device %s", target.name, estimate, target.limits.as_dict())
    if not over:
        return
    figures = ", ".join(f"{used:,} {_WORDS[name]} > {available:,} available"
                        for name, used, available in over)
    if folded_for == target.name:
        todo = "it was compiled for it: fold it slower (compile --folding or --target-fps)"
    else:
        todo = f"compile with --board {target.name} to fold it for this device"
    boards = sorted(map(get_board, list_boards()), key=lambda t: (t.limits.lut, t.name))
    larger = [t.name for t in boards
              if t.family == target.family and not overflows(estimate, t)]
    if larger:
        todo += f", or build for a larger board ({', '.join(larger[:2])} would fit)"
    raise SizeError(f"Design does not fit the {target.name} ({target.device}): estimated "
                    f"{figures}; {todo} (build --no-fit-check tries anyway)")
