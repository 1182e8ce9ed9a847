"""Read-only access to any bucket's objects by their exact keys: what prepare reads a job's input through.

Apart from ``S3Store`` (a job store: keys confined and normalised, conditional
writes): here keys are taken as they are and nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.storage.s3 import s3_client
from data_juicer_elastic.storage.s3_replies import _code, _missing
from data_juicer_elastic.storage.settings import StorageSettings

READ_WINDOW_FIRST = 64 << 10  # an input's first ranged GET: a line start is usually found in it
READ_WINDOW_MAX = 16 << 20  # ... each next one 4x larger, up to this


@dataclass(frozen=True)
class ObjectInfo:
    """One object as a HEAD or a listing reports it: what a job's input is fingerprinted by."""

    key: str
    size: int
    etag: str


class S3Objects:
    """Read-only access to any bucket's objects by their exact keys (a job's input): HEAD, LIST, ranged GET.

    Not a job store: keys are taken as they are (nothing normalised, no key
    left out as internal). Every failure but a missing key is a UserError
    naming the object's URL and the endpoint (never the credentials).
    """

    def __init__(self, settings: StorageSettings | None = None) -> None:
        self.client, self._client_error = s3_client(StorageSettings.from_env() if settings is None else settings)
        from botocore.exceptions import BotoCoreError

        self._errors: tuple[type[Exception], ...] = (self._client_error, BotoCoreError)

    @property
    def endpoint(self) -> str:
        return str(self.client.meta.endpoint_url)

    def head(self, bucket: str, key: str) -> ObjectInfo | None:
        """The object's size and ETag; None when the key (or its bucket) does not exist."""
        try:
            resp = self.client.head_object(Bucket=bucket, Key=key)
        except self._errors as exc:
            if _missing(exc):
                return None
            raise self._failed(bucket, key, exc) from exc
        return ObjectInfo(key, int(resp["ContentLength"]), str(resp["ETag"]))

    def list(self, bucket: str, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order (one request per 1,000 keys)."""
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                for obj in page.get("Contents", ()):
                    yield ObjectInfo(obj["Key"], int(obj["Size"]), str(obj["ETag"]))
        except self._errors as exc:
            raise self._failed(bucket, prefix, exc) from exc

    def blocks(self, bucket: str, key: str, start: int, end: int, size: int) -> Iterator[bytes]:
        """Bytes [start, end) of the object, in blocks of at most ``size``, by ranged GETs.

        The windows grow from READ_WINDOW_FIRST to READ_WINDOW_MAX, so a reader
        that stops at the first newline fetches little and a long read takes
        few requests. Ends early (no error) where the object ends: the caller
        tells a short read, as it does for a local file.
        """
        pos, window = start, READ_WINDOW_FIRST
        while pos < end:
            stop = min(end, pos + window)
            try:
                resp = self.client.get_object(Bucket=bucket, Key=key, Range=f"bytes={pos}-{stop - 1}")
            except self._errors as exc:
                if _code(exc) == "InvalidRange":
                    return  # starts past the object's end: it got shorter
                raise self._failed(bucket, key, exc) from exc
            with resp["Body"] as body:
                while pos < stop and (block := body.read(min(size, stop - pos))):
                    pos += len(block)
                    yield block
            if pos < stop:
                return
            window = min(window * 4, READ_WINDOW_MAX)

    def _failed(self, bucket: str, key: str, exc: Exception) -> UserError:
        why = f"{_code(exc)}: {exc}" if isinstance(exc, self._client_error) else str(exc)
        if _code(exc) == "NoSuchBucket":
            return UserError(f"s3://{bucket}/{key}: the bucket {bucket!r} does not exist at {self.endpoint}")
        return UserError(
            f"s3://{bucket}/{key}: cannot be read from {self.endpoint} ({why}); check the bucket, the key, "
            "the endpoint (elastic_shard.storage.endpoint_url or AWS_ENDPOINT_URL) and the credentials boto3 finds "
            "(AWS_PROFILE, AWS_ACCESS_KEY_ID, ...)"
        )
