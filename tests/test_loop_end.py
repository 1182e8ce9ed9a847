"""The one worker loop: the job ends with its last shard, shards are timed from their processing, a stop
lands only on the attempt it was meant for, and a lease that lapsed never publishes."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import orjson
import pytest

from data_juicer_elastic.job.records.done import load_done
from data_juicer_elastic.job.records.workers import read_workers
from data_juicer_elastic.worker.fencing import FENCE_SIGNAL, Fenced, RunnerStopper
from data_juicer_elastic.worker.loop import Worker, run_worker

from .jobs import attempt_outcomes, make_job, spawn_worker, wait_for
from .runners import copy


def _sleepy(seconds: float):
    def run(shard_path: str, output_path: str, job_dir: str) -> None:
        time.sleep(seconds)
        copy(shard_path, output_path, job_dir)

    return run


@pytest.mark.parametrize("prefetch", [0, 1])
def test_the_loop_ends_with_its_last_shard_not_a_poll_later(tmp_path, prefetch):
    """A long poll interval: the worker that publishes the last shard ends without waiting for it, and never
    names a shard it published itself as one it waits for."""
    job = make_job(tmp_path, rows=40, shards=4, poll_interval_secs=30.0)
    lines: list[str] = []
    started = time.monotonic()
    result = run_worker(job.root, _sleepy(0.2), prefetch=prefetch, log=lines.append)
    assert result.exit_code == 0 and result.message == "all 4 shards done"
    assert not [line for line in lines if line.startswith("waiting for")], lines
    assert time.monotonic() - started < 30.0  # a poll interval: the wait this test exists to rule out


def test_a_prefetching_worker_times_each_shard_from_its_processing(tmp_path):
    """Claimed ahead, a shard waits behind the one running: its done record's time starts when it is
    processed, so one worker's shards never overlap in time (they were timed from the claim before)."""
    job = make_job(tmp_path, rows=40, shards=4)
    lines: list[str] = []
    assert run_worker(job.root, _sleepy(0.5), prefetch=1, log=lines.append).exit_code == 0
    spans = sorted((r.started_at, r.finished_at) for r in (load_done(job, s.id) for s in job.manifest().shards))
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 0.05, spans
    done = [line for line in lines if line.startswith("done ")]
    assert len(done) == 4 and all(" in 0." in line for line in done), done  # 0.5 s shards, not 1.0 s


def test_a_stop_fired_for_one_attempt_never_lands_on_the_next():
    """The heartbeat of attempt A fires just as the main thread moves on to attempt B: B is not stopped."""
    a, b = object(), object()
    with RunnerStopper() as stopper:
        stopper.arm(a)
        stopper.disarm()
        stopper.arm(b)
        stopper.fire(a)  # sent too late: B runs now
        time.sleep(0.05)
        stopper.disarm()

        stopper.arm(a)
        stopper._target = a  # a fire for A in flight: the signal is on its way ...
        stopper.disarm()
        stopper.arm(b)  # ... and lands once B runs
        signal.pthread_kill(threading.main_thread().ident, FENCE_SIGNAL)
        time.sleep(0.05)
        stopper.disarm()

        stopper.arm(b)
        with pytest.raises(Fenced):
            stopper.fire(b)  # meant for B while B runs: stops it
            time.sleep(1)
        stopper.disarm()


def test_an_attempt_whose_lease_lapsed_does_not_publish(tmp_path):
    """A worker frozen past the lock timeout mid-shard (nobody took the lease over meanwhile) resumes and
    finishes its runner, but does not publish: another worker could have taken the stale lease just then.
    The shard is released and done again by a later attempt."""
    job = make_job(tmp_path, rows=10, shards=1, lock_timeout_secs=2.0, heartbeat_secs=0.2)
    sid = "part-00000-of-00001"
    release = tmp_path / "release"
    log = tmp_path / "worker.log"
    worker = spawn_worker(job, "slow_copy", log=log, DJE_TEST_HOLD=str(release))
    wait_for((job.attempts_dir / sid / "0001" / "started").exists, "attempt 1 started", proc=worker, log=log)
    os.kill(worker.pid, signal.SIGSTOP)
    time.sleep(3.0)  # past lock_timeout_secs: to any other process the lease looked stale
    release.touch()
    os.kill(worker.pid, signal.SIGCONT)
    assert worker.wait(timeout=120) == 0, log.read_text()
    assert attempt_outcomes(job)[sid][0] == "superseded"
    assert orjson.loads(job.done_path(sid).read_bytes())["attempt"] == 2
    assert "lease not renewed for" in log.read_text()


def test_an_idle_claim_loop_that_sees_nothing_move_gives_up_after_the_stall_timeout(tmp_path):
    """The claim loop's own stall bound (wait_for_shards had one, a claim loop none): a scan that keeps
    finding nothing to claim while nothing runs and no shard finishes ends the loop as stalled."""
    from data_juicer_elastic.worker.loop import Worker
    from data_juicer_elastic.worker.sweep import Snapshot

    job = make_job(tmp_path, rows=20, shards=2, poll_interval_secs=0.1)
    worker = Worker(job.root, copy, stall_timeout=1.0, log=lambda *_: None)
    hidden = Snapshot(seq=1, built_at=0.0, total=2, done=0, fresh_left=0)

    def finds_nothing():  # a snapshot that hides the job's two shards, as a bug or a lost record could
        worker.chooser.last = hidden
        return None, False, set()

    worker.chooser.claim_next = finds_nothing
    result = worker.run()
    assert result.stalled and result.exit_code == 1 and "for 1s" in result.message


def test_a_stop_during_the_last_ledger_write_exits_128_plus_n_with_the_ledger_written(tmp_path):
    """CI saw a SIGTERMed worker exit 1 with a traceback: the stop landed in the worker record's write after
    the loop had ended, outside the handling that maps a stop to 128 + N. It is this worker's end now, and
    the record is still written (published counts what it did)."""
    job = make_job(tmp_path, rows=20, shards=2)
    worker = Worker(job.root, copy, log=lambda _line: None)
    flush = worker.store.flush

    def stopped_while_flushing() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs at the next bytecode: inside this call
        flush()

    worker.store.flush = stopped_while_flushing  # called once, after the loop
    result = worker.run()
    assert (result.exit_code, result.message) == (128 + signal.SIGTERM, "interrupted by SIGTERM")
    records, _ = read_workers(job.store, job.key(job.workers_dir))
    assert [r.published for r in records] == [2]
