"""The one storage interface the job dir will sit behind (docs/OBJECT_STORE.md section 1).

Two backends: ``PosixStore`` (a shared POSIX directory, today's ``files.py``)
and ``S3Store`` (an S3 endpoint). Keys are job-relative POSIX paths, confined
to the store's root (:func:`normalise_key`). Every operation the protocol
names is one the job needs from both; what only one backend can do (fsync a
folder, clean temp names) stays out of it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit

from data_juicer_elastic.storage.keys import Entry, Meta, Ver, is_internal, normalise_key, normalise_prefix
from data_juicer_elastic.storage.settings import StorageSettings
from data_juicer_elastic.storage.urls import split_s3

__all__ = ["Entry", "Meta", "Store", "Ver", "is_internal", "normalise_key", "normalise_prefix", "store_for"]


@runtime_checkable
class Store(Protocol):
    """Small whole-object reads and writes with the two guarantees leases and done records rest on.

    ``create`` is create-once (the first writer wins, whole bytes or nothing)
    and ``head``/``read`` report ages on the store's clock, never a node's.
    """

    errors: tuple[type[Exception], ...]
    """What a failed request raises here, lost conditions aside (those are None or False): POSIX OSError; S3
    also botocore's errors once its retries are spent. A caller that outlives a flaky store (the lease
    refresher) catches these and tries again; anything else is a bug and propagates."""

    stamp_resolution: float
    """Seconds a stamp may read off by, from rounding (S3: ``Last-Modified`` and ``Date`` are whole seconds, so an
    age reads up to 1 s over; POSIX: a kernel tick): a lease is stale only past its timeout plus this."""

    def describe(self) -> str:
        """Where the store is, as messages name it (a path; an s3:// URL and its endpoint)."""
        ...

    def create(
        self, key: str, data: bytes, *, exclusive: bool = False, durable: bool = True, deadline: float | None = None
    ) -> Meta | None:
        """Write ``data`` at ``key`` unless a key is there: its Meta, or None when somebody else's is.

        The Meta's ``modified`` is the store's stamp of the create (a lease's
        ``claimed_at``) at no extra request. A key that already holds exactly
        ``data`` may count as this call's own (a resent request whose first
        send landed; an NFS link retransmitted), so bodies that must tell
        writers apart carry a unique token. ``exclusive``: for small records
        whose existence, not content, is the claim (leases): POSIX creates the
        name first and writes after (``O_EXCL``, fewer calls than temp + link),
        so a reader may briefly see it empty; S3 sends the same one PUT.
        ``durable`` as for ``replace`` (False: a power loss may leave the key missing again).
        ``deadline`` (a ``lapse_clock`` reading, a publish's lease end): no write is sent that could land
        after it; one that cannot start in time raises one of ``errors`` instead.
        """
        ...

    def replace(self, key: str, data: bytes, if_ver: Ver | None = None, *, durable: bool = True) -> Ver | None:
        """Replace ``key`` whole; with ``if_ver`` only if it still has that version (None: it changed or went).

        ``durable=False``: the caller accepts that a power loss (or a crash of
        the file server), not a process kill, may roll the key back to its
        previous bytes (for ``create``: no key). POSIX then leaves out the
        folder fsync after the rename or link; the file's bytes are still
        fsynced before it, so no reader ever sees a cut record (the attempt
        record: a worker's own progress, as ``replace_small`` always wrote
        it). S3 ignores it: a PUT is durable once answered.
        """
        ...

    def renew(self, key: str, ver: Ver) -> Ver | None:
        """Heartbeat a lease: the store stamps *its* now as ``modified``; the new version, or None when lost.

        Lost: ``key`` no longer holds what ``ver`` named (S3: its ETag moved;
        POSIX: its bytes differ, as the refresher has always compared, since
        sshfs may renumber an inode) or it was released, or it went; then
        nothing is written, so a lease that moved on is never renewed on its
        new holder's behalf. A renewal within the store's timestamp resolution
        may hand back ``ver`` itself on POSIX.
        """
        ...

    def release(self, key: str, ver: Ver | None = None) -> bool:
        """Give up a lease so it is claimable at once (``head`` says ``released``); False when missing,
        or, with ``ver``, when it no longer has that version (somebody else's lease is left alone)."""
        ...

    def read(self, key: str, now: float | None = None) -> tuple[bytes, Meta] | None:
        """A small key's bytes and the Meta of those very bytes; None when missing.

        ``now``: a reading of ``now()`` the caller holds, to age the key by
        (POSIX then needs no clock probe; S3's response carries its own ``Date``).
        """
        ...

    def head(self, key: str, now: float | None = None) -> Meta | None:
        """Size, version and age of ``key`` without its bytes; None when missing. ``now`` as for ``read``."""
        ...

    def upload(self, key: str, local_path: str | os.PathLike, *, create_once: bool) -> Meta | None:
        """Put a local file at ``key`` whole (bulk data: an attempt's output, a merged output): its Meta.

        Readers see the old bytes or the new, never a part: POSIX copies to a temp name beside the key,
        fsyncs, then links or renames; S3 sends one PUT, or a multipart upload that exists only once
        completed. ``create_once``: None when a key is there (its bytes kept), unless it holds exactly these
        bytes put by this very call (a resend whose first send landed, an NFS link retransmitted); else the
        key is replaced. A killed upload leaves no key and nothing a listing shows.
        """
        ...

    def download(self, key: str, local_path: str | os.PathLike) -> Meta | None:
        """The whole of ``key`` to the local file ``local_path`` (a temp beside it, renamed over it; streamed,
        never held in memory): the Meta of the bytes copied, or None when missing (no local file made)."""
        ...

    def open_range(self, key: str, start: int, end: int) -> bytes | None:
        """Bytes ``[start, end)`` of ``key``, short where it ends; None when missing (POSIX pread, S3 ranged GET)."""
        ...

    def open_read(self, key: str) -> BinaryIO | None:
        """``key`` whole as a stream to read in blocks (``blocks.blocks``), never held in memory; None when
        missing. POSIX: the file, not following a link; S3: one GET, its body checked for length at its end.
        For readers of bulk data (merge, verify); close it (a ``with`` block) when done."""
        ...

    def delete(self, key: str, if_ver: Ver | None = None) -> bool:
        """Remove ``key`` (gone already is fine); with ``if_ver``, False and nothing removed unless it has it."""
        ...

    def list(self, prefix: str) -> Iterator[Entry]:
        """Every key under the folder ``prefix``, recursively, in key order; internal keys left out.

        Off the hot path only: a listing is one request per 1,000 keys on S3.
        """
        ...

    def names(self, prefix: str) -> list[str]:
        """The names directly under the folder ``prefix``, keys and sub-folders alike, in no set order.

        One listing with nothing else read: no size, version or age, so POSIX stats nothing (``listdir``)
        and S3 sends ListObjectsV2 with ``Delimiter='/'`` (one request per 1,000 names). Internal names are
        left out; a missing folder has none. For readers that need names only (the leases, the shards'
        attempt folders); ``list`` for keys with their versions.
        """
        ...

    def stamp(self, prefix: str) -> str | None:
        """A token that moves whenever a name is added directly under the folder ``prefix`` or leaves it
        (``""`` while the folder is missing), for a reader that lists only when it moved; None where the
        backend keeps no such token (S3 has no folders): the reader then lists, or keeps no watch at all.

        POSIX: the folder's mtime, one stat (a rename into or out of it, a link, an unlink stamp it).
        """
        ...

    def now(self) -> float:
        """The store's clock (epoch seconds): the one clock every node reads alike."""
        ...

    def with_clock(self, key: str) -> Store:
        """This store, its clock read through ``key``: POSIX probes the file server's clock by touching a file,
        and each process keeps its own (so no file is touched by every process of a job); a store whose
        clock is its own (S3: a response's ``Date``) returns itself."""
        ...


def store_for(url: str, settings: StorageSettings | None = None) -> Store:
    """The store a job-dir URL names: a path or ``file://`` -> PosixStore; ``s3://bucket/prefix`` -> S3Store.

    ``settings`` (else the process's: ``StorageSettings.from_env``, which the recipe's
    ``elastic_shard.storage`` block was applied to) apply to s3:// only.
    """
    if "://" not in url:
        from data_juicer_elastic.storage.posix import PosixStore

        return PosixStore(Path(url))
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{url}: a file:// URL names a local path (file:///path), not host {parts.netloc!r}")
        from data_juicer_elastic.storage.posix import PosixStore

        return PosixStore(Path(unquote(parts.path)))
    if scheme == "s3":
        from data_juicer_elastic.storage.s3 import S3Store

        bucket, key = split_s3(url)
        return S3Store(bucket, normalise_prefix(unquote(key).lstrip("/")), settings)
    raise ValueError(f"{url}: unknown storage scheme {scheme!r}; use a path, file:// or s3:// (any S3 endpoint)")
