"""Fresh shards without listing: the manifest order split into contiguous lanes.

Two best-effort files describe each lane, both only ever true statements
about claimed shards (a shard whose first lease, ``<shard>@0001``, exists):

- the *hint*, ``state/lanes/<k>``: every shard of the lane before it is claimed
  (written by the lane's *owner*, which walks up from it);
- the *tail*, ``state/lanes/<k>.tail``: every shard from it to the lane's end is
  claimed (written by the lane's *guest*, which walks down to it from the end).

``[hint, tail)`` is what may be left; a lane whose hint reached its tail is
exhausted, for any reader, without a probe. A worker starts as the owner of
lane ``crc32(host:pid) % L``, probing each shard's first lease and creating
it O_EXCL, and rewrites its marker every few shards. When its lane runs out,
or it loses a create (another worker walks the same shards: in step, each
would lose a create per shard the other won), it reads both files of a few
random lanes and takes the one with the most left, in the role nobody plays
there: a guest where the tail is still the lane's end or stood still since it
last looked, an owner where the hint stood still. A walker that meets a
claimed shard reads both files again, once per run of claimed shards, and
stops where the other end is. So a lane has at most two walkers that never
walk in step, and its files say what is left up to a few shards at each end.
Shards that come back (a dead worker's, a released lease, ``dj-elastic
retry``) are not fresh: the sweep (``worker.sweep``) finds them from the
worker records.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from data_juicer_elastic.job.claims import ClaimStore, Lease
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.retry import retry_base
from data_juicer_elastic.job.records.workers import read_key

MAX_LANES = 64
MIN_LANE = 16  # shards per lane at least: small jobs have fewer lanes
HINT_EVERY = 4  # rewrite a lane's hint after this many shards of progress in it
CHOICES = 4  # lanes a worker reads to pick its next one (the one with the most left wins)


def lane_bounds(count: int) -> list[tuple[int, int]]:
    """[start, end) of each lane over ``count`` shards in manifest order (deterministic)."""
    lanes = max(1, min(MAX_LANES, count // MIN_LANE))
    return [(k * count // lanes, (k + 1) * count // lanes) for k in range(lanes)]


def _lane_key(job: JobDir, name: str) -> str:
    return f"{job.key(job.lanes_dir)}/{name}"


def _read_index(job: JobDir, name: str) -> int | None:
    data = read_key(job.store, _lane_key(job, name))  # missing, a link or unreadable: nothing said
    try:
        return int(data) if data else None
    except ValueError:
        return None


def _write_index(job: JobDir, name: str, index: int) -> None:
    """Best effort: a lane file that cannot be written only costs probes later. Its folder is made by the
    first write; no folder fsync (``durable=False``): a rolled-back marker is an older true statement."""
    try:
        job.store.replace(_lane_key(job, name), str(index).encode(), durable=False)
    except OSError:
        pass


def read_hint(job: JobDir, lane: int) -> int | None:
    return _read_index(job, str(lane))


def write_hint(job: JobDir, lane: int, index: int) -> None:
    _write_index(job, str(lane), index)


def read_tail(job: JobDir, lane: int) -> int | None:
    return _read_index(job, f"{lane}.tail")


def write_tail(job: JobDir, lane: int, index: int) -> None:
    _write_index(job, f"{lane}.tail", index)


def lane_state(job: JobDir, bounds: tuple[int, int], lane: int) -> tuple[int, int]:
    """(hint, tail) of a lane, each clamped to its bounds; a missing file says nothing (start, end).

    Merged with what ``job`` learned of the lane before (``learn``); a lane it saw exhausted is not read
    again: on S3 a lane's two files were most of a worker's GETs, the sweep reading every lane each time.
    """
    known = job.lane_ends.get(lane)
    if known is not None and known[0] >= known[1]:
        return known
    return learn(
        job, lane, _within(read_hint(job, lane), bounds, bounds[0]), _within(read_tail(job, lane), bounds, bounds[1])
    )


def lane_hint(job: JobDir, bounds: tuple[int, int], lane: int) -> int:
    """The lane's hint alone, clamped to its bounds (the start when missing): all a guest needs of it."""
    known = job.lane_ends.get(lane, (bounds[0], bounds[1]))
    if known[0] >= known[1]:
        return known[0]
    return learn(job, lane, _within(read_hint(job, lane), bounds, bounds[0]), known[1])[0]


def learn(job: JobDir, lane: int, hint: int, tail: int) -> tuple[int, int]:
    """Note a true (hint, tail) of a lane in ``job.lane_ends``; what is known now: the higher hint, the lower tail.

    Both only ever say what is claimed, and a claim is never undone: a hint written back by a paused worker,
    or read before another's write, is an older true statement, never a reason to walk claimed shards again.
    """
    known = job.lane_ends.get(lane)
    if known is not None:
        hint, tail = max(hint, known[0]), min(tail, known[1])
    job.lane_ends[lane] = (hint, tail)
    return hint, tail


def _within(index: int | None, bounds: tuple[int, int], missing: int) -> int:
    return max(bounds[0], min(missing if index is None else index, bounds[1]))


def fresh_left(job: JobDir, count: int) -> int:
    """Shards not yet claimed from the lanes, as hints and tails say (an upper bound: both lag)."""
    left = 0
    for k, bounds in enumerate(lane_bounds(count)):
        hint, tail = lane_state(job, bounds, k)
        left += max(tail - hint, 0)
    return left


def probed_fresh_left(job: JobDir, store: ClaimStore, order: list[str]) -> int:
    """``fresh_left`` with each lane's hint checked by probing the shard it names.

    A hint can lag, or go back (a paused worker writing an old position after another wrote the lane's
    end): the shard it names was claimed already. Then the lane is walked on to its first unclaimed shard
    or its tail (one ``stat`` a shard, each paid once: the corrected hint is written back), so a stale hint
    never keeps the count of fresh shards above zero for good. The sweep asks for it only where the hints
    are all that stands between a quiet job and its listing fallback.
    """
    left = 0
    for k, bounds in enumerate(lane_bounds(len(order))):
        hint, tail = lane_state(job, bounds, k)
        first = hint
        while first < tail and store.exists(order[first], 1):
            first += 1
        if first >= tail:
            first = bounds[1]  # all claimed: the hint says so for every later reader
        if first != hint:
            write_hint(job, k, first)
            learn(job, k, first, tail)
        left += max(tail - first, 0)
    return left


@dataclass
class Walk:
    """One walk through one lane: an owner up from the hint, a guest down from the tail."""

    lane: int
    cursor: int  # the next index to look at (owner) or the last one looked at (guest)
    owner: bool
    marked: int  # the cursor value last written to the walker's own marker
    other: int  # the other end's marker as last read: the owner stops at the tail, the guest at the hint
    in_claimed: bool = False  # the last probe met a claimed shard (the other marker was re-read there)


class Lanes:
    """One worker's walks through the lanes (see the module's docstring)."""

    def __init__(self, job: JobDir, store: ClaimStore, order: list[str], seed: int) -> None:
        self.job, self.store, self.order = job, store, order
        self.bounds = lane_bounds(len(order))
        self.done: set[int] = set()  # lanes found exhausted
        self.walk: Walk | None = None
        self._rng = random.Random(seed)
        self._first: int | None = seed % len(self.bounds)  # the lane it starts in, until it starts
        self._avoid: int | None = None  # the lane of the last lost create: another worker walks it
        self._seen: dict[int, tuple[int, int]] = {}  # lane -> (hint, tail) this worker last read there

    @property
    def exhausted(self) -> bool:
        return len(self.done) == len(self.bounds)

    def claim(self) -> Lease | None:
        """Claim the next never-claimed shard; None once every lane is exhausted."""
        while not self.exhausted:
            if self.walk is None:
                self.walk = self._choose()
                if self.walk is None:
                    continue
            lease = self._step(self.walk)
            if lease is not None:
                return lease
        return None

    def _state(self, k: int) -> tuple[int, int]:
        """(hint, tail) of lane ``k``; a lane whose hint reached its tail is done."""
        hint, tail = lane_state(self.job, self.bounds[k], k)
        if hint >= tail:
            self.done.add(k)
        return hint, tail

    def _choose(self) -> Walk | None:
        """The next walk: this worker's own lane first, then, of a few random lanes, the one with the most left,
        as its owner or its guest, whichever marker stood still since this worker last read it (the role nobody
        plays now). None when every sampled lane turned out exhausted (the caller samples again, or ends)."""
        if self._first is not None:
            k, self._first = self._first, None
            hint, tail = self._state(k)
            return None if k in self.done else Walk(k, hint, owner=True, marked=hint, other=tail)
        self.done.update(k for k, (hint, tail) in list(self.job.lane_ends.items()) if hint >= tail)  # seen by the sweep
        open_lanes = [k for k in range(len(self.bounds)) if k not in self.done]
        others = [k for k in open_lanes if k != self._avoid] or open_lanes
        self._avoid = None
        sample = self._rng.sample(others, min(CHOICES, len(others)))  # a few reads, never all L
        state = {k: self._state(k) for k in sample}
        live = sorted((k for k in sample if k not in self.done), key=lambda j: state[j][0] - state[j][1])
        if not live:
            return None
        best = None
        for k in live:  # the most left first
            hint, tail = state[k]
            seen = self._seen.get(k)
            if tail == self.bounds[k][1] or (seen is not None and seen[1] == tail):
                best = best or Walk(k, tail, owner=False, marked=tail, other=hint)  # no guest walks down from its tail
            elif seen is not None and seen[0] == hint:
                best = best or Walk(k, hint, owner=True, marked=hint, other=tail)  # no owner walks up from its hint
        self._seen.update((k, state[k]) for k in live)
        if best is None:  # both roles taken in every sampled lane: be a second guest where most is left
            k = live[0]
            best = Walk(k, state[k][1], owner=False, marked=state[k][1], other=state[k][0])
        return best

    def _step(self, walk: Walk) -> Lease | None:
        """Claim the next unclaimed shard of ``walk``; None when the walk ended (``self.walk`` cleared)."""
        while True:
            index = walk.cursor if walk.owner else walk.cursor - 1
            if (walk.owner and index >= walk.other) or (not walk.owner and index < walk.other):
                return self._exhaust(walk)  # met the other end: everything between was claimed
            sid = self.order[index]
            if self.store.exists(sid, 1):  # claimed before: not fresh
                if not walk.in_claimed:  # the first claimed shard of a run: read the ends again
                    walk.in_claimed = True
                    if walk.owner:  # skip what another owner reported claimed; stop where the guests are
                        hint, tail = lane_state(self.job, self.bounds[walk.lane], walk.lane)
                        walk.cursor, walk.other = max(walk.cursor, hint), tail
                    else:  # a guest stops at the hint; the tail is its own end
                        walk.other = lane_hint(self.job, self.bounds[walk.lane], walk.lane)
                    continue
                walk.cursor += 1 if walk.owner else -1
                continue
            walk.in_claimed = False
            retry_base(self.job, sid)  # a retry record planted for a shard never run is refused, not run
            lease = self.store.try_claim(sid, 0)
            walk.cursor += 1 if walk.owner else -1
            if lease is None:  # another worker walks here: leave it this lane
                self._mark(walk, walk.cursor)
                self.walk, self._avoid = None, walk.lane
                return None
            if abs(walk.cursor - walk.marked) >= HINT_EVERY:
                self._mark(walk, walk.cursor)
            return lease

    def _mark(self, walk: Walk, index: int) -> None:
        """Write the walker's own marker: everything it walked is claimed."""
        if index != walk.marked:
            (write_hint if walk.owner else write_tail)(self.job, walk.lane, index)
            walk.marked = index
            lo, hi = self.bounds[walk.lane]
            learn(self.job, walk.lane, index if walk.owner else lo, hi if walk.owner else index)

    def _exhaust(self, walk: Walk) -> None:
        lo, hi = self.bounds[walk.lane]
        self._mark(walk, hi if walk.owner else lo)
        self.done.add(walk.lane)
        self.walk = None
