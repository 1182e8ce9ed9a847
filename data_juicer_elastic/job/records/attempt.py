"""The attempt record, ``attempts/<shard>/<attempt>/attempt.json``: one attempt's progress and outcome.

The worker creates it when the attempt starts (outcome ``running``) and
replaces it once the attempt ends (``finish``), through the job's Store (key
``JobDir.attempt_key``): the create is create-once, and each later write names
the version the worker's own last write left, so a record rewritten by
anything else is refused rather than overwritten. Other workers read it for
tail pacing (``claimed_at``, ``pace``, ``final``) and for the retry budget
(``outcome``), through ``load_attempt``: a missing or unreadable record (or a
link at its name) reads as None, which the failure count treats as an attempt lost.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.job.attempt_files import AttemptDir
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records._read import int_or, load_key, number_or_none
from data_juicer_elastic.storage.files import dumps_json
from data_juicer_elastic.storage.keys import Ver

# Outcomes of an attempt that do not count against the retry budget: the
# worker was told to stop, it stalled and someone else took the shard, its
# backup (or the original it backed up) finished first, or the disk was full.
NOT_FAILURES = ("interrupted", "superseded", "done", "duplicate", "lost-race", "no-space")


@dataclass
class AttemptRecord:
    shard: str
    attempt: int
    host: str
    pid: int
    token: str
    started_at: float
    claimed_at: float  # the lease file's mtime when it was made (the shared clock); 0 if unknown
    pace: float | None  # the worker's median seconds per finished shard so far
    final: bool  # the worker's limits let it claim nothing after this attempt
    backup: bool = False  # a backup of a late live attempt (speculation)
    backup_of: int | None = None  # the attempt it backs up
    processing_at: float = 0.0  # the shared clock when its processing began, if it waited after its claim
    outcome: str | None = "running"  # None: read from a record that names none
    finished_at: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.finished_at is None:  # a running attempt's record has neither key
            del d["finished_at"], d["error"]
        return d

    def finish(self, outcome: str, error: str | None = None) -> AttemptRecord:
        """Record how the attempt ended (in memory; ``write_attempt`` puts it on disk)."""
        self.outcome, self.finished_at, self.error = outcome, time.time(), error
        return self


def attempt_file(attempt_dir: Path) -> Path:
    return attempt_dir / AttemptDir.RECORD


def write_attempt(job: JobDir, record: AttemptRecord, ver: Ver | None = None) -> Ver:
    """Put ``record`` on the store whole; the version written, for the writer's next call.

    Without ``ver``: the attempt's first write, a create (a record already there was written by something
    other than this attempt). With it: a replace, only while the record still has ``ver`` (the version the
    writer's own last write returned). Either refused raises IntegrityError; nothing is written then.
    POSIX fsyncs the bytes before the link or rename (over sshfs a rename can otherwise reach the server
    before the bytes, and another node reads a cut record), not the folder after it (``durable=False``): a
    power loss may roll the record back a write (to missing, or to ``running``), which readers already
    take for an attempt lost, and the worker that wrote it is gone with it.
    """
    key, data = job.attempt_key(record.shard, record.attempt), dumps_json(record.to_dict())
    if ver is None:
        meta = job.store.create(key, data, durable=False)
        written = None if meta is None else meta.ver
    else:
        written = job.store.replace(key, data, if_ver=ver, durable=False)
    if written is None:
        raise IntegrityError(
            f"{attempt_file(job.attempt_dir(record.shard, record.attempt))}: written by something other than "
            f"the worker running attempt {record.attempt} of {record.shard}; refusing to overwrite it"
        )
    return written


def load_attempt(job: JobDir, shard: str, attempt: int) -> AttemptRecord | None:
    """The attempt's record; None when it is missing or not an attempt record."""
    try:
        raw = load_key(job.store, job.attempt_key(shard, attempt))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    outcome, error = raw.get("outcome"), raw.get("error")
    return AttemptRecord(
        shard=str(raw.get("shard", "")),
        attempt=int_or(raw.get("attempt")),
        host=str(raw.get("host", "")),
        pid=int_or(raw.get("pid")),
        token=str(raw.get("token", "")),
        started_at=number_or_none(raw.get("started_at")) or 0.0,
        claimed_at=number_or_none(raw.get("claimed_at")) or 0.0,
        pace=number_or_none(raw.get("pace")),
        final=bool(raw.get("final")),
        backup=raw.get("backup") is True,
        backup_of=raw.get("backup_of") if type(raw.get("backup_of")) is int else None,
        processing_at=number_or_none(raw.get("processing_at")) or 0.0,
        outcome=outcome if isinstance(outcome, str) else None,
        finished_at=number_or_none(raw.get("finished_at")),
        error=error if isinstance(error, str) else None,
    )


def counts_as_failure(record: AttemptRecord | None, released: bool) -> bool:
    """Whether an attempt counts against the retry budget.

    A lost attempt (no record, or still ``running``) counts, unless its lease
    was released: then it was given up on purpose (the shard was done
    meanwhile, or the disk was full).
    """
    outcome = record.outcome if record else None
    if outcome in NOT_FAILURES:
        return False
    return not (outcome in (None, "running") and released)
