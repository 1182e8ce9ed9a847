"""The dedup pre-phase of one node's claim loop: every stage unit before the final pass, claimed in stage order.

Each unit is claimed through the shards' lease API (job/claims.py), renewed while it runs, fenced at publish, and
taken over once its holder's lease lapses, as a shard is. A node that finds a stage's remaining units held live
elsewhere waits for them; a stage starts only on the stage before done. The final pass is the classic shard
attempt (worker/loop.py), whose runner reads a shard's rows from :func:`final_rows`. No Ray, no Data-Juicer: the
recipe's code comes in as :class:`units.Ops` from the runner. A unit attempt that raises or is lost counts
against the unit's retry budget as a shard's does (dedup/budget.py).

Tests only: a process whose environment names a unit in ``DJE_TEST_GATE_UNIT`` and a folder in
``DJE_TEST_UNIT_GATE`` stops in that unit once its outputs are written, its done record not yet published (the
lease still renewed), after leaving ``<folder>/entered`` (holding its host), until ``<folder>/open`` exists: a
test kills the node there, by state rather than by time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from data_juicer_elastic.dedup import budget, units
from data_juicer_elastic.dedup.layout import DedupLayout, Unit
from data_juicer_elastic.dedup.plan import Plan
from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.claims import ClaimStore, Lease
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.storage.refresher import LeaseRefresher

MAX_BUCKETS = 256
GATE_ENV, GATE_UNIT_ENV = "DJE_TEST_UNIT_GATE", "DJE_TEST_GATE_UNIT"
Log = Callable[[str], None]


class Stopped(Exception):
    """The run was told to stop while the pre-phase waited or between units."""


def bucket_count(shards: int) -> int:
    """One bucket per input shard, at most :data:`MAX_BUCKETS`: the same on every node (a function of the job)."""
    return max(1, min(shards, MAX_BUCKETS))


def layout_of(job: JobDir, plan: Plan) -> DedupLayout:
    """The generation's dedup layout: its input shards, their first global rows, the bucket count."""
    manifest = job.manifest()
    if manifest.parquet is not None:
        raise UserError("deduplicators run on JSONL input only for now; this job's shards are Parquet row groups")
    specs = list(manifest.shards)
    base = job.key(job.gen_dir) if job.gen_dir != job.root else ""
    return DedupLayout.of(base, plan, [s.id for s in specs], [s.first_row for s in specs], bucket_count(len(specs)))


def final_rows(job: JobDir, layout: DedupLayout, shard: str) -> list[dict]:
    """An input shard's rows as the last dedup leaves them, in input order, without their global index."""
    pairs = units.surviving_rows(job.store, layout, shard, len(layout.kinds), None)
    return [row for _, row in pairs]


def test_gate(unit: Unit, host: str) -> None:
    """Tests only (see the module's docstring): hold ``unit`` here while the test's gate folder says so."""
    gate = os.environ.get(GATE_ENV)
    if not gate or os.environ.get(GATE_UNIT_ENV) != unit.id or os.path.exists(os.path.join(gate, "open")):
        return
    with open(os.path.join(gate, "entered.tmp"), "w", encoding="utf-8") as f:
        f.write(host)
    os.replace(os.path.join(gate, "entered.tmp"), os.path.join(gate, "entered"))
    while not os.path.exists(os.path.join(gate, "open")):
        time.sleep(0.05)


@dataclass
class Driver:
    """One node's pre-phase: the units of every stage before the final one, claimed and run one at a time."""

    job: JobDir
    layout: DedupLayout
    ops: units.Ops
    claims: ClaimStore
    should_stop: Callable[[], bool] = lambda: False
    log: Log = lambda _: None
    poll: float = 0.2
    max_retries: int = -1  # the job's policy when left at -1

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            self.max_retries = self.job.manifest().policy.max_retries

    def run(self) -> int:
        """Run until every stage before the final one is done (by this node or others); units this node ran."""
        ran = 0
        for stage, dedup in self.layout.stages():
            if stage == "final":
                break
            ran += self.run_stage(self.layout.units(stage, dedup))
        return ran

    def run_stage(self, todo: list[Unit]) -> int:
        """Claim this stage's units until all are done; wait while the rest are held live elsewhere."""
        ran, turn = 0, 0
        while True:
            if self.should_stop():
                raise Stopped("the run was stopped during the dedup stages")
            todo = [u for u in todo if not units.is_done(self.job.store, self.layout, u)]
            if not todo:
                return ran
            turn += 1
            start = turn % len(todo)  # nodes start at different units of a stage less often than not
            for unit in todo[start:] + todo[:start]:
                lease = self.claim(unit)
                if lease is not None:
                    ran += self.run_claimed(unit, lease)
                    break
            else:
                time.sleep(self.poll)  # every unit left is held live by another node

    def claim(self, unit: Unit) -> Lease | None:
        """The next attempt of ``unit`` unless its latest is held live (its holder renewing, not proven gone)."""
        current = self.claims.latest_attempt(unit.id)
        if current and self.claims.live_pair(unit.id, current, self.claims.now()):
            return None
        if current and budget.over_budget(self.job, unit, current, self.claims.host, self.max_retries):
            raise budget.UnitFailed(budget.failed_message(self.job, unit))
        return self.claims.try_claim(unit.id, current)

    def run_claimed(self, unit: Unit, lease: Lease) -> int:
        """One attempt under its lease, renewed meanwhile; published only while no later attempt fences it."""
        claims, store = self.claims, self.job.store
        ver = claims.hand_over(lease)
        key = claims.key(lease.shard, lease.attempt)
        ours = lambda: claims.is_current(lease)  # noqa: E731
        renew = LeaseRefresher(claims.store, key, ver, claims.lock_timeout / 4, still_ours=ours)
        try:
            with renew:
                if units.is_done(store, self.layout, unit):
                    return 0
                started, at = time.monotonic(), time.time()
                try:
                    done = units.run_unit(store, self.layout, unit, lease.attempt, self.ops)
                    test_gate(unit, lease.host)
                except Exception as exc:
                    self.failed(unit, lease, at, exc)
                    return 0
                if not claims.is_current(lease):
                    self.log(f"dedup unit {unit.id} attempt {lease.attempt}: superseded, not published")
                    return 0
                units.publish(store, self.layout, unit, done)
                rows = f", {done.rows} rows" if done.rows >= 0 else ""
                self.log(f"dedup unit {unit.id} attempt {lease.attempt} done{rows} ({time.monotonic() - started:.2f}s)")
                return 1
        finally:
            claims.release(lease)

    def failed(self, unit: Unit, lease: Lease, started: float, exc: Exception) -> None:
        """Record the attempt's failure (its lease still held); past the budget, fail the unit and end the run."""
        failures = budget.record_failure(self.job, unit, lease, started, exc)
        error = f"{type(exc).__name__}: {exc}"
        self.log(
            f"dedup unit {unit.id} attempt {lease.attempt} failed ({failures} failure(s), "
            f"max_retries {self.max_retries}): {error}"
        )
        if budget.over_budget(self.job, unit, lease.attempt, self.claims.host, self.max_retries, error):
            raise budget.UnitFailed(budget.failed_message(self.job, unit))
