"""Fresh shards without listing: the manifest order split into contiguous lanes.

A worker starts in lane ``crc32(host:pid) % L`` and walks it in manifest
order: a shard whose first lease (``<shard>@0001``) is missing has never been
claimed; the worker creates that lease O_EXCL, and whoever loses the create
moves on to the next shard. Each lane has a best-effort hint,
``state/lanes/<k>``: the index of the next shard nobody has claimed, as far as
the last writer knew. A newcomer starts from the hint instead of the lane's
start; a stale hint only costs a few probes (one ``stat`` each). A lane found
exhausted is remembered in memory and its hint set to its end; the worker
moves to the next lane. Shards that come back (a dead worker's, a released
lease, ``dj-elastic retry``) are not fresh: the sweep (``worker.sweep``)
finds them from the worker records.
"""

from __future__ import annotations

import os

from data_juicer_elastic.job.claims import ClaimStore, Lease
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.retry import retry_base
from data_juicer_elastic.job.records.workers import read_small, replace_small

MAX_LANES = 64
MIN_LANE = 16  # shards per lane at least: small jobs have fewer lanes
HINT_EVERY = 4  # rewrite a lane's hint after this many shards of progress in it


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


class Lanes:
    """One worker's walk through the lanes."""

    def __init__(self, job: JobDir, store: ClaimStore, order: list[str], seed: int) -> None:
        self.job, self.store, self.order = job, store, order
        self.bounds = lane_bounds(len(order))
        self.lane = seed % len(self.bounds)
        self.done: set[int] = set()  # lanes found exhausted
        self.cursor: int | None = None
        self._hinted = 0  # the cursor value last written as this lane's hint

    @property
    def exhausted(self) -> bool:
        return len(self.done) == len(self.bounds)

    def claim(self) -> Lease | None:
        """Claim the next never-claimed shard, moving lane to lane; None once every lane is exhausted."""
        while not self.exhausted:
            k = self.lane
            lo, hi = self.bounds[k]
            if k in self.done:
                self._next_lane()
                continue
            if self.cursor is None:
                hint = read_hint(self.job, k)
                self.cursor = max(lo, min(hint if hint is not None else lo, hi))
                self._hinted = self.cursor
            while self.cursor < hi:
                sid = self.order[self.cursor]
                if os.path.lexists(self.store.lease_path(sid, 1)):  # claimed before: not fresh
                    self.cursor += 1
                    continue
                retry_base(self.job, sid)  # a retry record planted for a shard never run is refused, not run
                lease = self.store.try_claim(sid, 0)
                self.cursor += 1
                if lease is None:
                    continue
                if self.cursor - self._hinted >= HINT_EVERY:
                    write_hint(self.job, k, self.cursor)
                    self._hinted = self.cursor
                return lease
            write_hint(self.job, k, hi)
            self.done.add(k)
            self._next_lane()
        return None

    def _next_lane(self) -> None:
        self.lane = (self.lane + 1) % len(self.bounds)
        self.cursor = None
