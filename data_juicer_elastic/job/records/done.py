"""The done record, ``state/done/<shard>.json``: a shard's verified output, first publication wins.

Written once by the worker after it re-read the output (``publish_done``);
read, with every field checked, by merge, verify, status and coordination
(``load_done``). Both go through the job's Store (``JobDir.store``, key
``done_key``): on POSIX a create is ``publish_once`` (temp + link) and a read
opens without following a link, so a planted link reads as no record. Its
``output`` is a path relative to the job directory; it is confined (no
escape by ``..`` or links) when opened (``output_path``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.job.attempt_files import AttemptDir
from data_juicer_elastic.job.layout import JobDir, attempt_name
from data_juicer_elastic.job.records._read import MISSING, int_or, load_key, number_or_none
from data_juicer_elastic.storage.files import dumps_json

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class DoneRecord:
    shard: str
    attempt: int
    host: str
    rows: int
    bytes: int
    sha256: str
    output: str  # generations/<gen>/attempts/<shard>/<attempt>/processed.jsonl, relative to the job dir
    pid: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    backup: bool = False  # the winning attempt was a backup (speculation)
    rows_in: int | None = None  # from the runner's ops.json, when it left one
    error_rows: int = 0  # rows the ops removed by raising (skip_op_error), from ops.json
    worker: str = ""  # the worker record (``state/workers``) of the process that published it; "" before those

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def output_path(self, job: JobDir) -> Path:
        """The output file, confined to the job directory (raises IntegrityError otherwise)."""
        return job.confine(self.output, "output")

    def describe_mismatch(self, path: Path, rows: int, size: int, sha: str, ends_with_newline: bool) -> str | None:
        """Why the output at ``path`` is not what this record says; None when it is."""
        diffs = []
        if not ends_with_newline:
            diffs.append("does not end with a newline")
        if rows != self.rows:
            diffs.append(f"{rows} rows, record says {self.rows}")
        if size != self.bytes:
            diffs.append(f"{size} bytes, record says {self.bytes}")
        if sha != self.sha256:
            diffs.append(f"sha256 {sha[:12]}…, record says {self.sha256[:12]}…")
        if not diffs:
            return None
        return (
            f"shard {self.shard}: {path} does not match its done record ({'; '.join(diffs)}); "
            f"it changed after the worker verified it: restore it, or archive the record and rerun the shard"
        )


def expected_output(job: JobDir, shard: str, attempt: int) -> str:
    """Where the attempt's output is, relative to the job dir (inside its generation's folder)."""
    return job.relative(job.attempt_output(shard, attempt))


def publish_done(job: JobDir, record: DoneRecord, deadline: float | None = None) -> bool:
    """Publish the shard's done record unless one is there already; True if this call did.

    Create-once on the store: a record already holding these very bytes counts as this call's (an NFS
    LINK retransmitted after it landed, an S3 PUT resent), which the worker's unique fields make ours alone.
    ``deadline`` (``lapse_clock``): no request is sent that could land after it (``Store.create``).
    """
    data = dumps_json(record.to_dict())
    return job.store.create(job.done_key(record.shard), data, deadline=deadline) is not None


def is_done(job: JobDir, shard: str) -> bool:
    """Has the shard a done record? One ``head`` (an lstat on POSIX; a planted link takes the name too)."""
    return job.store.head(job.done_key(shard)) is not None


def load_done(job: JobDir, shard: str) -> DoneRecord | None:
    """The shard's done record, checked; None when there is none yet. Raises IntegrityError."""
    try:
        raw = load_key(job.store, job.done_key(shard))
    except (OSError, ValueError) as exc:
        raise IntegrityError(
            f"{job.done_path(shard)}: unreadable done record ({exc}); restore it or archive it and rerun {shard}"
        ) from exc
    return None if raw is MISSING else _checked(job, shard, raw, job.done_path(shard))


def load_done_many(job: JobDir, shards: Iterable[str]) -> dict[str, DoneRecord | IntegrityError]:
    """Many done records at once (status, report): each shard's checked record, or why it was refused.

    The same checks as ``load_done``, with the keys and paths built once as
    strings: on 100,000 shards the per-record path objects cost more than the
    reads. A shard without a record is left out.
    """
    store, folder = job.store, job.key(job.done_dir)
    done_dir = f"{job.done_dir}{os.sep}"
    attempts = f"{job.relative(job.attempts_dir)}{os.sep}"
    found: dict[str, DoneRecord | IntegrityError] = {}
    for shard in shards:
        path = f"{done_dir}{shard}.json"  # for messages only
        try:
            raw = load_key(store, f"{folder}/{shard}.json")
            if raw is MISSING:
                continue
        except (OSError, ValueError) as exc:
            found[shard] = IntegrityError(
                f"{path}: unreadable done record ({exc}); restore it or archive it and rerun {shard}"
            )
            continue
        attempt = raw.get("attempt") if isinstance(raw, dict) else None
        expected = (
            f"{attempts}{shard}{os.sep}{attempt_name(attempt)}{os.sep}{AttemptDir.OUTPUT}"
            if type(attempt) is int
            else ""
        )
        try:
            found[shard] = _checked(job, shard, raw, path, expected)
        except IntegrityError as exc:
            found[shard] = exc
    return found


def _checked(job: JobDir, shard: str, raw: Any, path: Path | str, expected: str | None = None) -> DoneRecord:
    def bad(what: str) -> IntegrityError:
        return IntegrityError(
            f"{path}: {what}; the done record was edited or corrupted: restore it, or archive it and rerun {shard}"
        )

    if not isinstance(raw, dict):
        raise bad("not a JSON object")
    if raw.get("shard") != shard:
        raise bad(f"shard is {raw.get('shard')!r}, expected {shard!r}")
    for key in ("attempt", "rows", "bytes"):
        value = raw.get(key)
        if type(value) is not int or value < (1 if key == "attempt" else 0):
            raise bad(f"{key} is {value!r}, expected a {'positive' if key == 'attempt' else 'non-negative'} integer")
    if not isinstance(raw.get("sha256"), str) or not _SHA256_RE.match(raw["sha256"]):
        raise bad(f"sha256 is {raw.get('sha256')!r}, expected 64 hex digits")
    host = raw.get("host")
    if not isinstance(host, str) or not host:
        raise bad(f"host is {host!r}, expected a host name")
    output = raw.get("output")
    expected = expected or expected_output(job, shard, raw["attempt"])
    if output != expected:
        job.confine(output, f"done record {os.path.basename(path)} output")  # outside the job dir: say so first
        raise bad(f"output is {output!r}, expected {expected!r}")
    return DoneRecord(
        shard,
        raw["attempt"],
        host,
        raw["rows"],
        raw["bytes"],
        raw["sha256"],
        output,
        int_or(raw.get("pid")),
        number_or_none(raw.get("started_at")),
        number_or_none(raw.get("finished_at")),
        raw.get("backup") is True,
        raw["rows_in"] if type(raw.get("rows_in")) is int else None,
        int_or(raw.get("error_rows")),
        raw["worker"] if isinstance(raw.get("worker"), str) else "",
    )
