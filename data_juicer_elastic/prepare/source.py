"""An input's plain bytes by range, wherever they are: a local file by ``pread``, an s3:// object by ranged GETs.

Every reader of prepare (the split's newline search, the shard tasks, the
row counts and the error paths' line numbers) goes through
:func:`read_blocks`, so an input on S3 is cut and hashed exactly as the same
bytes on local disk. Readers that want a file object (gzip and zstandard
streaming a compressed input, pyarrow seeking to a Parquet footer and row
groups) get :func:`open_input`: the local file, or an :class:`ObjectReader`
on the same ranged GETs. The S3 client is made once per process (prepare's
child processes make their own) from boto3's standard chain.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Iterator
from typing import BinaryIO

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.storage.urls import is_s3, split_s3


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key) as ``storage.urls.split_s3`` splits it; a bad URL is the user's error."""
    try:
        return split_s3(url)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def s3_objects():  # -> storage.s3_objects.S3Objects (boto3 is imported only when an s3:// input is read)
    """The input's client for this process's storage settings as they are now (a recipe's block, applied)."""
    from data_juicer_elastic.storage.settings import StorageSettings

    return objects_for(StorageSettings.from_env())


@functools.cache
def objects_for(settings):  # one client per settings: a later job's block is not read through an earlier one's
    from data_juicer_elastic.storage.s3_objects import S3Objects

    return S3Objects(settings)


def read_blocks(path: str, start: int, end: int, size: int) -> Iterator[bytes]:
    """Bytes [start, end) of ``path`` in blocks of at most ``size``; ends early where the input ends."""
    if is_s3(path):
        bucket, key = split_s3_url(path)
        yield from s3_objects().blocks(bucket, key, start, end, size)
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = start
        while pos < end:
            block = os.pread(fd, min(size, end - pos), pos)
            if not block:
                return
            pos += len(block)
            yield block
    finally:
        os.close(fd)


STREAM_BLOCK = 1 << 20  # what one read of an ObjectReader's stream takes from a ranged GET's body at most


def open_input(path: str, size: int) -> BinaryIO:
    """The input as a read-only file object: a local file opened, an s3:// object (``size`` bytes) by ranged GETs."""
    if is_s3(path):
        return ObjectReader(path, size)  # type: ignore[return-value]
    return open(path, "rb")


class ObjectReader(io.RawIOBase):
    """One object as a seekable file, for readers that stream it or seek in it.

    Reads that follow on from the last one stream through one run of
    ``S3Objects.blocks`` (its windows grow to 16 MiB: a decompressor's small
    reads cost few GETs). The first read after a seek fetches exactly the
    bytes asked for, one GET: pyarrow reads a Parquet footer and each column
    chunk as a seek and a read. Nothing is cached: memory is one block.
    """

    def __init__(self, url: str, size: int) -> None:
        super().__init__()
        self.name = url
        self._bucket, self._key = split_s3_url(url)
        self._size = size
        self._pos = 0
        self._stream: Iterator[bytes] | None = None
        self._left = memoryview(b"")
        self._exact = False  # the next read is the first after a seek

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset != self._pos:
            self._drop()
            self._pos, self._exact = max(0, base + offset), True
        return self._pos

    def read(self, n: int = -1) -> bytes:
        """``n`` bytes (all that are left when ``n`` < 0), fewer only at the object's end: pyarrow takes a short
        read as the end."""
        want = self._size - self._pos if n is None or n < 0 else min(n, max(0, self._size - self._pos))
        out = bytearray(want)
        got = 0
        while got < want and (step := self.readinto(memoryview(out)[got:])):
            got += step
        return bytes(out[:got])

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        view = memoryview(buffer).cast("B")
        if not view or self._pos >= self._size:
            return 0
        if not self._left:
            if self._stream is None:
                end = min(self._size, self._pos + len(view)) if self._exact else self._size
                self._stream = s3_objects().blocks(self._bucket, self._key, self._pos, end, STREAM_BLOCK)
                self._exact = False
            block = next(self._stream, b"")
            if not block:  # that run ended (an exact read's end, or the object got shorter): go on from here
                self._stream = None
                if self._pos >= self._size:
                    return 0
                self._stream = s3_objects().blocks(self._bucket, self._key, self._pos, self._size, STREAM_BLOCK)
                block = next(self._stream, b"")
                if not block:
                    return 0
            self._left = memoryview(block)
        n = min(len(view), len(self._left))
        view[:n] = self._left[:n]
        self._left = self._left[n:]
        self._pos += n
        return n

    def _drop(self) -> None:
        if self._stream is not None:
            self._stream.close()  # type: ignore[attr-defined]  # a generator: closes the GET's body
        self._stream, self._left = None, memoryview(b"")

    def close(self) -> None:
        self._drop()
        super().close()
