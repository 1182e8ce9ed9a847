"""The manifest's shards: two columns every process holds, the rest read per shard when it is needed.

A job of 100,000 shards describes them in about 50 MB of JSON (each shard's
ranges of the input and their digests). Held as Python objects in every
worker that is 180 MB a process, and 256 workers on one machine do not fit.
So prepare writes the per-shard facts to ``shards/_table.jsonl`` (line *i*
is shard *i*), in blocks of ``BLOCK`` lines whose sha256 ``manifest.json``
records beside the ``rows`` and ``bytes`` columns (the only per-shard facts
the claim loop, the sweep and ``status`` need). A reader checks every block
once when it loads the manifest (a streamed hash, nothing kept), and again
each time it reads one back, so a table edited after prepare is refused as an
edited manifest is. Ids and paths are not stored: they follow from the index.
"""

from __future__ import annotations

import hashlib
import io
import itertools
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import orjson

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.storage.store import Store

TABLE_NAME = "shards/_table.jsonl"  # inside shards/: published by the same rename, so racing prepares agree
BLOCK = 64  # lines a block: one read of about 30 KB per claim, a hash per 64 shards in manifest.json


def shard_id(index: int, count: int) -> str:
    return f"part-{index:05d}-of-{count:05d}"


def shard_index(sid: str, count: int) -> int | None:
    """The index ``sid`` names in a job of ``count`` shards, or None when it names no shard of it."""
    try:
        _, index, _, _ = sid.split("-")
        i = int(index)
    except ValueError:
        return None
    return i if 0 <= i < count and shard_id(i, count) == sid else None


@dataclass(frozen=True)
class ShardSource:
    """A contiguous byte range of one input file inside a shard."""

    file: str
    start: int
    end: int
    first_line: int  # 1-based line number of the range's first line in ``file``
    sha256: str  # of the range's lines as read, each ending in a newline (one is added at a file's end)


@dataclass(frozen=True)
class ShardSpec:
    id: str
    path: str  # relative to the job directory
    rows: int
    bytes: int
    sha256: str
    first_row: int  # global 0-based index of the shard's first row
    sources: tuple[ShardSource, ...] = ()
    longest_line: int | None = None  # bytes, newline included (None: prepared before schema 5)


_LINE_KEYS = frozenset(("rows", "bytes", "sha256", "first_row", "sources", "longest_line"))


def _line(spec: ShardSpec) -> bytes:
    d = {k: getattr(spec, k) for k in _LINE_KEYS}
    d["sources"] = [dict(vars(s)) for s in spec.sources]
    return orjson.dumps(d, option=orjson.OPT_SORT_KEYS) + b"\n"


class ShardTable(Sequence[ShardSpec]):
    """The job's shards in order: ``rows`` and ``bytes`` held, each ``ShardSpec`` built when asked for.

    ``ShardTable.of(specs)`` holds specs already made (prepare; a manifest of
    schema 5 or older, which listed them inline); ``ShardTable.load(store,
    key, ...)`` reads them from the table file, a block at a time.
    """

    def __init__(self, rows: array, sizes: array, blocks: Any) -> None:
        self.rows, self.bytes, self._blocks = rows, sizes, blocks
        self._index: tuple[dict[str, Any], bytes] | None = None  # made once: seal and write both need it

    @classmethod
    def of(cls, specs: Sequence[ShardSpec]) -> ShardTable:
        specs = tuple(specs)
        return cls(array("q", (s.rows for s in specs)), array("q", (s.bytes for s in specs)), _Held(specs))

    @classmethod
    def load(cls, store: Store, key: str, name: str, index: dict[str, Any], where: str) -> ShardTable:
        """The table at ``key`` of the job's ``store`` (``name``: as messages spell it) as ``index``
        (manifest.json's ``shard_table``) describes it, every block checked."""
        try:
            rows, sizes = array("q", index["rows"]), array("q", index["bytes"])
            ends, digests = list(index["block_ends"]), list(index["block_sha256"])
            if index["block_rows"] != BLOCK or len(rows) != len(sizes) or len(ends) != len(digests):
                raise ValueError("columns and blocks disagree")
            if len(ends) != -(-len(rows) // BLOCK) or any(b <= a for a, b in zip([0, *ends], ends, strict=False)):
                raise ValueError("block ends do not cover the shards")
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise IntegrityError(f"{where}: malformed shard_table ({exc!r}); prepare the job again") from exc
        blocks = _Stored(store, key, name, ends, digests, rows, sizes)
        blocks.check_all()
        return cls(rows, sizes, blocks)

    def index(self) -> tuple[dict[str, Any], bytes]:
        """manifest.json's ``shard_table`` record and the table file's bytes (prepare writes both)."""
        if self._index is None:
            self._index = self._make_index()
        return self._index

    def _make_index(self) -> tuple[dict[str, Any], bytes]:
        ends, digests, data = [], [], bytearray()
        specs = list(self)
        for b in range(0, len(specs), BLOCK):
            block = b"".join(_line(s) for s in specs[b : b + BLOCK])
            data += block
            ends.append(len(data))
            digests.append(hashlib.sha256(block).hexdigest())
        record = {
            "file": TABLE_NAME,
            "block_rows": BLOCK,
            "block_ends": ends,
            "block_sha256": digests,
            "rows": list(self.rows),
            "bytes": list(self.bytes),
        }
        return record, bytes(data)

    def ids(self) -> list[str]:
        """Every shard's id in order (made from the index: nothing is read)."""
        n = len(self.rows)
        return [shard_id(i, n) for i in range(n)]

    def position(self, sid: str) -> int | None:
        """The index of shard ``sid`` in this job, or None when it names no shard of it."""
        return shard_index(sid, len(self.rows))

    def rows_by_id(self) -> Mapping[str, int]:
        """Each shard's rows by its id, a view of the column (no dict of 100,000 entries is built)."""
        return ColumnById(self, self.rows)

    def bytes_by_id(self) -> Mapping[str, int]:
        """Each shard's bytes by its id, a view of the column."""
        return ColumnById(self, self.bytes)

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> ShardSpec: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[ShardSpec]: ...
    def __getitem__(self, i: int | slice) -> ShardSpec | Sequence[ShardSpec]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._blocks.block(i // BLOCK)[i % BLOCK]

    def __iter__(self) -> Iterator[ShardSpec]:
        for b in range(-(-len(self) // BLOCK)):
            yield from self._blocks.block(b)

    def __eq__(self, other: object) -> bool:
        """The same shards (read whole: for tests and prepare's own comparisons, not a hot path)."""
        if not isinstance(other, ShardTable):
            return NotImplemented
        return self.rows == other.rows and self.bytes == other.bytes and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  (mutable columns: equal tables need not hash alike)


class ColumnById(Mapping[str, int]):
    """One column of a table looked up by shard id (an id of another job is not in it)."""

    def __init__(self, table: ShardTable, column: array) -> None:
        self._table, self._column = table, column

    def __getitem__(self, sid: str) -> int:
        i = self._table.position(sid) if isinstance(sid, str) else None
        if i is None:
            raise KeyError(sid)
        return self._column[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table.ids())

    def __len__(self) -> int:
        return len(self._column)


class _Held:
    """Specs already in memory."""

    def __init__(self, specs: tuple[ShardSpec, ...]) -> None:
        self._specs = specs

    def block(self, b: int) -> Sequence[ShardSpec]:
        return self._specs[b * BLOCK : (b + 1) * BLOCK]


class _Stored:
    """Blocks of the table file, each checked against its digest when read; the last one read is kept."""

    def __init__(
        self, store: Store, key: str, name: str, ends: list[int], digests: list[str], rows: array, sizes: array
    ) -> None:
        self.store, self.key, self.path = store, key, name
        self.ends, self.digests, self.rows, self.sizes = ends, digests, rows, sizes
        self.count = len(rows)
        self._last: tuple[int, list[ShardSpec]] | None = None
        self._first_rows: array | None = None  # each shard's first row, summed from ``rows`` when first needed

    def check_all(self) -> None:
        """Hash every block once, streamed (nothing kept)."""
        stream = self.store.open_read(self.key)
        if stream is None:
            raise self._missing()
        with io.BufferedReader(stream) as f:  # read(n): n bytes, fewer only at the end (a raw read may be short)
            for b in range(len(self.ends)):
                self._checked(b, f.read(self._length(b)))
            if f.read(1):
                raise self._edited("its end (bytes after the last block)")

    def block(self, b: int) -> list[ShardSpec]:
        if self._last is not None and self._last[0] == b:
            return self._last[1]
        start = self.ends[b - 1] if b else 0
        data = self.store.open_range(self.key, start, self.ends[b])  # POSIX: one pread
        if data is None:
            raise self._missing()
        data = self._checked(b, data)
        first = b * BLOCK
        try:
            specs = [_spec(first + k, self.count, orjson.loads(line)) for k, line in enumerate(data.splitlines())]
        except (KeyError, TypeError, ValueError) as exc:
            raise IntegrityError(f"{self.path}: malformed shard line in block {b} ({exc!r}); prepare again") from exc
        if len(specs) != min(BLOCK, self.count - first):
            raise IntegrityError(f"{self.path}: block {b} holds {len(specs)} shards; prepare the job again")
        for i, s in enumerate(specs, first):  # a table resealed by hand must still agree with its columns
            if (s.rows, s.bytes, s.first_row) != (self.rows[i], self.sizes[i], self.first_row(i)):
                raise IntegrityError(
                    f"{self.path}: shard {s.id} says {s.rows} rows, {s.bytes} bytes from row {s.first_row}; "
                    f"manifest.json says {self.rows[i]}, {self.sizes[i]} from {self.first_row(i)}; prepare again"
                )
        self._last = b, specs
        return specs

    def first_row(self, i: int) -> int:
        if self._first_rows is None:
            self._first_rows = array("q", itertools.accumulate(self.rows[:-1], initial=0)) if self.count else array("q")
        return self._first_rows[i]

    def _length(self, b: int) -> int:
        return self.ends[b] - (self.ends[b - 1] if b else 0)

    def _missing(self) -> IntegrityError:
        return IntegrityError(f"{self.path}: missing (manifest.json's shards are there); prepare again")

    def _checked(self, b: int, data: bytes) -> bytes:
        if len(data) != self._length(b) or hashlib.sha256(data).hexdigest() != self.digests[b]:
            raise self._edited(f"block {b} (shards {b * BLOCK} to {min((b + 1) * BLOCK, self.count) - 1})")
        return data

    def _edited(self, what: str) -> IntegrityError:
        return IntegrityError(
            f"{self.path}: {what} was edited after prepare (it does not match manifest.json's digest); "
            "restore it, or prepare the job again in a new job dir"
        )


def _spec(i: int, count: int, d: dict[str, Any]) -> ShardSpec:
    if d.keys() != _LINE_KEYS:
        raise ValueError(f"keys {sorted(d)}")
    sid = shard_id(i, count)
    sources = tuple(ShardSource(**s) for s in d["sources"])
    return ShardSpec(sid, f"shards/{sid}.jsonl", **{**d, "sources": sources})
