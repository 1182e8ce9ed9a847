"""The manifest: what prepare published about the input and its shards (``manifest.json``).

It describes the shards only (input files, row rules, shard ranges and
digests), never the ops, so every generation of a job reads the same one. Its
digest covers its own content, so an edit after prepare is refused.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.job.shard_table import TABLE_NAME, ShardSource, ShardSpec, ShardTable
from data_juicer_elastic.storage.files import atomic_write, dumps_json
from data_juicer_elastic.storage.store import Store

# 2: the manifest carries its digest; 3: inputs fingerprinted per source range; 4: generations;
# 5: the input's columns and each shard's longest line (4 is read as it is: a shard's schema is inferred);
# 6: the shards in their own table (job.shard_table), manifest.json keeps their rows and bytes columns
SCHEMA_VERSION = 6
LEGACY_SCHEMA = 3  # readable: its one generation lives at the top of the job dir
READABLE = (LEGACY_SCHEMA, 4, 5, SCHEMA_VERSION)
INLINE_SHARDS = (LEGACY_SCHEMA, 4, 5)  # these list every shard inside manifest.json


@dataclass(frozen=True)
class InputFile:
    """One input file as prepare saw it (path relative to the dataset root).

    Its content is fingerprinted by the sha256 of each of its source ranges
    (``ShardSource.sha256``), taken in prepare's one read of the file.
    """

    path: str
    size: int
    mtime_ns: int  # 0 for an s3:// object
    rows: int
    etag: str | None = None  # an s3:// object's; left out of the JSON for a local file (its manifest is as before)

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        if d["etag"] is None:
            del d["etag"]
        return d


@dataclass(frozen=True)
class Policy:
    """Execution settings fixed at prepare time; every worker obeys the manifest's copy."""

    num_shards: int
    lock_timeout_secs: float = 300.0
    heartbeat_secs: float = 30.0
    max_retries: int = 2
    poll_interval_secs: float = 5.0
    ray_address: str = "local"


@dataclass(frozen=True)
class Manifest:
    dataset_path: str  # absolute
    input_kind: str  # "file" or "dir"
    files: tuple[InputFile, ...]
    recipe_sha256: str
    versions: dict[str, str]
    policy: Policy
    media_keys: tuple[str, ...]
    index_keys: tuple[str, ...]
    shards: ShardTable
    total_rows: int
    total_bytes: int
    created_at: float = 0.0
    # The whole input's columns and JSON types (prepare.schema's recorded form), read by every shard's
    # reader so that a row's values never depend on its shard. None: prepared before schema 5.
    columns: list | None = None
    # A Parquet input (prepare.parquet): {"schema": base64 of the unified Arrow schema (IPC), "schema_text": the
    # same as text}; its shards are descriptors of row groups read in place. None (and left out of the JSON, so
    # a JSONL job's manifest and digest are as before): a JSONL input.
    parquet: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION
    digest: str = ""  # manifest_digest() of the rest, set by seal()

    def to_dict(self) -> dict[str, Any]:
        """manifest.json's content, built directly (``dataclasses.asdict`` deep-copies every field, which made
        a manifest of 100,000 shards take tens of seconds). Schema 6 names the shard table's blocks and
        columns in ``shard_table``; older schemas listed every shard in ``shards``."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["files"] = [f.to_dict() for f in self.files]
        d["versions"] = dict(self.versions)
        d["policy"] = dict(vars(self.policy))
        d["media_keys"], d["index_keys"] = list(self.media_keys), list(self.index_keys)
        if self.schema_version in INLINE_SHARDS:
            d["shards"] = [{**vars(s), "sources": [dict(vars(src)) for src in s.sources]} for s in self.shards]
        else:
            del d["shards"]
            d["shard_table"] = self.shards.index()[0]
        if d["parquet"] is None:
            del d["parquet"]
        else:
            d["parquet"] = dict(d["parquet"])
        return d

    def seal(self) -> Manifest:
        """This manifest with its digest filled in (what prepare publishes)."""
        return dataclasses.replace(self, digest=manifest_digest(self.to_dict()))

    def write(self, folder: Path) -> None:
        """Publish into ``folder``: the shard table first, then manifest.json, which names its digests."""
        if self.schema_version not in INLINE_SHARDS:
            atomic_write(folder / TABLE_NAME, self.shards.index()[1])
        atomic_write(folder / "manifest.json", dumps_json(self.to_dict()))

    @classmethod
    def from_dict(
        cls, d: dict[str, Any], where: str = "manifest.json", folder: Path | None = None, store: Store | None = None
    ) -> Manifest:
        """The manifest ``d`` (manifest.json's content); a schema-6 one reads its table in the job dir ``folder``
        through its ``store``."""
        try:
            if d.get("schema_version") not in READABLE:
                raise IntegrityError(
                    f"{where}: schema_version {d.get('schema_version')!r} is not {SCHEMA_VERSION}; "
                    "prepare the job again with this version of data-juicer-elastic"
                )
            if d["schema_version"] in INLINE_SHARDS:
                with _no_gc():  # 200,000 objects at 100,000 shards: the collector would walk them dozens of times
                    shards = ShardTable.of([_shard(s) for s in d["shards"]])
            else:
                table = d["shard_table"]
                if table.get("file") != TABLE_NAME or folder is None or store is None:
                    raise ValueError(f"shard_table file {table.get('file')!r} is not {TABLE_NAME!r}")
                shards = ShardTable.load(store, TABLE_NAME, str(folder / TABLE_NAME), table, where)
            return cls(
                dataset_path=d["dataset_path"],
                input_kind=d["input_kind"],
                files=tuple(InputFile(**f) for f in d["files"]),
                recipe_sha256=d["recipe_sha256"],
                versions=dict(d["versions"]),
                policy=Policy(**d["policy"]),
                media_keys=tuple(d["media_keys"]),
                index_keys=tuple(d["index_keys"]),
                shards=shards,
                total_rows=d["total_rows"],
                total_bytes=d["total_bytes"],
                created_at=d.get("created_at", 0.0),
                columns=d.get("columns"),
                parquet=dict(d["parquet"]) if d.get("parquet") is not None else None,
                schema_version=d["schema_version"],
                digest=d.get("digest", ""),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, IntegrityError):
                raise
            raise IntegrityError(f"{where}: malformed manifest ({exc!r}); prepare the job again") from exc


@contextmanager
def _no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector (the objects made meanwhile hold no cycles)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _fast(cls: type) -> Any:
    """A maker of ``cls`` objects from a dict that checks the keys as ``cls(**d)`` would, without the
    frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field): a manifest of 100,000 shards
    loads in a fraction of the time (its digest is checked on the dict, before or after, as before)."""
    names = [f.name for f in dataclasses.fields(cls)]
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    required, known = frozenset(names) - defaults.keys(), frozenset(names)
    new, set_attr = object.__new__, object.__setattr__

    def make(d: dict[str, Any], **override: Any) -> Any:
        keys = d.keys()
        if not (required <= keys <= known):
            raise TypeError(f"{cls.__name__}: missing {sorted(required - keys)}, unexpected {sorted(keys - known)}")
        obj = new(cls)
        set_attr(obj, "__dict__", {**defaults, **d, **override})
        return obj

    return make


_spec, _source = _fast(ShardSpec), _fast(ShardSource)


def _shard(s: dict[str, Any]) -> ShardSpec:
    return _spec(s, sources=tuple(_source(src) for src in s.get("sources", ())))


def manifest_digest(d: dict[str, Any]) -> str:
    """sha256 of a manifest's canonical JSON, leaving out ``digest`` itself and the ``created_at`` timestamp."""
    return hashlib.sha256(dumps_json({k: v for k, v in d.items() if k not in ("digest", "created_at")})).hexdigest()
