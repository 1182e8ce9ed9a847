"""An input's plain bytes by range, wherever they are: a local file by ``pread``, an s3:// object by ranged GETs.

Every reader of prepare (the split's newline search, the shard tasks, the
row counts and the error paths' line numbers) goes through
:func:`read_blocks`, so an input on S3 is cut and hashed exactly as the same
bytes on local disk. The S3 client is made once per process (prepare's
child processes make their own) from boto3's standard chain.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.storage.urls import is_s3, split_s3


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key) as ``storage.urls.split_s3`` splits it; a bad URL is the user's error."""
    try:
        return split_s3(url)
    except ValueError as exc:
        raise UserError(str(exc)) from None


@functools.cache
def s3_objects():  # -> storage.s3.S3Objects (boto3 is imported only when an s3:// input is read)
    from data_juicer_elastic.storage.s3 import S3Objects

    return S3Objects()


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
