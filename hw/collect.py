"""Garbage collection while Amaranth netlists are built.

Elaborating cores and building their netlist allocates millions of small objects, many in
reference cycles (fragments, modules, netlist cells). On Python's default thresholds (a
collection of the youngest generation every 700 allocations net, of the oldest, the whole
heap, after every ten of the middle one's) the collector ran full collections again and
again meanwhile: compiling MLPerf Tiny's MobileNetV1 (vww) for the ULX3S-85F spent 10.5 s
of wall time in 22 full collections during the Verilog emission alone.
:func:`fewer_collections` raises the first threshold to :data:`NETLIST_GC_THRESHOLD` while a
netlist is built: three full collections there, 0.6 s, and the same peak memory (turning
the collector off instead cost 90 MB more: the cyclic garbage of the whole design).
"""

from __future__ import annotations

import contextlib
import gc

__all__ = ["NETLIST_GC_THRESHOLD", "fewer_collections"]

#: Net allocations between two collections of the youngest generation while a netlist is
#: built (Python's default: 700).
NETLIST_GC_THRESHOLD = 20000


@contextlib.contextmanager
def fewer_collections():
    """The collector's first threshold at least :data:`NETLIST_GC_THRESHOLD` inside the
    block, restored after it (also on an error). Collection stays on: cycles are freed as
    before, in larger batches."""
    old = gc.get_threshold()
    if old[0] < NETLIST_GC_THRESHOLD:
        gc.set_threshold(NETLIST_GC_THRESHOLD, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
