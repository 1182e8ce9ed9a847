"""The worker records and the sweep's rebuild tickets on either store (docs/OBJECT_STORE.md section 6, step 3).

``write_worker``, ``read_workers`` and ``WorkerLedger`` take the job's store and the workers folder's key, and
the sweep's ``progress.d`` tickets are created and deleted through it: each test runs on a ``PosixStore`` and on
an ``S3Store`` against a real moto server in its own process (tests/s3server.py).
"""

from __future__ import annotations

from pathlib import Path

from data_juicer_elastic.job.claims import claim_store
from data_juicer_elastic.job.records.workers import WorkerLedger, WorkerRecord, read_workers, write_worker
from data_juicer_elastic.storage.store import Store
from data_juicer_elastic.worker.sweep import Snapshot, SnapshotCache
from tests.jobs import make_job
from tests.test_store_contract import moto_env, store  # noqa: F401 (fixtures: the server, both stores)

WORKERS = "state/workers"
SID = "part-00000-of-00002"


def test_a_ledger_writes_its_record_whole_and_read_workers_sums_it(store: Store):  # noqa: F811
    ledger = WorkerLedger(store, WORKERS, "node-a", 41, "abcd")
    ledger.hold(SID, 1)
    ledger.published(SID, 1, 2, 2, 0, 10, 1.0, 2.0)
    ledger.flush()
    records, unreadable = read_workers(store, WORKERS)
    assert unreadable == 0 and [(r.worker, r.pairs, r.published, r.output_rows) for r in records] == [
        (ledger.worker, [], 1, 2)
    ]
    got = store.read(f"{WORKERS}/{ledger.worker}.json")
    assert got is not None and got[0] == ledger.record.to_bytes()  # the bytes the previous version wrote


def test_what_is_not_a_record_is_counted_unreadable_and_other_names_are_not_listed(store: Store):  # noqa: F811
    write_worker(store, WORKERS, WorkerRecord(worker="good", host="h", pid=1, published=3))
    store.replace(f"{WORKERS}/cut.json", b'{"worker": "cu')
    store.replace(f"{WORKERS}/notes.txt", b"not a record")
    store.replace("state/elsewhere.json", WorkerRecord(worker="out", host="h", pid=2).to_bytes())
    records, unreadable = read_workers(store, WORKERS)
    assert [r.worker for r in records] == ["good"] and unreadable == 1
    assert read_workers(store, "state/none") == ([], 0)


def test_one_process_wins_a_rebuild_ticket_and_another_once_it_is_deleted(tmp_path: Path, store: Store):  # noqa: F811
    """The tickets live on the job's store (a missing ``progress.d`` is made by the create on POSIX)."""
    job = make_job(tmp_path / "src", rows=4, shards=2)
    job._store = store  # the job's store is where its tickets go
    first, second = (SnapshotCache(job, claim_store(job, host), 1.0) for host in ("a", "b"))
    ticket = job.key(job.state_dir / "progress.d" / "7")
    assert store.head(ticket) is None
    assert first._won("7") and not second._won("7") and not first._won("7")
    assert store.head(ticket) is not None
    assert store.delete(ticket) and second._won("7")


class _WriteFirst:
    """The job's store, but another process's snapshot lands at ``key`` just before this one's first write."""

    def __init__(self, inner: Store, key: str, theirs: bytes) -> None:
        self._store, self._key, self._theirs = inner, key, theirs

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def replace(self, key: str, data: bytes, *args, **kwargs):
        self._land(key)
        return self._store.replace(key, data, *args, **kwargs)

    def create(self, key: str, data: bytes, *args, **kwargs):
        self._land(key)
        return self._store.create(key, data, *args, **kwargs)

    def _land(self, key: str) -> None:
        if key == self._key and self._theirs:
            theirs, self._theirs = self._theirs, b""
            assert self._store.replace(key, theirs) is not None


def test_a_snapshot_write_never_puts_an_older_one_over_a_newer(tmp_path: Path, store: Store):  # noqa: F811
    """``progress.json`` is replaced only in the version read: a rebuilder that read seq 1 and is about to write
    seq 2 loses to a seq 3 that landed in between (it reads again and yields), on either store."""
    job = make_job(tmp_path / "src", rows=4, shards=2)
    job._store = store
    cache = SnapshotCache(job, claim_store(job, "a"), 1.0)
    key = job.key(job.progress_path)
    assert store.replace(key, Snapshot(seq=1, built_at=1.0, total=2, done=0, fresh_left=2).to_bytes())
    newer = Snapshot(seq=3, built_at=3.0, total=2, done=1, fresh_left=1).to_bytes()
    job._store = _WriteFirst(store, key, newer)
    cache._write(Snapshot(seq=2, built_at=2.0, total=2, done=0, fresh_left=2))
    got = store.read(key)
    assert got is not None and Snapshot.from_bytes(got[0]).seq == 3, "an older snapshot overwrote a newer one"
