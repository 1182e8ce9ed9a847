"""Coordination costs the same per shard at any size (DESIGN invariant 12), counted, never timed.

Real ``dj-elastic worker`` processes (copy runner) run under ``strace -f``; every system call on the job
dir is counted (``tests/benchmarks/bench_scale.py`` has the counter and the B10-B12 benchmarks). The
claim loop listed state/done, state/failed and state/claims for every claim: its calls and listing bytes
per shard grew with the job. Now they must not: the larger job may cost at most 1.2x per shard what the
smaller one costs.
"""

from __future__ import annotations

import shutil

import pytest

from tests.benchmarks.bench_scale import FAST, per_shard
from tests.jobs import make_job

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("strace") is None, reason="strace counts the calls (apt-get install strace)"),
]

WORKERS = 16


def _cost(tmp_path, shards: int) -> tuple[float, float]:
    job = make_job(tmp_path / f"job-{shards}", rows=shards, shards=shards, **FAST)
    calls, listing, codes = per_shard(job, WORKERS, tmp_path / f"traces-{shards}")
    assert set(codes) == {0}, codes
    return calls, listing


@pytest.mark.timeout(900)
def test_file_system_calls_per_shard_do_not_grow_with_the_job(tmp_path):
    small_calls, small_listing = _cost(tmp_path, 500)
    big_calls, big_listing = _cost(tmp_path, 5000)
    print(
        f"{WORKERS} workers: 500 shards {small_calls:.1f} calls and {small_listing:.0f} B of listings per shard; "
        f"5000 shards {big_calls:.1f} calls and {big_listing:.0f} B per shard"
    )
    assert big_calls <= 1.2 * small_calls, (small_calls, big_calls)
    assert big_listing <= 1.2 * small_listing + 64, (small_listing, big_listing)
    assert big_listing <= 8192, big_listing
