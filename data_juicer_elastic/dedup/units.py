"""The stage units of a dedup job on the job dir: each reads only verified outputs of the stage before, writes
under its own attempt's keys, and ends in a create-once done record holding each output's size and sha256.

A unit is a function of the store, the unit and the recipe's per-row code, so a kill anywhere redoes that one
unit and a retried read changes nothing. What a unit reads it checks against the done record that published it
(invariant 5): a whole file by its size and sha256; a byte range (a bucket's slice of a key file, a shard's slice
of the join's removed file) by the range's own sha256, listed in a small index file whose sha256 the done record
holds, so a range reader never reads the whole file to trust its slice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from data_juicer_elastic.dedup import decide, join, keyfile, records
from data_juicer_elastic.dedup.layout import (
    INDEX,
    KEYS,
    OUT,
    OUTPUT_NAMES,
    REMOVED,
    REMOVED_INDEX,
    ROWS,
    DedupLayout,
    Unit,
)
from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.storage.store import Store

Row = dict[str, Any]
Pairs = list[tuple[int, Row]]
Segment = Callable[[Pairs], Pairs]
"""A segment's per-row ops over (global index, row) pairs: they may drop rows, never renumber them."""

INDEX_HEAD = struct.Struct("<4sIH")  # magic, ranges, key length
INDEX_MAGIC = b"DJEX"
U64 = struct.Struct("<Q")
SHA = 32


@dataclass(frozen=True)
class Hasher:
    """One dedup's keys: ``keys_for(rows)`` gives each row's keys (Data-Juicer's op, via ray_runner/dedup_keys),
    all ``key_len`` bytes long; passed in so this module needs neither Data-Juicer nor Ray."""

    keys_for: Callable[[list[Row]], list[list[bytes]]]
    key_len: int


@dataclass(frozen=True)
class Ops:
    """The recipe's code: a hasher per dedup, and per segment its ops (None: no op), the last one's run by final."""

    hashers: Sequence[Hasher]
    segments: Sequence[Segment | None]


@dataclass(frozen=True)
class Output:
    key: str
    size: int
    sha256: str


@dataclass(frozen=True)
class UnitDone:
    """A unit's done record: the attempt that won and what it wrote (first publication wins)."""

    unit: str
    attempt: int
    outputs: dict[str, Output]
    rows: int = -1  # rows written (hash, final); -1 where a unit writes none
    host: str = ""
    pid: int = 0
    removed: int = -1  # rows a join removed (what status and the PASS line say); -1 for other units

    def to_json(self) -> bytes:
        outs = {n: {"key": o.key, "size": o.size, "sha256": o.sha256} for n, o in sorted(self.outputs.items())}
        body = {"unit": self.unit, "attempt": self.attempt, "outputs": outs, "rows": self.rows}
        if self.removed >= 0:
            body["removed"] = self.removed
        return orjson.dumps({**body, "host": self.host, "pid": self.pid}, option=orjson.OPT_SORT_KEYS)


# --------------------------------------------------------------------------- done records
def publish(store: Store, layout: DedupLayout, unit: Unit, done: UnitDone) -> bool:
    """Create the unit's done record unless one is there; True if this call did (first wins). The caller
    checks its lease is still current first, as a shard's publish does (invariant 14)."""
    return store.create(layout.done_key(unit), done.to_json()) is not None


def is_done(store: Store, layout: DedupLayout, unit: Unit) -> bool:
    return store.head(layout.done_key(unit)) is not None


def load_done(store: Store, layout: DedupLayout, unit: Unit) -> UnitDone | None:
    """The unit's done record, every field checked against the layout; None when there is none yet."""
    key = layout.done_key(unit)
    got = store.read(key)
    if got is None:
        return None
    try:
        raw = orjson.loads(got[0])
        attempt = raw["attempt"]
        if raw["unit"] != unit.id or type(attempt) is not int or attempt < 1:
            raise ValueError(f"names unit {raw['unit']!r}, attempt {attempt!r}")
        outputs = {n: Output(o["key"], int(o["size"]), str(o["sha256"])) for n, o in raw["outputs"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IntegrityError(f"{key}: not a done record of {unit.id} ({exc}); archive it and rerun the unit") from exc
    names = OUTPUT_NAMES[unit.stage]
    if sorted(outputs) != sorted(names):
        raise IntegrityError(f"{key}: outputs {sorted(outputs)}, a {unit.stage} unit writes {sorted(names)}")
    for name, out in outputs.items():
        if out.key != layout.output_key(unit, attempt, name):
            raise IntegrityError(f"{key}: output {name} at {out.key!r}, not attempt {attempt}'s own key")
    rows, removed = int(raw.get("rows", -1)), int(raw.get("removed", -1))
    return UnitDone(unit.id, attempt, outputs, rows, str(raw.get("host", "")), removed=removed)


def verified_inputs(store: Store, layout: DedupLayout, units: Iterable[Unit]) -> list[UnitDone]:
    """The done records a unit reads; a missing one means the stage before is not done: refuse."""
    found = []
    for unit in units:
        done = load_done(store, layout, unit)
        if done is None:
            raise IntegrityError(f"{layout.done_key(unit)}: missing; {unit.id} is not done, so nothing reads it")
        found.append(done)
    return found


# --------------------------------------------------------------------------- outputs, checked both ways
def _put(store: Store, key: str, data: bytes) -> Output:
    """Create ``key`` (this attempt's own) and re-read it: what the done record holds is what is there."""
    if store.create(key, data) is None:
        raise IntegrityError(f"{key}: already there; an attempt's output is written by that attempt alone")
    got = store.read(key)
    back = None if got is None else got[0]
    if back != data:
        raise IntegrityError(f"{key}: reads back other bytes than were written")
    return Output(key, len(data), hashlib.sha256(data).hexdigest())


def fetch(store: Store, out: Output) -> bytes:
    """A whole output, refused unless its size and sha256 are the done record's."""
    got = store.read(out.key)
    if got is None:
        raise IntegrityError(f"{out.key}: missing, though its done record names it; rerun the unit that wrote it")
    data = got[0]
    if len(data) != out.size or hashlib.sha256(data).hexdigest() != out.sha256:
        raise IntegrityError(
            f"{out.key}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:12]}…; its done record says "
            f"{out.size} bytes, {out.sha256[:12]}…: it changed after it was verified; rerun the unit that wrote it"
        )
    return data


def index_of(data: bytes) -> bytes:
    """A key file's range index: its offsets and one sha256 per bucket's byte range."""
    table = keyfile.read_table(keyfile.from_bytes(data))
    spans = [table.span(b) for b in range(table.header.buckets)]
    digests = b"".join(hashlib.sha256(data[a:z]).digest() for a, z in spans)
    offsets = b"".join(U64.pack(o) for o in table.offsets)
    return INDEX_HEAD.pack(INDEX_MAGIC, table.header.buckets, table.header.key_len) + offsets + digests


def read_range(store: Store, data: Output, index: Output, part: int) -> list[tuple[bytes, int]]:
    """One bucket's records of a key file, trusted by the index the done record vouches for: two reads."""
    raw = fetch(store, index)
    magic, count, key_len = INDEX_HEAD.unpack_from(raw)
    if magic != INDEX_MAGIC or len(raw) != INDEX_HEAD.size + U64.size * (count + 1) + SHA * count:
        raise IntegrityError(f"{index.key}: not a range index")
    if not 0 <= part < count:
        raise ValueError(f"{data.key}: range {part} out of its {count}")
    at = INDEX_HEAD.size + U64.size * part
    start, end = U64.unpack_from(raw, at)[0], U64.unpack_from(raw, at + U64.size)[0]
    want = raw[INDEX_HEAD.size + U64.size * (count + 1) + SHA * part :][:SHA]
    got = store.open_range(data.key, start, end) if end > start else b""
    if got is None or len(got) != end - start or hashlib.sha256(got).digest() != want:
        raise IntegrityError(
            f"{data.key}: bytes [{start}, {end}) are not what its done record's index says; "
            "it changed after it was verified; rerun the unit that wrote it"
        )
    return list(keyfile.decode_records(got, key_len))


def _rows_file(pairs: Pairs) -> bytes:
    return b"".join(orjson.dumps([i, r]) + b"\n" for i, r in pairs)


def _rows_of(data: bytes) -> Pairs:
    return [(int(i), r) for i, r in (orjson.loads(line) for line in data.splitlines() if line)]


def _done(unit: Unit, attempt: int, outputs: dict[str, Output], rows: int = -1) -> UnitDone:
    return UnitDone(unit.id, attempt, outputs, rows, socket.gethostname(), os.getpid())


# --------------------------------------------------------------------------- the units
def surviving_rows(store: Store, layout: DedupLayout, shard: str, dedup: int, segment: Segment | None) -> Pairs:
    """An input shard's rows as segment ``dedup`` leaves them: dedup 0 reads the input; later ones the shard's
    rows of hash ``dedup - 1`` minus what join ``dedup - 1`` removed, its one byte range of the join's file."""
    if dedup == 0:
        got = store.read(layout.input_key(shard))
        if got is None:
            raise IntegrityError(f"{layout.input_key(shard)}: input shard missing")
        first = layout.starts[layout.shards.index(shard)]
        pairs = [(first + n, orjson.loads(line)) for n, line in enumerate(got[0].splitlines()) if line.strip()]
    else:
        hashed, joined = verified_inputs(store, layout, [Unit("hash", dedup - 1, shard), Unit("join", dedup - 1)])
        rows = _rows_of(fetch(store, hashed.outputs[ROWS]))
        part = layout.shards.index(shard)
        removed = {i for _, i in read_range(store, joined.outputs[REMOVED], joined.outputs[REMOVED_INDEX], part)}
        pairs = [(i, r) for i, r in rows if i not in removed]
    return pairs if segment is None else segment(pairs)


def hash_unit(store: Store, layout: DedupLayout, unit: Unit, attempt: int, ops: Ops) -> UnitDone:
    """Segment ``d``'s rows of one input shard and their key file (one file whatever the bucket count)."""
    pairs = surviving_rows(store, layout, unit.part, unit.dedup, ops.segments[unit.dedup])
    hasher = ops.hashers[unit.dedup]
    keys = hasher.keys_for([r for _, r in pairs]) if pairs else []
    recs = [(keyfile.bucket_of(k, layout.buckets), k, i) for (i, _), ks in zip(pairs, keys, strict=True) for k in ks]
    data = keyfile.encode(recs, layout.buckets, hasher.key_len)
    outputs = {
        ROWS: _put(store, layout.output_key(unit, attempt, ROWS), _rows_file(pairs)),
        KEYS: _put(store, layout.output_key(unit, attempt, KEYS), data),
        INDEX: _put(store, layout.output_key(unit, attempt, INDEX), index_of(data)),
    }
    return _done(unit, attempt, outputs, len(pairs))


def bucket_unit(
    store: Store, layout: DedupLayout, unit: Unit, attempt: int, ops: Ops, pause: Callable[[], None] | None = None
) -> UnitDone:
    """One bucket's decision from its slice of every hash shard's key file. ``pause``: called once its output
    is written and before it returns (a test's kill point: the attempt's output exists, no done record yet)."""
    bucket = int(unit.part)
    hashed = verified_inputs(store, layout, [Unit("hash", unit.dedup, s) for s in layout.shards])
    slices = [read_range(store, h.outputs[KEYS], h.outputs[INDEX], bucket) for h in hashed]
    if layout.kinds[unit.dedup] == "exact":
        data = records.encode_indices(decide.exact_removed(slices))
    else:
        data = records.encode_edges(decide.minhash_edges(slices))
    outputs = {OUT: _put(store, layout.output_key(unit, attempt, OUT), data)}
    if pause is not None:
        pause()
    return _done(unit, attempt, outputs)


def join_unit(store: Store, layout: DedupLayout, unit: Unit, attempt: int, ops: Ops) -> UnitDone:
    """Every bucket's output into one removed-index file, bucketed by input shard, with its range index."""
    buckets = layout.units("bucket", unit.dedup)
    outs = [fetch(store, d.outputs[OUT]) for d in verified_inputs(store, layout, buckets)]
    if layout.kinds[unit.dedup] == "exact":
        removed = join.exact_removed(records.decode_indices(o) for o in outs)
    else:
        removed = join.minhash_removed(records.decode_edges(o) for o in outs)
    data = join.removed_file(removed, layout.starts)
    outputs = {
        REMOVED: _put(store, layout.output_key(unit, attempt, REMOVED), data),
        REMOVED_INDEX: _put(store, layout.output_key(unit, attempt, REMOVED_INDEX), index_of(data)),
    }
    return dataclasses.replace(_done(unit, attempt, outputs), removed=len(removed))


def final_unit(store: Store, layout: DedupLayout, unit: Unit, attempt: int, ops: Ops) -> UnitDone:
    """The last segment over one input shard's surviving rows: the rows the output shard holds, in order."""
    pairs = surviving_rows(store, layout, unit.part, unit.dedup, ops.segments[unit.dedup])
    rows = _put(store, layout.output_key(unit, attempt, ROWS), _rows_file(pairs))
    return _done(unit, attempt, {ROWS: rows}, len(pairs))


RUNNERS = {"hash": hash_unit, "bucket": bucket_unit, "join": join_unit, "final": final_unit}


def run_unit(store: Store, layout: DedupLayout, unit: Unit, attempt: int, ops: Ops, **kw: Any) -> UnitDone:
    """Run one attempt of ``unit``: its outputs written and re-read, its done record not yet published."""
    return RUNNERS[unit.stage](store, layout, unit, attempt, ops, **kw)


def units_pending(store: Store, layout: DedupLayout) -> list[Unit]:
    """The units claimable now: those not done of the first stage not wholly done ([] once final is done).
    One ``head`` per unit up to that stage: a driver for tests and benchmarks, not the worker's hot path."""
    for stage, dedup in layout.stages():
        pending = [u for u in layout.units(stage, dedup) if not is_done(store, layout, u)]
        if pending:
            return pending
    return []


def kept_rows(store: Store, layout: DedupLayout) -> Pairs:
    """Every final unit's verified rows, in input order: what the merge will write."""
    finals = verified_inputs(store, layout, layout.units("final", len(layout.kinds)))
    return [p for d in finals for p in _rows_of(fetch(store, d.outputs[ROWS]))]
