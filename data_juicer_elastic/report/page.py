"""The report as one self-contained HTML page: inline CSS and SVG, no script, no network."""

from __future__ import annotations

import time
from html import escape

from data_juicer_elastic.report.collect import OUTCOMES, Attempt, JobReport
from data_juicer_elastic.report.svg import COLOURS, MAX_BARS, QUEUED, lanes, rate_chart, timeline

MAX_ROWS = 1000  # rows a table lists at most (the shard table: those not done by one attempt first)

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:13px} .state{font-weight:600;padding:1px 8px;border-radius:9px;color:#fff}
.state-finished{background:#2e8b57}.state-failed{background:#d62728}.state-running{background:#1f77b4}
.state-not\\ prepared{background:#7f7f7f}
table{border-collapse:collapse;font-size:13px;margin:6px 0} th,td{padding:3px 10px;border-bottom:1px solid #eee;
text-align:left} td.n,th.n{text-align:right;font-variant-numeric:tabular-nums} th{background:#f5f5f5}
.chart{display:block;max-width:100%;height:auto} .grid{stroke:#eee} .tick{font-size:11px;fill:#666}
.lane{font-size:12px;fill:#333} .legend{font-size:12px} .bar:hover{stroke:#000;stroke-width:1.5}
.key span{display:inline-block;margin-right:14px;font-size:13px}
.key i{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:4px;vertical-align:-1px}
.notes li{color:#8a5300} code{font-size:12px} .cards{display:flex;gap:12px;flex-wrap:wrap}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:120px}
.card b{display:block;font-size:20px}
"""


def _n(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else "" if value is None else escape(str(value))


def _table(headers: list[str], rows: list[list[object]], numeric: set[int], cls: str = "") -> str:
    head = "".join(
        f'<th class="n">{escape(h)}</th>' if i in numeric else f"<th>{escape(h)}</th>" for i, h in enumerate(headers)
    )
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="n">{_n(v)}</td>' if i in numeric else f"<td>{_n(v)}</td>" for i, v in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def busy_seconds(attempts: list[Attempt]) -> float:
    """Seconds in which at least one of ``attempts`` was processing (a prefetched attempt's wait is not work):
    a worker killed while its successor on the same host already ran is not counted twice."""
    total, until = 0.0, float("-inf")
    for begin, end in sorted((a.start + a.queued, a.end) for a in attempts):
        if end > until:
            total += end - max(begin, until)
            until = end
    return total


def host_rows(report: JobReport) -> list[list[object]]:
    """Per host: shards done, rows in and out, busy and idle seconds, failed or lost attempts."""
    t0 = report.t0
    lane_of: dict[str, list[Attempt]] = {}
    for a in report.attempts:
        lane_of.setdefault(a.lane, []).append(a)
    hosts: dict[str, dict] = {}
    for lane in lanes(report):
        mine = lane_of[lane]
        h = hosts.setdefault(mine[0].host, {"workers": 0, "shards": 0, "in": 0, "out": 0, "fail": 0, "all": []})
        h["workers"] += 1
        h["all"] += mine
        for a in mine:
            if a.outcome == "done":
                h["shards"] += 1
                h["in"] += a.rows_in or 0
                h["out"] += a.rows_out or 0
            h["fail"] += a.outcome in ("failed", "lost")
    rows = []
    for host, h in sorted(hosts.items()):
        busy = busy_seconds(h["all"])
        idle = max(max(a.end for a in h["all"]) - t0 - busy, 0.0)
        rows.append([host, h["workers"], h["shards"], h["in"], h["out"], f"{busy:.1f}", f"{idle:.1f}", h["fail"]])
    return rows


def op_rows(report: JobReport) -> list[list[object]]:
    """Per op, summed over the done attempts: rows in, rows out, rows a Filter dropped, rows op errors removed."""
    totals: dict[int, dict] = {}
    for a in report.winners():
        for i, op in enumerate(a.ops):
            t = totals.setdefault(i, {"op": op.get("op"), "kind": op.get("kind"), "in": 0, "out": 0, "err": 0})
            for key, src in (("in", "rows_in"), ("out", "rows_out"), ("err", "error_rows")):
                t[key] += op.get(src) if type(op.get(src)) is int else 0
    rows = []
    for i in sorted(totals):
        t = totals[i]
        dropped = t["in"] - t["out"] - t["err"]
        rows.append(
            [i + 1, t["op"], t["kind"], t["in"], t["out"], dropped if t["kind"] == "Filter" else None, t["err"]]
        )
    return rows


def shard_rows(report: JobReport) -> list[list[object]]:
    """One row per shard and a total; past ``MAX_ROWS`` shards only those not done by one attempt are listed."""
    by_shard: dict[str, list[Attempt]] = {}
    for a in report.attempts:
        by_shard.setdefault(a.shard, []).append(a)
    rows = []
    for s in report.shards:
        mine = by_shard.get(s["id"], [])
        win = next((a for a in mine if a.outcome == "done"), None)
        state = "done" if win else (mine[-1].outcome if mine else "pending")
        rows.append(
            [
                s["id"],
                state,
                len(mine),
                s.get("rows"),
                win.rows_in if win else None,
                win.rows_out if win else None,
                win.error_rows if win else None,
                win.host if win else "",
                f"{win.seconds:.1f}" if win else "",
            ]
        )
    total = ["total", "", sum(r[2] for r in rows)] + [sum(r[i] or 0 for r in rows) for i in (3, 4, 5, 6)] + ["", ""]
    if len(rows) > MAX_ROWS:
        listed = [r for r in rows if r[1] != "done" or r[2] != 1]
        left = len(rows) - len(listed[:MAX_ROWS])
        note = [f"{left:,} more shards", "not listed", None, None, None, None, None, "", ""]
        rows = [*listed[:MAX_ROWS], note]
    return [*rows, total]


def cards(report: JobReport) -> str:
    """The summary: attempts by what they ended as (a lost one counts as lost, never as running)."""
    wins = report.winners()
    rows_in = sum(s.get("rows") or 0 for s in report.shards)
    rows_out = sum(a.rows_out or 0 for a in wins)
    errors = sum(a.error_rows for a in wins)
    span = report.t1 - report.t0
    ended = {o: sum(1 for a in report.attempts if a.outcome == o) for o in OUTCOMES}
    items = [
        ("shards done", f"{len(wins):,} / {len(report.shards):,}"),
        ("attempts", f"{len(report.attempts):,}"),
        ("running", f"{ended['running']:,}"),
        ("failed or lost", f"{ended['failed'] + ended['lost']:,}"),
        ("superseded or lost a race", f"{ended['superseded'] + ended['lost-race']:,}"),
        ("rows in", f"{rows_in:,}"),
        ("rows out", f"{rows_out:,}"),
        ("rows removed by op errors", f"{errors:,}"),
        ("hosts", f"{len({a.host for a in report.attempts}):,}"),
        ("wall time", f"{span:,.1f} s"),
    ]
    return (
        '<div class="cards">' + "".join(f'<div class="card">{escape(k)}<b>{v}</b></div>' for k, v in items) + "</div>"
    )


def render(report: JobReport) -> str:
    parts = [*_header(report), *_charts(report), *_tables(report)]
    if report.notes:
        parts.append("<h2>Skipped records</h2><ul class='notes'>")
        parts += [f"<li>{escape(n)}</li>" for n in report.notes]
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _header(report: JobReport) -> list[str]:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(report.generated_at))
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>job report: {escape(report.job_dir)}</title><style>{CSS}</style></head><body>",
        f'<h1>Job report <span class="state state-{escape(report.state)}">{escape(report.state)}</span></h1>',
        f'<div class="meta"><code>{escape(report.job_dir)}</code> &middot; generated {when}</div>',
        cards(report),
    ]


def _charts(report: JobReport) -> list[str]:
    key = "".join(f'<span><i style="background:{COLOURS[o]}"></i>{o}</span>' for o in OUTCOMES)
    if len(report.attempts) > MAX_BARS:
        title = (
            f"Timeline: {len(report.attempts):,} attempts in time buckets per lane "
            "(opacity: share of the time processing; a mark: the worst outcome that ended in the bucket)"
        )
    else:
        key += f'<span><i style="background:{QUEUED};height:5px"></i>queued behind the previous attempt</span>'
        title = "Timeline: one lane per worker, one bar per attempt"
    return [
        f"<h2>{escape(title)}</h2>",
        f'<div class="key">{key}</div>',
        timeline(report) if report.attempts else "<p>No attempt has started yet.</p>",
        "<h2>Rows per second</h2>",
        rate_chart(report) if report.winners() else "<p>No shard is done yet.</p>",
    ]


def _tables(report: JobReport) -> list[str]:
    slow = sorted(report.winners(), key=lambda a: a.seconds, reverse=True)[:10]
    failures = [a for a in report.attempts if a.outcome in ("failed", "lost", "stopped")]
    failure_rows = [[a.shard, a.attempt, a.outcome, a.lane, a.error, a.log] for a in failures[:MAX_ROWS]]
    if len(failures) > MAX_ROWS:
        failure_rows.append([f"{len(failures) - MAX_ROWS:,} more", None, "", "", "not listed", ""])
    hosts = ["host", "workers", "shards done", "rows in", "rows out", "busy s", "idle s", "failed or lost"]
    ops = ["#", "op", "kind", "rows in", "rows out", "dropped by the filter", "removed by op errors"]
    shards = ["shard", "state", "attempts", "input rows", "rows in", "rows out", "op error rows", "host", "seconds"]
    return [
        "<h2>Hosts</h2>",
        _table(hosts, host_rows(report), {1, 2, 3, 4, 5, 6, 7}, "hosts"),
        "<h2>Ops (summed over all done shards)</h2>",
        _table(ops, op_rows(report), {0, 3, 4, 5, 6}, "ops"),
        "<h2>Slowest shards</h2>",
        _table(
            ["shard", "seconds", "host", "rows in", "rows out"],
            [[a.shard, f"{a.seconds:.1f}", a.lane, a.rows_in, a.rows_out] for a in slow],
            {1, 3, 4},
        ),
        f"<h2>Failures ({len(failures)})</h2>",
        _table(
            ["shard", "attempt", "outcome", "host", "message", "log"],
            failure_rows,
            {1},
            "failures",
        ),
        "<h2>Shards</h2>",
        _table(shards, shard_rows(report), {2, 3, 4, 5, 6, 8}, "shards"),
    ]
