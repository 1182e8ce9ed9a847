"""The report of a real run with a node killed -9 mid-shard (tests/test_report.py's three nodes).

The killed node's attempt is drawn until its last heartbeat (its lease's last renewal), not until another
node took the shard over a lock timeout later: the worker did nothing in between. Busy seconds per host
count what ran, so no host is busier than the job's wall time, and the failure names when it died.
"""

from __future__ import annotations

import re

import pytest

from data_juicer_elastic.report.collect import collect
from data_juicer_elastic.report.page import host_rows, render
from data_juicer_elastic.report.svg import LABEL, WIDTH

from .jobs import last_heartbeat
from .test_report import run_nodes, wait_nodes


def bar_right_edge(html: str, shard: str, attempt: int) -> float:
    m = re.search(rf'<rect class="bar [^"]*" data-shard="{shard}" data-attempt="{attempt}"[^>]*>', html)
    assert m, (shard, attempt)
    x, w = (float(re.search(rf'{k}="([\d.]+)"', m.group(0)).group(1)) for k in ("x", "width"))
    return x + w


@pytest.mark.slow  # three nodes and a lease waited out
def test_a_killed_attempt_is_drawn_until_its_last_heartbeat(tmp_path):
    job, _, nodes = run_nodes(tmp_path, hold=2.0)  # beats in the shard, then the kill
    codes = wait_nodes(nodes)
    assert codes == [0, 0], [(tmp_path / f"{h}.log").read_text()[-3000:] for h in ("node-a", "node-b")]
    report = collect(job.root)
    lost = [a for a in report.attempts if a.outcome == "lost"]
    assert lost and {a.host for a in lost} == {"node-c"}, report.attempts
    html = render(report)
    scale = (WIDTH - LABEL - 20) / max(report.t1 - report.t0, 1.0)
    for a in lost:
        beat = last_heartbeat(job, a.shard, a.attempt)
        later = next(x for x in report.attempts if x.shard == a.shard and x.attempt == a.attempt + 1)
        assert later.start - beat >= job.manifest().policy.lock_timeout_secs / 2  # so the two can be told apart
        assert a.end == beat > a.start + 1.0, (a.start, a.end, beat, later.start)
        edge = bar_right_edge(html, a.shard, a.attempt) - (LABEL + (a.end - report.t0) * scale)
        assert -0.1 <= edge <= 2.1, edge  # a bar is 2 px at least (a prefetched attempt is all queued time)
        assert "killed or stalled at ~" in a.error and f"taken over by attempt {later.attempt}" in a.error, a.error
    wall = report.t1 - report.t0
    for row in host_rows(report):
        assert float(row[5]) <= wall + 0.05, (row, wall)


def test_busy_seconds_count_overlapping_attempts_once():
    from data_juicer_elastic.report.collect import Attempt
    from data_juicer_elastic.report.page import busy_seconds

    def at(start: float, end: float, pid: int) -> Attempt:
        return Attempt("s", 1, "h", pid, start, end, "done")

    # a killed worker's last attempt overlapping its restarted successor's first on the same host
    assert busy_seconds([at(0, 10, 1), at(8, 20, 2), at(30, 35, 2)]) == 25.0
    assert busy_seconds([at(0, 10, 1), at(2, 5, 2)]) == 10.0
