"""Reading a file in large blocks, and what every reader of an output counts: rows, bytes, sha256.

One loop for all of them (a shard checked before it runs, an output
re-read before it is published, outputs re-checked by verify and merge, the
parts an attempt joins, a decompressed input): 16 MiB reads into one reused
buffer, which keeps the syscall count low on network filesystems without
holding much memory.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

BLOCK = 16 << 20


def blocks(source: str | os.PathLike | BinaryIO, buf: bytearray | None = None) -> Iterator[memoryview]:
    """The bytes of ``source`` (a path, or a file open for binary reading) as views of one reused buffer.

    A view is only valid until the next one is taken.
    """
    buf = bytearray(BLOCK) if buf is None else buf
    view = memoryview(buf)
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb", buffering=0) as f:
            yield from _read(f, buf, view)
    else:
        yield from _read(source, buf, view)


def _read(f: BinaryIO, buf: bytearray, view: memoryview) -> Iterator[memoryview]:
    while n := f.readinto(buf):
        yield view[:n]


@dataclass(frozen=True)
class FileDigest:
    rows: int  # newlines
    bytes: int
    sha256: str  # "" when not hashed
    ends_with_newline: bool  # or is empty


class Digester:
    """Counts rows and bytes of the blocks given to it, and hashes them unless ``sha256`` is False."""

    def __init__(self, sha256: bool = True) -> None:
        self._sha = hashlib.sha256() if sha256 else None
        self.rows = self.bytes = 0
        self._last = 10

    def update(self, block: memoryview) -> None:
        """Take in one block as ``blocks`` yields it: a view starting at its buffer's first byte.

        The newlines are counted in that buffer, in place (a memoryview has no ``count``).
        """
        if self._sha is not None:
            self._sha.update(block)
        n = len(block)
        if n:
            self.rows += block.obj.count(b"\n", 0, n)
            self.bytes += n
            self._last = block[n - 1]

    def result(self) -> FileDigest:
        return FileDigest(self.rows, self.bytes, self._sha.hexdigest() if self._sha else "", self._last == 10)


def digest_file(source: str | os.PathLike | BinaryIO, buf: bytearray | None = None) -> FileDigest:
    """Rows, bytes, sha256 and last byte of a file, in one pass of large blocks."""
    return digest_blocks(blocks(source, buf))


def digest_blocks(source: Iterable[memoryview | bytes]) -> FileDigest:
    """The same of a stream's blocks (``blocks``' views, or bytes as ranged GETs of an object return them)."""
    d = Digester()
    for block in source:
        d.update(block if isinstance(block, memoryview) else memoryview(block))
    return d.result()
