"""Which shard to claim next, at the same cost per shard however large the job.

Fresh shards come from the lanes (``lanes``: a stat or two and one O_EXCL
create per claim, no listing). Everything else (a dead or stalled worker's
lease, a lease released after a failed attempt, a hole, a requeued shard) is
found by the sweep of the worker records (``sweep``), which this worker reads
from the shared ``state/progress.json`` at most once per refresh interval
and re-checks by probing before it claims. Near the end of the job (the
sweep says ``TAIL_LIMIT`` claimable shards or fewer) tail pacing (``pacing``)
counts on the busy workers the sweep found, each re-checked. A shard whose
attempts used up the retry budget is failed here, so a shard that keeps
killing its workers stops the job instead of going round forever. With no
shard left to claim, the worker may back up a late one (``speculation``).
A terminal failure anywhere is seen at the next claim from the failed
folder's stamp (one stat on POSIX), not from a listing.
"""

from __future__ import annotations

import math
import os
import statistics
import time
import zlib
from collections.abc import Callable

from data_juicer_elastic.job.claims import ClaimStore, Lease
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.attempt import load_attempt
from data_juicer_elastic.job.records.done import is_done
from data_juicer_elastic.job.records.failed import is_failed
from data_juicer_elastic.worker.budget import fail_terminally, failure_count
from data_juicer_elastic.worker.lanes import Lanes
from data_juicer_elastic.worker.pacing import TAIL_LIMIT, BusyWorker, Pace, should_claim
from data_juicer_elastic.worker.speculation import Speculation, Speculator
from data_juicer_elastic.worker.sweep import Busy, Snapshot, SnapshotCache

Held = list[tuple[str, int]]  # (shard, its latest attempt number)
Scan = tuple[Lease | None, bool, set[str]]  # the lease taken (if any), whether every shard is done, the failed shards


def refresh_interval(job: JobDir) -> float:
    """How old the shared snapshot may get: the poll interval, at least half a second."""
    return max(job.manifest().policy.poll_interval_secs, 0.5)


class FailedWatch:
    """Terminal failures, seen from the failed folder's stamp (``Store.stamp``: one stat on POSIX), listed
    only when it moved; a store that keeps no stamp (S3) is listed at most once per ``every`` seconds (the
    poll interval): a LIST per check was two a claim, a third of a job's request price there."""

    def __init__(self, job: JobDir) -> None:
        self.job = job
        self._key = job.key(job.failed_dir)
        self._stamp: str | None = ""  # no folder, no failed shard: nothing to list until one appears
        self.failed: set[str] = set()
        self.every = refresh_interval(job)
        self._listed_at = -math.inf  # monotonic time of the last listing, where the store keeps no stamp

    def check(self) -> set[str]:
        stamp = self.job.store.stamp(self._key)
        if stamp is None:
            now = time.monotonic()
            if now - self._listed_at >= self.every:
                self._listed_at = now
                self.failed = self.job.failed_ids()
        elif stamp != self._stamp:
            self._stamp = stamp
            self.failed = self.job.failed_ids()
        return self.failed


class ClaimChooser:
    """Picks and claims the next shard for one worker."""

    def __init__(
        self,
        job: JobDir,
        store: ClaimStore,
        pace: Pace,
        log: Callable[[str], None],
        speculation: Speculation | None = None,
    ) -> None:
        self.job, self.store, self.pace, self.log = job, store, pace, log
        self.speculator = Speculator(job, store, speculation or Speculation())
        self.max_retries = job.manifest().policy.max_retries
        self.order = job.manifest().shards.ids()
        self.mean_bytes = sum(job.manifest().shards.bytes) / max(len(self.order), 1)
        seed = zlib.crc32(f"{store.host}:{os.getpid()}".encode())
        self.lanes = Lanes(job, store, self.order, seed)
        self.snapshots = SnapshotCache(job, store, refresh_interval(job))
        self.failures = FailedWatch(job)
        self._waiting = False  # declined to claim at the tail (logged once per stretch)
        # Seconds of claimed work this worker holds before a new claim could start (a prefetching worker's).
        self.backlog: Callable[[], float] = lambda: 0.0
        self.last: Snapshot | None = None  # the snapshot the last claim looked at, if any
        self._claimed_at: float | None = None  # the shared clock at this worker's latest claim

    @property
    def last_claim_at(self) -> float | None:
        """The shared clock at this worker's latest claim, if it made one."""
        return self._claimed_at

    def claim_next(self) -> Scan:
        scan = self._claim_next()
        if scan[0] is not None:
            self._claimed_at = scan[0].claimed_at
        return scan

    def _claim_next(self) -> Scan:
        failed = self.failures.check()
        if failed:
            return None, False, failed
        snap = self.snapshots.get() if self.pace.seconds is not None or self.lanes.exhausted else None
        if snap is not None:
            self.last = snap
            if snap.complete:
                return None, True, set()
            if snap.failed:
                failed, snap = self._still_failed(snap)
                if failed:
                    return None, False, failed
        if snap is not None and self._stale_for_pacing(snap):  # a pacing decision: the workers busy now
            newer = self._claimed_at if self._claimed_at is not None else snap.built_at + 1e-3
            snap = self.last = self.snapshots.refresh(newer_than=newer, lean=True)
        if not self.lanes.exhausted:
            left = snap.fresh_left + len(snap.claimable) if snap is not None else TAIL_LIMIT + 1
            if left > 0 and self._pacing_matters(snap, left) and not self._my_turn(left, self._busy(snap.live)):
                return None, False, set()
            lease = self.lanes.claim()
            if lease is not None:
                return lease, False, set()
            snap = self.last = self.snapshots.get(fresh=True)
            if snap.complete:
                return None, True, set()
        return self._from_the_sweep(snap)

    def _still_failed(self, snap: Snapshot) -> tuple[set[str], Snapshot]:
        """The snapshot's failed shards that still have a failed record, read now (the snapshot may predate a
        ``retry`` that archived them: it is a cache, and one the records contradict is replaced by a new sweep).

        Nothing ends on a failure the snapshot remembers: only on failed records read after any retry that
        archived them, so a worker that ran a requeued shard to done never ends "failed terminally" on it.
        """
        failed = {sid for sid in snap.failed if is_failed(self.job, sid)}
        if len(failed) < len(snap.failed):
            snap = self.last = self.snapshots.refresh(newer_than=self.store.now())
        return failed, snap

    def _stale_for_pacing(self, snap: Snapshot) -> bool:
        """At the tail, a pacing decision counts on the workers busy now: sweep again if this worker claimed
        since the snapshot was built (or never decided at the tail), so at most once per claim of its own."""
        if not self._pacing_matters(snap, snap.fresh_left + len(snap.claimable)):
            return False
        return self._claimed_at is None or snap.built_at < self._claimed_at

    def _pacing_matters(self, snap: Snapshot, left: int) -> bool:
        """Could tail pacing decline now? Only with ``left`` free shards or fewer than the workers could
        finish before this one finishes one: at most 2 x workers x (this worker's pace over the job's)."""
        pace = self.pace.seconds
        if pace is None or left > TAIL_LIMIT:
            return False
        rate = statistics.median(snap.rates) if snap.rates else None
        if not rate or not self.mean_bytes:
            return True
        slower = max(pace * rate / self.mean_bytes, 1.0)
        return left <= 2 * max(snap.workers, 1) * slower

    def _from_the_sweep(self, snap: Snapshot) -> Scan:
        """Lanes exhausted: the shards the sweep found, each re-checked; then a backup of a late one."""
        candidates = list(snap.claimable) + self._ended(snap.live)
        paced = candidates and self._pacing_matters(snap, len(candidates))
        if paced and not self._my_turn(len(candidates), self._busy(snap.live)):
            return None, False, set()
        lease, failed_now = self._take_first(candidates)
        if failed_now:
            return None, False, failed_now
        if lease is None and not candidates:  # nothing left to claim
            lease = self.speculator.try_backup([(b.shard, b.attempt) for b in snap.live], snap, self.log)
        return lease, False, set()

    def _ended(self, live: list[Busy]) -> Held:
        """Attempts the sweep found live whose lease went stale or was released since (two stats each)."""
        if not live:
            return []
        now = self.store.now()
        ended = []
        for b in live:
            n = self.store.latest_attempt(b.shard, b.attempt)
            if not self.store.live_pair(b.shard, n, now):
                ended.append((b.shard, n))
        return ended

    def _busy(self, live: list[Busy]) -> list[Busy]:
        """The sweep's live attempts that still run now (not done, lease renewed), newest record read."""
        if not live:
            return []
        now = self.store.now()
        found = []
        for b in live:
            if is_done(self.job, b.shard):
                continue
            n = self.store.latest_attempt(b.shard, b.attempt)
            if n == b.attempt and self.store.is_live(b.shard, n, now):
                found.append(b)
            elif n != b.attempt and self.store.live_pair(b.shard, n, now):
                found.append(Busy(b.shard, n, "?"))
        return found

    def _take_first(self, candidates: Held) -> tuple[Lease | None, set[str]]:
        """Claim the first shard that is free, stale or released; (None, failed shards) if a budget ran out."""
        now: float | None = None
        for sid, named in candidates:
            if is_done(self.job, sid) or is_failed(self.job, sid):
                continue
            current = self.store.latest_attempt(sid, named if self._exists(sid, named) else 0)
            if current:
                now = self.store.now() if now is None else now
                if self.store.live_pair(sid, current, now):
                    continue
            if failure_count(self.job, sid, current) > self.max_retries:
                error = "attempts lost (worker killed or stalled) past the retry budget"
                fail_terminally(self.job, sid, current, self.store.host, error)
                return None, self.job.failed_ids()
            lease = self.store.try_claim(sid, current)
            if lease is None:
                continue
            if is_done(self.job, sid):  # finished while we looked
                self.store.release(lease)
                self.store.ledger.drop(sid, lease.attempt)
                continue
            return lease, set()
        return None, set()

    def _exists(self, sid: str, attempt: int) -> bool:
        return attempt > 0 and self.store.exists(sid, attempt)

    def _my_turn(self, claimable: int, busy: list[Busy]) -> bool:
        """Tail pacing: False while faster busy workers would finish every claimable shard first."""
        if self.pace.seconds is None:
            return True
        workers = []
        now = self.store.now() if busy else 0.0
        for b in busy:
            info = load_attempt(self.job, b.shard, b.attempt)
            if info and info.host == self.store.host and info.pid == self.store.pid:
                continue  # this worker's own claims held ahead: its backlog counts them
            if info and info.pace is not None and info.claimed_at > 0 and not info.final:
                workers.append(BusyWorker(info.pace, max(now - info.claimed_at, 0.0)))
        turn = should_claim(self.pace.seconds, workers, claimable, self.backlog())
        if not turn and not self._waiting:
            self.log(
                f"leaving the last {claimable} shard(s) to faster workers "
                f"(this one takes {self.pace.seconds:.1f}s per shard)"
            )
        self._waiting = not turn
        return turn
