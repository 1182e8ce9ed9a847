"""Fresh shards from the lanes: every shard claimed once, workers spread instead of walking one stretch in step.

Workers that walk the same stretch of one lane lose an O_EXCL create for each shard the other won (a worker
record rewrite and a failed create each); over one sshfs mount that doubled the last tenth of a 20,000-shard
job. A worker whose lane runs out, or that loses a create, starts inside the largest remainder it finds.
"""

from __future__ import annotations

import os
import threading

from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.worker.lanes import Lanes, lane_bounds, read_hint, write_hint

from .jobs import make_job


def _lanes(job, host: str, seed: int) -> tuple[Lanes, ClaimStore]:
    store = ClaimStore(job, lock_timeout=30.0, host=host, pid=os.getpid())
    return Lanes(job, store, job.manifest().shards.ids(), seed), store


def _claimed(job) -> set[str]:
    return {name.split("@")[0] for name in os.listdir(job.claims_dir) if name.endswith("@0001")}


def test_threads_racing_through_the_lanes_claim_every_shard_exactly_once(tmp_path):
    """Eight walkers, four of them starting in the same lane (they lose creates to each other): each
    shard's first lease is created once, every walker ends with every lane exhausted."""
    job = make_job(tmp_path, rows=400, shards=400)
    lanes = len(lane_bounds(400))
    walkers = [_lanes(job, f"node-{i}", seed=i * lanes if i < 4 else i) for i in range(8)]  # 0-3: lane 0
    got: list[list[str]] = [[] for _ in walkers]

    def walk(i: int) -> None:
        lanes_i, _ = walkers[i]
        while (lease := lanes_i.claim()) is not None:
            got[i].append(lease.shard)

    threads = [threading.Thread(target=walk, args=(i,)) for i in range(len(walkers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    every = [sid for g in got for sid in g]
    assert sorted(every) == sorted(job.manifest().shards.ids())  # each once: no shard twice, none left
    assert all(w.exhausted for w, _ in walkers)
    assert all(read_hint(job, k) == hi for k, (_, hi) in enumerate(lane_bounds(400)))


def test_a_walker_whose_lane_ran_out_starts_inside_the_largest_remainder_and_leaves_its_hint(tmp_path):
    """Lane 0 exhausted: the walker samples lanes, takes the one with the most left and starts inside it as
    a guest (shards before its start may be unclaimed, so it never moves that lane's hint)."""
    job = make_job(tmp_path, rows=2048, shards=2048)  # 64 lanes of 32
    bounds = lane_bounds(2048)
    for k, (_, hi) in enumerate(bounds):
        if k != 5:
            write_hint(job, k, hi - 1)  # one shard left in every lane but lane 5
    lanes, _ = _lanes(job, "node-a", seed=0)
    lanes.done = {k for k in range(len(bounds)) if k not in (0, 5)}  # what this walker found exhausted
    lanes._first, lanes._avoid = None, 0  # it started in lane 0 and just left it
    first = lanes.claim()
    lo, hi = bounds[5]
    index = job.manifest().shards.ids().index(first.shard)
    assert lanes.walk.lane == 5 and not lanes.walk.owner
    assert lo + 8 <= index < hi  # inside the remainder, past its first quarter
    assert read_hint(job, 5) is None  # a guest never writes the hint


def test_an_owner_that_reaches_what_it_saw_claimed_exhausts_the_lane(tmp_path):
    """A guest walked [start, end) of lane 3 to the end; later, walking lane 3 from its hint, the same worker
    stops at that start: the lane is exhausted, its hint set to the lane's end, no shard probed past it."""
    job = make_job(tmp_path, rows=1024, shards=1024)
    bounds = lane_bounds(1024)
    lo, hi = bounds[3]
    lanes, store = _lanes(job, "node-a", seed=3)
    ids = job.manifest().shards.ids()
    for i in range(lo + 8, hi):  # claimed by somebody
        assert store.try_claim(ids[i], 0) is not None
    lanes.known_claimed[3] = lo + 8
    got = [lanes.claim().shard for _ in range(8)]
    assert got == ids[lo : lo + 8]
    nxt = lanes.claim()  # lane 3 is exhausted now: the next shard comes from elsewhere
    assert 3 in lanes.done and read_hint(job, 3) == hi
    assert nxt is not None and not lo <= ids.index(nxt.shard) < hi
    assert _claimed(job) >= set(ids[lo:hi])
