"""Coordination costs the same per shard at any size (DESIGN invariant 12), counted, never timed.

Real ``dj-elastic worker`` processes (copy runner) run under ``strace -f``; every system call on the job
dir is counted (``tests/benchmarks/bench_scale.py`` has the counter and the B10-B12 benchmarks). The
claim loop listed state/done, state/failed and state/claims for every claim: its calls and listing bytes
per shard grew with the job. Now they must not: the larger job may cost at most 1.2x per shard what the
smaller one costs.

One listing is paid per snapshot interval rather than per shard: the sweep's listing of ``state/workers``
(one entry per worker process). How many sweeps fall on a shard depends on how fast this machine runs the
shards that moment, so that folder is held to its own bound instead: each listing of it O(processes).
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


def _per_sweep(cost: PerShard) -> tuple[float, float]:
    """(listing bytes per shard not paid per sweep; bytes of one listing of the worker records)."""
    swept = [f for f in cost.listings if f.endswith("/state/workers")]
    largest = max((cost.per_read[f] for f in swept), default=0.0)
    return cost.listing - sum(cost.listings[f] for f in swept), largest


@pytest.mark.timeout(900)
def test_file_system_calls_per_shard_do_not_grow_with_the_job(tmp_path):
    small, big = _cost(tmp_path, SMALL), _cost(tmp_path, BIG)
    (small_listing, small_sweep), (big_listing, big_sweep) = _per_sweep(small), _per_sweep(big)
    print(
        f"{WORKERS} workers: {SMALL} shards {small.calls:.1f} calls and {small.listing:.0f} B of listings per shard "
        f"({small_listing:.0f} B not per sweep); {BIG} shards {big.calls:.1f} calls and {big.listing:.0f} B "
        f"({big_listing:.0f} B); a sweep lists {max(small_sweep, big_sweep):.0f} B of worker records"
    )
    assert big.calls <= 1.2 * small.calls, (small.calls, big.calls)
    assert big_listing <= 1.2 * small_listing + 64, (small.listings, big.listings)
    assert big.listing <= 8192, big.listings
    # a sweep's listing names the worker processes (about 40 B each), never the shards
    assert 0 < big_sweep <= 64 * (WORKERS + 2), big_sweep
