"""``S3Store``: the storage interface on an S3 endpoint (AWS, MinIO, ...), by boto3.

Create-once is ``PutObject If-None-Match: *`` and conditional replace
``If-Match: <etag>``: the store decides who wins, as ``link``/``O_EXCL`` do on
POSIX. A heartbeat (``renew``) rewrites a lease's JSON body with ``beat`` + 1
under ``If-Match``, so every beat has a new ETag and a foreign write is seen as
a 412; ``release`` rewrites it with ``"released": true`` and the metadata
``x-amz-meta-dje-released: 1``, which a HEAD reads without the body. Ages come
from one response's ``Last-Modified`` and ``Date``, both the store's. boto3 is
imported only when a store is built (about 0.2 s, and an optional extra):
importing this module needs nothing beyond the core's own dependencies.
Endpoint, region, addressing style and dialect are ``StorageSettings``
(``storage/settings.py``: the recipe's ``elastic_shard.storage`` or the
environment), and every client is built by :func:`s3_client` from them;
credentials follow boto3's own chain (``AWS_PROFILE``, roles ...) and nothing
here logs them.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.storage import dialects
from data_juicer_elastic.storage.blocks import BLOCK
from data_juicer_elastic.storage.files import dumps_json, rename_staged, stage_blocks
from data_juicer_elastic.storage.keys import Entry, Meta, Ver, is_internal, normalise_key, normalise_prefix
from data_juicer_elastic.storage.s3_beats import Beat, BeatBook, next_body
from data_juicer_elastic.storage.s3_replies import (
    RELEASED_META,
    _code,
    _date,
    _meta,
    _missing,
    _refused,
    _released,
    _retried,
)
from data_juicer_elastic.storage.s3_upload import ANY, put_file
from data_juicer_elastic.storage.settings import StorageSettings

CLOCK_KEY = ".clock"  # HEADed (never written) for the store's Date: a 404 carries one too
CONFLICT_TRIES = 5  # 409 ConditionalRequestConflict: a concurrent conditional write; S3 asks for a retry
RETRIES = {"mode": "standard", "max_attempts": 5}  # botocore's own retries of a send, bounded
READ_WINDOW_FIRST = 64 << 10  # an input's first ranged GET: a line start is usually found in it
READ_WINDOW_MAX = 16 << 20  # ... each next one 4x larger, up to this


class _Body(io.RawIOBase):
    """A GET's body as a raw stream: ``readinto`` for ``blocks``; a body cut short raises when read to its end
    (botocore's ``StreamingBody.read`` checks the length; its raw stream, which ``with body`` hands out, does not)."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        data = self._body.read(len(buf))
        buf[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._body.close()
        super().close()


CONTENT_TYPES = {"html": "text/html; charset=utf-8", "json": "application/json"}


class S3Store:
    """The job dir as the keys under ``s3://bucket/prefix``."""

    stamp_resolution = 1.0  # Last-Modified and Date are whole seconds: an age reads up to 1 s over

    def __init__(self, bucket: str, prefix: str = "", settings: StorageSettings | None = None) -> None:
        settings = StorageSettings.from_env() if settings is None else settings
        self.bucket, self.prefix, self.dialect = bucket, normalise_prefix(prefix), settings.dialect_name
        self.client, self._client_error = s3_client(settings)
        from botocore.exceptions import BotoCoreError

        self.errors: tuple[type[Exception], ...] = (OSError, self._client_error, BotoCoreError)
        self._beats = BeatBook()  # by full key: the last beat of each lease, and the beats in flight

    def __repr__(self) -> str:
        return f"S3Store({self.bucket!r}, {self.prefix!r}, {self.endpoint!r})"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def endpoint(self) -> str:
        return str(self.client.meta.endpoint_url)

    @property
    def keeps_if_match(self) -> bool:
        """Whether the dialect has compare-and-swap on PUT (renew, release, ``replace(if_ver)``)."""
        return dialects.keeps_if_match(self.dialect)

    def describe(self) -> str:
        dialect = "" if self.dialect == "s3" else f", dialect {self.dialect}"
        return f"{self.url} (endpoint {self.endpoint}{dialect})"

    def with_clock(self, key: str) -> S3Store:
        return self  # every response carries the store's own Date

    def create(
        self, key: str, data: bytes, *, exclusive: bool = False, durable: bool = True, deadline: float | None = None
    ) -> Meta | None:
        """One ``If-None-Match: *`` PUT, ``modified`` its ``Date``; ``deadline`` bounds each send (``s3_deadline``)."""
        from data_juicer_elastic.storage.s3_deadline import bounded_sends  # botocore: only with a client

        with bounded_sends(self.client, deadline):
            resp = self._put_resp(self._full(normalise_key(key)), data, {"IfNoneMatch": "*"})
        return None if resp is None else _meta(resp, len(data))

    def replace(self, key: str, data: bytes, if_ver: Ver | None = None, *, durable: bool = True) -> Ver | None:
        """One PUT, ``If-Match`` with ``if_ver`` (``durable`` changes nothing: an answered PUT is durable)."""
        return self._put(self._full(normalise_key(key)), data, {} if if_ver is None else {"IfMatch": if_ver})

    def renew(self, key: str, ver: Ver) -> Ver | None:
        """An If-Match PUT of the next beat (a fresh ``beat_token``); a moved ETag whose body has a token we
        sent is our beat that landed unanswered: adopted, and the beat sent over it (``s3_beats``)."""
        full = self._full(normalise_key(key))
        beat = self._beat(full, ver) or self._landed(full)
        for _ in range(2):  # the second: over our own landed beat, once
            if beat is None or beat.released:
                break
            body = next_body(beat)
            self._beats.sending(full, body["beat_token"])
            resp = self._put_resp(full, dumps_json(body), {"IfMatch": beat.ver})
            if resp is not None:
                new = str(resp["ETag"])
                self._beats.remember(full, Beat(new, body, False, _date(resp), time.monotonic()))
                return new
            beat = self._landed(full)
        self._beats.forget(full)
        return None

    def _landed(self, full: str) -> Beat | None:
        """The lease as it stands if it holds a beat this process sent (one GET), else None: a foreign write."""
        beat = self._beat(full, None)
        return beat if beat is not None and self._beats.ours(full, beat.body) else None

    def release(self, key: str, ver: Ver | None = None) -> bool:
        """One If-Match PUT of the body marked released; without ``ver``, the body and ETag a GET finds
        (tried again while a beat moves the ETag in between, a few times at most)."""
        full = self._full(normalise_key(key))
        for _ in range(1 if ver is not None else CONFLICT_TRIES):
            beat = self._beat(full, ver)
            self._beats.forget(full)
            if beat is None:
                return False
            if beat.released:
                return True
            data = dumps_json({**beat.body, "released": True})
            if self._put_resp(full, data, {"IfMatch": beat.ver}, {RELEASED_META: "1"}) is not None:
                return True
        return False

    def read(self, key: str, now: float | None = None) -> tuple[bytes, Meta] | None:
        """One GET; ``now`` is not needed: the response's own ``Date`` ages the key (fresher, and free)."""
        got = self._get(self._full(normalise_key(key)))
        return None if got is None else (got[0], _meta(got[1], len(got[0])))

    def head(self, key: str, now: float | None = None) -> Meta | None:
        """One HEAD, aged by its own ``Date`` (``now`` is not needed)."""
        resp = self.head_response(key)
        return None if resp is None else _meta(resp, resp["ContentLength"])

    def head_response(self, key: str) -> dict[str, Any] | None:
        """One HEAD's whole response (user metadata included), or None when ``key`` is missing."""
        try:
            return dict(self.client.head_object(Bucket=self.bucket, Key=self._full(normalise_key(key))))
        except self._client_error as exc:
            if _missing(exc):
                return None
            raise

    def upload(self, key: str, local_path: str | os.PathLike, *, create_once: bool) -> Meta | None:
        """One PUT up to ``s3_upload.PART_SIZE``, else a multipart upload (``s3_upload.put_file``, the
        export's); ``create_once``: ``If-None-Match: *`` on the PUT or on ``CompleteMultipartUpload`` (and a
        HEAD before Complete). A killed upload leaves no key (at most an incomplete multipart upload)."""
        written = put_file(self, key, local_path, None if create_once else ANY)
        return None if written is None else written.meta

    def download(self, key: str, local_path: str | os.PathLike) -> Meta | None:
        """One GET streamed in blocks to a temp name beside ``local_path``, renamed over it (not fsynced:
        node-local scratch); a body cut short raises (botocore checks its length), leaving nothing."""
        resp = self._get_resp(self._full(normalise_key(key)))
        if resp is None:
            return None
        body = resp["Body"]  # entered, a StreamingBody hands out its raw stream, which has no length check
        with body:
            tmp, _ = stage_blocks(local_path, body.iter_chunks(BLOCK), direct=False, fsync=False)
        rename_staged(tmp, local_path, durable=False)
        return _meta(resp, int(resp["ContentLength"]))

    def open_range(self, key: str, start: int, end: int) -> bytes | None:
        """One ranged GET (``Range: bytes=start-end-1``); short where the object ends, None when missing."""
        full = self._full(normalise_key(key))
        if end <= start:
            return b"" if self.head(key) is not None else None
        try:
            resp = self._get_resp(full, Range=f"bytes={start}-{end - 1}")
        except self._client_error as exc:
            if _code(exc) == "InvalidRange":
                return b""  # starts at or past the object's end
            raise
        if resp is None:
            return None
        with resp["Body"] as body:
            return body.read()

    def open_read(self, key: str) -> BinaryIO | None:
        resp = self._get_resp(self._full(normalise_key(key)))
        return None if resp is None else _Body(resp["Body"])  # type: ignore[return-value]

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
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._folder(prefix))
        cut = len(self.prefix) + 1 if self.prefix else 0
        for page in pages:
            for obj in page.get("Contents", ()):
                key = obj["Key"][cut:]
                if not is_internal(key):
                    yield Entry(key, obj["Size"], obj["ETag"], obj["LastModified"].timestamp())

    def names(self, prefix: str) -> list[str]:
        start = self._folder(prefix)
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start, Delimiter="/")
        found: set[str] = set()  # a key and a folder may share a name on S3, never on POSIX
        for page in pages:
            found.update(obj["Key"][len(start) :] for obj in page.get("Contents", ()))
            found.update(sub["Prefix"][len(start) : -1] for sub in page.get("CommonPrefixes", ()))
        return [n for n in found if n and not is_internal(n)]  # "": a folder marker (``prefix/``) itself

    def stamp(self, prefix: str) -> str | None:
        """None: a bucket keeps no folder, so nothing moves when a key under ``prefix`` comes or goes."""
        normalise_prefix(prefix)  # confined as every key is
        return None

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

    def _folder(self, prefix: str) -> str:
        """The full key prefix of the folder ``prefix`` (normalised and confined), '/'-terminated unless the root."""
        folder = normalise_prefix(prefix)
        return self._full(folder) + "/" if folder else (f"{self.prefix}/" if self.prefix else "")

    def _put(self, full: str, data: bytes, condition: dict[str, str]) -> Ver | None:
        resp = self._put_resp(full, data, condition)
        return None if resp is None else str(resp["ETag"])

    def _put_resp(
        self, full: str, data: bytes, condition: dict[str, str], metadata: dict[str, str] | None = None
    ) -> dict[str, Any] | None:
        """One conditional PUT: its response (ETag, Date), or None when the precondition failed.

        A 412 after botocore re-sent the request may be our own first send's
        success (its reply lost): the stored bytes decide, as ``_ours`` does for
        an NFS link retransmitted. A 409 is a concurrent conditional write: retried.
        """
        extra: dict[str, Any] = {**condition, "Metadata": metadata} if metadata else dict(condition)
        kind = CONTENT_TYPES.get(full.rpartition(".")[2])
        if kind:  # a browser shows the report, opened by a presigned URL, instead of downloading it
            extra["ContentType"] = kind
        for attempt in range(CONFLICT_TRIES):
            try:
                return dict(self.client.put_object(Bucket=self.bucket, Key=full, Body=data, **extra))
            except self._client_error as exc:
                if _code(exc) == "ConditionalRequestConflict" and attempt + 1 < CONFLICT_TRIES:
                    time.sleep(0.05 * 2**attempt)
                    continue
                if _refused(exc) or (condition.get("IfMatch") and _missing(exc)):
                    if _retried(exc):
                        got = self._get(full)
                        if got is not None and got[0] == data:
                            return got[1]
                    return None
                raise
        raise AssertionError("unreachable: the last try returns or raises")

    def _get(self, full: str, if_ver: Ver | None = None) -> tuple[bytes, dict[str, Any]] | None:
        """A key's bytes and GET response; None when missing, or, with ``if_ver``, when its ETag moved."""
        resp = self._get_resp(full, **({"IfMatch": if_ver} if if_ver else {}))
        if resp is None:
            return None
        with resp["Body"] as body:
            return body.read(), resp

    def _get_resp(self, full: str, **extra: str) -> dict[str, Any] | None:
        """A GET's response, its body unread; None when missing, or when an ``IfMatch`` in ``extra`` failed."""
        try:
            return dict(self.client.get_object(Bucket=self.bucket, Key=full, **extra))
        except self._client_error as exc:
            if _missing(exc) or ("IfMatch" in extra and _code(exc) == "PreconditionFailed"):
                return None
            raise

    def _beat(self, full: str, ver: Ver | None) -> Beat | None:
        """The lease at ``full`` if it still has ``ver`` (any version when None): from memory, else one GET."""
        beat = self._beats.get(full)
        if beat is not None and ver is not None and beat.ver == ver:
            return beat
        got = self._get(full, ver)
        if got is None:
            return None
        try:
            body = orjson.loads(got[0])
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise ValueError(f"s3://{self.bucket}/{full}: renew and release take a lease (a JSON object)")
        released = _released(got[1]) or body.get("released") is True
        return Beat(str(got[1]["ETag"]), body, released, _date(got[1]), time.monotonic())


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


def s3_client(settings: StorageSettings) -> tuple[Any, type[Exception]]:
    """The one way an S3 client is made (the job dir's store, the input, the export): thread-safe, speaking
    ``settings``' dialect, with botocore's ClientError; a clear error when boto3 is not installed or a
    setting is wrong (exit 2)."""
    problems = settings.problems("S3 setting (elastic_shard.storage or the environment) ")
    if problems:
        raise UserError("; ".join(problems))
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import ClientError
    except ImportError as exc:
        raise UserError(
            f"an s3:// store needs boto3, which is not installed ({exc}): pip install 'data-juicer-elastic[s3]'"
        ) from exc
    s3 = {"addressing_style": settings.addressing_style} if settings.addressing_style else None
    config = Config(retries=RETRIES, connect_timeout=5, read_timeout=20, max_pool_connections=32, s3=s3)
    client = boto3.session.Session().client(
        "s3", endpoint_url=settings.endpoint_url, region_name=settings.region, config=config
    )
    dialects.install(client, settings.dialect_name)
    return client, ClientError
