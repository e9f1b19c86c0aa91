"""ONNX conformance, graph level: structure, initializers, nodes, shapes, subgraphs.

Item IDs are those of the ONNX consumer checklist (docs/onnx-conformance.md). Every model is
built here with onnx.helper.
"""

import warnings
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2fpga.errors import CheckError, UnsupportedError
from onnx2fpga.frontend.check import _stable_topological
from onnx2fpga.frontend.load import Onnx2FpgaWarning, load_model
from tests.api.test_fuzz import _qdq_mlp, run_frontend
from tests.helpers.models import float_mlp


def _quiet(fn, *args, **kw):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = fn(*args, **kw)
    return out, [str(r.message) for r in rec if r.category is Onnx2FpgaWarning]


def test_gr01_graph_name_is_required_in_strict_mode():
    m = float_mlp()
    m.graph.name = ""
    with pytest.raises(CheckError, match=r"^ONNX checker: Field 'name' of 'graph' is "
                                         r"required to be non-empty"):
        load_model(m)


def test_gr02_a_cycle_is_always_fatal():
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.node[0].input[0] = "h1"  # fc0 reads fc1's output: fc0 -> relu0 -> fc1 -> fc0
    msg = r"^Node 'fc0' \(Gemm\): input 'h1' is part of a cycle$"
    with pytest.raises(CheckError, match=msg):
        load_model(m)
    with pytest.raises(CheckError, match=msg):
        load_model(m, lenient=True)


def test_gr02_long_hostile_node_lists_are_handled_in_linear_time():
    """20,000 Relu nodes in reverse order are re-sorted (lenient), and the sort reads each
    node a bounded number of times: counted, not timed (the quadratic scan this replaced
    read the node list once per node, and took minutes)."""
    n = 20_000
    nodes = [helper.make_node("Relu", [f"t{k}"], [f"t{k + 1}"]) for k in range(n)][::-1]
    g = helper.make_graph(nodes, "chain",
                          [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8

    class Counted(list):
        reads = 0

        def __getitem__(self, k):
            Counted.reads += 1
            return super().__getitem__(k)

        def __iter__(self):
            for k in range(len(self)):
                yield self[k]

    order, _ = _stable_topological(SimpleNamespace(node=Counted(m.graph.node)), {"t0"})
    assert order == list(range(n))[::-1]
    assert Counted.reads <= 3 * n
    graph, warned = _quiet(load_model, m, lenient=True)
    assert graph.nodes[0].inputs == ["t0"] and graph.nodes[-1].outputs == [f"t{n}"]
    assert any("GR-02" in w for w in warned)


def test_gr03_output_names_are_single_assignment():
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.node.append(helper.make_node("Identity", ["x"], ["h1"]))  # h1 written twice
    with pytest.raises(CheckError, match=r"^ONNX checker: .*h1"):
        load_model(m)


def test_gr04_undefined_input_is_named():
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.node[2].input[1] = "nowhere"
    with pytest.raises(CheckError, match=r"^Node 'fc1' \(Gemm\): input 'nowhere' is not "
                                         r"defined \(no graph input, initializer or node "
                                         r"output has that name\)$"):
        load_model(m)


def test_gr05_initializer_that_is_an_input_is_a_default_baked_as_constant():
    """GR-05: an initializer listed among the inputs is a default (warned and baked in);
    the real inputs are the inputs without an initializer; the default must have the
    input's declared type."""
    m = float_mlp((8, 6, 4), softmax=False)
    w = m.graph.initializer[0]
    m.graph.input.append(helper.make_tensor_value_info(w.name, TensorProto.FLOAT, [8, 6]))
    g, warned = _quiet(load_model, m)
    assert g.inputs == ["x"] and "W0" in g.constants
    assert warned == ["GR-05: input 'W0' has an initializer (an overridable default); it is "
                      "treated as a constant and baked into the design"]
    m.graph.input[-1].type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(CheckError, match=r"^Shape inference: .*differs"):
        load_model(m)
    # shape inference does not compare the shapes; the importer does
    m.graph.input[-1].type.tensor_type.elem_type = TensorProto.FLOAT
    m.graph.input[-1].type.tensor_type.shape.dim[1].dim_value = 5
    with pytest.raises(CheckError, match=r"^(Input 'W0' is declared with shape \[8, 5\] but "
                                         r"its initializer \(default value\) has shape "
                                         r"\[8, 6\]|Shape inference: .*)$"):
        load_model(m)


def test_gr05_initializer_not_an_input_is_a_constant():
    g, warned = _quiet(load_model, float_mlp((8, 6, 4), softmax=False))
    assert g.inputs == ["x"] and set(g.constants) == {"W0", "B0", "W1", "B1"}
    assert not warned


def test_gr06_initializer_order_does_not_matter():
    m = float_mlp((8, 6, 4), softmax=False)
    inits = list(m.graph.initializer)[::-1]
    del m.graph.initializer[:]
    m.graph.initializer.extend(inits)
    a, _ = _quiet(run_frontend, m)
    b, _ = _quiet(run_frontend, float_mlp((8, 6, 4), softmax=False))
    for la, lb in zip(a.dataflow.layers, b.dataflow.layers, strict=True):
        np.testing.assert_array_equal(la.weight, lb.weight)


def test_gr07_sparse_initializer_is_densified():
    m = float_mlp((8, 6, 4), softmax=False)
    w = m.graph.initializer[0]
    dense = numpy_helper.to_array(w).copy()
    dense[np.abs(dense) < 0.2] = 0
    idx = np.flatnonzero(dense).astype(np.int64)
    m.graph.initializer.remove(w)
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(dense.reshape(-1)[idx], "W0"),
        numpy_helper.from_array(idx), [8, 6]))
    g = load_model(m)
    np.testing.assert_array_equal(g.constants["W0"], dense)
    # coordinates form [NNZ, rank]
    coords = np.stack(np.unravel_index(idx, (8, 6)), 1).astype(np.int64)
    m.graph.sparse_initializer[0].indices.CopyFrom(numpy_helper.from_array(coords))
    np.testing.assert_array_equal(load_model(m).constants["W0"], dense)


@pytest.mark.parametrize("index,msg", [
    (48, r"has an index outside its 48 elements$"),
    (-1, r"has an index outside its 48 elements$"),
])
def test_gr07_sparse_index_out_of_range_is_refused(index, msg):
    m = float_mlp((8, 6, 4), softmax=False)
    w = m.graph.initializer[0]
    m.graph.initializer.remove(w)
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(np.float32([1, 2]), "W0"),
        numpy_helper.from_array(np.int64([0, index])), [8, 6]))
    with pytest.raises(CheckError, match=msg):
        load_model(m)


def test_gr08_sh01_top_level_inputs_need_a_shape():
    m = float_mlp()
    m.graph.input[0].type.tensor_type.ClearField("shape")
    with pytest.raises(CheckError, match=r"^ONNX checker: Field 'shape' of 'type' is required "
                                         r"but missing"):
        load_model(m)


def test_gr09_value_info_is_a_hint_checked_by_inference():
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.value_info.append(helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 7]))
    with pytest.raises(CheckError, match=r"^Shape inference: .*"):
        load_model(m)
    # a value_info entry never overrides the graph input's own type
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.value_info.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, None))
    assert load_model(m).tensors["x"].shape == (1, 8)


def test_gr10_graph_output_may_be_an_input_or_initializer():
    """GR-10: pass-through and constant outputs load; the hardware refuses a graph output
    that is the graph input by name (only the accelerator's output stream reaches the host
    tail)."""
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.output.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8]))
    g = load_model(m)
    assert g.outputs == ["h1", "x"]
    with pytest.raises(UnsupportedError, match=r"^Tensor 'x': the graph input is read after "
                                               r"the accelerator \(a graph output or a tail "
                                               r"node\); only the accelerator's one output "
                                               r"stream reaches the host part after it$"):
        run_frontend(_qdq_two_outputs())


def _qdq_two_outputs():
    m = _qdq_mlp()
    m.graph.output.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]))
    return m


def test_gr11_sh03_names_need_not_be_c_identifiers():
    m = float_mlp((8, 6, 4), softmax=False)
    rename = {"x": "input:0", "h0": "onnx::Gemm_0", "r0": "gpu_0/data 0", "h1": "74"}
    for n in m.graph.node:
        n.input[:] = [rename.get(i, i) for i in n.input]
        n.output[:] = [rename.get(o, o) for o in n.output]
    m.graph.input[0].name, m.graph.output[0].name = "input:0", "74"
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch size!"
    d, _ = _quiet(run_frontend, m)
    assert d.inputs[0]["name"] == "input:0" and d.outputs[0]["name"].startswith("74")


def test_gr12_node_names_are_optional_and_may_repeat():
    m = float_mlp((8, 6, 4), softmax=False)
    for n in m.graph.node:
        n.name = "same"
    m.graph.node[1].name = ""
    d, _ = _quiet(run_frontend, m)
    assert len(d.dataflow.layers) == 2


@pytest.mark.parametrize("op", ["If", "Loop", "Scan"])
def test_gr13_subgraphs_are_refused_by_name(op):
    m = float_mlp((8, 6, 4), softmax=False)
    body_in = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4])]
    body = helper.make_graph([helper.make_node("Identity", ["a"], ["b"])], "body", [] if
                             op == "If" else body_in,
                             [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4])])
    if op == "If":
        m.graph.initializer.append(numpy_helper.from_array(np.array(True), "cond"))
        node = helper.make_node("If", ["cond"], ["y"], name="ctl", then_branch=body,
                                else_branch=body)
    elif op == "Loop":
        node = helper.make_node("Loop", ["", "", "h1"], ["y"], name="ctl", body=body)
    else:
        node = helper.make_node("Scan", ["h1"], ["y"], name="ctl", body=body,
                                num_scan_inputs=1)
    graph = helper.make_graph(list(m.graph.node) + [node], "g", list(m.graph.input),
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              list(m.graph.initializer))
    m2 = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m2.ir_version = 8
    with pytest.raises((UnsupportedError, CheckError)) as e:
        load_model(m2)
    if isinstance(e.value, UnsupportedError):
        assert any(p.startswith(f"Node 'ctl' ({op}, opset 13): attribute ") and
                   p.endswith("holds a subgraph (control flow is not supported)")
                   for p in e.value.problems)


def test_gr13_if_refused_after_checks_pass():
    """A valid If model passes checker and shape inference and is refused at import."""
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 4])])
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then,
                          else_branch=other)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    with pytest.raises(UnsupportedError, match=r"^Node 'branch' \(If, opset 13\): attribute "
                                               r"'else_branch' holds a subgraph \(control "
                                               r"flow is not supported\)$"):
        load_model(m)


def test_gr15_quantization_annotation_is_tolerated():
    m = _qdq_mlp()
    ann = m.graph.quantization_annotation.add(tensor_name="x_q")
    ann.quant_parameter_tensor_names.add(key="SCALE_TENSOR", value="s_x")
    ann.quant_parameter_tensor_names.add(key="finn_datatype", value="INT8")
    d, _ = _quiet(run_frontend, m)
    assert d.dataflow.input.type.name == "int8"


def test_gr16_dead_nodes_and_initializers_are_legal():
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.node.append(helper.make_node("Relu", ["h0"], ["dead"]))
    m.graph.initializer.append(numpy_helper.from_array(np.ones(3, np.float32), "unused"))
    g, _ = _quiet(load_model, m)
    assert "unused" in g.constants and g.nodes[-1].outputs == ["dead"]


def test_nd03_arity_and_attributes_follow_the_schema():
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.node[1].input.append("h0")  # Relu with two inputs
    with pytest.raises(CheckError, match=r"^ONNX checker: .*Relu"):
        load_model(m)


def test_nd04_empty_name_is_an_absent_optional_input():
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.node[0].input[2] = ""  # Gemm without C
    g = load_model(m)
    assert g.nodes[0].inputs == ["x", "W0", ""]
    d, _ = _quiet(run_frontend, m)
    assert len(d.dataflow.layers) == 2


def test_nd06_attribute_values_are_decoded_to_python():
    m = float_mlp((8, 6, 4), softmax=False, trans_b=True)
    m.graph.node[0].attribute.append(helper.make_attribute("alpha", 0.5))
    g = load_model(m)
    assert g.nodes[0].attrs == {"transB": 1, "alpha": 0.5}


def test_nd06_non_finite_float_attribute_is_refused():
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.node[0].attribute.append(helper.make_attribute("alpha", float("nan")))
    with pytest.raises(CheckError, match=r"^Node 'fc0' \(Gemm, opset 13\): attribute 'alpha' "
                                         r"is nan; a finite value is required$"):
        load_model(m)


def test_nd07_parameter_inputs_must_be_constant():
    """Q/DQ scale as a graph input (not constant) is refused by name."""
    from onnx2fpga.frontend.qdq import normalize_qdq

    m = _qdq_mlp()
    s = [t for t in m.graph.initializer if t.name == "s_y0"][0]
    m.graph.initializer.remove(s)
    m.graph.input.append(helper.make_tensor_value_info("s_y0", TensorProto.FLOAT, []))
    g = load_model(m)
    with pytest.raises(UnsupportedError, match=r"scale is not a constant"):
        normalize_qdq(g)


def test_nd08_dtype_optional_values_are_refused():
    m = float_mlp((8, 6, 4), softmax=False, opset=18)
    m.graph.node.append(helper.make_node("Optional", ["h1"], ["opt"], name="opt"))
    m.graph.output.append(helper.make_value_info(
        "opt", helper.make_optional_type_proto(helper.make_tensor_type_proto(
            TensorProto.FLOAT, [1, 4]))))
    with pytest.raises(UnsupportedError, match=r"^Value 'opt': optional_type values are not "
                                               r"supported \(tensors only\)$"):
        load_model(m)


def test_nd10_constant_nodes_become_constants():
    m = float_mlp((8, 6, 4), softmax=False)
    w = m.graph.initializer[0]
    m.graph.initializer.remove(w)
    m.graph.node.insert(0, helper.make_node("Constant", [], ["W0"], value=w))
    m.graph.node.insert(0, helper.make_node("Constant", [], ["k"], value_floats=[1.0, 2.0]))
    sp = helper.make_sparse_tensor(numpy_helper.from_array(np.float32([5])),
                                   numpy_helper.from_array(np.int64([1])), [3])
    m.graph.node.insert(0, helper.make_node("Constant", [], ["s"], sparse_value=sp))
    g = load_model(m)
    np.testing.assert_array_equal(g.constants["W0"], numpy_helper.to_array(w))
    np.testing.assert_array_equal(g.constants["k"], np.float32([1, 2]))
    np.testing.assert_array_equal(g.constants["s"], np.float32([0, 5, 0]))
    assert [n.op for n in g.nodes] == ["Gemm", "Relu", "Gemm"]


def test_nd10_string_constant_is_refused_by_name():
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.node.insert(0, helper.make_node("Constant", [], ["s"], name="str",
                                            value_string="hello"))
    with pytest.raises(UnsupportedError, match=r"^Node 'str' \(Constant, opset 13\): Constant "
                                               r"with attributes \['value_string'\] is not "
                                               r"supported"):
        load_model(m)


def test_sh02_sh05_symbolic_batch_is_bound_to_one_everywhere():
    """SH-02/05: the leading dim_param is bound to 1; SH-04: dim variables are global, so
    the same name elsewhere is bound too."""
    m = float_mlp((8, 6, 4), softmax=False)
    g = load_model(m)
    assert g.tensors["x"].shape == (1, 8) and g.tensors["h1"].shape == (1, 4)


def test_sh04_sh05_other_symbolic_dimensions_are_refused_clearly():
    m = float_mlp()
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "F"
    with pytest.raises(CheckError, match=r"^Input 'x': dimension 1 is symbolic \('F'\); only "
                                         r"the leading batch dimension is bound \(to 1\)$"):
        load_model(m)
    m.graph.input[0].type.tensor_type.shape.dim[1].Clear()
    with pytest.raises(CheckError, match=r"^Input 'x': dimension 1 is symbolic \(unknown\)"):
        load_model(m)


def test_sh05_zero_sized_input_is_refused():
    m = float_mlp()
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 0
    with pytest.raises(CheckError, match=r"^Input 'x': dimension 1 is 0; empty tensors are "
                                         r"not supported$"):
        load_model(m)


def test_sh06_baked_in_odd_batch_is_reported_by_the_stage_that_needs_it():
    """SH-06: a batch baked as 789444 (old pytorch exports) is not a symbolic dimension;
    the calibration data check names it."""
    import onnx2fpga
    from onnx2fpga.errors import CalibrationError

    m = float_mlp((8, 6, 4), softmax=False)
    for vi in (m.graph.input[0], m.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_value = 789444
    cal = np.zeros((4, 1, 8), np.float32)
    with pytest.raises(CalibrationError, match=r"789444"):
        onnx2fpga.compile(m, calibration=cal)


def test_nd02_undeclared_domain_needs_lenient_and_is_then_named():
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.node[1].op_type, m.graph.node[1].domain = "LocalAct", "org.example"
    with pytest.raises(CheckError, match=r"^Node 'relu0' \(org\.example\.LocalAct\): domain "
                                         r"'org\.example' is not declared in opset_import "
                                         r"\(--lenient assumes version 1\)$"):
        load_model(m)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with pytest.raises(UnsupportedError, match=r"domain 'org\.example' is not supported"):
            load_model(m, lenient=True)
    assert any(str(r.message) == "ND-02: domain 'org.example' is used but not declared in "
               "opset_import; assumed version 1" for r in rec)


def test_nd05_variadic_minimum_arity():
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.node.append(helper.make_node("Concat", [], ["cat"], axis=0))
    with pytest.raises(CheckError, match=r"^ONNX checker: .*Concat"):
        load_model(m)
