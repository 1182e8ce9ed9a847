"""Leases on shards, kept as files in ``state/claims``.

Each attempt at a shard is one lease file, ``<shard>@<attempt>``, created
with O_CREAT|O_EXCL: attempt numbers are the fencing tokens. Whoever creates
``<shard>@<n+1>`` has superseded attempt ``n``, so when several workers find
the same stale lease at once, exactly one wins the next number. A lease lives
while its owner renews the file's mtime; it is stale once the shared
filesystem's clock (never the local one) is ``lock_timeout`` past that mtime.
Heartbeats rewrite a byte of the lease (``storage.touch``), so the file
server stamps them. Releasing a lease sets its mtime to 1 (the epoch's first
second: sshfs turns an mtime of 0 into "now"), which makes it claimable at once.

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
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.workers import WorkerLedger
from data_juicer_elastic.storage.files import create_exclusive, dumps_json, publish_once, server_now, touch
from data_juicer_elastic.storage.host import holder_gone, hostname, identity
from data_juicer_elastic.storage.refresher import LeaseRefresher

SEP = "@"
RELEASED_MTIME = 1  # a released lease's mtime; anything at or below it reads as released


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


class ClaimStore:
    """Claim, renew, release and take over leases for one worker process."""

    def __init__(self, job: JobDir, *, lock_timeout: float, host: str, pid: int | None = None) -> None:
        self.job = job
        self.lock_timeout = lock_timeout
        self.host = host
        self.pid = os.getpid() if pid is None else pid
        self._probe = job.clock_dir / f"{host}-{self.pid}"
        self._ledger: WorkerLedger | None = None
        self._holders: dict[tuple[str, int], dict] = {}  # lease bodies read so far (a lease's body never changes)
        self._gone: set[tuple[str, int]] = set()  # leases whose holder was proven gone (it stays gone)

    @property
    def ledger(self) -> WorkerLedger:
        """This process's worker record (made on first use: a read-only store never writes one)."""
        if self._ledger is None:
            self._ledger = WorkerLedger(self.job.workers_dir, self.host, self.pid, uuid.uuid4().hex[:8])
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
        return server_now(self._probe)

    def latest_attempts(self) -> dict[str, int]:
        """Highest attempt number per shard, from one directory listing."""
        latest: dict[str, int] = defaultdict(int)
        for name in os.listdir(self.job.claims_dir):
            parsed = parse_lease_name(name)
            if parsed and parsed[1] > latest[parsed[0]]:
                latest[parsed[0]] = parsed[1]
        return dict(latest)

    def latest_attempt(self, shard: str, start: int = 0) -> int:
        """The shard's highest attempt number, by probing leases upward from ``start`` (no listing).

        ``start`` is an attempt known to exist (0: none known). Attempt numbers
        only grow by one, so the first missing number ends the probe.
        """
        n = start
        while os.path.lexists(self.lease_path(shard, n + 1)):
            n += 1
        return n

    def lease_path(self, shard: str, attempt: int) -> Path:
        return self.job.claims_dir / lease_name(shard, attempt)

    def heartbeat_age(self, shard: str, attempt: int, now: float) -> float | None:
        """Seconds since the lease was renewed (inf if released); None if it vanished.

        A symlink in the claims folder is not followed: no worker makes one, and
        following it would let any file outside the job dir keep a shard "live".
        """
        try:
            mtime = os.lstat(self.lease_path(shard, attempt)).st_mtime
        except FileNotFoundError:
            return None
        return float("inf") if mtime <= RELEASED_MTIME else now - mtime

    def is_live(self, shard: str, attempt: int, now: float) -> bool:
        """Renewed within ``lock_timeout``, and not held by a process of this host that is provably gone."""
        age = self.heartbeat_age(shard, attempt, now)
        return age is not None and age < self.lock_timeout and not self.holder_gone(shard, attempt)

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
            body = read_lease(self.job, shard, attempt)
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
        return read_lease(self.job, shard, attempt)

    def backup_of(self, shard: str, attempt: int) -> int | None:
        """The attempt that lease ``attempt`` backs up, or None for an ordinary (or unreadable) lease."""
        return lease_backup_of(self.job, shard, attempt)

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
        path = self.lease_path(shard, attempt)
        body = {"shard": shard, "attempt": attempt, "host": self.host, "token": token, **self._identity()}
        self.ledger.hold(shard, attempt)  # on disk before the lease: a crash from here on leaves a trace
        if not create_exclusive(path, dumps_json(body)):
            self.ledger.drop(shard, attempt)
            return None
        lease = Lease(shard, attempt, self.host, self.pid, token, path, _mtime(path))
        if not self.is_current(lease):  # what we looked at was old: a later attempt already exists
            self.ledger.drop(shard, attempt)
            return None
        return lease

    def try_backup(self, shard: str, original: int) -> Lease | None:
        """Take attempt ``original + 1`` as a backup of the live attempt ``original``."""
        attempt = original + 1
        token = uuid.uuid4().hex
        path = self.lease_path(shard, attempt)
        body = {"shard": shard, "attempt": attempt, "host": self.host, "token": token, **self._identity()}
        self.ledger.hold(shard, attempt)
        if not publish_once(path, dumps_json({**body, "backup_of": original})):  # appears whole
            self.ledger.drop(shard, attempt)
            return None
        lease = Lease(shard, attempt, self.host, self.pid, token, path, _mtime(path), backup_of=original)
        if not self.is_current(lease):
            self.ledger.drop(shard, attempt)
            return None
        return lease

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
        if not self.lease_path(lease.shard, nxt).exists():
            return True
        if self.backup_of(lease.shard, nxt) != lease.attempt:
            return False
        return not self.lease_path(lease.shard, nxt + 1).exists()

    def renew(self, lease: Lease) -> None:
        touch(lease.path)

    def release(self, lease: Lease) -> None:
        """Make the shard claimable at once (a released mtime reads as infinitely stale)."""
        self.release_attempt(lease.shard, lease.attempt)

    def release_attempt(self, shard: str, attempt: int) -> None:
        """Release attempt ``attempt``'s lease, whoever made it (the caller knows it holds nothing)."""
        try:
            os.utime(self.lease_path(shard, attempt), (RELEASED_MTIME, RELEASED_MTIME))
        except FileNotFoundError:
            pass


def claim_store(job: JobDir, host: str | None = None) -> ClaimStore:
    """The claim store of this process for ``job``, with the manifest's lock timeout."""
    return ClaimStore(job, lock_timeout=job.manifest().policy.lock_timeout_secs, host=host or hostname())


def read_lease(job: JobDir, shard: str, attempt: int) -> dict | None:
    """A lease file's body (not following a symlink), or None."""
    try:
        fd = os.open(job.claims_dir / lease_name(shard, attempt), os.O_RDONLY | os.O_NOFOLLOW)
        with open(fd, "rb") as f:
            data = orjson.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def lease_backup_of(job: JobDir, shard: str, attempt: int) -> int | None:
    """The attempt that lease ``attempt`` backs up, or None for an ordinary (or unreadable) lease."""
    of = (read_lease(job, shard, attempt) or {}).get("backup_of")
    return of if type(of) is int and of == attempt - 1 else None


def _mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0  # unknown: pacing then ignores this attempt


def heartbeat(
    store: ClaimStore,
    lease: Lease,
    interval: float,
    log: Callable[[str], None],
    on_lost: Callable[[], None] | None = None,
) -> LeaseRefresher:
    """Renews ``lease`` while its attempt runs.

    ``.lost`` is set (and ``on_lost`` called) once a later attempt superseded it, or once another
    attempt of the shard (its backup, or the original it backs up) published the done record.
    """
    done = store.job.done_path(lease.shard)
    return LeaseRefresher(
        lease.path,
        interval,
        still_ours=lambda: store.is_current(lease) and not done.exists(),
        log=log,
        on_lost=on_lost,
    )
