"""ONNX conformance, model level: IR versions, metadata, opsets, functions, training info.

Item IDs are those of the ONNX consumer checklist; docs/onnx-conformance.md maps each to
its test. Every model is built here with onnx.helper.
"""

import json
import re
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx2fpga
from onnx2fpga.errors import CheckError, UnsupportedError
from onnx2fpga.frontend.load import Onnx2FpgaWarning, load_model
from onnx2fpga.sim.model import run_design
from tests.api.test_fuzz import _qdq_mlp, run_frontend
from tests.helpers.models import float_mlp

# (IR version, the newest ai.onnx opset released with it): onnx.helper.VERSION_TABLE.
IR_OPSETS = [(3, 8), (4, 9), (5, 10), (6, 11), (7, 14), (8, 18), (9, 20), (10, 22),
             (11, 23), (12, 24), (13, 27), (14, 28)]


def _ir3(m):
    """IR 3: every initializer is also listed as a graph input (the checker requires it)."""
    m.ir_version = 3
    for t in m.graph.initializer:
        m.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return m


def _quiet(fn, *args, **kw):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = fn(*args, **kw)
    return out, [str(r.message) for r in rec if r.category is Onnx2FpgaWarning]


def _same_design(a, b, x):
    np.testing.assert_array_equal(run_design(a, x), run_design(b, x))
    for la, lb in zip(a.dataflow.layers, b.dataflow.layers, strict=True):
        np.testing.assert_array_equal(la.weight, lb.weight)


@pytest.mark.parametrize("ir,opset", IR_OPSETS)
def test_md01_every_ir_version_from_3_to_the_newest(ir, opset):
    """MD-01, MD-13: IR 3 up to onnx.IR_VERSION load and compile, and give the design of
    the same weights at IR 8."""
    assert IR_OPSETS[-1][0] == onnx.IR_VERSION
    m = float_mlp((8, 6, 4), opset=opset)
    m.ir_version = ir
    if ir == 3:
        _ir3(m)
    d, _ = _quiet(run_frontend, m)
    ref, _ = _quiet(run_frontend, float_mlp((8, 6, 4), opset=13))
    assert d.metadata["ir_version"] == ir
    x = np.random.default_rng(0).standard_normal((20, 1, 8)).astype(np.float32)
    _same_design(d, ref, x)


@pytest.mark.parametrize("ir,msg", [
    (2, r"^IR version 2 is not supported \(IR 3, ONNX 1\.0, introduced operator sets; "
        r"supported: IR 3 to 14\)$"),
    (15, r"^IR version 15 is newer than this onnx supports \(14\)$"),
])
def test_md01_ir_versions_outside_the_range_are_refused(ir, msg):
    m = float_mlp()
    m.ir_version = ir
    with pytest.raises(CheckError, match=msg):
        load_model(m)


def test_md01_missing_ir_version_is_not_a_model(tmp_path):
    m = float_mlp()
    m.ClearField("ir_version")
    p = tmp_path / "m.onnx"
    p.write_bytes(m.SerializeToString())
    with pytest.raises(onnx2fpga.errors.LoadError, match=r"no graph or no ir_version\)$"):
        load_model(p)


def test_md02_types_newer_than_the_ir_version_are_refused_or_warned():
    """MD-02: an INT4 weight in an IR 9 model (INT4 arrived with IR 10)."""
    m = _qdq_mlp()
    m.ir_version = 9
    m.opset_import[0].version = 21
    w = m.graph.initializer[2]
    assert w.name == "W0"
    w.CopyFrom(helper.make_tensor("W0", TensorProto.INT4, list(w.dims),
                                  np.zeros(int(np.prod(w.dims)), np.int64)))
    z = [t for t in m.graph.initializer if t.name == "z_w0"][0]
    z.CopyFrom(helper.make_tensor("z_w0", TensorProto.INT4, [], [0]))
    with pytest.raises(CheckError, match=r"^MD-02: IR version 9 predates features the model "
                                         r"uses: Initializer 'W0' is INT4 \(IR 10\)"):
        load_model(m)
    g, warned = _quiet(load_model, m, lenient=True)
    assert any(w.startswith("MD-02: IR version 9 predates") for w in warned)
    assert g.constants["W0"].dtype.name == "int4"


def test_md03_md04_opset_import_is_required_and_bound():
    """MD-03: every op is resolved in the declared opsets; MD-04: no ai.onnx import is
    refused in strict mode and assumed (newest opset of the IR) in lenient mode."""
    g = load_model(float_mlp(opset=17))
    assert g.opsets[""] == 17
    assert [n.version for n in g.nodes] == [13, 14, 13, 13]  # Gemm-13 Relu-14 ...
    m = float_mlp()
    del m.opset_import[:]
    with pytest.raises(CheckError, match=r"--lenient"):
        load_model(m)
    g, warned = _quiet(load_model, m, lenient=True)
    assert g.opsets[""] == 18 and any(w.startswith("MD-04") for w in warned)


@pytest.mark.parametrize("imports,twice,lenient_too", [
    ([("", 13), ("", 17)], "'ai.onnx' twice (versions 13 and 17)", True),
    # "" and "ai.onnx" are one domain (OP-04)
    ([("", 13), ("ai.onnx", 17)], "'ai.onnx' twice (versions 13 and 17)", True),
    # the same version twice: --lenient drops one
    ([("", 13), ("", 13)], "'ai.onnx' twice (versions 13 and 13)", False),
    ([("", 13), ("org.example", 1), ("org.example", 2)], "'org.example' twice (versions 1 "
                                                          "and 2)", True),
])
def test_md03_duplicate_opset_imports_are_refused(imports, twice, lenient_too):
    """MD-03: "duplicates are an error" (they were accepted, the last one winning)."""
    m = float_mlp(opset=13)
    del m.opset_import[:]
    m.opset_import.extend(helper.make_opsetid(d, v) for d, v in imports)
    msg = rf"^MD-03: opset_import names domain {re.escape(twice)}; a model imports each domain"
    with pytest.raises(CheckError, match=msg):
        load_model(m)
    if lenient_too:
        with pytest.raises(CheckError, match=msg):
            load_model(m, lenient=True)
    else:
        g, warned = _quiet(load_model, m, lenient=True)
        assert g.opsets[""] == 13
        assert any(w.startswith("MD-03: opset_import names domain 'ai.onnx' twice") for w in
                   warned)


@pytest.mark.parametrize("domain", ["", "ai.onnx"])
@pytest.mark.parametrize("lenient", [False, True])
def test_md03_an_opset_newer_than_onnx_knows_is_refused(domain, lenient):
    """An ai.onnx opset from the future (99) was accepted silently: its operators' semantics
    are not those of any opset the installed onnx (and this compiler) knows."""
    m = float_mlp(opset=13)
    m.opset_import[0].domain, m.opset_import[0].version = domain, 99
    newest = onnx.defs.onnx_opset_version()
    with pytest.raises(CheckError, match=rf"^MD-03: ai.onnx opset 99 is newer than the "
                                         rf"installed onnx \S+ knows \(its newest is opset "
                                         rf"{newest}\)"):
        load_model(m, lenient=lenient)
    m.opset_import[0].version = newest           # the newest itself is fine
    assert load_model(m, lenient=lenient).opsets[""] == newest


def _licensed_mlp():
    m = float_mlp((8, 6, 4), softmax=False)
    m.producer_name, m.producer_version = "exporter", "4.5"
    m.model_version = (1 << 48) | (2 << 32) | 3
    m.doc_string = "# A small MLP\n\nFor tests."
    m.domain = "org.example"
    m.graph.doc_string = "the graph"
    helper.set_model_props(m, {"model_license": "Apache-2.0", "model_author": "A. Person",
                               "org.example.note": "kept"})
    return m


def test_md05_md09_metadata_reaches_the_manifest(tmp_path):
    """MD-05 (producer), MD-06 (domain, not enforced), MD-07 (SemVer model_version), MD-08
    (doc_string), MD-09 (metadata_props incl. model_license), GR-14 (graph doc_string):
    carried through onnx2fpga.compile into manifest.json."""
    cal = np.random.default_rng(0).standard_normal((32, 1, 8)).astype(np.float32)
    design = onnx2fpga.compile(_licensed_mlp(), tmp_path / "out", calibration=cal)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    model = manifest["model"]
    assert design.manifest["model"] == model
    assert (model["producer_name"], model["producer_version"]) == ("exporter", "4.5")
    assert model["model_version"] == (1 << 48) | (2 << 32) | 3
    assert model["model_version_semver"] == "1.2.3"
    assert model["doc_string"] == "# A small MLP\n\nFor tests."
    assert model["graph_doc_string"] == "the graph"
    assert model["domain"] == "org.example"
    assert model["model_license"] == "Apache-2.0"
    assert model["model_author"] == "A. Person"
    assert model["metadata_props"] == {"model_license": "Apache-2.0",
                                       "model_author": "A. Person",
                                       "org.example.note": "kept"}


def test_md07_simple_model_version_has_no_semver():
    m = float_mlp()
    m.model_version = 7
    g = load_model(m)
    assert g.metadata["model_version"] == 7 and "model_version_semver" not in g.metadata


def test_md09_duplicate_metadata_keys_are_refused():
    m = float_mlp()
    m.metadata_props.add(key="k", value="1")
    m.metadata_props.add(key="k", value="2")
    with pytest.raises(CheckError, match=r"^ONNX checker: .*k"):
        load_model(m)


def test_md10_tr01_training_info_is_ignored_with_a_warning():
    m = float_mlp((8, 6, 4), softmax=False)
    m.training_info.add()
    g, warned = _quiet(load_model, m)
    assert "TR-01: the model's training_info is ignored (inference only)" in warned
    assert len(g.nodes) == 3


def test_md12_lenient_mode_repairs_and_names_what_it_repaired():
    """MD-12 / VC-04 (lenient mode): an empty graph name and an unsorted node list."""
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.name = ""
    nodes = list(m.graph.node)[::-1]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    with pytest.raises(CheckError, match=r"^ONNX checker: .*--lenient"):
        load_model(m)
    g, warned = _quiet(load_model, m, lenient=True)
    assert [n.op for n in g.nodes] == ["Gemm", "Relu", "Gemm"]
    assert g.name == "graph"
    assert any(w.startswith("GR-01") for w in warned)
    assert any(w.startswith("GR-02") for w in warned)


@pytest.mark.parametrize("opset,since", [(7, 7), (9, 9), (11, 11), (13, 13), (20, 13)])
def test_op01_op02_nodes_bind_to_the_newest_version_at_most_the_import(opset, since):
    g = load_model(float_mlp(opset=opset))
    gemm = [n for n in g.nodes if n.op == "Gemm"][0]
    assert (gemm.version, gemm.opset) == (since, opset)


def test_op03_attribute_unknown_to_the_bound_version_is_refused():
    """OP-03: `axis` of QuantizeLinear exists from version 13; under opset 10 it is an error."""
    m = _qdq_mlp()
    m.opset_import[0].version = 10
    m.graph.node[0].attribute.append(helper.make_attribute("axis", 1))
    with pytest.raises(CheckError, match=r"^ONNX checker: Unrecognized attribute: axis for "
                                         r"operator QuantizeLinear"):
        load_model(m)


def test_op04_ai_onnx_domain_name_is_the_default_domain():
    m = float_mlp()
    m.opset_import[0].domain = "ai.onnx"
    g = load_model(m)
    assert g.opsets == {"": 13} and all(n.domain == "" for n in g.nodes)


@pytest.mark.parametrize("domain,op", [("ai.onnx.ml", "Imputer"),
                                       ("com.microsoft", "QGemm"),
                                       ("ai.onnx.preview.training", "Momentum")])
def test_op05_op06_op08_tr02_other_domains_are_refused_by_name(domain, op):
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.node[1].op_type, m.graph.node[1].domain = op, domain
    del m.graph.node[1].attribute[:]
    m.opset_import.append(helper.make_opsetid(domain, 1))
    with pytest.raises((UnsupportedError, CheckError)) as e:
        load_model(m, lenient=True)
    assert f"{domain}" in str(e.value)


def test_op05_op06_custom_domain_ops_are_listed_as_unsupported():
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.node[1].op_type, m.graph.node[1].domain = "LocalAct", "org.example"
    m.opset_import.append(helper.make_opsetid("org.example", 1))
    with pytest.raises(UnsupportedError, match=r"^Node 'relu0' \(org\.example"
                                               r"\.LocalAct, opset 1\): domain "
                                               r"'org\.example' is not "
                                               r"supported \(only ai\.onnx operators; "
                                               r"model-local functions are inlined\)$"):
        load_model(m)
    # Of the QONNX / FINN domains only the quantizers are implemented (frontend/qonnx.py,
    # frontend/finn.py).
    m = float_mlp((8, 6, 4), softmax=False)
    m.graph.node[1].op_type, m.graph.node[1].domain = "Im2Col", "qonnx.custom_op.general"
    m.opset_import.append(helper.make_opsetid("qonnx.custom_op.general", 1))
    with pytest.raises(UnsupportedError, match=r"^Node 'relu0' \(qonnx\.custom_op\.general"
                                               r"\.Im2Col, opset 1\): operator "
                                               r"'Im2Col' of domain "
                                               r"'qonnx\.custom_op\.general' is not supported "
                                               r"\(of this domain only Quant, IntQuant, "
                                               r"BipolarQuant, Trunc, MultiThreshold\)$"):
        load_model(m)


def _legacy_opset6():
    """IR 3, opset 6: Gemm-6 with `broadcast`, every weight also a graph input (GR-05)."""
    m = float_mlp((8, 6, 4), opset=13)
    for n in m.graph.node:
        if n.op_type == "Gemm":
            n.attribute.append(helper.make_attribute("broadcast", 1))
    m.opset_import[0].version = 6
    return _ir3(m)


def test_op09_old_opsets_are_converted_and_compile_the_same():
    """OP-09: opsets below 7 are converted with onnx.version_converter (the legacy
    `broadcast` attribute); the design equals the opset-13 one with the same weights."""
    m = _legacy_opset6()
    onnx.checker.check_model(m)
    d, warned = _quiet(run_frontend, m)
    assert "OP-09: converted the model from ai.onnx opset 6 to 7" in warned
    assert any(w.startswith("GR-05") for w in warned)
    ref, _ = _quiet(run_frontend, float_mlp((8, 6, 4), opset=13))
    x = np.random.default_rng(1).standard_normal((20, 1, 8)).astype(np.float32)
    _same_design(d, ref, x)


def test_op10_models_we_write_for_tests_set_ir_version_explicitly():
    """OP-10 is about producing ONNX: the test builders pin the IR version (onnxruntime
    refuses IR 14), which is the only ONNX the project writes."""
    assert float_mlp().ir_version == 8 and float_mlp(opset=21).ir_version == 10
    assert _qdq_mlp().ir_version == 8


def _with_function(attr_default=None):
    """Relu replaced by a model-local function LeakyClip(x) = Clip(LeakyRelu(x)), with an
    attribute reference (FN-05)."""
    m = float_mlp((8, 6, 4), softmax=False)
    m.ir_version = 10
    relu = m.graph.node[1]
    relu.op_type, relu.domain = "LocalAct", "org.example"
    if attr_default is None:
        relu.attribute.append(helper.make_attribute("slope", 0.0))
    leaky = helper.make_node("LeakyRelu", ["a"], ["b"])
    ref = onnx.AttributeProto(name="alpha", ref_attr_name="slope", type=onnx.AttributeProto.FLOAT)
    leaky.attribute.append(ref)
    fn = helper.make_function("org.example", "LocalAct", ["a"], ["b"], [leaky],
                              [helper.make_opsetid("", 13)], attributes=[])
    proto = helper.make_attribute("slope", attr_default if attr_default is not None else 0.5)
    fn.attribute_proto.append(proto)
    m.functions.append(fn)
    m.opset_import.append(helper.make_opsetid("org.example", 1))
    return m


def test_fn02_fn03_fn05_model_local_functions_are_inlined():
    """FN-02/03/04: the function body (its own opset import) replaces the call; FN-05: the
    call-site attribute value (slope=0) replaces the reference, so LeakyRelu(0) == Relu;
    FN-06: shapes are inferred after inlining."""
    g = load_model(_with_function())
    assert [n.op for n in g.nodes] == ["Gemm", "LeakyRelu", "Gemm"]
    assert g.nodes[1].attrs == {"alpha": 0.0}
    assert g.tensors[g.nodes[1].outputs[0]].shape == (1, 6)


def test_fn05_attribute_default_from_attribute_proto():
    m = _with_function(attr_default=0.25)
    g = load_model(m)
    assert g.nodes[1].op == "LeakyRelu" and g.nodes[1].attrs == {"alpha": 0.25}


def test_fn01_schema_functions_run_as_their_operator():
    """FN-01: a function op of the standard (HardSwish, a schema function) is kept as the
    operator, not expanded; an op the hardware cannot run is reported by name."""
    m = float_mlp((8, 6, 4), softmax=False, opset=14)
    m.graph.node[1].op_type = "HardSwish"
    g = load_model(m)
    assert g.nodes[1].op == "HardSwish" and g.nodes[1].version == 14
