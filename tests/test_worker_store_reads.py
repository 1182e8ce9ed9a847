"""The worker's reads of the job dir through its Store (docs/OBJECT_STORE.md section 6, steps 3 and 5).

The failed watch and the retry stamp ask ``Store.stamp`` and list where a store keeps none (S3); the retry
budget reads a lease's release from ``head``, which never follows a link planted at the lease's name.
"""

from __future__ import annotations

import os
from pathlib import Path

from data_juicer_elastic.job.claims import claim_store
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.failed import FailedRecord, publish_failed
from data_juicer_elastic.storage.posix import RELEASED_MTIME, PosixStore
from data_juicer_elastic.worker.budget import failure_count
from data_juicer_elastic.worker.scan import FailedWatch
from data_juicer_elastic.worker.sweep import retry_stamp

from .jobs import make_job

OLD_NS = 10**9  # a folder mtime far in the past: what a change within one timestamp tick would leave


class NoStamp(PosixStore):
    """A POSIX job dir read as a store that keeps no folder stamp (as S3 keeps none)."""

    def stamp(self, prefix: str) -> str | None:
        return None


def _without_stamps(job: JobDir) -> JobDir:
    job._store = NoStamp(job.root)
    return job


def _fail(job: JobDir, sid: str) -> None:
    publish_failed(job, FailedRecord(sid, 1, "h", 1, "boom", "log", 1, 0.0))
    os.utime(job.failed_dir, ns=(OLD_NS, OLD_NS))  # the folder's mtime as the watch last saw it


def test_failed_watch_lists_at_most_once_a_poll_interval_on_a_store_without_stamps(tmp_path: Path):
    job = _without_stamps(make_job(tmp_path, rows=20, shards=2))
    first, second = job.manifest().shards.ids()
    watch = FailedWatch(job)
    watch.every = 3600.0
    _fail(job, first)
    assert watch.check() == {first}
    _fail(job, second)  # the folder's mtime unchanged: a stamp would not move, the next listing sees it
    assert watch.check() == {first}  # not listed again within the interval
    watch.every = 0.0
    assert watch.check() == {first, second}


def test_failed_watch_lists_only_when_the_folder_stamp_moves(tmp_path: Path):
    job = make_job(tmp_path, rows=20, shards=2)
    first, second = job.manifest().shards.ids()
    watch = FailedWatch(job)
    assert watch.check() == set()
    _fail(job, first)
    assert watch.check() == {first}
    _fail(job, second)  # dated back to the stamp last read: not listed again (one stat per check)
    assert watch.check() == {first}
    os.utime(job.failed_dir)
    assert watch.check() == {first, second}


def test_retry_stamp_on_a_store_without_stamps_digests_the_listing(tmp_path: Path):
    job = _without_stamps(make_job(tmp_path, rows=20, shards=2))
    sid = job.manifest().shards.ids()[0]
    key = job.key(job.retry_path(sid))
    assert retry_stamp(job) == "none"
    job.store.create(key, b'{"after": 1}')
    os.utime(job.retry_dir, ns=(OLD_NS, OLD_NS))
    once = retry_stamp(job)
    assert once != "none"
    job.store.replace(key, b'{"after": 2, "requeued": "again"}')  # requeued again: the record's version moves
    os.utime(job.retry_dir, ns=(OLD_NS, OLD_NS))
    assert retry_stamp(job) not in (once, "none")


def test_a_link_at_a_lease_name_is_never_read_as_released(tmp_path: Path):
    """A link planted where attempt 1's lease would be, to a file dated as a released lease: the link is no
    lease given back, so the attempt that never recorded an outcome counts as lost."""
    job = make_job(tmp_path, rows=20, shards=2)
    sid = job.manifest().shards.ids()[0]
    store = claim_store(job, "planter")
    target = tmp_path / "released-elsewhere"
    target.write_bytes(b"{}")
    os.utime(target, (RELEASED_MTIME, RELEASED_MTIME))
    store.lease_path(sid, 1).parent.mkdir(parents=True, exist_ok=True)
    store.lease_path(sid, 1).symlink_to(target)
    assert failure_count(job, sid, 1) == 1


def test_a_released_lease_is_no_failure(tmp_path: Path):
    job = make_job(tmp_path, rows=20, shards=2)
    sid = job.manifest().shards.ids()[0]
    store = claim_store(job, "quitter")
    lease = store.try_claim(sid, 0)
    assert failure_count(job, sid, 1) == 1  # held, no outcome: lost if its worker is gone
    store.release(lease)
    assert failure_count(job, sid, 1) == 0
