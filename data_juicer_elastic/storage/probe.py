"""The startup probe (docs/OBJECT_STORE.md section 3): refuse a store that does not keep create-once writes,
and find out which other conditional requests it keeps, and in which form it takes an ETag (``Capabilities``,
recorded by endpoint in ``conditions.py`` for every store of the process).

Leases and done records rest on "the first create wins". An S3-compatible
store that ignores ``If-None-Match: *`` lets a second writer overwrite the
first without a word, so two workers would both hold a shard. One sequential
probe catches a store that ignores the header; it cannot see a check-then-write
that races (the test server's own suite covers that).

Stores are typed ``Any`` here: ``store.py`` opens the backends and ``s3.py`` asks this module to probe on
its first conditional request, so importing either would close a circle; a store's ``probed`` says
which kind it is.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.storage import conditions
from data_juicer_elastic.storage.conditions import Capabilities, as_sent
from data_juicer_elastic.storage.host import hostname
from data_juicer_elastic.storage.keys import Meta
from data_juicer_elastic.storage.s3_replies import _code, _refused

_PROBED: dict[str, Capabilities] = {}  # this process's probes, by the store's describe(): one each
PROBE_FOLDER = ".probe"  # internal: never listed, one key per probing process, deleted after


class StoreRefused(UserError):
    """The store lacks a guarantee the job needs (exit 2, the message names the store and the fix)."""


def probe_key() -> str:
    """A key no other process picks: host, pid and a random tag."""
    return f"{PROBE_FOLDER}/{hostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def probe_store(store: Any) -> Capabilities:
    """The startup probe: refuse a store whose dialect has no compare-and-swap (lease renewals would race) or
    without create-once (StoreRefused), then what else it keeps."""
    check_dialect(store)
    try:
        check_create_once(store)
        if store.probed:  # an object store: every conditional request it may or may not honour
            return probe_conditions(store)
        return Capabilities(if_match=check_if_match(store))
    except store.errors as exc:
        if _code(exc) != "NotImplemented":
            raise
        raise StoreRefused(
            f"{store.describe()}: the store answered NotImplemented to a conditional write (If-None-Match: * or "
            "If-Match), so it cannot hold leases or done records. Alibaba OSS's S3 endpoint does that: it keeps "
            "neither, so put the job dir on AWS S3, MinIO or a shared POSIX directory (OSS serves dataset_path and "
            "export_path with elastic_shard.storage.dialect: oss)."
        ) from exc


def check_dialect(store: Any) -> None:
    """Refuse, before any request, a store whose dialect cannot replace a key only if unchanged (``oss``): a
    lease's renewal there would overwrite whoever took the lease over, silently."""
    if store.probed and not getattr(store, "keeps_if_match", True):
        raise StoreRefused(
            f"{store.describe()}: storage dialect {store.dialect} has no compare-and-swap on a write (Alibaba OSS "
            "answers If-Match on PutObject with NotImplemented), so lease renewals could race and overwrite another "
            "worker's lease: a job dir cannot be there. Put the job dir on AWS S3, MinIO or a shared POSIX "
            "directory; dataset_path and export_path may stay on OSS."
        )


def probe_once(store: Any, log: Callable[[str], None]) -> Capabilities | None:
    """The probe, run the first time this process meets an object store (its capability line logged then),
    before it writes anything there; None for a POSIX job dir, whose create-once is a link."""
    if not store.probed:
        return None
    where = store.describe()
    if where not in _PROBED:
        _PROBED[where] = probe_store(store)
        log(_PROBED[where].line(store))
    return _PROBED[where]


@contextlib.contextmanager
def _probing(store: Any) -> Iterator[str]:
    """A fresh probe key, deleted after whatever the probe found."""
    key = probe_key()
    try:
        yield key
    finally:
        try:
            store.delete(key)
        except Exception:
            pass  # a probe key left behind is harmless (internal, never listed); the probe's own error matters


def _create_fresh(store: Any, key: str, data: bytes) -> Meta:
    meta = store.create(key, data)
    if meta is None:
        raise StoreRefused(f"{store.describe()}: the store refused the first create of {key}, a fresh key")
    return meta


def check_create_once(store: Any) -> None:
    """Create one probe key twice; raise StoreRefused unless the second create is refused and the first stays."""
    token = uuid.uuid4().hex
    first, second = f"probe A {token}\n".encode(), f"probe B {token}\n".encode()
    with _probing(store) as key:
        _create_fresh(store, key, first)
        lost = store.create(key, second)
        got = store.read(key)
        if lost is not None or got is None or got[0] != first:
            raise StoreRefused(
                f"{store.describe()}: the store accepted a second create of {key} (If-None-Match: * ignored), "
                "so it does not honour create-once writes and cannot hold leases or done records. Use a store "
                "with conditional writes (AWS S3, MinIO) or a shared POSIX directory."
            )


def check_if_match(store: Any) -> bool:
    """Whether a replace on a version that has moved on is refused: create A, replace it by B on A's
    version, then try C on A's version again; the store must refuse C and keep B."""
    token = uuid.uuid4().hex
    a, b, c = (f"probe {n} {token}\n".encode() for n in "ABC")
    with _probing(store) as key:
        stale = _create_fresh(store, key, a).ver
        if store.replace(key, b, if_ver=stale) is None:
            return False  # refused on the version it has: the header is not understood either way
        lost = store.replace(key, c, if_ver=stale)
        got = store.read(key)
        return lost is None and got is not None and got[0] == b


def probe_conditions(store: Any) -> Capabilities:
    """Each conditional request the protocol sends, tried on probe keys with the store's own client (so in
    the exact form asked, and no request through ``S3Store`` waits on this probe): PUT, GET and DELETE
    ``If-Match`` on a stale ETag, ``If-None-Match: *`` on Complete and on Copy onto a key. The ETag form is
    learned first: quoted, and bare only where the quoted current ETag is refused. Recorded for the
    endpoint (``conditions.learn``) and returned."""
    with _probing(store) as key, _probing(store) as other:
        full = store._full(key)
        stale = _create_fresh(store, key, b"probe A\n").ver
        quoted, current = True, _put_if(store, full, b"probe B\n", IfMatch=as_sent(stale, True))
        if current is None:
            quoted, current = False, _put_if(store, full, b"probe B\n", IfMatch=as_sent(stale, False))
        if current is None:  # refused on the version it has in either form: not understood
            found = Capabilities(if_match=False, get_if_match=False, delete_if_match=False)
        else:
            found = Capabilities(
                if_match=_put_if(store, full, b"probe C\n", IfMatch=as_sent(stale, quoted)) is None
                and _body(store, full) == b"probe B\n",
                etag_quoted=quoted,
                get_if_match=_get_if_refused(store, full, as_sent(stale, quoted), as_sent(current, quoted)),
                complete_once=_complete_refused(store, full),
                copy_once=_copy_refused(store, full, other),
                delete_if_match=_delete_refused(store, full, as_sent(stale, quoted)),
            )
    conditions.learn(store.endpoint, found)
    return found


def _put_if(store: Any, full: str, data: bytes, **condition: str) -> str | None:
    """One conditional PUT: its ETag, or None when refused (412)."""
    try:
        return str(store.client.put_object(Bucket=store.bucket, Key=full, Body=data, **condition)["ETag"])
    except store._client_error as exc:
        if _refused(exc):
            return None
        raise


def _body(store: Any, full: str) -> bytes | None:
    got = store._get_resp(full)
    if got is None:
        return None
    with got["Body"] as body:
        return body.read()


def _honoured(call: Callable[[], Any], store: Any) -> bool:
    """Whether ``call`` (a request on a stale or taken key) was refused with 412; any other error (400, 501,
    a botocore without the parameter) reads as not honoured."""
    from botocore.exceptions import ParamValidationError

    try:
        call()
    except store._client_error as exc:
        return _refused(exc)
    except ParamValidationError:
        return False
    return False


def _get_if_refused(store: Any, full: str, stale: str, current: str) -> bool:
    """GET If-Match: the current ETag answered, a stale one refused."""
    try:
        store.client.get_object(Bucket=store.bucket, Key=full, IfMatch=current)["Body"].close()
    except store._client_error:
        return False
    return _honoured(lambda: store.client.get_object(Bucket=store.bucket, Key=full, IfMatch=stale), store)


def _complete_refused(store: Any, full: str) -> bool:
    """CompleteMultipartUpload ``If-None-Match: *`` onto the existing ``full`` (one part of 2 bytes)."""
    where = {"Bucket": store.bucket, "Key": full}
    before = _body(store, full)
    upload = store.client.create_multipart_upload(**where)["UploadId"]
    try:
        part = store.client.upload_part(**where, UploadId=upload, PartNumber=1, Body=b"Z\n")
        parts = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
        return (
            _honoured(
                lambda: store.client.complete_multipart_upload(
                    **where, UploadId=upload, MultipartUpload=parts, IfNoneMatch="*"
                ),
                store,
            )
            and _body(store, full) == before
        )
    finally:
        with contextlib.suppress(*store.errors):
            store.client.abort_multipart_upload(**where, UploadId=upload)


def _copy_refused(store: Any, full: str, other: str) -> bool:
    """CopyObject ``If-None-Match: *`` of ``full`` onto ``other``, which exists."""
    _create_fresh(store, other, b"probe D\n")
    target = store._full(other)
    source = {"Bucket": store.bucket, "Key": full}
    copy = {"Bucket": store.bucket, "Key": target, "CopySource": source, "IfNoneMatch": "*"}
    return _honoured(lambda: store.client.copy_object(**copy), store) and _body(store, target) == b"probe D\n"


def _delete_refused(store: Any, full: str, stale: str) -> bool:
    """DeleteObject ``If-Match`` on a stale ETag: refused, and the key is still there."""
    delete = {"Bucket": store.bucket, "Key": full, "IfMatch": stale}
    return _honoured(lambda: store.client.delete_object(**delete), store) and _body(store, full) is not None


def refuse_delete_if_match(store: Any) -> StoreRefused:
    """The refusal of a delete asked to remove a key only in the version its caller read, on a store that
    ignores ``If-Match`` on DELETE (the key could hold another writer's newer version by then). No caller
    asks for one there: ``dj-elastic retry`` deletes under its lock instead (``job.records.retry_lock``)."""
    return StoreRefused(
        f"{store.describe()}: the store ignores If-Match on DELETE (the startup probe deleted a key on a stale "
        "ETag), so a delete of one version of a key cannot be kept there; delete it unconditionally under a "
        "lock that keeps every other writer away, as `dj-elastic retry` does."
    )
