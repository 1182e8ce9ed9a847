"""``dj-elastic report``: one self-contained HTML page that shows what a job did, where and how fast.

Core layer: reads the job dir only (no Ray, no Data-Juicer), so it runs on any
machine that mounts the job dir, on a finished, running, failed or
half-written job.
"""

from __future__ import annotations

import os
from pathlib import Path

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.report.collect import collect
from data_juicer_elastic.report.page import render
from data_juicer_elastic.storage.files import atomic_write
from data_juicer_elastic.storage.urls import ObjectPath, is_s3

REPORT_NAME = "report.html"


def write_report(job_dir: str | os.PathLike, output: str | os.PathLike | None = None) -> Path:
    """Write the report (default ``<job_dir>/report.html``) atomically; returns its path."""
    if isinstance(job_dir, ObjectPath) or is_s3(str(job_dir)):  # it reads and writes the job dir by path
        raise UserError(f"{job_dir}: the report cannot be written for a job dir on an object store yet")
    if not Path(job_dir).is_dir():
        raise UserError(f"{job_dir}: no such job directory; give the elastic_shard.job_dir of a job")
    path = Path(output) if output else Path(job_dir) / REPORT_NAME
    atomic_write(path, render(collect(job_dir)).encode("utf-8"))
    return path


__all__ = ["REPORT_NAME", "collect", "render", "write_report"]
