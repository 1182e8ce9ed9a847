"""Read-only view of a job (``dj-elastic status``); requeueing is ``job.records.retry.requeue``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from data_juicer_elastic.dedup.progress import DedupProgress, dedup_progress, stage_lines
from data_juicer_elastic.errors import IntegrityError, one_line
from data_juicer_elastic.job.claims import ClaimStore, claim_store, latest_of, lease_key
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Manifest
from data_juicer_elastic.job.records.attempt import load_attempt
from data_juicer_elastic.job.records.done import DoneRecord, load_done_many
from data_juicer_elastic.job.records.failed import load_failed
from data_juicer_elastic.job.records.retry import read_requeued, summed_by_records
from data_juicer_elastic.job.records.workers import read_workers
from data_juicer_elastic.worker.speculation import RateBook, late_attempt

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
    backup: dict | None = None  # a running backup (``backup_view``), or {"won": attempt} once a backup won
    error_rows: int = 0
    log: str | None = None  # a failed shard's process.log, relative to the job dir
    lost: int = 0  # attempts that ended without recording how (their process was killed or stalled)


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
    hosts_active: list[str] = field(default_factory=list)  # hosts holding a live lease now
    error_rows: int = 0  # rows removed by op errors (skip_op_error) in done shards
    shard_count: int = 0  # the job's shards (``shards`` lists them all only with ``per_shard``)
    per_shard: bool = True  # ``shards`` lists every shard; else only those started and not done (a summary)
    earlier_attempts: int = 0  # attempts before each shard's latest: failed, lost or beaten by a backup
    dedup: list[DedupProgress] = field(default_factory=list)  # per dedup its stages (dedup/progress.py)

    def dedup_lines(self) -> list[str]:
        """``dj-elastic status``'s lines of the dedup stages, one per dedup (none without deduplicators)."""
        return stage_lines(self.dedup)

    def to_dict(self) -> dict:
        """JSON-ready view for output only: shard entries are the objects' own dicts.

        (dataclasses.asdict deep-copies, which costs about a second on 10,000 shards.)
        """
        d = dict(vars(self))
        d["shards"] = [vars(s) for s in self.shards]
        if self.dedup:
            d["dedup"] = [vars(p) for p in self.dedup]
        else:
            del d["dedup"]  # a job without deduplicators reads as it always did
        return d


def job_status(job: JobDir, *, details: bool = True, per_shard: bool = True) -> JobStatus:
    """The job's state; ``per_shard`` reads every done record, the summary (``per_shard=False``) none.

    Both list ``state/done``, ``state/failed`` and ``state/claims`` once. The per-shard view reads one done
    record per done shard and, with ``details``, counts the lost attempts of done shards (one attempt.json
    read per earlier attempt of each); ``dj-elastic status`` asks for it with ``--shards`` or ``--all``.
    The summary (``job_summary``) takes the done shards' totals from the worker records instead.
    A recipe with deduplicators adds its stages (``dedup/progress.py``: the recipe snapshot, two listings,
    one read per done join); the shards are the final pass's units.
    """
    st = _job_status(job, details) if per_shard else job_summary(job)
    st.dedup = dedup_progress(job)
    st.failed = st.failed or any(p.failed for p in st.dedup)  # a unit failed past its budget stops the job
    return st


def _job_status(job: JobDir, details: bool) -> JobStatus:
    manifest = job.manifest()
    store = claim_store(job)
    done, failed = job.done_ids(), job.failed_ids()
    latest = store.latest_attempts()
    ids = manifest.shards.ids()
    now = store.now() if len(done) + len(failed) < len(ids) else time.time()
    records = load_done_many(job, (sid for sid in ids if sid in done))
    shards: list[ShardStatus] = []
    book: list[RateBook] = []  # the job's rate, read only if a backup runs
    for sid, rows in zip(ids, manifest.shards.rows, strict=True):
        attempts = latest.get(sid, 0)
        if sid in done:
            s = _done_status(sid, rows, attempts, records.get(sid))
            if not details or attempts <= 1:
                shards.append(s)
                continue
            s.lost = lost_attempts(job, sid, attempts - 1)
            shards.append(s)
            continue
        shards.append(_unfinished(job, store, sid, rows, attempts, sid in failed, done, now, book))
    good = [r for r in records.values() if isinstance(r, DoneRecord)]
    starts = [r.started_at for r in good if r.started_at is not None]
    ends = [r.finished_at for r in good if r.finished_at is not None]
    st = _summarise(job, manifest, shards, max(ends, default=0.0) - min(starts, default=float("inf")))
    st.earlier_attempts = sum(max(n - 1, 0) for n in latest.values())
    return st


def _unfinished(
    job: JobDir,
    store: ClaimStore,
    sid: str,
    rows_in: int,
    attempts: int,
    failed: bool,
    done: set[str],
    now: float,
    book: list[RateBook],
) -> ShardStatus:
    """A shard without a done record: failed (its record read), leased (its lease looked at) or pending."""
    s = ShardStatus(id=sid, state="pending", attempts=attempts, input_rows=rows_in)
    if failed:
        rec = load_failed(job, sid)
        s.state, s.host, s.error, s.log = "failed", rec and rec.host, one_line(rec and rec.error), rec and rec.log
    elif s.attempts:
        _lease_state(store, s, now)
        if store.backup_of(s.id, s.attempts) is not None:
            book[:] = book or [RateBook(job)]
            s.backup = backup_view(job, store, book[0], done, s, now)
    finished_last = s.state == "running"  # its last attempt is alive
    if s.attempts > finished_last:
        s.lost = lost_attempts(job, sid, s.attempts - finished_last)
    return s


def job_summary(job: JobDir) -> JobStatus:
    """The job's counts, rows, rate and hosts without opening a done record.

    Listings of ``state/done``, ``state/failed`` and ``state/claims`` give the states (exact, as the
    per-shard view counts them) and the input rows done (the manifest's rows of the done shards); the
    worker records (``state/workers``, one per worker process) give the output and error rows, each
    host's shards and the job's span. A worker record counts a done shard through its ``published`` sum,
    or through the attempt it still names, whose done record is read (one per attempt a live worker
    holds). Only shards started and not done are listed, as the per-shard view has them (their leases,
    failure records and attempts are looked at: few while a job runs). When the records do not account
    for exactly the done records listed (a job dir run before worker records, a record lost, a retried
    done shard), the done records are read after all, as ``--shards`` does.
    """
    manifest = job.manifest()
    store = claim_store(job)
    rows = manifest.shards.rows_by_id()
    done, failed = {s for s in job.done_ids() if s in rows}, {s for s in job.failed_ids() if s in rows}
    latest = _latest_attempts(job, rows)
    now = store.now() if len(done) + len(failed) < len(rows) else time.time()
    shards: list[ShardStatus] = []
    book: list[RateBook] = []
    counts = {state: 0 for state in STATES}
    counts["done"] = len(done)
    for sid, attempts in latest.items():
        if sid in rows and sid not in done and sid not in failed:
            shards.append(_unfinished(job, store, sid, rows[sid], attempts, False, done, now, book))
    for sid in sorted(failed - done):
        shards.append(_unfinished(job, store, sid, rows[sid], latest.get(sid, 0), True, done, now, book))
    shards.sort(key=lambda s: s.id)  # manifest order: shard ids sort as their index
    for s in shards:
        counts[s.state] += 1
    counts["pending"] += len(rows) - len(done) - len(shards)  # never claimed
    totals = _done_totals(job, done)
    rows_done = sum(rows[sid] for sid in done)
    total_rows = manifest.total_rows
    span = totals.last_finish - totals.first_start
    return JobStatus(
        job_dir=str(job.root),
        counts=counts,
        shards=shards,
        hosts=totals.hosts,
        input_rows=total_rows,
        input_rows_done=rows_done,
        output_rows=totals.output_rows,
        progress=rows_done / total_rows if total_rows else 1.0,
        rows_per_sec=round(rows_done / span, 1) if span > 0 else None,
        complete=counts["done"] == len(rows),
        failed=counts["failed"] > 0,
        generation=job.generation,
        hosts_active=sorted({s.host or "?" for s in shards if s.state == "running"}),
        error_rows=totals.error_rows,
        shard_count=len(rows),
        per_shard=False,
        earlier_attempts=sum(n - 1 for n in latest.values() if n > 1),
    )


def _latest_attempts(job: JobDir, rows: Mapping[str, int]) -> dict[str, int]:
    """``ClaimStore.latest_attempts`` for the manifest's shards (one listing of names)."""
    return {sid: n for sid, n in latest_of(job.store.names(job.key(job.claims_dir))).items() if sid in rows}


@dataclass
class _DoneTotals:
    hosts: dict[str, int] = field(default_factory=dict)
    output_rows: int = 0
    error_rows: int = 0
    first_start: float = float("inf")
    last_finish: float = 0.0

    def add(self, host: str, n: int, output_rows: int, error_rows: int, start, end) -> None:
        if n:
            self.hosts[host or "?"] = self.hosts.get(host or "?", 0) + n
            if not self.hosts[host or "?"]:
                del self.hosts[host or "?"]
        self.output_rows += output_rows
        self.error_rows += error_rows
        if start is not None:
            self.first_start = min(self.first_start, start)
        if end is not None:
            self.last_finish = max(self.last_finish, end)


def _done_totals(job: JobDir, done: set[str]) -> _DoneTotals:
    """The done shards' totals from the worker records; from the done records when those don't add up."""
    totals, counted = _DoneTotals(), 0
    records = read_workers(job.store, job.key(job.workers_dir))[0]
    for r in records:
        totals.add(r.host, r.published, r.output_rows, r.error_rows, r.first_start, r.last_finish)
        counted += r.published
        named = [(sid, n) for sid, n in r.pairs if sid in done]
        for sid, rec in load_done_many(job, sorted({sid for sid, _ in named})).items():
            if isinstance(rec, DoneRecord) and rec.worker == r.worker and (sid, rec.attempt) in named:
                totals.add(rec.host, 1, rec.rows, rec.error_rows, rec.started_at, rec.finished_at)
                counted += 1
    for a, r in summed_by_records(read_requeued(job)[0], records):  # retried done shards still summed
        totals.add(r.host, -1, -a.rows, -a.error_rows, None, None)
        counted -= 1
    if counted == len(done):
        return totals
    totals = _DoneTotals()
    for rec in load_done_many(job, sorted(done)).values():
        if isinstance(rec, DoneRecord):
            totals.add(rec.host, 1, rec.rows, rec.error_rows, rec.started_at, rec.finished_at)
        else:
            totals.add("?", 1, 0, 0, None, None)
    return totals


def lost_attempts(job: JobDir, sid: str, upto: int) -> int:
    """Attempts 1..upto whose attempt.json still says ``running`` (or nothing): their process died or stalled.

    An attempt with no record whose lease was released was given back on purpose (a claim that found the
    shard done just then, a claim made ahead by a worker that stopped): nothing was lost.
    """
    lost = 0
    for n in range(1, upto + 1):
        r = load_attempt(job, sid, n)
        if r is None and _released(job, sid, n):
            continue
        lost += r is None or r.outcome in (None, "running")
    return lost


def _released(job: JobDir, sid: str, n: int) -> bool:
    """Was lease ``n`` given up (``Store.release``)? One head, no age asked: no clock read."""
    meta = job.store.head(lease_key(job, sid, n))
    return meta is not None and meta.released


def _done_status(sid: str, rows_in: int, attempts: int, rec: DoneRecord | IntegrityError | None) -> ShardStatus:
    """A done shard; a record verify and merge would refuse shows without its host (they say what is wrong)."""
    if not isinstance(rec, DoneRecord):
        return ShardStatus(id=sid, state="done", attempts=attempts, input_rows=rows_in)
    return ShardStatus(
        id=sid,
        state="done",
        host=rec.host,
        attempts=attempts,
        rows=rec.rows,
        input_rows=rows_in,
        backup={"won": rec.attempt} if rec.backup else None,
        error_rows=rec.error_rows,
    )


def _lease_state(store: ClaimStore, s: ShardStatus, now: float) -> None:
    age = store.heartbeat_age(s.id, s.attempts, now)
    lease = store.read_lease(s.id, s.attempts) or {}
    s.host = lease.get("host")
    if lease.get("backup_of") == s.attempts - 1:  # running while either the backup or its original is
        original = store.heartbeat_age(s.id, s.attempts - 1, now)
        if original is not None and (age is None or original < age):
            age = original
    if age is None or age == float("inf"):
        s.state = "pending"  # released: claimable at once
    else:
        s.heartbeat_age_secs = round(age, 1)
        s.state = "running" if store.fresh(age) else "stale"


def backup_view(job: JobDir, store: ClaimStore, book: RateBook, done: set[str], s: ShardStatus, now: float) -> dict:
    """A running backup: its host and attempt, the original's, and how late the original is."""
    book.update(done)
    original = s.attempts - 1
    late = late_attempt(job, store, book, s.id, original, now)
    info = load_attempt(job, s.id, original)
    return {
        "attempt": s.attempts,
        "host": s.host,
        "original_attempt": original,
        "original_host": info.host if info else None,
        "original_live": store.is_live(s.id, original, now),
        "original_elapsed_secs": round(late.elapsed, 1) if late else None,
        "expected_secs": round(late.expected, 1) if late else None,
    }


def _summarise(job: JobDir, manifest: Manifest, shards: list[ShardStatus], elapsed: float) -> JobStatus:
    counts = {state: 0 for state in STATES}
    hosts: dict[str, int] = {}
    for s in shards:
        counts[s.state] += 1
        if s.state == "done":
            hosts[s.host or "?"] = hosts.get(s.host or "?", 0) + 1
    rows_done = sum(s.input_rows for s in shards if s.state == "done")
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
        hosts_active=sorted({s.host or "?" for s in shards if s.state == "running"}),
        error_rows=sum(s.error_rows for s in shards),
        shard_count=len(shards),
    )


def first_line(text: str, limit: int = 300) -> str:
    """One line of an error for the console (tracebacks and ANSI colours stay in process.log)."""
    return one_line(text, limit) or ""


def error_rows_by_shard(job: JobDir) -> dict[str, int]:
    """Rows that ops removed by raising (Data-Juicer's skip_op_error), per done shard that lost any."""
    records = load_done_many(job, sorted(job.done_ids()))  # a refused record: verify and merge say why
    return {sid: r.error_rows for sid, r in records.items() if isinstance(r, DoneRecord) and r.error_rows > 0}


def describe_error_rows(found: dict[str, int]) -> str:
    """``2 row(s) removed by op errors ... in 1 shard(s): part-...=2; ...`` or an empty string."""
    if not found:
        return ""
    listing = ", ".join(f"{sid}={n}" for sid, n in list(found.items())[:5]) + (", ..." if len(found) > 5 else "")
    return (
        f"{sum(found.values())} row(s) removed by op errors (skip_op_error) in {len(found)} shard(s): {listing}; "
        "each shard's process.log has the errors, `dj-elastic report` the ops"
    )
