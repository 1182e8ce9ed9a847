"""Bulk writes to an ``S3Store``: a multipart upload completed once, a file put whole, stale uploads aborted.

An object written by multipart exists only once ``CompleteMultipartUpload``
succeeds, so a killed writer leaves an incomplete upload, never a partial
object. Completion is conditional: ``If-None-Match: *`` where no object was
there (two finalizers cannot both write; AWS and MinIO honour it on
Complete), ``If-Match: <etag>`` where one was and the caller may replace it
(a store that ignores ``If-Match`` on Complete, moto, replaces it
unconditionally). A HEAD just before Complete also refuses an object that
appeared meanwhile on a store that ignores both. An incomplete upload is
never completed by anyone but its writer: a later writer of the same key
aborts those older than ``STALE_UPLOAD_SECS`` (by the store's clock) and
ignores younger ones, which may be a live writer's (a bucket lifecycle rule
``AbortIncompleteMultipartUpload`` removes the rest).

The store's client is the one ``S3Store`` built (credentials from boto3's
own chain); nothing here logs a request, a header or a credential.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_juicer_elastic.storage.blocks import BLOCK, blocks
from data_juicer_elastic.storage.conditions import same_etag
from data_juicer_elastic.storage.keys import Meta, normalise_key
from data_juicer_elastic.storage.s3_replies import _code, _date, _meta, _refused, _retried

S3Store = Any  # an ``S3Store`` (storage/s3.py), not imported: its ``upload`` is ``put_file``, so s3.py imports this

PUT_LIMIT = 5 << 30  # S3's largest single PUT
MIN_PART = 5 << 20  # S3's smallest part but the last
PART_SIZE = 16 << 20  # the default part, grown so that no upload needs more than MAX_PARTS; a file up to it is one PUT
MAX_PARTS = 9000  # S3 allows 10,000: room for a size estimate that falls short
IN_FLIGHT = 4  # parts sent at once (each held in memory until its reply)
STALE_UPLOAD_SECS = 3600.0  # an incomplete upload this old is a killed writer's: aborted
SHA_META = "dje-sha256"  # x-amz-meta-dje-sha256 on a part put by the folder export: what a resume compares
ANY = "*"  # an ``expect`` that replaces whatever is there (or nothing): no HEAD, no condition


@dataclass(frozen=True)
class Written:
    """What a completed write left: the object's Meta (size, ETag, the store's stamp) and version (None
    unversioned)."""

    meta: Meta
    version_id: str | None

    @property
    def size(self) -> int:
        return self.meta.size

    @property
    def etag(self) -> str:
        return self.meta.ver

    @classmethod
    def of(cls, resp: dict[str, Any], size: int) -> Written:
        """From a PUT's or Complete's response (stamped at its ``Date``), or a GET's (``Last-Modified``)."""
        return cls(_meta(resp, size), resp.get("VersionId"))


class Refused(Exception):
    """The object was there (or appeared) and the write may not replace it; nothing was written."""


def part_size_for(total: int) -> int:
    """The part size for about ``total`` bytes: ``PART_SIZE``, larger where that would take too many parts."""
    return max(PART_SIZE, MIN_PART, -(-total // MAX_PARTS))


class MultipartWrite:
    """One multipart upload to ``key``: ``write`` blocks in order, then ``complete`` once; aborted on any error.

    ``expect``: the ETag of the object the caller saw there (replaced only if it is still that one), None
    for none (refused if one appears), or ``ANY`` (whatever is there is replaced). Use as a context manager:
    leaving it without ``complete`` aborts the upload, so what was sent is never kept.
    """

    def __init__(
        self, store: S3Store, key: str, expect: str | None, part_size: int, metadata: dict[str, str] | None = None
    ) -> None:
        self.store, self.key, self.expect = store, normalise_key(key), expect
        self.full = store._full(self.key)
        self.part_size = max(part_size, MIN_PART)
        self.client = store.client
        once = {"IfNoneMatch": "*"} if expect is None else {}  # the dialect's hook: OSS sends it, S3 drops it
        try:
            resp = self.client.create_multipart_upload(
                Bucket=store.bucket, Key=self.full, Metadata=metadata or {}, **once
            )
        except store._client_error as exc:
            if _refused(exc):  # OSS checks create-once at the start: an object appeared since the caller's HEAD
                raise Refused(f"{store.url}/{self.key}: an object appeared before the upload began") from exc
            raise
        self.upload_id: str | None = str(resp["UploadId"])
        self.buf = bytearray()
        self.sent: list[tuple[int, Future, str]] = []  # part number, its reply, the md5 of its bytes
        self.size = 0
        self.pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="dje-s3-part")

    def __enter__(self) -> MultipartWrite:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()

    def write(self, block: Any) -> None:
        self.buf += block
        self.size += len(block)
        while len(self.buf) >= self.part_size:
            self._send(bytes(self.buf[: self.part_size]))
            del self.buf[: self.part_size]

    def _send(self, data: bytes) -> None:
        number = len(self.sent) + 1
        args = {"Bucket": self.store.bucket, "Key": self.full, "UploadId": self.upload_id, "PartNumber": number}
        self.sent.append((number, self.pool.submit(self.client.upload_part, Body=data, **args), _md5(data)))
        if len(self.sent) > IN_FLIGHT:
            self.sent[-IN_FLIGHT - 1][1].result()  # at most IN_FLIGHT parts held at once

    def complete(self) -> Written:
        """Send the rest, then Complete under the condition; ``Refused`` when another object is (now) there."""
        if self.buf or not self.sent:
            self._send(bytes(self.buf))
            self.buf = bytearray()
        parts = [{"PartNumber": n, "ETag": f.result()["ETag"]} for n, f, _ in self.sent]
        if self.expect != ANY:
            seen = self.store.head(self.key)
            if not same_etag(seen.ver if seen else None, self.expect):
                raise Refused(f"s3://{self.store.bucket}/{self.full}: {'changed' if self.expect else 'appeared'}")
        try:
            resp = self.client.complete_multipart_upload(
                Bucket=self.store.bucket,
                Key=self.full,
                UploadId=self.upload_id,
                MultipartUpload={"Parts": parts},
                **_condition(self.store, self.expect),
            )
        except self.store._client_error as exc:
            if not _refused(exc) and _code(exc) != "NoSuchUpload":
                raise
            ours = self._ours_after_resend() if _retried(exc) else None
            if ours is None:
                raise Refused(f"s3://{self.store.bucket}/{self.full}: written by another meanwhile") from exc
            self.upload_id = None
            return ours
        self.upload_id = None  # completed: nothing to abort
        if not str(resp.get("ETag") or "").strip('"'):  # Ceph RGW 16 answers an empty <ETag></ETag>
            return self._headed(resp)
        return Written.of(resp, self.size)

    def _headed(self, resp: dict[str, Any]) -> Written:
        """The object's Meta from a HEAD, for a Complete that answered no ETag; its stamp stays the Complete's
        ``Date``. A HEAD that finds an object of another size (a write after ours) gives way to the ETag our
        parts make."""
        meta = self.store.head(self.key)
        ver = meta.ver if meta is not None and meta.size == self.size else self._parts_etag()
        return Written.of({**resp, "ETag": ver}, self.size)

    def _ours_after_resend(self) -> Written | None:
        """A Complete that botocore sent again after its first send landed: the object's ETag is the one
        these parts make (md5 of the parts' md5s, ``-<count>``)."""
        meta = self.store.head(self.key)
        if meta is None or not same_etag(meta.ver, self._parts_etag()) or meta.size != self.size:
            return None
        return Written(meta, None)

    def _parts_etag(self) -> str:
        """The ETag S3 gives the object these parts make: the md5 of the parts' md5s, ``-<count>``."""
        digests = b"".join(bytes.fromhex(md5) for _, _, md5 in self.sent)
        return f'"{_md5(digests)}-{len(self.sent)}"'

    def abort(self) -> None:
        """Drop the upload (once; a completed one has nothing to drop)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self.upload_id is None:
            return
        upload_id, self.upload_id = self.upload_id, None
        try:
            self.client.abort_multipart_upload(Bucket=self.store.bucket, Key=self.full, UploadId=upload_id)
        except self.store._client_error as exc:
            if _code(exc) != "NoSuchUpload":
                raise


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()  # S3's part ETag, not security


def _condition(store: S3Store, expect: str | None) -> dict[str, str]:
    """The precondition a write under ``expect`` (as ``MultipartWrite`` takes it) sends, the ETag in the form
    the store takes."""
    if expect == ANY:
        return {}
    return {"IfMatch": store.sent(expect)} if expect else {"IfNoneMatch": "*"}


def put_file(
    store: S3Store, key: str, path: str | os.PathLike, expect: str | None, metadata: dict[str, str] | None = None
) -> Written | None:
    """``path`` at ``key``: one PUT up to ``PART_SIZE`` (the file read whole), else a multipart upload of
    ``part_size_for`` parts streamed from the file. ``expect`` as ``MultipartWrite`` takes it; None when that
    condition fails, nothing written. A resend whose first send landed is ours: the PUT's by the bytes stored
    (``S3Store._put_resp``), the Complete's by the ETag its parts make."""
    size = os.stat(path).st_size
    if size <= PART_SIZE:
        data = Path(path).read_bytes()
        resp = store._put_resp(store._full(normalise_key(key)), data, _condition(store, expect), metadata)
        return None if resp is None else Written.of(resp, len(data))
    if expect is None and size <= PUT_LIMIT and not store.conditions().complete_once:
        return _put_streamed(store, key, path, size, metadata)
    try:
        up = MultipartWrite(store, key, expect, part_size_for(size), metadata)
        with open(path, "rb", buffering=0) as f, up:
            for block in blocks(f, bytearray(BLOCK)):
                up.write(block)
            return up.complete()
    except Refused:
        return None


def _put_streamed(
    store: S3Store, key: str, path: str | os.PathLike, size: int, metadata: dict[str, str] | None
) -> Written | None:
    """One ``If-None-Match: *`` PUT of the file, streamed: create-once on a store that ignores it on Complete
    (the probe says) but keeps it on PUT. None when refused; a resend whose first send landed is ours when
    the object there has the file's size and md5 (a single PUT's ETag)."""
    full = store._full(normalise_key(key))
    extra: dict[str, Any] = {"IfNoneMatch": "*", **({"Metadata": metadata} if metadata else {})}
    with open(path, "rb") as f:
        try:
            return Written.of(dict(store.client.put_object(Bucket=store.bucket, Key=full, Body=f, **extra)), size)
        except store._client_error as exc:
            if not _refused(exc):
                raise
            meta = store.head(key) if _retried(exc) else None
    if meta is None or meta.size != size or not same_etag(meta.ver, _file_md5(path)):
        return None
    return Written(meta, None)


def _file_md5(path: str | os.PathLike) -> str:
    digest = hashlib.md5()  # S3's ETag of a single PUT, not security
    for block in blocks(path):
        digest.update(block)
    return digest.hexdigest()


def upload_file(store: S3Store, key: str, path: Path, sha256: str, *, tick: Callable | None = None) -> Written:
    """``path`` at ``key`` (replacing whatever is there; a multipart upload only the object it saw when it
    began), its sha256 in the metadata (``put_file``)."""
    size = os.stat(path).st_size
    expect = ANY
    if size > PART_SIZE:
        seen = store.head(key)
        expect = seen.ver if seen else None
    written = put_file(store, key, path, expect, {SHA_META: sha256})
    if written is None:
        raise Refused(f"s3://{store.bucket}/{store._full(normalise_key(key))}: changed during the upload")
    if tick is not None:
        tick(size)
    return written


def sha256_of(store: S3Store, key: str) -> tuple[int, str | None] | None:
    """Size and the ``dje-sha256`` metadata of ``key`` (one HEAD), or None when it is missing."""
    resp = store.head_response(key)
    if resp is None:
        return None
    return int(resp["ContentLength"]), resp.get("Metadata", {}).get(SHA_META)


def abort_stale_uploads(store: S3Store, key: str, older_than: float | None = None) -> int:
    """Abort the incomplete uploads to exactly ``key`` begun ``older_than`` seconds (default
    ``STALE_UPLOAD_SECS``) or more before the store's now; younger ones are left alone. How many."""
    full = store._full(normalise_key(key))
    limit = STALE_UPLOAD_SECS if older_than is None else older_than
    resp = store.client.list_multipart_uploads(Bucket=store.bucket, Prefix=full)
    now = _date(resp)
    aborted = 0
    for upload in resp.get("Uploads", ()):
        if upload["Key"] != full or now - upload["Initiated"].timestamp() < limit:
            continue
        try:
            store.client.abort_multipart_upload(Bucket=store.bucket, Key=full, UploadId=upload["UploadId"])
            aborted += 1
        except store._client_error as exc:
            if _code(exc) != "NoSuchUpload":
                raise
    return aborted
