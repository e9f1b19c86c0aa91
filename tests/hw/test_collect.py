"""hw/collect.py: garbage collection paused while a netlist lives, collected once after."""

import gc
import weakref

import pytest

from onnx2fpga.hw.collect import one_collection


class _Node:
    pass


def _cycle():
    """A reference cycle that only the cyclic collector frees, and a weak reference to it."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_one_collection_pauses_and_collects_at_the_end():
    assert gc.isenabled()
    with one_collection():
        assert not gc.isenabled()
        ref = _cycle()
        with one_collection():              # nested: the outer block collects
            assert not gc.isenabled()
            inner = _cycle()
        assert not gc.isenabled()
        assert ref() is not None and inner() is not None
    assert gc.isenabled()
    assert ref() is None and inner() is None


def test_one_collection_leaves_collection_off_when_the_caller_turned_it_off():
    gc.disable()
    try:
        with one_collection():
            ref = _cycle()
        assert not gc.isenabled()
        assert ref() is not None
    finally:
        gc.enable()
    gc.collect()
    assert ref() is None


def test_one_collection_restores_collection_after_an_error():
    with pytest.raises(ValueError, match=r"^x$"), one_collection():
        raise ValueError("x")
    assert gc.isenabled()
