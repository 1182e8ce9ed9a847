"""The retry record, ``state/retry/<shard>.json``: attempts up to ``after_attempt`` no longer count.

Written by ``requeue`` (``dj-elastic retry``), which also archives the shard's
failed and done records in ``state/history``: nothing is deleted. It releases
the leases of the shard's attempts that ended (a done attempt's lease is never
released, only no longer renewed): an ended attempt holds nothing, so the
requeued shard is claimable at once instead of after ``lock_timeout``. Read by the
worker's failure count (``retry_base``), which refuses one it cannot trust:
a wrong number would hand a shard more, or fewer, retries than the policy says.

While it archives, ``state/retry/<stamp>.archiving`` stands (``ARCHIVING``): the
end-of-job confirmation (``worker.sweep.SnapshotCache``) neither makes nor
trusts a "complete" marker while one does (see ``requeue``). One retry of a
generation runs at a time: ``state/retry.lock`` (``retry_lock``).
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import orjson

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.job.claims import claim_store
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records._read import MISSING, int_or, load_key
from data_juicer_elastic.job.records.attempt import load_attempt
from data_juicer_elastic.job.records.done import is_done, load_done
from data_juicer_elastic.job.records.failed import is_failed
from data_juicer_elastic.job.records.retry_lock import RetryLock, take
from data_juicer_elastic.job.records.workers import WorkerRecord, read_key
from data_juicer_elastic.storage.files import dumps_json

STAGE_DONE = "stage-done"  # dedup units' done records, in the generation's state folder (dedup/layout.py)
ARCHIVING = ".archiving"  # the suffix of the name a requeue holds in state/retry while it archives
_STAMP_RE = re.compile(r"^[0-9]{8}T[0-9]{6}-[0-9a-f]{6}$")


@dataclass(frozen=True)
class RetryRecord:
    shard: str
    after_attempt: int
    at: float
    # each archived done record's publisher: {"attempt", "worker", "rows", "error_rows"}; the sweep subtracts
    # one from the counts only where that worker's record still sums it (worker.sweep)
    archived: tuple[dict, ...] = ()


@dataclass(frozen=True)
class Archived:
    """A done record ``retry`` archived: who published it (counts subtract it where a worker record's sum holds it)."""

    shard: str
    attempt: int
    worker: str
    rows: int = 0
    error_rows: int = 0


def read_requeued(job: JobDir) -> tuple[list[Archived], dict[str, int]]:
    """(done records archived by retry; requeued shard -> the attempt after which it starts again)."""
    folder = job.key(job.retry_dir)
    archived, found = [], {}
    for name in job.store.names(folder):  # a missing folder has none
        if not name.endswith(".json"):
            continue
        data = read_key(job.store, f"{folder}/{name}")
        try:
            raw = orjson.loads(data) if data else {}
            after = raw.get("after_attempt", 0)
            for a in raw.get("archived") or []:
                archived.append(
                    Archived(
                        name[:-5],
                        int(a["attempt"]),
                        str(a["worker"]),
                        int_or(a.get("rows")),
                        int_or(a.get("error_rows")),
                    )
                )
        except (ValueError, TypeError, AttributeError, KeyError):
            continue
        if type(after) is int:
            found[name[:-5]] = after
    return archived, found


def summed_by_records(archived: list[Archived], records: list[WorkerRecord]) -> Iterator[tuple[Archived, WorkerRecord]]:
    """The archived publications a worker record's ``published`` still sums, each with that record.

    Its worker's record is readable and no longer names the pair: a record still naming it counts it only
    through its done record, which retry moved away, and an unreadable record sums nothing. Counts built
    from the records (the sweep, ``status``) take these out again.
    """
    by_worker = {r.worker: r for r in records}
    for a in archived:
        r = by_worker.get(a.worker)
        if r is not None and (a.shard, a.attempt) not in r.pairs:
            yield a, r


def write_retry(job: JobDir, record: RetryRecord, stamp: str) -> None:
    """Put ``record`` in place; an earlier one goes to history under ``stamp`` and is replaced only if unchanged.

    Raises UserError when another ``retry`` of the shard wrote its record meanwhile (nothing is overwritten).
    """
    key = job.key(job.retry_path(record.shard))
    # the stamp makes every version's bytes new, so its ETag too: a listing's versions show each retry
    body = {"shard": record.shard, "after_attempt": record.after_attempt, "at": record.at, "stamp": stamp}
    data = dumps_json({**body, "archived": list(record.archived)})
    earlier = job.store.read(key)
    if earlier is None:
        written = job.store.create(key, data) is not None
    else:
        _keep(job, earlier[0], f"{stamp}-{record.shard}.retry.json")
        written = job.store.replace(key, data, if_ver=earlier[1].ver) is not None
    if not written:
        raise UserError(
            f"retry: {job.retry_path(record.shard)} was written by another `dj-elastic retry` meanwhile; "
            "check `dj-elastic status`, then run it again if the shard still needs it"
        )


def _keep(job: JobDir, data: bytes, name: str) -> None:
    """Put a copy of a record in state/history (create-once: nothing there is ever overwritten)."""
    if job.store.create(job.key(job.history_dir / name), data) is None:
        raise UserError(f"retry: {job.history_dir / name} exists already; run retry again (a new name is drawn)")


def _archive(job: JobDir, key: str, name: str, lock: RetryLock) -> None:
    """Move the record at ``key`` to state/history: a copy first, then the record (see ``requeue``).

    A kill between the two leaves both; the record still stands, so the shard reads as before and a
    later ``retry`` archives it again.
    """
    got = job.store.read(key)
    if got is None:
        if job.store.head(key) is not None:  # the name is taken (a worker sees it done), but not by a record
            raise IntegrityError(f"{job.root / key}: not a record (a link?); move it away, then run retry again")
        return  # archived meanwhile by another retry
    _keep(job, got[0], name)
    lock.renew()  # still the one retry: nobody else deleted this key since it was read
    lock.delete_ok()
    job.store.delete(key, if_ver=got[1].ver if _conditional_delete(job.store) else None)


def _conditional_delete(store: object) -> bool:
    """Whether ``delete(if_ver=...)`` is kept (POSIX checks, then unlinks; S3 where the probe saw it)."""
    return not getattr(store, "probed", False) or store.conditions().delete_if_match  # type: ignore[attr-defined]


def retry_base(job: JobDir, shard: str) -> int:
    """The last attempt that no longer counts (0 without a retry record). Raises IntegrityError."""
    path = job.retry_path(shard)
    try:
        raw = load_key(job.store, job.key(path))  # a link at its name is no record
    except (OSError, ValueError):
        raw = None
    if raw is MISSING:
        return 0
    base = raw.get("after_attempt", 0) if isinstance(raw, dict) else None
    if type(base) is not int or base < 0:
        raise IntegrityError(
            f"{path}: not a retry record (after_attempt must be a "
            "whole number); restore it or run `dj-elastic retry` for the shard again"
        )
    return base


def _archived_so_far(job: JobDir, shard: str) -> tuple[dict, ...]:
    """The publishers the shard's earlier retry record names (its archived done records)."""
    try:
        raw = load_key(job.store, job.key(job.retry_path(shard)))
    except (OSError, ValueError):
        return ()
    found = raw.get("archived") if isinstance(raw, dict) else None
    return tuple(a for a in found if isinstance(a, dict)) if isinstance(found, list) else ()


def _publisher(job: JobDir, shard: str) -> dict | None:
    """Who published the shard's done record, as the retry record keeps it; None if it has none."""
    try:
        done = load_done(job, shard)
    except IntegrityError:
        return None
    if done is None:
        return None
    return {"attempt": done.attempt, "worker": done.worker, "rows": done.rows, "error_rows": done.error_rows}


def requeue(
    job: JobDir,
    shard_ids: list[str] | None = None,
    *,
    all_failed: bool = False,
    log: Callable[[str], None] | None = None,
) -> list[str]:
    """Requeue shards: archive their failed/done records in state/history, reset the retry budget.

    The budget is reset by a retry record naming the last attempt so far, so
    earlier attempts stop counting; nothing is deleted. With ``all_failed`` and
    no failed shard it requeues nothing and returns ``[]``: the state asked for
    already holds (the caller says so); naming no shard at all is a UserError.

    Why a record deleted is the record read, even where DELETE ignores ``If-Match`` (Ceph RGW 16): done and
    failed records are only ever created (``publish_done``/``publish_failed``: create-once, a backup's
    too), never replaced, and this is their only deleter. So between our read and our delete only another
    retry can change the key (delete it, then a new attempt create a new one). ``state/retry.lock``
    (``retry_lock``) lets one retry of a generation run at a time, on every store: one path, and POSIX's
    delete on a version is a check, then an unlink; a version is still sent where the store keeps it.

    Why no "complete" marker outlives it: a marker names the retry stamp read before its maker listed
    ``state/done`` (a digest of this folder's names and versions). The ``.archiving`` name stands from
    before the first write to after the last archive, so a stamp read meanwhile is no stamp (no marker);
    one read before it differs from every stamp after (this run's records are new versions); one read
    after it was read after every archive, so its listing misses the archived done records. A kill -9
    leaves the name: the retry that takes its lock over removes it once its own stands.
    """
    if not all_failed and not shard_ids:
        raise UserError("retry: name shards with --shard-id, or use --all-failed")
    failed_now = job.failed_ids() if shard_ids else set()
    for sid in shard_ids or ():
        if sid not in failed_now:  # a failed record's name is a shard's or a dedup unit's (one listed: no path)
            _refuse_done_unit(job, sid)
            job.shard(sid)  # validates the id
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]
    lock = take(job, stamp, log or _say)
    try:
        if all_failed:
            shard_ids = sorted(job.failed_ids())  # listed under the lock: no other retry archives meanwhile
            if not shard_ids:
                return []
        _requeue_all(job, shard_ids or [], stamp, lock)
    finally:
        lock.release()
    return list(shard_ids or [])


def _refuse_done_unit(job: JobDir, sid: str) -> None:
    """A done dedup unit is not requeued: the stages after it read its outputs, so redoing it alone could leave
    them built on other rows; its record stays (a new recipe generation redoes every stage)."""
    if "/" in sid or sid.startswith("."):
        return  # no unit id: ``job.shard`` says what is wrong with it
    if job.store.head(job.key(job.state_dir / STAGE_DONE / f"{sid}.json")) is not None:
        raise UserError(
            f"retry: dedup unit {sid} is done and later stages read what it wrote; it is not requeued "
            "(only a unit failed past its retry budget is: --all-failed)"
        )


def _requeue_all(job: JobDir, shard_ids: list[str], stamp: str, lock: RetryLock) -> None:
    """Each shard's requeue, under the ``.archiving`` name (and a killed holder's name removed, once ours stands)."""
    busy = job.key(job.retry_dir / f"{stamp}{ARCHIVING}")
    if job.store.create(busy, stamp.encode()) is None:
        raise UserError(f"retry: {job.retry_dir / (stamp + ARCHIVING)} exists already; run retry again")
    try:
        dead = lock.took_from.get("stamp")
        if isinstance(dead, str) and _STAMP_RE.match(dead) and dead != stamp:
            job.store.delete(job.key(job.retry_dir / f"{dead}{ARCHIVING}"))
        for sid in shard_ids:
            _requeue_one(job, sid, stamp, lock)
    finally:
        job.store.delete(busy)


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def _requeue_one(job: JobDir, sid: str, stamp: str, lock: RetryLock) -> None:
    """One shard, or one dedup unit failed past its budget (``state/failed/<unit>.json``, dedup/budget.py): the
    same records, the same budget reset (the unit's failure count reads its retry record too). Nothing after a
    failed unit is redone, and nothing needs to be: a unit publishes its done record only after its outputs, and
    a failed unit has none, so no later stage (which starts only on the whole stage before it done) ever ran on
    its inputs; a done unit is never requeued (``_refuse_done_unit``)."""
    lock.renew()
    store = claim_store(job)
    failed, done = is_failed(job, sid), is_done(job, sid)
    latest = store.latest_attempt(sid)
    if not failed and not done:
        state = "running" if latest else "pending"
        raise UserError(f"retry: shard {sid} is {state}, not failed or done; nothing to requeue")
    publishers = _archived_so_far(job, sid)
    publisher = _publisher(job, sid) if done else None
    if publisher is not None:
        publishers = (*publishers, publisher)
    write_retry(job, RetryRecord(sid, latest, time.time(), publishers), stamp)
    if failed:
        _archive(job, job.failed_key(sid), f"{stamp}-{sid}.failed.json", lock)
    if done:
        _archive(job, job.done_key(sid), f"{stamp}-{sid}.done.json", lock)
    for attempt in (latest, latest - 1):  # the latest, and the attempt it may back up
        if attempt > 0 and _ended(job, sid, attempt):
            store.release_attempt(sid, attempt)


def _ended(job: JobDir, shard: str, attempt: int) -> bool:
    """Did the attempt end (its record names an outcome other than running)? Then its lease holds nothing."""
    record = load_attempt(job, shard, attempt)
    return record is not None and record.outcome not in (None, "running")
