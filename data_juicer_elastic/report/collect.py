"""What the report shows, read from a job dir that may be finished, running, failed or half-written.

Records are read through their ``job.records`` readers (a missing or
corrupt one reads as absent) and ``ops.json`` and ``merge.json`` through
:func:`load_record`, on the job's store as its folders' names and its leases'
stamps are, with every value type-checked here, so rendering never meets a
surprise; whatever was skipped is listed in ``notes``. Nothing is written.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.job.attempt_files import AttemptDir
from data_juicer_elastic.job.claims import latest_of, lease_key
from data_juicer_elastic.job.layout import JobDir, attempt_name
from data_juicer_elastic.job.manifest import Manifest
from data_juicer_elastic.job.records._read import load_record
from data_juicer_elastic.job.records.attempt import load_attempt
from data_juicer_elastic.job.records.done import DoneRecord, load_done_many
from data_juicer_elastic.status import first_line

OUTCOMES = ("done", "failed", "lost", "lost-race", "superseded", "running", "stopped")
# attempt.json outcome -> what the report calls it
_OUTCOME_OF = {
    "done": "done",
    "failed": "failed",
    "lost-race": "lost-race",  # a backup race: the other attempt published done first
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
    processing_from: float | None = None  # when its processing began, if after ``start`` (queued behind another)
    backup_of: int | None = None  # the attempt this one backs up (speculation), if it is a backup
    last_beat: float | None = None  # its lease's last renewal, read for an attempt with no outcome recorded

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 0.0)

    @property
    def queued(self) -> float:
        """Seconds claimed and loaded but waiting for the worker's previous attempt (a prefetching worker)."""
        return 0.0 if self.processing_from is None else max(min(self.processing_from, self.end) - self.start, 0.0)

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


def _int(value: object) -> int | None:
    return value if type(value) is int else None


def load_manifest(job: JobDir, notes: list[str]) -> Manifest | None:
    try:
        return job.manifest()
    except (OSError, ValueError, ElasticError) as exc:
        notes.append(f"manifest.json unreadable ({first_line(str(exc))}): shards are taken from attempts/")
        return None


def collect(job_dir: JobDir | str | os.PathLike, now: float | None = None) -> JobReport:
    """Everything the report shows; never raises on a damaged job dir (notes say what was skipped).

    A shard done by its first and only attempt is read from its done record and
    ops.json alone (two reads); only the others have their attempt folders listed
    and each attempt.json read, so a 100,000-shard job costs about 200,000 small reads. Every read goes
    through the job's store, so a job dir on an object store is read as one on disk.
    """
    job = job_dir if isinstance(job_dir, JobDir) else JobDir(job_dir)
    now = time.time() if now is None else now
    notes: list[str] = []
    manifest = load_manifest(job, notes)
    shard_ids = manifest.shards.ids() if manifest else _names(job, job.attempts_dir)
    rows = manifest.shards.rows if manifest else None
    shards = [{"id": s, "rows": rows[i]} if rows else {"id": s} for i, s in enumerate(shard_ids)]
    done = _done_records(job, shard_ids, notes)
    latest = _latest_attempts(job) if manifest else {}
    attempts: list[Attempt] = []
    folder = f"{job.key(job.attempts_dir)}/"  # built once: paths cost
    for sid in shard_ids:
        rec = done.get(sid)
        if rec is not None and rec.attempt == 1 == latest.get(sid) and rec.started_at and rec.finished_at:
            attempts.append(_from_done(job, rec, folder))
        else:
            attempts.extend(shard_attempts(job, sid, now, notes, rec))
    mark_queued(attempts)
    failed = _failed_ids(job)
    finished = {a.shard for a in attempts if a.outcome == "done"}
    state = (
        "failed"
        if failed & set(shard_ids)
        else "finished"
        if shard_ids and len(finished) == len(shard_ids)
        else "running"
        if manifest
        else "not prepared"
    )
    merge = load_record(job.store, job.key(job.merge_record_path))
    return JobReport(str(job.root), now, shards, attempts, state, notes, merge)


def _done_records(job: JobDir, shard_ids: list[str], notes: list[str]) -> dict[str, DoneRecord]:
    """The checked done records (one read each); a refused one is noted and its shard read from its attempts."""
    try:
        found = load_done_many(job, shard_ids)
    except OSError:
        return {}
    good = {}
    for sid, rec in found.items():
        if isinstance(rec, DoneRecord):
            good[sid] = rec
        else:
            notes.append(first_line(str(rec)))
    return good


def _latest_attempts(job: JobDir) -> dict[str, int]:
    return latest_of(_names(job, job.claims_dir))


def _failed_ids(job: JobDir) -> set[str]:
    """``job.failed_ids``, or none when ``state/failed`` cannot be listed (EACCES, ESTALE), as ``_names`` reads it."""
    try:
        return job.failed_ids()
    except OSError:
        return set()


def _from_done(job: JobDir, rec: DoneRecord, folder: str) -> Attempt:
    """A shard's one attempt, from its done record (the same host, pid and times as its attempt.json);
    ``folder``: the attempts folder's key, '/'-terminated (the log is named relative to the job dir: the key)."""
    name = attempt_name(rec.attempt)
    ops = load_record(job.store, f"{folder}{rec.shard}/{name}/{AttemptDir.OPS}")
    return Attempt(
        shard=rec.shard,
        attempt=rec.attempt,
        host=rec.host,
        pid=rec.pid,
        start=rec.started_at or 0.0,
        end=max(rec.finished_at or 0.0, rec.started_at or 0.0),
        outcome="done",
        rows_in=_int(ops.get("rows_in")),
        rows_out=rec.rows,
        error_rows=_int(ops.get("error_rows")) or 0,
        log=f"{folder}{rec.shard}/{name}/{AttemptDir.LOG}",
        ops=_ops_of(ops),
    )


def _ops_of(ops: dict) -> list[dict]:
    return [o for o in ops.get("ops", []) if isinstance(o, dict)] if isinstance(ops.get("ops"), list) else []


def mark_queued(attempts: list[Attempt]) -> None:
    """Split a prefetching worker's overlapping attempts into queued and processing time.

    A worker processes one attempt at a time, so an attempt claimed while the
    previous one of its lane (same host and pid) still ran began processing
    no earlier than that one ended. That end includes the previous attempt's
    finish stage (join, re-read, publish), which overlaps the next processing:
    the queued time shown is an upper bound. The worker does not record when
    processing began; with that in attempt.json this would be exact.
    """
    by_lane: dict[str, list[Attempt]] = {}
    for a in attempts:
        by_lane.setdefault(a.lane, []).append(a)
    for mine in by_lane.values():
        mine.sort(key=lambda a: a.start)
        busy_until = float("-inf")
        for a in mine:
            if busy_until > a.start:
                a.processing_from = min(busy_until, a.end)
            busy_until = max(busy_until, a.end)


def _names(job: JobDir, folder: Path) -> list[str]:
    """The names in a folder of the job dir, sorted (hidden ones left out; none when it cannot be listed)."""
    try:
        return sorted(job.store.names(job.key(folder)))
    except OSError:
        return []


def shard_attempts(job: JobDir, sid: str, now: float, notes: list[str], done: DoneRecord | None) -> list[Attempt]:
    """The shard's attempts in order, each with its outcome as the report names it."""
    folder = job.attempts_dir / sid
    numbers = sorted(int(n) for n in _names(job, folder) if n.isdigit())
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
    for i, a in enumerate(found):
        if a.outcome == "running":
            _lost_if_ended(a, found[i + 1 :], done)
    for a, later in itertools.pairwise(found):
        if a.outcome == "lost":  # drawn until its last heartbeat: the worker did nothing after it
            a.error += f"; taken over by attempt {later.attempt} on {later.host}"
    return found


def killed_at(a: Attempt) -> str:
    """When a lost attempt's worker last showed life (its lease's last renewal), as the report says it."""
    if a.last_beat is None:
        return f"killed or stalled after ~{_utc(a.start)} (it left no heartbeat)"
    return f"killed or stalled at ~{_utc(a.end)} (its last heartbeat)"


def _utc(t: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


def _lost_if_ended(a: Attempt, later: list[Attempt], done: DoneRecord | None) -> None:
    """An attempt whose record still says running, with a live lease, is lost all the same once its shard
    is done by another attempt or a later attempt took it over (not a backup racing it): a node killed -9
    and restarted at once (same host and run id) takes its own leases over while they are still fresh,
    and nothing ever renews or writes this attempt again (as ``dj-elastic status --all`` counts it)."""
    if done is not None and done.attempt != a.attempt:
        why = f"; attempt {done.attempt} finished the shard"
    elif any(x.backup_of != a.attempt for x in later):
        why = ""  # the takeover is named by shard_attempts
    else:
        return
    a.outcome = "lost"
    a.end = max(min(a.last_beat or a.start, a.end), a.start)
    a.error = a.error or f"no outcome recorded: {killed_at(a)}{why}"


def read_attempt(job: JobDir, sid: str, n: int, now: float, notes: list[str]) -> Attempt | None:
    info = load_attempt(job, sid, n)
    if info is None or not info.started_at:
        notes.append(f"attempts/{sid}/{attempt_name(n)}/attempt.json missing or unreadable: attempt not shown")
        return None
    start, end = info.started_at, info.finished_at
    outcome = _OUTCOME_OF.get(info.outcome) if info.outcome else None
    if outcome is None:  # "running" or nothing: alive if its lease is still renewed, else lost
        beat = _lease_mtime(job, sid, n)
        live = beat is not None and now - beat < _lock_timeout(job) + job.store.stamp_resolution  # as ClaimStore.fresh
        outcome = "running" if live else "lost"
        end = now if live else max(beat or start, start)
    else:
        beat = None
    ops = load_record(job.store, job.key(job.attempt_dir(sid, n) / AttemptDir.OPS))
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
        log=f"attempts/{sid}/{attempt_name(n)}/{AttemptDir.LOG}",
        ops=_ops_of(ops),
        backup_of=info.backup_of if info.backup_of is not None else n - 1 if info.backup else None,
        last_beat=beat,
    )
    if outcome == "lost" and not a.error:
        a.error = f"no outcome recorded and its lease stopped: {killed_at(a)}"
    return a


def _lease_mtime(job: JobDir, sid: str, n: int) -> float | None:
    """The lease's last renewal (one head, no age asked: no clock read); None when gone or released."""
    try:
        meta = job.store.head(lease_key(job, sid, n))
    except OSError:
        return None
    return None if meta is None or meta.released else meta.modified


def _lock_timeout(job: JobDir) -> float:
    try:
        return job.manifest().policy.lock_timeout_secs
    except (OSError, ValueError, ElasticError):
        return 300.0
