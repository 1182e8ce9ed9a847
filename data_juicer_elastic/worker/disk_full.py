"""A full disk during an attempt: stop the worker, but do not count it against the shard.

The attempt's unpublished output is removed (it is what filled the disk),
the attempt is recorded as ``no-space``, its lease released, and the worker
exits 2 with a message naming the path; the job goes on once space is freed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.job.attempt_files import AttemptDir
from data_juicer_elastic.job.claims import ClaimStore, Lease
from data_juicer_elastic.job.layout import JobDir, attempt_name
from data_juicer_elastic.job.records.done import load_done
from data_juicer_elastic.storage.files import disk_full_in, no_space_error


class NoSpace(Exception):
    """The disk filled up while an attempt wrote ``path``."""

    def __init__(self, path: Path, error: OSError) -> None:
        super().__init__(path, error)
        self.path, self.error = path, error

    def __str__(self) -> str:
        return str(self.error)


@contextmanager
def space_for(path: Path) -> Iterator[None]:
    """Turn a full disk while writing ``path`` into ``NoSpace``; other errors pass."""
    try:
        yield
    except OSError as exc:
        if full := disk_full_in(exc):
            raise NoSpace(path, full) from exc
        raise


def give_back(
    job: JobDir,
    store: ClaimStore,
    lease: Lease,
    end: Callable[[str, str], None],
    exc: NoSpace,
    log: Callable[[str], None],
) -> UserError:
    """Give the shard back uncounted: drop the unpublished output, record why (``end``: the attempt's own
    writer, which holds its record's version), release the lease."""
    sid, attempt = lease.shard, lease.attempt
    adir = job.attempt_dir(sid, attempt)
    if _published_attempt(job, sid) != attempt:
        steps = (
            lambda: (adir / AttemptDir.OUTPUT).unlink(missing_ok=True),  # frees the space it took
            lambda: end("no-space", f"no space left on device writing {exc.path}"),
        )
        for step in steps:
            try:
                step()
            except OSError:
                pass
    store.release(lease)
    log(f"{sid} attempt {attempt_name(attempt)}: no space left on device; stopping")
    return no_space_error(
        exc.path,
        exc.error,
        f"running {sid} attempt {attempt_name(attempt)} (the shard is not counted as failed and can be claimed again)",
    )


def _published_attempt(job: JobDir, sid: str) -> int | None:
    """The attempt the shard's done record names, if there is one."""
    try:
        record = load_done(job, sid)
    except IntegrityError:
        return None
    return record.attempt if record else None
