"""The per-shard retry budget: which attempts count as failures, and the terminal failure record."""

from __future__ import annotations

import os
import time

from data_juicer_elastic.job.attempt_files import AttemptDir
from data_juicer_elastic.job.claims import lease_backup_of, lease_key
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.attempt import counts_as_failure, load_attempt
from data_juicer_elastic.job.records.failed import FailedRecord, publish_failed
from data_juicer_elastic.job.records.retry import retry_base


def failure_count(job: JobDir, shard: str, upto: int) -> int:
    """Attempts 1..upto after the last retry that failed or were lost (killed, never finished).

    An attempt that never recorded an outcome but whose lease was released
    was given up on purpose (the shard was done meanwhile, or the disk was
    full): that is no failure. A backup (speculation) never counts, however it ended.
    """
    count = 0
    for attempt in range(retry_base(job, shard) + 1, upto + 1):
        record = load_attempt(job, shard, attempt)
        if (record and record.backup) or lease_backup_of(job, shard, attempt) is not None:
            continue
        count += counts_as_failure(record, _released(job, shard, attempt))
    return count


def _released(job: JobDir, shard: str, attempt: int) -> bool:
    """Was the attempt's lease released (one head: lstat, no clock)? A missing lease was not."""
    meta = job.store.head(lease_key(job, shard, attempt))
    return meta is not None and meta.released


def fail_terminally(job: JobDir, shard: str, attempt: int, host: str, error: str) -> None:
    """Publish the shard's failed record: the job stops until ``dj-elastic retry`` requeues it."""
    log = str((job.attempt_dir(shard, attempt) / AttemptDir.LOG).relative_to(job.root))
    failures = failure_count(job, shard, attempt)
    publish_failed(job, FailedRecord(shard, attempt, host, os.getpid(), error, log, failures, time.time()))
