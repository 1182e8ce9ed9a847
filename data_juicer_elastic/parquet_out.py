"""Parquet exports: one ``.parquet`` file, or a folder of ``part-NNNNN-of-NNNNN.parquet`` files.

Where the values come from: a recipe whose export is Parquet (``export_path``
ending in ``.parquet``, or ``export_type: parquet``) makes every attempt write,
beside its ``processed.jsonl``, the same rows as ``processed.parquet``, straight
from the Arrow blocks Data-Juicer's RayExecutor produced (``ray_runner``), and a
sidecar ``processed.parquet.json`` with its rows, bytes and sha256. Not from
the JSONL: Ray's JSON writer goes through pandas, which keeps 10 significant
digits of a float and writes an integer column holding a null as floats, so a
conversion of the JSONL would not hold the values a plain ``executor_type: ray``
run exports to Parquet.

Every part is written with one schema: the input's columns as prepare recorded
them (manifest ``columns``) first, in their order and types, then the columns
the ops added, as Arrow inferred them. Where shards inferred an added column
differently (a column all null in one shard), the export unifies the schemas
(``permissive``: null gives way to any type, an int to a float) and casts.

Integrity: the done record names the attempt's JSONL output; the Parquet file
lives in the same attempt folder, and its sidecar's rows must equal the done
record's, its bytes and sha256 the file's, checked as the file is read (one
read) by the one-file merge, by stat by the folder export (as for JSONL
parts), and re-hashed by ``verify``.

The attempt's files are read through the job's store (``attempt_file``): a
file on POSIX, an object on S3. A schema is read from the footer alone (one
ranged read), a part whole (``open_read``) once, as it is checked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.storage.files import dumps_json, fsync_dir, temp_name, unlink_quietly
from data_juicer_elastic.storage.store import Store

if TYPE_CHECKING:
    from data_juicer_elastic.job.layout import JobDir

PARQUET = "parquet"
JSONL = "jsonl"
OUTPUT = "processed.parquet"  # beside the attempt's processed.jsonl
SIDECAR = "processed.parquet.json"  # its rows, bytes and sha256, written after it
ROW_GROUP = 64 * 1024  # rows per row group, the same as pyarrow's write_table default (1 Mi) would be too coarse
FOOTER_TAIL = 64 << 10  # a schema's first ranged read: the footer of a part file with a few hundred columns

_SCALARS = {"null": "null", "bool": "bool_", "int": "int64", "float": "float64", "string": "string"}


# --------------------------------------------------------------------------- schema
def arrow_type(recorded: Any) -> Any:
    """The Arrow type of one recorded column type (prepare.schema's form)."""
    import pyarrow as pa

    if isinstance(recorded, str):
        return getattr(pa, _SCALARS[recorded])()
    kind, inner = recorded
    if kind == "list":
        return pa.list_(arrow_type(inner))
    return pa.struct([pa.field(name, arrow_type(t)) for name, t in inner])


def arrow_schema(columns: Any) -> Any:
    """The Arrow schema of recorded columns (a Parquet input records an Arrow schema: returned as it is)."""
    import pyarrow as pa

    if isinstance(columns, pa.Schema):
        return columns
    return pa.schema([pa.field(name, arrow_type(t)) for name, t in columns])


def output_schema(table: Any, columns: Any) -> Any:
    """The recorded input columns first (recorded types), then the columns the ops added, as inferred."""
    import pyarrow as pa

    if columns is None or len(columns) == 0:
        return table.schema
    recorded = arrow_schema(columns)
    fields = []
    for f in recorded:
        i = table.schema.get_field_index(f.name)
        if i < 0:
            continue  # an op removed it
        got = table.schema.field(i)
        fields.append(f if got.type == pa.null() or got.type == f.type else got)  # an op may change a type
    fields += [f for f in table.schema if recorded.get_field_index(f.name) < 0]
    return pa.schema(fields)


def conform(table: Any, schema: Any) -> Any:
    """``table`` with exactly ``schema``'s columns, in its order and types (absent columns: nulls)."""
    import pyarrow as pa

    if table.schema == schema:
        return table
    arrays = []
    for f in schema:
        i = table.schema.get_field_index(f.name)
        if i < 0:
            arrays.append(pa.nulls(table.num_rows, f.type))
        else:
            col = table.column(i)
            arrays.append(col if col.type == f.type else col.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def unify(schemas: Iterable[Any]) -> Any:
    import pyarrow as pa

    return pa.unify_schemas(list(schemas), promote_options="permissive")


# --------------------------------------------------------------------------- which format
def wants_parquet(export_path: str | None, export_type: str | None) -> bool:
    """Does a recipe's export ask for Parquet (``.parquet``, or ``export_type: parquet``)?"""
    return str(export_path or "").endswith(".parquet") or export_type == PARQUET


def output_format(output: str, job: JobDir | None = None) -> str:
    """``parquet`` or ``jsonl``: a file's suffix says; a folder takes the recipe of ``job`` (its export,
    ``wants_parquet``), read through the job's store; without a job, JSONL."""
    ext = os.path.splitext(os.path.basename(os.path.abspath(os.fspath(output))))[1]
    if ext == ".parquet":
        return PARQUET
    if ext or job is None:
        return JSONL
    try:
        import yaml

        recipe = yaml.safe_load(read_whole(job.store, job.key(job.recipe_path)) or b"")
    except (OSError, ValueError):
        return JSONL
    if not isinstance(recipe, dict):
        return JSONL
    return PARQUET if wants_parquet(recipe.get("export_path"), recipe.get("export_type")) else JSONL


# --------------------------------------------------------------------------- the job's files, through its store
def read_whole(store: Store, key: str) -> bytes | None:
    """``key``'s bytes (``open_read``, so a large part is never a ``read`` of a small record); None when missing."""
    stream = store.open_read(key)
    if stream is None:
        return None
    with stream:
        return stream.read()


# --------------------------------------------------------------------------- the attempt's Parquet output
def write_shard_parquet(table: Any, attempt_dir: str | os.PathLike, columns: Any) -> Path:
    """Write ``table`` as the attempt's ``processed.parquet`` (temp, fsync, rename), then its sidecar."""
    import pyarrow.parquet as pq

    from data_juicer_elastic.storage.blocks import digest_file

    folder = Path(attempt_dir)
    out = folder / OUTPUT
    table = conform(table, output_schema(table, columns))
    tmp = temp_name(out)
    try:
        pq.write_table(table, tmp, row_group_size=ROW_GROUP)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        d = digest_file(tmp)
        os.replace(tmp, out)
    finally:
        unlink_quietly(tmp)
    side = folder / SIDECAR
    side_tmp = temp_name(side)
    with open(side_tmp, "wb") as f:
        f.write(dumps_json({"rows": table.num_rows, "bytes": d.bytes, "sha256": d.sha256}))
        f.flush()
        os.fsync(f.fileno())
    os.replace(side_tmp, side)
    fsync_dir(folder)
    return out


def shard_parquet(job: JobDir, record: Any, jsonl_path: Path) -> tuple[Path, dict]:
    """The Parquet output beside a done record's JSONL output and its sidecar (read through ``job``'s store),
    rows checked against the record."""
    path = jsonl_path.with_name(OUTPUT)
    side = jsonl_path.with_name(SIDECAR)
    try:
        data = read_whole(job.store, job.key(side))
        if data is None:
            raise FileNotFoundError(side)
        meta = orjson.loads(data)
    except FileNotFoundError:
        raise UserError(
            f"shard {record.shard}: {path} is missing: this generation's outputs were written as JSONL only "
            "(its recipe's export is not Parquet); export to a .jsonl file or folder, or set export_path "
            "to a .parquet file (or export_type: parquet) in the recipe and run the job again"
        ) from None
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"shard {record.shard}: {side} is unreadable ({exc}); rerun the shard") from exc
    if not isinstance(meta, dict) or any(not isinstance(meta.get(k), int) for k in ("rows", "bytes")):
        raise IntegrityError(f"shard {record.shard}: {side} is malformed; rerun the shard")
    if meta["rows"] != record.rows:
        raise IntegrityError(
            f"shard {record.shard}: {path} holds {meta['rows']} rows, its done record says {record.rows}; "
            "archive the record and rerun the shard"
        )
    return path, meta


def describe_part_mismatch(shard: str, path: Path, meta: dict, size: int, sha: str | None) -> str | None:
    diffs = []
    if size != meta.get("bytes"):
        diffs.append(f"{size} bytes, {SIDECAR} says {meta.get('bytes')}")
    if sha is not None and sha != meta.get("sha256"):
        diffs.append(f"sha256 {sha[:12]}…, {SIDECAR} says {str(meta.get('sha256'))[:12]}…")
    if not diffs:
        return None
    return (
        f"shard {shard}: {path} does not match its {SIDECAR} ({'; '.join(diffs)}); it changed after the "
        "worker wrote it: restore it, or archive the record and rerun the shard"
    )


def read_checked(job: JobDir, shard: str, path: Path, meta: dict) -> Any:
    """The Parquet file's bytes, read once (through ``job``'s store) and checked against its sidecar, as a
    pyarrow buffer."""
    import hashlib

    import pyarrow as pa

    try:
        with job.open_output(shard, path) as stream:
            data = stream.read()
    except OSError as exc:
        raise IntegrityError(f"shard {shard}: {path} cannot be read ({exc.strerror}); rerun the shard") from exc
    problem = describe_part_mismatch(shard, path, meta, len(data), hashlib.sha256(data).hexdigest())
    if problem:
        raise IntegrityError(problem)
    return pa.py_buffer(data)


def schema_of(buf: Any) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pq.ParquetFile(pa.BufferReader(buf)).schema_arrow


def schema_of_file(job: JobDir, shard: str, path: Path, size: int) -> Any:
    """The schema in the footer of the ``size`` bytes at ``path``: its tail alone, read through ``job``'s store
    (one ranged read; a second where the footer is larger than ``FOOTER_TAIL``)."""
    import pyarrow as pa

    store, key = job.store, job.key(path)
    tail = store.open_range(key, max(size - FOOTER_TAIL, 0), size)
    if tail is not None and len(tail) >= 8 and tail[-4:] == b"PAR1":
        need = int.from_bytes(tail[-8:-4], "little") + 8
        if need > len(tail) and need <= size:
            tail = store.open_range(key, size - need, size)
        if tail is not None and need <= len(tail):
            try:
                return schema_of(pa.py_buffer(b"PAR1" + tail[-need:]))  # the leading magic a reader looks for
            except (OSError, ValueError):
                pass
    why = "it is missing" if tail is None else f"its last {size} bytes hold no Parquet footer"
    raise IntegrityError(f"shard {shard}: {path} cannot be read ({why}); restore it or rerun the shard")


def write_merged(job: JobDir, parts: list[tuple[str, Path, dict]], out: Path, tick: Any = None) -> tuple[int, int]:
    """The parts' rows, in order, into the one Parquet file ``out`` (written to a temp path by the caller).

    Each part is read once (checked against its sidecar); its schema is read from its footer first, so the
    file is written with the union of every part's schema. Returns rows and bytes of the file (fsynced).
    The parts are read through ``job``'s store.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    schemas, union = part_schemas(job, parts)  # footers only
    schema = union if union is not None else schemas[0] if schemas else unify(schemas)
    rows = 0
    with pq.ParquetWriter(out, schema) as writer:
        for shard, path, meta in parts:
            f = pq.ParquetFile(pa.BufferReader(read_checked(job, shard, path, meta)))
            for i in range(f.num_row_groups):
                table = conform(f.read_row_group(i), schema)
                writer.write_table(table, row_group_size=ROW_GROUP)
                rows += table.num_rows
            if tick is not None:
                tick(meta["bytes"])
        if not parts:
            writer.write_table(schema.empty_table())
    with open(out, "rb+") as fh:
        os.fsync(fh.fileno())
        return rows, os.fstat(fh.fileno()).st_size


def part_schemas(job: JobDir, parts: list[tuple[str, Path, dict]]) -> tuple[list[Any], Any]:
    """Each part's schema (its footer, through ``job``'s store), and None when they are one schema, else the
    union to rewrite the others with."""
    schemas = [schema_of_file(job, shard, path, meta["bytes"]) for shard, path, meta in parts]
    if len({str(s) for s in schemas}) <= 1:
        return schemas, None
    return schemas, unify(schemas)


def rewrites(job: JobDir, parts: list[tuple[str, Path, dict]]) -> tuple[list[bool], Any]:
    """Which parts a folder export rewrites (their schema is not the union of all), and that union (None
    when every part has one schema: none is rewritten)."""
    schemas, union = part_schemas(job, parts)
    return [union is not None and not own.equals(union) for own in schemas], union


def rewrite_part(job: JobDir, shard: str, path: Path, meta: dict, dst: Path, schema: Any) -> None:
    """The part at ``path`` (read once, checked: ``read_checked``) cast to ``schema``, written to ``dst``
    (fsynced)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = pq.ParquetFile(pa.BufferReader(read_checked(job, shard, path, meta)))
    with pq.ParquetWriter(dst, schema) as writer:
        for i in range(f.num_row_groups):
            writer.write_table(conform(f.read_row_group(i), schema), row_group_size=ROW_GROUP)
    with open(dst, "rb+") as fh:
        os.fsync(fh.fileno())
