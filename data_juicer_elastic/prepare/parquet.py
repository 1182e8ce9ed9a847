"""Prepare for a Parquet input: shards are runs of row groups, read in place by the runner.

Everything prepare needs is in the files' footers: the schema (unified across
files; a column whose types cannot be unified is refused, naming both files),
each row group's rows and compressed bytes. Shards are contiguous runs of row
groups over the files in input order, balanced by those bytes; a row group is
never split. No row is decoded here.

A shard is a descriptor (``shards/<id>.jsonl``, one JSON line: for each
source file its path, row groups ``[start, end)``, size, mtime and the sha256
of its footer), so prepare writes almost nothing and the worker's shard check
(the sha256 of the shard file against the manifest) covers the descriptor. The
runner (ray_runner.shard_io) re-checks each source file's size, mtime and
footer digest before it reads the row groups, so a file changed after prepare
is refused, naming it. The manifest's shard sources record each run's byte
range in its file and that range's sha256 (the ranges of a file cover it
whole, magic and footer included), taken in one read of the input, so a
repeated prepare re-hashes a copied or restored input as it does a JSONL one.

An s3:// input is read where it is: its footer, the range digests and (in
the runner) its row groups by ranged GETs through ``prepare.source`` (the
boto3 client every other S3 read uses, so one endpoint and credential chain;
pyarrow's own S3 filesystem would resolve both again, its own way). Its
descriptor records the object's URL and ETag (mtime 0), and the runner checks
size, ETag and footer by a HEAD and the footer's range before it reads.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import hashlib
import itertools
import os
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.layout import shard_id
from data_juicer_elastic.job.manifest import InputFile, Manifest, ShardSource, ShardSpec
from data_juicer_elastic.prepare.inputs import Dataset, InputSpec, changed_error, check_unchanged
from data_juicer_elastic.prepare.request import PrepareRequest
from data_juicer_elastic.prepare.source import open_input, read_blocks, s3_objects, split_s3_url
from data_juicer_elastic.storage.files import atomic_write, fsync_dir
from data_juicer_elastic.storage.urls import is_s3

BLOCK = 1 << 20
FORMAT = "parquet"


@dataclass(frozen=True)
class FileLayout:
    """One Parquet input's footer facts."""

    rows: tuple[int, ...]  # per row group
    weights: tuple[int, ...]  # compressed bytes per row group (the metadata's column chunk sizes)
    starts: tuple[int, ...]  # byte offset of each row group's first page
    size: int
    footer_sha256: str
    schema: Any  # pyarrow.Schema


def footer_sha256(path: str, size: int | None = None) -> str:
    """sha256 of the file's footer (metadata, its length and the closing magic); ``size`` None: a local file's."""
    if size is None:
        size = os.stat(path).st_size
    start = 0
    if size >= 12:
        (length,) = struct.unpack("<I", b"".join(read_blocks(path, size - 8, size - 4, BLOCK)).ljust(4, b"\0"))
        start = max(0, size - 8 - length)
    return hashlib.sha256(b"".join(read_blocks(path, start, size, BLOCK))).hexdigest()


def read_layout(spec: InputSpec) -> FileLayout:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with _source(spec.path, spec.seen.size) as src:
            md = pq.read_metadata(src)
        schema = md.schema.to_arrow_schema()
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{spec.path}: not a readable Parquet file ({exc}); rewrite it or remove it") from exc
    rows, weights, starts = [], [], []
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        first, weight = None, 0
        for c in range(rg.num_columns):
            col = rg.column(c)
            offset = col.data_page_offset
            if col.has_dictionary_page and col.dictionary_page_offset:
                offset = min(offset, col.dictionary_page_offset)
            first = offset if first is None else min(first, offset)
            weight += col.total_compressed_size
        rows.append(rg.num_rows)
        weights.append(weight)
        starts.append(first if first is not None else 4)
    if any(b < a for a, b in itertools.pairwise(starts)):
        raise UserError(
            f"{spec.path}: its row groups are not stored in order; rewrite the file (e.g. with pyarrow) to shard it"
        )
    if sum(rows) == 0:
        raise UserError(f"{spec.path}: holds no rows; add rows or remove it")
    footer = footer_sha256(spec.path, spec.seen.size)
    return FileLayout(tuple(rows), tuple(weights), tuple(starts), spec.seen.size, footer, schema)


@contextlib.contextmanager
def _source(path: str, size: int) -> Iterator[Any]:
    """What pyarrow reads: a local path as it is (pyarrow's own file), an s3:// object through ranged GETs,
    closed on leaving (pyarrow leaves a file object it was given open: its GET body, until collected)."""
    if not is_s3(path):
        yield path
        return
    with open_input(path, size) as reader:
        yield reader


# --------------------------------------------------------------------------- schema
def unify(specs: tuple[InputSpec, ...], layouts: list[FileLayout]) -> Any:
    """The files' schemas as one: columns in first-seen order; a clash names the column and both files."""
    import pyarrow as pa

    fields: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for spec, layout in zip(specs, layouts, strict=True):
        for f in layout.schema:
            if f.name not in fields:
                fields[f.name], owner[f.name] = f.remove_metadata(), spec.path
                continue
            known = fields[f.name]
            if known.type == f.type:
                continue
            try:
                merged = pa.unify_schemas(
                    [pa.schema([known]), pa.schema([f.remove_metadata()])], promote_options="permissive"
                )
            except (pa.ArrowTypeError, pa.ArrowInvalid):
                raise UserError(
                    f"{spec.path}: column {f.name!r} is {f.type} here but {known.type} in {owner[f.name]}; "
                    "one job reads one schema (every shard is read with it): write the column with one type "
                    "in every file, or rename it in one of them"
                ) from None
            fields[f.name] = merged.field(0)
    return pa.schema(list(fields.values()))


def schema_record(schema: Any) -> dict[str, Any]:
    return {"schema": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"), "schema_text": str(schema)}


def schema_of(record: dict[str, Any]) -> Any:
    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(record["schema"])))


# --------------------------------------------------------------------------- plan
def plan_row_groups(weights: list[int], n: int) -> list[tuple[int, int]]:
    """``n`` contiguous non-empty runs ``[a, b)`` of row groups, cut nearest to k/n of the bytes."""
    g = len(weights)
    if n > g:
        raise ValueError(g)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + max(w, 0))
    total = prefix[-1]
    cuts = []
    for k in range(1, n):
        target = k * total / n
        i = bisect.bisect_left(prefix, target, 1, g)
        if i > 1 and target - prefix[i - 1] <= prefix[i] - target:
            i -= 1
        cuts.append(min(max(i, 1), g - 1))
    for k in range(len(cuts)):  # strictly increasing, leaving room for the runs after it
        low = cuts[k - 1] + 1 if k else 1
        cuts[k] = min(max(cuts[k], low), g - (n - 1 - k))
    bounds = [0, *cuts, g]
    return list(itertools.pairwise(bounds))


@dataclass(frozen=True)
class _Run:
    file: int
    start: int  # row groups [start, end) of the file
    end: int


def _runs(layouts: list[FileLayout], a: int, b: int) -> list[_Run]:
    out, base = [], 0
    for i, layout in enumerate(layouts):
        g = len(layout.rows)
        lo, hi = max(a, base), min(b, base + g)
        if lo < hi:
            out.append(_Run(i, lo - base, hi - base))
        base += g
    return out


def _byte_range(layout: FileLayout, run: _Run) -> tuple[int, int]:
    """The run's bytes; a file's runs cover it whole (the first from 0, the last to its end)."""
    g = len(layout.rows)
    start = 0 if run.start == 0 else layout.starts[run.start]
    end = layout.size if run.end == g else layout.starts[run.end]
    return start, end


def _hash_range(path: str, start: int, end: int) -> str:
    digest, pos = hashlib.sha256(), start
    for block in read_blocks(path, start, end, BLOCK):
        digest.update(block)
        pos += len(block)
    return digest.hexdigest() if pos == end else ""


# --------------------------------------------------------------------------- the build
@dataclass(frozen=True)
class Built:
    manifest: Manifest
    data_bytes: int


def build(req: PrepareRequest, dataset: Dataset, staging: Path, recipe_sha: str) -> Built:
    """Shard descriptors and the manifest of a Parquet dataset, written into ``staging``."""
    if req.index_keys:
        raise UserError(
            f"index_keys {list(req.index_keys)}: not supported for a Parquet input (filling a key per row "
            "would rewrite every row); add the index column to the Parquet files, or drop index_keys"
        )
    specs = dataset.inputs
    layouts = [read_layout(s) for s in specs]
    schema = unify(specs, layouts)
    weights = [w for layout in layouts for w in layout.weights]
    n = req.policy.num_shards
    try:
        runs = [_runs(layouts, a, b) for a, b in plan_row_groups(weights, n)]
    except ValueError:
        raise UserError(
            f"num_shards: {n} requested but the input has only {len(weights)} Parquet row groups (a row group "
            f"is never split); set num_shards between 1 and {len(weights)}, or rewrite the files with smaller "
            "row groups"
        ) from None
    ranges = [[(r, *_byte_range(layouts[r.file], r)) for r in rs] for rs in runs]
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:  # hashlib releases the GIL
        digests = [[pool.submit(_hash_range, specs[r.file].path, a, b) for r, a, b in rr] for rr in ranges]
        digests_done = [[f.result() for f in fs] for fs in digests]
    for spec, layout in zip(specs, layouts, strict=True):
        check_unchanged(spec)
        if footer_sha256(spec.path, spec.seen.size) != layout.footer_sha256:
            raise changed_error(spec)
    if any(d == "" for ds in digests_done for d in ds):  # pragma: no cover  (check_unchanged saw the size move)
        raise UserError(f"{dataset.root}: an input got shorter while prepare read it; prepare again")

    shards_dir = staging / "shards"
    shards_dir.mkdir()
    file_rows = [0] * len(specs)
    shards, row = [], 0
    for i, (rr, ds) in enumerate(zip(ranges, digests_done, strict=True)):
        sid = shard_id(i, n)
        sources, described, rows = [], [], 0
        for (run, a, b), sha in zip(rr, ds, strict=True):
            spec, layout = specs[run.file], layouts[run.file]
            run_rows = sum(layout.rows[run.start : run.end])
            sources.append(ShardSource(spec.rel, a, b, file_rows[run.file] + 1, sha))
            source = {
                "file": spec.rel,
                "path": spec.path,
                "row_groups": [run.start, run.end],
                "rows": run_rows,
                "size": spec.seen.size,
                "mtime_ns": spec.seen.mtime_ns,
                "footer_sha256": layout.footer_sha256,
            }
            described.append(source if spec.seen.etag is None else {**source, "etag": spec.seen.etag})
            file_rows[run.file] += run_rows
            rows += run_rows
        data = orjson.dumps({"format": FORMAT, "sources": described}, option=orjson.OPT_SORT_KEYS) + b"\n"
        atomic_write(shards_dir / f"{sid}.jsonl", data)
        shards.append(
            ShardSpec(
                sid, f"shards/{sid}.jsonl", rows, len(data), hashlib.sha256(data).hexdigest(), row, tuple(sources)
            )
        )
        row += rows
    fsync_dir(shards_dir)
    files = tuple(
        InputFile(s.rel, s.seen.size, s.seen.mtime_ns, rows, s.seen.etag)
        for s, rows in zip(specs, file_rows, strict=True)
    )
    manifest = req.manifest(
        dataset.root, dataset.kind, recipe_sha, files, shards, columns=None, parquet=schema_record(schema)
    )
    manifest.write(staging)
    return Built(manifest, sum(s.seen.size for s in specs))


# --------------------------------------------------------------------------- the runner's side
def read_descriptor(path: str, schema: Any) -> list[Any]:
    """The shard's row groups as Arrow tables with ``schema``, after checking each source is as prepared."""
    import pyarrow.parquet as pq

    from data_juicer_elastic.errors import PermanentError
    from data_juicer_elastic.parquet_out import conform

    with open(path, "rb") as f:
        desc = orjson.loads(f.read())
    tables = []
    for src in desc["sources"]:
        p = src["path"]
        now, stamp = _now(p, src)
        footer = now["footer_sha256"]
        if (now["size"], now[stamp], footer) != (src["size"], src[stamp], src["footer_sha256"]):
            raise PermanentError(
                f"{p}: changed since prepare (size {src['size']} -> {now['size']}, {stamp} {src[stamp]} -> "
                f"{now[stamp]}, footer {'same' if footer == src['footer_sha256'] else 'differs'}); its shards "
                "read it in place: restore it, or prepare the job again in a new job dir"
            )
        a, b = src["row_groups"]
        with _source(p, now["size"]) as where, pq.ParquetFile(where) as pf:
            table = pf.read_row_groups(list(range(a, b)))
        if table.num_rows != src["rows"]:
            raise PermanentError(f"{p}: row groups {a}..{b - 1} hold {table.num_rows} rows, prepare saw {src['rows']}")
        tables.append(conform(table.replace_schema_metadata(None), schema))
    return tables


def _now(path: str, src: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The source's size, change stamp (a file's mtime_ns, an object's ETag) and footer digest now, and the
    stamp's name; PermanentError when it cannot be read."""
    from data_juicer_elastic.errors import PermanentError

    if "etag" in src:
        bucket, key = split_s3_url(path)
        info = s3_objects().head(bucket, key)
        if info is not None:
            return {"size": info.size, "etag": info.etag, "footer_sha256": footer_sha256(path, info.size)}, "etag"
        why = "it does not exist any more"
    else:
        try:
            st = os.stat(path)
            now = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "footer_sha256": footer_sha256(path, st.st_size)}
            return now, "mtime_ns"
        except OSError as exc:
            why = str(exc.strerror)
    raise PermanentError(
        f"{path}: the Parquet input of this shard cannot be read ({why}); restore it, "
        "or prepare the job again in a new job dir"
    )
