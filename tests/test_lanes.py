"""Fresh shards from the lanes: every shard claimed once, at most two walkers a lane, ends that meet.

Workers that walk the same stretch of one lane lose an O_EXCL create for each shard the other won (a worker
record rewrite and a failed create each); over one sshfs mount that doubled the last tenth of a 20,000-shard
job. Each lane has an owner walking up from its hint and a guest walking down from its tail; where they meet
the lane is exhausted, and both files only ever say what is claimed.
"""

from __future__ import annotations

import os
import threading

from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.storage.posix import PosixStore
from data_juicer_elastic.worker.lanes import (
    Lanes,
    fresh_left,
    lane_bounds,
    lane_state,
    read_hint,
    read_tail,
    write_hint,
    write_tail,
)

from .jobs import make_job


def _lanes(job, host: str, seed: int) -> tuple[Lanes, ClaimStore]:
    store = ClaimStore(job, lock_timeout=30.0, host=host, pid=os.getpid())
    return Lanes(job, store, job.manifest().shards.ids(), seed), store


def _claimed(job) -> set[str]:
    return {name.split("@")[0] for name in os.listdir(job.claims_dir) if name.endswith("@0001")}


def _only_open(lanes: Lanes, *open_lanes: int) -> None:
    """As if the walker had found every other lane exhausted and left its own."""
    lanes.done = {k for k in range(len(lanes.bounds)) if k not in open_lanes}
    lanes._first = None


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
    for k, bounds in enumerate(lane_bounds(400)):  # every lane's ends met: read as exhausted by anyone
        hint, tail = lane_state(job, bounds, k)
        assert hint >= tail


def test_a_walker_whose_lane_ran_out_walks_the_largest_remainder_down_from_its_tail(tmp_path):
    """Lane 0 exhausted: the walker reads a few lanes, takes the one with the most left and, as no guest
    walks it yet (its tail is the lane's end), walks it down from the end. It moves the tail, never the hint:
    shards below its start may be unclaimed."""
    job = make_job(tmp_path, rows=2048, shards=2048)  # 64 lanes of 32
    bounds = lane_bounds(2048)
    for k, (_, hi) in enumerate(bounds):
        if k != 5:
            write_hint(job, k, hi - 1)  # one shard left in every lane but lane 5
    lanes, _ = _lanes(job, "node-a", seed=0)
    _only_open(lanes, 1, 2, 5)
    ids = job.manifest().shards.ids()
    _, hi = bounds[5]
    got = [ids.index(lanes.claim().shard) for _ in range(4)]
    assert got == [hi - 1, hi - 2, hi - 3, hi - 4]
    assert lanes.walk.lane == 5 and not lanes.walk.owner
    assert read_tail(job, 5) == hi - 4  # [hi - 4, hi) claimed, for every later reader
    assert read_hint(job, 5) is None  # a guest never writes the hint


def test_an_owner_that_meets_the_tail_exhausts_the_lane_without_probing_past_it(tmp_path):
    """A guest walked lane 3 down to lo + 8 and said so in the tail; the owner walking up from the hint stops
    there: the lane is exhausted, its hint set to the lane's end, no shard past the tail looked at."""
    job = make_job(tmp_path, rows=1024, shards=1024)
    bounds = lane_bounds(1024)
    lo, hi = bounds[3]
    lanes, _ = _lanes(job, "node-a", seed=3)
    ids = job.manifest().shards.ids()
    write_tail(job, 3, lo + 8)  # a lie past lo + 8 (nothing claimed there): an owner that probed would claim
    got = [lanes.claim().shard for _ in range(8)]
    assert got == ids[lo : lo + 8]
    nxt = lanes.claim()  # lane 3 is exhausted now: the next shard comes from elsewhere
    assert 3 in lanes.done and read_hint(job, 3) == hi
    assert nxt is not None and not lo <= ids.index(nxt.shard) < hi
    assert _claimed(job) & set(ids[lo + 8 : hi]) == set()


def test_a_guest_that_meets_the_hint_exhausts_the_lane_and_lowers_the_tail_to_its_start(tmp_path):
    """The owner of lane 3 reported [lo, lo + 8) claimed; a guest walking down from the end claims the rest
    and, meeting the hint, writes the tail at the lane's start: exhausted for every reader."""
    job = make_job(tmp_path, rows=1024, shards=1024)
    lo, hi = lane_bounds(1024)[3]
    lanes, _ = _lanes(job, "node-a", seed=0)
    ids = job.manifest().shards.ids()
    write_hint(job, 3, lo + 8)  # a lie below lo + 8 (nothing claimed there): a guest that probed would claim
    _only_open(lanes, 3)
    got = []
    while (lease := lanes.claim()) is not None:
        got.append(ids.index(lease.shard))
    assert got == list(range(hi - 1, lo + 7, -1))
    assert lanes.exhausted and read_tail(job, 3) == lo
    assert _claimed(job) & set(ids[lo : lo + 8]) == set()


def test_a_lane_whose_ends_met_is_exhausted_at_once(tmp_path):
    """Hint and tail at the same index: nothing between them, so the lane counts as exhausted when read,
    without a probe (in a job's last moments every worker reads every lane once, not walks it)."""
    job = make_job(tmp_path, rows=1024, shards=1024)
    lo, _ = lane_bounds(1024)[7]
    write_hint(job, 7, lo + 16)
    write_tail(job, 7, lo + 16)  # a lie about [lo, lo + 16): nothing is claimed there
    lanes, _ = _lanes(job, "node-a", seed=0)
    _only_open(lanes, 7)
    assert lanes.claim() is None and lanes.exhausted
    assert _claimed(job) == set()


def test_a_lane_whose_hint_stood_still_gets_an_owner_and_one_whose_tail_moves_gets_no_second_guest(tmp_path):
    """A worker reads lane 5 twice: its tail moved between the reads (a guest walks it), its hint did not
    (its owner left): the second choice walks up from the hint, as the owner nobody was."""
    job = make_job(tmp_path, rows=2048, shards=2048)
    lo, hi = lane_bounds(2048)[5]
    write_hint(job, 5, lo + 4)
    write_tail(job, 5, hi - 4)
    lanes, _ = _lanes(job, "node-a", seed=0)
    _only_open(lanes, 5)
    first = lanes._choose()
    assert first.lane == 5 and not first.owner  # both ends unknown to it: a guest (the second, maybe)
    write_tail(job, 5, hi - 8)  # the guest walking it moved on
    second = lanes._choose()
    assert second.lane == 5 and second.owner and second.cursor == lo + 4


class _CountedReads(PosixStore):
    """The job dir as a store that counts its reads (each one a GET on S3)."""

    reads = 0

    def read(self, key: str):
        type(self).reads += 1
        return super().read(key)


def test_a_lane_seen_exhausted_is_not_read_again_and_a_marker_written_back_moves_nothing_back(tmp_path):
    """The sweep reads every lane's two files at each build: a lane this job object saw exhausted is not read
    again, and a hint written back later (a paused worker's old position) does not undo what was read."""
    job = make_job(tmp_path, rows=64, shards=64)  # four lanes of 16
    job._store = _CountedReads(job.root)
    bounds = lane_bounds(64)
    for k, (_, hi) in enumerate(bounds[:3]):
        write_hint(job, k, hi)  # lanes 0-2 exhausted; lane 3 has no file yet
    lo, hi = bounds[3]
    write_hint(job, 3, lo + 8)
    _CountedReads.reads = 0
    assert fresh_left(job, 64) == hi - lo - 8
    assert _CountedReads.reads == 8
    write_hint(job, 0, bounds[0][0])  # written back: an older true statement
    write_hint(job, 3, lo + 4)
    _CountedReads.reads = 0
    assert fresh_left(job, 64) == hi - lo - 8  # lane 0 still exhausted, lane 3's hint not lowered
    assert _CountedReads.reads == 2  # lane 3's two files only
    assert lane_state(job, bounds[0], 0) == (bounds[0][1], bounds[0][1])
