"""Speculation: back up a live shard that is running late, on an idle worker of another host.

A slow node (a noisy neighbour, a throttled GPU, a slow mount) holds its last
shard with a live lease, so neither stale takeover nor tail pacing helps: the
whole job waits for it. As with MapReduce's backup tasks and Spark's
``spark.speculation``, a worker that finds nothing left to claim may start a
second live attempt of such a shard; whichever publishes the done record
first wins (``publish_once``), and the other is fenced (see
``job/claims.py`` and docs/CONTRACTS.md).

When is a shard late? Each done record gives one rate, the shard's input
bytes over its attempt's run time (``finished_at - started_at``, one host's
clock). The job's rate is the median of those, so one slow node cannot move
it much; a running shard's expected time is its bytes over that rate, and it
is late once its elapsed time (the shared clock's now minus the lease's
``claimed_at``) passes ``multiplier`` times that and ``min_secs``. Nothing is
backed up before ``quantile`` of the shards are done. A worker backs up only
shards of other hosts, never a backup, and at most one backup per live
attempt. It must not be a straggler itself: the latest shard it finished
(speeds change: that is why we speculate) ran at no less than the job's rate
over ``multiplier``, and at that rate it expects to finish the whole shard
within the time the original has run so far; a worker that has finished
nothing yet may try. So a slow idle worker never takes the one backup a
fast worker, busy for a moment, would finish sooner.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.job.claims import ClaimStore, Lease
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.attempt import load_attempt
from data_juicer_elastic.job.records.done import is_done, load_done


@dataclass(frozen=True)
class Speculation:
    """The ``elastic_shard.speculation*`` keys; a worker option, so a resubmission may change them."""

    enabled: bool = True
    quantile: float = 0.75  # fraction of the shards done before any backup starts
    multiplier: float = 1.5  # late: elapsed > multiplier * expected
    min_secs: float = 60.0  # never back up an attempt that has run less than this

    def check(self) -> None:
        if not 0.0 <= self.quantile <= 1.0:
            raise UserError(f"elastic_shard.speculation_quantile must be within [0, 1], got {self.quantile}")
        if not self.multiplier >= 1.0:
            raise UserError(f"elastic_shard.speculation_multiplier must be at least 1, got {self.multiplier}")
        if not self.min_secs >= 0.0:
            raise UserError(f"elastic_shard.speculation_min_secs must not be negative, got {self.min_secs}")


OFF = Speculation(enabled=False)


@dataclass(frozen=True)
class Late:
    """A live attempt running past what its size predicts."""

    shard: str
    attempt: int
    host: str
    elapsed: float  # seconds on the shared clock
    expected: float  # seconds its bytes take at the job's rate

    @property
    def lateness(self) -> float:
        return self.elapsed / self.expected if self.expected > 0 else math.inf


class RateBook:
    """Bytes per second of each finished shard, read once per done record (they never change)."""

    def __init__(self, job: JobDir) -> None:
        self.job = job
        self.sizes = job.manifest().shards.bytes_by_id()
        self._seen: set[str] = set()
        self._rates: list[float] = []
        self._latest: dict[tuple[str, int], tuple[float, float]] = {}  # (host, pid) -> (finished_at, rate)

    def update(self, done: set[str]) -> None:
        for sid in done - self._seen:
            self._seen.add(sid)
            try:
                rec = load_done(self.job, sid)
            except IntegrityError:  # verify and merge report it; it just gives no rate
                continue
            if rec is None or rec.started_at is None or rec.finished_at is None or sid not in self.sizes:
                continue
            start, end = rec.started_at, rec.finished_at
            if end <= start:
                continue
            rate = self.sizes[sid] / (end - start)
            self._rates.append(rate)
            key = (rec.host, rec.pid)
            if key not in self._latest or self._latest[key][0] < end:
                self._latest[key] = (end, rate)

    @property
    def job_rate(self) -> float | None:
        """Median bytes per second over the finished shards."""
        return statistics.median(self._rates) if self._rates else None

    def own_rate(self, host: str, pid: int) -> float | None:
        """The rate of the latest shard this worker finished (speeds change: that is why we speculate)."""
        latest = self._latest.get((host, pid))
        return latest[1] if latest else None

    def expected(self, sid: str) -> float | None:
        rate = self.job_rate
        return self.sizes.get(sid, 0) / rate if rate else None


def late_attempt(job: JobDir, store: ClaimStore, book: Any, sid: str, attempt: int, now: float) -> Late | None:
    """Attempt ``attempt`` of ``sid`` as a ``Late`` if its record says when it began (lateness not judged).

    Its time counts from the start of its processing (``processing_at``, the shared clock; a
    prefetched shard waits behind another before it starts), else from its claim.
    """
    expected = book.expected(sid)
    info = load_attempt(job, sid, attempt)
    if expected is None or info is None or info.claimed_at <= 0 or not info.host:
        return None
    began = info.processing_at if info.processing_at > 0 else info.claimed_at
    return Late(sid, attempt, info.host, max(now - began, 0.0), expected)


class SweptRates:
    """The job's rates as the sweep summed them from the worker records (no done record is read)."""

    def __init__(self, sizes: Mapping[str, int], rates: list[float]) -> None:
        self.sizes = sizes
        self.job_rate = statistics.median(rates) if rates else None

    def expected(self, sid: str) -> float | None:
        return self.sizes.get(sid, 0) / self.job_rate if self.job_rate else None


class Speculator:
    """One worker's backup decisions."""

    def __init__(self, job: JobDir, store: ClaimStore, policy: Speculation) -> None:
        self.job, self.store, self.policy = job, store, policy
        self.sizes = job.manifest().shards.bytes_by_id()
        self.total = len(self.sizes)

    def try_backup(self, held: list[tuple[str, int]], snap: Any, log: Callable[[str], None]) -> Lease | None:
        """Claim a backup of the latest shard among ``held`` (shard, live attempt), or None.

        ``snap`` is the sweep's snapshot (``worker.sweep.Snapshot``): shards done and the job's rates.
        """
        if not self.policy.enabled or not held or snap.done < self.policy.quantile * self.total:
            return None
        book = SweptRates(self.sizes, snap.rates)
        job_rate, mine = book.job_rate, self.store.ledger.latest_rate()
        if job_rate is None or (mine is not None and mine * self.policy.multiplier < job_rate):
            return None  # no estimate yet, or this worker is a straggler itself
        now = self.store.now()
        for late in sorted(self._late(book, held, now), key=lambda x: -x.lateness):
            if mine is not None and self.sizes[late.shard] / mine > late.elapsed:
                continue  # this worker would not beat an original that is late already
            lease = self.store.try_backup(late.shard, late.attempt)
            if lease is None:
                continue
            if is_done(self.job, late.shard):  # finished while we looked
                self.store.release(lease)
                self.store.ledger.drop(late.shard, lease.attempt)
                continue
            log(
                f"backing up attempt {late.attempt:04d} of {late.shard} on host={late.host}: running "
                f"{late.elapsed:.1f}s, {late.lateness:.1f}x the {late.expected:.1f}s its size predicts"
            )
            return lease
        return None

    def _late(self, book: SweptRates, held: list[tuple[str, int]], now: float) -> list[Late]:
        found = []
        for sid, attempt in held:
            if not self.store.is_live(sid, attempt, now):
                continue
            if self.store.backup_of(sid, attempt) is not None:  # already backed up: at most one backup
                continue
            if self.store.backup_of(sid, attempt + 1) is not None:
                continue
            late = late_attempt(self.job, self.store, book, sid, attempt, now)
            if late is None or late.host == self.store.host:
                continue
            if late.elapsed >= max(self.policy.min_secs, self.policy.multiplier * late.expected):
                found.append(late)
        return found
