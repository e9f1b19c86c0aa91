"""Parameter checks shared by the planning models and the cores: a positive count, a lane count
dividing the channels. A wrong value raises ``TypeError`` or ``ValueError`` naming it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_count", "check_lanes"]


def check_count(name: str, value, minimum: int = 1) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {value!r}")
    return int(value)


def check_lanes(lanes, channels: int) -> int:
    """``lanes`` checked as a count that divides ``channels`` (already checked)."""
    lanes = check_count("Lanes", lanes)
    if channels % lanes:
        raise ValueError(f"Lanes must divide channels={channels}, not {lanes}")
    return lanes
