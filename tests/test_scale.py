"""Coordination costs the same per shard at any size (DESIGN invariant 12), counted, never timed.

Real ``dj-elastic worker`` processes (copy runner) run under ``strace -f``; every system call on the job
dir is counted (``tests/benchmarks/bench_scale.py`` has the counter and the B10-B12 benchmarks). The
claim loop listed state/done, state/failed and state/claims for every claim: its calls and listing bytes
per shard grew with the job. Now they must not: the larger job may cost at most 1.2x per shard what the
smaller one costs.

One listing is paid per snapshot interval rather than per shard: the sweep's listing of ``state/workers``
(one entry per worker process). How many sweeps fall on a shard depends on how fast this machine runs the
shards that moment, so that folder is held to its own bound instead: each listing of it O(processes).

``state/done`` and ``state/claims`` are listed per job, not per claim: one process confirms a complete
snapshot by one listing of the done records, a process whose lister is late lists for itself, and the
sweep's quiet fallback (nothing live, nothing claimable, not complete; at most once per lease timeout) lists
both. How many a job pays depends on timing: CI measured one at 300 shards and two or three at 3,000 in
one run. Each is held to at most one listing per process (about 48 B a shard each); a listing per claim
would cost thousands of bytes a shard.
"""

from __future__ import annotations

import shutil

import pytest

from tests.benchmarks.bench_scale import FAST, PerShard, per_shard
from tests.jobs import make_job
from tests.require import require

pytestmark = pytest.mark.slow

WORKERS = 16
SMALL, BIG = 300, 3000  # ten times the shards: a per-claim listing of a shard folder would cost ten times more


def _cost(tmp_path, shards: int) -> PerShard:
    require(shutil.which("strace") is not None, "strace counts the calls (apt-get install strace)")
    job = make_job(tmp_path / f"job-{shards}", rows=shards, shards=shards, **FAST)
    cost = per_shard(job, WORKERS, tmp_path / f"traces-{shards}")
    assert set(cost.codes) == {0}, cost.codes
    return cost


DONE_LISTING = 48  # bytes a shard in one listing of state/done (its entry: name and dirent header)


def _per_sweep(cost: PerShard) -> tuple[float, float, float]:
    """(listing bytes per shard paid per claim; bytes of one listing of the worker records; listing bytes per
    shard of state/done and state/claims)."""
    swept = [f for f in cost.listings if f.endswith("/state/workers")]
    done = sum(v for f, v in cost.listings.items() if f.endswith(("/state/done", "/state/claims")))
    largest = max((cost.per_read[f] for f in swept), default=0.0)
    return cost.listing - sum(cost.listings[f] for f in swept) - done, largest, done


@pytest.mark.timeout(900)
def test_file_system_calls_per_shard_do_not_grow_with_the_job(tmp_path):
    small, big = _cost(tmp_path, SMALL), _cost(tmp_path, BIG)
    (small_listing, small_sweep, small_done), (big_listing, big_sweep, big_done) = _per_sweep(small), _per_sweep(big)
    print(
        f"{WORKERS} workers: {SMALL} shards {small.calls:.1f} calls and {small.listing:.0f} B of listings per shard "
        f"({small_listing:.0f} B per claim); {BIG} shards {big.calls:.1f} calls and {big.listing:.0f} B "
        f"({big_listing:.0f} B); a sweep lists {max(small_sweep, big_sweep):.0f} B of worker records; "
        f"state/done and state/claims {small_done:.0f} / {big_done:.0f} B a shard"
    )
    assert big.calls <= 1.2 * small.calls, (small.calls, big.calls)
    assert big_listing <= 1.2 * small_listing + 64, (small.listings, big.listings)
    assert big.listing <= 8192, big.listings
    # a sweep's listing names the worker processes (about 40 B each), never the shards
    assert 0 < big_sweep <= 64 * (WORKERS + 2), big_sweep
    # state/done and state/claims: listed per job (done at least once, to confirm the end), each at most once
    # per process
    for done in (small_done, big_done):
        assert DONE_LISTING * 0.9 <= done <= 2 * DONE_LISTING * (WORKERS + 1), (small.listings, big.listings)
