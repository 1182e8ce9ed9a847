"""The startup probe (docs/OBJECT_STORE.md section 3): refuse a store that does not keep create-once writes,
and find out whether it keeps ``If-Match`` (a capability: off is reported, not refused).

Leases and done records rest on "the first create wins". An S3-compatible
store that ignores ``If-None-Match: *`` lets a second writer overwrite the
first without a word, so two workers would both hold a shard. One sequential
probe catches a store that ignores the header; it cannot see a check-then-write
that races (the test server's own suite covers that).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.storage.host import hostname
from data_juicer_elastic.storage.posix import PosixStore
from data_juicer_elastic.storage.s3 import S3Store
from data_juicer_elastic.storage.s3_replies import _code
from data_juicer_elastic.storage.store import Meta, Store

_PROBED: dict[str, Capabilities] = {}  # this process's probes, by the store's describe(): one each
PROBE_FOLDER = ".probe"  # internal: never listed, one key per probing process, deleted after


class StoreRefused(UserError):
    """The store lacks a guarantee the job needs (exit 2, the message names the store and the fix)."""


def probe_key() -> str:
    """A key no other process picks: host, pid and a random tag."""
    return f"{PROBE_FOLDER}/{hostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Capabilities:
    """What the store keeps beyond create-once (which the probe requires): one that is off is reported, not
    refused; what the job does without it is for the steps that use it (docs/OBJECT_STORE.md section 6)."""

    if_match: bool  # a replace conditional on a stale version is refused (412)

    def line(self, store: Store) -> str:
        """The one log line: ``store: s3://b/p (endpoint ...): create-once yes, If-Match no``."""
        return f"store: {store.describe()}: create-once yes, If-Match {'yes' if self.if_match else 'no'}"


def probe_store(store: Store) -> Capabilities:
    """The startup probe: refuse a store whose dialect has no compare-and-swap (lease renewals would race) or
    without create-once (StoreRefused), then what else it keeps."""
    check_dialect(store)
    try:
        check_create_once(store)
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


def check_dialect(store: Store) -> None:
    """Refuse, before any request, a store whose dialect cannot replace a key only if unchanged (``oss``): a
    lease's renewal there would overwrite whoever took the lease over, silently."""
    if isinstance(store, S3Store) and not store.keeps_if_match:
        raise StoreRefused(
            f"{store.describe()}: storage dialect {store.dialect} has no compare-and-swap on a write (Alibaba OSS "
            "answers If-Match on PutObject with NotImplemented), so lease renewals could race and overwrite another "
            "worker's lease: a job dir cannot be there. Put the job dir on AWS S3, MinIO or a shared POSIX "
            "directory; dataset_path and export_path may stay on OSS."
        )


def probe_once(store: Store, log: Callable[[str], None]) -> Capabilities | None:
    """The probe, run the first time this process meets an object store (its capability line logged then),
    before it writes anything there; None for a POSIX job dir, whose create-once is a link."""
    if isinstance(store, PosixStore):
        return None
    where = store.describe()
    if where not in _PROBED:
        _PROBED[where] = probe_store(store)
        log(_PROBED[where].line(store))
    return _PROBED[where]


@contextlib.contextmanager
def _probing(store: Store) -> Iterator[str]:
    """A fresh probe key, deleted after whatever the probe found."""
    key = probe_key()
    try:
        yield key
    finally:
        try:
            store.delete(key)
        except Exception:
            pass  # a probe key left behind is harmless (internal, never listed); the probe's own error matters


def _create_fresh(store: Store, key: str, data: bytes) -> Meta:
    meta = store.create(key, data)
    if meta is None:
        raise StoreRefused(f"{store.describe()}: the store refused the first create of {key}, a fresh key")
    return meta


def check_create_once(store: Store) -> None:
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


def check_if_match(store: Store) -> bool:
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
