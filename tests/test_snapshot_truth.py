"""The shared progress snapshot is a cache, never an authority (issue 33): a retry during a run, a late
flush, an old submission's snapshot and a rebuild lost to another process can delay its count, never move
it past the done records."""

from __future__ import annotations

from data_juicer_elastic.job.claims import claim_store
from data_juicer_elastic.job.records.retry import requeue
from data_juicer_elastic.job.records.workers import read_workers
from data_juicer_elastic.worker import sweep
from data_juicer_elastic.worker.loop import Worker, run_worker
from data_juicer_elastic.worker.scan import refresh_interval
from data_juicer_elastic.worker.sweep import SnapshotCache, build

from .jobs import make_job
from .runners import copy


def _quiet(*_: object) -> None:
    pass


def _sweep(job):
    return build(job, claim_store(job, "observer"))


def test_a_retry_during_the_run_then_a_late_flush_never_overcounts(tmp_path):
    """A publishes S and keeps naming (S, 1) (publishing does not rewrite its record); S is retried and B
    redoes everything; A's record is flushed late; then T is retried: T is not done, and a new worker
    redoes exactly T. The count and the rows follow the done records at every step."""
    job = make_job(tmp_path, rows=40, shards=4)
    total_rows = job.manifest().total_rows
    a = Worker(job.root, copy, host="a", log=_quiet)
    lease, _, _ = a.claim_next()
    s = lease.shard
    assert a.run_attempt(lease, final=False) == "done"  # A's record on disk still names (S, 1)

    requeue(job, [s])
    snap = _sweep(job)
    assert snap.done == 0 and snap.input_rows_done == 0

    assert run_worker(job.root, copy, host="b", log=_quiet).exit_code == 0
    snap = _sweep(job)
    assert (snap.done, snap.input_rows_done) == (4, total_rows)

    a.store.flush()  # A leaves: S moves to its record's ``published``
    snap = _sweep(job)
    assert (snap.done, snap.input_rows_done) == (4, total_rows)

    t = next(x.id for x in job.manifest().shards if x.id != s)
    requeue(job, [t])
    snap = _sweep(job)
    assert snap.done == 3 and not snap.complete
    assert snap.input_rows_done == total_rows - job.shard(t).rows

    again = run_worker(job.root, copy, host="c", log=_quiet)
    assert again.exit_code == 0 and again.completed == [t]
    assert _sweep(job).done == 4


def test_an_old_complete_snapshot_is_never_taken_at_its_word(tmp_path):
    """After a retry, a process of the next submission that loses the rebuild reads the last submission's
    snapshot ("complete"): it checks that against the done records and sees the retried shard pending."""
    job = make_job(tmp_path, rows=30, shards=3)
    assert run_worker(job.root, copy, log=_quiet).exit_code == 0
    store = claim_store(job, "next")
    first = SnapshotCache(job, store, refresh_interval(job)).refresh(newer_than=0.0)
    assert first.complete  # the last submission's snapshot, on disk
    sid = job.manifest().shards[1].id
    requeue(job, [sid])
    (job.state_dir / "progress.d").mkdir(exist_ok=True)
    (job.state_dir / "progress.d" / f"{first.seq + 1}").touch()  # another process holds the rebuild

    snap = SnapshotCache(job, store, refresh_interval(job)).get()
    assert not snap.complete and snap.done == 2
    result = run_worker(job.root, copy, host="next", log=_quiet)
    assert result.exit_code == 0 and result.completed == [sid]


def test_a_worker_record_read_as_missing_never_ratchets_the_count(tmp_path):
    """A record read cut or ESTALE while it is replaced adds nothing to that sweep: the count drops (a
    delay), the listing fallback does not take its shards for unaccounted ones, and once the record reads
    again a retried shard still counts as not done."""
    job = make_job(tmp_path, rows=40, shards=4)
    for host in ("a", "b"):
        assert run_worker(job.root, copy, host=host, max_shards=2, log=_quiet).exit_code == 0
    (record,) = [p for p in job.workers_dir.iterdir() if p.name.startswith("a-")]
    whole = record.read_bytes()
    record.write_bytes(whole[: len(whole) // 2])  # what a read through another mount's stale cache returns
    cut = _sweep(job)
    assert cut.done == 2 and cut.legacy_done == 0

    record.write_bytes(whole)
    snap = build(job, claim_store(job, "observer"), cut)
    assert snap.done == 4
    requeue(job, [job.manifest().shards[0].id])
    assert build(job, claim_store(job, "observer"), snap).done == 3


def test_a_lane_hint_written_backwards_never_keeps_fresh_shards_above_zero(tmp_path):
    """A paused worker writes an old lane position after another wrote the lane's end: when the count is
    short and only the hints say work is left, the sweep probes the shard each hint names, walks on past
    claimed ones and writes the hint back, so the listing fallback is not gated for good on fresh shards
    that do not exist."""
    import shutil

    from data_juicer_elastic.worker.lanes import read_hint, write_hint

    job = make_job(tmp_path, rows=64, shards=32)  # two lanes of 16
    assert run_worker(job.root, copy, log=_quiet).exit_code == 0
    shutil.rmtree(job.workers_dir)  # the records lost: only the listing can count the done shards
    write_hint(job, 0, 3)
    (job.lanes_dir / "0.tail").unlink(missing_ok=True)  # a guest's tail would say the lane is exhausted
    snap = _sweep(job)
    assert snap.fresh_left == 0 and snap.done == 32 and snap.exact
    assert read_hint(job, 0) == 16


def test_status_does_not_count_a_lease_given_back_on_purpose_as_lost(tmp_path):
    """A claim that found its shard done just then, or one made ahead by a worker that stopped, releases its
    lease without an attempt record: given back, not lost to a killed process."""
    from data_juicer_elastic.status import job_status

    job = make_job(tmp_path, rows=20, shards=2)
    sid = job.manifest().shards[0].id
    store = claim_store(job, "quitter")
    lease = store.try_claim(sid, 0)
    store.release(lease)
    store.ledger.drop(sid, lease.attempt)
    assert run_worker(job.root, copy, log=_quiet).exit_code == 0
    shard = next(s for s in job_status(job, details=True).shards if s.id == sid)
    assert shard.attempts == 2 and shard.lost == 0


def test_a_record_read_just_before_its_last_claim_is_read_again_before_anything_is_listed(tmp_path, monkeypatch):
    """The sweep read a worker's record, then that worker claimed and published the last shard before the
    probes: the job looked unfinished and quiet, and a clean job listed ``state/done`` and ``state/claims``.
    It reads the records once more first; the listing stays for what they cannot account for."""
    job = make_job(tmp_path, rows=20, shards=2)
    assert run_worker(job.root, copy, host="a", log=_quiet).exit_code == 0
    reads: list[int] = []

    def stale_first(store, prefix):
        records, unreadable = read_workers(store, prefix)
        reads.append(len(records))
        if len(reads) == 1:  # as read before the worker claimed its last shard
            records[0].published -= 1
        return records, unreadable

    monkeypatch.setattr(sweep, "read_workers", stale_first)
    snap = _sweep(job)
    assert (snap.done, snap.complete, snap.exact) == (2, True, False)
    assert reads == [1, 1]
