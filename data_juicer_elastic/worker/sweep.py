"""The job's state without listing the done or claims folders: a sweep of the worker records.

A sweep lists ``state/workers`` (one file per worker process, so O(processes)),
reads each record and probes the attempts they name: done (its record names
that attempt and worker: counted), live (a busy worker, for tail pacing and
speculation), or claimable (stale, released, or a hole: named but never
created). Requeued shards (``state/retry``, written by ``dj-elastic retry``) are
looked at too. The lane hints say how many never-claimed shards are left.

    done = sum of the records' ``published`` + pairs whose done record names them
           - publications archived by ``retry`` that a record's ``published`` sums

Each done record is counted at most once: through the pair of the worker
that holds it, or through that worker's ``published``, never both (the
ledger moves a pair to ``published`` in one rewrite). A retry archives a
done record and names, in the shard's retry record, the worker and attempt
that published it; the sweep subtracts it only where a record's
``published`` still sums it, so a retry, a late flush or an unreadable
record (an ESTALE, a cut read: it adds nothing) can only lower the count.

Only when that count says the job is unfinished while nothing is live,
claimable or fresh (a job dir written before worker records, or records
lost), and still so when it reads the records once more, does the sweep fall
back to listing ``state/done`` and ``state/claims`` once (only on a sweep that
read every listed record); what the records do
not account for is kept as ``legacy_done``, recomputed (never accumulated)
at each fallback, and it repeats at most once per lock timeout. The
snapshot is a cache, never an authority: one that says complete is
checked against a listing of ``state/done`` before any process ends on its
word (``SnapshotCache``), and corrected when the two disagree.

The result, a ``Snapshot``, is shared through ``state/progress.json``:
whoever finds it older than the refresh interval rebuilds it (one process
wins ``state/progress.d/<seq>`` O_EXCL and writes the next one), everybody
else reads one small file. So a progress tick, a waiting process's poll and
an idle worker's poll cost O(1) calls each, and the sweep's O(processes)
is paid once per interval for the whole job.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import orjson

from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records._read import int_or, number_or_none
from data_juicer_elastic.job.records.attempt import load_attempt
from data_juicer_elastic.job.records.retry import ARCHIVING, Archived, read_requeued, summed_by_records
from data_juicer_elastic.job.records.workers import WorkerRecord, read_key, read_workers
from data_juicer_elastic.storage.files import json_object
from data_juicer_elastic.worker.lanes import fresh_left, probed_fresh_left

Held = tuple[str, int]


@dataclass
class Busy:
    """A live attempt: who runs it and what its attempt record says (for pacing and speculation)."""

    shard: str
    attempt: int
    host: str
    pid: int = 0
    claimed_at: float = 0.0
    pace: float | None = None
    final: bool = False
    backup: bool = False  # this attempt is a backup (speculation)
    age: float = 0.0  # seconds since its lease was renewed, by the shared clock


@dataclass
class Snapshot:
    seq: int
    built_at: float  # the shared clock
    total: int
    done: int
    fresh_left: int
    live: list[Busy] = field(default_factory=list)
    claimable: list[Held] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    input_rows_done: int = 0
    output_rows: int = 0
    error_rows: int = 0
    first_start: float | None = None
    last_finish: float | None = None
    rates: list[float] = field(default_factory=list)  # recent input bytes per second per shard, all workers
    workers: int = 0
    swept: int = 0  # done shards the worker records account for (``done`` less ``legacy_done``)
    unreadable: int = 0  # worker records listed but not read this sweep (the fallback waits for them)
    exact: bool = False  # counted from a listing of state/done (the fallback)
    legacy_done: int = 0  # done records no worker record counts (a job dir run before worker records)
    fallback_at: float = 0.0  # the shared clock when the listing fallback last ran

    @property
    def complete(self) -> bool:
        return self.done >= self.total

    def to_bytes(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_bytes(cls, data: bytes) -> Snapshot | None:
        try:
            raw = {k: v for k, v in orjson.loads(data).items() if k in _FIELDS}  # an older version's extra keys
            raw["live"] = [Busy(**b) for b in raw.get("live", [])]
            raw["claimable"] = [(s, int(n)) for s, n in raw.get("claimable", [])]
            return cls(**raw)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


_FIELDS = frozenset(Snapshot.__dataclass_fields__)


def build(
    job: JobDir, store: ClaimStore, previous: Snapshot | None = None, lean: bool = False, again: bool = True
) -> Snapshot:
    """Sum the worker records and probe what they name (see the module docstring).

    ``lean`` (a tail pacing decision, which needs the busy workers now) keeps the previous count of
    fresh shards instead of reading every lane's hint. A sweep that finds the job unfinished and quiet
    sweeps ``again`` before it lists: a worker can claim and publish between the read of its record and
    the probes, so the last shards of a clean job looked unaccounted for (a listing of ``state/done``
    and ``state/claims`` in a job that needed none).
    """
    manifest = job.manifest()
    rows = manifest.shards.rows_by_id()
    total = len(rows)
    now = store.now()
    records, unreadable = read_workers(job.store, job.key(job.workers_dir))
    left = previous.fresh_left if lean and previous is not None else fresh_left(job, total)
    snap = Snapshot(seq=0, built_at=now, total=total, done=0, fresh_left=left)
    snap.workers = len(records)
    snap.unreadable = unreadable
    counted = 0
    latest: dict[str, int] = {}  # shard -> the highest attempt any record names
    # (shard, attempt) -> {worker: (host, pid)}: two records may name one attempt (a create lost to another)
    owner: dict[tuple[str, int], dict[str, tuple[str, int]]] = {}
    for r in records:
        snap.done += r.published
        snap.input_rows_done += r.input_rows
        snap.output_rows += r.output_rows
        snap.error_rows += r.error_rows
        snap.rates.extend(r.rates)
        if r.first_start is not None:
            snap.first_start = r.first_start if snap.first_start is None else min(snap.first_start, r.first_start)
        if r.last_finish is not None:
            snap.last_finish = r.last_finish if snap.last_finish is None else max(snap.last_finish, r.last_finish)
        for sid, attempt in r.pairs:
            if sid in rows:
                latest[sid] = max(latest.get(sid, 0), attempt)
                owner.setdefault((sid, attempt), {})[r.worker] = (r.host, r.pid)
    archived, requeued = read_requeued(job)
    _subtract_archived(snap, archived, records, rows)
    for sid, after in requeued.items():
        if sid in rows and sid not in latest:
            latest[sid] = after
    sizes = manifest.shards.bytes_by_id()
    for sid, named in sorted(latest.items()):
        done = _done_of(job, sid)
        if done is not None:
            attempt, worker = int_or(done.get("attempt")), str(done.get("worker") or "")
            if worker in owner.get((sid, attempt), {}):
                counted += 1
                _add_done(snap, done, rows[sid], sizes[sid])
            continue
        _place(store, snap, sid, named, now)
    snap.done += counted
    snap.swept = max(snap.done, 0)
    snap.legacy_done = previous.legacy_done if previous else 0
    snap.done = snap.swept + snap.legacy_done
    snap.failed = sorted(job.failed_ids())  # a missing folder lists none
    snap.fallback_at = previous.fallback_at if previous else 0.0
    if _needs_fallback(snap, job, store, now):
        if again:  # the records read may predate the job's last claims: read them once more first
            return build(job, store, previous, lean, again=False)
        _fallback(job, store, snap, now)
    snap.done = min(max(snap.done, 0), total)
    return snap


def _place(store: ClaimStore, snap: Snapshot, sid: str, named: int, now: float) -> None:
    """A shard that is not done: its latest attempt is live (busy) or claimable."""
    n = named if store.exists(sid, named) else named - 1  # a hole: never created
    n = store.latest_attempt(sid, max(n, 0))
    if n == 0:
        snap.claimable.append((sid, 0))
        return
    live = [a for a in (n, n - 1) if a > 0 and store.is_live(sid, a, now)]
    if live and (live[0] == n or store.backup_of(sid, n) is not None):
        for a in live:
            snap.live.append(_busy(store, sid, a, now))
        return
    snap.claimable.append((sid, n))


def _busy(store: ClaimStore, sid: str, attempt: int, now: float) -> Busy:
    info = load_attempt(store.job, sid, attempt)
    age = store.heartbeat_age(sid, attempt, now) or 0.0
    if info is None:
        lease = store.read_lease(sid, attempt) or {}
        return Busy(sid, attempt, str(lease.get("host", "?")), int(lease.get("pid") or 0), age=age)
    return Busy(sid, attempt, info.host, info.pid, info.claimed_at, info.pace, info.final, info.backup, age)


def _done_of(job: JobDir, sid: str) -> dict | None:
    """The shard's done record as written; None if it has none ({} if unreadable: done, counted by nobody)."""
    got = job.store.read(job.done_key(sid))
    return None if got is None else json_object(got[0])


def _add_done(snap: Snapshot, done: dict, rows: int, size: int) -> None:
    """A done shard its worker's record does not sum yet (published since the record's last rewrite)."""
    snap.input_rows_done += rows
    snap.output_rows += int_or(done.get("rows"))
    snap.error_rows += int_or(done.get("error_rows"))
    start, end = number_or_none(done.get("started_at")), number_or_none(done.get("finished_at"))
    if start is not None and end is not None and end > start:
        snap.rates.append(size / (end - start))
        snap.first_start = start if snap.first_start is None else min(snap.first_start, start)
        snap.last_finish = end if snap.last_finish is None else max(snap.last_finish, end)


def _subtract_archived(
    snap: Snapshot, archived: list[Archived], records: list[WorkerRecord], rows: Mapping[str, int]
) -> None:
    """Take out the archived publications a worker record's ``published`` still sums."""
    for a, _ in summed_by_records([a for a in archived if a.shard in rows], records):
        snap.done -= 1
        snap.input_rows_done -= rows[a.shard]
        snap.output_rows -= a.rows
        snap.error_rows -= a.error_rows


def _needs_fallback(snap: Snapshot, job: JobDir, store: ClaimStore, now: float) -> bool:
    if snap.complete or snap.live or snap.claimable or snap.failed:
        return False
    if snap.fresh_left > 0:  # only the lane hints say work is left: check them (a hint may lag or go back)
        snap.fresh_left = probed_fresh_left(job, store, job.manifest().shards.ids())
    quiet = snap.fresh_left == 0
    # every listed record read: a record read as missing would make its publications look unaccounted for
    whole = snap.unreadable == 0
    return not snap.complete and quiet and whole and now - snap.fallback_at >= store.lock_timeout


def _fallback(job: JobDir, store: ClaimStore, snap: Snapshot, now: float) -> None:
    """List state/done and state/claims once: exact count, and leases no worker record names."""
    done = job.done_ids() & set(job.manifest().shards.ids())
    # quiet: nothing is live, so nothing was published between the records' read and this listing
    snap.legacy_done = max(len(done) - snap.swept, 0)
    snap.done, snap.exact, snap.fallback_at = len(done), True, now
    failed = job.failed_ids()
    for sid, n in sorted(store.latest_attempts().items()):
        if sid not in done and sid not in failed:
            _place(store, snap, sid, n, now)
    for sid in job.manifest().shards.ids():  # never claimed and behind every lane's hint (an old job dir's hole)
        fresh = sid not in done and not store.exists(sid, 1)
        if fresh and (sid, 0) not in snap.claimable:
            snap.claimable.append((sid, 0))


def retry_stamp(job: JobDir) -> str | None:
    """What changes whenever ``retry`` requeues a shard: a digest of ``state/retry``'s listing (names and
    versions; a retry record's every version is new bytes), ``none`` while it is empty; None while a
    ``retry`` archives (its ``.archiving`` name stands: no stamp read then may vouch for a listing).
    A folder's mtime was one stat, but it moves in clock ticks: two writes in one tick left it still."""
    listed = sorted((e.key, e.ver) for e in job.store.list(job.key(job.retry_dir)))
    if any(key.endswith(ARCHIVING) for key, _ in listed):
        return None
    digest = b"\n".join(f"{key} {ver}".encode() for key, ver in listed)
    return hashlib.sha256(digest).hexdigest()[:16] if digest else "none"


class SnapshotCache:
    """This process's view of ``state/progress.json``: read at most once per interval, rebuilt when old.

    A snapshot that says complete is confirmed against a listing of ``state/done`` before this process acts
    on it, once for the whole job: the process that lists leaves ``progress.d/complete-<stamp>`` (the retry
    folder's stamp, read before it listed), and the others trust it while that stamp is unchanged, since
    only ``retry`` takes a done record away, and it moves the stamp after (``retry.requeue`` says why).
    The marker does not ride in the snapshot: a snapshot rebuilt while the lister listed would drop it,
    and the next one would list again.
    One the listing contradicts (an old submission's snapshot after a retry, a count a record read wrongly)
    is corrected and written back.
    """

    def __init__(self, job: JobDir, store: ClaimStore, interval: float) -> None:
        self.job, self.store, self.interval = job, store, interval
        self.snap: Snapshot | None = None
        self._read_at = -1e18  # local monotonic time of the last read
        self._seen: tuple[int, float] | None = None  # (seq, local time it was first seen)
        self._complete = False  # confirmed against the done records
        self._progress = job.key(job.progress_path)
        self._tickets = job.key(job.state_dir / "progress.d")  # the rebuild tickets' and markers' prefix
        self._token = uuid.uuid4().hex.encode()  # a ticket's body: S3 takes a create resent onto equal bytes as ours

    def get(self, fresh: bool = False) -> Snapshot:
        """The snapshot; ``fresh`` reads the file again even within the interval."""
        now = time.monotonic()
        if self.snap is not None and not fresh and now - self._read_at < self.interval:
            return self.snap
        self._read_at = now
        snap = self._read()
        if snap is None or now - self._seen[1] >= self.interval:  # nobody rebuilt it for an interval
            snap = self._rebuild(snap, now) or snap
        if snap is None:  # no file and another process is rebuilding it: sweep for ourselves
            snap = build(self.job, self.store)
        self.snap = self._confirmed(snap)
        return self.snap

    def refresh(self, newer_than: float, lean: bool = False) -> Snapshot:
        """A snapshot built at or after ``newer_than`` (the shared clock), for a worker woken by a change or
        deciding at the tail (``lean``: it needs the busy workers now, not the lanes' count again).

        One process wins the rebuild; the others read its result, so a wake, or the tail decisions of hundreds
        of workers, cost the job one sweep, not one each. Nobody's result within an interval (its builder
        died): this process sweeps for itself.
        """
        deadline = time.monotonic() + max(self.interval, 1.0)
        while True:
            snap = self._read()
            if snap is not None and snap.built_at >= newer_than:
                self.snap, self._read_at = self._confirmed(snap), time.monotonic()
                return self.snap
            built = self._rebuild(snap, time.monotonic(), lean)
            if built is not None or time.monotonic() >= deadline:
                snap = built or build(self.job, self.store, snap, lean)
                self.snap, self._read_at = self._confirmed(snap), time.monotonic()
                return self.snap
            time.sleep(0.2)

    def _read(self) -> Snapshot | None:
        data = read_key(self.job.store, self._progress)  # unreadable reads as missing: the next look rebuilds it
        snap = Snapshot.from_bytes(data) if data else None
        now = time.monotonic()
        if snap is not None and (self._seen is None or self._seen[0] != snap.seq):
            age = max(self.store.now() - snap.built_at, 0.0) if self._seen is None else 0.0  # first sight
            self._seen = (snap.seq, now - age)
        return snap

    def _confirmed(self, snap: Snapshot) -> Snapshot:
        """``snap``, unless it says complete and the done records do not: then corrected from their listing."""
        if not snap.complete or self._complete:
            return snap
        stamp = retry_stamp(self.job)
        if stamp is None:  # a retry is archiving: list for ourselves, and leave no marker
            return self._listed(snap, None)
        marker = f"complete-{stamp}"
        deadline = time.monotonic() + 4 * max(self.interval, 1.0)
        while self.job.store.head(self._ticket(marker)) is None:
            # one process lists the done records for everyone; the others wait for its marker (or list for
            # themselves once it is late: its lister died, or found the snapshot wrong and a newer one says
            # complete again)
            if self._won(f"confirm-{stamp}-{snap.seq}") or time.monotonic() > deadline:
                return self._listed(snap, marker)
            time.sleep(0.2)
            latest = self._read()
            if latest is not None and latest.built_at >= snap.built_at:  # never trade ours for an older one
                snap = latest
            if not snap.complete:
                return snap
        self._complete = True
        return snap

    def _listed(self, snap: Snapshot, marker: str | None) -> Snapshot:
        """``snap`` checked against one listing of the done records: confirmed, or corrected from it."""
        ids = set(self.job.manifest().shards.ids())
        done = len(self.job.done_ids() & ids)
        if done >= snap.total:
            self._complete = True
            if marker is not None:
                self._won(marker)  # not made (a flaky mount): the others list for themselves
            return snap
        snap.legacy_done = max(min(snap.legacy_done, done - snap.swept), 0)
        snap.done, snap.exact = done, True
        self._write(snap)
        return snap

    def _rebuild(self, old: Snapshot | None, now: float, lean: bool = False) -> Snapshot | None:
        seq = (old.seq if old else 0) + 1
        waited = 0 if self._seen is None else int((now - self._seen[1]) // max(self.store.lock_timeout, 1.0))
        name = f"{seq}" if waited < 1 else f"{seq}.{waited}"  # a rebuilder that died leaves its lock behind
        if not self._won(name):
            return None
        snap = build(self.job, self.store, old, lean)
        snap.seq = seq
        self._write(snap)
        for stale in (f"{seq - 1}", f"{seq - 1}.{waited}"):
            try:
                self.job.store.delete(self._ticket(stale))
            except OSError:
                pass
        return snap

    def _won(self, ticket: str) -> bool:
        """Did this process create ``progress.d/<ticket>`` (one process per ticket does)? A flaky mount: no.
        A missing ``progress.d`` is made by the create (POSIX), as S3 needs none."""
        try:
            return self.job.store.create(self._ticket(ticket), self._token, exclusive=True) is not None
        except OSError:  # another process, or the next look, does it
            return False

    def _ticket(self, name: str) -> str:
        return f"{self._tickets}/{name}"

    def _write(self, snap: Snapshot, tries: int = 5) -> None:
        """Put ``snap`` in place unless a newer one is there: replaced only in the version just read (a
        rebuilder paused between its read and its write cannot put an older snapshot over a newer one); a
        lost race reads again; a write that fails leaves the old file, which the next look rebuilds."""
        for _ in range(tries):
            try:
                got = self.job.store.read(self._progress)
            except OSError:
                return
            current = Snapshot.from_bytes(got[0]) if got is not None else None
            if current is not None and current.seq > snap.seq:
                return
            try:
                if got is None:
                    written = self.job.store.create(self._progress, snap.to_bytes(), durable=False) is not None
                else:
                    ver = self.job.store.replace(self._progress, snap.to_bytes(), got[1].ver, durable=False)
                    written = ver is not None
            except OSError:
                return
            if written:
                self._seen = (snap.seq, time.monotonic())
                return
