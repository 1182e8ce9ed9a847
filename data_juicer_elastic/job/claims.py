"""Leases on shards, kept as files in ``state/claims``.

Each attempt at a shard is one lease file, ``<shard>@<attempt>``, created
with O_CREAT|O_EXCL: attempt numbers are the fencing tokens. Whoever creates
``<shard>@<n+1>`` has superseded attempt ``n``, so when several workers find
the same stale lease at once, exactly one wins the next number. A lease lives
while its owner renews the file's mtime; it is stale once the shared
filesystem's clock (never the local one) is ``lock_timeout`` past that mtime.
Heartbeats rewrite a byte of the lease (``Store.renew`` from the refresher,
``heartbeat``), so the file server stamps them. Releasing a lease sets its
mtime to 1 (the epoch's first second: sshfs turns an mtime of 0 into "now"),
which makes it claimable at once.

A lease also records its process's identity (pid, start time, boot id:
``storage.host.identity``). A process of the same host that can prove that
holder gone (killed, its pod restarted under the same host name) treats the
lease as stale at once instead of after ``lock_timeout`` (``is_live``); a
lease of another host always waits out the timeout.

Backups (``worker/speculation.py``) are the one exception to "one live lease
per shard": a backup of a live, late attempt ``n`` is attempt ``n+1`` whose
lease body says ``"backup_of": n``. It is published whole (write, then link),
so a lease whose body does not (yet) say so is an ordinary takeover. Attempt
``n`` then stays current beside its backup; only attempt ``n+2`` fences both
(``is_current``), and that is only claimed once neither of them is live
(``live_pair``).

Every lease operation goes through the job's store (keys relative to its
root: ``generations/<gen>/state/claims/<shard>@<n>``; docs/OBJECT_STORE.md).
On POSIX that is a ``PosixStore`` on the job root with this process's own
clock probe, with the system calls of old: an age is one lstat aged by a ``now`` the caller holds, a claim
is O_EXCL + write (``create(exclusive=True)``), and its store stamp is
``claimed_at``.

Nothing here lists the claims folder on the hot path: a shard's latest
attempt is found by probing ``<shard>@0001``, ``@0002``, ... until one is
missing (``latest_attempt``; bounded by retries plus backups). Before it
creates a lease, the store names the attempt in this process's worker record
(``job.records.workers``), so whatever the process leaves behind can be found
from that record instead of from a listing.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.done import is_done
from data_juicer_elastic.job.records.workers import WorkerLedger
from data_juicer_elastic.storage.files import dumps_json
from data_juicer_elastic.storage.host import holder_gone, hostname, identity
from data_juicer_elastic.storage.posix import RELEASED_MTIME
from data_juicer_elastic.storage.refresher import LeaseRefresher
from data_juicer_elastic.storage.store import Store, Ver

SEP = "@"
__all__ = [
    "RELEASED_MTIME",
    "ClaimStore",
    "Lease",
    "claim_store",
    "heartbeat",
    "lease_backup_of",
    "lease_key",
    "lease_name",
    "parse_lease_name",
    "read_lease",
]


@dataclass(frozen=True)
class Lease:
    shard: str
    attempt: int
    host: str
    pid: int
    token: str
    path: Path
    claimed_at: float = 0.0  # the shared filesystem's clock when the lease file was made
    backup_of: int | None = None  # the live attempt this one backs up (speculation), if any


def lease_name(shard: str, attempt: int) -> str:
    return f"{shard}{SEP}{attempt:04d}"


def parse_lease_name(name: str) -> tuple[str, int] | None:
    shard, sep, num = name.rpartition(SEP)
    if not sep or not num.isdigit():
        return None
    return shard, int(num)


def latest_of(names: Iterable[str]) -> dict[str, int]:
    """Highest attempt number per shard among lease names (a listing of the claims folder); other names are
    skipped. Split, not matched: on 100,000 names a call per name costs more than the listing."""
    latest: dict[str, int] = {}
    for name in names:
        shard, sep, num = name.rpartition(SEP)
        if sep and num.isdigit() and int(num) > latest.get(shard, 0):
            latest[shard] = int(num)
    return latest


class ClaimStore:
    """Claim, renew, release and take over leases for one worker process."""

    def __init__(self, job: JobDir, *, lock_timeout: float, host: str, pid: int | None = None) -> None:
        self.job = job
        self.lock_timeout = lock_timeout
        self.host = host
        self.pid = os.getpid() if pid is None else pid
        self.store: Store = job.store.with_clock(job.key(job.clock_dir / f"{host}-{self.pid}"))  # its own probe
        self._vers: dict[str, Ver] = {}  # lease key -> the version this process last created or renewed
        self._ledger: WorkerLedger | None = None
        self._holders: dict[tuple[str, int], dict] = {}  # lease bodies read so far (a lease's body never changes)
        self._gone: set[tuple[str, int]] = set()  # leases whose holder was proven gone (it stays gone)

    @property
    def ledger(self) -> WorkerLedger:
        """This process's worker record (made on first use: a read-only store never writes one)."""
        if self._ledger is None:
            job = self.job
            self._ledger = WorkerLedger(job.store, job.key(job.workers_dir), self.host, self.pid, uuid.uuid4().hex[:8])
        return self._ledger

    def flush(self) -> None:
        """Write this process's worker record if it changed since (what it published since its last claim)."""
        if self._ledger is not None:
            try:
                self._ledger.flush()
            except OSError:  # a record that lags is still counted right: through its pairs' done records
                pass

    # views ----------------------------------------------------------------
    def now(self) -> float:
        """The shared filesystem's clock."""
        return self.store.now()

    def latest_attempts(self) -> dict[str, int]:
        """Highest attempt number per shard, from one listing of names (a missing folder has none)."""
        return latest_of(self.store.names(self.job.key(self.job.claims_dir)))

    def latest_attempt(self, shard: str, start: int = 0) -> int:
        """The shard's highest attempt number, by probing leases upward from ``start`` (no listing).

        ``start`` is an attempt known to exist (0: none known). Attempt numbers
        only grow by one, so the first missing number ends the probe.
        """
        n = start
        while self.exists(shard, n + 1):
            n += 1
        return n

    def exists(self, shard: str, attempt: int) -> bool:
        """Is the lease's name taken (one lstat, no clock; a link there counts, a folder does not)?"""
        return self.store.head(self.key(shard, attempt)) is not None

    def lease_path(self, shard: str, attempt: int) -> Path:
        return self.job.claims_dir / lease_name(shard, attempt)

    def key(self, shard: str, attempt: int) -> str:
        """The lease's key in ``self.store`` (relative to the job root)."""
        return lease_key(self.job, shard, attempt)

    def heartbeat_age(self, shard: str, attempt: int, now: float) -> float | None:
        """Seconds since the lease was renewed (inf if released); None if it vanished.

        A symlink in the claims folder is not followed: no worker makes one, and
        following it would let any file outside the job dir keep a shard "live".
        """
        meta = self.store.head(self.key(shard, attempt), now=now)  # one lstat, aged by the caller's clock reading
        if meta is None:
            return None
        return float("inf") if meta.released else meta.age

    def is_live(self, shard: str, attempt: int, now: float) -> bool:
        """Renewed within ``lock_timeout``, and not held by a process of this host that is provably gone."""
        age = self.heartbeat_age(shard, attempt, now)
        return age is not None and self.fresh(age) and not self.holder_gone(shard, attempt)

    def fresh(self, age: float) -> bool:
        """The one judge of staleness: an age read on the store is fresh below ``lock_timeout`` plus the
        store's stamp resolution (S3's whole seconds read a lease renewed 1.2 s ago as 2 s old)."""
        return age < self.lock_timeout + self.store.stamp_resolution

    def holder_gone(self, shard: str, attempt: int) -> bool:
        """Is the lease's holder a process of this host that no longer runs (``storage.host.holder_gone``)?

        The lease body is read once per lease (it never changes) and only proves anything when it names
        this host; another host's lease costs one read, then a dict lookup.
        """
        key = (shard, attempt)
        if key in self._gone:
            return True
        body = self._holders.get(key)
        if body is None:
            body = self.read_lease(shard, attempt)
            if not body or "pid" not in body:  # being written (create, then write) or unreadable: prove nothing
                return False
            self._holders[key] = body = {k: body.get(k) for k in ("host", "pid", "start", "boot")}
        if body["host"] != self.host or (body["pid"] == os.getpid() and body["start"] == identity()["start"]):
            return False
        if holder_gone(body, self.host):
            self._gone.add(key)
            return True
        return False

    def read_lease(self, shard: str, attempt: int) -> dict | None:
        return _lease_body(self.store, self.key(shard, attempt))

    def backup_of(self, shard: str, attempt: int) -> int | None:
        """The attempt that lease ``attempt`` backs up, or None for an ordinary (or unreadable) lease."""
        return _backup_of(self.read_lease(shard, attempt), attempt)

    def live_pair(self, shard: str, latest: int, now: float) -> bool:
        """Is the shard held live: its latest lease, or, when that is a backup, the attempt it backs up?"""
        if self.is_live(shard, latest, now):
            return True
        return self.backup_of(shard, latest) is not None and self.is_live(shard, latest - 1, now)

    # actions ----------------------------------------------------------------
    def try_claim(self, shard: str, current: int) -> Lease | None:
        """Take attempt ``current + 1`` of ``shard``; the caller judged ``current`` free or stale."""
        attempt = current + 1
        token = uuid.uuid4().hex
        body = {"shard": shard, "attempt": attempt, "host": self.host, "token": token, **self._identity()}
        self.ledger.hold(shard, attempt)  # on disk before the lease: a crash from here on leaves a trace
        lease = self._create(shard, attempt, token, body, exclusive=True)  # O_EXCL + write: the name is the claim
        if lease is None:
            self.ledger.drop(shard, attempt)
            return None
        if not self.is_current(lease):  # what we looked at was old: a later attempt already exists
            self.ledger.drop(shard, attempt)
            return None
        return lease

    def try_backup(self, shard: str, original: int) -> Lease | None:
        """Take attempt ``original + 1`` as a backup of the live attempt ``original``."""
        attempt = original + 1
        token = uuid.uuid4().hex
        body = {"shard": shard, "attempt": attempt, "host": self.host, "token": token, **self._identity()}
        self.ledger.hold(shard, attempt)
        lease = self._create(shard, attempt, token, {**body, "backup_of": original}, exclusive=False)  # whole
        if lease is None:
            self.ledger.drop(shard, attempt)
            return None
        if not self.is_current(lease):
            self.ledger.drop(shard, attempt)
            return None
        return lease

    def _create(self, shard: str, attempt: int, token: str, body: dict, *, exclusive: bool) -> Lease | None:
        """Create the lease's key: the Lease, stamped with the create's own store time, or None when taken."""
        key = self.key(shard, attempt)
        meta = self.store.create(key, dumps_json(body), exclusive=exclusive)
        if meta is None:
            return None
        self._vers[key] = meta.ver
        path, of = self.lease_path(shard, attempt), body.get("backup_of")
        return Lease(shard, attempt, self.host, self.pid, token, path, meta.modified, backup_of=of)

    def _identity(self) -> dict:
        """What a lease records of its holder: the pid, and this process's start time and boot id when the
        store claims for this process (a store made for another pid records only that pid)."""
        me = identity()
        return me if self.pid == me["pid"] else {"pid": self.pid}

    def is_current(self, lease: Lease) -> bool:
        """True while no later attempt fences this one; attempt numbers only ever grow by one.

        A backup of this very attempt does not fence it: only the attempt after the backup does.
        """
        nxt = lease.attempt + 1
        if not self.exists(lease.shard, nxt):
            return True
        if self.backup_of(lease.shard, nxt) != lease.attempt:
            return False
        return not self.exists(lease.shard, nxt + 1)

    def renew(self, lease: Lease) -> bool:
        """One heartbeat by hand (the refresher beats on its own); False once the lease is lost or released."""
        key = self.key(lease.shard, lease.attempt)
        ver = self.ver(lease)
        new = None if ver is None else self.store.renew(key, ver)
        if new is not None:
            self._vers[key] = new
        return new is not None

    def ver(self, lease: Lease) -> Ver | None:
        """The lease's version as this process last created or renewed it, else as it is now; None when gone."""
        key = self.key(lease.shard, lease.attempt)
        return self._vers.get(key) or _ver_now(self.store, key)

    def hand_over(self, lease: Lease) -> Ver | None:
        """``ver``, for a refresher that renews the lease from now on: this store forgets it, so a later beat
        by hand reads the lease's version anew instead of sending one the refresher moved past."""
        ver = self.ver(lease)
        self._vers.pop(self.key(lease.shard, lease.attempt), None)
        return ver

    def release(self, lease: Lease) -> None:
        """Make the shard claimable at once (a released mtime reads as infinitely stale)."""
        self.release_attempt(lease.shard, lease.attempt)

    def release_attempt(self, shard: str, attempt: int) -> None:
        """Release attempt ``attempt``'s lease, whoever made it (the caller knows it holds nothing)."""
        key = self.key(shard, attempt)
        self.store.release(key)  # one utime; a lease that is gone needs nothing
        self._vers.pop(key, None)


def claim_store(job: JobDir, host: str | None = None) -> ClaimStore:
    """The claim store of this process for ``job``, with the manifest's lock timeout."""
    return ClaimStore(job, lock_timeout=job.manifest().policy.lock_timeout_secs, host=host or hostname())


def lease_key(job: JobDir, shard: str, attempt: int) -> str:
    """A lease's store key: its path relative to the job root."""
    return f"{job.claims_dir.relative_to(job.root).as_posix()}/{lease_name(shard, attempt)}"


def read_lease(job: JobDir, shard: str, attempt: int) -> dict | None:
    """A lease file's body (not following a symlink), or None."""
    return _lease_body(job.store, lease_key(job, shard, attempt))


def lease_backup_of(job: JobDir, shard: str, attempt: int) -> int | None:
    """The attempt that lease ``attempt`` backs up, or None for an ordinary (or unreadable) lease."""
    return _backup_of(read_lease(job, shard, attempt), attempt)


def _lease_body(store: Store, key: str) -> dict | None:
    """The JSON object a lease holds; None when missing, a link, unreadable or not one (no age: no clock read)."""
    try:
        got = store.read(key)
        data = None if got is None else orjson.loads(got[0])
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _backup_of(body: dict | None, attempt: int) -> int | None:
    of = (body or {}).get("backup_of")
    return of if type(of) is int and of == attempt - 1 else None


def _ver_now(store: Store, key: str) -> Ver | None:
    meta = store.head(key)  # the version only: its clock is never read
    return None if meta is None else meta.ver


def heartbeat(
    store: ClaimStore,
    lease: Lease,
    interval: float,
    log: Callable[[str], None],
    on_lost: Callable[[], None] | None = None,
) -> LeaseRefresher:
    """Renews ``lease`` while its attempt runs, through the store, from the version this process holds.

    ``.lost`` is set (and ``on_lost`` called) once a later attempt superseded it, or once another
    attempt of the shard (its backup, or the original it backs up) published the done record. The
    refresher then holds the lease's version (``ClaimStore.hand_over``).
    """
    return LeaseRefresher(
        store.store,
        store.key(lease.shard, lease.attempt),
        store.hand_over(lease),
        interval,
        still_ours=lambda: store.is_current(lease) and not is_done(store.job, lease.shard),
        log=log,
        on_lost=on_lost,
    )
