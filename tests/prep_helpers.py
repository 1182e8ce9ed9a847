"""Helpers for the prepare/merge tests: write inputs, build requests, fake finished shards."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import orjson

from data_juicer_elastic.job.layout import JobDir, shard_id
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.job.records.done import DoneRecord, expected_output, publish_done
from data_juicer_elastic.prepare.driver import PrepareRequest, PrepareResult, prepare

RECIPE = b"# test recipe\nproject_name: t\nprocess:\n  - text_length_filter: {min_len: 1}\n"


def write_rows(path: Path, rows: list[dict], newline_at_end: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"\n".join(orjson.dumps(r) for r in rows)
    path.write_bytes(data + (b"\n" if newline_at_end else b""))
    return path


def text_rows(n: int, start: int = 0, width: int = 40) -> list[dict]:
    """Rows of slightly varying length, so byte balance is not trivially row balance."""
    return [{"text": f"row {i} " + "x" * (width + (i * 7) % 23), "id": i} for i in range(start, start + n)]


def request(dataset: Path, job_dir: Path, shards: int, **kw) -> PrepareRequest:
    kw.setdefault("recipe_text", RECIPE)
    kw.setdefault("versions", {"data_juicer": "1.6.1", "data_juicer_elastic": "0.1.0"})
    return PrepareRequest(dataset_path=str(dataset), job_dir=str(job_dir), policy=Policy(num_shards=shards), **kw)


def run(req: PrepareRequest, jobs: int | None = 0, **kw) -> tuple[PrepareResult, list[str]]:
    logs: list[str] = []
    result = prepare(req, log=logs.append, jobs=jobs, **kw)
    return result, logs


def shard_bytes(job_dir: Path) -> list[bytes]:
    job = JobDir(job_dir)
    return [job.shard_file(s.id).read_bytes() for s in job.manifest().shards]


def slow_pid(seconds: float) -> int:
    """A pool task that takes a while, saying which process ran it."""
    time.sleep(seconds)
    return os.getpid()


def endless_task() -> None:
    """A pool task that reads "blocks" until the pool stops it."""
    from data_juicer_elastic.prepare import shards as prep_shards

    while True:
        prep_shards._advance(1 << 20)
        time.sleep(0.01)


def lines_of(data: bytes) -> list[dict]:
    return [orjson.loads(line) for line in data.splitlines()]


def fake_done(job: JobDir, sid: str, *, attempt: int = 1, host: str = "node-a", content: bytes | None = None) -> Path:
    """Publish a done record for an identity run: the output is the shard itself (or ``content``).

    For outputs no real runner is asked to write (chosen content, a chosen attempt); test_merge.py checks
    that these records have exactly the fields and values the real worker writes.
    """
    out = job.attempt_output(sid, attempt)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = job.shard_file(sid).read_bytes() if content is None else content
    out.write_bytes(data)
    record = DoneRecord(
        shard=sid,
        attempt=attempt,
        host=host,
        pid=1,
        rows=data.count(b"\n"),
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        output=expected_output(job, sid, attempt),
        started_at=time.time(),
        finished_at=time.time(),
    )
    assert publish_done(job, record)
    return out


def finish_all(job: JobDir, hosts: tuple[str, ...] = ("node-a",)) -> None:
    """Every shard done by the real worker with the identity runner, the hosts taking one shard in turn."""
    from data_juicer_elastic.worker.loop import run_worker

    from .runners import copy

    total = len(job.manifest().shards)
    for i in range(total):
        result = run_worker(job.root, copy, host=hosts[i % len(hosts)], max_shards=1, log=lambda *_: None)
        assert result.exit_code == 0 and len(result.completed) == 1, result
    assert len(job.done_ids()) == total


def shard_files(job_dir: Path) -> list[Path]:
    """The shards' files in order (``shards/`` also holds the manifest's shard table)."""
    return sorted((job_dir / "shards").glob("part-*.jsonl"))


def with_inline_shards(job_dir: Path, raw: dict) -> dict:
    """``raw`` (manifest.json's content) as schemas before 6 wrote it: every shard listed inside it."""
    lines = (job_dir / "shards" / "_table.jsonl").read_bytes().splitlines()
    n = len(lines)
    shards = [
        {"id": shard_id(i, n), "path": f"shards/{shard_id(i, n)}.jsonl", **orjson.loads(x)} for i, x in enumerate(lines)
    ]
    return {**{k: v for k, v in raw.items() if k != "shard_table"}, "shards": shards}
