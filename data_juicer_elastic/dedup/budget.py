"""A dedup stage unit's retry budget, counted as a shard's (worker/budget.py): the policy's ``max_retries``.

A unit attempt that raises leaves an attempt record (outcome ``failed``, its error) and its traceback as the
attempt's ``process.log`` under ``attempts/<unit>/<attempt>/``, then releases its lease, so any node retries it.
An attempt lost to a kill leaves no record and an unreleased lease: it counts too (``failure_count``). Past the
budget the unit's failed record (``state/failed/<unit>.json``) is published and the run ends, naming the unit,
its error and its log.
"""

from __future__ import annotations

import os
import traceback

from data_juicer_elastic.dedup.layout import Unit
from data_juicer_elastic.errors import one_line
from data_juicer_elastic.job.attempt_files import AttemptDir
from data_juicer_elastic.job.claims import Lease
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.attempt import AttemptRecord, write_attempt
from data_juicer_elastic.job.records.failed import load_failed
from data_juicer_elastic.worker.budget import fail_terminally, failure_count

LOST = "attempts lost (node killed or stalled) past the retry budget"


class UnitFailed(Exception):
    """A dedup unit failed past its retry budget: the run ends (exit 2) with this message."""


def log_key(job: JobDir, unit: Unit, attempt: int) -> str:
    return job.key(job.attempt_dir(unit.id, attempt) / AttemptDir.LOG)


def record_failure(job: JobDir, unit: Unit, lease: Lease, started: float, exc: BaseException) -> int:
    """The failed attempt's log and record (the lease still held); its unit's failures so far, this one in."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    job.store.create(log_key(job, unit, lease.attempt), text.encode(), durable=False)
    record = AttemptRecord(unit.id, lease.attempt, lease.host, os.getpid(), lease.token, started, 0.0, None, False)
    write_attempt(job, record.finish("failed", f"{type(exc).__name__}: {exc}"))
    return failure_count(job, unit.id, lease.attempt)


def over_budget(job: JobDir, unit: Unit, attempt: int, host: str, max_retries: int, error: str = LOST) -> bool:
    """Publish ``unit``'s failed record when its failures up to ``attempt`` exceed ``max_retries``."""
    if failure_count(job, unit.id, attempt) <= max_retries:
        return False
    fail_terminally(job, unit.id, attempt, host, error)
    return True


def failed_message(job: JobDir, unit: Unit) -> str:
    """The run's FAIL line for a unit past its budget: the unit, where and how often it failed, its log."""
    rec = load_failed(job, unit.id)
    host, failures, error = (rec.host, rec.failures, rec.error) if rec else ("?", None, None)
    log = f"{job.root}/{rec.log}" if rec and rec.log else str(job.attempts_dir / unit.id)
    gen = f" --generation {job.generation}" if job.generation else ""
    return (
        f"dedup unit {unit.id} ({unit.stage} stage of dedup {unit.dedup}) failed terminally on host={host} after "
        f"{failures} failure(s): {one_line(error)}; see {log}; fix the cause, then "
        f"`dj-elastic retry --job-dir {job.root}{gen} --all-failed` and submit the job again"
    )
