"""Tail pacing: the decision itself, and real workers on a real job directory."""

from __future__ import annotations

import threading
import time

import pytest

from data_juicer_elastic.storage.files import read_record
from data_juicer_elastic.worker.loop import Worker
from data_juicer_elastic.worker.pacing import TAIL_LIMIT, BusyWorker, Pace, should_claim

from .jobs import make_job
from .runners import copy


def test_pace_is_the_median_of_finished_attempts():
    pace = Pace()
    assert pace.seconds is None
    for s in (9.0, 1.0, 1.2):  # a slow first shard (warm-up) does not set the pace
        pace.add(s)
    assert pace.seconds == 1.2


@pytest.mark.parametrize(
    "my_pace, busy, free, expected",
    [
        (None, [BusyWorker(0.1, 0.0)], 1, True),  # no pace of its own yet: claims, so one gets measured
        (10.0, [], 3, True),  # nobody else is working
        (10.0, [BusyWorker(1.0, 0.5)], 3, False),  # the busy one finishes all three in 3.5 s, before 10 s
        (10.0, [BusyWorker(1.0, 0.5)], 12, True),  # too many for it alone: this worker gets one
        (1.0, [BusyWorker(10.0, 0.0)], 1, True),  # the busy one is slower
        (10.0, [BusyWorker(1.0, 2.5)], 3, True),  # overdue (past twice its pace): not counted on
        (10.0, [BusyWorker(1.0, 0.0)], TAIL_LIMIT + 1, True),  # far from the tail
    ],
)
def test_should_claim(my_pace, busy, free, expected):
    assert should_claim(my_pace, busy, free) is expected


def _busy_fast_worker(job, pace: float) -> tuple[Worker, threading.Event, threading.Thread]:
    """A worker in the middle of an attempt (its runner waits on an event), with a measured pace."""
    gate = threading.Event()
    started = threading.Event()

    def gated(shard_path: str, output_path: str, job_dir: str) -> None:
        started.set()
        gate.wait(30)
        copy(shard_path, output_path, job_dir)

    fast = Worker(job.root, gated, host="fast", log=lambda *_: None)
    fast.pace.add(pace)
    lease, _, _ = fast.claim_next()
    assert lease is not None
    thread = threading.Thread(target=fast.run_attempt, args=(lease, False))
    thread.start()
    assert started.wait(10)
    return fast, gate, thread


def test_slow_worker_leaves_the_last_shards_to_a_faster_busy_one(tmp_path):
    job = make_job(tmp_path, rows=40, shards=4)
    _fast, gate, thread = _busy_fast_worker(job, pace=5.0)
    try:
        info = read_record(job.attempt_dir(*_only_attempt(job)) / "attempt.json")
        assert info["pace"] == 5.0 and info["claimed_at"] > 0 and info["final"] is False

        slow = Worker(job.root, copy, host="slow", log=lambda *_: None)
        lease, _, _ = slow.claim_next()  # no pace of its own yet: it claims
        assert lease is not None
        slow.store.release(lease)

        slow.pace.add(60.0)  # three free shards: done by the busy worker in <= 20 s, before 60 s
        assert slow.claim_next()[0] is None

        quick = Worker(job.root, copy, host="quick", log=lambda *_: None)
        quick.pace.add(1.0)  # faster than the busy worker: it claims
        assert quick.claim_next()[0] is not None
    finally:
        gate.set()
        thread.join()
    assert slow.claim_next()[0] is not None  # nobody busy is left to count on


def test_an_overdue_busy_worker_is_not_counted_on(tmp_path):
    job = make_job(tmp_path, rows=40, shards=4)
    _fast, gate, thread = _busy_fast_worker(job, pace=0.2)
    try:
        slow = Worker(job.root, copy, host="slow", log=lambda *_: None)
        slow.pace.add(60.0)
        time.sleep(0.5)  # the busy attempt has now run past twice its pace (0.4 s)
        assert slow.claim_next()[0] is not None
    finally:
        gate.set()
        thread.join()


def test_slow_workers_deciding_at_the_tail_together_cost_the_job_one_sweep(tmp_path, monkeypatch):
    """Eight slow workers reach the tail at once, each needing a snapshot built since its last claim: one of
    them sweeps, the others read its result, and all leave the shards to the faster busy worker. Each one
    that lost the rebuild used to sweep for itself (eight sweeps here; 256 at the tail of a 256-worker job)."""
    from data_juicer_elastic.worker import sweep

    job = make_job(tmp_path, rows=40, shards=4)
    _fast, gate, thread = _busy_fast_worker(job, pace=5.0)
    sweeps = []
    real_build = sweep.build

    def counted(*args, **kwargs):
        sweeps.append(1)
        return real_build(*args, **kwargs)

    try:
        slow = [Worker(job.root, copy, host=f"slow-{i}", log=lambda *_: None) for i in range(8)]
        for w in slow:
            w.pace.add(60.0)
        monkeypatch.setattr(sweep, "build", counted)
        start = threading.Barrier(len(slow))
        got = []

        def decide(w: Worker) -> None:
            start.wait()
            got.append(w.claim_next()[0])

        threads = [threading.Thread(target=decide, args=(w,)) for w in slow]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert got == [None] * 8  # three free shards, all left to the busy worker
        assert len(sweeps) <= 3  # the tail decision's rebuild, one for a snapshot gone old, one spare
    finally:
        gate.set()
        thread.join()


def _only_attempt(job) -> tuple[str, int]:
    [shard_dir] = list(job.attempts_dir.iterdir())
    [attempt] = list(shard_dir.iterdir())
    return shard_dir.name, int(attempt.name)
