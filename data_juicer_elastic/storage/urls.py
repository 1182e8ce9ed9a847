"""s3:// URLs, spelled and split one way for the job dir's store, prepare's input and the merge's export."""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from urllib.parse import urlsplit

SCHEME = "s3://"


def is_s3(path: str | os.PathLike) -> bool:
    return os.fspath(path).lower().startswith(SCHEME)


def split_s3(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key), the key exactly as written ("" for the whole bucket).

    ValueError, naming what to change, for a URL without a bucket, with a
    query or fragment, or with credentials in it: they would be recorded in
    the manifest and logs, and boto3's own chain finds them anyway.
    """
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            f"s3://{parts.hostname}/...: the URL holds credentials; remove them (boto3 reads AWS_PROFILE, "
            "AWS_ACCESS_KEY_ID or the instance's role)"
        )
    if not parts.netloc:
        raise ValueError(f"{url}: an s3:// URL names a bucket (s3://bucket/prefix/data.jsonl)")
    if parts.query or parts.fragment:
        raise ValueError(f"{url}: an s3:// URL takes no query or fragment ('?', '#')")
    return parts.netloc, url[len(SCHEME) + len(parts.netloc) :].removeprefix("/")


_MARK = "\x00s3:"  # the first part of every ObjectPath: no local file call takes a name holding a NUL


class ObjectPath(PurePosixPath):
    """A name inside a job dir on an object store, spelled as a path (``job.root / "state" / ...``) so the
    job's layout is written once for both backends; ``str`` gives its ``s3://`` URL, for messages.

    It is no local file, and every way of using it as one fails loudly rather than touching the local
    disk: ``os.fspath`` (so ``open``, ``os.stat``) raises TypeError, it has no ``exists``/``is_dir``, and
    ``Path(it)`` (which takes a path's parts without asking ``fspath``) holds a NUL byte, which every
    system call refuses (ValueError). ``JobDir.key`` turns it into the store's key.
    """

    def __str__(self) -> str:
        text = super().__str__()
        head = f"/{_MARK}"
        if not text.startswith(head):
            return text  # a relative name (a key)
        return "s3://" + text[len(head) :].lstrip("/")

    def __fspath__(self) -> str:
        raise TypeError(f"{self}: a key of an object store, not a local file: read it through the job's store")

    @classmethod
    def of(cls, url: str) -> ObjectPath:
        """The root of the job dir ``s3://bucket/prefix``."""
        bucket, key = split_s3(url)
        return cls("/", _MARK, bucket, *(p for p in key.split("/") if p))
