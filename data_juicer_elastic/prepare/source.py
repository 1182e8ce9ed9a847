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
from urllib.parse import urlsplit

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.s3_export import SCHEME, is_s3


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key); the key exactly as written ("" for the whole bucket).

    Credentials never travel in the URL (it is recorded in the manifest and logs): boto3's chain finds them.
    """
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        raise UserError(
            f"s3://{parts.hostname}/...: the URL holds credentials; remove them (boto3 reads AWS_PROFILE, "
            "AWS_ACCESS_KEY_ID or the instance's role)"
        )
    if not parts.netloc:
        raise UserError(f"{url}: an s3:// URL names a bucket (s3://bucket/prefix/data.jsonl)")
    if parts.query or parts.fragment:
        raise UserError(f"{url}: an s3:// input URL takes no query or fragment ('?', '#')")
    return parts.netloc, url[len(SCHEME) + len(parts.netloc) :].removeprefix("/")


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
