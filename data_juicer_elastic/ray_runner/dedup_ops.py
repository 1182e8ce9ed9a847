"""The recipe's code for the dedup stages (dedup/units.py): each segment's ops and each dedup's keys.

A segment before a dedup runs in-process through Data-Juicer's own ``NestedDataset.process`` with the ops built by
``load_ops`` from the parsed recipe, as the default executor runs them; each row carries its global input index in
one extra column, which Mappers and Filters pass through unchanged (checked: it must come back ascending and
unique, or the segment is refused). The keys come from the dedup op's own ``compute_hash`` (dedup_keys.py). The
last segment is no part of this: the classic shard attempt runs it (runner.py) on :func:`driver.final_rows`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from data_juicer_elastic.dedup import units
from data_juicer_elastic.dedup.plan import Plan, plan
from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.ray_runner import dedup_keys

INDEX_COLUMN = "__dj_elastic_index__"


def recipe_plan(cfg: Any) -> Plan:
    """The parsed recipe's ``process`` cut at its deduplicators (the arguments as Data-Juicer filled them in)."""
    return plan(list(cfg.process or []))


def last_segment(cfg: Any, found: Plan) -> list[dict[str, Any]]:
    """The entries of ``cfg.process`` after the last dedup: what the final pass runs (an attempt's own copy)."""
    last = found.dedups[-1].position
    return list((cfg.process or [])[last + 1 :])


def segment(entries: Sequence[dict[str, Any]]) -> units.Segment | None:
    """The per-row ops ``entries`` over (global index, row) pairs; None for an empty segment."""
    if not entries:
        return None
    from data_juicer.ops import load_ops

    ops = load_ops([dict(e) for e in entries])
    names = [next(iter(e)) for e in entries]

    def run(pairs: units.Pairs) -> units.Pairs:
        if not pairs:
            return []
        from data_juicer.core.data import NestedDataset

        dataset = NestedDataset.from_list([{**row, INDEX_COLUMN: i} for i, row in pairs])
        rows = dataset.process(ops, open_monitor=False).to_list()
        out = [(row.pop(INDEX_COLUMN), row) for row in rows]
        indices = [i for i, _ in out]
        if not set(indices) <= {i for i, _ in pairs} or indices != sorted(set(indices)):
            raise IntegrityError(
                f"ops {names} did not keep the rows' global index column {INDEX_COLUMN!r} as it came in "
                "(a row added, copied or reordered); such ops cannot run before a deduplicator"
            )
        return [(int(i), row) for i, row in out]

    return run


def hasher(dedup: Any) -> units.Hasher:
    """One dedup's keys from its own op (for a ``ray_*`` variant its twin), built with the recipe's arguments."""
    op = dedup_keys.build_op(dedup)
    kind = dedup.kind

    def keys_for(rows: list[units.Row]) -> list[list[bytes]]:
        return [dedup_keys.row_keys(op, kind, row) for row in rows]

    return units.Hasher(keys_for, dedup_keys.key_length(op, kind))


def stage_ops(cfg: Any, found: Plan) -> units.Ops:
    """Every dedup's hasher and every segment's ops; the last segment stays None (the classic attempt runs it)."""
    segments = [segment(s.ops) if s.dedup is not None else None for s in found.segments]
    return units.Ops([hasher(d) for d in found.dedups], segments)
