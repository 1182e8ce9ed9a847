"""``dj-elastic retry`` racing the processes that decide a job's end (issue 43, holes 1 and 5).

Each race is forced, not waited for: the racing process's step runs at the exact point of the retry (a
wrapper around ``retry._archive`` runs it first, as tests/chaos/killpoint.py dies at a point), or a
snapshot written before the retry is read after it, within the refresh interval the policy sets.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from data_juicer_elastic.cli import main as cli_main
from data_juicer_elastic.job.claims import claim_store
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records import retry as retry_mod
from data_juicer_elastic.merge import verify
from data_juicer_elastic.worker.loop import run_worker
from data_juicer_elastic.worker.sweep import SnapshotCache

from .jobs import attempt_outcomes, make_job, spawn_worker
from .runners import copy
from .test_jobdir_s3 import mirror
from .test_store_contract import moto_env  # noqa: F401 (the server, one per module)

LONG = 3600.0  # a refresh interval no test outlives: a snapshot read is never rebuilt for its age


def _finished_job(tmp_path: Path, where: str, request: pytest.FixtureRequest, monkeypatch) -> JobDir:
    local = make_job(tmp_path, rows=30, shards=3)
    job = local
    if where == "s3":
        url, _ = mirror(local, monkeypatch, request.getfixturevalue("moto_env"))
        job = JobDir(url)
    result = run_worker(job, copy, host="node-a", log=lambda *_: None)
    assert result.exit_code == 0 and result.job_complete
    return JobDir(job.root)


def _cache(job: JobDir, host: str) -> SnapshotCache:
    """A process's own view of the snapshot (a fresh JobDir and lease store: nothing shared in memory)."""
    fresh = JobDir(job.root)
    return SnapshotCache(fresh, claim_store(fresh, host), LONG)


@pytest.mark.parametrize("where", ["posix", "s3"])
def test_a_completion_confirmed_while_retry_archives_is_not_trusted_after_it(
    tmp_path: Path, where: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
):
    """Hole 1: a process confirms "complete" after the retry record is written, before the done record is
    archived; once the retry returns, no process may take the job for complete on that confirmation."""
    job = _finished_job(tmp_path, where, request, monkeypatch)
    sid = job.manifest().shards.ids()[1]
    store = claim_store(job, "node-a")
    assert SnapshotCache(job, store, LONG).refresh(newer_than=store.now()).complete  # a snapshot: complete
    archive, confirmed = retry_mod._archive, []

    def confirm_then_archive(j: JobDir, key: str, name: str, *lock) -> None:
        if key == j.done_key(sid):  # the retry record is written; the done record still stands
            confirmed.append(_cache(job, "confirmer").get().complete)
        archive(j, key, name, *lock)

    monkeypatch.setattr(retry_mod, "_archive", confirm_then_archive)
    assert retry_mod.requeue(JobDir(job.root), [sid]) == [sid]
    monkeypatch.setattr(retry_mod, "_archive", archive)
    assert confirmed == [True]  # it listed while the done record stood: complete, for that moment
    assert not _cache(job, "later").get().complete, "a process started after the retry trusts a stale marker"
    result = run_worker(JobDir(job.root), copy, host="node-b", log=lambda *_: None)
    assert result.exit_code == 0 and result.completed == [sid], result
    assert verify(JobDir(job.root)).ok


def test_a_failure_snapshot_written_before_retry_does_not_end_the_next_worker(tmp_path: Path):
    """Hole 5: the snapshot that says "failed" was built before ``retry --all-failed`` and is read after it
    (within the refresh interval); the next worker runs the shard to done and must exit 0, not 2."""
    job = make_job(tmp_path, rows=10, shards=1, max_retries=1, poll_interval_secs=60.0)  # fresh for a minute
    sid = "part-00000-of-00001"
    failing = spawn_worker(job, "fail", log=tmp_path / "w1.log", DJE_TEST_FAIL_SHARDS=sid)
    assert failing.wait(timeout=120) == 2
    store = claim_store(job, "status")
    before = SnapshotCache(job, store, LONG).refresh(newer_than=store.now())
    assert before.failed == [sid] and (sid, 2) in before.claimable, before  # what the next worker reads
    assert cli_main(["retry", "--job-dir", str(job.root), "--all-failed"]) == 0
    worker = spawn_worker(job, "copy", log=tmp_path / "w2.log")
    assert worker.wait(timeout=120) == 0, "the next worker ended on the failure the retry archived"
    assert attempt_outcomes(job)[sid] == ["failed", "failed", "done"]
    assert cli_main(["verify", "--job-dir", str(job.root)]) == 0
