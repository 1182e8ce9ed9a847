"""Which shard to claim next: one listing of the state folders, then the first claimable shard.

Each process scans from its own offset in the manifest order, so racing
workers rarely try the same shard. Far from the end of the job a held
shard's lease is only looked at when the scan reaches it; near the end
(``TAIL_LIMIT`` free shards or fewer) every lease is checked first, so tail
pacing (``pacing``) knows the busy workers. A shard whose attempts used up
the retry budget is failed here, so a shard that keeps killing its workers
stops the job instead of going round forever. A shard counts as live while
its latest attempt is, or, if that is a backup, while the original is
(``ClaimStore.live_pair``). With no shard left to claim, the worker may back
up a late one (``speculation``).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable

from data_juicer_elastic.job.claims import ClaimStore, Lease
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.attempt import load_attempt
from data_juicer_elastic.worker.budget import fail_terminally, failure_count
from data_juicer_elastic.worker.pacing import TAIL_LIMIT, BusyWorker, Pace, should_claim
from data_juicer_elastic.worker.speculation import Speculation, Speculator

Held = list[tuple[str, int]]  # (shard, its latest attempt number)
Scan = tuple[Lease | None, set[str], set[str]]  # the lease taken (if any), the done and failed shards


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
        self.order = [s.id for s in job.manifest().shards]
        self._offset = zlib.crc32(f"{store.host}:{os.getpid()}".encode()) % len(self.order)
        self._waiting = False  # declined to claim at the tail (logged once per stretch)
        # Seconds of claimed work this worker holds before a new claim could start (a prefetching worker's).
        self.backlog: Callable[[], float] = lambda: 0.0
        self._declined = False  # this scan declined claimable shards (pacing): no backup either

    def candidates(self) -> tuple[Held, Held, set[str], set[str]]:
        """Never-claimed shards, shards with an attempt (live or not), and the done/failed sets."""
        done = self.job.done_ids()
        failed = self.job.failed_ids()
        latest = self.store.latest_attempts()
        ordered = self.order[self._offset :] + self.order[: self._offset]
        free: Held = []
        held: Held = []
        for sid in ordered:
            if sid in done or sid in failed:
                continue
            (held if latest.get(sid) else free).append((sid, latest.get(sid, 0)))
        return free, held, done, failed

    def claim_next(self) -> Scan:
        free, held, done, failed = self.candidates()
        if failed or len(done) == len(self.order):
            return None, done, failed
        if len(free) > TAIL_LIMIT:  # far from the tail: liveness is checked lazily below
            candidates, lazy, self._declined = free + held, True, False
        else:
            candidates, lazy = self._at_the_tail(free, held), False
        lease, failed_now = self._take_first(candidates, lazy)
        if lease is None and not failed_now and not free and not self._declined:  # nothing left to claim
            lease = self.speculator.try_backup(held, done, self.log)  # back up a late shard, if any
        return lease, done, failed_now or failed

    def _at_the_tail(self, free: Held, held: Held) -> Held:
        """Every lease checked now: the live ones are the busy workers pacing counts on."""
        now = self.store.now() if held else 0.0
        busy = [(sid, n) for sid, n in held if self.store.live_pair(sid, n, now)]
        live = {sid for sid, _ in busy}
        candidates = free + [(sid, n) for sid, n in held if sid not in live]
        self._declined = bool(candidates) and not self._my_turn(len(candidates), busy, now)
        return [] if self._declined else candidates

    def _take_first(self, candidates: Held, lazy: bool) -> tuple[Lease | None, set[str]]:
        """Claim the first shard that is free, stale or released; (None, failed shards) if a budget ran out."""
        now: float | None = None  # the shared clock, read once and only if a held shard is looked at
        for sid, current in candidates:
            if current and lazy:
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
            if self.job.done_path(sid).exists():  # finished while we looked
                self.store.release(lease)
                continue
            return lease, set()
        return None, set()

    def _my_turn(self, claimable: int, busy: Held, now: float) -> bool:
        """Tail pacing: False while faster busy workers would finish every claimable shard first."""
        if self.pace.seconds is None:
            return True
        workers = []
        for sid, attempt in busy:
            info = load_attempt(self.job.attempt_dir(sid, attempt))
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
