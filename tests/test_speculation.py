"""Backup attempts of late shards (speculation), with real worker processes on a real directory.

Hosts are simulated with DJ_ELASTIC_HOSTNAME; ``tests.runners:straggler`` makes a host slow on
purpose. Speculation is made eager (half the shards done, 0.5 s minimum) so the tests stay short,
and tolerant (multiplier 3) so a busy test machine's timing noise does not make a fast host look slow.

A test that checks that nothing was backed up waits for a worker's own report that it looked and found
nothing to claim (its "waiting for ..." line, logged after a whole scan), never for a fixed time, and
makes sure the shard was late enough to be backed up before that scan began.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.cli import main as cli_main
from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.status import job_status
from data_juicer_elastic.worker.budget import failure_count

from .cluster import Cluster, done_hosts, finish
from .jobs import (
    attempt_outcomes,
    check_done_exactly_once,
    kill_group,
    make_job,
    merge_and_check,
    spawn_worker,
    started_shard,
    wait_for,
)

EAGER = ("--speculation-min-secs", "0.5", "--speculation-quantile", "0.5", "--speculation-multiplier", "3")


def info(job: JobDir, sid: str, attempt: int) -> dict:
    return orjson.loads((job.attempt_dir(sid, attempt) / "attempt.json").read_bytes())


def log_of(job: JobDir, host: str) -> Path:
    return job.root.parent / f"{host}.log"


def scanned_and_waited(job: JobDir, host: str) -> bool:
    """``host``'s worker ended a whole scan with nothing to claim or back up (it logs which leases it waits on),
    or it backed a shard up (which the caller's check then reports)."""
    log = log_of(job, host)
    text = log.read_text() if log.exists() else ""
    return "waiting for 1 shard(s) leased by other workers" in text or "backing up " in text


def running_for(job: JobDir, sid: str, attempt: int, secs: float) -> bool:
    """Attempt ``attempt`` of ``sid`` has been claimed for ``secs`` by the shared filesystem's clock."""
    store = ClaimStore(job, lock_timeout=3.0, host="test")
    return store.now() - info(job, sid, attempt)["claimed_at"] >= secs


def worker(job: JobDir, host: str, *extra: str, **env: str):
    # One shard held per host at a time (no prefetch): these tests count on the slow host holding only
    # the shard it runs. tests/test_prefetch.py covers prefetching workers.
    return spawn_worker(
        job,
        "straggler",
        *EAGER,
        "--prefetch-shards",
        "0",
        *extra,
        log=log_of(job, host),
        DJ_ELASTIC_HOSTNAME=host,
        **env,
    )


def test_backup_on_a_fast_host_wins_and_the_slow_original_is_refused(tmp_path):
    job = make_job(tmp_path, rows=40, shards=4)
    slow = worker(job, "slow", DJE_TEST_SLOW_HOSTS="slow", DJE_TEST_UNTIL_DONE="1")
    fast = None
    try:
        sid = started_shard(job)  # the slow host holds this shard until someone else finishes it
        fast = worker(job, "fast", DJE_TEST_SLOW_HOSTS="slow")
        assert fast.wait(timeout=60) == 0
        assert slow.wait(timeout=60) == 0  # it finishes just after the winner, cannot publish, and exits
    finally:
        for p in (slow, fast):
            if p is not None:
                kill_group(p)
    outcomes = attempt_outcomes(job)
    assert outcomes[sid] == ["lost-race", "done"]
    assert all(o == ["done"] for s, o in outcomes.items() if s != sid)
    record = orjson.loads(job.done_path(sid).read_bytes())
    assert (record["attempt"], record["host"], record["backup"]) == (2, "fast", True)
    assert info(job, sid, 1)["backup"] is False and "attempt 2 published done first" in info(job, sid, 1)["error"]
    assert (info(job, sid, 2)["backup"], info(job, sid, 2)["backup_of"]) == (True, 1)
    assert failure_count(job, sid, 2) == 0
    assert check_done_exactly_once(job)[sid] == 2
    merge_and_check(job, tmp_path / "merged.jsonl")  # every row once: the loser's output is not merged
    status = {s.id: s for s in job_status(job).shards}
    assert status[sid].backup == {"won": 2} and status[sid].host == "fast"


def test_original_and_backup_killed_in_turn_then_a_third_attempt_finishes(tmp_path):
    # max_retries 1: the lost original is one failure; had the lost backup counted, the shard would fail
    job = make_job(tmp_path, rows=40, shards=4, max_retries=1, lock_timeout_secs=2.0, heartbeat_secs=0.3)
    slow = worker(job, "slow", DJE_TEST_SLOW_HOSTS="slow")
    fast = idle = None
    try:
        sid = started_shard(job)
        fast = worker(job, "fast", DJE_TEST_SLOW_BACKUPS="1")  # its backup straggles too
        wait_for((job.attempt_dir(sid, 2) / "started").exists, timeout=60)
        kill_group(slow, signal.SIGKILL)
        store = ClaimStore(job, lock_timeout=2.0, host="test")
        wait_for(lambda: not store.is_live(sid, 1, store.now()), timeout=30)
        # a worker that scans with the original stale and its backup live: nothing to claim, it waits
        idle = worker(job, "idle")
        wait_for(lambda: scanned_and_waited(job, "idle"), "the idle worker's first scan", timeout=60)
        assert store.latest_attempts()[sid] == 2, "a dead original was taken over while its backup lived"
        assert "status" and job_status(job).shards[int(sid[5:10])].backup["original_live"] is False
        kill_group(fast, signal.SIGKILL)
        assert idle.wait(timeout=60) == 0
    finally:
        for p in (slow, fast, idle):
            if p is not None:
                kill_group(p, signal.SIGKILL)
    assert attempt_outcomes(job)[sid] == ["running", "running", "done"]
    assert info(job, sid, 2)["backup"] is True and info(job, sid, 3)["backup"] is False
    assert failure_count(job, sid, 2) == 1  # the lost original only
    backup_last_beat = os.stat(job.claims_dir / f"{sid}@0002").st_mtime
    assert info(job, sid, 3)["claimed_at"] >= backup_last_beat + 2.0 - 1.0, "taken over before the backup aged out"
    assert check_done_exactly_once(job)[sid] == 3
    merge_and_check(job, tmp_path / "merged.jsonl")


def test_a_backup_that_straggles_too_loses_to_the_original_and_is_stopped(tmp_path, capsys):
    job = make_job(tmp_path, rows=50, shards=5)
    gate = tmp_path / "gate"
    slow = worker(job, "slow", DJE_TEST_SLOW_HOSTS="slow", DJE_TEST_GATE=str(gate))
    fast = idle = None
    try:
        sid = started_shard(job)
        fast = worker(job, "fast", DJE_TEST_SLOW_BACKUPS="1")  # the backup sleeps 600 s unless stopped
        wait_for((job.attempt_dir(sid, 2) / "started").exists, timeout=60)
        # both attempts late (past the 0.5 s minimum and 3x a 0.2 s shard) before a third worker scans
        wait_for(lambda: running_for(job, sid, 2, 1.5), "the backup to run late", timeout=60)
        idle = worker(job, "idle", DJE_TEST_SLOW_BACKUPS="1")
        wait_for(lambda: scanned_and_waited(job, "idle"), "the idle worker's first scan", timeout=60)
        assert ClaimStore(job, lock_timeout=3.0, host="t").latest_attempts()[sid] == 2, "a second backup"
        assert cli_main(["status", "--job-dir", str(job.root)]) == 1
        shown = capsys.readouterr().out
        assert f"backup: {sid} attempt 2 on host=fast backs up attempt 1 on host=slow (live), original running" in shown
        gate.touch()  # the original finishes first
        assert [p.wait(timeout=60) for p in (slow, fast, idle)] == [0, 0, 0]  # the backup's runner was stopped
    finally:
        gate.touch()
        for p in (slow, fast, idle):
            if p is not None:
                kill_group(p, signal.SIGKILL)
    assert attempt_outcomes(job)[sid] == ["done", "lost-race"]
    record = orjson.loads(job.done_path(sid).read_bytes())
    assert (record["attempt"], record["host"], record["backup"]) == (1, "slow", False)
    assert not (job.attempt_dir(sid, 2) / "processed.jsonl").exists()  # stopped before it wrote anything
    merge_and_check(job, tmp_path / "merged.jsonl")


def test_speculation_off_never_backs_up(tmp_path):
    job = make_job(tmp_path, rows=40, shards=4)
    gate = tmp_path / "gate"
    slow = worker(job, "slow", DJE_TEST_SLOW_HOSTS="slow", DJE_TEST_GATE=str(gate))
    fast = None
    try:
        sid = started_shard(job)
        # late before the other worker's first idle scan: with speculation on, that scan backs it up
        wait_for(lambda: running_for(job, sid, 1, 1.5), "the original to run late", timeout=60)
        fast = worker(job, "fast", "--no-speculation")
        wait_for(lambda: scanned_and_waited(job, "fast"), "the fast worker's first idle scan", timeout=60)
        assert len(job.done_ids()) == 3
        assert ClaimStore(job, lock_timeout=3.0, host="t").latest_attempts()[sid] == 1
        gate.touch()
        assert [p.wait(timeout=60) for p in (slow, fast)] == [0, 0]
    finally:
        gate.touch()
        for p in (slow, fast):
            if p is not None:
                kill_group(p, signal.SIGKILL)
    assert attempt_outcomes(job)[sid] == ["done"]


def test_a_late_shard_is_never_backed_up_on_its_own_host(tmp_path):
    """A fast worker on the slow worker's host leaves its late shard alone; one on another host backs it up."""
    job = make_job(tmp_path, rows=40, shards=4)
    slow = worker(job, "slow", DJE_TEST_SLOW_HOSTS="slow", DJE_TEST_UNTIL_DONE="1")
    neighbour = other = None
    try:
        sid = started_shard(job)
        wait_for(lambda: running_for(job, sid, 1, 1.5), "the original to run late", timeout=60)
        neighbour = spawn_worker(  # the same host, not slow itself: it does the other three shards
            job, "straggler", *EAGER, "--prefetch-shards", "0", log=log_of(job, "neighbour"), DJ_ELASTIC_HOSTNAME="slow"
        )
        wait_for(lambda: scanned_and_waited(job, "neighbour"), "the neighbour's first idle scan", timeout=60)
        assert len(job.done_ids()) == 3
        assert ClaimStore(job, lock_timeout=3.0, host="t").latest_attempts()[sid] == 1, "backed up on its own host"
        other = worker(job, "other")  # the same late shard, seen from another host: backed up
        assert [p.wait(timeout=60) for p in (other, slow, neighbour)] == [0, 0, 0]
    finally:
        for p in (slow, neighbour, other):
            if p is not None:
                kill_group(p, signal.SIGKILL)
    assert attempt_outcomes(job)[sid] == ["lost-race", "done"]
    assert (info(job, sid, 2)["backup"], info(job, sid, 2)["host"]) == (True, "other")
    merge_and_check(job, tmp_path / "merged.jsonl")


@pytest.mark.timeout(180)
def test_speculation_with_require_all_nodes_keeps_each_host_within_its_share(tmp_path):
    # 3 shards over 2 required nodes: each host completes at most 2, so both must take part
    c = Cluster(tmp_path, rows=30, shards=3)
    args = (
        "--nodes",
        "2",
        "--strict",
        "--runner",
        "straggler",
        "--speculation-min-secs",
        "0.5",
        "--wait-timeout",
        "60",
    )
    env = {"DJE_TEST_SLOW_HOSTS": "slow", "DJE_TEST_SLOW_AFTER": "1", "DJE_TEST_UNTIL_DONE": "1"}
    slow = c.start_one("slow", *args, **env)
    nodes = [slow]
    try:
        wait_for(lambda: c.job.attempts_dir.exists() and len(c.job.done_ids()) == 1, timeout=120)
        sid = started_shard(c.job)  # its second shard: it straggles until another host finishes it
        nodes.append(c.start_one("fast", *args, **env))
        assert finish(nodes, timeout=120) == [0, 0], [n.output for n in nodes]
    finally:
        for n in nodes:
            kill_group(n.proc, signal.SIGKILL)
    assert done_hosts(c.job) == {"slow": 1, "fast": 2}
    assert attempt_outcomes(c.job)[sid] == ["lost-race", "done"]
    assert orjson.loads(c.job.done_path(sid).read_bytes())["backup"] is True
    assert all("PASS: 3 shards completed by 2 host(s)" in n.output.strip().splitlines()[-1] for n in nodes)
