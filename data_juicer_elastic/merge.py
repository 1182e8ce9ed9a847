"""Verify done records against their outputs, and merge the outputs in input order.

Both are read-only on the job's state. ``verify`` re-reads every done output
and checks rows, bytes and sha256 against its record. ``merge`` does the same
checks while it copies (one read per output, large blocks, the merged file's
hash computed in a second thread), writes into a temp file beside the target,
fsyncs and renames it into place, so a partial merge is never visible at the
output path; then it records what it wrote in ``merge.json``, with the
output's size, mtime and inode, so ``merged_already`` can tell cheaply that a
finished generation needs no second merge.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.job.layout import JobDir, ShardSpec
from data_juicer_elastic.progress import ProgressBar
from data_juicer_elastic.storage.bulk_write import BulkWriter
from data_juicer_elastic.storage.files import (
    atomic_write,
    disk_full_in,
    dumps_json,
    fsync_dir,
    lost_race,
    no_space_error,
    read_json,
    read_record,
    remove_dead_temps,
    temp_name,
)

BLOCK = 16 << 20
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
NOT_DONE = "not done yet"


@dataclass
class ShardCheck:
    shard: str
    ok: bool
    host: str | None = None
    rows: int | None = None
    problem: str | None = None


@dataclass
class VerifyReport:
    shards: list[ShardCheck]
    hosts: dict[str, int]  # host -> done shards
    complete: bool  # every shard has a done record
    ok: bool  # no integrity problem and no terminally failed shard (incomplete alone is ok)
    problems: list[str] = field(default_factory=list)


@dataclass
class MergeResult:
    output: str
    rows: int
    bytes: int
    seconds: float
    shards: int


@dataclass(frozen=True)
class DoneRecord:
    """A done record whose fields have been type-checked and whose output path is confined."""

    shard: str
    attempt: int
    host: str
    rows: int
    bytes: int
    sha256: str
    output: Path

    def describe_mismatch(self, rows: int, size: int, sha: str, ends_with_newline: bool) -> str | None:
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
            f"shard {self.shard}: {self.output} does not match its done record ({'; '.join(diffs)}); "
            f"it changed after the worker verified it: restore it, or archive the record and rerun the shard"
        )


def load_done(job: JobDir, spec: ShardSpec) -> DoneRecord | None:
    """The shard's done record, checked; None when there is none yet. Raises IntegrityError."""
    path = job.done_path(spec.id)
    try:
        raw = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise IntegrityError(
            f"{path}: unreadable done record ({exc}); restore it or archive it and rerun {spec.id}"
        ) from exc
    return _check_record(job, spec, raw, path)


def _check_record(job: JobDir, spec: ShardSpec, raw: Any, path: Path) -> DoneRecord:
    def bad(what: str) -> IntegrityError:
        return IntegrityError(
            f"{path}: {what}; the done record was edited or corrupted: restore it, or archive it and rerun {spec.id}"
        )

    if not isinstance(raw, dict):
        raise bad("not a JSON object")
    if raw.get("shard") != spec.id:
        raise bad(f"shard is {raw.get('shard')!r}, expected {spec.id!r}")
    for key in ("attempt", "rows", "bytes"):
        value = raw.get(key)
        if type(value) is not int or value < (1 if key == "attempt" else 0):
            raise bad(f"{key} is {value!r}, expected a {'positive' if key == 'attempt' else 'non-negative'} integer")
    if not isinstance(raw.get("sha256"), str) or not _SHA256_RE.match(raw["sha256"]):
        raise bad(f"sha256 is {raw.get('sha256')!r}, expected 64 hex digits")
    host = raw.get("host")
    if not isinstance(host, str) or not host:
        raise bad(f"host is {host!r}, expected a host name")
    expected = job.relative(job.attempt_output(spec.id, raw["attempt"]))
    output = raw.get("output")
    if output != expected:
        job.confine(output, f"done record {path.name} output")  # outside the job dir: say so first
        raise bad(f"output is {output!r}, expected {expected!r}")
    return DoneRecord(
        spec.id, raw["attempt"], host, raw["rows"], raw["bytes"], raw["sha256"], job.confine(output, "output")
    )


# verify -----------------------------------------------------------------------
def verify(job: JobDir, *, expect_nodes: int | None = None, check_content: bool = True) -> VerifyReport:
    """Check every done record (and, with ``check_content``, its output's rows, bytes and sha256)."""
    manifest = job.manifest()
    checks: list[ShardCheck] = []
    hosts: dict[str, int] = {}
    problems: list[str] = []
    buf = bytearray(BLOCK) if check_content else None
    complete = True
    for spec in manifest.shards:
        check, has_record = _verify_shard(job, spec, buf)
        checks.append(check)
        complete &= has_record
        if check.problem and check.problem != NOT_DONE:
            problems.append(check.problem)
        if check.host is not None and check.ok:
            hosts[check.host] = hosts.get(check.host, 0) + 1
    if complete and expect_nodes is not None and len(hosts) < expect_nodes:
        problems.append(f"only {len(hosts)} host(s) completed shards, {expect_nodes} expected")
    return VerifyReport(checks, hosts, complete, not problems, problems)


def _verify_shard(job: JobDir, spec: ShardSpec, buf: bytearray | None) -> tuple[ShardCheck, bool]:
    """The shard's check, and whether it has a done record at all."""
    try:
        record = load_done(job, spec)
    except IntegrityError as exc:
        return ShardCheck(spec.id, False, problem=str(exc)), True
    if record is None:
        failed = job.failed_path(spec.id)
        if failed.exists():
            problem = f"shard {spec.id} failed terminally (see {failed}); `dj-elastic retry {spec.id}` requeues it"
            return ShardCheck(spec.id, False, problem=problem), False
        return ShardCheck(spec.id, False, problem=NOT_DONE), False
    if buf is not None:
        try:
            rows, size, sha, nl = _digest(record.output, buf)
        except OSError as exc:
            problem = f"shard {spec.id}: {record.output} cannot be read ({exc.strerror}); restore it or rerun the shard"
            return ShardCheck(spec.id, False, record.host, record.rows, problem), True
        problem = record.describe_mismatch(rows, size, sha, nl)
        if problem:
            return ShardCheck(spec.id, False, record.host, record.rows, problem), True
    return ShardCheck(spec.id, True, record.host, record.rows), True


def _digest(path: Path, buf: bytearray) -> tuple[int, int, str, bool]:
    """(rows, bytes, sha256, ends with a newline or is empty) of a file, in large blocks."""
    digest, rows, size, last = hashlib.sha256(), 0, 0, 10
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            digest.update(view[:n])
            rows += buf.count(b"\n", 0, n)
            size += n
            last = buf[n - 1]
    return rows, size, digest.hexdigest(), last == 10


# merge ------------------------------------------------------------------------
def merge(
    job: JobDir,
    output: str,
    *,
    overwrite: bool = False,
    log: Callable[[str], Any] = print,
    progress: bool | None = None,
) -> MergeResult:
    """Concatenate the verified outputs in manifest order into ``output``, atomically."""
    started, started_at = time.monotonic(), time.time()
    out = Path(os.path.abspath(output))
    _check_target(out, overwrite)
    records = _all_done(job)
    out.parent.mkdir(parents=True, exist_ok=True)
    total = sum(r.bytes for r in records)
    bar = ProgressBar(total, "merge", progress)
    remove_dead_temps(out)  # what merges killed on this host left behind
    try:
        rows, size, sha = _write_merged(records, out, overwrite, bar)
    except OSError as exc:
        if full := disk_full_in(exc):
            raise no_space_error(out, full, "writing the merged output (nothing was put in place)") from exc
        raise
    finally:
        bar.close()
    seconds = time.monotonic() - started
    try:
        _record(job, out, records, rows, size, sha, started_at, seconds)
    except OSError as exc:
        if full := disk_full_in(exc):
            raise no_space_error(
                job.merge_record_path, full, f"recording the merge (the output {out} is complete)"
            ) from exc
        raise
    mb = size / 1e6
    log(
        f"merged {len(records)} shards, {rows:,} rows, {mb:,.1f} MB in {seconds:.2f} s "
        f"({mb / max(seconds, 1e-9):,.1f} MB/s) into {out}"
    )
    return MergeResult(str(out), rows, size, seconds, len(records))


def merged_already(job: JobDir, output: str) -> dict | None:
    """The merge record when it holds exactly the current done records and ``output`` is still the file it wrote.

    Cheap: done records are read, outputs are not; the output is compared by
    size, mtime and inode (a rewrite or a replacement changes them).
    """
    record = read_record(job.merge_record_path)
    out = os.path.abspath(output)
    stat = record.get("output_stat")
    if record.get("output") != out or not isinstance(stat, dict) or not isinstance(record.get("shards"), list):
        return None
    try:
        st = os.stat(out)
    except OSError:
        return None
    if (st.st_size, st.st_mtime_ns, st.st_ino) != (stat.get("size"), stat.get("mtime_ns"), stat.get("ino")):
        return None
    merged = [(s.get("shard"), s.get("attempt"), s.get("sha256")) for s in record["shards"] if isinstance(s, dict)]
    current = []
    for spec in job.manifest().shards:
        done = read_record(job.done_path(spec.id))
        current.append((spec.id, done.get("attempt"), done.get("sha256")))
    return record if merged == current else None


def _check_target(out: Path, overwrite: bool) -> None:
    if out.is_dir():
        raise UserError(f"{out}: is a directory; give a file path for the merged output")
    if os.path.lexists(out) and not overwrite:
        raise UserError(
            f"{out}: already exists; pass --overwrite (or overwrite_output) to replace it, or choose another path"
        )


def _all_done(job: JobDir) -> list[DoneRecord]:
    specs = job.manifest().shards
    records, missing = [], []
    for spec in specs:
        record = load_done(job, spec)
        if record is None:
            missing.append(spec.id)
        else:
            records.append(record)
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise IntegrityError(
            f"{job.root}: {len(missing)} of {len(specs)} shards are not done ({shown}); "
            "run workers until `dj-elastic status` shows every shard done, then merge"
        )
    return records


def _write_merged(records: list[DoneRecord], out: Path, overwrite: bool, bar: ProgressBar) -> tuple[int, int, str]:
    tmp = temp_name(out)
    try:
        with BulkWriter(tmp) as writer:  # fsyncs on a clean close
            rows, size, sha = _copy_all(records, writer, bar)
        _put_in_place(tmp, out, overwrite)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    fsync_dir(out.parent)
    return rows, size, sha


def _put_in_place(tmp: Path, out: Path, overwrite: bool) -> None:
    if overwrite:
        os.replace(tmp, out)
        return
    try:
        os.link(tmp, out)  # never replaces a file that appeared meanwhile
    except OSError as exc:
        if not lost_race(exc, out):
            raise
        raise UserError(f"{out}: already exists; pass --overwrite (or overwrite_output) to replace it") from exc


def _copy_all(records: list[DoneRecord], writer: BulkWriter, bar: ProgressBar) -> tuple[int, int, str]:
    """Copy each output once, checking it against its record; hash the merged bytes in a thread."""
    merged = hashlib.sha256()
    buf = bytearray(BLOCK)
    rows = size = 0
    with ThreadPoolExecutor(1, thread_name_prefix="dje-merge-hash") as hasher:
        for record in records:
            r, s = _copy_one(record, writer, buf, merged, hasher, lambda n: bar.update(size + n))  # noqa: B023 (called before the loop moves on)
            rows += r
            size += s
    return rows, size, merged.hexdigest()


def _copy_one(
    record: DoneRecord,
    writer: BulkWriter,
    buf: bytearray,
    merged: Any,
    hasher: ThreadPoolExecutor,
    tick: Callable[[int], None],
) -> tuple[int, int]:
    digest, rows, size, last = hashlib.sha256(), 0, 0, 10
    view = memoryview(buf)
    try:
        f = open(record.output, "rb", buffering=0)
    except OSError as exc:
        raise IntegrityError(
            f"shard {record.shard}: {record.output} cannot be read ({exc.strerror}); restore it or rerun the shard"
        ) from exc
    with f:
        while n := f.readinto(buf):
            block = view[:n]
            pending: Future = hasher.submit(merged.update, block)
            digest.update(block)
            rows += buf.count(b"\n", 0, n)
            last = buf[n - 1]
            writer.write(block)
            pending.result()  # the buffer is reused next round
            size += n
            tick(size)
    problem = record.describe_mismatch(rows, size, digest.hexdigest(), last == 10)
    if problem:
        raise IntegrityError(problem)
    return rows, size


def _stat_of(path: Path) -> dict[str, int]:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def _record(
    job: JobDir, out: Path, records: list[DoneRecord], rows: int, size: int, sha: str, started_at: float, seconds: float
) -> None:
    atomic_write(
        job.merge_record_path,
        dumps_json(
            {
                "output": str(out),
                "rows": rows,
                "bytes": size,
                "sha256": sha,
                "output_stat": _stat_of(out),
                "shards": [
                    {
                        "shard": r.shard,
                        "attempt": r.attempt,
                        "host": r.host,
                        "rows": r.rows,
                        "bytes": r.bytes,
                        "sha256": r.sha256,
                    }
                    for r in records
                ],
                "started_at": started_at,
                "finished_at": time.time(),
                "seconds": seconds,
            }
        ),
    )
