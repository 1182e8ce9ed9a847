"""What prepare recorded about a shard, as Arrow's JSON reader takes it: the whole input's schema, the longest line.

Every shard is read with the same explicit schema (DESIGN.md invariant 13),
so Ray infers nothing per shard: a column absent from one shard is null there,
a column holding ints and floats anywhere is a float column everywhere, a
string column stays a string column even where each of a shard's strings
parses as a date, and objects carry the union of their fields. The manifest is
read once per process and job (it is immutable: cached by its stat), never
once per shard. A job dir prepared before schema 5 records neither fact: its
shards are read as before (Ray infers each one's schema, the shard is scanned
for its longest line), and a log line says so once.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Manifest
from data_juicer_elastic.parquet_out import arrow_schema, arrow_type

__all__ = ["ShardFacts", "arrow_schema", "arrow_type", "parquet_schema", "recorded_columns", "shard_facts"]


@dataclass(frozen=True)
class ShardFacts:
    parse_options: Any  # pyarrow.json.ParseOptions with the input's schema; None: not recorded
    longest_line: int | None  # None: not recorded


@dataclass(frozen=True)
class _JobFacts:
    stat: tuple[int, int, int]
    manifest: Manifest
    parse_options: Any
    parquet_schema: Any = None  # a Parquet input's unified Arrow schema (its shards are row group descriptors)


_cache: dict[str, _JobFacts] = {}
_lock = threading.Lock()


def shard_facts(shard_path: str, log: Any = None) -> ShardFacts | None:
    """The recorded facts of the shard at ``<job>/shards/<id>.jsonl``; None outside a job dir."""
    path = Path(shard_path)
    if path.parent.name != "shards":
        return None
    job = _job_facts(str(path.parent.parent), log)
    if job is None:
        return None
    i = job.manifest.shards.position(path.stem)
    return ShardFacts(job.parse_options, job.manifest.shards[i].longest_line if i is not None else None)


def _job_facts(root: str, log: Any) -> _JobFacts | None:
    manifest_path = os.path.join(root, "manifest.json")
    try:
        st = os.stat(manifest_path)
    except FileNotFoundError:
        return None
    stat = (st.st_ino, st.st_size, st.st_mtime_ns)
    with _lock:
        known = _cache.get(root)
        if known is not None and known.stat == stat:
            return known
        m = JobDir(root)._raw_manifest()
        options = schema = None
        if m.parquet is not None:
            from data_juicer_elastic.prepare.parquet import schema_of

            schema = schema_of(m.parquet)
        elif m.columns is not None:
            import pyarrow.json as pj

            options = pj.ParseOptions(explicit_schema=arrow_schema(m.columns))
        elif log is not None:
            log(
                f"{root}: prepared by an older data-juicer-elastic (manifest schema {m.schema_version}), which "
                "recorded no input schema: each shard's schema is inferred from the shard alone, so a value "
                "may depend on the shard it fell in; prepare a new job dir to read every shard alike"
            )
        _cache[root] = facts = _JobFacts(stat, m, options, schema)
        return facts


def recorded_columns(job_dir: str) -> Any:
    """The input's columns as prepare recorded them (manifest ``columns``; a Parquet input's Arrow schema).

    None where not recorded."""
    job = _job_facts(os.path.abspath(job_dir), None)
    if job is None:
        return None
    return job.parquet_schema if job.parquet_schema is not None else job.manifest.columns


def parquet_schema(shard_path: str) -> Any:
    """The unified Arrow schema when the shard at ``<job>/shards/<id>.jsonl`` describes Parquet row groups."""
    path = Path(shard_path)
    if path.parent.name != "shards":
        return None
    job = _job_facts(str(path.parent.parent), None)
    return job.parquet_schema if job is not None else None
