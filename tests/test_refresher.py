"""The lease refresher tells a lost lease (stop, flag it) from a transient error (log once, go on).

It renews through the job dir's store from the version the lease's create handed out: on POSIX (a byte
rewritten in place) and on S3 (an ``If-Match`` PUT, against a moto server).
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import orjson

from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.storage.posix import PosixStore
from data_juicer_elastic.storage.refresher import LeaseRefresher
from data_juicer_elastic.storage.s3 import S3Store
from data_juicer_elastic.storage.settings import StorageSettings
from data_juicer_elastic.storage.store import Store, Ver, store_for
from data_juicer_elastic.worker.loop import run_worker

from .jobs import make_job, wait_for
from .test_store_contract import LEASE, THEIRS, moto_env, s3_store  # noqa: F401 (moto_env: the server, one per module)

TICK = 0.05
KEY = "claims/part-00000@0001"


def _renewed_after(path: Path, mtime_ns: int, timeout: float = 30.0) -> bool:
    """Wait until ``path``'s mtime moves past ``mtime_ns`` (False if it does not within ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.stat(path).st_mtime_ns > mtime_ns:
                return True
        except FileNotFoundError:
            pass
        time.sleep(TICK)
    return False


def _lease(tmp_path: Path) -> tuple[PosixStore, Path, Ver, int]:
    """A lease created through a store: the store, its file, the create's version and the file's mtime."""
    store = PosixStore(tmp_path / "job")
    meta = store.create(KEY, LEASE, exclusive=True)
    assert meta is not None
    path = store.path(KEY)
    return store, path, meta.ver, os.stat(path).st_mtime_ns


def test_a_removed_lease_is_lost_and_not_renewed_again(tmp_path):
    (store, path, ver, mtime), logged = _lease(tmp_path), []
    with LeaseRefresher(store, KEY, ver, TICK, log=logged.append) as lease:
        assert _renewed_after(path, mtime), "the refresher never renewed the lease"
        os.unlink(path)
        assert lease.lost.wait(30), "a removed lease was not reported lost"
        path.write_bytes(LEASE)
        os.utime(path, (1000, 1000))
        assert not _renewed_after(path, 1000 * 10**9, timeout=10 * TICK), "a lost lease was renewed"
    assert any("lease lost" in line for line in logged)


def test_a_lease_replaced_by_other_bytes_is_lost(tmp_path):
    store, path, ver, mtime = _lease(tmp_path)
    with LeaseRefresher(store, KEY, ver, TICK) as lease:
        assert _renewed_after(path, mtime)
        tmp = tmp_path / "other"
        tmp.write_bytes(THEIRS)
        os.replace(tmp, path)
        assert lease.lost.wait(30), "a replaced lease was not reported lost"
    assert path.read_bytes() == THEIRS


def test_a_superseded_lease_is_lost(tmp_path):
    (store, _, ver, _), superseded = _lease(tmp_path), threading.Event()
    with LeaseRefresher(store, KEY, ver, TICK, still_ours=lambda: not superseded.is_set()) as lease:
        superseded.set()
        assert lease.lost.wait(30)


def test_a_transient_error_is_logged_once_and_renewal_goes_on(tmp_path):
    """A directory where the lease was makes every renewal fail with an OSError that is not "gone"."""
    (store, path, ver, mtime), logged = _lease(tmp_path), []
    aside = tmp_path / "aside"
    with LeaseRefresher(store, KEY, ver, TICK, log=logged.append) as lease:
        assert _renewed_after(path, mtime)
        os.rename(path, aside)
        path.mkdir()
        deadline = time.monotonic() + 30
        while not logged and time.monotonic() < deadline:
            time.sleep(TICK)
        time.sleep(10 * TICK)  # several more failing ticks
        path.rmdir()
        beaten = os.stat(aside).st_mtime_ns
        os.rename(aside, path)  # the same file back: its bytes, inode and mtime are the last beat's
        assert _renewed_after(path, beaten), "renewal did not resume after the transient error"
        assert not lease.lost.is_set()
    assert len(logged) == 1 and "cannot renew the lease" in logged[0], logged


def test_a_lease_copied_to_another_inode_is_still_ours(tmp_path):
    """sshfs may number the same file differently over time: the same bytes under a new inode are renewed."""
    store, path, ver, mtime = _lease(tmp_path)
    with LeaseRefresher(store, KEY, ver, TICK) as lease:
        assert _renewed_after(path, mtime)
        copy = tmp_path / "copy"
        shutil.copy2(path, copy)  # its bytes and mtime, another inode
        before = os.stat(copy)
        os.replace(copy, path)
        assert _renewed_after(path, before.st_mtime_ns), "a lease under a new inode was not renewed"
        assert not lease.lost.is_set() and os.stat(path).st_ino == before.st_ino
    assert path.read_bytes() == LEASE


def _beats(store: Store) -> int:
    """How many beats the S3 lease's body counts (``S3Store.renew`` adds one per renewal)."""
    got = store.read(KEY)
    return 0 if got is None else int(orjson.loads(got[0]).get("beat", 0))


def test_a_lease_on_s3_is_renewed_then_lost_once_another_holder_replaces_it(moto_env, monkeypatch):  # noqa: F811
    """Each tick is one ``If-Match`` PUT from the version the last one handed back; another holder's lease
    put over it moves the ETag, so the next renewal is refused: lost, and their lease is left as it is."""
    store = s3_store(monkeypatch, moto_env)
    meta = store.create(KEY, LEASE, exclusive=True)
    assert meta is not None
    lost = threading.Event()
    with LeaseRefresher(store, KEY, meta.ver, TICK, on_lost=lost.set) as lease:
        wait_for(lambda: _beats(store) >= 2, "two renewals of the S3 lease")
        assert not lease.lost.is_set()
        other = store_for(store.url)  # another holder's store on the same job dir
        assert other.replace(KEY, THEIRS) is not None
        assert lease.lost.wait(30), "a lease replaced on S3 was not reported lost"
    assert lost.is_set() and store.read(KEY)[0] == THEIRS  # not written back over theirs


def test_an_s3_endpoint_that_stops_answering_is_a_transient_error(moto_env, monkeypatch):  # noqa: F811
    """botocore's errors (here: no connection, once its retries are spent) are logged once and retried, as a
    flaky mount's OSError is: the refresher's thread goes on and the lease is not called lost."""
    store = s3_store(monkeypatch, moto_env)
    meta = store.create(KEY, LEASE, exclusive=True)
    assert meta is not None
    with socket.socket() as sock:  # a port nobody listens on: connections are refused at once
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    unreachable = S3Store(store.bucket, store.prefix, StorageSettings(endpoint_url=dead))  # type: ignore[attr-defined]
    unreachable.client.meta.events.register("needs-retry.s3", lambda **kwargs: None)  # fail fast: no backoff
    logged: list[str] = []
    with LeaseRefresher(unreachable, KEY, meta.ver, TICK, log=logged.append) as lease:
        wait_for(lambda: bool(logged), "the failed renewal logged")
        time.sleep(10 * TICK)  # several more failing ticks
        assert lease._thread.is_alive() and not lease.lost.is_set()
    assert len(logged) == 1 and "cannot renew the lease" in logged[0], logged


def test_a_worker_whose_lease_file_vanishes_does_not_publish(tmp_path):
    """Another claim of the same attempt number could exist once the lease is gone: no done record."""
    job = make_job(tmp_path, rows=10, shards=1, lock_timeout_secs=3.0, heartbeat_secs=0.1)
    sid = "part-00000-of-00001"
    lost = threading.Event()

    def log(line: str) -> None:
        if "lease lost" in line:
            lost.set()

    def remove_lease_then_copy(shard_path: str, output_path: str, job_dir: str) -> None:
        os.unlink(ClaimStore(job, lock_timeout=3.0, host="x").lease_path(sid, 1))
        assert lost.wait(30), "the heartbeat never noticed its lease file was removed"
        with open(shard_path, "rb") as src, open(output_path, "wb") as out:
            out.write(src.read())

    result = run_worker(job.root, remove_lease_then_copy, claim_limit=1, log=log)
    assert result.exit_code == 0 and result.completed == []
    assert not job.done_path(sid).exists()
    info = orjson.loads((job.attempt_dir(sid, 1) / "attempt.json").read_bytes())
    assert info["outcome"] == "superseded"
