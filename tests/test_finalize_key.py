"""The finalize election's key (coordination.finalize): the same for every process that finishes the same
state, new after a retry or a merge, and paid without reading the done records (one per shard: at the end
of a 100,000-shard job of 256 processes that was 25.6 million opens)."""

from __future__ import annotations

import os

from data_juicer_elastic.coordination.finalize import finalize_key
from data_juicer_elastic.job.records.retry import requeue
from data_juicer_elastic.worker.loop import run_worker

from .jobs import make_job
from .runners import copy


def _quiet(*_: object) -> None:
    pass


def test_the_key_follows_retries_and_merges_and_reads_no_done_record(tmp_path):
    job = make_job(tmp_path, rows=40, shards=4)
    out = str(tmp_path / "out.jsonl")
    assert run_worker(job.root, copy, host="a", log=_quiet).exit_code == 0
    key = finalize_key(job, out)
    assert finalize_key(job, out) == key and finalize_key(job, out + ".x") != key

    done = sorted(job.done_dir.iterdir())
    for path in done:  # a done record the key would read is now a folder: reading one raises
        data = path.read_bytes()
        path.unlink()
        path.mkdir()
        (path / "data").write_bytes(data)
    assert finalize_key(job, out) == key
    for path in done:
        data = (path / "data").read_bytes()
        (path / "data").unlink()
        path.rmdir()
        path.write_bytes(data)

    requeue(job, [done[0].name[: -len(".json")]])
    retried = finalize_key(job, out)
    assert retried != key
    assert run_worker(job.root, copy, host="b", log=_quiet).exit_code == 0
    assert finalize_key(job, out) == retried  # redone: the state to merge is the retry's

    job.merge_record_path.parent.mkdir(parents=True, exist_ok=True)
    job.merge_record_path.write_bytes(b'{"merged": 1}')
    assert finalize_key(job, out) not in (key, retried)
    os.unlink(job.merge_record_path)
    assert finalize_key(job, out) == retried
