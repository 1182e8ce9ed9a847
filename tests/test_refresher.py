"""The lease refresher tells a lost lease (stop, flag it) from a transient error (log once, go on)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import orjson

from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.storage.refresher import LeaseRefresher
from data_juicer_elastic.worker.loop import run_worker

from .jobs import make_job

TICK = 0.05


def _renewed_after(path: Path, mtime: float, timeout: float = 30.0) -> bool:
    """Wait until ``path``'s mtime moves past ``mtime`` (False if it does not within ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.stat(path).st_mtime > mtime:
                return True
        except FileNotFoundError:
            pass
        time.sleep(TICK)
    return False


def _lease(tmp_path: Path) -> Path:
    path = tmp_path / "lease"
    path.write_bytes(b'{"token": "mine"}\n')
    os.utime(path, (1, 1))
    return path


def test_a_removed_lease_is_lost_and_not_renewed_again(tmp_path):
    path, logged = _lease(tmp_path), []
    with LeaseRefresher(path, TICK, log=logged.append) as lease:
        assert _renewed_after(path, 1), "the refresher never renewed the lease"
        os.unlink(path)
        assert lease.lost.wait(30), "a removed lease was not reported lost"
        path.write_bytes(b'{"token": "mine"}\n')
        os.utime(path, (1, 1))
        assert not _renewed_after(path, 1, timeout=10 * TICK), "a lost lease was renewed"
    assert any("lease lost" in line for line in logged)


def test_a_lease_replaced_by_other_bytes_is_lost(tmp_path):
    path = _lease(tmp_path)
    with LeaseRefresher(path, TICK) as lease:
        assert _renewed_after(path, 1)
        tmp = tmp_path / "other"
        tmp.write_bytes(b'{"token": "theirs"}\n')
        os.replace(tmp, path)
        assert lease.lost.wait(30), "a replaced lease was not reported lost"


def test_a_superseded_lease_is_lost(tmp_path):
    path, superseded = _lease(tmp_path), threading.Event()
    with LeaseRefresher(path, TICK, still_ours=lambda: not superseded.is_set()) as lease:
        superseded.set()
        assert lease.lost.wait(30)


def test_a_transient_error_is_logged_once_and_renewal_goes_on(tmp_path):
    """A directory where the lease was makes every renewal fail with an OSError that is not "gone"."""
    path, logged = _lease(tmp_path), []
    aside = tmp_path / "aside"
    with LeaseRefresher(path, TICK, log=logged.append) as lease:
        assert _renewed_after(path, 1)
        os.rename(path, aside)
        path.mkdir()
        deadline = time.monotonic() + 30
        while not logged and time.monotonic() < deadline:
            time.sleep(TICK)
        time.sleep(10 * TICK)  # several more failing ticks
        path.rmdir()
        os.utime(aside, (1, 1))
        os.rename(aside, path)
        assert _renewed_after(path, 1), "renewal did not resume after the transient error"
        assert not lease.lost.is_set()
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
