"""``onnx2fpga conformance``: the ONNX backend node tests through the golden model and RTL.

The expected outputs are the ONNX project's own (onnx.backend.test node tests), so every
"exact" here is an agreement with data from outside the project.
"""

import json

import numpy as np
import pytest

from onnx2fpga.cli import main
from onnx2fpga.conformance import QUANT_OPS, format_table, node_tests, run_conformance
from onnx2fpga.sim import host

# Node tests of the six quantization operators that use what we do not claim: float8 and
# float4 element types, and blocked quantization whose blocks split an axis.
UNCLAIMED = {
    "test_dequantizelinear_e4m3fn": "element type float8_e4m3fn is not supported",
    "test_dequantizelinear_e4m3fn_float16": "element type float8_e4m3fn is not supported",
    "test_dequantizelinear_e4m3fn_zero_point": "element type float8_e4m3fn is not supported",
    "test_dequantizelinear_e5m2": "element type float8_e5m2 is not supported",
    "test_dequantizelinear_float4e2m1": "element type float4_e2m1fn is not supported",
    "test_quantizelinear_e4m3fn": "element type float8_e4m3fn is not supported",
    "test_quantizelinear_e5m2": "element type float8_e5m2 is not supported",
    "test_quantizelinear_float4e2m1": "element type float4_e2m1fn is not supported",
    "test_dequantizelinear_blocked": "blocked quantization (block_size=2 along axis 1",
    "test_quantizelinear_blocked_asymmetric": "blocked quantization (block_size=2 along axis 1",
    "test_quantizelinear_blocked_symmetric": "blocked quantization (block_size=2 along axis 1",
}


@pytest.fixture(scope="module")
def quant_results():
    return run_conformance(QUANT_OPS, rtl=False)


def test_every_quantization_node_test_passes_exactly_or_is_refused_by_type(quant_results):
    by_name = {r.test: r for r in quant_results}
    expected = {t.name for t in node_tests(QUANT_OPS)}
    assert set(by_name) == expected
    assert len(expected) == 39          # onnx 1.23.2: all of them, none skipped
    for op in QUANT_OPS:
        assert any(r.op == op and r.result == "exact" for r in quant_results), op
    for r in quant_results:
        if r.test in UNCLAIMED:
            assert r.result == "unsupported", r
            assert UNCLAIMED[r.test] in r.reason, r
        else:
            assert r.result == "exact", r
            assert r.engine == "golden" and r.reason == ""


def test_table_lists_every_test_and_counts_them(quant_results):
    table = format_table(quant_results)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["test", "op", "result", "engine"]
    rows = {ln.split()[0]: ln.split()[1:3] for ln in lines[1:-2]}
    assert rows["test_qlinearconv"] == ["QLinearConv", "exact"]
    assert rows["test_quantizelinear_e5m2"] == ["QuantizeLinear", "unsupported"]
    assert lines[-1] == "39 tests: 28 exact, 11 unsupported"


def test_float_operators_of_the_hardware_layers_pass():
    results = run_conformance(["Conv", "MaxPool", "Gemm"], rtl=False)
    assert len(results) == 36           # onnx 1.23.2
    for r in results:
        # 3-D pools and MaxPool's Indices output are refused by name; all else passes.
        assert r.passed or (r.result == "unsupported" and (
            "3-D pooling" in r.reason or "Indices output" in r.reason)), r


def test_cli_prints_json_and_exits_0_when_every_claimed_test_passes(capsys):
    assert main(["conformance", "--op", "QLinearMatMul", "MatMulInteger", "--golden-only",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted({r["op"] for r in rows}) == ["MatMulInteger", "QLinearMatMul"]
    assert len(rows) == 9 and all(r["result"] == "exact" for r in rows)


def test_cli_exits_1_when_a_test_fails(capsys, monkeypatch):
    # A golden function two steps off: the command must notice.
    real = host.HOST_OPS["QLinearMatMul"]

    def wrong(*args, **kw):
        y = real(*args, **kw)
        return (y.astype(np.int64) + 2).clip(np.iinfo(y.dtype).min,
                                             np.iinfo(y.dtype).max).astype(y.dtype)
    monkeypatch.setitem(host.HOST_OPS, "QLinearMatMul", wrong)
    assert main(["conformance", "--op", "QLinearMatMul", "--golden-only"]) == 1
    out = capsys.readouterr().out
    assert "test_qlinearmatmul_2D_uint8_float32" in out
    assert "failed" in out and out.splitlines()[-1].endswith("8 failed")


def test_cli_refuses_an_operator_without_node_tests(capsys):
    assert main(["conformance", "--op", "QLinearFoo", "--golden-only"]) == 2
    assert capsys.readouterr().err == \
        "error: ops must be operators with node tests, not ['QLinearFoo']\n"


@pytest.mark.rtl
def test_rtl_runs_the_node_test_that_compiles_and_explains_the_others():
    results = {r.test: r for r in run_conformance(["QLinearConv", "MatMulInteger"])}
    conv = results["test_qlinearconv"]
    assert (conv.result, conv.engine, conv.rtl) == ("exact", "golden+rtl", "exact")
    mmi = results["test_matmulinteger"]
    assert (mmi.result, mmi.engine) == ("exact", "golden")
    assert mmi.rtl == ("golden only: Node 'Y' (MatMulInteger, opset 10): its int32 result is "
                       "read by a graph output; only one Cast to float (then scaled and "
                       "requantized) maps to the hardware's requantization")


@pytest.mark.parametrize("kwargs,message", [
    ({"ops": "Conv"}, r"^ops must be a sequence of operator names, not 'Conv'$"),
    ({"ops": ["Conv"], "rtl": 1}, r"^rtl must be a bool, not 1$"),
])
def test_bad_parameters_are_named(kwargs, message):
    ops = kwargs.pop("ops")
    with pytest.raises(TypeError, match=message):
        run_conformance(ops, **kwargs)
