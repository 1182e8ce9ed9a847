"""Prefetch keeps the protocol: real worker processes, real signals, a runner that sleeps on chosen shards."""

from __future__ import annotations

import os
import signal
import threading
import time

from data_juicer_elastic.errors import PermanentError
from data_juicer_elastic.job.claims import RELEASED_MTIME
from data_juicer_elastic.worker.loop import run_worker
from data_juicer_elastic.worker.signals import Interrupted
from tests.jobs import attempt_outcomes, make_job, spawn_worker, wait_for


def _leases(job) -> list[str]:
    return sorted(os.listdir(job.claims_dir))


def test_sigterm_releases_the_running_and_the_prefetched_lease(tmp_path):
    """While one shard runs, the next is already claimed; SIGTERM ends both as interrupted and frees both."""
    job = make_job(tmp_path, rows=40, shards=4)
    first = job.manifest().shards[0].id
    worker = spawn_worker(job, "slow_copy", "--prefetch-shards", "1", log=tmp_path / "w.log", DJE_TEST_SLEEP="120")
    try:
        wait_for(lambda: len(list(job.attempts_dir.glob("*/*/started"))) == 1, timeout=120)
        wait_for(lambda: len(_leases(job)) == 2, timeout=120)  # the running shard and the one claimed ahead
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        if worker.poll() is None:
            worker.kill()
    leases = _leases(job)
    assert len(leases) == 2, leases
    assert all(os.lstat(job.claims_dir / name).st_mtime <= RELEASED_MTIME for name in leases), "a lease still held"
    outcomes = attempt_outcomes(job)
    assert sorted(v for o in outcomes.values() for v in o) == ["interrupted", "interrupted"], outcomes
    assert not job.done_ids(), first


class _StopInFirstLoad:
    """A staged runner stopped while its first load (which starts Ray in the real runner) runs in the main thread."""

    def load(self, shard: str, output: str, job_dir: str) -> None:
        raise Interrupted(signal.SIGHUP)  # what the guard's handler raises there

    def process(self, loaded: None) -> None:
        raise AssertionError("never reached")

    def finish(self, processed: None) -> None:
        raise AssertionError("never reached")


def test_a_stop_during_the_first_load_releases_its_lease(tmp_path):
    job = make_job(tmp_path, rows=20, shards=2)
    result = run_worker(job.root, _StopInFirstLoad(), prefetch=1, log=lambda *_: None)
    assert result.exit_code == 128 + signal.SIGHUP, result
    leases = _leases(job)
    assert len(leases) == 1 and os.lstat(job.claims_dir / leases[0]).st_mtime <= RELEASED_MTIME, leases
    assert [v for o in attempt_outcomes(job).values() for v in o] == ["interrupted"]


class _FailFirstWhileNextLoads:
    """The first shard fails for good while the next one's load, in the background, is still running."""

    def __init__(self) -> None:
        self.loads_running = 0
        self.loads = 0
        self.lock = threading.Lock()

    def load(self, shard: str, output: str, job_dir: str) -> str:
        with self.lock:
            self.loads_running += 1
            self.loads += 1
            first = self.loads == 1
        try:
            if not first:
                time.sleep(3)  # the real runner reads the shard into Ray here
        finally:
            with self.lock:
                self.loads_running -= 1
        return shard

    def process(self, shard: str) -> None:
        raise PermanentError(f"{shard}: a row every attempt refuses")

    def finish(self, processed: None) -> None:
        raise AssertionError("never reached")


def test_a_worker_ending_lets_background_loads_end_before_its_runner_closes(tmp_path):
    """The runner is closed when the worker returns; a load still in Ray when Ray shut down made Ray end
    dj-process with exit 1 instead of 2."""
    job = make_job(tmp_path, rows=20, shards=2)
    runner = _FailFirstWhileNextLoads()
    result = run_worker(job.root, runner, prefetch=1, log=lambda *_: None)
    assert result.exit_code == 2, result
    assert runner.loads == 2 and runner.loads_running == 0, "the worker returned while a shard was still loading"


def test_max_shards_counts_the_claims_made_ahead(tmp_path):
    """--max-shards 2 with prefetch: two shards done, no third claimed, nothing left held."""
    job = make_job(tmp_path, rows=100, shards=10)
    worker = spawn_worker(job, "copy", "--prefetch-shards", "1", "--max-shards", "2", log=tmp_path / "w.log")
    assert worker.wait(timeout=120) == 0, (tmp_path / "w.log").read_text()
    assert len(job.done_ids()) == 2
    outcomes = attempt_outcomes(job)
    assert sorted(v for o in outcomes.values() for v in o) == ["done", "done"], outcomes


def test_prefetching_workers_finish_a_job_and_publish_each_shard_once(tmp_path):
    """Three prefetching workers race over 30 shards: every shard done once, every attempt ended, no lease held."""
    job = make_job(tmp_path, rows=300, shards=30)
    workers = [spawn_worker(job, "copy", "--prefetch-shards", "2", log=tmp_path / f"w{i}.log") for i in range(3)]
    for i, w in enumerate(workers):
        assert w.wait(timeout=300) == 0, (tmp_path / f"w{i}.log").read_text()
    assert len(job.done_ids()) == 30
    outcomes = attempt_outcomes(job)
    assert all(o[-1] == "done" and "running" not in o for o in outcomes.values()), outcomes
    assert all(
        os.lstat(job.claims_dir / n).st_mtime <= RELEASED_MTIME or n.split("@")[0] in job.done_ids()
        for n in _leases(job)
    )
