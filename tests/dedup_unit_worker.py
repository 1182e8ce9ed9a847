"""One racing process of tests/test_dedup_units.py: claims dedup stage units through the shard lease API
(job/claims.py) and runs them until the final stage is done.

``victim``: on its first bucket unit it writes its output, names the unit in a marker key, then waits to be
killed -9 (no done record). ``racer``: claims no bucket unit before that marker is there, so the victim always
holds one bucket when the kill lands, and a racer must take it over once its lease lapses.
"""

from __future__ import annotations

import sys
import time

from data_juicer_elastic.dedup import units
from data_juicer_elastic.dedup.layout import DedupLayout, Unit
from data_juicer_elastic.dedup.plan import plan
from data_juicer_elastic.job.claims import ClaimStore, Lease
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.shard_table import shard_id
from data_juicer_elastic.ray_runner import dedup_keys
from data_juicer_elastic.storage.host import hostname
from data_juicer_elastic.storage.refresher import LeaseRefresher
from data_juicer_elastic.storage.store import Store
from tests.test_dedup_core import EXACT, MINHASH, long_filter

GEN = "0123456789abcdef"
MARKER = "test/victim-in-bucket"
PROCESS = [EXACT, MINHASH]


def layout_for(rows: int, shards: int, buckets: int) -> DedupLayout:
    ids = [shard_id(s, shards) for s in range(shards)]
    starts = [rows * s // shards for s in range(shards)]
    return DedupLayout.of(f"generations/{GEN}", plan(PROCESS), ids, starts, buckets)


def recipe_ops() -> units.Ops:
    """Data-Juicer's own ops make the keys (ray_runner/dedup_keys); the filter between the dedups is the core
    test's stand-in for any per-row op."""
    hashers = []
    for dedup in plan(PROCESS).dedups:
        op = dedup_keys.build_op(dedup)
        keys_for = lambda rows, op=op, kind=dedup.kind: [dedup_keys.row_keys(op, kind, r) for r in rows]  # noqa: E731
        hashers.append(units.Hasher(keys_for, dedup_keys.key_length(op, dedup.kind)))
    return units.Ops(hashers, [None, long_filter, None])


def claim(claims: ClaimStore, unit: Unit) -> Lease | None:
    """The next attempt of ``unit`` unless its latest is held live (its holder renewing, not proven gone)."""
    current = claims.latest_attempt(unit.id)
    if current and claims.live_pair(unit.id, current, claims.now()):
        return None
    return claims.try_claim(unit.id, current)


def hang(store: Store, unit: Unit) -> None:
    store.create(MARKER, unit.id.encode())
    while True:  # killed -9 here, lease renewed by the refresher until then
        time.sleep(1)


def run_claimed(
    store: Store, claims: ClaimStore, layout: DedupLayout, unit: Unit, lease: Lease, ops: units.Ops, victim: bool
) -> None:
    """One attempt under its lease, renewed meanwhile; published only while no later attempt fences it."""
    ver = claims.hand_over(lease)
    key = claims.key(lease.shard, lease.attempt)
    interval = claims.lock_timeout / 4
    with LeaseRefresher(claims.store, key, ver, interval, still_ours=lambda: claims.is_current(lease)):
        if units.is_done(store, layout, unit):
            return
        kw = {"pause": lambda: hang(store, unit)} if victim and unit.stage == "bucket" else {}
        done = units.run_unit(store, layout, unit, lease.attempt, ops, **kw)
        if claims.is_current(lease):
            units.publish(store, layout, unit, done)


def main(url: str, role: str, rows: int, shards: int, buckets: int, lock_timeout: float) -> None:
    job = JobDir(url, GEN)
    store = job.store
    claims = ClaimStore(job, lock_timeout=lock_timeout, host=hostname())
    layout, ops = layout_for(rows, shards, buckets), recipe_ops()
    turn = 0
    while pending := units.units_pending(store, layout):
        if role == "racer" and pending[0].stage == "bucket" and store.head(MARKER) is None:
            time.sleep(0.05)
            continue
        turn += 1
        for unit in pending[turn % len(pending) :] + pending[: turn % len(pending)]:
            lease = claim(claims, unit)
            if lease is not None:
                run_claimed(store, claims, layout, unit, lease, ops, role == "victim")
                claims.release(lease)
                break
        else:
            time.sleep(0.05)  # every pending unit held live by another process


if __name__ == "__main__":
    url, role, *nums = sys.argv[1:]
    main(url, role, int(nums[0]), int(nums[1]), int(nums[2]), float(nums[3]))
