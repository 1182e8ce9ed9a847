"""`dj-elastic retry` while a run of several hosts is working, then a resubmission after another retry:
every node ends with the job's one outcome, every shard is done once per requeue, and the merged output is
the input (issue 33: a snapshot that believed the job complete used to end the resubmission at once, and
finalize refused it as incomplete on every try)."""

from __future__ import annotations

import time

import orjson

from data_juicer_elastic.cli import main as cli_main

from ..cluster import Cluster, finish
from ..jobs import attempt_outcomes, wait_for

HOSTS = ["node-a", "node-b", "node-c"]


def _done(c: Cluster) -> list[str]:
    return sorted(p.stem for p in c.job.done_dir.glob("*.json")) if c.job.done_dir.exists() else []


def _attempt_of(c: Cluster, sid: str) -> int:
    return orjson.loads(c.job.done_path(sid).read_bytes())["attempt"]


def _claimed_at(c: Cluster, sid: str, attempt: int) -> float:
    return orjson.loads((c.job.attempt_dir(sid, attempt) / "attempt.json").read_bytes())["claimed_at"]


LOCK_TIMEOUT = 60.0  # tests/coord_node.py's default: a requeued shard must not wait for its old lease


def _each_done_once_per_requeue(c: Cluster, retried: set[str]) -> None:
    """Every shard's attempts say done once, twice for a requeued one (its first done record archived)."""
    outcomes = attempt_outcomes(c.job)
    assert sorted(outcomes) == _done(c) and len(outcomes) == 24
    for sid, seen in outcomes.items():
        assert seen.count("done") == 1 + (sid in retried), (sid, seen)


def test_retry_during_a_run_then_retry_and_resubmit(tmp_path):
    c = Cluster(tmp_path, rows=240, shards=24)
    slow = {"DJE_TEST_UNIT": "0.15"}
    nodes = c.start(HOSTS, "--runner", "weighted", **slow)
    try:
        early = wait_for(lambda: _done(c)[:2] if len(_done(c)) >= 4 else None, "four shards done", timeout=240)
        retried_at = time.time()
        for sid in early:
            assert cli_main(["retry", "--job-dir", str(c.job.root), "--shard-id", sid]) == 0
        assert finish(nodes) == [0, 0, 0], [n.output for n in nodes]
    finally:
        finish(nodes, timeout=5)
    assert all(n.last_line().startswith("PASS: 24 shards completed") for n in nodes), [n.last_line() for n in nodes]
    assert not [n for n in nodes if "nothing rewritten" in n.output]  # this run merged: it says so on every node
    assert all(_attempt_of(c, s) == 2 for s in early)  # redone in the same run, once
    assert all(_claimed_at(c, s, 2) - retried_at < LOCK_TIMEOUT / 2 for s in early)  # not after its old lease
    _each_done_once_per_requeue(c, set(early))
    assert c.export.read_bytes() == c.expected()

    late = _done(c)[-1]
    assert cli_main(["retry", "--job-dir", str(c.job.root), "--shard-id", late]) == 0
    again = c.start(HOSTS, "--runner", "weighted", run_id="run-2", **slow)
    assert finish(again, timeout=60) == [0, 0, 0], [n.output for n in again]
    assert all(n.last_line().startswith("PASS: 24 shards completed") for n in again), [n.output for n in again]
    assert not [n for n in again if "nothing rewritten" in n.output]
    assert _attempt_of(c, late) == 2
    _each_done_once_per_requeue(c, {*early, late})
    assert c.export.read_bytes() == c.expected()
