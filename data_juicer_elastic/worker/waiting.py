"""An idle worker's wait for the job's last shards, woken as soon as one of them is published.

With nothing left to claim, a worker waits for the shards others (or its own
finisher, a moment ago) still hold. It used to sleep a poll interval on the
snapshot it had, which still listed the shards it had just published itself:
every job ended a poll interval after its last shard. Now the wait names
only shards that are not done and not this worker's own, and it looks at
their done records a few at a time every ``WAKE_SECS``. Once the last of
them is done it asks for a snapshot built from then on (one process sweeps,
the others read its result) and goes back to the claim loop at once; a
worker that left shards to faster ones (tail pacing) goes back at the first
one done, to decide again. At most ``CHECKED_PER_WAKE`` stats per wake, so a
wait costs the same whatever the job's size; the poll interval still bounds
how long a wait can miss a change the stats do not see (a lease going
stale).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.worker.scan import ClaimChooser
from data_juicer_elastic.worker.sweep import Busy

WAKE_SECS = 0.5
CHECKED_PER_WAKE = 4


class TailWait:
    def __init__(self, job: JobDir, chooser: ClaimChooser, policy: Policy, log: Callable[[str], None]) -> None:
        self.job, self.chooser, self.policy, self.log = job, chooser, policy, log
        self._named: list[str] = []  # the shards the last wait line named
        self._turn = 0  # where the next wake's stats start in the waited list

    def wait(self) -> None:
        """Until one of the shards waited for is done, or a poll interval passed."""
        snap = self.chooser.last
        if snap is None:  # declined at the tail before the lanes ran out: nothing to watch yet
            time.sleep(self.policy.poll_interval_secs)
            return
        waited, newest = self._not_done(snap.live)
        if not waited:
            mine = self.chooser.last_claim_at or 0.0
            if newest > snap.built_at:  # it calls live a shard done since: one built after that record
                self.chooser.snapshots.refresh(newer_than=newest)
            elif mine > snap.built_at:  # built before this worker's own last claim (once a claim): one of now
                self.chooser.snapshots.refresh(newer_than=self.chooser.store.now())
            else:  # nothing in it to watch, and nothing it misses that this worker knows of
                time.sleep(self.policy.poll_interval_secs)
            return
        self._say(waited)
        left = [b.shard for b in waited]
        deadline = time.monotonic() + self.policy.poll_interval_secs
        while time.monotonic() < deadline:
            time.sleep(min(WAKE_SECS, max(deadline - time.monotonic(), 0.0)))
            done = self._done_among(left)
            if not done:
                continue
            if snap.claimable:  # shards it left to faster workers: a finished one may make it its turn
                return
            newest = max(newest, *done.values())
            left = [s for s in left if s not in done]
            if not left:  # the last of them: the job's end, or new work, is in a snapshot built after it
                self.chooser.snapshots.refresh(newer_than=newest)
                return

    def _not_done(self, live: list[Busy]) -> tuple[list[Busy], float]:
        """The live attempts that are neither done nor this worker's own (it holds nothing while idle), one
        a shard; and the newest done record's mtime (the shared clock) among the others, 0 if none."""
        mine = (self.chooser.store.host, self.chooser.store.pid)
        freshest: dict[str, Busy] = {}  # a shard with a running backup holds two live attempts: one to wait for
        newest = 0.0
        for b in live:
            done_at = _done_at(self.job, b.shard)
            if done_at is not None:
                newest = max(newest, done_at)
                continue
            if (b.host, b.pid) == mine:
                continue
            if b.shard not in freshest or b.age < freshest[b.shard].age:
                freshest[b.shard] = b
        return [freshest[s] for s in sorted(freshest)], newest

    def _done_among(self, shards: list[str]) -> dict[str, float]:
        """Which of a few of ``shards`` (taking turns) have a done record now, with its mtime."""
        n = min(len(shards), CHECKED_PER_WAKE)
        start = self._turn % len(shards)
        self._turn += n
        found = {sid: _done_at(self.job, sid) for sid in (shards * 2)[start : start + n]}
        return {sid: at for sid, at in found.items() if at is not None}

    def _say(self, waited: list[Busy]) -> None:
        """One line each time the set of shards it waits for changes: whose, and when each may be taken over.

        From the sweep's snapshot the claim just looked at: no lease is listed or read here.
        """
        names = [b.shard for b in waited]
        if names == self._named:
            return
        self._named = names
        timeout = self.policy.lock_timeout_secs
        parts = []
        for b in waited[:8]:
            free_at = time.strftime("%H:%M:%S", time.localtime(time.time() + timeout - b.age))
            parts.append(f"{b.shard} (host={b.host}, renewed {b.age:.0f}s ago, free at {free_at} unless renewed)")
        more = f"; ... ({len(waited) - 8} more)" if len(waited) > 8 else ""
        self.log(f"waiting for {len(waited)} shard(s) leased by other workers: " + "; ".join(parts) + more)


def _done_at(job: JobDir, sid: str) -> float | None:
    """When the shard's done record was written (the shared clock), or None while it has none."""
    meta = job.store.head(job.done_key(sid))  # its clock is never read
    return None if meta is None else meta.modified
