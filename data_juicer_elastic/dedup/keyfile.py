"""One file of fixed-length (bucket, key, index) records, sorted by bucket, with an offset table up front.

A hash shard writes one such file whatever the bucket count, and a bucket reads only its own byte range of each
(two ranged reads, or one once a reader keeps the file's table): files grow with shards plus buckets, never with
their product. The same layout, with empty keys and input shards as buckets, carries removed indices to the
filter pass. Layout: ``DJEK`` magic, version, bucket count, key length, record count; ``buckets + 1`` absolute
offsets (u64, little-endian); the records, each ``key`` bytes then the index as u64, sorted by (bucket, key,
index) so a bucket's readers merge shards' slices in one pass.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from data_juicer_elastic.errors import IntegrityError

MAGIC = b"DJEK"
VERSION = 1
HEADER = struct.Struct("<4sHIHQ")  # magic, version, buckets, key length, record count
OFFSET = struct.Struct("<Q")
INDEX = struct.Struct("<Q")

ReadRange = Callable[[int, int], "bytes | None"]
"""Bytes ``[start, end)`` of one file, short at its end, None when missing (``Store.open_range`` bound to a key)."""


@dataclass(frozen=True)
class Header:
    buckets: int
    key_len: int
    count: int

    @property
    def table_end(self) -> int:
        return HEADER.size + OFFSET.size * (self.buckets + 1)

    @property
    def record_size(self) -> int:
        return self.key_len + INDEX.size

    @property
    def size(self) -> int:
        return self.table_end + self.count * self.record_size


def bucket_of(key: bytes, buckets: int) -> int:
    """Where a key goes: the same bucket on every node and run (never Python's salted ``hash``), spread evenly
    even where the key's leading bytes are not (MinHash band values start with four zero bytes)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % buckets


def encode(records: Iterable[tuple[int, bytes, int]], buckets: int, key_len: int) -> bytes:
    """The file for ``records`` (bucket, key, index); a key of another length or a bucket out of range is a bug."""
    ordered = sorted(records)
    counts = [0] * (buckets + 1)
    body = bytearray()
    for bucket, key, index in ordered:
        if not 0 <= bucket < buckets or len(key) != key_len:
            raise ValueError(f"record ({bucket}, {key!r}) does not fit {buckets} buckets of {key_len}-byte keys")
        counts[bucket + 1] += 1
        body += key
        body += INDEX.pack(index)
    head = Header(buckets, key_len, len(ordered))
    offsets, at = [], head.table_end
    for b in range(buckets + 1):
        at += counts[b] * head.record_size
        offsets.append(at)
    table = b"".join(OFFSET.pack(o) for o in offsets)
    return HEADER.pack(MAGIC, VERSION, buckets, key_len, len(ordered)) + table + bytes(body)


def _header(data: bytes, where: str) -> Header:
    if len(data) < HEADER.size:
        raise IntegrityError(f"{where}: cut before the end of its header")
    magic, version, buckets, key_len, count = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise IntegrityError(f"{where}: not a key file of version {VERSION} ({magic!r}, {version})")
    return Header(buckets, key_len, count)


@dataclass(frozen=True)
class Table:
    """A key file's header and offsets: read once per file, then one ranged read per bucket."""

    header: Header
    offsets: tuple[int, ...]

    def span(self, bucket: int) -> tuple[int, int]:
        return self.offsets[bucket], self.offsets[bucket + 1]


def read_table(read: ReadRange, where: str = "key file") -> Table:
    """Header and offset table in two reads; a missing file, a cut table or offsets that disagree raise."""
    head = _header(_need(read, 0, HEADER.size, where), where)
    raw = _need(read, HEADER.size, head.table_end, where)
    offsets = tuple(o for (o,) in OFFSET.iter_unpack(raw))
    if offsets[0] != head.table_end or offsets[-1] != head.size or list(offsets) != sorted(offsets):
        raise IntegrityError(f"{where}: offset table disagrees with its {head.count} records")
    return Table(head, offsets)


def read_bucket(read: ReadRange, table: Table, bucket: int, where: str = "key file") -> list[tuple[bytes, int]]:
    """One bucket's (key, index) records, in (key, index) order, from one ranged read."""
    start, end = table.span(bucket)
    if start == end:
        return []
    return list(decode_records(_need(read, start, end, where), table.header.key_len))


def read_one(read: ReadRange, bucket: int, where: str = "key file") -> list[tuple[bytes, int]]:
    """One bucket without the whole offset table (a reader that wants one bucket of a file with many): header,
    its two offsets, its records; three small reads whatever the bucket count."""
    head = _header(_need(read, 0, HEADER.size, where), where)
    if not 0 <= bucket < head.buckets:
        raise ValueError(f"{where}: bucket {bucket} out of its {head.buckets}")
    at = HEADER.size + OFFSET.size * bucket
    start, end = (o for (o,) in OFFSET.iter_unpack(_need(read, at, at + 2 * OFFSET.size, where)))
    if not head.table_end <= start <= end <= head.size:
        raise IntegrityError(f"{where}: bucket {bucket} spans [{start}, {end}) outside its records")
    if start == end:
        return []
    return list(decode_records(_need(read, start, end, where), head.key_len))


def decode_records(data: bytes, key_len: int) -> Iterator[tuple[bytes, int]]:
    size = key_len + INDEX.size
    for at in range(0, len(data), size):
        yield data[at : at + key_len], INDEX.unpack_from(data, at + key_len)[0]


def _need(read: ReadRange, start: int, end: int, where: str) -> bytes:
    data = read(start, end)
    if data is None:
        raise IntegrityError(f"{where}: missing")
    if len(data) != end - start:
        raise IntegrityError(f"{where}: cut at byte {start + len(data)} (expected {end})")
    return data


def from_bytes(data: bytes) -> ReadRange:
    """A reader over bytes in memory (a file just downloaded, a test)."""
    return lambda start, end: data[start:end]


def from_store(store, key: str) -> ReadRange:
    """A reader over ``key`` of the job dir's :class:`~data_juicer_elastic.storage.store.Store` (pread, ranged GET)."""
    return lambda start, end: store.open_range(key, start, end)
