"""The shared disk fills up during prepare, an attempt, or merge (a small tmpfs as the job dir or output).

Each time: exit 2 with a message naming the path and "no space left", nothing
half-published, no shard counted as failed, and the job resumes once space is freed.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.claims import claim_store
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.merge import verify
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare
from data_juicer_elastic.status import job_status
from data_juicer_elastic.storage import posix as posix_mod
from data_juicer_elastic.storage.files import disk_full_in
from data_juicer_elastic.worker.budget import failure_count
from data_juicer_elastic.worker.loop import run_worker

from ..jobs import (
    RECIPE,
    REPO,
    check_done_exactly_once,
    env_with,
    jsonl_only,
    make_job,
    merge_and_check,
    shard_data,
    worker_cmd,
    write_corpus,
)
from ..runners import copy

NO_SPACE = "no space left on device"


def _fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` up, then give back ``leave`` bytes."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        chunk = b"\0" * (64 << 10)
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", *args],
        cwd=REPO,
        env=env_with(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _nothing_failed(job: JobDir) -> None:
    assert not os.listdir(job.failed_dir)
    latest = {s.id: 0 for s in job.manifest().shards}
    for name in os.listdir(job.claims_dir):
        sid, _, n = name.rpartition("@")
        latest[sid] = max(latest[sid], int(n))
    assert all(failure_count(job, sid, n) == 0 for sid, n in latest.items()), "a full disk counted as a failure"
    assert job_status(job).counts["running"] == 0, "a lease was left live"
    report = verify(job)
    assert report.ok, report.problems  # whatever was published is whole


@jsonl_only("prepare must fill the disk with shard bytes; a Parquet prepare writes only small descriptors")
def test_disk_full_during_prepare(tmp_path, small_disk):
    corpus = write_corpus(tmp_path / "in" / "data.jsonl", 30000, width=100)
    assert corpus.stat().st_size > 2 << 20
    disk = small_disk.mount("1m")
    req = PrepareRequest(
        dataset_path=str(corpus),
        job_dir=str(disk / "job"),
        recipe_text=RECIPE,
        policy=Policy(num_shards=4, lock_timeout_secs=3.0, heartbeat_secs=0.5, poll_interval_secs=0.1),
    )
    with pytest.raises(UserError) as err:
        prepare(req, log=lambda *_: None)
    assert NO_SPACE in str(err.value) and str(disk / "job") in str(err.value), err.value
    assert err.value.exit_code == 2
    assert os.listdir(disk) == [], "a half-prepared job dir or staging folder was left"
    small_disk.resize(disk, "16m")
    prepare(req, log=lambda *_: None)
    job = JobDir(disk / "job")
    assert run_worker(job.root, copy, log=lambda *_: None).exit_code == 0
    merge_and_check(job, tmp_path / "merged.jsonl")


@pytest.mark.timeout(120)
def test_disk_full_during_an_attempt_then_space_is_freed(tmp_path, small_disk):
    disk = small_disk.mount("4m")
    job = make_job(tmp_path, rows=12000, shards=4, job_dir=disk / "job")
    assert min(len(shard_data(job, s.id)) for s in job.manifest().shards) > 128 << 10  # each output
    filler = _fill(disk, 64 << 10)  # room for leases and records, not for a shard's output
    p = subprocess.run(worker_cmd(job, "copy"), cwd=REPO, env=env_with(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert NO_SPACE in p.stderr and str(job.root) in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    _nothing_failed(job)
    assert len(os.listdir(job.done_dir)) < 4
    os.unlink(filler)
    assert (
        subprocess.run(worker_cmd(job, "copy"), cwd=REPO, env=env_with(), capture_output=True, timeout=120).returncode
        == 0
    )
    check_done_exactly_once(job)
    merge_and_check(job, tmp_path / "merged.jsonl")


def test_disk_full_when_publishing_the_done_record(tmp_path, monkeypatch):
    job = make_job(tmp_path, rows=40, shards=4)
    real = posix_mod.publish_once  # what the store's create runs on POSIX

    def full(path, data, **how):
        if Path(path).parent.name != "done":
            return real(path, data, **how)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(posix_mod, "publish_once", full)
    result = run_worker(job.root, copy, log=lambda *_: None)
    assert result.exit_code == 2 and NO_SPACE in result.message and str(job.done_dir) in result.message
    _nothing_failed(job)
    assert not os.listdir(job.done_dir)
    monkeypatch.setattr(posix_mod, "publish_once", real)
    assert run_worker(job.root, copy, log=lambda *_: None).exit_code == 0
    check_done_exactly_once(job)
    merge_and_check(job, tmp_path / "merged.jsonl")


def test_disk_full_during_merge(tmp_path, small_disk):
    job = make_job(tmp_path, rows=12000, shards=4)
    assert run_worker(job.root, copy, log=lambda *_: None).exit_code == 0
    disk = small_disk.mount("512k")
    out = disk / "merged.jsonl"
    p = _cli("merge", "--job-dir", str(job.root), "--output", str(out))
    assert p.returncode == 2 and NO_SPACE in p.stderr and str(out) in p.stderr, p.stderr
    assert os.listdir(disk) == [], "a partial merged output or temp file was left"
    assert not job.merge_record_path.exists()
    small_disk.resize(disk, "16m")
    merge_and_check(job, out)


def test_a_claim_the_full_disk_cut_short_is_no_claim(tmp_path, small_disk):
    """The lease file is created but its body cannot be written: no lease is left behind to count as lost."""
    disk = small_disk.mount("4m")
    job = make_job(tmp_path, rows=400, shards=4, job_dir=disk / "job")
    filler = _fill(disk, 0)
    store = claim_store(job)
    with pytest.raises(OSError) as err:
        store.try_claim("shard-00000", 0)
    assert disk_full_in(err.value)
    assert not os.listdir(job.claims_dir), "a half-written lease was left"
    os.unlink(filler)
    assert store.try_claim("shard-00000", 0) is not None  # the same attempt number is free again
