"""What prepare recorded about a shard, as Arrow's JSON reader takes it: the whole input's schema, the longest line.

Every shard is read with the same explicit schema (DESIGN.md invariant 13),
so Ray infers nothing per shard: a column absent from one shard is null there,
a column holding ints and floats anywhere is a float column everywhere, a
string column stays a string column even where each of a shard's strings
parses as a date, and objects carry the union of their fields. The manifest is
read once per process and job (it is immutable: cached by its stat; on an
object store, where ``manifest.json`` is created once and never replaced, by
its prefix, without a HEAD per look-up), never once per shard. A job dir prepared before
schema 5 records neither fact: its shards are read as before (Ray infers each
one's schema, the shard is scanned for its longest line), and a log line says
so once. A runner working in node-local scratch names the job (its shard file
keeps its ``<id>.jsonl`` name there); otherwise the shard's ``shards/`` folder does.
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
    stamp: Any  # the manifest's stat (ino, size, mtime_ns), or its version on an object store
    manifest: Manifest
    parse_options: Any
    parquet_schema: Any = None  # a Parquet input's unified Arrow schema (its shards are row group descriptors)


_cache: dict[str, _JobFacts] = {}
_lock = threading.Lock()


def shard_facts(shard_path: str, log: Any = None, job: JobDir | None = None) -> ShardFacts | None:
    """The recorded facts of the shard file ``<id>.jsonl`` at ``shard_path`` of ``job`` (None: the job whose
    ``shards/`` holds the file; a runner in node-local scratch names its job); None outside a job dir."""
    facts = _facts_of(shard_path, job, log)
    if facts is None:
        return None
    i = facts.manifest.shards.position(Path(shard_path).stem)
    return ShardFacts(facts.parse_options, facts.manifest.shards[i].longest_line if i is not None else None)


def _facts_of(shard_path: str, job: JobDir | None, log: Any) -> _JobFacts | None:
    if job is None:
        path = Path(shard_path)
        if path.parent.name != "shards":
            return None
        job = JobDir(path.parent.parent)
    return _job_facts(job, log)


def _stamp(job: JobDir) -> Any:
    """What changes when the manifest is made again in place (None: there is none)."""
    if job.on_object_store:
        meta = job.store.head(job.key(job.manifest_path))
        return meta.ver if meta is not None else None
    try:
        st = os.stat(job.manifest_path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _job_facts(job: JobDir, log: Any) -> _JobFacts | None:
    root = str(job.root)
    key = f"{job.store.endpoint} {root}" if job.on_object_store else root  # one bucket name, two endpoints
    if job.on_object_store:  # manifest.json is created once there, never replaced: no HEAD per look-up
        with _lock:
            known = _cache.get(key)
        if known is not None:
            return known
    stamp = _stamp(job)
    if stamp is None:
        return None
    with _lock:
        known = _cache.get(key)
        if known is not None and known.stamp == stamp:
            return known
        m = JobDir(job.root)._raw_manifest()  # afresh: the job dir may have been made again in place
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
        _cache[key] = facts = _JobFacts(stamp, m, options, schema)
        return facts


def recorded_columns(job: JobDir) -> Any:
    """The input's columns as prepare recorded them (manifest ``columns``; a Parquet input's Arrow schema).

    None where not recorded."""
    facts = _job_facts(job, None)
    if facts is None:
        return None
    return facts.parquet_schema if facts.parquet_schema is not None else facts.manifest.columns


def parquet_schema(shard_path: str, job: JobDir | None = None) -> Any:
    """The unified Arrow schema when the shard file at ``shard_path`` (of ``job``, as ``shard_facts``) describes
    Parquet row groups."""
    facts = _facts_of(shard_path, job, None)
    return facts.parquet_schema if facts is not None else None
