"""The report's two pictures as inline SVG: the attempt timeline and rows per second over time."""

from __future__ import annotations

from html import escape

from data_juicer_elastic.report.collect import Attempt, JobReport

COLOURS = {
    "done": "#2e8b57",
    "failed": "#d62728",
    "lost": "#ff7f0e",
    "superseded": "#9467bd",
    "running": "#1f77b4",
    "stopped": "#7f7f7f",
}
SERIES = ["#1f77b4", "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#6b6ecf", "#7f7f7f", "#393b79", "#637939"]
WIDTH, LABEL, LANE, AXIS = 1100, 190, 22, 28


def _ticks(span: float, count: int = 8) -> list[float]:
    step = max(span / count, 1e-9)
    for nice in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400):
        if nice >= step:
            step = nice
            break
    return [i * step for i in range(int(span // step) + 1)]


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _axis(x0: float, scale: float, span: float, top: int, bottom: int) -> list[str]:
    out = []
    for t in _ticks(span):
        x = x0 + t * scale
        out.append(f'<line class="grid" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}"/>')
        out.append(f'<text class="tick" x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{_clock(t)}</text>')
    return out


def lanes(report: JobReport) -> list[str]:
    """One lane per worker (host and pid), ordered by host then first start."""
    first: dict[str, tuple[str, float]] = {}
    for a in report.attempts:
        host, start = first.get(a.lane, (a.host, a.start))
        first[a.lane] = (host, min(start, a.start))
    return sorted(first, key=lambda lane: first[lane])


def timeline(report: JobReport) -> str:
    rows = lanes(report)
    t0, span = report.t0, max(report.t1 - report.t0, 1.0)
    scale = (WIDTH - LABEL - 20) / span
    height = len(rows) * LANE + AXIS + 10
    parts = [
        f'<svg id="timeline" class="chart" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
        'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="attempt timeline">'
    ]
    parts += _axis(LABEL, scale, span, 0, len(rows) * LANE)
    index = {lane: i for i, lane in enumerate(rows)}
    for i, lane in enumerate(rows):
        y = i * LANE
        parts.append(
            f'<text class="lane" x="{LABEL - 6}" y="{y + LANE * 0.68:.1f}" text-anchor="end">{escape(lane)}</text>'
        )
    for a in report.attempts:
        parts.append(_bar(a, LABEL + (a.start - t0) * scale, index[a.lane] * LANE, max(a.seconds * scale, 2.0)))
    parts.append("</svg>")
    return "\n".join(parts)


def _bar(a: Attempt, x: float, y: float, w: float) -> str:
    rows = f"{a.rows_in if a.rows_in is not None else '?'} rows in, {a.rows_out if a.rows_out is not None else '?'} out"
    tip = f"{a.shard} attempt {a.attempt} on {a.lane}: {a.outcome}, {a.seconds:.1f}s, {rows}"
    if a.error:
        tip += f"\n{a.error}"
    return (
        f'<rect class="bar outcome-{a.outcome}" data-shard="{escape(a.shard)}" data-attempt="{a.attempt}" '
        f'data-outcome="{a.outcome}" x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{LANE - 6}" rx="2" '
        f'fill="{COLOURS[a.outcome]}"><title>{escape(tip)}</title></rect>'
    )


def rate_series(report: JobReport, bins: int = 60) -> tuple[float, dict[str, list[float]]]:
    """Rows per second in ``bins`` equal time bins, for the job and per host (done attempts' input rows)."""
    t0, span = report.t0, max(report.t1 - report.t0, 1.0)
    width = span / bins
    series: dict[str, list[float]] = {"job": [0.0] * bins}
    for a in report.winners():
        rows = a.rows_in if a.rows_in is not None else a.rows_out or 0
        per_sec = rows / max(a.seconds, 1e-3)
        host = series.setdefault(a.host, [0.0] * bins)
        for b in range(bins):
            lo, hi = t0 + b * width, t0 + (b + 1) * width
            overlap = max(0.0, min(hi, a.end) - max(lo, a.start))
            if overlap:
                for s in (series["job"], host):
                    s[b] += per_sec * overlap / width
    return width, series


def rate_chart(report: JobReport) -> str:
    width, series = rate_series(report)
    height, top, bottom = 260, 10, 220
    peak = max((v for s in series.values() for v in s), default=0.0) or 1.0
    span = width * len(series["job"])
    scale = (WIDTH - LABEL - 20) / span
    parts = [
        f'<svg id="rate" class="chart" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
        'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="rows per second">'
    ]
    parts += _axis(LABEL, scale, span, top, bottom)
    for frac in (0, 0.5, 1):
        y = bottom - frac * (bottom - top)
        parts.append(f'<text class="tick" x="{LABEL - 6}" y="{y + 4:.1f}" text-anchor="end">{peak * frac:,.0f}</text>')
    legend: list[str] = []
    for k, (name, values) in enumerate(series.items()):
        colour = "#111" if name == "job" else SERIES[k % len(SERIES)]
        points = " ".join(
            f"{LABEL + (i + 0.5) * width * scale:.1f},{bottom - v / peak * (bottom - top):.1f}"
            for i, v in enumerate(values)
        )
        cls = "series job" if name == "job" else "series"
        dash = ' stroke-width="2.5"' if name == "job" else ' stroke-dasharray="5 3"'
        label = "whole job" if name == "job" else name
        parts.append(
            f'<polyline class="{cls}" fill="none" stroke="{colour}"{dash} points="{points}">'
            f"<title>{escape(label)} rows/s</title></polyline>"
        )
        legend.append(f'<span style="color:{colour}">&#9473; {escape(label)}</span>')
    parts.append(f'<text class="tick" x="12" y="{top + 10}">rows/s</text>')
    parts.append("</svg>")
    return "\n".join(parts) + f'<div class="key">{"".join(legend)}</div>'
