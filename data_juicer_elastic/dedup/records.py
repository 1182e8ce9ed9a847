"""Flat binary lists a stage hands the next: a bucket's edges, a bucket's removed indices.

Fixed-size little-endian records behind a small header with the count, so a reader tells a whole file from a cut
one before it trusts a byte.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from data_juicer_elastic.errors import IntegrityError

HEADER = struct.Struct("<4sQ")
EDGE = struct.Struct("<QQ")
INDEX = struct.Struct("<Q")
EDGES_MAGIC = b"DJEE"
INDICES_MAGIC = b"DJEI"


def encode_edges(edges: Iterable[tuple[int, int]]) -> bytes:
    body = b"".join(EDGE.pack(u, v) for u, v in edges)
    return HEADER.pack(EDGES_MAGIC, len(body) // EDGE.size) + body


def decode_edges(data: bytes, where: str = "edge file") -> list[tuple[int, int]]:
    return list(EDGE.iter_unpack(_body(data, EDGES_MAGIC, EDGE.size, where)))


def encode_indices(indices: Iterable[int]) -> bytes:
    body = b"".join(INDEX.pack(i) for i in indices)
    return HEADER.pack(INDICES_MAGIC, len(body) // INDEX.size) + body


def decode_indices(data: bytes, where: str = "index file") -> list[int]:
    return [i for (i,) in INDEX.iter_unpack(_body(data, INDICES_MAGIC, INDEX.size, where))]


def _body(data: bytes, magic: bytes, size: int, where: str) -> bytes:
    if len(data) < HEADER.size:
        raise IntegrityError(f"{where}: cut before the end of its header")
    found, count = HEADER.unpack_from(data)
    if found != magic:
        raise IntegrityError(f"{where}: not a {magic!r} file ({found!r})")
    if len(data) != HEADER.size + count * size:
        raise IntegrityError(f"{where}: holds {len(data)} bytes, its header says {HEADER.size + count * size}")
    return data[HEADER.size :]
