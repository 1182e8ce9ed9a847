"""How the lanes walk spends file calls, tenth by tenth: threads as workers, counted, never timed.

    python tests/benchmarks/sim_lanes.py [--shards 20000] [--workers 256] [--seed 1]

Each thread is one worker's ``Lanes`` (its own ``ClaimStore`` and host name) on one prepared job in
``/dev/shm``; it claims fresh shards until every lane is exhausted, pausing 0-4 ms after each claim as if it
ran the shard. Per tenth of the claims: probes of a first lease that found it free or claimed, lost creates
and reads and writes of the lane files, and the calls beyond one probe and one create per shard ("extra",
a lost create counted as two: the failed create and the ledger rewrite before it). The interleaving is
the interpreter's, so the counts move from run to run; compare designs by their shape over the tenths
(flat or growing), not by a digit. The B12 benchmarks time the same walk with real worker processes.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.worker import lanes as lanes_mod
from tests.jobs import make_job

COLUMNS = (
    "claimed",
    "probe_free",
    "probe_claimed",
    "lost_create",
    "read_hint",
    "read_tail",
    "write_hint",
    "write_tail",
)


class Tally:
    """Counts by tenth of the claims made so far (one lock: the threads share it)."""

    def __init__(self, total: int) -> None:
        self.total, self.claimed = total, 0
        self.by_tenth: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        self.lanes_by_tenth: dict[int, set[tuple[int, int]]] = collections.defaultdict(set)
        self.lock = threading.Lock()

    def add(self, what: str) -> None:
        with self.lock:
            self.by_tenth[min(self.claimed * 10 // self.total, 9)][what] += 1

    def claim(self, lane: int, worker: int) -> None:
        with self.lock:
            tenth = min(self.claimed * 10 // self.total, 9)
            self.by_tenth[tenth]["claimed"] += 1
            self.lanes_by_tenth[tenth].add((lane, worker))
            self.claimed += 1


def counted(tally: Tally, name: str, fn):
    def wrapper(*args, **kwargs):
        tally.add(name)
        return fn(*args, **kwargs)

    return wrapper


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="dje-sim-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        job = make_job(base, rows=a.shards, shards=a.shards)
        order = job.manifest().shards.ids()
        lane_of = {order[i]: k for k, (lo, hi) in enumerate(lanes_mod.lane_bounds(a.shards)) for i in range(lo, hi)}
        tally = Tally(a.shards)
        for name in ("read_hint", "read_tail", "write_hint", "write_tail"):
            setattr(lanes_mod, name, counted(tally, name, getattr(lanes_mod, name)))

        def walk(i: int) -> None:
            store = ClaimStore(job, lock_timeout=30.0, host=f"sim-{i:03d}", pid=os.getpid())
            try_claim = store.try_claim

            def claim(sid, attempt):
                lease = try_claim(sid, attempt)
                if lease is None:
                    tally.add("lost_create")
                return lease

            store.try_claim = claim
            exists = store.exists

            def probe(sid, attempt):
                found = exists(sid, attempt)
                if attempt == 1:
                    tally.add("probe_claimed" if found else "probe_free")
                return found

            store.exists = probe
            rng = random.Random(a.seed * 100003 + i)
            walker = lanes_mod.Lanes(job, store, order, rng.getrandbits(32))
            while (lease := walker.claim()) is not None:
                tally.claim(lane_of[lease.shard], i)
                threading.Event().wait(rng.uniform(0.0, 0.004))

        threads = [threading.Thread(target=walk, args=(i,)) for i in range(a.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(f"{a.workers} walkers, {a.shards} shards, {len(lanes_mod.lane_bounds(a.shards))} lanes")
        print("tenth " + " ".join(f"{c:>13}" for c in COLUMNS) + "  walkers/lane  extra/shard")
        for tenth in range(10):
            c = tally.by_tenth[tenth]
            pairs = tally.lanes_by_tenth[tenth]
            per_lane = len(pairs) / max(len({lane for lane, _ in pairs}), 1)
            extra = c["probe_claimed"] + 2 * c["lost_create"] + sum(c[k] for k in COLUMNS[4:])
            print(
                f"{tenth:5d} "
                + " ".join(f"{c[k]:13d}" for k in COLUMNS)
                + f"  {per_lane:12.1f}  {extra / max(c['claimed'], 1):11.2f}"
            )
        claimed = sum(c["claimed"] for c in tally.by_tenth.values())
        if claimed != a.shards:
            print(f"claimed {claimed} of {a.shards}: the walk lost or repeated shards", file=sys.stderr)
            return 1
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
