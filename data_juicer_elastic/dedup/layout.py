"""Where a dedup job's stage units keep their outputs and done records on the job dir (docs/DEDUP.md).

Keys only, relative to the job root (``Store`` keys): every unit writes under its own attempt's folder, so a
superseded attempt never overwrites the winner, and each unit has one create-once done record. Files per stage
grow with shards plus buckets: a hash unit writes three files, a bucket one, the join two, a final unit one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from data_juicer_elastic.dedup.plan import Kind, Plan, StageName

ROWS = "rows.jsonl"  # a unit's surviving rows, each line ``[global index, row]``
KEYS = "keys.djek"  # a hash unit's key file (dedup/keyfile.py)
INDEX = "keys.index"  # a ranged file's offsets and per-range sha256 (dedup/units.py): what a range reader verifies
OUT = "out.bin"  # a bucket's removed indices (exact) or edges (MinHash), dedup/records.py
REMOVED = "removed.djek"  # the join's removed indices, a key file bucketed by input shard
REMOVED_INDEX = "removed.index"


@dataclass(frozen=True)
class Unit:
    """One claimable unit of one stage: ``part`` is an input shard id, a bucket number, or "" for the join."""

    stage: StageName
    dedup: int
    part: str = ""

    @property
    def id(self) -> str:
        """Its lease and done-record name: no '/' and no '@' (the lease name's separator)."""
        if self.stage == "final":
            return f"final-{self.part}"
        return f"d{self.dedup}-{self.stage}" + (f"-{self.part}" if self.part else "")


@dataclass(frozen=True)
class DedupLayout:
    """One generation's dedup job: its folder (``generations/<gen>``), input shards and their first global
    indices, the bucket count, and the kind of each dedup in recipe order."""

    base: str
    shards: tuple[str, ...]
    starts: tuple[int, ...]
    buckets: int
    kinds: tuple[Kind, ...]

    @classmethod
    def of(cls, base: str, plan: Plan, shards: Sequence[str], starts: Sequence[int], buckets: int) -> DedupLayout:
        if len(shards) != len(starts) or list(starts) != sorted(starts) or buckets < 1:
            raise ValueError("shards need ascending first indices, one each, and at least one bucket")
        return cls(base.strip("/"), tuple(shards), tuple(starts), buckets, tuple(d.kind for d in plan.dedups))

    # units -----------------------------------------------------------------
    def stages(self) -> list[tuple[StageName, int]]:
        """The stages in the order they run: per dedup hash, bucket, join; then the final pass."""
        out: list[tuple[StageName, int]] = []
        for d in range(len(self.kinds)):
            out += [("hash", d), ("bucket", d), ("join", d)]
        return [*out, ("final", len(self.kinds))]

    def units(self, stage: StageName, dedup: int) -> list[Unit]:
        if stage in ("hash", "final"):
            return [Unit(stage, dedup, s) for s in self.shards]
        if stage == "bucket":
            return [Unit(stage, dedup, f"{b:05d}") for b in range(self.buckets)]
        return [Unit(stage, dedup)]

    def before(self, unit: Unit) -> tuple[StageName, int] | None:
        """The stage whose verified outputs ``unit`` reads (None: the hash of dedup 0 reads the input)."""
        order = self.stages()
        at = order.index((unit.stage, unit.dedup))
        return order[at - 1] if at else None

    # keys ------------------------------------------------------------------
    def folder(self, unit: Unit) -> str:
        if unit.stage == "final":
            return f"{self.base}/dedup/final/{unit.part}"
        return f"{self.base}/dedup/{unit.dedup}/{unit.stage}" + (f"/{unit.part}" if unit.part else "")

    def output_key(self, unit: Unit, attempt: int, name: str) -> str:
        """One output of one attempt: ``<folder>/<attempt>/<name>``, never shared by two attempts."""
        if attempt < 1:
            raise ValueError(f"attempt {attempt} of {unit.id}: attempts count from 1")
        return f"{self.folder(unit)}/{attempt:04d}/{name}"

    def done_key(self, unit: Unit) -> str:
        """The unit's done record, beside the shards' ``state/done`` (a name no shard id can take)."""
        return f"{self.base}/state/stage-done/{unit.id}.json"

    def input_key(self, shard: str) -> str:
        """An input shard as prepare wrote it (the job root's ``shards/``)."""
        return f"shards/{shard}.jsonl"


OUTPUT_NAMES: dict[str, tuple[str, ...]] = {
    "hash": (ROWS, KEYS, INDEX),
    "bucket": (OUT,),
    "join": (REMOVED, REMOVED_INDEX),
    "final": (ROWS,),
}
"""What each stage's unit writes, so a done record is checked against its stage's names."""
