"""Fresh shards without listing: the manifest order split into contiguous lanes.

A worker starts in lane ``crc32(host:pid) % L`` and walks it in manifest
order: a shard whose first lease (``<shard>@0001``) is missing has never been
claimed; the worker creates that lease O_EXCL. Each lane has a best-effort
hint, ``state/lanes/<k>``: the index of the next shard nobody has claimed, as
far as the last writer knew. A newcomer starts from the hint instead of the
lane's start; a stale hint only costs a few probes (one ``stat`` each). A
lane found exhausted is remembered in memory and its hint set to its end.
Then, or when it loses a create (another worker walks the same shards), the
worker moves to the lane with the most shards left and starts inside that
remainder, so two workers never walk one stretch in step: each would lose a
create per shard the other won (over sshfs the last tenth of a job took
twice the first, workers piling up in the last lanes).
Shards that come back (a dead worker's, a released
lease, ``dj-elastic retry``) are not fresh: the sweep (``worker.sweep``)
finds them from the worker records.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

from data_juicer_elastic.job.claims import ClaimStore, Lease
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.retry import retry_base
from data_juicer_elastic.job.records.workers import read_small, replace_small

MAX_LANES = 64
MIN_LANE = 16  # shards per lane at least: small jobs have fewer lanes
HINT_EVERY = 4  # rewrite a lane's hint after this many shards of progress in it
SPLIT_MIN = 32  # a lane with fewer shards left than this is walked from its hint, not split
CHOICES = 4  # lanes whose hints a worker reads to pick its next one (the one with the most left wins)


def lane_bounds(count: int) -> list[tuple[int, int]]:
    """[start, end) of each lane over ``count`` shards in manifest order (deterministic)."""
    lanes = max(1, min(MAX_LANES, count // MIN_LANE))
    return [(k * count // lanes, (k + 1) * count // lanes) for k in range(lanes)]


def read_hint(job: JobDir, lane: int) -> int | None:
    data = read_small(job.lanes_dir / str(lane))
    try:
        return int(data) if data else None
    except ValueError:
        return None


def write_hint(job: JobDir, lane: int, index: int) -> None:
    """Best effort: a hint that cannot be written only costs probes later."""
    try:
        replace_small(job.lanes_dir / str(lane), str(index).encode())
    except FileNotFoundError:
        try:
            job.lanes_dir.mkdir(parents=True, exist_ok=True)
            replace_small(job.lanes_dir / str(lane), str(index).encode())
        except OSError:
            pass
    except OSError:
        pass


def fresh_left(job: JobDir, count: int) -> int:
    """Shards not yet claimed from the lanes, as the hints say (an upper bound: hints lag)."""
    left = 0
    for k, (lo, hi) in enumerate(lane_bounds(count)):
        hint = read_hint(job, k)
        left += hi - max(lo, min(hint if hint is not None else lo, hi))
    return left


def probed_fresh_left(job: JobDir, store: ClaimStore, order: list[str]) -> int:
    """``fresh_left`` with each lane's hint checked by probing the shard it names.

    A hint can lag, or go back (a paused worker writing an old position after another wrote the lane's
    end): the shard it names was claimed already. Then the lane is walked on to its first unclaimed shard
    (one ``stat`` a shard, each paid once: the corrected hint is written back), so a stale hint never keeps
    the count of fresh shards above zero for good. The sweep asks for it only where the hints are all that
    stands between a quiet job and its listing fallback.
    """
    left = 0
    for k, (lo, hi) in enumerate(lane_bounds(len(order))):
        hint = read_hint(job, k)
        first = start = max(lo, min(hint if hint is not None else lo, hi))
        while first < hi and os.path.lexists(store.lease_path(order[first], 1)):
            first += 1
        if first != start:
            write_hint(job, k, first)
        left += hi - first
    return left


@dataclass
class Walk:
    """One stretch of one lane this worker walks forward: [cursor, end)."""

    lane: int
    start: int
    cursor: int
    end: int
    owner: bool  # started at the lane's hint: all before its cursor is claimed, so it moves the hint


class Lanes:
    """One worker's walk through the lanes.

    It starts at its own lane's hint. When that lane runs out, or it loses a create there (another worker
    walks the same shards: following it would cost both a lost create per shard), it reads every lane's
    hint and takes the lane with the most shards left, starting at a random point of that remainder: a
    guest there, which leaves the lane's owner its part and never writes the hint (shards before its
    start may be unclaimed). A guest that reached its end knows ``[start, end)`` is claimed
    (``known_claimed``); an owner that reaches that point has exhausted the lane.
    """

    def __init__(self, job: JobDir, store: ClaimStore, order: list[str], seed: int) -> None:
        self.job, self.store, self.order = job, store, order
        self.bounds = lane_bounds(len(order))
        self.done: set[int] = set()  # lanes found exhausted
        self.known_claimed: dict[int, int] = {}  # lane -> index from which this worker saw every shard claimed
        self.walk: Walk | None = None
        self._rng = random.Random(seed)
        self._first: int | None = seed % len(self.bounds)  # the lane it starts in, until it starts
        self._avoid: int | None = None  # the lane of the last lost create: another worker walks it
        self._hinted = 0  # the cursor value last written as the walked lane's hint

    @property
    def exhausted(self) -> bool:
        return len(self.done) == len(self.bounds)

    def claim(self) -> Lease | None:
        """Claim the next never-claimed shard; None once every lane is exhausted."""
        while not self.exhausted:
            if self.walk is None:
                self.walk = self._choose()
            lease = self._step(self.walk)
            if lease is not None:
                return lease
        return None

    def _end_of(self, k: int) -> int:
        return self.known_claimed.get(k, self.bounds[k][1])

    def _hint(self, k: int) -> int:
        lo, hi = self.bounds[k]
        hint = read_hint(self.job, k)
        return max(lo, min(hint if hint is not None else lo, hi))

    def _choose(self) -> Walk:
        """The next stretch: this worker's own lane first, then the lane with the most left (by the hints)."""
        if self._first is not None:
            k, self._first = self._first, None
            return self._owner(k, self._hint(k))
        open_lanes = [k for k in range(len(self.bounds)) if k not in self.done]
        others = [k for k in open_lanes if k != self._avoid] or open_lanes
        self._avoid = None
        sample = self._rng.sample(others, min(CHOICES, len(others)))  # a few hint reads, never all L
        hints = {k: self._hint(k) for k in sample}
        left = {k: max(self._end_of(k) - hints[k], 0) for k in sample}
        k = max(sample, key=lambda j: left[j])
        if left[k] >= SPLIT_MIN:
            start = hints[k] + int(left[k] * self._rng.uniform(0.25, 0.75))
            return Walk(k, start, start, self._end_of(k), owner=False)
        return self._owner(k, hints[k])

    def _owner(self, k: int, hint: int) -> Walk:
        self._hinted = hint
        return Walk(k, hint, hint, self._end_of(k), owner=True)

    def _step(self, walk: Walk) -> Lease | None:
        """Claim the next unclaimed shard of ``walk``; None when the stretch ended (``self.walk`` cleared)."""
        while walk.cursor < walk.end:
            sid = self.order[walk.cursor]
            if os.path.lexists(self.store.lease_path(sid, 1)):  # claimed before: not fresh
                walk.cursor += 1
                continue
            retry_base(self.job, sid)  # a retry record planted for a shard never run is refused, not run
            lease = self.store.try_claim(sid, 0)
            walk.cursor += 1
            if lease is None:  # another worker walks here: leave it this stretch
                self._leave(walk, lost=True)
                return None
            if walk.owner and walk.cursor - self._hinted >= HINT_EVERY:
                write_hint(self.job, walk.lane, walk.cursor)
                self._hinted = walk.cursor
            return lease
        self._leave(walk, lost=False)
        return None

    def _leave(self, walk: Walk, lost: bool) -> None:
        self.walk = None
        if lost:
            self._avoid = walk.lane
            if walk.owner and walk.cursor > self._hinted:  # all it walked is claimed, the lost shard too
                write_hint(self.job, walk.lane, walk.cursor)
            return
        if walk.owner:  # from the hint to the end of what is known claimed: the lane is exhausted
            write_hint(self.job, walk.lane, self.bounds[walk.lane][1])
            self.done.add(walk.lane)
        else:
            self.known_claimed[walk.lane] = walk.start
