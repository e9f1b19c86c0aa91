"""hw/collect.py: fewer garbage collections while a netlist is built, none skipped."""

import gc
import weakref

import pytest

from onnx2fpga.hw.collect import NETLIST_GC_THRESHOLD, fewer_collections


class _Node:
    pass


def _cycle():
    """A reference cycle that only the cyclic collector frees, and a weak reference to it."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_fewer_collections_raises_the_first_threshold_and_restores_it():
    before = gc.get_threshold()
    assert before[0] < NETLIST_GC_THRESHOLD
    with fewer_collections():
        assert gc.get_threshold() == (NETLIST_GC_THRESHOLD, *before[1:])
        with fewer_collections():
            assert gc.get_threshold() == (NETLIST_GC_THRESHOLD, *before[1:])
        assert gc.get_threshold() == (NETLIST_GC_THRESHOLD, *before[1:])
    assert gc.get_threshold() == before
    with pytest.raises(ValueError, match=r"^x$"), fewer_collections():
        raise ValueError("x")
    assert gc.get_threshold() == before


def test_fewer_collections_keeps_a_higher_threshold():
    before = gc.get_threshold()
    gc.set_threshold(10 * NETLIST_GC_THRESHOLD, *before[1:])
    try:
        with fewer_collections():
            assert gc.get_threshold()[0] == 10 * NETLIST_GC_THRESHOLD
        assert gc.get_threshold()[0] == 10 * NETLIST_GC_THRESHOLD
    finally:
        gc.set_threshold(*before)


def test_cycles_are_still_collected_inside():
    with fewer_collections():
        first = _cycle()
        refs = [_cycle() for _ in range(2 * NETLIST_GC_THRESHOLD)]
        # Each cycle allocates three tracked objects: the collector ran meanwhile.
        assert first() is None
        assert sum(r() is None for r in refs) > NETLIST_GC_THRESHOLD
