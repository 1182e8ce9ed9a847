"""``S3Store``: the storage interface on an S3 endpoint (AWS, MinIO, ...), by boto3.

Create-once is ``PutObject If-None-Match: *`` and conditional replace
``If-Match: <etag>``: the store decides who wins, as ``link``/``O_EXCL`` do on
POSIX. Ages come from one response's ``Last-Modified`` and ``Date``, both the
store's. boto3 is imported only when a store is built (about 0.2 s, and an
optional extra): importing this module needs nothing beyond the standard library.
Credentials, region and endpoint follow boto3's own chain (``AWS_ENDPOINT_URL``,
``AWS_PROFILE``, roles ...); nothing here logs them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from email.utils import parsedate_to_datetime
from typing import Any

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.storage.keys import Entry, Meta, Ver, is_internal, normalise_key, normalise_prefix

CLOCK_KEY = ".clock"  # HEADed (never written) for the store's Date: a 404 carries one too
DIALECTS = ("s3",)  # oss and gcs (their own create-once headers) come with the dialect hooks
CONFLICT_TRIES = 5  # 409 ConditionalRequestConflict: a concurrent conditional write; S3 asks for a retry
RETRIES = {"mode": "standard", "max_attempts": 5}  # botocore's own retries of a send, bounded


class S3Store:
    """The job dir as the keys under ``s3://bucket/prefix``."""

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None, dialect: str = "s3") -> None:
        if dialect not in DIALECTS:
            raise ValueError(f"storage dialect {dialect!r} is not supported yet; supported: {', '.join(DIALECTS)}")
        self.bucket, self.prefix, self.dialect = bucket, normalise_prefix(prefix), dialect
        self.client, self._client_error = _client(endpoint_url)

    def __repr__(self) -> str:
        return f"S3Store({self.bucket!r}, {self.prefix!r}, {self.endpoint!r})"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def endpoint(self) -> str:
        return str(self.client.meta.endpoint_url)

    def describe(self) -> str:
        return f"{self.url} (endpoint {self.endpoint})"

    def create(self, key: str, data: bytes) -> Ver | None:
        return self._put(self._full(normalise_key(key)), data, {"IfNoneMatch": "*"})

    def replace(self, key: str, data: bytes, if_ver: Ver | None = None) -> Ver | None:
        return self._put(self._full(normalise_key(key)), data, {} if if_ver is None else {"IfMatch": if_ver})

    def read(self, key: str) -> tuple[bytes, Meta] | None:
        got = self._get(self._full(normalise_key(key)))
        return None if got is None else (got[0], _meta(got[1], len(got[0])))

    def head(self, key: str) -> Meta | None:
        try:
            resp = self.client.head_object(Bucket=self.bucket, Key=self._full(normalise_key(key)))
        except self._client_error as exc:
            if _missing(exc):
                return None
            raise
        return _meta(resp, resp["ContentLength"])

    def delete(self, key: str, if_ver: Ver | None = None) -> bool:
        condition = {} if if_ver is None else {"IfMatch": if_ver}
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._full(normalise_key(key)), **condition)
        except self._client_error as exc:
            if _code(exc) == "PreconditionFailed" or (if_ver is not None and _missing(exc)):
                return False
            if not _missing(exc):
                raise
        return True

    def list(self, prefix: str) -> Iterator[Entry]:
        folder = normalise_prefix(prefix)
        start = self._full(folder) + "/" if folder else (f"{self.prefix}/" if self.prefix else "")
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start)
        cut = len(self.prefix) + 1 if self.prefix else 0
        for page in pages:
            for obj in page.get("Contents", ()):
                key = obj["Key"][cut:]
                if not is_internal(key):
                    yield Entry(key, obj["Size"], obj["ETag"], obj["LastModified"].timestamp())

    def now(self) -> float:
        try:
            resp = self.client.head_object(Bucket=self.bucket, Key=self._full(CLOCK_KEY))
        except self._client_error as exc:
            if not _missing(exc):
                raise
            resp = exc.response
        return _date(resp)

    def _full(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _put(self, full: str, data: bytes, condition: dict[str, str]) -> Ver | None:
        """One conditional PUT: its ETag, or None when the precondition failed.

        A 412 after botocore re-sent the request may be our own first send's
        success (its reply lost): the stored bytes decide, as ``_ours`` does for
        an NFS link retransmitted. A 409 is a concurrent conditional write: retried.
        """
        for attempt in range(CONFLICT_TRIES):
            try:
                resp = self.client.put_object(Bucket=self.bucket, Key=full, Body=data, **condition)
                return str(resp["ETag"])
            except self._client_error as exc:
                if _code(exc) == "ConditionalRequestConflict" and attempt + 1 < CONFLICT_TRIES:
                    time.sleep(0.05 * 2**attempt)
                    continue
                if _code(exc) == "PreconditionFailed" or (condition.get("IfMatch") and _missing(exc)):
                    if _retried(exc):
                        got = self._get(full)
                        if got is not None and got[0] == data:
                            return str(got[1]["ETag"])
                    return None
                raise
        raise AssertionError("unreachable: the last try returns or raises")

    def _get(self, full: str) -> tuple[bytes, dict[str, Any]] | None:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=full)
        except self._client_error as exc:
            if _missing(exc):
                return None
            raise
        with resp["Body"] as body:
            return body.read(), resp


def _client(endpoint_url: str | None) -> tuple[Any, type[Exception]]:
    """One S3 client (thread-safe) and botocore's ClientError; a clear error when boto3 is not installed."""
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import ClientError
    except ImportError as exc:
        raise UserError(
            f"an s3:// store needs boto3, which is not installed ({exc}): pip install 'data-juicer-elastic[s3]'"
        ) from exc
    config = Config(retries=RETRIES, connect_timeout=5, read_timeout=20, max_pool_connections=32)
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config), ClientError


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _missing(exc: Any) -> bool:
    return _code(exc) in ("NoSuchKey", "404", "NotFound")


def _retried(exc: Any) -> bool:
    return int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)) > 0


def _date(resp: dict[str, Any]) -> float:
    """The response's ``Date`` header: the store's clock (1 s resolution)."""
    date = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if not date:
        raise RuntimeError("the S3 endpoint sent no Date header, so it offers no clock to age leases by")
    return parsedate_to_datetime(date).timestamp()


def _meta(resp: dict[str, Any], size: int) -> Meta:
    return Meta(size, str(resp["ETag"]), resp["LastModified"].timestamp(), _date(resp))
