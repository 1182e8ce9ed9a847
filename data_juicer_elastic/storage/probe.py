"""The startup probe (docs/OBJECT_STORE.md section 3): refuse a store that does not keep create-once writes.

Leases and done records rest on "the first create wins". An S3-compatible
store that ignores ``If-None-Match: *`` lets a second writer overwrite the
first without a word, so two workers would both hold a shard. One sequential
probe catches a store that ignores the header; it cannot see a check-then-write
that races (the test server's own suite covers that).
"""

from __future__ import annotations

import os
import uuid

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.storage.host import hostname
from data_juicer_elastic.storage.store import Store

PROBE_FOLDER = ".probe"  # internal: never listed, one key per probing process, deleted after


class StoreRefused(UserError):
    """The store lacks a guarantee the job needs (exit 2, the message names the store and the fix)."""


def probe_key() -> str:
    """A key no other process picks: host, pid and a random tag."""
    return f"{PROBE_FOLDER}/{hostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def check_create_once(store: Store) -> None:
    """Create one probe key twice; raise StoreRefused unless the second create is refused and the first stays."""
    key, token = probe_key(), uuid.uuid4().hex
    first, second = f"probe A {token}\n".encode(), f"probe B {token}\n".encode()
    try:
        if store.create(key, first) is None:
            raise StoreRefused(f"{store.describe()}: the store refused the first create of {key}, a fresh key")
        lost = store.create(key, second)
        got = store.read(key)
        if lost is not None or got is None or got[0] != first:
            raise StoreRefused(
                f"{store.describe()}: the store accepted a second create of {key} (If-None-Match: * ignored), "
                "so it does not honour create-once writes and cannot hold leases or done records. Use a store "
                "with conditional writes (AWS S3, MinIO) or a shared POSIX directory."
            )
    finally:
        try:
            store.delete(key)
        except Exception:
            pass  # a probe key left behind is harmless (internal, never listed); the probe's own error matters
