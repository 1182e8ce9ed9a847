"""A recipe's ``process`` list cut into segments at each deduplicator, and the stages that run them (docs/DEDUP.md).

Kept apart from Data-Juicer so the parse-time check and the worker loop agree on one table of what runs staged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["exact", "minhash"]
StageName = Literal["hash", "bucket", "join", "final"]

KINDS: dict[str, Kind] = {
    "document_deduplicator": "exact",
    "ray_document_deduplicator": "exact",
    "document_minhash_deduplicator": "minhash",
    "ray_bts_minhash_deduplicator": "minhash",
    "ray_bts_minhash_cpp_deduplicator": "minhash",
}
"""Deduplicators that run staged, and what their keys mean."""

TWINS: dict[str, str] = {
    "ray_document_deduplicator": "document_deduplicator",
    "ray_bts_minhash_deduplicator": "document_minhash_deduplicator",
    "ray_bts_minhash_cpp_deduplicator": "document_minhash_deduplicator",
}
"""A Ray variant's keys come from its non-Ray twin, whose result (first row in input order) is the one defined."""

RAY_ONLY_ARGS: frozenset[str] = frozenset(
    {
        "backend",
        "redis_address",
        "dedup_set_num",
        "union_find_parallel_num",
        "union_threshold",
        "max_pending_edge_buffer_task",
        "num_edge_buffer_task_returns",
        "max_pending_filter_tasks",
        "num_filter_task_returns",
        "merge_batch_size",
        "minhash_batch_size",
        "memory_per_sample",
        "actor_memory",
        "task_memory",
    }
)
"""Arguments that tune a Ray variant's actors and batches; they change no row kept, so the twin goes without them."""

REFUSED: dict[str, str] = {
    "document_minhash_deduplicator_with_uid": "keeps rows by a '__dj__uid' column, not by input order",
    "ray_bts_minhash_deduplicator_with_uid": "keeps rows by a '__dj__uid' column, not by input order",
    "document_simhash_deduplicator": "has no staged form yet (its neighbours are found by bit windows)",
    "document_line_deduplicator": "has no staged form yet",
    "image_deduplicator": "has no staged form yet",
    "video_deduplicator": "has no staged form yet",
    "ray_image_deduplicator": "has no staged form yet",
    "ray_video_deduplicator": "has no staged form yet",
}
"""Deduplicators named with why they do not run here; the parse-time message lists :data:`KINDS` beside them."""


@dataclass(frozen=True)
class DedupOp:
    """One deduplicator of the recipe: where it stands, what builds its keys, and with which arguments."""

    position: int
    name: str
    kind: Kind
    builder: str
    args: Mapping[str, Any]


@dataclass(frozen=True)
class Segment:
    """The per-row ops that run before ``dedup`` (None: the last segment, which writes the output)."""

    ops: tuple[dict[str, Any], ...]
    dedup: DedupOp | None


@dataclass(frozen=True)
class Stage:
    """One stage of the job: its units are input shards (hash, final), buckets, or one join."""

    name: StageName
    dedup: int
    units: Literal["input_shards", "buckets", "one"]


@dataclass(frozen=True)
class Plan:
    segments: tuple[Segment, ...]
    stages: tuple[Stage, ...] = field(default=())

    @property
    def dedups(self) -> tuple[DedupOp, ...]:
        return tuple(s.dedup for s in self.segments if s.dedup is not None)


def op_name_args(entry: Any) -> tuple[str, dict[str, Any]]:
    """A ``process`` entry as Data-Juicer writes it: ``{name: {args}}``, ``{name: None}`` or a bare name."""
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, Mapping) and len(entry) == 1:
        ((name, args),) = entry.items()
        return str(name), dict(args or {})
    raise ValueError(f"a process entry must be one op name with its arguments, got {entry!r}")


def dedup_op(position: int, entry: Any) -> DedupOp | None:
    """The entry as a staged deduplicator, None for any other op; ValueError for a refused deduplicator."""
    name, args = op_name_args(entry)
    if name in REFUSED:
        runs = ", ".join(sorted(KINDS))
        raise ValueError(f"process[{position}] {name} {REFUSED[name]}; the deduplicators that run here: {runs}")
    if name not in KINDS:
        return None
    builder = TWINS.get(name, name)
    kept = {k: v for k, v in args.items() if builder == name or k not in RAY_ONLY_ARGS}
    return DedupOp(position=position, name=name, kind=KINDS[name], builder=builder, args=kept)


def stages_of(segments: Sequence[Segment]) -> tuple[Stage, ...]:
    """Per dedup: hash over input shards (fused with the previous dedup's filter), bucket, join; then final."""
    count = sum(1 for s in segments if s.dedup is not None)
    out: list[Stage] = []
    for d in range(count):
        out += [Stage("hash", d, "input_shards"), Stage("bucket", d, "buckets"), Stage("join", d, "one")]
    out.append(Stage("final", count, "input_shards"))
    return tuple(out)


def plan(process: Sequence[Any]) -> Plan:
    """Cut ``process`` at each deduplicator; with none, one segment and one stage (today's job)."""
    segments: list[Segment] = []
    pending: list[dict[str, Any]] = []
    for position, entry in enumerate(process):
        found = dedup_op(position, entry)
        if found is None:
            name, args = op_name_args(entry)
            pending.append({name: args})
            continue
        segments.append(Segment(tuple(pending), found))
        pending = []
    segments.append(Segment(tuple(pending), None))
    return Plan(tuple(segments), stages_of(segments))
