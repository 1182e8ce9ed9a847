"""What the report shows, read from a job dir that may be finished, running, failed or half-written.

Records are read through their ``job.records`` readers (a missing or
corrupt one reads as absent) and ``ops.json`` through :func:`read_record`,
with every value type-checked here, so rendering never meets a surprise;
whatever was skipped is listed in ``notes``. Nothing is written.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from data_juicer_elastic.errors import ElasticError, IntegrityError
from data_juicer_elastic.job.claims import RELEASED_MTIME, lease_name
from data_juicer_elastic.job.layout import JobDir, attempt_name
from data_juicer_elastic.job.manifest import Manifest
from data_juicer_elastic.job.records.attempt import load_attempt
from data_juicer_elastic.job.records.done import load_done
from data_juicer_elastic.status import OPS_NAME, first_line
from data_juicer_elastic.storage.files import read_record

OUTCOMES = ("done", "failed", "lost", "superseded", "running", "stopped")
# attempt.json outcome -> what the report calls it
_OUTCOME_OF = {
    "done": "done",
    "failed": "failed",
    "superseded": "superseded",
    "duplicate": "superseded",
    "interrupted": "stopped",
    "no-space": "stopped",
}


@dataclass
class Attempt:
    shard: str
    attempt: int
    host: str
    pid: int
    start: float
    end: float
    outcome: str  # one of OUTCOMES
    rows_in: int | None = None
    rows_out: int | None = None
    error_rows: int = 0
    error: str = ""
    log: str = ""  # relative to the job dir
    ops: list[dict] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 0.0)

    @property
    def lane(self) -> str:
        return f"{self.host} pid {self.pid}"


@dataclass
class JobReport:
    job_dir: str
    generated_at: float
    shards: list[dict]  # id, rows (input)
    attempts: list[Attempt]
    state: str  # finished, running, failed, not prepared
    notes: list[str] = field(default_factory=list)
    merge: dict = field(default_factory=dict)

    @property
    def t0(self) -> float:
        return min((a.start for a in self.attempts), default=self.generated_at)

    @property
    def t1(self) -> float:
        return max((a.end for a in self.attempts), default=self.generated_at)

    def winners(self) -> list[Attempt]:
        return [a for a in self.attempts if a.outcome == "done"]


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: object) -> int | None:
    return value if type(value) is int else None


def load_manifest(job: JobDir, notes: list[str]) -> Manifest | None:
    try:
        return job.manifest()
    except (OSError, ValueError, ElasticError) as exc:
        notes.append(f"manifest.json unreadable ({first_line(str(exc))}): shards are taken from attempts/")
        return None


def collect(job_dir: str | os.PathLike, now: float | None = None) -> JobReport:
    """Everything the report shows; never raises on a damaged job dir (notes say what was skipped)."""
    job = JobDir(job_dir)
    now = time.time() if now is None else now
    notes: list[str] = []
    manifest = load_manifest(job, notes)
    shard_ids = [s.id for s in manifest.shards] if manifest else _listdir(job.attempts_dir)
    shards = [{"id": s.id, "rows": s.rows} for s in manifest.shards] if manifest else [{"id": s} for s in shard_ids]
    attempts: list[Attempt] = []
    for sid in shard_ids:
        attempts.extend(shard_attempts(job, sid, now, notes))
    failed = [s for s in shard_ids if job.failed_path(s).exists()]
    done = {a.shard for a in attempts if a.outcome == "done"}
    state = (
        "failed"
        if failed
        else "finished"
        if shard_ids and len(done) == len(shard_ids)
        else "running"
        if manifest
        else "not prepared"
    )
    merge = read_record(job.merge_record_path)
    return JobReport(str(job.root), now, shards, attempts, state, notes, merge)


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(path) if not n.startswith("."))
    except OSError:
        return []


def shard_attempts(job: JobDir, sid: str, now: float, notes: list[str]) -> list[Attempt]:
    """The shard's attempts in order, each with its outcome as the report names it."""
    folder = job.attempts_dir / sid
    numbers = sorted(int(n) for n in _listdir(folder) if n.isdigit())
    try:
        done = load_done(job, sid)
    except IntegrityError as exc:
        notes.append(first_line(str(exc)))
        done = None
    found: list[Attempt] = []
    for n in numbers:
        a = read_attempt(job, sid, n, now, notes)
        if a is None:
            continue
        if a.outcome == "done" and (done is None or n != done.attempt):
            a.outcome = "superseded"  # another attempt's output won, or `retry` archived this one
        if a.outcome == "done" and done is not None:
            a.rows_out = done.rows
        found.append(a)
    for a, later in itertools.pairwise(found):
        if a.outcome == "lost":  # taken over: the shard was held up until the next attempt began
            a.end = max(a.start, later.start)
            a.error += f"; taken over by attempt {later.attempt} on {later.host}"
    return found


def read_attempt(job: JobDir, sid: str, n: int, now: float, notes: list[str]) -> Attempt | None:
    adir = job.attempt_dir(sid, n)
    info = load_attempt(adir)
    if info is None or not info.started_at:
        notes.append(f"attempts/{sid}/{attempt_name(n)}/attempt.json missing or unreadable: attempt not shown")
        return None
    start, end = info.started_at, info.finished_at
    outcome = _OUTCOME_OF.get(info.outcome) if info.outcome else None
    if outcome is None:  # "running" or nothing: alive if its lease is still renewed, else lost
        beat = _lease_mtime(job, sid, n)
        live = beat is not None and now - beat < _lock_timeout(job)
        outcome = "running" if live else "lost"
        end = now if live else max(beat or start, start)
    ops = read_record(adir / OPS_NAME)
    a = Attempt(
        shard=sid,
        attempt=n,
        host=info.host or "?",
        pid=info.pid,
        start=start,
        end=max(end if end is not None else start, start),
        outcome=outcome,
        rows_in=_int(ops.get("rows_in")),
        rows_out=_int(ops.get("rows_out")),
        error_rows=_int(ops.get("error_rows")) or 0,
        error=first_line(info.error or ""),
        log=f"attempts/{sid}/{attempt_name(n)}/process.log",
        ops=[o for o in ops.get("ops", []) if isinstance(o, dict)] if isinstance(ops.get("ops"), list) else [],
    )
    if outcome == "lost" and not a.error:
        a.error = "no outcome recorded and its lease stopped: the worker was killed or stalled"
    return a


def _lease_mtime(job: JobDir, sid: str, n: int) -> float | None:
    try:
        mtime = os.lstat(job.claims_dir / lease_name(sid, n)).st_mtime
    except OSError:
        return None
    return None if mtime <= RELEASED_MTIME else mtime


def _lock_timeout(job: JobDir) -> float:
    try:
        return job.manifest().policy.lock_timeout_secs
    except (OSError, ValueError, ElasticError):
        return 300.0
