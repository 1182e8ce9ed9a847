"""Issue 43, hole 2: a superseded attempt cannot publish. The done record goes out after one last beat, and
no write of it can land past that beat's lock timeout (``Store.create(deadline=)``), on POSIX and on S3.

Real servers only (moto in its own process, tests/s3server.py); no test times anything: a process frozen
between its last check and its publish is a clock moved forward, as the publish's own check reads it.
"""

from __future__ import annotations

import pytest

from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.attempt import load_attempt
from data_juicer_elastic.storage import files, s3_deadline
from data_juicer_elastic.storage.lapse import lapse_clock
from data_juicer_elastic.worker import attempt as attempt_mod
from data_juicer_elastic.worker.loop import run_worker

from .jobs import make_job
from .runners import copy
from .test_jobdir_s3 import mirror
from .test_lease_holes import moto_env  # noqa: F401  (a fixture: moto in its own process)

pytestmark = pytest.mark.usefixtures("moto_env")


def one_shard_job(tmp_path, monkeypatch, env, backend: str) -> JobDir:
    local = make_job(tmp_path, rows=4, shards=1, max_retries=0)  # a 3 s lock timeout
    return local if backend == "posix" else JobDir(mirror(local, monkeypatch, env)[0])


@pytest.mark.parametrize("backend", ["posix", "s3"])
def test_a_publish_frozen_past_its_lease_deadline_does_not_land(tmp_path, moto_env, monkeypatch, backend):  # noqa: F811
    """Frozen for a minute after its last check (a suspended VM, a stalled thread): by then another
    process may have taken the lease over, so the done record is not written and the attempt fails.
    Before: it was published whatever the time (``finish`` checked, then wrote)."""
    job = one_shard_job(tmp_path, monkeypatch, moto_env, backend)
    frozen = lambda: lapse_clock() + 60.0  # noqa: E731
    monkeypatch.setattr(files if backend == "posix" else s3_deadline, "lapse_clock", frozen)
    result = run_worker(job, copy, host="node-a", log=lambda *_: None)
    assert result.exit_code == 2 and not result.completed, result
    record = load_attempt(job, job.manifest().shards[0].id, 1)
    assert record is not None and record.outcome == "failed" and "deadline" in (record.error or "")
    assert not job.done_ids()


@pytest.mark.parametrize("backend", ["posix", "s3"])
def test_a_lease_released_after_the_last_tick_is_not_published_under(tmp_path, moto_env, monkeypatch, backend):  # noqa: F811
    """Released (made claimable at once) after the heartbeat stopped and the attempt's checks passed: the
    beat sent right before publishing finds it gone, and the attempt is superseded. Before: published."""
    job = one_shard_job(tmp_path, monkeypatch, moto_env, backend)
    checks = attempt_mod.Attempt._beaten
    calls: list[int] = []

    def then_released(self) -> bool:
        beaten = checks(self)
        calls.append(1)
        if len(calls) == 2:  # finish's check, once its heartbeat stopped (the first: before processing)
            ClaimStore(job, lock_timeout=3.0, host="node-b").release_attempt(self.lease.shard, self.lease.attempt)
        return beaten

    monkeypatch.setattr(attempt_mod.Attempt, "_beaten", then_released)
    run_worker(job, copy, host="node-a", log=lambda *_: None, claim_limit=1)
    assert len(calls) == 2 and not job.done_ids()
    record = load_attempt(job, job.manifest().shards[0].id, 1)
    assert record is not None and record.outcome == "superseded", record
