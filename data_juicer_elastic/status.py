"""Read-only view of a job (``dj-elastic status``) and the one write operators need: retry."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.job.identity import hostname
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.storage.files import atomic_write, dumps_json, read_record

STATES = ("pending", "running", "stale", "done", "failed")


@dataclass
class ShardStatus:
    id: str
    state: str
    host: str | None = None
    attempts: int = 0
    rows: int | None = None
    input_rows: int = 0
    heartbeat_age_secs: float | None = None
    error: str | None = None


@dataclass
class JobStatus:
    job_dir: str
    counts: dict[str, int]
    shards: list[ShardStatus]
    hosts: dict[str, int]
    input_rows: int
    input_rows_done: int
    output_rows: int
    progress: float
    rows_per_sec: float | None
    complete: bool
    failed: bool = False
    notes: list[str] = field(default_factory=list)
    generation: str = ""  # the recipe generation shown ("" for a job dir from before generations)

    def to_dict(self) -> dict:
        """JSON-ready view for output only: shard entries are the objects' own dicts.

        (dataclasses.asdict deep-copies, which costs about a second on 10,000 shards.)
        """
        d = dict(vars(self))
        d["shards"] = [vars(s) for s in self.shards]
        return d


def job_status(job: JobDir) -> JobStatus:
    """One listing per state directory, one stat per leased shard: cheap on 10,000 shards."""
    manifest = job.manifest()
    store = ClaimStore(job, lock_timeout=manifest.policy.lock_timeout_secs, host=hostname())
    done, failed = job.done_ids(), job.failed_ids()
    latest = store.latest_attempts()
    now = store.now() if len(done) + len(failed) < len(manifest.shards) else time.time()
    shards: list[ShardStatus] = []
    hosts: dict[str, int] = {}
    first_start, last_finish = float("inf"), 0.0
    for spec in manifest.shards:
        s = ShardStatus(id=spec.id, state="pending", attempts=latest.get(spec.id, 0), input_rows=spec.rows)
        if spec.id in done:
            rec = read_record(job.done_path(spec.id))
            s.state, s.host, s.rows = "done", rec.get("host"), rec.get("rows")
            hosts[s.host or "?"] = hosts.get(s.host or "?", 0) + 1
            first_start = min(first_start, rec.get("started_at", first_start))
            last_finish = max(last_finish, rec.get("finished_at", last_finish))
        elif spec.id in failed:
            rec = read_record(job.failed_path(spec.id))
            s.state, s.host, s.error = "failed", rec.get("host"), rec.get("error")
        elif s.attempts:
            age = store.heartbeat_age(spec.id, s.attempts, now)
            lease = store.read_lease(spec.id, s.attempts) or {}
            s.host = lease.get("host")
            if age is None or age == float("inf"):
                s.state = "pending"  # released: claimable at once
            else:
                s.heartbeat_age_secs = round(age, 1)
                s.state = "running" if age < manifest.policy.lock_timeout_secs else "stale"
        shards.append(s)
    counts = {state: 0 for state in STATES}
    for s in shards:
        counts[s.state] += 1
    rows_done = sum(s.input_rows for s in shards if s.state == "done")
    elapsed = last_finish - first_start
    return JobStatus(
        job_dir=str(job.root),
        counts=counts,
        shards=shards,
        hosts=hosts,
        input_rows=manifest.total_rows,
        input_rows_done=rows_done,
        output_rows=sum(s.rows or 0 for s in shards if s.state == "done"),
        progress=rows_done / manifest.total_rows if manifest.total_rows else 1.0,
        rows_per_sec=round(rows_done / elapsed, 1) if elapsed > 0 else None,
        complete=counts["done"] == len(shards),
        failed=counts["failed"] > 0,
        generation=job.generation,
    )


def retry(job: JobDir, shard_ids: list[str] | None = None, *, all_failed: bool = False) -> list[str]:
    """Requeue shards: archive their failed/done records in state/history, reset the retry budget.

    The budget is reset by a retry record naming the last attempt so far, so
    earlier attempts stop counting; nothing is deleted.
    """
    manifest = job.manifest()
    if all_failed:
        shard_ids = sorted(job.failed_ids())
    if not shard_ids:
        raise UserError("retry: name shards with --shard-id, or use --all-failed")
    store = ClaimStore(job, lock_timeout=manifest.policy.lock_timeout_secs, host=hostname())
    latest = store.latest_attempts()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    requeued = []
    for sid in shard_ids:
        job.shard(sid)  # validates the id
        records = [p for p in (job.failed_path(sid), job.done_path(sid)) if p.exists()]
        if not records:
            state = "running" if latest.get(sid) else "pending"
            raise UserError(f"retry: shard {sid} is {state}, not failed or done; nothing to requeue")
        retry_rec = job.retry_path(sid)
        if retry_rec.exists():
            os.rename(retry_rec, job.history_dir / f"{stamp}-{sid}.retry.json")
        atomic_write(retry_rec, dumps_json({"shard": sid, "after_attempt": latest.get(sid, 0), "at": time.time()}))
        for path in records:
            kind = path.parent.name
            os.rename(path, job.history_dir / f"{stamp}-{sid}.{kind}.json")
        requeued.append(sid)
    return requeued


def failure_message(job: JobDir, sid: str) -> str:
    """Name the terminally failed shard, its error, its log, and how to requeue it."""
    rec = read_record(job.failed_path(sid))
    try:
        log = job.confine(rec["log"], "failed record log")
    except (KeyError, TypeError, IntegrityError):
        log = job.failed_path(sid)
    return (
        f"shard {sid} failed terminally on host={rec.get('host')} after {rec.get('failures')} failure(s): "
        f"{rec.get('error')}; see {log}; fix the cause, then "
        f"`dj-elastic retry --job-dir {job.root} --shard-id {sid}` and submit the job again"
    )
