"""The registries are complete: every IR layer type has its planning kind and its golden
function, every core kind planned has its cycle model and its hardware. A new layer or core
kind that misses one of its entries fails here, by name, before any design is built."""

import re

from onnx2fpga.hw.top import CORES
from onnx2fpga.ir.layers import LAYER_TYPES
from onnx2fpga.plan.cores import CORE_KINDS
from onnx2fpga.plan.layers import KINDS, kind_of
from onnx2fpga.plan.stage import Stage
from onnx2fpga.sim import golden


def test_every_layer_type_has_a_kind_and_a_golden_function():
    names = sorted(t.__name__ for t in LAYER_TYPES)
    assert sorted(t.__name__ for t in KINDS) == names
    assert sorted(t.__name__ for t in golden._LAYERS) == names
    for layer_type, kind in KINDS.items():
        assert kind.layer_type is layer_type


def test_every_core_kind_has_a_cycle_model_and_hardware():
    # A cast is wires: a cycle model, no core.
    assert sorted(CORE_KINDS) == sorted(set(CORES) | {"cast"})
    for kind, model in CORE_KINDS.items():
        assert kind in model.kinds
    for kind, core in CORES.items():
        assert callable(core.from_stage), kind


def test_stage_kinds_named_in_the_stage_docstring_are_the_registered_ones():
    doc = Stage.__doc__.split("kind : str")[1].split("name : str")[0]
    named = set(re.findall(r'``"(\w+)"``', doc))
    assert named == set(CORE_KINDS)


def test_an_unknown_layer_is_refused_by_name():
    class Odd:
        pass
    try:
        kind_of(Odd())
    except TypeError as e:
        assert str(e) == "Unknown layer type Odd"
    else:                                           # pragma: no cover
        raise AssertionError("kind_of accepted an object no kind describes")
