"""Input discovery for prepare: which files, in which order, and did they change.

A dataset is one JSONL or Parquet file, or a directory scanned recursively
for ``*.jsonl``, ``*.jsonl.gz``, ``*.jsonl.zst`` and ``*.parquet``, ordered by
relative path (plain string sort of the posix path). One job reads one input
format: a folder holding both JSONL and Parquet files is refused. Compressed files are decompressed into
the staging folder once, so every later step reads plain bytes with seeks;
byte ranges in the manifest then refer to the decompressed stream.

An ``s3://bucket/key`` dataset (one object, or the objects under a prefix,
by the same names and rules) is discovered here too; its objects are
fingerprinted by size and ETag. Plain JSONL and Parquet objects are read in
place by ranged GETs (prepare.source); a compressed object is streamed through
its decompressor into the staging folder, as a local compressed file is.
"""

from __future__ import annotations

import errno
import gzip
import os
import posixpath
import stat
import zlib
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, BinaryIO

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.prepare.source import open_input, s3_objects, split_s3_url
from data_juicer_elastic.storage.blocks import blocks
from data_juicer_elastic.storage.urls import SCHEME, is_s3

if TYPE_CHECKING:
    from data_juicer_elastic.storage.s3_objects import ObjectInfo

SUFFIXES = {".jsonl": None, ".jsonl.gz": "gz", ".jsonl.zst": "zst", ".parquet": "parquet"}
PARQUET = "parquet"  # the codec of a Parquet input: read in place by prepare.parquet, never materialised
STAGING_MARK = ".dje-staging-"


@dataclass(frozen=True)
class Fingerprint:
    """What a cheap check compares: enough to notice an edit without hashing."""

    size: int
    mtime_ns: int
    ino: int
    dev: int
    etag: str | None = None  # an s3:// input's (its mtime_ns, ino and dev are 0)

    @classmethod
    def of(cls, path: str) -> Fingerprint:
        st = os.stat(path)
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


@dataclass(frozen=True)
class InputSpec:
    """One input file as discovered (before reading it)."""

    rel: str  # name in the manifest: posix path relative to the root (file input: the file name)
    path: str  # absolute path of the file as found
    codec: str | None  # None, "gz", "zst" or "parquet"
    media_base: str  # folder relative media paths resolve against
    seen: Fingerprint

    @property
    def parquet(self) -> bool:
        return self.codec == PARQUET


@dataclass(frozen=True)
class Dataset:
    root: str  # absolute dataset path as given (file or directory)
    kind: str  # "file" or "dir"
    inputs: tuple[InputSpec, ...]
    skipped: tuple[str, ...] = ()  # files of a folder input that are not JSONL (relative paths)

    @property
    def parquet(self) -> bool:
        """A Parquet dataset (discover refuses a mix, so the first input tells)."""
        return bool(self.inputs) and self.inputs[0].parquet

    def skipped_note(self, limit: int = 10) -> str | None:
        """A log line naming the files a folder input left out, so none is dropped silently."""
        if not self.skipped:
            return None
        more = f", ... ({len(self.skipped) - limit} more)" if len(self.skipped) > limit else ""
        names = "*.parquet" if self.parquet else "*.jsonl, *.jsonl.gz or *.jsonl.zst"
        return (
            f"{self.root}: skipped {len(self.skipped)} file(s) not named {names}: "
            + ", ".join(self.skipped[:limit])
            + more
        )


def codec_of(name: str) -> tuple[bool, str | None]:
    for suffix, codec in SUFFIXES.items():
        if name.endswith(suffix):
            return True, codec
    return False, None


def dataset_root(dataset_path: str) -> str:
    """How the dataset path is recorded and compared: a local path made absolute, an s3:// URL as written."""
    return dataset_path if is_s3(dataset_path) else os.path.abspath(dataset_path)


def discover(dataset_path: str, exclude: tuple[str, ...] = ()) -> Dataset:
    """Find the input files; ``exclude`` holds real paths of folders to skip (the job dir)."""
    if is_s3(dataset_path):
        return _discover_s3(dataset_path)
    root = os.path.abspath(dataset_path)
    try:
        st = os.stat(root)
    except OSError as exc:
        raise _unreadable(root, exc) from exc
    if stat.S_ISDIR(st.st_mode):
        skipped: list[str] = []
        inputs = _scan_dir(root, {os.path.realpath(p) for p in exclude}, skipped)
        _refuse_mixed(root, inputs)
        return Dataset(root, "dir", inputs, tuple(sorted(skipped)))
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{root}: not a regular file or directory; pass a JSONL or Parquet file or a folder of them")
    _, codec = codec_of(os.path.basename(root))
    spec = _spec(root, os.path.basename(root), codec, os.path.dirname(root))
    return Dataset(root, "file", (spec,))


def _scan_dir(root: str, exclude: set[str], skipped: list[str]) -> tuple[InputSpec, ...]:
    found: list[InputSpec] = []
    _walk(root, (), root, exclude, (os.path.realpath(root),), found, skipped)
    if not found:
        if not _has_entries(root):
            raise UserError(f"{root}: the dataset directory is empty; put .jsonl files in it or pass another path")
        raise UserError(
            f"{root}: no *.jsonl, *.jsonl.gz, *.jsonl.zst or *.parquet files found (searched recursively); "
            "name the input files with one of these suffixes or pass the file itself"
        )
    found.sort(key=lambda s: s.rel)
    return tuple(found)


def _refuse_mixed(root: str, inputs: tuple[InputSpec, ...]) -> None:
    """One input format per job: the shards, their reader and the recorded schema all follow from it."""
    parquet = next((s for s in inputs if s.parquet), None)
    jsonl = next((s for s in inputs if not s.parquet), None)
    if parquet is not None and jsonl is not None:
        raise UserError(
            f"{root}: mixes JSONL and Parquet inputs (e.g. {jsonl.rel} and {parquet.rel}); a job reads one "
            "input format (its shards, their reader and the recorded schema follow from it): convert one kind, "
            "or move it to another folder and run it as its own job"
        )


def _has_entries(path: str) -> bool:
    with os.scandir(path) as it:
        return any(True for _ in it)


def _walk(
    folder: str,
    parts: tuple[str, ...],
    root: str,
    exclude: set[str],
    ancestors: tuple[str, ...],
    out: list[InputSpec],
    skipped: list[str],
) -> None:
    """Recurse following symlinks; a folder that is its own ancestor is a loop."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        raise _unreadable(folder, exc) from exc
    for entry in entries:
        if STAGING_MARK in entry.name:
            continue
        path = entry.path
        try:
            st = os.stat(path)
        except OSError as exc:
            if codec_of(entry.name)[0] or exc.errno == errno.ELOOP:
                raise _unreadable(path, exc) from exc
            continue  # a dangling link that is no input is none of our business
        if stat.S_ISDIR(st.st_mode):
            real = os.path.realpath(path)
            if real in exclude:
                continue
            if real in ancestors:
                raise UserError(
                    f"{path}: symlink loop (it leads back to {real}); remove the link or point it elsewhere"
                )
            _walk(path, (*parts, entry.name), root, exclude, (*ancestors, real), out, skipped)
            continue
        matched, codec = codec_of(entry.name)
        if not matched:
            if not entry.name.startswith("."):  # hidden files (.DS_Store, editor swap files) are no data
                skipped.append(str(PurePosixPath(*parts, entry.name)))
            continue
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{path}: not a regular file; replace it with a plain JSONL file or remove it")
        out.append(_spec(path, str(PurePosixPath(*parts, entry.name)), codec, root))


def _spec(path: str, rel: str, codec: str | None, media_base: str) -> InputSpec:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # the manifest, records and media paths are UTF-8 JSON
        shown = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise UserError(f"{shown}: the path is not valid UTF-8; rename the file (or folder) to a UTF-8 name") from None
    try:
        with open(path, "rb"):
            pass
        seen = Fingerprint.of(path)
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    if seen.size == 0:
        raise UserError(f"{path}: empty file; add {_rows_of(codec)} or remove it")
    return InputSpec(rel=rel, path=path, codec=codec, media_base=media_base, seen=seen)


def _rows_of(codec: str | None) -> str:
    return "a Parquet file's rows" if codec == PARQUET else "rows (one JSON object per line)"


def _unreadable(path: str, exc: OSError) -> UserError:
    if exc.errno == errno.ELOOP:
        return UserError(f"{path}: symlink loop ({exc.strerror}); remove the link or point it at a real file")
    if exc.errno == errno.ENOENT:
        return UserError(f"{path}: does not exist (or is a dangling symlink); fix the path or the link")
    return UserError(f"{path}: cannot be read ({exc.strerror}); make it readable (chmod) or remove it")


def check_unchanged(spec: InputSpec) -> None:
    """Refuse an input whose size, mtime or inode (an s3:// object's ETag) moved while prepare read it (a stat or
    HEAD after the read)."""
    if spec.seen.etag is not None:
        now = _fingerprint_s3(spec.path)
    else:
        try:
            now = Fingerprint.of(spec.path)
        except OSError as exc:
            raise _unreadable(spec.path, exc) from exc
    if now != spec.seen:
        raise changed_error(spec, now)


def changed_error(spec: InputSpec, now: Fingerprint | None = None) -> UserError:
    moved = ""
    if now is not None and spec.seen.etag is not None:
        moved = f" (size {spec.seen.size} -> {now.size}, ETag {spec.seen.etag} -> {now.etag})"
    elif now is not None:
        moved = f" (size {spec.seen.size} -> {now.size}, mtime_ns {spec.seen.mtime_ns} -> {now.mtime_ns})"
    return UserError(
        f"{spec.path}: changed while prepare read it{moved}; wait until nothing writes it, then prepare again"
    )


# inputs on S3 -------------------------------------------------------------------------------------------
# The same rules as a local dataset, so the same bytes give the same inputs in the same order: a key that
# names an object is a file input; otherwise the keys under ``key/`` are a folder, taken by their path
# relative to it, sorted, by the folder's suffixes (other names listed as skipped, hidden ones left out
# silently; JSONL and Parquet mixed refused). Each object is fingerprinted by its size and ETag (the HEAD or
# the listing); only the URL, the size and the ETag are recorded.


def _discover_s3(url: str) -> Dataset:
    """The inputs a dataset URL names; UserError (exit 2) naming the URL when there are none or one is refused."""
    bucket, key = split_s3_url(url)
    objects = s3_objects()
    if key and not key.endswith("/"):
        info = objects.head(bucket, key)
        if info is not None:
            return Dataset(url, "file", (_s3_spec(bucket, info, posixpath.basename(key), posixpath.dirname(key)),))
    prefix = key if not key or key.endswith("/") else key + "/"
    found: list[InputSpec] = []
    skipped: list[str] = []
    listed = False
    for info in objects.list(bucket, prefix):
        listed = True
        rel = info.key[len(prefix) :]
        if not rel or rel.endswith("/") or any(STAGING_MARK in part for part in rel.split("/")):
            continue  # a folder marker, or a prepare's staging folder
        matched, _ = codec_of(rel)
        if matched:
            found.append(_s3_spec(bucket, info, rel, prefix.rstrip("/")))
        elif not posixpath.basename(rel).startswith("."):
            skipped.append(rel)
    if not found:
        if not listed:
            raise UserError(
                f"{url}: does not exist (no object at this key and none under it at {objects.endpoint}); "
                "fix the bucket or key"
            )
        raise UserError(
            f"{url}: no *.jsonl, *.jsonl.gz, *.jsonl.zst or *.parquet objects found under it (searched "
            "recursively); name the input objects with one of these suffixes or pass the object itself"
        )
    found.sort(key=lambda s: s.rel)
    inputs = tuple(found)
    _refuse_mixed(url, inputs)
    return Dataset(url, "dir", inputs, tuple(sorted(skipped)))


def _fingerprint_s3(url: str) -> Fingerprint:
    """The object's size and ETag now (one HEAD); UserError when it is gone."""
    bucket, key = split_s3_url(url)
    info = s3_objects().head(bucket, key)
    if info is None:
        raise UserError(f"{url}: does not exist any more; put it back, then prepare again")
    return _object_fingerprint(info)


def _object_fingerprint(info: ObjectInfo) -> Fingerprint:
    return Fingerprint(info.size, 0, 0, 0, info.etag)


def _s3_spec(bucket: str, info: ObjectInfo, rel: str, folder: str) -> InputSpec:
    url = f"{SCHEME}{bucket}/{info.key}"
    _, codec = codec_of(rel)
    if info.size == 0:
        raise UserError(f"{url}: empty object; add {_rows_of(codec)} or remove it")
    media_base = f"{SCHEME}{bucket}/{folder}".rstrip("/")
    return InputSpec(rel=rel, path=url, codec=codec, media_base=media_base, seen=_object_fingerprint(info))


@dataclass(frozen=True)
class Materialised:
    """The plain bytes prepare reads for one input."""

    data_path: str
    data_size: int


def materialise(spec: InputSpec, dest: str) -> Materialised:
    """Plain inputs are read in place; compressed ones are decompressed to ``dest`` once.

    An s3:// object is streamed (one run of ranged GETs, a block in memory): the decompressors never seek, and
    ``dest`` takes the plain bytes that a local compressed file's would (node-local scratch for a job dir on S3).
    """
    if spec.codec is None:
        return Materialised(spec.path, spec.seen.size)
    try:
        raw = open_input(spec.path, spec.seen.size)
    except OSError as exc:
        raise _unreadable(spec.path, exc) from exc
    with raw, open(dest, "wb") as out:
        try:
            size = _copy(_decompressor(spec.codec, raw), out)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise _corrupt(spec, exc) from exc
        except OSError:
            raise
        except Exception as exc:  # zstandard.ZstdError, without importing zstandard for plain inputs
            if type(exc).__module__.startswith("zstandard"):
                raise _corrupt(spec, exc) from exc
            raise
    if size == 0:
        raise UserError(f"{spec.path}: decompresses to nothing; add rows (one JSON object per line) or remove it")
    return Materialised(dest, size)


def _corrupt(spec: InputSpec, exc: BaseException) -> UserError:
    return UserError(f"{spec.path}: not a valid .{spec.codec} file ({exc}); re-compress it or use the plain .jsonl")


def _decompressor(codec: str, raw: BinaryIO) -> BinaryIO:
    if codec == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    try:
        import zstandard
    except ImportError as exc:
        raise UserError(
            f"{getattr(raw, 'name', 'input')}: .zst inputs need the zstandard package; pip install zstandard"
        ) from exc
    return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)  # type: ignore[return-value]


def _copy(reader: BinaryIO, out: BinaryIO) -> int:
    size = 0
    for block in blocks(reader):
        out.write(block)
        size += len(block)
    return size
