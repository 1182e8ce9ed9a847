"""``dj-elastic report``: one self-contained HTML page that shows what a job did, where and how fast.

Core layer: reads the job dir only (no Ray, no Data-Juicer), so it runs on any
machine that mounts the job dir, or reaches its object store, on a finished,
running, failed or half-written job.
"""

from __future__ import annotations

import os
from pathlib import Path

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.report.collect import collect
from data_juicer_elastic.report.page import render
from data_juicer_elastic.s3_export import store_of
from data_juicer_elastic.storage.files import atomic_write
from data_juicer_elastic.storage.urls import ObjectPath, is_s3

REPORT_NAME = "report.html"


def write_report(job_dir: str | os.PathLike, output: str | os.PathLike | None = None) -> Path | ObjectPath:
    """Write the report (default ``<job_dir>/report.html``) whole; returns where it lies.

    A job dir on an object store (``s3://``) is read through its store, and the
    default report is the key of that name there, replaced whole by one write
    (nothing on the local disk). ``output``: a local path or an ``s3://`` URL.
    """
    on_store = isinstance(job_dir, ObjectPath) or is_s3(str(job_dir))
    if not on_store and not Path(job_dir).is_dir():
        raise UserError(f"{job_dir}: no such job directory; give the elastic_shard.job_dir of a job")
    elsewhere = store_of(str(output), folder=False) if output and is_s3(str(output)) else None  # checked first
    job = JobDir(job_dir)
    if on_store and not job.store.names(""):
        raise UserError(f"{job_dir}: no job under this prefix; give the elastic_shard.job_dir of a job")
    page = render(collect(job)).encode("utf-8")
    if elsewhere is not None:  # a key of any bucket the endpoint serves
        store, key = elsewhere
        store.replace(key, page)
        return ObjectPath.of(str(output))
    if not output and on_store:
        target = ObjectPath.of(str(job_dir)) / REPORT_NAME
        job.store.replace(job.key(target), page)
        return target
    path = Path(output) if output else Path(job_dir) / REPORT_NAME
    atomic_write(path, page)
    return path


__all__ = ["REPORT_NAME", "collect", "render", "write_report"]
