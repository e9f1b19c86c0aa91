"""``explore.html``: a sweep's Pareto fronts and rows, one self-contained page (inline SVG, no
scripts), written from ``explore.json``'s content by :func:`write_html`."""

from __future__ import annotations

import html
import math

from .designdir import atomic_write

__all__ = ["write_html", "svg_front"]

_W, _H, _PAD = 560, 340, 56
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
            "#e377c2")


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        return [10.0 ** e for e in range(math.floor(math.log10(lo)),
                                         math.ceil(math.log10(hi)) + 1)]
    step = 10 ** math.floor(math.log10(max(hi - lo, 1e-9)))
    while (hi - lo) / step > 6:
        step *= 2
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 2)]


def _fmt(v: float) -> str:
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:g}{unit}"
    return f"{v:g}"


def svg_front(rows, cost: str, label: str) -> str:
    """An SVG scatter of inferences per second at Fmax (log scale) against ``cost`` (a row
    column) for the rows that built; the Pareto front (``pareto_<cost>``) filled and joined,
    one colour per candidate."""
    pts = [r for r in rows if r.get("status") == "ok" and r.get("inferences_per_second")
           and r.get(cost) is not None]
    if not pts:
        return "<p>No run built.</p>"
    xs = [r[cost] for r in pts]
    ys = [r["inferences_per_second"] for r in pts]
    x_lo, x_hi = 0.0, max(max(xs) * 1.08, 1.0)
    y_lo, y_hi = min(ys) / 1.5, max(ys) * 1.5
    x_ticks = [t for t in _ticks(x_lo, x_hi, False) if x_lo <= t <= x_hi]
    y_ticks = [t for t in _ticks(y_lo, y_hi, True) if y_lo <= t <= y_hi]

    def sx(v):
        return _PAD + (v - x_lo) / (x_hi - x_lo) * (_W - 2 * _PAD)

    def sy(v):
        f = (math.log10(v) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo))
        return _H - _PAD - f * (_H - 2 * _PAD)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect x="{_PAD}" y="{_PAD}" width="{_W - 2 * _PAD}" height="{_H - 2 * _PAD}" '
           f'fill="none" stroke="#999"/>']
    for t in x_ticks:
        out.append(f'<text x="{sx(t):.1f}" y="{_H - _PAD + 14}" text-anchor="middle">'
                   f'{_fmt(t)}</text>')
    for t in y_ticks:
        out.append(f'<line x1="{_PAD}" x2="{_W - _PAD}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" '
                   f'stroke="#eee"/><text x="{_PAD - 4}" y="{sy(t) + 4:.1f}" '
                   f'text-anchor="end">{_fmt(t)}</text>')
    out.append(f'<text x="{_W / 2}" y="{_H - 14}" text-anchor="middle">{html.escape(label)}'
               f'</text><text x="14" y="{_H / 2}" text-anchor="middle" '
               f'transform="rotate(-90 14 {_H / 2})">inferences/s at Fmax</text>')
    front = sorted((r for r in pts if r.get(f"pareto_{cost}")), key=lambda r: r[cost])
    if len(front) > 1:
        path = " ".join(f"{sx(r[cost]):.1f},{sy(r['inferences_per_second']):.1f}"
                        for r in front)
        out.append(f'<polyline points="{path}" fill="none" stroke="#444" '
                   f'stroke-dasharray="4 3"/>')
    cands = list(dict.fromkeys(r["candidate"] for r in rows))
    for r in pts:
        c = _COLOURS[cands.index(r["candidate"]) % len(_COLOURS)]
        fill = c if r.get(f"pareto_{cost}") else "white"
        tip = (f"{r['run']}: {r['fmax_mhz']} MHz, {r[cost]} {cost.upper()}, "
               f"{r['inferences_per_second']:,.0f}/s")
        out.append(f'<circle cx="{sx(r[cost]):.1f}" cy="{sy(r["inferences_per_second"]):.1f}" '
                   f'r="5" fill="{fill}" stroke="{c}" stroke-width="2"><title>'
                   f'{html.escape(tip)}</title></circle>')
    for i, cand in enumerate(cands):
        c = _COLOURS[i % len(_COLOURS)]
        y = _PAD + 4 + 14 * i
        out.append(f'<circle cx="{_W - _PAD + 8}" cy="{y}" r="4" fill="{c}"/>'
                   f'<text x="{_W - _PAD + 15}" y="{y + 4}">{html.escape(cand)}</text>')
    out.append("</svg>")
    return "\n".join(out)


_COLUMNS = (("run", "run"), ("worker", "worker"), ("cycles_per_inference", "cycles"),
            ("latency_cycles", "latency"), ("clock_mhz", "clock MHz"), ("fmax_mhz", "Fmax MHz"),
            ("timing_met", "met"), ("lut", "LUT"), ("ff", "FF"), ("dsp", "DSP"),
            ("bram", "BRAM"), ("inferences_per_second", "inf/s at Fmax"),
            ("wall_seconds", "build s"), ("error", "error"))


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return html.escape(str(v))


def write_html(path: str, doc: dict) -> None:
    """Write ``explore.html`` for the sweep ``doc`` (``explore.json``'s content)."""
    rows = doc.get("rows", [])
    best = doc.get("best")
    head = "".join(f"<th>{html.escape(t)}</th>" for _, t in _COLUMNS)
    body = []
    for r in rows:
        mark = " ★" if r["run"] == best else ""
        front = [c.upper() for c in ("lut", "dsp") if r.get(f"pareto_{c}")]
        cells = "".join(f"<td>{_cell(r.get(k))}{mark if k == 'run' else ''}</td>"
                        for k, _ in _COLUMNS)
        style = ' style="background:#eef6ee"' if front else ""
        body.append(f"<tr{style} title=\"Pareto: {', '.join(front) or 'no'}\">{cells}</tr>")
    ok = sum(r["status"] == "ok" for r in rows)
    met = sum(bool(r.get("timing_met")) for r in rows)
    summary = (f"{len(rows)} runs: {ok} built, {met} met timing, {len(rows) - ok} failed. "
               f"Wall time {doc.get('wall_seconds', 0):,.0f} s on {doc.get('workers', '?')} "
               f"workers; the runs' own times add up to {doc.get('run_seconds', 0):,.0f} s.")
    text = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>onnx2fpga sweep: {html.escape(doc['model'])}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right;font-size:13px}}
td:first-child,td:nth-child(2),td:last-child{{text-align:left}}</style></head><body>
<h1>Sweep of {html.escape(doc['model'])} for {html.escape(doc['board'])}</h1>
<p>{html.escape(summary)} Chosen: <b>{html.escape(best or 'none (no run met timing)')}</b>
(copied to <code>best/</code>). Filled points and shaded rows are on a Pareto front.</p>
<h2>Inferences per second at Fmax against LUTs</h2>
{svg_front(rows, "lut", "LUTs")}
<h2>Inferences per second at Fmax against DSPs</h2>
{svg_front(rows, "dsp", "DSPs (hard multipliers)")}
<h2>Runs</h2>
<table><tr>{head}</tr>
{chr(10).join(body)}
</table></body></html>
"""
    atomic_write(path, text)
