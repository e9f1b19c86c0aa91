"""The design report: report.html (graph, cycle bars, builds) and report.md, and the per-layer
quantization error the compiler puts in the manifest."""

import importlib.metadata
import json
import math
import os
import re
import shutil
from html.parser import HTMLParser

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnx2fpga
from onnx2fpga.cli import main
from onnx2fpga.errors import DesignDirError
from onnx2fpga.report import graph_layout, write_report
from onnx2fpga.sim import golden
from onnx2fpga.sim.model import run_head, stack_inputs
from tests.helpers import paths
from tests.helpers.models import float_mlp, ort_qdq_mlp, save

EXAMPLE = str(paths.EXAMPLES / "cnn_digits")
_VOID = {"meta", "br", "hr", "img", "input", "link"}


class _Doc(HTMLParser):
    """Every element with its attributes and text; checks that tags nest."""

    def __init__(self):
        super().__init__()
        self.stack, self.elements, self.errors = [], [], []

    def handle_starttag(self, tag, attrs):
        el = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.elements.append(el)
        if tag not in _VOID:
            self.stack.append(el)

    def handle_startendtag(self, tag, attrs):
        self.elements.append({"tag": tag, "attrs": dict(attrs), "text": ""})

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1]["tag"] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1]['tag'] if self.stack else None}")
            return
        self.stack.pop()

    def handle_data(self, data):
        for el in self.stack:
            el["text"] += data

    def find(self, tag, cls=None):
        return [e for e in self.elements if e["tag"] == tag and
                (cls is None or cls in e["attrs"].get("class", "").split())]


def _parse(path) -> _Doc:
    doc = _Doc()
    with open(path, encoding="utf-8") as f:
        doc.feed(f.read())
    doc.close()
    assert doc.errors == [] and [e["tag"] for e in doc.stack] == []
    return doc


def _md_tables(text: str) -> list:
    """Every markdown table as a list of rows (header first), cells unescaped."""
    tables, cur = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip().replace("\\|", "|")
                     for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if set(line) <= {"|", "-"}:
                continue
            if cur is None:
                cur = []
                tables.append(cur)
            cur.append(cells)
        else:
            cur = None
    return tables


def _table(tables, first_header: str) -> list[dict]:
    for t in tables:
        if t[0][0] == first_header:
            return [dict(zip(t[0], row)) for row in t[1:]]
    raise KeyError(first_header)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """The residual CNN example (a skip FIFO, pools, a view) compiled with its calibration."""
    out = tmp_path_factory.mktemp("cnn") / "d"
    onnx2fpga.compile(os.path.join(EXAMPLE, "model.onnx"), out,
                      calibration=os.path.join(EXAMPLE, "calibration.npy"))
    return out


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlp")
    path = save(float_mlp((12, 8, 4), seed=3), tmp / "mlp.onnx")
    cal = np.random.default_rng(5).standard_normal((40, 1, 12)).astype(np.float32)
    d = onnx2fpga.compile(path, tmp / "d", calibration=cal)
    return path, cal, d


def test_html_parses_and_shows_every_layer(cnn):
    m = json.loads((cnn / "manifest.json").read_text())
    doc = _parse(cnn / "report.html")
    assert doc.find("script") == [] and "http" not in (cnn / "report.html").read_text() \
        .replace('xmlns="http://www.w3.org/2000/svg"', "")
    nodes = {e["attrs"]["data-id"]: e for e in doc.find("g", "node")}
    for ly in m["layers"]:
        assert ly["name"] in nodes, ly["name"]
        assert f"{ly['cycles']} cycles" in nodes[ly["name"]]["text"]
    # Host head and tail boxes, the ports, and the skip FIFO with its depth.
    assert "x__quant" in nodes["host_head"]["text"] and "host" in \
        nodes["host_head"]["attrs"]["class"]
    assert "logits__dequant" in nodes["host_tail"]["text"]
    assert {"s_axis", "m_axis"} <= set(nodes)
    (edge, depth), = m["edge_fifos"].items()
    skips = doc.find("path", "skip")
    labels = [e["text"] for e in doc.find("text", "elabel")]
    assert len(skips) == 1 and f"FIFO {depth}" in " ".join(labels)
    assert any(t.startswith("r1__q · channels-last · 1 lane") for t in labels)
    assert any(t.startswith("m1__q · channels-last · 1 lane") for t in labels)


def test_bottleneck_marked_on_the_slowest_layer(cnn):
    m = json.loads((cnn / "manifest.json").read_text())
    slowest = max(m["layers"], key=lambda ly: ly["cycles"])["name"]
    doc = _parse(cnn / "report.html")
    assert [e["attrs"]["data-layer"] for e in doc.find("rect", "bottleneck")] == [slowest]
    assert [e["attrs"]["data-id"] for e in doc.find("g", "bottleneck")] == [slowest]
    rows = doc.find("tr", "bottleneck")
    assert len(rows) == 1 and rows[0]["text"].startswith(slowest)
    md = _table(_md_tables((cnn / "report.md").read_text()), "layer")
    assert [r["layer"] for r in md if r["bottleneck"] == "◀ bottleneck"] == [slowest]


def test_bar_widths_proportional_to_cycles(cnn):
    m = json.loads((cnn / "manifest.json").read_text())
    bars = _parse(cnn / "report.html").find("rect", "bar")
    assert [b["attrs"]["data-layer"] for b in bars] == [ly["name"] for ly in m["layers"]]
    widths = np.array([float(b["attrs"]["width"]) for b in bars])
    cycles = np.array([ly["cycles"] for ly in m["layers"]], dtype=float)
    assert cycles.min() == 0 and cycles.max() > 0          # a view: no bar at all
    np.testing.assert_allclose(widths, cycles * widths.max() / cycles.max(), atol=1e-3)
    assert widths.max() >= 100


def test_report_is_byte_identical(cnn, tmp_path):
    first = {n: (cnn / n).read_bytes() for n in ("report.html", "report.md")}
    write_report(cnn)
    assert {n: (cnn / n).read_bytes() for n in first} == first
    again = tmp_path / "again"
    onnx2fpga.compile(os.path.join(EXAMPLE, "model.onnx"), again,
                      calibration=os.path.join(EXAMPLE, "calibration.npy"))
    assert {n: (again / n).read_bytes() for n in first} == first


def test_markdown_holds_the_manifest_numbers(cnn):
    m = json.loads((cnn / "manifest.json").read_text())
    tables = _md_tables((cnn / "report.md").read_text())
    summary = {r["figure"]: r["value"] for r in _table(tables, "figure")}
    assert summary["cycles per inference"] == str(m["cycles_per_inference"])
    assert summary["latency (cycles)"] == str(m["latency_cycles"])
    layers = _table(tables, "layer")
    assert [(r["layer"], r["kind"], r["cycles"], r["latency"], r["FIFO after"])
            for r in layers] == [(ly["name"], ly["kind"], str(ly["cycles"]),
                                  str(ly["latency_cycles"]), str(ly["fifo_depth_after"]))
                                 for ly in m["layers"]]
    ports = {r["port"]: r for r in _table(tables, "port")}
    for name in ("s_axis", "m_axis"):
        p = m["ports"][name]
        assert float(ports[name]["scale"]) == pytest.approx(p["scale"], rel=1e-5)
        assert (ports[name]["zero point"], ports[name]["lanes"], ports[name]["type"]) == \
            (str(p["zero_point"]), str(p["lanes"]), p["type"])
    quant = next(t for t in tables if t[0][1] == "float tensor")
    errs = {row[0]: float(row[4]) for row in quant[1:]}
    assert errs == {q["name"]: pytest.approx(q["max_abs_error"], rel=1e-3)
                    for q in m["quantization"]["layers"]}
    streams = {r["tensor"]: r for r in _table(tables, "tensor")}
    assert streams["m1__q"]["order"] == "channels-last" and streams["m1__q"]["lanes"] == "1"
    part = {r["part"]: r["operators"] for r in _table(tables, "part")}
    assert part["host head"] == "x__quant" and part["host tail"] == "logits__dequant"


def _fake_build(board, family, *, fmax, clock, lut_used, paths):
    return {"board": board, "device": "DEV-" + board, "family": family, "clock_mhz": clock,
            "fmax_mhz": fmax, "timing_met": fmax >= clock, "timing_complete": True,
            "timing_warnings": [], "critical_paths": paths, "seed": 7,
            "resources": {"lut": {"used": lut_used, "available": 5280},
                          "ff": {"used": 500, "available": 5280},
                          "dsp": {"used": 0, "available": 8},
                          "bram": {"used": 4, "available": 30}}}


def test_builds_and_resource_estimates(cnn, tmp_path):
    d = tmp_path / "d"
    shutil.copytree(cnn, d)
    m = json.loads((d / "manifest.json").read_text())
    for k, ly in enumerate(m["layers"]):     # another engineer's estimates, made up here
        ly["resources"] = {"ice40": {"lut": 100 * (k + 1), "ff": 10, "dsp": 0, "bram": 1}}
    (d / "manifest.json").write_text(json.dumps(m))
    paths = [{"from": "<async>", "to": "posedge clk", "delay_ns": 30.0, "start": "io_a",
              "end": "io_b"},
             {"from": "posedge clk", "to": "posedge clk", "delay_ns": 21.5, "start": "reg_a",
              "end": "reg_b"},
             {"from": "posedge clk", "to": "posedge clk", "delay_ns": 9.0, "start": "reg_c",
              "end": "reg_d"}]
    for board, fmax in (("icebreaker", 46.5), ("slowboard", 10.0)):
        (d / "build" / board).mkdir(parents=True)
        (d / "build" / board / "report.json").write_text(json.dumps(
            _fake_build(board, "ice40", fmax=fmax, clock=12.0, lut_used=4000, paths=paths)))
    write_report(d)
    est_lut = sum(100 * (k + 1) for k in range(len(m["layers"])))
    want_err = f"{100 * (est_lut - 4000) / 4000:+.1f} %"
    est_ff = 10 * len(m["layers"])
    tables = _md_tables((d / "report.md").read_text())
    per_layer = next(t for t in tables if t[0][:2] == ["layer", "ice40 LUT"])
    assert [row[1] for row in per_layer[1:]] == [str(100 * (k + 1)) for k in
                                                 range(len(m["layers"]))] + [str(est_lut)]
    builds = [t for t in tables if t[0][0] == "resource"]
    assert len(builds) == 2
    for t in builds:
        rows = {r[0]: r for r in t[1:]}
        assert rows["LUT"][1:] == [str(est_lut), "4000", "5280", "75.8 %", want_err]
        assert rows["FF"][5] == f"{100 * (est_ff - 500) / 500:+.1f} %"
    facts = [{r[0]: r[1] for r in t[1:]} for t in tables if t[0] == ["figure", "value"]][1:]
    assert [f["timing"] for f in facts] == ["met", "NOT MET"]
    assert [f["Fmax"] for f in facts] == ["46.50 MHz", "10.00 MHz"]
    assert facts[0]["critical path"] == "reg_a → reg_b (21.50 ns)"
    doc = _parse(d / "report.html")
    assert [e["text"] for e in doc.find("td", "ok")] == ["met"]
    assert [e["text"] for e in doc.find("td", "bad")] == ["NOT MET"]
    text = (d / "report.html").read_text()
    assert want_err in text and "reg_a → reg_b (21.50 ns)" in text
    summary = {r["figure"]: r["value"] for r in _table(tables, "figure")}
    rate = 12e6 / m["cycles_per_inference"]
    assert summary["icebreaker at 12 MHz"].startswith(f"{rate:.1f} inferences/s")


def test_without_estimates_or_builds(cnn, tmp_path):
    """A manifest from before the resource model (no estimates) and no builds."""
    d = tmp_path / "old"
    shutil.copytree(cnn, d)
    m = json.loads((d / "manifest.json").read_text())
    m.pop("resources", None)
    for ly in m["layers"]:
        ly.pop("resources", None)
    (d / "manifest.json").write_text(json.dumps(m))
    write_report(d)
    text = (d / "report.md").read_text()
    assert "No per-layer resource estimates in the manifest." in text
    assert "No builds yet." in text
    assert not any(t[0][0] == "resource" for t in _md_tables(text))
    fresh = (cnn / "report.md").read_text()
    assert "No per-layer resource estimates in the manifest." not in fresh


def test_quantization_error_per_layer_against_onnxruntime(mlp):
    path, cal, d = mlp
    q = d.manifest["quantization"]["layers"]
    assert [e["name"] for e in q] == [ly.name for ly in d.design.dataflow.layers]
    assert [e["tensor"] for e in q] == ["r0", "h1"]
    # onnxruntime's float tensors at the same points.
    model = onnx.load(path)
    del model.graph.output[:]
    model.graph.output.extend([onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT,
                                                                  None) for t in ("r0", "h1")])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = [np.concatenate(v) for v in zip(*(sess.run(None, {"x": s}) for s in cal))]
    # The golden model's integers, dequantized here with the scales and zero points of the
    # ports and layers that carry them: the first layer's output feeds the second layer
    # (its zero point), the second's is the output port.
    trace = {}
    golden.run_dataflow(d.design.dataflow, run_head(d.design, stack_inputs(d.design, cal)[0]),
                        trace)
    first, second = d.design.dataflow.layers
    port = d.design.dataflow.output
    assert (q[0]["zero_point"], q[1]["zero_point"], q[1]["scale"]) == \
        (second.in_zero_point, port.zero_point, pytest.approx(port.scale, rel=1e-7))
    for entry, r in zip(q, ref):
        y = (trace[entry["name"]].astype(np.float64) - entry["zero_point"]) * entry["scale"]
        err = np.abs(y - r.astype(np.float64))
        assert entry["max_abs_error"] == pytest.approx(err.max(), rel=1e-5, abs=1e-6)
        assert entry["mean_abs_error"] == pytest.approx(err.mean(), rel=1e-5, abs=1e-6)
        assert 0 < entry["max_abs_error"] < 4 * entry["scale"]    # a few LSB, not garbage
    # The first layer's scale: its integers times the scale are within an LSB of the float
    # tensor on average only with the right scale (a wrong one is off by a factor).
    y0 = (trace[q[0]["name"]].astype(np.float64) - q[0]["zero_point"]) * q[0]["scale"]
    assert np.abs(y0 - ref[0]).mean() < q[0]["scale"] / 2


def test_no_layer_errors_for_models_quantized_elsewhere(tmp_path):
    path, cal = ort_qdq_mlp(tmp_path, sizes=(8, 6, 4))
    d = onnx2fpga.compile(path, tmp_path / "d")
    assert "layers" not in d.manifest["quantization"]
    text = (tmp_path / "d" / "report.md").read_text()
    assert "Quantization error" not in text and "dense" in text


def test_layout_rows_are_topological_depths():
    nodes = [(n, "layer", [n]) for n in ("a", "b", "c", "d", "e")]
    edges = [("a", "b", "", None), ("b", "c", "", None), ("a", "d", "", None),
             ("c", "e", "", None), ("d", "e", "", None)]
    pos = graph_layout(nodes, edges)
    assert {k: v[0] for k, v in pos.items()} == {"a": 0, "b": 1, "d": 1, "c": 2, "e": 3}
    assert pos["b"][2] == pos["d"][2] == 2 and {pos["b"][1], pos["d"][1]} == {0, 1}


def test_build_refreshes_the_report(mlp, tmp_path, monkeypatch):
    import onnx2fpga.boards.build as build

    _, _, design = mlp
    d = onnx2fpga.load(shutil.copytree(design.directory, tmp_path / "d"))
    assert "No builds yet." in (tmp_path / "d" / "report.md").read_text()

    def fake(factory, i, o, board, build_dir, **kw):
        os.makedirs(build_dir, exist_ok=True)   # the lock made it
        r = _fake_build(board, "ice40", fmax=33.3, clock=12.0, lut_used=999, paths=[])
        with open(os.path.join(build_dir, "report.json"), "w") as f:
            json.dump(r, f)
        return r
    monkeypatch.setattr(build, "build_bitstream", fake)
    d.build("icebreaker")
    text = (tmp_path / "d" / "report.md").read_text()
    assert "### Build for icebreaker" in text and "| Fmax | 33.30 MHz |" in text


def test_cli_report(cnn, tmp_path, capsys):
    d = tmp_path / "d"
    shutil.copytree(cnn, d)
    (d / "report.html").unlink()
    (d / "report.md").unlink()
    assert main(["report", str(d)]) == 0
    out, _ = capsys.readouterr()
    assert out == f"wrote {d / 'report.html'} and {d / 'report.md'}\n"
    assert (d / "report.html").read_bytes() == (cnn / "report.html").read_bytes()
    assert main(["report", str(tmp_path / "nothing")]) == 2
    _, err = capsys.readouterr()
    assert err == (f"error: {tmp_path / 'nothing'}: not a design directory (missing "
                   f"manifest.json); create one with 'onnx2fpga compile'\n")


def test_write_report_checks_its_argument(tmp_path):
    with pytest.raises(TypeError, match=r"^directory must be a path, not 3$"):
        write_report(3)
    with pytest.raises(DesignDirError, match=rf"^{re.escape(str(tmp_path))}: not a design "
                       r"directory \(missing manifest\.json\); create one with "
                       r"'onnx2fpga compile'$"):
        write_report(tmp_path)


def test_summary_names_lut_products_and_soft_memories(cnn):
    # What board folding moved off the hard blocks is in the summary.
    from onnx2fpga.report import _summary_rows
    m = json.loads((cnn / "manifest.json").read_text())
    m["folding"].update({"board": "icebreaker", "limited_by": "logic cells 10 > 9",
                         "max_lanes": None,
                         "lut_multipliers": ["conv0"],
                         "logic_memories": ["matvec_1/w_mem", "wrapper/rx_fifo"]})
    rows = dict(_summary_rows(m, {}))
    assert rows["products in LUTs (no hard multipliers)"] == "conv0"
    assert rows["memories in soft logic (block RAM ran out)"] == \
        "matvec_1/w_mem, wrapper/rx_fifo"
    assert rows["folding"] == "fits icebreaker; limited by logic cells 10 > 9"
    m["folding"]["optimize"] = "latency"
    assert dict(_summary_rows(m, {}))["folding"] == \
        "fits icebreaker, the latency shortened at that rate; limited by logic cells 10 > 9"


# A name as hostile as a model file can make it: a table separator, an escaped one, a code
# span, a link, line breaks and a script.
_EVIL = "|a`b\\|c[x](http://e.example)\nd\re\u2028<script>alert(1)</script>"


def _gfm_cells(line: str) -> int:
    """Cells of a markdown table row as GitHub's table extension splits it: on every pipe
    that no backslash escapes (a backslash escapes whatever character follows it)."""
    cells, k = 1, 0
    while k < len(line):
        if line[k] == "\\":
            k += 2
            continue
        cells += line[k] == "|"
        k += 1
    return cells - 2                       # the leading and trailing pipes


def test_hostile_names_neither_break_markdown_tables_nor_inject_html(tmp_path, capsys):
    m = float_mlp((12, 8, 4), seed=3)
    names = {}

    def rename(t):
        return names.setdefault(t, f"{t}{_EVIL}") if t else t
    g = m.graph
    g.name = "mlp" + _EVIL
    for n in g.node:
        n.name = rename(n.name)
        n.input[:] = [rename(t) for t in n.input]
        n.output[:] = [rename(t) for t in n.output]
    for vi in list(g.input) + list(g.output):
        vi.name = rename(vi.name)
    for t in g.initializer:
        t.name = rename(t.name)
    onnx.checker.check_model(m, full_check=True)
    cal = np.random.default_rng(5).standard_normal((16, 1, 12)).astype(np.float32)
    onnx2fpga.compile(save(m, tmp_path / "evil.onnx"), tmp_path / "d", calibration=cal)
    assert main(["report", str(tmp_path / "d")]) == 0
    md = (tmp_path / "d" / "report.md").read_text(encoding="utf-8")
    lines = md.split("\n")
    # Every line holding a name is a whole table row (or the title): no line break leaked.
    for line in lines:
        if "alert(1)" in line:
            assert line.startswith("# onnx2fpga report: mlp") or (
                line.startswith("| ") and line.endswith(" |")), line
    # Every row of a table has as many cells as its header.
    k = 0
    while k < len(lines):
        if not lines[k].startswith("|"):
            k += 1
            continue
        width = _gfm_cells(lines[k])
        while k < len(lines) and lines[k].startswith("|"):
            assert _gfm_cells(lines[k]) == width, lines[k]
            k += 1
    for text in (md, (tmp_path / "d" / "report.html").read_text(encoding="utf-8")):
        assert "<script" not in text.lower()
    for found in re.finditer(r"(\\*)\]\(", md):    # no markdown link: every "](" escaped
        assert len(found.group(1)) % 2 == 1, md[found.start() - 20:found.end()]
    assert md.count("\\|a\\`b\\\\\\|c") >= 5         # the names are there, escaped
    doc = _parse(tmp_path / "d" / "report.html")
    assert any("<script>alert(1)</script>" in e["text"] for e in doc.find("td")), \
        "the names are shown, as text"


# The frame layout as boards/protocol.py documents it: sync (2) | type (1) | seq (1) |
# length (2) | payload | crc (2); an 8N1 UART sends 10 bits a byte; USB full speed carries
# at most 19 bulk packets of 64 bytes a millisecond (USB 2.0, table 5-10).
_FRAME = 2 + 1 + 1 + 2 + 2


def _link_build(m, *, link, baud=None, host_link="framed", clock=12.0):
    r = _fake_build("b", "ice40", fmax=40.0, clock=clock, lut_used=100, paths=[])
    ports = {side: {"tdata_width": m["ports"][name]["tdata_width"],
                    "beats": m["ports"][name]["beats"]}
             for side, name in (("in", "s_axis"), ("out", "m_axis"))}
    r.update(link=link, host_link=host_link, ports=ports,
             uart={"link": link, "baud": baud})
    return r


def test_link_limited_rate_beside_the_accelerator(mlp, tmp_path):
    _, _, design = mlp
    d = tmp_path / "d"
    shutil.copytree(design.directory, d)
    m = json.loads((d / "manifest.json").read_text())
    n_in = m["ports"]["s_axis"]["tdata_width"] // 8 * m["ports"]["s_axis"]["beats"]
    n_out = m["ports"]["m_axis"]["tdata_width"] // 8 * m["ports"]["m_axis"]["beats"]
    cycles, latency = m["cycles_per_inference"], m["latency_cycles"]
    builds = {"uart": _link_build(m, link="uart", baud=115200),
              "raw": _link_build(m, link="uart", baud=9600, host_link="raw"),
              "usb": _link_build(m, link="usb", clock=0.01),
              "old": _fake_build("old", "ice40", fmax=40.0, clock=12.0, lut_used=1, paths=[])}
    for board, r in builds.items():
        (d / "build" / board).mkdir(parents=True)
        (d / "build" / board / "report.json").write_text(json.dumps(r))
    write_report(d)
    summary = {r["figure"]: r["value"] for r in
               _table(_md_tables((d / "report.md").read_text()), "figure")}
    b_in, b_out = n_in + _FRAME, n_out + _FRAME
    uart = 115200 / (10 * (b_in + b_out))
    raw = 9600 / (10 * (n_in + n_out))
    usb = 19_000 / (math.ceil(b_in / 64) + math.ceil(b_out / 64))
    assert summary["uart host link"].endswith(
        f": {b_in} bytes in, {b_out} out per inference ({n_in} + {_FRAME} and {n_out} + "
        f"{_FRAME}: payload + frame header and CRC)")
    assert summary["uart host link"].startswith("UART at 115200 baud, 8N1 (10 bits a byte)")
    assert summary["raw host link"].endswith(f": {n_in} bytes in, {n_out} out per inference "
                                             f"(raw bytes)")
    assert summary["usb host link"].startswith("USB full speed")
    for board, rate, clock in (("uart", uart, 12.0), ("raw", raw, 12.0), ("usb", usb, 0.01)):
        accelerator = clock * 1e6 / cycles
        turn = 1 / (1 / rate + latency / (clock * 1e6))
        which = (f"the host link ({accelerator:.1f} inferences/s for the accelerator alone)"
                 if rate < accelerator else "the accelerator")
        assert summary[f"{board} link-limited rate"] == (
            f"{rate:.1f} inferences/s; the rate is limited by {which}; one request at a time "
            f"with the accelerator's latency: {turn:.1f} inferences/s"), board
    assert uart < 12e6 / cycles and usb > 0.01e6 / cycles      # both verdicts are checked
    assert "old link-limited rate" not in summary and "old at 12 MHz" in summary
    html = (d / "report.html").read_text()
    assert f"{uart:.1f} inferences/s; the rate is limited by the host link" in html


def _fake_rtl(calls):
    """simulate_rtl's stand-in: the golden model's outputs and made-up cycle figures."""
    from types import SimpleNamespace

    def fake(verilog, in_port, out_port, x, **kw):
        calls.append(kw)
        df = design_of[0].design.dataflow
        return SimpleNamespace(outputs=golden.run_dataflow(df, x), cycles_per_inference=41.5,
                               latency_cycles=97, total_cycles=12345, stalled_cycles=999,
                               sim_seconds=0.25, shards=1)
    design_of = []
    return fake, design_of


def test_measured_figures_are_saved_and_shown(mlp, tmp_path, monkeypatch):
    import onnx2fpga.sim.rtl as rtl
    from onnx2fpga.designdir import check_target

    _, cal, design = mlp
    d = onnx2fpga.load(shutil.copytree(design.directory, tmp_path / "d"))
    calls = []
    fake, design_of = _fake_rtl(calls)
    design_of.append(d)
    monkeypatch.setattr(rtl, "simulate_rtl", fake)
    d.simulate(cal[:5], engine="rtl", stall_in=0.25, stall_out=0.5, seed=3)
    meas = json.loads((tmp_path / "d" / "measured.json").read_text())
    assert {k: meas[k] for k in d.last_run if k != "inferences"} == \
        {k: v for k, v in d.last_run.items() if k != "inferences"}
    assert (meas["inputs"], meas["stalled_cycles"], meas["stall_in"], meas["stall_out"],
            meas["seed"]) == (5, 999, 0.25, 0.5, 3)
    assert meas["verilog_sha256"] == d.manifest["top"]["verilog_sha256"]
    assert re.fullmatch(r"Verilator \d+\.\d{3}", meas["simulator"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meas["date"])
    tables = _md_tables((tmp_path / "d" / "report.md").read_text())   # refreshed by simulate
    vs = next(t for t in tables if t[0] == ["figure", "estimated", "measured"])
    assert vs[1:] == [["cycles per inference (interval)", str(d.manifest["cycles_per_inference"]),
                       "41.5"],
                      ["latency (cycles)", str(d.manifest["latency_cycles"]), "97"]]
    tools = {(r["tool"], r["used for"]): r["version"] for r in _table(tables, "tool")}
    assert tools[("onnx2fpga", "compile")] == onnx2fpga.__version__
    assert tools[("amaranth", "compile (the Verilog)")] == importlib.metadata.version("amaranth")
    assert tools[("Verilator", "RTL simulation (measured.json)")] == meas["simulator"][10:]
    # the manifest's hashes still hold, and --force may replace the folder
    onnx2fpga.load(tmp_path / "d")
    assert check_target(tmp_path / "d", True) == str(tmp_path / "d")
    # figures of another top.v are not shown
    meas["verilog_sha256"] = "0" * 64
    (tmp_path / "d" / "measured.json").write_text(json.dumps(meas))
    write_report(tmp_path / "d")
    assert "Measured in RTL simulation" not in (tmp_path / "d" / "report.md").read_text()


@pytest.mark.rtl
def test_measured_figures_of_a_real_rtl_run(mlp, tmp_path):
    _, cal, design = mlp
    d = onnx2fpga.load(shutil.copytree(design.directory, tmp_path / "d"))
    y = d.simulate(cal[:20], engine="rtl", seed=1)
    np.testing.assert_array_equal(y, d.simulate(cal[:20], engine="golden"))
    meas = json.loads((tmp_path / "d" / "measured.json").read_text())
    assert meas["inputs"] == 20 and meas["stalled_cycles"] > 0
    for k in ("cycles_per_inference", "latency_cycles", "total_cycles"):
        assert meas[k] == d.last_run[k], k
    assert "## Measured in RTL simulation" in (tmp_path / "d" / "report.md").read_text()
