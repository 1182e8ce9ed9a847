"""The failed record, ``state/failed/<shard>.json``: a shard failed past its retry budget.

Published once by the worker (``publish_failed``); its presence stops the job.
Read by the worker, coordination and status through ``load_failed``, which
never raises: a failed record that was edited still fails the job, so every
field it cannot trust reads as unknown, and its ``log`` path is confined
before it is shown (``failure_message``). Both go through the job's Store
(``JobDir.store``, key ``failed_key``), as the done record does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from data_juicer_elastic.errors import ElasticError, IntegrityError, one_line
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records._read import MISSING, int_or, load_key, number_or_none
from data_juicer_elastic.storage.files import dumps_json


@dataclass(frozen=True)
class FailedRecord:
    shard: str
    attempt: int
    host: str | None
    pid: int
    error: str | None
    log: str | None  # the failing attempt's process.log, relative to the job dir
    failures: int | None
    at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def publish_failed(job: JobDir, record: FailedRecord) -> bool:
    """Publish the shard's terminal failure unless one is there already."""
    return job.store.create(job.failed_key(record.shard), dumps_json(record.to_dict())) is not None


def is_failed(job: JobDir, shard: str) -> bool:
    """Has the shard a failed record? One ``head`` (an lstat on POSIX), as ``done.is_done``."""
    return job.store.head(job.failed_key(shard)) is not None


def load_failed(job: JobDir, shard: str) -> FailedRecord | None:
    """The shard's failed record, None if there is none; fields it cannot trust read as None."""
    try:
        raw = load_key(job.store, job.failed_key(shard))
    except (OSError, ValueError):
        raw = {}
    if raw is MISSING:
        return None
    raw = raw if isinstance(raw, dict) else {}

    def text(key: str) -> str | None:
        return raw[key] if isinstance(raw.get(key), str) else None

    failures = raw.get("failures")
    return FailedRecord(
        shard,
        int_or(raw.get("attempt")),
        text("host"),
        int_or(raw.get("pid")),
        text("error"),
        text("log"),
        failures if type(failures) is int else None,
        number_or_none(raw.get("at")),
    )


def failure_message(job: JobDir, sid: str) -> str:
    """Name the terminally failed shard, its error, its log, and how to requeue it."""
    rec = load_failed(job, sid) or FailedRecord(sid, 0, None, 0, None, None, None)
    try:
        log = job.confine(rec.log, "failed record log")
    except IntegrityError:
        log = job.failed_path(sid)
    return (
        f"{_what(job, sid)} {sid} failed terminally on host={rec.host} after {rec.failures} failure(s): "
        f"{one_line(rec.error)}; see {log}; fix the cause, then "
        f"`dj-elastic retry --job-dir {job.root}{_generation_arg(job)} --shard-id {sid}` and submit the job again"
    )


def _what(job: JobDir, sid: str) -> str:
    """ "shard", or "dedup unit" for a failed record that names no shard of the manifest (dedup/budget.py)."""
    try:
        return "shard" if sid in job.manifest().shards.rows_by_id() else "dedup unit"
    except (OSError, ValueError, ElasticError):
        return "shard"


def _generation_arg(job: JobDir) -> str:
    return f" --generation {job.generation}" if job.generation else ""
