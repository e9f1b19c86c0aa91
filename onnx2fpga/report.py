"""A build report to look at: ``report.html`` (inline SVG and CSS) and its ``report.md`` twin.

>>> onnx2fpga.report.write_report("out/")   # doctest: +SKIP
'out/report.html'

Both files are made from what a design directory holds: ``manifest.json`` (layers, folding,
cycle figures, streams, ports, partition, quantization) and every ``build/<board>/report.json``
(Fmax, resources, critical paths). They contain no time stamps and no absolute paths, so the
same directory always gives the same bytes. The HTML has no scripts and loads nothing.

Contents: a summary (cycles per inference, latency, bottleneck, throughput at each build's
clock), the dataflow graph (layers as boxes placed in rows by topological depth, tensors as
arrows labelled with their stream order and lanes, skip FIFOs with their depths, the host
head and tail as host boxes), per-layer cycles as a bar chart (bar widths proportional to the
cycles), per-layer resource estimates (``layers[k]["resources"]`` when the manifest has them),
estimated against measured resources per build, the per-layer quantization error (float
models compiled with calibration data), the ports and the host/hardware partition. Beside each
build's rate, the rate its host link carries (:func:`onnx2fpga.boards.protocol.link_rate`)
and which of the two limits; the cycles and latency measured by the last RTL simulation
(``measured.json``, :mod:`onnx2fpga.measured`) beside the estimates; the tools' versions.
"""

from __future__ import annotations

import html
import json
import os
import re

from .designdir import atomic_write
from .errors import DesignDirError
from .measured import MEASURED, read_measured

__all__ = ["write_report", "render_html", "render_markdown", "graph_layout", "folding_text"]

_RESOURCES = ("lut", "ff", "dsp", "bram")
_FAMILIES = ("ice40", "ecp5")

# Graph geometry (pixels).
_BOX_W, _BOX_H, _GAP_X, _ROW_H, _MARGIN = 250, 74, 40, 130, 20
# Bar chart geometry.
_BAR_X, _BAR_W, _BAR_H, _BAR_GAP = 170, 480, 18, 6


# ---------------------------------------------------------------------------------------------
# Reading the design directory


def _read_inputs(directory: str) -> tuple[dict, dict]:
    path = os.path.join(directory, "manifest.json")
    if not os.path.isfile(path):
        raise DesignDirError(f"{directory}: not a design directory (missing manifest.json); "
                             f"create one with 'onnx2fpga compile'")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise DesignDirError(f"{path}: cannot read the manifest ({e})") from None
    builds = {}
    build_dir = os.path.join(directory, "build")
    if os.path.isdir(build_dir):
        for board in sorted(os.listdir(build_dir)):
            rpath = os.path.join(build_dir, board, "report.json")
            if not os.path.isfile(rpath):
                continue
            try:
                with open(rpath) as f:
                    builds[board] = json.load(f)
            except (OSError, ValueError) as e:
                raise DesignDirError(f"{rpath}: cannot read the build report ({e})") from None
    return manifest, builds


def write_report(directory) -> str:
    """Write ``report.html`` and ``report.md`` into a design directory.

    Parameters
    ----------
    directory : str or os.PathLike
        A design directory written by :func:`onnx2fpga.compile` (``manifest.json``, and any
        ``build/<board>/report.json``).

    Returns
    -------
    str
        The path of ``report.html``.

    Raises
    ------
    TypeError
        If ``directory`` is not a path.
    DesignDirError
        If the directory holds no readable manifest, or a build report is damaged.
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory must be a path, not {directory!r}")
    directory = os.fspath(directory)
    manifest, builds = _read_inputs(directory)
    measured = read_measured(directory, manifest)
    out = os.path.join(directory, "report.html")
    try:
        html_text = render_html(manifest, builds, measured)
        md_text = render_markdown(manifest, builds, measured)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        # manifest.json and the build reports are JSON anybody may have edited
        raise DesignDirError(f"{directory}: manifest.json or a build report lacks what the "
                             f"report shows ({type(e).__name__}: {e}); compile the model "
                             f"again") from None
    try:
        atomic_write(out, html_text)                   # concurrent builds each rewrite them
        atomic_write(os.path.join(directory, "report.md"), md_text)
    except OSError as e:
        raise DesignDirError(f"{directory}: cannot write the report ({e.strerror}: "
                             f"{e.filename})") from None
    return out


# ---------------------------------------------------------------------------------------------
# Figures shared by both renderings


def _fmt(x, digits: int = 4) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_fmt(v, digits) for v in x) + "]"
    return str(x)


def _shape(s) -> str:
    return "×".join(str(d) for d in s) if s else "scalar"


def _in_shapes(ly: dict) -> str:
    if "in_shapes" not in ly:           # manifests of chains, before layers had shapes
        return str(ly.get("in_size", "?"))
    return " + ".join(_shape(s) for s in ly["in_shapes"])


def _out_shape(ly: dict) -> str:
    return _shape(ly["out_shape"]) if "out_shape" in ly else str(ly.get("out_size", "?"))


def _wiring(m: dict) -> list[tuple[list, str]]:
    """``(inputs, output)`` of every layer; manifests from before layers named their tensors
    describe a chain."""
    prev, out = m["ports"]["s_axis"]["tensor"], []
    for k, ly in enumerate(m["layers"]):
        last = k == len(m["layers"]) - 1
        output = ly.get("output") or (m["ports"]["m_axis"]["tensor"] if last else ly["name"])
        out.append((ly.get("inputs") or [prev], output))
        prev = output
    return out


def folding_text(ly: dict) -> str:
    """A manifest layer entry's parallelism in a few words (``simd=4 pe=2``, ``lanes=2``,
    ``wires``; on the layer engine its products a value)."""
    kind = ly["kind"]
    if "engine" in ly:          # a layer of the layer engine (a view moves nothing there)
        return f"engine, {ly['engine']['products_per_value']} products a value" \
            if ly["engine"] else "none"
    if kind == "view":
        return "wires"
    if kind == "dense":
        return f"simd={ly['simd']} pe={ly['pe']}"
    if kind == "conv" and not ly.get("depthwise"):
        return f"simd={ly['simd']} pe={ly['pe']} lanes={ly['lanes']}"
    return f"lanes={ly.get('in_lanes', 1)}"


def _critical_path(report: dict):
    """The slowest register-to-register path (paths from or to ``<async>`` ports are I/O);
    the same rule as :func:`onnx2fpga.boards.pnr.critical_path`, without its imports."""
    paths = [p for p in report.get("critical_paths") or []
             if "<async>" not in (p.get("from"), p.get("to")) and p.get("start")]
    return max(paths, key=lambda p: p["delay_ns"]) if paths else None


def _layer_table(m: dict) -> tuple[list, list]:
    head = ["layer", "kind", "in shape", "out shape", "types", "folding", "cycles",
            "latency", "FIFO after", "bottleneck"]
    rows = []
    for ly in m["layers"]:
        cycles = ly["cycles"]
        if ly.get("reorder_cycles"):
            cycles = f"{cycles} (+ reorder {ly['reorder_cycles']})"
        rows.append([ly["name"], ly["kind"], _in_shapes(ly), _out_shape(ly),
                     f"{ly['in_type']} → {ly['out_type']}",
                     folding_text(ly), cycles, ly.get("latency_cycles"), ly.get("fifo_depth_after"),
                     "◀ bottleneck" if ly.get("bottleneck", False) else ""])
    return head, rows


def _link(m: dict, r: dict):
    """The host link of build report ``r``: ``(LinkRate, input payload bytes, output payload
    bytes)``, or ``None`` for a report that does not say which link it built."""
    link = r.get("link") or (r.get("uart") or {}).get("link")
    baud = (r.get("uart") or {}).get("baud")
    if link not in ("uart", "usb") or (link == "uart" and not baud):
        return None
    from .boards.protocol import link_rate     # imports Amaranth: only when a build has one

    ports = r.get("ports") or {}
    p_in, p_out = ((ports.get(side) or m["ports"][name]) for side, name in
                   (("in", "s_axis"), ("out", "m_axis")))
    n_in, n_out = (p["tdata_width"] // 8 * p["beats"] for p in (p_in, p_out))
    return (link_rate(n_in, n_out, link=link, baud=baud,
                      framed=r.get("host_link", "framed") == "framed"), n_in, n_out)


def _link_rows(m: dict, board: str, r: dict, rate: float, clock: float) -> list:
    found = _link(m, r)
    if found is None:
        return []
    lr, n_in, n_out = found
    framing = (f" ({n_in} + {lr.bytes_in - n_in} and {n_out} + {lr.bytes_out - n_out}: "
               f"payload + frame header and CRC)" if lr.bytes_in != n_in else " (raw bytes)")
    limit = lr.inferences_per_second
    which = (f"the host link ({_rate(rate)} inferences/s for the accelerator alone)"
             if limit < rate else "the accelerator")
    turn = 1 / (lr.seconds + m["latency_cycles"] / (clock * 1e6))
    return [[f"{board} host link", f"{lr.assumption}: {lr.bytes_in} bytes in, "
                                   f"{lr.bytes_out} out per inference{framing}"],
            [f"{board} link-limited rate",
             f"{_rate(limit)} inferences/s; the rate is limited by {which}; one request at a "
             f"time with the accelerator's latency: {_rate(turn)} inferences/s"]]


def _rate(x: float) -> str:
    return f"{x:.1f}"


def _measured_rows(m: dict, meas: dict) -> tuple[list, list]:
    """Estimated against measured cycles, and how they were measured."""
    rows = [["cycles per inference (interval)", m["cycles_per_inference"],
             meas.get("cycles_per_inference")],
            ["latency (cycles)", m["latency_cycles"], meas.get("latency_cycles")]]
    facts = [["simulator", meas.get("simulator")], ["date", meas.get("date")],
             ["inputs", meas.get("inputs")],
             ["random stalls", f"input {_fmt(meas.get('stall_in'))}, output "
                               f"{_fmt(meas.get('stall_out'))}, seed {meas.get('seed')}: "
                               f"{meas.get('stalled_cycles')} cycles for all inputs"],
             ["total cycles", meas.get("total_cycles")]]
    return rows, facts


def _tool_rows(m: dict, builds: dict, meas: dict | None) -> list:
    rows = [["onnx2fpga", m.get("onnx2fpga_version"), "compile"],
            ["amaranth", m.get("amaranth_version"), "compile (the Verilog)"]]
    if meas is not None:
        name, _, version = str(meas.get("simulator") or "").partition(" ")
        rows.append([name or "simulator", version or None, f"RTL simulation ({MEASURED})"])
    for board, r in builds.items():
        for tool, e in (r.get("tools") or {}).items():
            e = e if isinstance(e, dict) else {"version": e}
            version = e.get("version")
            if e.get("package") and e.get("package") != version:
                version = f"{version or '?'} ({e['package']})"
            rows.append([tool, version, f"build for {board}"])
    return rows


def _summary_rows(m: dict, builds: dict, measured: dict | None = None) -> list:
    rows = [["hardware layers", len(m["layers"])],
            ["cycles per inference", m["cycles_per_inference"]],
            ["latency (cycles)", m["latency_cycles"]],
            ["bottleneck", ", ".join(m.get("bottleneck", [])) or "—"]]
    f = m.get("folding") or {}
    if f.get("limited_by"):
        goal = [f"fits {f['board']}"] if f.get("board") else []
        if f.get("target_fps"):
            goal.append(f"{_fmt(f['target_fps'])} inferences/s at {_fmt(f['clock_mhz'])} MHz")
        if f.get("max_lanes"):
            goal.append(f"at most {f['max_lanes']} multiply lanes")
        if f.get("optimize") == "latency":
            goal.append("the latency shortened at that rate")
        rows.append(["folding", f"{', '.join(goal) or 'automatic'}; limited by "
                                f"{f['limited_by']}"])
    if f.get("lut_multipliers"):
        rows.append(["products in LUTs (no hard multipliers)",
                     ", ".join(f["lut_multipliers"])])
    if f.get("logic_memories"):
        rows.append(["memories in soft logic (block RAM ran out)",
                     ", ".join(f["logic_memories"])])
    if f.get("block_memories"):
        rows.append(["weight ROMs in block RAM (LUTs ran short)",
                     ", ".join(f["block_memories"])])
    q = m.get("quantization", {})
    if "calibration_max_abs_error" in q:
        rows.append(["output error vs float (calibration data)",
                     f"max {_fmt(q['calibration_max_abs_error'])}, mean "
                     f"{_fmt(q['calibration_mean_abs_error'])}"])
    for board, r in builds.items():
        clock = r.get("clock_mhz")
        if clock and m["cycles_per_inference"]:
            rate = clock * 1e6 / m["cycles_per_inference"]
            lat = m["latency_cycles"] / clock
            fmax = r.get("fmax_mhz")
            limit = (f"; at Fmax {fmax:.1f} MHz: {fmax * 1e6 / m['cycles_per_inference']:.1f}"
                     f" inferences/s" if fmax else "")
            rows.append([f"{board} at {_fmt(clock)} MHz",
                         f"{rate:.1f} inferences/s, latency {lat:.1f} µs{limit}"])
            rows += _link_rows(m, board, r, rate, clock)
    if measured is not None:
        rows.append(["measured in RTL simulation",
                     f"{_fmt(measured.get('cycles_per_inference'))} cycles per inference, "
                     f"latency {_fmt(measured.get('latency_cycles'))} cycles "
                     f"({measured.get('simulator')}, {str(measured.get('date'))[:10]})"])
    return rows


def _resource_rows(m: dict) -> tuple[list, list, list]:
    """Per-layer estimates: header, rows, and the families present (empty if none)."""
    fams = [f for f in _FAMILIES if any(f in (ly.get("resources") or {}) for ly in m["layers"])]
    extra = sorted({f for ly in m["layers"] for f in (ly.get("resources") or {})} - set(fams))
    fams += extra
    if not fams:
        return [], [], []
    head = ["layer"] + [f"{f} {r.upper()}" for f in fams for r in _RESOURCES]
    rows = []
    totals = {(f, r): 0 for f in fams for r in _RESOURCES}
    for ly in m["layers"]:
        res = ly.get("resources") or {}
        row = [ly["name"]]
        for f in fams:
            for r in _RESOURCES:
                v = (res.get(f) or {}).get(r)
                row.append(v)
                if isinstance(v, (int, float)):
                    totals[(f, r)] += v
        rows.append(row)
    rows.append(["total"] + [totals[(f, r)] for f in fams for r in _RESOURCES])
    return head, rows, fams


def _estimate_totals(m: dict, family: str) -> dict | None:
    vals = [(ly.get("resources") or {}).get(family) for ly in m["layers"]]
    if not any(vals):
        return None
    return {r: sum(v.get(r, 0) or 0 for v in vals if v) for r in _RESOURCES}


def _build_rows(m: dict, r: dict) -> tuple[list, list]:
    """Estimated against measured resources of one build."""
    est = _estimate_totals(m, r.get("family", ""))
    head = ["resource", "estimated", "measured", "available", "used", "error"]
    rows = []
    for name, v in r.get("resources", {}).items():
        used, avail = v.get("used"), v.get("available")
        e = est.get(name) if est is not None and name in _RESOURCES else None
        err = (f"{100 * (e - used) / used:+.1f} %" if e is not None and used else
               ("—" if e is None else f"{e - used:+g}"))
        share = f"{100 * used / avail:.1f} %" if avail else "—"
        rows.append([name.upper(), e, used, avail, share, err])
    return head, rows


def _build_facts(r: dict) -> list:
    path = _critical_path(r)
    fmax = r.get("fmax_mhz")
    verdict = ("met" if r.get("timing_met") else
               "NOT MET" if r.get("timing_complete", True) else "NOT VERIFIED")
    rows = [["device", f"{r.get('device', '?')} ({r.get('family', '?')})"],
            ["clock", f"{_fmt(r.get('clock_mhz'))} MHz"],
            ["Fmax", "—" if fmax is None else f"{fmax:.2f} MHz"],
            ["timing", verdict],
            ["critical path", "—" if path is None else
             f"{path['start']} → {path['end']} ({path['delay_ns']:.2f} ns)"],
            ["seed", r.get("seed")]]
    for w in r.get("timing_warnings", []):
        rows.append(["warning", w])
    return rows


def _quant_rows(m: dict) -> tuple[list, list]:
    layers = m.get("quantization", {}).get("layers")
    if not layers:
        return [], []
    head = ["layer", "float tensor", "scale", "zero point", "max |error|", "mean |error|",
            "max |error| / scale"]
    rows = []
    for q in layers:
        scale = q["scale"]
        lsb = (q["max_abs_error"] / scale if isinstance(scale, float) and scale else None)
        rows.append([q["name"], q["tensor"], _fmt(scale), _fmt(q["zero_point"]),
                     _fmt(q["max_abs_error"]), _fmt(q["mean_abs_error"]),
                     "—" if lsb is None else f"{lsb:.2f} LSB"])
    return head, rows


def _port_rows(m: dict) -> tuple[list, list]:
    head = ["port", "tensor", "shape", "element order", "type", "scale", "zero point", "lanes",
            "tdata bits", "beats"]
    rows = []
    for name in ("s_axis", "m_axis"):
        p = m["ports"][name]
        rows.append([name, p["tensor"], _shape(p["shape"]), p["element_order"], p["type"],
                     _fmt(p["scale"], 6), p["zero_point"], p["lanes"], p["tdata_width"],
                     p["beats"]])
    return head, rows


def _part_rows(m: dict) -> tuple[list, list]:
    """The tensors of a multiplexed port (several inputs or hardware results), if any."""
    head = ["port", "tensor", "offset", "size", "shape", "type", "scale", "zero point"]
    rows = []
    for name in ("s_axis", "m_axis"):
        for q in m["ports"][name].get("parts") or []:
            scale = q["scale"] if not isinstance(q["scale"], list) else "per channel"
            rows.append([name, q["tensor"], q["offset"], q["size"], _shape(q["shape"]),
                         q["type"], _fmt(scale, 6), q["zero_point"]])
    return head, rows


def _stream_rows(m: dict) -> tuple[list, list, list]:
    """The tensors between cores (manifests before ``streams`` existed have none) and the
    skip-edge FIFOs."""
    streams = m.get("streams", {})
    place = {"s_axis": -1} | {ly["name"]: k for k, ly in enumerate(m["layers"])}
    rows = [[t, s["producer"], s["order"], s["lanes"], s["type"], s["size"]]
            for t, s in sorted(streams.items(),
                               key=lambda i: (place.get(i[1]["producer"], 1 << 30), i[0]))]
    fifos = [[k, v] for k, v in m.get("edge_fifos", {}).items()]
    return ["tensor", "producer", "order", "lanes", "type", "elements"], rows, fifos


def _partition_rows(m: dict) -> list:
    part = m.get("partition", {})
    return [["host head", ", ".join(part.get("host_head", [])) or "—"],
            ["hardware", f"{len(dict.fromkeys(part.get('hardware', [])))} ONNX nodes in "
                         f"{len(m['layers'])} layers"],
            ["host tail", ", ".join(part.get("host_tail", [])) or "—"]]


# ---------------------------------------------------------------------------------------------
# The graph: nodes, edges and a layered layout


def _graph(m: dict) -> tuple[list, list]:
    """Nodes ``(id, kind, lines)`` in topological order and edges ``(src, dst, label, fifo)``."""
    streams = m.get("streams", {})
    nodes, edges = [], []
    part = m.get("partition", {})
    s_axis, m_axis = m["ports"]["s_axis"], m["ports"]["m_axis"]
    if part.get("host_head"):
        nodes.append(("host_head", "host", ["host head"] + _wrap(part["host_head"])))
    nodes.append(("s_axis", "port", ["s_axis", f"{_shape(s_axis['shape'])} {s_axis['type']}",
                                     f"{s_axis['lanes']} lane(s)"]))
    if part.get("host_head"):
        edges.append(("host_head", "s_axis", "", None))
    writer = {s_axis["tensor"]: "s_axis"}
    wiring = _wiring(m)
    for ly, (_, output) in zip(m["layers"], wiring):
        writer[output] = ly["name"]
    for ly, (inputs, _) in zip(m["layers"], wiring):
        mark = "  ◀ bottleneck" if ly.get("bottleneck", False) else ""
        nodes.append((ly["name"], "bottleneck" if ly.get("bottleneck", False) else "layer",
                      [f"{ly['name']} · {ly['kind']}",
                       f"{_in_shapes(ly)} → {_out_shape(ly)}",
                       folding_text(ly), f"{ly['cycles']} cycles{mark}"]))
        for t in dict.fromkeys(inputs):
            edges.append((writer.get(t, "s_axis"), ly["name"], _tensor_label(t, streams),
                          m.get("edge_fifos", {}).get(f"{t}->{ly['name']}")))
    nodes.append(("m_axis", "port", ["m_axis", f"{_shape(m_axis['shape'])} {m_axis['type']}",
                                     f"{m_axis['lanes']} lane(s)"]))
    edges.append((writer.get(m_axis["tensor"], "s_axis"), "m_axis",
                  _tensor_label(m_axis["tensor"], streams),
                  m.get("edge_fifos", {}).get(f"{m_axis['tensor']}->port")))
    if part.get("host_tail"):
        nodes.append(("host_tail", "host", ["host tail"] + _wrap(part["host_tail"])))
        edges.append(("m_axis", "host_tail", "", None))
    return nodes, edges


def _wrap(names: list, width: int = 34, lines: int = 2) -> list:
    out, cur = [], ""
    for n in names:
        piece = n if not cur else f"{cur}, {n}"
        if len(piece) > width and cur:
            out.append(cur + ",")
            cur = n
        else:
            cur = piece
    out.append(cur)
    if len(out) > lines:
        out = out[:lines - 1] + [f"… {len(names)} ops"]
    return out


def _tensor_label(t: str, streams: dict) -> str:
    s = streams.get(t)
    if s is None:
        return t
    return f"{t} · {s['order']} · {s['lanes']} lane{'s' if s['lanes'] != 1 else ''}"


def graph_layout(nodes: list, edges: list) -> dict:
    """A layered layout: each node's row is its topological depth (longest path from a
    source); within a row, nodes are ordered by the mean position of their parents (ties:
    graph order) and centred. Returns ``{id: (row, column, columns in that row)}``."""
    depth = {}
    parents = {n[0]: [] for n in nodes}
    for src, dst, *_ in edges:
        parents[dst].append(src)
    for nid, *_ in nodes:                       # nodes come in topological order
        depth[nid] = max((depth[p] + 1 for p in parents[nid]), default=0)
    rows: dict[int, list] = {}
    for k, (nid, *_) in enumerate(nodes):
        rows.setdefault(depth[nid], []).append((k, nid))
    pos = {}
    for r in sorted(rows):
        members = rows[r]

        def key(item, r=r):
            k, nid = item
            xs = [pos[p][1] - (pos[p][2] - 1) / 2 for p in parents[nid] if p in pos]
            return (sum(xs) / len(xs) if xs else 0.0, k)
        members = sorted(members, key=key)
        for col, (_, nid) in enumerate(members):
            pos[nid] = (r, col, len(members))
    return pos


def _svg_graph(m: dict) -> str:
    nodes, edges = _graph(m)
    pos = graph_layout(nodes, edges)
    widest = max(p[2] for p in pos.values())
    n_rows = max(p[0] for p in pos.values()) + 1
    # Room right of the boxes for the skip edges' lanes and labels (about 6 px a character).
    skipped = [len(label) + (len(f" · FIFO {fifo}") if fifo else 0)
               for src, dst, label, fifo in edges if pos[dst][0] - pos[src][0] > 1]
    skip_lane = 20 * len(skipped) + 6.2 * max(skipped, default=0) + 30
    width = _MARGIN * 2 + widest * _BOX_W + (widest - 1) * _GAP_X + skip_lane
    # Each gap between rows is tall enough to stack the labels of the edges crossing it.
    crossing = [[e for e in edges if pos[e[0]][0] == r and pos[e[1]][0] == r + 1]
                for r in range(n_rows)]
    row_y = [_MARGIN]
    for r in range(n_rows - 1):
        row_y.append(row_y[-1] + _BOX_H + max(_ROW_H - _BOX_H, 24 + 14 * len(crossing[r])))
    height = row_y[-1] + _BOX_H + _MARGIN
    centre = _MARGIN + (widest * _BOX_W + (widest - 1) * _GAP_X) / 2

    def box(nid):
        r, c, n = pos[nid]
        x = centre + (c - (n - 1) / 2) * (_BOX_W + _GAP_X) - _BOX_W / 2
        return x, row_y[r]
    out = [f'<svg class="graph" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
           f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
           'fill="#555"/></marker></defs>']
    skips = 0
    for src, dst, label, fifo in edges:
        (x0, y0), (x1, y1) = box(src), box(dst)
        rows_apart = pos[dst][0] - pos[src][0]
        sx, sy = x0 + _BOX_W / 2, y0 + _BOX_H
        tx, ty = x1 + _BOX_W / 2, y1
        text = label + (f" · FIFO {fifo}" if fifo else "")
        if rows_apart > 1:
            # Around the boxes in between: out of the source's right side, down a lane to
            # the right of every box, into the target's right side.
            skips += 1
            lane = _MARGIN + widest * _BOX_W + (widest - 1) * _GAP_X + 20 * skips
            sx, sy = x0 + _BOX_W, y0 + _BOX_H * 0.7
            tx, ty = x1 + _BOX_W, y1 + _BOX_H * 0.3
            d = f"M{sx:.1f},{sy:.1f} H{lane:.1f} V{ty:.1f} H{tx:.1f}"
            lx, ly_ = lane + 4, (sy + ty) / 2
            cls = "edge skip"
        else:
            d = f"M{sx:.1f},{sy:.1f} C{sx:.1f},{sy + 30:.1f} {tx:.1f},{ty - 30:.1f} " \
                f"{tx:.1f},{ty:.1f}"
            k = crossing[pos[src][0]].index((src, dst, label, fifo))
            n = len(crossing[pos[src][0]])
            lx = (sx + tx) / 2 + 6
            ly_ = (sy + ty) / 2 + 4 if n == 1 else sy + 18 + 14 * k
            cls = "edge"
        out.append(f'<path class="{cls}" d="{d}" marker-end="url(#arrow)"/>')
        if text:
            out.append(f'<text class="elabel" x="{lx:.1f}" y="{ly_:.1f}">{_e(text)}</text>')
    for nid, kind, lines in nodes:
        x, y = box(nid)
        out.append(f'<g class="node {kind}" data-id="{_e(nid)}">'
                   f'<rect x="{x:.1f}" y="{y:.1f}" width="{_BOX_W}" height="{_BOX_H}" rx="6"/>')
        for k, line in enumerate(lines):
            cls = "title" if k == 0 else "line"
            out.append(f'<text class="{cls}" x="{x + 8:.1f}" y="{y + 17 + 16 * k:.1f}">'
                       f'{_e(line)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _svg_bars(m: dict) -> str:
    """Horizontal bars, width proportional to each layer's cycles (the longest spans
    ``_BAR_W`` pixels); the bottleneck bar is marked."""
    layers = m["layers"]
    top = max([ly["cycles"] for ly in layers], default=0) or 1
    height = len(layers) * (_BAR_H + _BAR_GAP) + _BAR_GAP
    width = _BAR_X + _BAR_W + 180
    out = [f'<svg class="bars" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}">']
    for k, ly in enumerate(layers):
        y = _BAR_GAP + k * (_BAR_H + _BAR_GAP)
        w = ly["cycles"] * _BAR_W / top
        cls = "bar bottleneck" if ly.get("bottleneck", False) else "bar"
        out.append(f'<text class="blabel" x="{_BAR_X - 8}" y="{y + _BAR_H - 4}" '
                   f'text-anchor="end">{_e(ly["name"])} ({_e(ly["kind"])})</text>')
        out.append(f'<rect class="{cls}" data-layer="{_e(ly["name"])}" '
                   f'data-cycles="{ly["cycles"]}" x="{_BAR_X}" y="{y}" width="{w:.3f}" '
                   f'height="{_BAR_H}"/>')
        mark = "  ◀ bottleneck" if ly.get("bottleneck", False) else ""
        out.append(f'<text class="bvalue" x="{_BAR_X + w + 6:.1f}" y="{y + _BAR_H - 4}">'
                   f'{ly["cycles"]}{mark}</text>')
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# HTML


def _e(x) -> str:
    return html.escape(x if isinstance(x, str) else _fmt(x), quote=True)


_CSS = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1400px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.bottleneck td { background: #fde8e8; font-weight: bold; }
.ok { color: #176317; font-weight: bold; } .bad { color: #b00; font-weight: bold; }
.note { color: #666; font-size: 0.9em; }
svg text { font-family: sans-serif; }
.graph .node rect { fill: #eef4fb; stroke: #4a78b0; stroke-width: 1.2; }
.graph .node.bottleneck rect { fill: #fde8e8; stroke: #c22; stroke-width: 2.5; }
.graph .node.host rect { fill: #f3f3f3; stroke: #888; stroke-dasharray: 5 3; }
.graph .node.port rect { fill: #eef8ee; stroke: #3a8a3a; }
.graph .title { font-size: 13px; font-weight: bold; } .graph .line { font-size: 11.5px; }
.graph .edge { fill: none; stroke: #555; stroke-width: 1.3; }
.graph .edge.skip { stroke: #a0522d; stroke-dasharray: 6 3; }
.graph .elabel { font-size: 10.5px; fill: #444; }
.bars .bar { fill: #4a78b0; } .bars .bar.bottleneck { fill: #c22; }
.bars .blabel, .bars .bvalue { font-size: 12px; }
"""


def _html_table(head: list, rows: list, *, mark=None, cell_class=None) -> str:
    """``mark[k]``: row ``k`` is the bottleneck; ``cell_class[(k, j)]``: a cell's class."""
    cell_class = cell_class or {}
    out = ["<table>", "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for k, row in enumerate(rows):
        cls = ' class="bottleneck"' if mark is not None and mark[k] else ""
        cells = []
        for j, v in enumerate(row):
            c = cell_class.get((k, j)) or ("num" if isinstance(v, (int, float)) and
                                           not isinstance(v, bool) else None)
            cells.append(f'<td class="{c}">{_e(v)}</td>' if c else f"<td>{_e(v)}</td>")
        out.append(f"<tr{cls}>{''.join(cells)}</tr>")
    out.append("</table>")
    return "\n".join(out)


def render_html(manifest: dict, builds: dict, measured: dict | None = None) -> str:
    """The HTML report of a manifest, its build reports (``{board: report}``) and the
    figures of its last RTL simulation (:func:`onnx2fpga.measured.read_measured`)."""
    m = manifest
    name = m.get("model", {}).get("graph_name") or "model"
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             f"<title>onnx2fpga report: {_e(name)}</title>", f"<style>{_CSS}</style>",
             "</head>", "<body>",
             f"<h1>onnx2fpga report: {_e(name)}</h1>",
             f'<p class="note">onnx2fpga {_e(m.get("onnx2fpga_version", "?"))}, module '
             f'{_e(m.get("top", {}).get("module", "top"))}, '
             f'{_e(m.get("top", {}).get("file", "top.v"))} sha256 '
             f'{_e(m.get("top", {}).get("verilog_sha256", "?")[:16])}…</p>',
             '<h2 id="summary">Summary</h2>', _html_table(["figure", "value"],
                                                          _summary_rows(m, builds, measured)),
             '<h2 id="graph">Dataflow graph</h2>',
             '<p class="note">Rows by topological depth. Arrows: tensor · stream order · lanes '
             '(dashed: skip branch, with its FIFO depth in transfers). Red: bottleneck.</p>',
             _svg_graph(m),
             '<h2 id="cycles">Cycles per layer</h2>',
             f'<p>{m["cycles_per_inference"]} cycles per inference, latency '
             f'{m["latency_cycles"]} cycles.</p>', _svg_bars(m)]
    head, rows = _layer_table(m)
    parts += [_html_table(head, rows, mark=[ly.get("bottleneck", False) for ly in m["layers"]])]
    if measured is not None:
        rows, facts = _measured_rows(m, measured)
        parts += ['<h2 id="measured">Measured in RTL simulation</h2>',
                  _html_table(["figure", "estimated", "measured"], rows),
                  _html_table(["figure", "value"], facts)]
    head, rows, fifos = _stream_rows(m)
    if rows:
        parts += ['<h2 id="streams">Streams</h2>', _html_table(head, rows)]
        if fifos:
            parts.append(_html_table(["skip edge", "FIFO depth"], fifos))
    parts.append('<h2 id="resources">Resources</h2>')
    head, rows, _ = _resource_rows(m)
    if rows:
        parts += ["<h3>Estimated per layer</h3>", _html_table(head, rows)]
    else:
        parts.append('<p class="note">No per-layer resource estimates in the manifest.</p>')
    if not builds:
        parts.append('<p class="note">No builds yet (<code>onnx2fpga build DIR --board '
                     'NAME</code> adds measured figures here).</p>')
    for board, r in builds.items():
        facts = _build_facts(r)
        verdict = "ok" if r.get("timing_met") else "bad"
        parts.append(f"<h3>Build for {_e(board)}</h3>")
        timing = next(k for k, row in enumerate(facts) if row[0] == "timing")
        parts.append(_html_table(["figure", "value"], facts,
                                 cell_class={(timing, 1): verdict}))
        head, rows = _build_rows(m, r)
        parts += [_html_table(head, rows),
                  '<p class="note">Measured: the whole bitstream (accelerator and host link); '
                  'estimated: the sum of the layers. Error = (estimated − measured) / '
                  'measured.</p>']
    head, rows = _quant_rows(m)
    if rows:
        parts += ['<h2 id="quantization">Quantization error per layer</h2>',
                  '<p class="note">Each layer\'s dequantized integer output (golden model) '
                  'against the float model\'s tensor at the same point, over the '
                  f'{_e(m["quantization"].get("calibration_samples", "?"))} calibration '
                  'samples.</p>', _html_table(head, rows)]
    head, rows = _port_rows(m)
    parts += ['<h2 id="ports">Ports</h2>', _html_table(head, rows),
              '<p class="note">real = (q − zero point) × scale; element j of a beat at tdata '
              'bits [j·bits, (j+1)·bits).</p>']
    head, rows = _part_rows(m)
    if rows:
        parts += ['<p class="note">Multiplexed: each tensor flattened in C order at its '
                  'offset in the stream, with its own scale and zero point.</p>',
                  _html_table(head, rows)]
    parts += ['<h2 id="partition">Partition</h2>',
              _html_table(["part", "operators"], _partition_rows(m)),
              '<h2 id="tools">Tools</h2>',
              _html_table(["tool", "version", "used for"], _tool_rows(m, builds, measured)),
              "</body>", "</html>", ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Markdown


# Characters that end a markdown line (CommonMark: LF, CR; renderers also break on the
# Unicode separators) and other control characters: a space in their place.
_MD_BREAKS = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")
# Backslash first, so that the escapes added after it are not escaped again; ``<`` as an
# entity (no HTML tag or autolink can start), ``](`` escaped (no inline link or image).
_MD_ESCAPES = (("\\", "\\\\"), ("|", "\\|"), ("`", "\\`"), ("<", "&lt;"), ("](", "\\]("))


def _md_text(v) -> str:
    """``v`` as markdown text that stays on one line and in its table cell and carries no
    HTML, code span or link (names come from the model file); what a terminal shows stays
    readable: only those characters are escaped."""
    text = _MD_BREAKS.sub(" ", _fmt(v))
    for a, b in _MD_ESCAPES:
        text = text.replace(a, b)
    return text


def _md_cell(v) -> str:
    return _md_text(v)


def _md_table(head: list, rows: list) -> str:
    out = ["| " + " | ".join(_md_cell(h) for h in head) + " |",
           "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def render_markdown(manifest: dict, builds: dict, measured: dict | None = None) -> str:
    """The markdown twin of :func:`render_html`: the same tables, no graphics."""
    m = manifest
    name = m.get("model", {}).get("graph_name") or "model"
    parts = [f"# onnx2fpga report: {_md_text(name)}", "", "## Summary", "",
             _md_table(["figure", "value"], _summary_rows(m, builds, measured)), "",
             "## Layers", "", _md_table(*_layer_table(m)), ""]
    if measured is not None:
        rows, facts = _measured_rows(m, measured)
        parts += ["## Measured in RTL simulation", "",
                  _md_table(["figure", "estimated", "measured"], rows), "",
                  _md_table(["figure", "value"], facts), ""]
    head, rows, fifos = _stream_rows(m)
    if rows:
        parts += ["## Streams", "", _md_table(head, rows), ""]
        if fifos:
            parts += [_md_table(["skip edge", "FIFO depth"], fifos), ""]
    parts += ["## Resources", ""]
    head, rows, _ = _resource_rows(m)
    if rows:
        parts += ["### Estimated per layer", "", _md_table(head, rows), ""]
    else:
        parts += ["No per-layer resource estimates in the manifest.", ""]
    if not builds:
        parts += ["No builds yet.", ""]
    for board, r in builds.items():
        parts += [f"### Build for {_md_text(board)}", "",
                  _md_table(["figure", "value"], _build_facts(r)),
                  "", _md_table(*_build_rows(m, r)), ""]
    head, rows = _quant_rows(m)
    if rows:
        parts += ["## Quantization error per layer", "", _md_table(head, rows), ""]
    parts += ["## Ports", "", _md_table(*_port_rows(m)), ""]
    head, rows = _part_rows(m)
    if rows:
        parts += ["Multiplexed: each tensor flattened in C order at its offset in the stream, "
                  "with its own scale and zero point.", "", _md_table(head, rows), ""]
    parts += ["## Partition", "", _md_table(["part", "operators"], _partition_rows(m)), ""]
    parts += ["## Tools", "", _md_table(["tool", "version", "used for"],
                                       _tool_rows(m, builds, measured)), ""]
    return "\n".join(parts)
