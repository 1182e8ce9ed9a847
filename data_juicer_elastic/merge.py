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
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_juicer_elastic import parquet_out, s3_export
from data_juicer_elastic.errors import IntegrityError, UserError, output_in_the_way
from data_juicer_elastic.export_target import may_replace, record_intent, stamped, stat_of
from data_juicer_elastic.folder_export import (
    SUCCESS,
    Done,
    LocalFolder,
    check_recorded_file,
    check_recorded_folder,
    export_folder,
    export_parquet_folder,
    is_folder_export,
    shard_entry,
)
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import ShardSpec
from data_juicer_elastic.job.records._read import load_record
from data_juicer_elastic.job.records.done import DoneRecord, load_done, load_done_many
from data_juicer_elastic.job.records.failed import is_failed
from data_juicer_elastic.progress import ProgressBar
from data_juicer_elastic.storage.blocks import BLOCK, Digester, blocks, digest_file
from data_juicer_elastic.storage.bulk_write import BulkWriter
from data_juicer_elastic.storage.files import (
    disk_full_in,
    dumps_json,
    fsync_dir,
    lost_race,
    no_space_error,
    remove_dead_temps,
    remove_dead_temps_in,
    temp_name,
    unlink_quietly,
)

NOT_DONE = "not done yet"
JSONL, PARQUET = parquet_out.JSONL, parquet_out.PARQUET


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
    exported = load_record(job.store, job.key(job.merge_record_path))
    if check_content and isinstance(exported.get("output"), str):
        problems += _verify_export(exported)
    return VerifyReport(checks, hosts, complete, not problems, problems)


def _verify_export(record: dict) -> list[str]:
    """The export merge.json names, checked against what it recorded (``folder_export.check_recorded_*``):
    on S3 by ``s3_export``; here its stamp is the stat ``merged_already`` compares, its bytes read from disk."""
    out = record["output"]
    if s3_export.is_s3(out):
        return s3_export.verify_export(record)
    folder = record.get("kind") == "folder"
    try:
        now: dict | None = stat_of(stamped(out, folder))
    except FileNotFoundError:
        now = None
    except OSError as exc:
        return [f"{stamped(out, folder)}: cannot be read ({exc.strerror}); restore it or merge the job again"]
    if folder:
        return check_recorded_folder(LocalFolder(out), now, record)
    return check_recorded_file(now, record, lambda: digest_file(out))


def _verify_shard(job: JobDir, spec: ShardSpec, buf: bytearray | None) -> tuple[ShardCheck, bool]:
    """The shard's check, and whether it has a done record at all."""
    try:
        record = load_done(job, spec.id)
        output = record.output_path(job) if record else None
    except IntegrityError as exc:
        return ShardCheck(spec.id, False, problem=str(exc)), True
    if record is None or output is None:
        if is_failed(job, spec.id):
            failed = job.failed_path(spec.id)
            problem = f"shard {spec.id} failed terminally (see {failed}); `dj-elastic retry {spec.id}` requeues it"
            return ShardCheck(spec.id, False, problem=problem), False
        return ShardCheck(spec.id, False, problem=NOT_DONE), False
    if buf is not None:
        try:
            with job.open_output(spec.id, output) as stream:
                d = digest_file(stream, buf)
        except IntegrityError as exc:  # missing, or unreadable when opened
            return ShardCheck(spec.id, False, record.host, record.rows, str(exc)), True
        except job.store.errors as exc:  # failed while read (EIO, a dropped connection)
            problem = f"shard {spec.id}: {output} cannot be read ({exc}); restore it or rerun the shard"
            return ShardCheck(spec.id, False, record.host, record.rows, problem), True
        problem = record.describe_mismatch(output, d.rows, d.bytes, d.sha256, d.ends_with_newline)
        if problem:
            return ShardCheck(spec.id, False, record.host, record.rows, problem), True
    return ShardCheck(spec.id, True, record.host, record.rows), True


# merge ------------------------------------------------------------------------
def merge(
    job: JobDir,
    output: str,
    *,
    overwrite: bool = False,
    log: Callable[[str], Any] = print,
    progress: bool | None = None,
) -> MergeResult:
    """Concatenate the verified outputs in manifest order into ``output``, atomically.

    An ``output`` without a suffix (or ending in a separator) is a folder: the outputs are published
    there as part files instead, no byte copied (``folder_export``). A ``.parquet`` file (or a folder of a
    recipe with ``export_type: parquet``) is written from the attempts' Parquet outputs (``parquet_out``).
    """
    fmt = output_format(job, output)
    overwrite = may_replace(job, s3_export.location(output), is_folder_export(output), overwrite, log)
    if is_folder_export(output):
        return _export(job, output, overwrite, log, fmt)
    if s3_export.is_s3(output):
        return _merge_to_s3(job, output, overwrite, log, fmt, progress)
    started, started_at = time.monotonic(), time.time()
    out = Path(os.path.abspath(output))
    _check_target(out, overwrite)
    records = _all_done(job)
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = [(r.shard, *parquet_out.shard_parquet(job, r, path)) for r, path in records] if fmt == PARQUET else []
    total = sum(m["bytes"] for _, _, m in parts) if parts else sum(r.bytes for r, _ in records)
    bar = ProgressBar(total, "merge", progress)
    remove_dead_temps(out)  # what killed merges left behind (this host's dead pids; others' after an hour)
    try:
        if fmt == PARQUET:
            rows, size, sha = _write_parquet(job, parts, out, overwrite, bar)
        else:
            rows, size, sha = _write_merged(job, records, out, overwrite, bar)
    except OSError as exc:
        if full := disk_full_in(exc):
            raise no_space_error(out, full, "writing the merged output (nothing was put in place)") from exc
        raise
    finally:
        bar.close()
    seconds = time.monotonic() - started
    try:
        _record(job, out, records, rows, size, sha, started_at, seconds, fmt=fmt)
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


def _merge_to_s3(
    job: JobDir, output: str, overwrite: bool, log: Callable[[str], Any], fmt: str, progress: bool | None
) -> MergeResult:
    """One object at an s3:// URL (``s3_export``): JSONL streamed into one multipart upload as it is checked;
    Parquet written locally (``s3_export.scratch``), then uploaded as one multipart upload. merge.json names
    URL, size, ETag."""
    started, started_at = time.monotonic(), time.time()
    url = s3_export.location(output)
    if fmt == PARQUET:  # its file is written before the upload that would refuse it
        s3_export.refuse_existing(url, overwrite)
    records = _all_done(job)
    parts = [(r.shard, *parquet_out.shard_parquet(job, r, path)) for r, path in records] if fmt == PARQUET else []
    total = sum(m["bytes"] for _, _, m in parts) if parts else sum(r.bytes for r, _ in records)
    bar = ProgressBar(total, "merge", progress)
    try:
        if fmt == PARQUET:
            with s3_export.scratch(job) as folder:
                tmp = temp_name(folder / "merged.parquet")
                try:
                    rows = parquet_out.write_merged(job, parts, tmp, lambda n: bar.update(n))[0]
                    stamp = s3_export.upload_local(tmp, url, overwrite)
                finally:
                    unlink_quietly(tmp)
            sha = None
        else:
            with s3_export.open_upload(url, overwrite, total) as upload:
                rows, _, sha = _copy_all(job, records, upload, bar)
                stamp = s3_export.complete(upload, url)
    finally:
        bar.close()
    seconds = time.monotonic() - started
    _record(job, url, records, rows, stamp.size, sha, started_at, seconds, fmt=fmt, stamp=stamp)
    mb = stamp.size / 1e6
    log(
        f"merged {len(records)} shards, {rows:,} rows, {mb:,.1f} MB in {seconds:.2f} s "
        f"({mb / max(seconds, 1e-9):,.1f} MB/s) into {url}"
    )
    return MergeResult(url, rows, stamp.size, seconds, len(records))


def _export(job: JobDir, output: str, overwrite: bool, log: Callable[[str], Any], fmt: str) -> MergeResult:
    """The folder export: part files linked from the attempt outputs, ``_SUCCESS`` last, then merge.json.
    To an s3:// prefix: ``s3_export.export_to_prefix`` (staged and uploaded, or copied by the store)."""
    started, started_at = time.monotonic(), time.time()
    remote = s3_export.is_s3(output)
    folder = s3_export.location(output)
    records = _all_done(job)
    try:
        exporter = export_parquet_folder if fmt == PARQUET else export_folder
        if remote:
            done, stamp = s3_export.export_to_prefix(job, records, exporter, folder, overwrite, log)
        else:
            done, stamp = exporter(records, Path(folder), overwrite=overwrite, log=log, job=job), None
        seconds = time.monotonic() - started
        _record(
            job, folder, records, done.rows, done.bytes, None, started_at, seconds, kind="folder", fmt=fmt, stamp=stamp
        )
    except OSError as exc:
        if full := disk_full_in(exc):
            doing = f"exporting part files (the export is complete once {SUCCESS} is there)"
            raise no_space_error(folder, full, doing) from exc
        raise
    mb = done.bytes / 1e6
    log(
        f"exported {len(records)} shards, {done.rows:,} rows, {mb:,.1f} MB as part files into {folder}/ "
        f"in {seconds:.2f} s ({done.linked} linked, {done.kept} already there, {done.copied} copied)"
    )
    return MergeResult(str(folder), done.rows, done.bytes, seconds, len(records))


def merged_already(job: JobDir, output: str) -> dict | None:
    """The merge record when it holds exactly the current done records and ``output`` is still what it wrote.

    Cheap: done records are read, outputs are not; the output (a folder export's
    ``_SUCCESS``) is compared by size, mtime and inode (a rewrite or a
    replacement changes them). What killed merges left beside it is cleared.
    """
    record = load_record(job.store, job.key(job.merge_record_path))
    out = s3_export.location(output)
    stat = record.get("output_stat")
    if record.get("output") != out or not isinstance(stat, dict) or not isinstance(record.get("shards"), list):
        return None
    folder = record.get("kind") == "folder"
    if folder != is_folder_export(output) or record.get("format", JSONL) != output_format(job, output):
        return None
    if s3_export.is_s3(out):
        st = s3_export.stamp_of(out, folder)
        if st is None:
            return None
    else:
        try:
            st = stat_of(stamped(out, folder))
        except OSError:
            return None
        if folder:
            remove_dead_temps_in(out)
        else:
            remove_dead_temps(out)
    if st != {k: stat.get(k) for k in st}:
        return None
    merged = [(s.get("shard"), s.get("attempt"), s.get("sha256")) for s in record["shards"] if isinstance(s, dict)]
    shards = job.manifest().shards.ids()
    done = load_done_many(job, shards)
    current = [_merged_key(sid, done.get(sid)) for sid in shards]
    return record if merged == current else None


def output_format(job: JobDir, output: str) -> str:
    """``parquet`` or ``jsonl``: what ``output`` gets (a folder: what the generation's recipe exports)."""
    return parquet_out.output_format(output, job if is_folder_export(output) else None)


def _write_parquet(job: JobDir, parts: list, out: Path, overwrite: bool, bar: ProgressBar) -> tuple[int, int, None]:
    """The attempts' Parquet outputs, each checked as it is read, into one Parquet file put in place once."""
    tmp = temp_name(out)
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        bar.update(done)

    try:
        rows, size = parquet_out.write_merged(job, parts, tmp, tick)
        _put_in_place(job, tmp, out, overwrite)
    finally:
        unlink_quietly(tmp)
    fsync_dir(out.parent)
    return rows, size, None


def _merged_key(sid: str, record: DoneRecord | IntegrityError | None) -> tuple:
    """What merge.json remembers of a shard: its attempt and sha256 (None for a missing or refused record)."""
    return (sid, record.attempt, record.sha256) if isinstance(record, DoneRecord) else (sid, None, None)


def _check_target(out: Path, overwrite: bool) -> None:
    if out.is_dir():
        raise UserError(f"{out}: is a directory; give a file path for the merged output")
    if os.path.lexists(out) and not overwrite:
        raise output_in_the_way(out)


def _all_done(job: JobDir) -> list[Done]:
    records: list[Done] = []
    missing = []
    for sid in job.manifest().shards.ids():
        record = load_done(job, sid)
        if record is None:
            missing.append(sid)
        else:
            records.append((record, record.output_path(job)))
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise IntegrityError(
            f"{job.root}: {len(missing)} of {len(job.manifest().shards)} shards are not done ({shown}); "
            "run workers until `dj-elastic status` shows every shard done, then merge"
        )
    return records


def _write_merged(
    job: JobDir, records: list[Done], out: Path, overwrite: bool, bar: ProgressBar
) -> tuple[int, int, str]:
    tmp = temp_name(out)
    try:
        with BulkWriter(tmp) as writer:  # fsyncs on a clean close
            rows, size, sha = _copy_all(job, records, writer, bar)
        _put_in_place(job, tmp, out, overwrite)
    finally:
        unlink_quietly(tmp)
    fsync_dir(out.parent)
    return rows, size, sha


def _put_in_place(job: JobDir, tmp: Path, out: Path, overwrite: bool) -> None:
    record_intent(job, out, tmp)  # a kill before merge.json leaves an output still known as ours
    if overwrite:
        os.replace(tmp, out)
        return
    try:
        os.link(tmp, out)  # never replaces a file that appeared meanwhile
    except OSError as exc:
        if not lost_race(exc, out):
            raise
        raise output_in_the_way(out, "appeared during this merge") from exc


def _copy_all(job: JobDir, records: list[Done], writer: BulkWriter, bar: ProgressBar) -> tuple[int, int, str]:
    """Copy each output once, checking it against its record; hash the merged bytes in a thread."""
    merged = hashlib.sha256()
    buf = bytearray(BLOCK)
    rows = size = 0
    with ThreadPoolExecutor(1, thread_name_prefix="dje-merge-hash") as hasher:
        for done in records:
            r, s = _copy_one(job, done, writer, buf, merged, hasher, lambda n: bar.update(size + n))  # noqa: B023 (called before the loop moves on)
            rows += r
            size += s
    return rows, size, merged.hexdigest()


def _copy_one(
    job: JobDir,
    done: Done,
    writer: BulkWriter,
    buf: bytearray,
    merged: Any,
    hasher: ThreadPoolExecutor,
    tick: Callable[[int], None],
) -> tuple[int, int]:
    record, path = done
    d = Digester()
    with job.open_output(record.shard, path) as f:
        for block in blocks(f, buf):
            pending: Future = hasher.submit(merged.update, block)
            d.update(block)
            writer.write(block)
            pending.result()  # the buffer is reused next round
            tick(d.bytes)
    got = d.result()
    problem = record.describe_mismatch(path, got.rows, got.bytes, got.sha256, got.ends_with_newline)
    if problem:
        raise IntegrityError(problem)
    return got.rows, got.bytes


def _record(
    job: JobDir,
    out: Path | str,
    records: list[Done],
    rows: int,
    size: int,
    sha: str | None,
    started_at: float,
    seconds: float,
    kind: str = "file",
    fmt: str = JSONL,
    stamp: s3_export.Stamp | None = None,
) -> None:
    """merge.json: what was written (a folder export, a Parquet file: no whole-output sha256; a folder's
    ``_SUCCESS`` lists each part's); ``format``: jsonl or parquet, so a rerun asking for the other is no match.
    An s3:// output is stamped by its size and ETag (a folder's: its ``_SUCCESS``'s), its VersionId beside."""
    remote = {} if stamp is None else {"etag": stamp.etag, "version_id": stamp.version_id}
    job.store.replace(
        job.key(job.merge_record_path),
        dumps_json(
            {
                "output": str(out),
                "kind": kind,
                "format": fmt,
                "rows": rows,
                "bytes": size,
                "sha256": sha,
                "output_stat": stamp.record() if stamp else stat_of(stamped(out, kind == "folder")),
                **remote,
                "shards": [shard_entry(r) for r, _ in records],
                "started_at": started_at,
                "finished_at": time.time(),
                "seconds": seconds,
            }
        ),
    )
