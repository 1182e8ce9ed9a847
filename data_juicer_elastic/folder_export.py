"""Folder export: each shard's verified output published as an ordered part file, no byte copied.

An ``export_path`` without a suffix (``out/result`` or ``out/result/``)
names a folder; ``.jsonl`` names the one merged file (``merge.py``). The
folder gets ``part-00000-of-01024.jsonl`` ... (the shard ids: input order is
file name order), each a hard link to the attempt output its done record
names, so publishing a shard is a link and a rename whatever its size. A
part is put in place under a temp name and renamed, so a name in the folder
is always a whole output. ``_SUCCESS`` (JSON: every part with its shard,
attempt, rows, bytes and sha256) is written last, after the folder is
fsynced: a reader that finds it knows the folder is complete; pyarrow and
Ray skip ``_``-prefixed files, and it has no data suffix for Data-Juicer's
readers to pick up.

What is checked at export: every done record (as the merge does) and each
output's size against its record, by stat; the content was re-read and
hashed by the worker before it published the done record, and
``verify_folder`` (``dj-elastic verify``) re-hashes every part against
``_SUCCESS``. Re-hashing at export would read every byte again, which is
what folder export exists to avoid.

Where a link is impossible (the folder on another file system, a file
system without hard links, a job dir on S3) the part is copied instead, read
through the job's store (``parquet_out.open_checked``) and checked against
its record as the merge checks it. From a job dir on S3 to an s3:// prefix
no byte passes through here: the store copies each part (``s3_export.copy_folder``; a Parquet part of
another schema is rewritten and uploaded, ``copy_parquet_folder``).
A killed export leaves parts and no
``_SUCCESS``: an export into that folder resumes, keeping each part that is
already the shard's output. A complete folder that holds exactly these
outputs is left as it is (nothing rewritten).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from data_juicer_elastic import parquet_out
from data_juicer_elastic.errors import IntegrityError, UserError, output_in_the_way
from data_juicer_elastic.job.records.done import DoneRecord
from data_juicer_elastic.storage.blocks import BLOCK, Digester, FileDigest, blocks, digest_file
from data_juicer_elastic.storage.files import (
    atomic_write,
    dumps_json,
    fsync_dir,
    read_record,
    remove_dead_temps_in,
    temp_name,
    unlink_quietly,
)

if TYPE_CHECKING:
    from data_juicer_elastic.job.layout import JobDir

SUCCESS = "_SUCCESS"
MERGE_JSON = "merge.json"  # what ``dj-elastic verify`` checks an export against, as the problems name it
_SAYS = {"size": "bytes", "etag": "ETag"}  # merge.json's output_stat keys as the problems name them
FORMAT = "data-juicer-elastic folder export"
VERSION = 1
PART_RE = re.compile(r"^part-\d{5,}-of-\d{5,}\.(jsonl|parquet)$")
# link() errors that mean "no hard link here" (another file system, a file system without them): copy instead
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}

Done = tuple[DoneRecord, Path]  # a checked done record and its confined output path


def is_folder_export(output: str | os.PathLike) -> bool:
    """A path ending in a separator, or without a suffix, names a folder of part files."""
    text = os.fspath(output)
    if text.endswith(("/", os.sep)):
        return True
    return not os.path.splitext(os.path.basename(os.path.abspath(text)))[1]


def part_name(shard: str, fmt: str = "jsonl") -> str:
    return f"{shard}.{fmt}"


@dataclass
class FolderExport:
    folder: Path | str  # an s3:// prefix's URL when exported there
    rows: int
    bytes: int
    linked: int  # parts published by a link now
    copied: int  # parts copied now (no hard link possible)
    kept: int  # parts already in place from an earlier (killed) export


def export_folder(
    records: list[Done],
    folder: Path,
    *,
    overwrite: bool,
    log: Callable[[str], Any] = print,
    job: JobDir,
) -> FolderExport:
    """Publish ``records`` into ``folder`` as part files, then ``_SUCCESS``; the outputs are ``job``'s
    (``parquet_out.attempt_file``): linked where its store is a POSIX folder, else copied through it."""
    manifest = manifest_of(records)
    if _prepare_folder(folder, manifest, overwrite):
        return _result(folder, records, kept=len(records))
    remove_dead_temps_in(folder)  # what exports killed on this host left (and stale ones of any host)
    linked = copied = kept = 0
    wanted = {part_name(r.shard) for r, _ in records}
    for record, path in records:
        how = _publish_part(record, path, folder / part_name(record.shard), job)
        linked += how == "linked"
        copied += how == "copied"
        kept += how == "kept"
    for name in os.listdir(folder):  # parts of an earlier export of another shard count
        if PART_RE.match(name) and name not in wanted:
            os.unlink(folder / name)
    fsync_dir(folder)  # every part's name is durable before the manifest says the folder is complete
    atomic_write(folder / SUCCESS, dumps_json(manifest))
    if copied and job.files_are_local:
        log(f"{copied} part(s) were copied: {folder} is not on the job dir's file system (no hard link possible)")
    return _result(folder, records, linked=linked, copied=copied, kept=kept)


def _result(folder: Path, records: list[Done], linked: int = 0, copied: int = 0, kept: int = 0) -> FolderExport:
    rows = sum(r.rows for r, _ in records)
    size = sum(r.bytes for r, _ in records)
    return FolderExport(folder, rows, size, linked, copied, kept)


def shard_entry(r: DoneRecord) -> dict:
    """What merge.json and ``_SUCCESS`` say of each shard output they hold."""
    return {k: getattr(r, k) for k in ("shard", "attempt", "host", "rows", "bytes", "sha256")}


def manifest_of(records: list[Done]) -> dict:
    """``_SUCCESS`` of a folder export of ``records`` (its bytes: ``dumps_json``), wherever the folder is."""
    parts = [{"file": part_name(r.shard), **shard_entry(r)} for r, _ in records]
    return {
        "format": FORMAT,
        "version": VERSION,
        "parts": parts,
        "rows": sum(p["rows"] for p in parts),
        "bytes": sum(p["bytes"] for p in parts),
    }


def _prepare_folder(folder: Path, manifest: dict, overwrite: bool) -> bool:
    """Make ``folder`` ready for the parts; True when it is complete with exactly these parts already."""
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder}: exists and is not a folder; a path without a suffix names a folder of parts")
    folder.mkdir(parents=True, exist_ok=True)
    success = folder / SUCCESS
    if success.exists():
        found = read_record(success)
        if found.get("parts") == manifest["parts"] and _parts_in_place(folder, manifest):
            return True
        if not overwrite:
            raise output_in_the_way(f"{folder}/", "holds a complete export of other outputs")
        os.unlink(success)  # from here on the folder reads as incomplete until the new manifest is written
        fsync_dir(folder)
    foreign = sorted(n for n in os.listdir(folder) if not PART_RE.match(n) and ".tmp-" not in n)
    if foreign:
        raise UserError(
            f"{folder}: holds files that are not part files of an export ({', '.join(foreign[:3])}); "
            "export into an empty or new folder"
        )
    return False


def _parts_in_place(folder: Path, manifest: dict) -> bool:
    """Every part named in the manifest is there with its size (a stat each; content: ``verify_folder``)."""
    for part in manifest["parts"]:
        try:
            if os.stat(folder / part["file"]).st_size != part["bytes"]:
                return False
        except OSError:
            return False
    return True


def _publish_part(record: DoneRecord, path: Path, target: Path, job: JobDir) -> str:
    """Put the shard's output at ``target``: ``linked``, ``copied`` or ``kept`` (already there). An output
    in a store that is no POSIX folder (S3) has no file to stat or link: it is copied, checked as it is read."""
    local = job.files_are_local
    if local and _in_place(record, path, target):
        return "kept"
    tmp = temp_name(target)
    try:
        how = "linked" if local and _linked(path, tmp) else "copied"
        if how == "copied":
            _copy_checked(record, path, tmp, job)
        os.replace(tmp, target)
    finally:
        unlink_quietly(tmp)
    return how


def _in_place(record: DoneRecord, path: Path, target: Path) -> bool:
    """Is the output file at ``path`` already ``target`` (a link an earlier export made)? Its size is checked
    against the record first (a stat: the content was hashed by the worker, and by ``verify_folder``)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise IntegrityError(
            f"shard {record.shard}: {path} cannot be read ({exc.strerror}); restore it or rerun the shard"
        ) from exc
    check_output_size(record, path, st.st_size)
    try:
        return os.path.samefile(path, target)
    except OSError:
        return False


def check_output_size(record: DoneRecord, path: Path, size: int) -> None:
    """An output whose size (a stat, a HEAD) is not its done record's changed after the worker verified it."""
    if size != record.bytes:
        raise IntegrityError(
            f"shard {record.shard}: {path} is {size} bytes, its done record says {record.bytes}; "
            "it changed after the worker verified it: restore it, or archive the record and rerun the shard"
        )


def _linked(path: Path, tmp: Path) -> bool:
    """Hard-link ``path`` at ``tmp``; False where no link is possible (``_NO_LINK``: copy instead)."""
    try:
        os.link(path, tmp)
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
        return False
    return True


def _copy_checked(record: DoneRecord, path: Path, tmp: Path, job: JobDir) -> None:
    """Copy the output at ``path`` (read through ``job``'s store) to ``tmp`` (fsynced), checking rows, bytes
    and sha256 against the record as it goes."""
    d = Digester()
    with job.open_output(record.shard, path) as src, open(tmp, "xb") as dst:
        for block in blocks(src, bytearray(BLOCK)):
            d.update(block)
            dst.write(block)
        dst.flush()
        os.fsync(dst.fileno())
    got = d.result()
    problem = record.describe_mismatch(path, got.rows, got.bytes, got.sha256, got.ends_with_newline)
    if problem:
        raise IntegrityError(problem)


class PartSource(Protocol):
    """Where ``check_export`` reads an export: a local folder (``LocalFolder``) or an s3:// prefix
    (``s3_export.verify_export``)."""

    where: str  # the folder or the URL, as the problems name it

    def success(self) -> bytes | None:
        """``_SUCCESS``'s bytes; None when there is none (OSError or UserError when it cannot be read)."""
        ...

    def names(self) -> Iterable[str]:
        """Every name in the folder (``check_export`` picks the part files)."""
        ...

    def digest(self, name: str) -> FileDigest | str:
        """The part's rows, bytes and sha256 read whole, or a problem line saying why it cannot be read."""
        ...


def check_export(source: PartSource) -> list[str]:
    """Re-read every part of an export against its ``_SUCCESS``; the problems found (none: complete and intact)."""
    where = source.where
    try:
        data = source.success()
        if data is None:
            return [f"{where}: no {SUCCESS}: the export is not complete; run the job (or `dj-elastic merge`) again"]
        manifest = orjson.loads(data)
        parts = manifest["parts"]
        if manifest.get("format") != FORMAT or not isinstance(parts, list):
            raise ValueError("not a folder export manifest")
    except (OSError, UserError, ValueError, KeyError, TypeError) as exc:
        return [f"{where}/{SUCCESS}: unreadable ({exc}); export the job again (`dj-elastic merge --output {where}/`)"]
    problems = []
    for part in parts:
        problems += _check_part(source, part)
    listed = {p.get("file") for p in parts if isinstance(p, dict)}
    extra = sorted(n for n in source.names() if PART_RE.match(n) and n not in listed)
    if extra:
        problems.append(f"{where}: part files not in {SUCCESS}: {', '.join(extra[:5])}; remove them or export again")
    return problems


def check_recorded_folder(source: PartSource, now: dict[str, Any] | None, record: dict[str, Any]) -> list[str]:
    """A folder export against merge.json (``dj-elastic verify``): its ``_SUCCESS`` must be the one the merge
    wrote (``now``, its stamp, against ``output_stat``), else the folder holds another export, however
    self-consistent; then every part against that ``_SUCCESS`` (``check_export``)."""
    diffs = [] if now is None else _stamp_diffs(now, record)  # no _SUCCESS: check_export says so
    if diffs:
        where = record["output"]
        return [
            f"{where}/{SUCCESS}: is not the one {MERGE_JSON} recorded ({'; '.join(diffs)}); the folder holds "
            f"another export now: export the job again (`dj-elastic merge --output {where}/ --overwrite`)"
        ]
    return check_export(source)


def check_recorded_file(
    now: dict[str, Any] | None, record: dict[str, Any], read: Callable[[], FileDigest]
) -> list[str]:
    """A one-file export against merge.json (``dj-elastic verify``): its stamp (``now``) against ``output_stat``,
    and where merge.json holds the whole file's sha256 (JSONL; a Parquet merge records none, its stamp stands
    for it) its rows and sha256, re-read by ``read``."""
    where = record["output"]
    if now is None:
        return [f"{where}: is gone; merge the job again (`dj-elastic merge --output {where}`)"]
    diffs = _stamp_diffs(now, record)
    if isinstance(record.get("sha256"), str):
        try:
            d = read()
        except (OSError, UserError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else str(exc)
            return [f"{where}: cannot be read ({why}); restore it or merge the job again"]
        diffs += mismatches({"rows": d.rows, "sha256": d.sha256}, record, MERGE_JSON)
    if not diffs:
        return []
    return [
        f"{where}: does not match {MERGE_JSON} ({'; '.join(diffs)}); it changed after the merge: merge the job "
        f"again (`dj-elastic merge --output {where} --overwrite`)"
    ]


def _stamp_diffs(now: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """Each way the stamp found now (size and mtime_ns and inode; size and ETag on S3) differs from merge.json's."""
    stat = record.get("output_stat")
    stat = stat if isinstance(stat, dict) else {}
    return mismatches(
        {_SAYS.get(k, k): v for k, v in now.items()}, {_SAYS.get(k, k): stat.get(k) for k in now}, MERGE_JSON
    )


def mismatches(got: dict[str, Any], want: dict[str, Any], says: str) -> list[str]:
    """``key <got>, <says> says <want>`` for each key of ``got`` whose value ``want`` does not hold."""
    return [f"{k} {got[k]}, {says} says {want.get(k)}" for k in got if got[k] != want.get(k)]


def _check_part(source: PartSource, part: Any) -> list[str]:
    if not isinstance(part, dict) or not PART_RE.match(str(part.get("file", ""))):
        return [f"{source.where}/{SUCCESS}: a part entry is malformed ({part!r}); export the job again"]
    d = source.digest(part["file"])
    if isinstance(d, str):
        return [d]
    parquet = part["file"].endswith(".parquet")
    got = {"bytes": d.bytes, "sha256": d.sha256} if parquet else {"rows": d.rows, "bytes": d.bytes, "sha256": d.sha256}
    diffs = mismatches(got, part, SUCCESS)
    if d.bytes and not d.ends_with_newline and not parquet:
        diffs.append("does not end with a newline")
    if not diffs:
        return []
    return [
        f"{source.where}/{part['file']}: does not match {SUCCESS} ({'; '.join(diffs)}); it changed after the "
        "export: export the job again"
    ]


@dataclass
class LocalFolder:
    """A local folder export as ``check_export`` reads it."""

    where: str
    buf: bytearray = field(default_factory=lambda: bytearray(BLOCK))

    def success(self) -> bytes | None:
        try:
            return (Path(self.where) / SUCCESS).read_bytes()
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        return os.listdir(self.where)

    def digest(self, name: str) -> FileDigest | str:
        path = Path(self.where) / name
        try:
            return digest_file(path, self.buf)
        except OSError as exc:
            return f"{path}: cannot be read ({exc.strerror}); export the job again"


def verify_folder(folder: str | os.PathLike) -> list[str]:
    """Re-read every part of an exported folder against ``_SUCCESS``; the problems found (none: complete and intact)."""
    return check_export(LocalFolder(str(folder)))


# --------------------------------------------------------------------------- Parquet parts
Source = tuple[DoneRecord, Path, dict]  # a done record, its attempt's processed.parquet, that file's sidecar


def export_parquet_folder(
    records: list[Done],
    folder: Path,
    *,
    overwrite: bool,
    log: Callable[[str], Any] = print,
    job: JobDir,
) -> FolderExport:
    """Publish each attempt's ``processed.parquet`` (``parquet_out``) as a part, linked where every part
    already has one schema; parts whose schema differs are rewritten with the union. ``_SUCCESS`` last.
    The parts are ``job``'s, read through its store; copied (checked) where it is no POSIX folder."""
    found = parquet_sources(job, records)
    local = job.files_are_local
    for r, path, meta in found if local else ():  # elsewhere the bytes are checked as they are copied
        _check_size(r.shard, path, meta["bytes"])
    success = folder / SUCCESS
    if folder.exists() and success.exists():
        old = read_record(success)
        if same_sources(old, found) and _parts_in_place(folder, old):
            return parquet_result(folder, found, kept=len(found))
    _prepare_folder(folder, {"parts": None}, overwrite)
    remove_dead_temps_in(folder)
    rewrite, schema = parquet_rewrites(job, found)
    parts, linked, copied = [], 0, 0
    for source, again in zip(found, rewrite, strict=True):
        r, path, meta = source
        target = folder / part_name(r.shard, parquet_out.PARQUET)
        tmp = temp_name(target)
        d = None
        try:
            if again:
                d = rewrite_source(job, source, tmp, schema)  # what the worker wrote is rewritten
                copied += 1
            elif local and _linked(path, tmp):
                linked += 1
            else:
                tmp.write_bytes(bytes(parquet_out.read_checked(job, r.shard, path, meta)))
                copied += 1
            os.replace(tmp, target)
        finally:
            unlink_quietly(tmp)
        parts.append(parquet_part(source, d))
    wanted = {p["file"] for p in parts}
    for name in os.listdir(folder):
        if PART_RE.match(name) and name not in wanted:
            os.unlink(folder / name)
    fsync_dir(folder)
    atomic_write(success, dumps_json(parquet_manifest(parts)))
    if copied:
        log(f"{copied} part(s) were written anew (another schema, or no hard link possible)")
    return parquet_result(folder, found, linked=linked, copied=copied)


def parquet_sources(job: JobDir, records: list[Done]) -> list[Source]:
    """Each record's Parquet output and sidecar (``parquet_out.shard_parquet``: rows checked)."""
    return [(r, *parquet_out.shard_parquet(job, r, path)) for r, path in records]


def parquet_rewrites(job: JobDir, found: list[Source]) -> tuple[list[bool], Any]:
    """Which parts are rewritten, and with which schema (``parquet_out.rewrites``: their footers only)."""
    return parquet_out.rewrites(job, [(r.shard, path, meta) for r, path, meta in found])


def rewrite_source(job: JobDir, source: Source, dst: Path, schema: Any) -> FileDigest:
    """The part rewritten with ``schema`` at ``dst`` (its source checked as it is read), and what it holds."""
    r, path, meta = source
    parquet_out.rewrite_part(job, r.shard, path, meta, dst, schema)
    return digest_file(dst)


def same_sources(manifest: dict, found: list[Source]) -> bool:
    """Does a ``_SUCCESS`` list exactly these sources? (A rewritten part's bytes are not its source's.)"""
    return [_source_of(p) for p in manifest.get("parts", [])] == [_source_entry(r, meta) for r, _, meta in found]


def parquet_part(source: Source, rewritten: FileDigest | None) -> dict:
    """``_SUCCESS``'s entry of a part: its source, and its bytes and sha256 (the source's, unless rewritten)."""
    r, _, meta = source
    size, sha = (rewritten.bytes, rewritten.sha256) if rewritten else (meta["bytes"], meta["sha256"])
    return {"file": part_name(r.shard, parquet_out.PARQUET), **_source_entry(r, meta), "bytes": size, "sha256": sha}


def parquet_manifest(parts: list[dict]) -> dict:
    """``_SUCCESS`` of a Parquet folder export (its bytes: ``dumps_json``), wherever the folder is."""
    manifest = {"format": FORMAT, "version": VERSION, "data": parquet_out.PARQUET, "parts": parts}
    return manifest | {"rows": sum(p["rows"] for p in parts), "bytes": sum(p["bytes"] for p in parts)}


def _source_entry(r: DoneRecord, meta: dict) -> dict:
    return {"shard": r.shard, "attempt": r.attempt, "host": r.host, "rows": r.rows, "source_sha256": meta["sha256"]}


def _source_of(part: Any) -> dict:
    keys = ("shard", "attempt", "host", "rows", "source_sha256")
    return {k: part.get(k) for k in keys} if isinstance(part, dict) else {}


def _check_size(shard: str, path: Path, size: int) -> None:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise IntegrityError(f"shard {shard}: {path} cannot be read ({exc.strerror}); rerun the shard") from exc
    check_sidecar_size(shard, path, st.st_size, size)


def check_sidecar_size(shard: str, path: Path, size: int, want: int) -> None:
    """A Parquet output whose size (a stat, a HEAD) is not its sidecar's changed after the worker wrote it."""
    if size != want:
        raise IntegrityError(
            f"shard {shard}: {path} is {size} bytes, its sidecar says {want}; it changed after the worker "
            "wrote it: restore it, or archive the record and rerun the shard"
        )


def parquet_result(
    folder: Path | str, found: list[Source], linked: int = 0, copied: int = 0, kept: int = 0
) -> FolderExport:
    rows = sum(r.rows for r, _, _ in found)
    size = sum(meta["bytes"] for _, _, meta in found)
    return FolderExport(folder, rows, size, linked, copied, kept)
