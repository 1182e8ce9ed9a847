"""One progress line for the whole job, read from the job dir: logged every N seconds, or redrawn in place.

Every process of a job (and ``dj-elastic status --watch`` on any machine that
mounts the job dir) sees the same job dir, so each can say how the whole job
stands: shards done / running / pending, hosts at work, rows per second and
the time left. The line every process logs (``ProgressTicker``) comes from
the shared snapshot of the worker records (``worker.sweep``): one small file
read per tick, whatever the job's size. ``status --watch``, a person's
request, redraws ``status.job_summary``: listings and the worker records, no done record.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from data_juicer_elastic.dedup.progress import brief, dedup_layout, progress_of
from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.job.claims import claim_store
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.status import JobStatus, job_status
from data_juicer_elastic.worker.scan import refresh_interval
from data_juicer_elastic.worker.sweep import Snapshot, SnapshotCache


def duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def progress_line(st: JobStatus) -> str:
    """``progress: 12/16 shards done, 3 running, 1 pending; 2 host(s) active; 4,210 rows/s; ETA 1m05s``."""
    c = st.counts
    parts = [
        f"progress: {c['done']}/{st.shard_count} shards done ({st.progress:.0%} of rows), "
        f"{c['running']} running, {c['pending'] + c['stale']} pending"
        + (f", {c['failed']} failed" if c["failed"] else "")
    ]
    parts.append(f"{len(st.hosts_active)} host(s) active")
    if st.rows_per_sec:
        parts.append(f"{st.rows_per_sec:,.0f} rows/s")
        left = st.input_rows - st.input_rows_done
        if left > 0:
            parts.append(f"ETA {duration(left / st.rows_per_sec)}")
    if st.error_rows:
        parts.append(f"{st.error_rows} row(s) removed by op errors")
    if st.dedup:
        parts.append(brief(st.dedup))
    return "; ".join(parts)


def snapshot_line(snap: Snapshot, input_rows: int) -> str:
    """The progress line (``progress_line``'s wording) from the sweep's snapshot."""
    running = len({b.shard for b in snap.live})
    failed = len(snap.failed)
    pending = max(snap.total - snap.done - running - failed, 0)
    share = snap.input_rows_done / input_rows if input_rows else 1.0
    parts = [
        f"progress: {snap.done}/{snap.total} shards done ({min(share, 1.0):.0%} of rows), "
        f"{running} running, {pending} pending" + (f", {failed} failed" if failed else "")
    ]
    parts.append(f"{len({b.host for b in snap.live})} host(s) active")
    span = (snap.last_finish or 0.0) - (snap.first_start or 0.0)
    rate = snap.input_rows_done / span if snap.first_start is not None and span > 0 else None
    if rate:
        parts.append(f"{rate:,.0f} rows/s")
        left = input_rows - snap.input_rows_done
        if left > 0:
            parts.append(f"ETA {duration(left / rate)}")
    if snap.error_rows:
        parts.append(f"{snap.error_rows} row(s) removed by op errors")
    return "; ".join(parts)


class ProgressReader:
    """The progress line of one job dir, from the shared snapshot; the manifest is read once."""

    def __init__(self, job_dir: str) -> None:
        self.job_dir = job_dir
        self._cache: SnapshotCache | None = None
        self._rows = 0
        self._dedup: tuple | None = None  # (job, plan, layout) of a recipe with deduplicators
        self._removed: dict[int, int] = {}  # each done join's removed rows (its done record is create-once)
        self._stages = ""  # the dedup words once every join is done: nothing more to list

    def line(self) -> str | None:
        """The progress line, or None while the job dir is not prepared yet (or unreadable)."""
        try:
            if self._cache is None:
                job = JobDir(self.job_dir)
                if not job.exists():
                    return None
                self._rows = job.manifest().total_rows
                found = dedup_layout(job)
                self._dedup = (job, *found) if found is not None else None
                self._cache = SnapshotCache(job, claim_store(job), refresh_interval(job))
            line = snapshot_line(self._cache.get(fresh=True), self._rows)
            stages = self.stages()
            return f"{line}; {stages}" if stages else line
        except (OSError, ValueError, ElasticError):
            return None

    def stages(self) -> str:
        """``dedup: d0 exact removed 40 rows, d1 minhash bucket 2/4`` ("" without deduplicators): two listings
        a tick while a join is not done, one read per join as it gets done, nothing once all are."""
        if self._dedup is None or self._stages:
            return self._stages
        found = progress_of(*self._dedup, self._removed)
        if all(p.done for p in found):
            self._stages = brief(found)
        return brief(found)


def job_progress(job_dir: str) -> str | None:
    """The progress line, or None while the job dir is not prepared yet (or unreadable)."""
    return ProgressReader(job_dir).line()


class ProgressTicker:
    """A daemon thread that logs the progress line every ``interval`` seconds while the job runs.

    The job's verdict (a PASS: or FAIL: line logged through :meth:`story`) is its last word: no progress
    line follows it, though the process still closes its runner after it.
    """

    VERDICTS = ("PASS:", "FAIL:")

    def __init__(self, job_dir: str, interval: float | None, log: Callable[[str], None]) -> None:
        self.job_dir, self.interval, self.log = job_dir, interval, log
        self.reader = ProgressReader(job_dir)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # a tick read before the verdict is not logged after it
        self._thread = threading.Thread(target=self._run, name="dje-progress", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            line = self.reader.line()
            with self._lock:
                if line and not self._stop.is_set():
                    self.log(line)

    def story(self, log: Callable[[str], None]) -> Callable[[str], None]:
        """``log``, which stops the ticks for good when it logs the verdict."""

        def logged(line: str) -> None:
            if not line.startswith(self.VERDICTS):
                return log(line)
            with self._lock:
                self._stop.set()
                log(line)

        return logged

    def __enter__(self) -> ProgressTicker:
        if self.interval:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


def watch(
    job_dir: str, interval: float = 2.0, stream: TextIO | None = None, until: Callable[[], bool] | None = None
) -> int:
    """Redraw the progress in place (a terminal) or print it when it changes; returns status's exit code."""
    out = stream or sys.stdout
    tty = bool(getattr(out, "isatty", lambda: False)())
    last = ""
    while True:
        job = JobDir(job_dir)
        st = job_status(job, per_shard=False)
        line = f"{time.strftime('%H:%M:%S')} {progress_line(st)}"
        if tty:
            out.write("\r\x1b[2K" + line)
        elif line.split(" ", 1)[1] != last:
            out.write(line + "\n")
        last = line.split(" ", 1)[1]
        out.flush()
        if st.complete or st.failed or (until is not None and until()):
            if tty:
                out.write("\n")
            return 0 if st.complete else (2 if st.failed else 1)
        time.sleep(interval)
