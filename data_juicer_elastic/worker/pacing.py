"""Tail pacing: near the end of a job, leave the last shards to the workers that finish them first.

Workers claim greedily, so on nodes of unequal speed a slow worker can take
one of the last shards a moment before a fast worker falls idle; the job then
waits a whole slow shard for it. Re-running the shard elsewhere would break
the one-live-lease rule, so the slow worker instead declines to claim while
the free shards would all finish sooner on workers that hold a live lease now.

The decision is an earliest-finish-time simulation over the free shards. A
worker's pace is the median duration of the shards it finished in this
process, measured on its own monotonic clock; it writes that pace and the
lease's ``claimed_at`` (the shared filesystem's clock) into every attempt's
``attempt.json``, so the others learn when it will be free from one small
read per live lease; elapsed time is the shared clock's now minus
``claimed_at``, so skewed node clocks do not matter. Only workers that can
be counted on take part: a live lease, a known pace, and an attempt not
already running past twice that pace. A worker with no finished shard always
claims, so paces get measured, and one with nobody busy to count on always
claims, so the job never waits on a worker that is not working.
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass

# Beyond this many free shards a worker is not at the tail: skip the simulation.
TAIL_LIMIT = 256
# A busy worker whose attempt has run this many times its pace is not counted on.
OVERDUE = 2.0


@dataclass(frozen=True)
class BusyWorker:
    pace: float  # seconds per shard
    elapsed: float  # seconds its current attempt has run


class Pace:
    """Seconds per shard of this worker: the median of the attempts it finished."""

    def __init__(self) -> None:
        self._durations: list[float] = []

    def add(self, seconds: float) -> None:
        self._durations.append(seconds)

    @property
    def seconds(self) -> float | None:
        return statistics.median(self._durations) if self._durations else None


def should_claim(my_pace: float | None, busy: list[BusyWorker], free_shards: int, my_backlog: float = 0.0) -> bool:
    """True if an earliest-finish-time schedule of the free shards gives this worker one.

    ``my_backlog``: seconds of work this worker already holds (a prefetching
    worker claims its next shard while one runs), 0 for an idle worker.
    """
    if my_pace is None or free_shards > TAIL_LIMIT:
        return True
    me = -1
    heap = [(my_backlog + my_pace, my_pace, me)]
    for i, w in enumerate(busy):
        if w.elapsed <= OVERDUE * w.pace:
            finish = max(w.pace - w.elapsed, 0.0) + w.pace
            heap.append((finish, w.pace, i))
    heapq.heapify(heap)
    for _ in range(free_shards):
        finish, pace, who = heapq.heappop(heap)
        if who == me:
            return True
        heapq.heappush(heap, (finish + pace, pace, who))
    return False
