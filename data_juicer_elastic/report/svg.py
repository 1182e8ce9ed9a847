"""The report's two pictures as inline SVG: the attempt timeline and rows per second over time."""

from __future__ import annotations

from html import escape

from data_juicer_elastic.report.collect import Attempt, JobReport

COLOURS = {
    "done": "#2e8b57",
    "failed": "#d62728",
    "lost": "#ff7f0e",
    "lost-race": "#bcbd22",
    "superseded": "#9467bd",
    "running": "#1f77b4",
    "stopped": "#7f7f7f",
}
SERIES = ["#1f77b4", "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#6b6ecf", "#7f7f7f", "#393b79", "#637939"]
WIDTH, LABEL, LANE, AXIS = 1100, 190, 22, 28
QUEUED = "#9ecae1"  # claimed and loaded, waiting for the worker's previous attempt
MAX_BARS = 2000  # above this many attempts the timeline shows time buckets per lane instead of bars
BUCKET_PX = 4  # a bucket's width on the page
MAX_WORKER_LANES = 64  # above this many workers, one lane per host


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
    """One bar per attempt; past ``MAX_BARS`` attempts (more bars than pixels), time buckets per lane."""
    if len(report.attempts) > MAX_BARS:
        return bucket_timeline(report)
    rows = lanes(report)
    t0, span = report.t0, max(report.t1 - report.t0, 1.0)
    scale = (WIDTH - LABEL - 20) / span
    parts = _timeline_frame(rows, scale, span, "attempt timeline")
    index = {lane: i for i, lane in enumerate(rows)}
    for a in report.attempts:
        y = index[a.lane] * LANE
        begin = a.start + a.queued
        if a.queued:
            parts.append(_queued(a, LABEL + (a.start - t0) * scale, y, a.queued * scale))
        parts.append(_bar(a, LABEL + (begin - t0) * scale, y, max((a.end - begin) * scale, 2.0)))
    parts.append("</svg>")
    return "\n".join(parts)


def _timeline_frame(rows: list[str], scale: float, span: float, label: str) -> list[str]:
    height = len(rows) * LANE + AXIS + 10
    parts = [
        f'<svg id="timeline" class="chart" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{label}">'
    ]
    parts += _axis(LABEL, scale, span, 0, len(rows) * LANE)
    for i, lane in enumerate(rows):
        y = i * LANE
        parts.append(
            f'<text class="lane" x="{LABEL - 6}" y="{y + LANE * 0.68:.1f}" text-anchor="end">{escape(lane)}</text>'
        )
    return parts


def _queued(a: Attempt, x: float, y: float, w: float) -> str:
    """The time an attempt waited, claimed and loaded, for its worker's previous attempt: a thin bar below."""
    tip = f"{a.shard} attempt {a.attempt} on {a.lane}: queued {a.queued:.1f}s behind the previous attempt"
    return (
        f'<rect class="queued" data-shard="{escape(a.shard)}" data-attempt="{a.attempt}" x="{x:.1f}" '
        f'y="{y + LANE - 8}" width="{max(w, 1.0):.1f}" height="5" fill="{QUEUED}"><title>{escape(tip)}</title></rect>'
    )


def bucket_timeline(report: JobReport) -> str:
    """Per lane, equal time buckets coloured by how busy the lane was, with what ended in each.

    A bucket's opacity is the share of its time the lane's workers spent processing (queued
    time excluded); a mark on top shows the worst outcome (failed, lost, ...) that ended in it.
    """
    by_host = len({a.lane for a in report.attempts}) > MAX_WORKER_LANES
    lane_of = (lambda a: a.host) if by_host else (lambda a: a.lane)
    workers: dict[str, set[str]] = {}
    for a in report.attempts:
        workers.setdefault(lane_of(a), set()).add(a.lane)
    order = {lane: i for i, lane in enumerate(lanes(report))}
    rows = sorted(workers, key=lambda lane: min(order[w] for w in workers[lane]))
    t0, span = report.t0, max(report.t1 - report.t0, 1.0)
    count = max((WIDTH - LABEL - 20) // BUCKET_PX, 1)
    width = span / count
    busy = {lane: [0.0] * count for lane in rows}
    ended: dict[tuple[str, int], dict[str, int]] = {}
    for a in report.attempts:
        lane, begin = lane_of(a), a.start + a.queued
        for b, overlap in _overlaps(begin, a.end, t0, width, count):
            busy[lane][b] += overlap
        b = min(int((a.end - t0) / width), count - 1)
        tally = ended.setdefault((lane, b), {})
        tally[a.outcome] = tally.get(a.outcome, 0) + 1
    scale = (WIDTH - LABEL - 20) / span
    parts = _timeline_frame(rows, scale, span, "worker utilisation over time")
    for i, lane in enumerate(rows):
        n = len(workers[lane])
        for b in range(count):
            tally = ended.get((lane, b), {})
            share = min(busy[lane][b] / (width * n), 1.0)
            if share <= 0 and not tally:
                continue
            parts.append(_bucket(lane, b, t0 + b * width - t0, width, share, tally, LABEL + b * BUCKET_PX, i * LANE))
    parts.append("</svg>")
    return "\n".join(parts)


def _overlaps(start: float, end: float, t0: float, width: float, count: int) -> list[tuple[int, float]]:
    """(bucket, seconds of [start, end) inside it) for the buckets the interval touches."""
    first = max(int((start - t0) / width), 0)
    last = min(int((end - t0) / width), count - 1)
    found = []
    for b in range(first, last + 1):
        lo, hi = t0 + b * width, t0 + (b + 1) * width
        overlap = min(hi, end) - max(lo, start)
        if overlap > 0:
            found.append((b, overlap))
    return found


_WORST = ("failed", "lost", "lost-race", "superseded", "stopped", "running")


def _bucket(lane: str, b: int, at: float, width: float, share: float, tally: dict[str, int], x: float, y: float) -> str:
    listing = ", ".join(f"{n} {o}" for o, n in sorted(tally.items())) or "nothing ended"
    tip = f"{lane} {_clock(at)}-{_clock(at + width)}: {share:.0%} busy; {listing}"
    worst = next((o for o in _WORST if o in tally), None)
    mark = (
        f'<rect class="mark outcome-{worst}" x="{x:.1f}" y="{y + 2}" width="{BUCKET_PX}" height="5" '
        f'fill="{COLOURS[worst]}"/>'
        if worst
        else ""
    )
    return (
        f'<g class="bucket" data-lane="{escape(lane)}" data-bucket="{b}" data-done="{tally.get("done", 0)}">'
        f'<rect x="{x:.1f}" y="{y + 3}" width="{BUCKET_PX}" height="{LANE - 6}" fill="{COLOURS["done"]}" '
        f'fill-opacity="{0.08 + 0.92 * share:.2f}"/>{mark}<title>{escape(tip)}</title></g>'
    )


def _bar(a: Attempt, x: float, y: float, w: float) -> str:
    rows = f"{a.rows_in if a.rows_in is not None else '?'} rows in, {a.rows_out if a.rows_out is not None else '?'} out"
    took = f"{a.seconds:.1f}s" + (f" ({a.queued:.1f}s of it queued)" if a.queued else "")
    tip = f"{a.shard} attempt {a.attempt} on {a.lane}: {a.outcome}, {took}, {rows}"
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
        begin = a.start + a.queued  # rows are processed after the queued time
        per_sec = rows / max(a.end - begin, 1e-3)
        host = series.setdefault(a.host, [0.0] * bins)
        for b, overlap in _overlaps(begin, a.end, t0, width, bins):
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
