"""What ``dj-elastic status``, ``--watch``, the console's progress line, the PASS line and the report say of a
job's dedup stages: per dedup, each stage's units done / total, its failed units, and once its join is done the
rows it removed.

Bounded whatever the job's size: the recipe snapshot (one read), one listing of ``state/stage-done`` and one of
``state/failed``, and per dedup whose join is done that one done record (the join keeps its removed count there;
a record from before it did: two small ranged reads of the removed file's header and table). No row is read, no
other unit's done record. A job without deduplicators costs the recipe read and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from data_juicer_elastic.dedup import keyfile, units
from data_juicer_elastic.dedup.driver import layout_of
from data_juicer_elastic.dedup.layout import REMOVED, DedupLayout, Unit
from data_juicer_elastic.dedup.plan import Plan, plan
from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.job.layout import JobDir

PRE_FINAL = ("hash", "bucket", "join")


@dataclass
class DedupProgress:
    """One dedup of the recipe: ``stages`` maps hash, bucket and join to [done, total] units."""

    dedup: int
    op: str
    kind: str
    stages: dict[str, list[int]]
    removed: int | None = None  # rows its join removed, once the join is done
    failed: list[str] = field(default_factory=list)  # its units failed past their budget

    @property
    def done(self) -> bool:
        return self.removed is not None

    def current(self) -> str:
        """The first stage not done, as ``bucket 2/4``; the removed rows once the join is done."""
        if self.removed is not None:
            return f"removed {self.removed} rows"
        for stage in PRE_FINAL:
            done, total = self.stages[stage]
            if done < total:
                return f"{stage} {done}/{total}"
        return "join done"


def recipe_plan(job: JobDir) -> Plan | None:
    """The generation's recipe snapshot cut at its deduplicators; None without one (or without a readable
    snapshot: a job dir from before snapshots, a refused deduplicator, which never ran)."""
    got = job.store.read(job.key(job.recipe_path))
    if got is None:
        return None
    try:
        recipe = yaml.safe_load(got[0])
        found = plan(list(recipe.get("process") or [])) if isinstance(recipe, dict) else None
    except (ValueError, TypeError, yaml.YAMLError):
        return None
    return found if found is not None and found.dedups else None


def dedup_layout(job: JobDir) -> tuple[Plan, DedupLayout] | None:
    """The job's dedup plan and layout; None for a job without deduplicators (or on Parquet input, refused)."""
    found = recipe_plan(job)
    if found is None:
        return None
    try:
        return found, layout_of(job, found)
    except ElasticError:
        return None


def done_folder(layout: DedupLayout) -> str:
    return layout.done_key(Unit("join", 0)).rsplit("/", 1)[0]


def removed_rows(job: JobDir, layout: DedupLayout, dedup: int) -> int | None:
    """Rows join ``dedup`` removed, from its done record (None while it is not done)."""
    done = units.load_done(job.store, layout, Unit("join", dedup))
    if done is None:
        return None
    if done.removed >= 0:
        return done.removed
    out = done.outputs[REMOVED]  # a record from before joins kept the count: the removed file's header says it
    return keyfile.read_table(keyfile.from_store(job.store, out.key), out.key).header.count


def dedup_progress(job: JobDir, known: dict[int, int] | None = None) -> list[DedupProgress]:
    """Every dedup's progress ([] for a job without any). ``known``: removed counts read before (a watcher's
    cache: a join's done record is create-once), filled in here."""
    found = dedup_layout(job)
    if found is None:
        return []
    return progress_of(job, *found, known if known is not None else {})


def progress_of(job: JobDir, found: Plan, layout: DedupLayout, known: dict[int, int]) -> list[DedupProgress]:
    """``dedup_progress`` for a layout already known: two listings, one read per join done and not yet known."""
    done = {n[:-5] for n in job.store.names(done_folder(layout)) if n.endswith(".json")}
    failed = job.failed_ids()
    out = []
    for d, op in enumerate(found.dedups):
        stages: dict[str, list[int]] = {}
        lost: list[str] = []
        for stage in PRE_FINAL:
            ids = [u.id for u in layout.units(stage, d)]  # type: ignore[arg-type]
            stages[stage] = [sum(1 for i in ids if i in done), len(ids)]
            lost += [i for i in ids if i in failed]
        if stages["join"][0] and d not in known:
            removed = removed_rows(job, layout, d)
            if removed is not None:
                known[d] = removed
        out.append(DedupProgress(d, op.name, op.kind, stages, known.get(d), lost))
    return out


def brief(progress: list[DedupProgress]) -> str:
    """``dedup: d0 exact removed 40 rows, d1 minhash bucket 2/4`` ("" without dedups): the progress and PASS
    lines' words."""
    if not progress:
        return ""
    return "dedup: " + ", ".join(f"d{p.dedup} {p.kind} {p.current()}" for p in progress)


def stage_lines(progress: list[DedupProgress]) -> list[str]:
    """``dj-elastic status``'s lines, one per dedup (none without dedups)."""
    lines = []
    for p in progress:
        counts = ", ".join(f"{stage} {p.stages[stage][0]}/{p.stages[stage][1]}" for stage in PRE_FINAL)
        removed = f"; removed {p.removed} rows" if p.removed is not None else ""
        failed = f"; failed past the retry budget: {' '.join(p.failed)}" if p.failed else ""
        lines.append(f"dedup d{p.dedup} {p.op} ({p.kind}): {counts}{removed}{failed}")
    return lines
