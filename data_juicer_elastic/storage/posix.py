"""``PosixStore``: the storage interface on a shared POSIX directory, by today's ``files.py`` primitives.

Nothing here changes how a file is written: ``create`` is ``publish_once``
(temp + link: whole bytes or nothing, first writer wins) or, ``exclusive``,
``create_exclusive`` (O_EXCL + write: a lease), ``replace`` is
``atomic_write`` (temp + fsync + rename; ``durable=False`` leaves out the folder fsync after the link or
rename, as ``replace_small`` always did), ``now`` is ``server_now`` (the file
server's clock), ``renew`` rewrites a byte as ``touch`` does (the file server stamps the write) and
``release`` sets the mtime to ``RELEASED_MTIME``; ``upload`` and ``download`` copy bulk data through a temp
name and ``publish_once``'s link or ``atomic_write``'s rename (``stage_blocks``). Folders are made on demand,
since a key implies its parents.
Each call is the system calls ``job/claims.py`` made by hand before (tests/test_scale.py counts them): an age
is one lstat when the caller holds ``now``, and a read or create probes the clock only if its age is asked for.
A create or replace takes the new version from its temp file's ``fstat`` (a link or rename keeps the inode,
size and mtime), not from a stat of the name after.
"""

from __future__ import annotations

import errno
import filecmp
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from data_juicer_elastic.storage.blocks import blocks
from data_juicer_elastic.storage.files import (
    atomic_write,
    create_exclusive,
    in_folder,
    is_disk_full,
    link_staged,
    publish_once,
    rename_staged,
    server_now,
    stage_blocks,
)
from data_juicer_elastic.storage.keys import Entry, Meta, Ver, is_internal, normalise_key, normalise_prefix
from data_juicer_elastic.storage.lapse import lapse_clock
from data_juicer_elastic.storage.urls import ObjectPath

CLOCK_KEY = ".clock"  # the file ``now`` touches: internal (never listed), one per store
RELEASED_MTIME = 1  # a released lease's mtime, at or below it reads as released (sshfs turns 0 into "now")
LEASE_BYTES = 1 << 16  # leases are small: renew compares at most this much
LEASES_KEPT = 1024  # lease bytes remembered for renew (one per lease created or renewed here)


def ver_of(st: os.stat_result) -> Ver:
    """Inode, mtime and size: a rename, a rewrite or a touch each give a new version."""
    return f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"


class PosixStore:
    """The job dir as a folder on a POSIX file system every node mounts."""

    def __init__(self, root: str | os.PathLike, clock_key: str = CLOCK_KEY) -> None:
        if isinstance(root, ObjectPath):
            raise TypeError(f"{root}: a job dir on an object store has its own store (JobDir.store), not a folder")
        self.root = Path(root)
        self._root = str(self.root)  # reads join strings: on 100,000 done records a Path per key costs more
        self.clock_key = normalise_key(clock_key)  # a process may keep its own probe (claims.py: one per worker)
        self._leases: dict[str, tuple[Ver, bytes]] = {}  # key -> the version its last write here handed out, its bytes
        self._leases_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PosixStore({str(self.root)!r})"

    errors: tuple[type[Exception], ...] = (OSError,)
    stamp_resolution = 0.01  # an mtime and the clock probe's are both the kernel's coarse clock: a tick apart

    def describe(self) -> str:
        return str(self.root)

    def with_clock(self, key: str) -> PosixStore:
        return PosixStore(self.root, clock_key=key)

    def path(self, key: str) -> Path:
        """The file that holds ``key`` (normalised and confined)."""
        return self.root / normalise_key(key)

    def create(
        self, key: str, data: bytes, *, exclusive: bool = False, durable: bool = True, deadline: float | None = None
    ) -> Meta | None:
        """``deadline``: checked before the create's one call that publishes (a link or O_EXCL open): a local
        call lands when it returns, so a late one is refused (a hung mount may still hold it past it)."""
        if deadline is not None and lapse_clock() >= deadline:
            raise TimeoutError(f"{self.root / key}: not written, its deadline passed (the lease may have lapsed)")
        path = self.path(key)
        if exclusive:
            won = in_folder(path, lambda: create_exclusive(path, data, durable=durable))
            st = os.lstat(path) if won else None
        else:
            st = in_folder(path, lambda: publish_once(path, data, durable=durable))
        if st is None:
            return None
        meta = self._meta(st, None)
        self._remember(normalise_key(key), meta.ver, data)
        return meta

    def replace(self, key: str, data: bytes, if_ver: Ver | None = None, *, durable: bool = True) -> Ver | None:
        """``if_ver`` is compared as ``renew`` compares (``_holds``: the bytes this store last wrote there,
        else the size and mtime, never the inode: sshfs may renumber the file between an attempt's two
        writes). Compare, then rename: as today (fencing never rested on it)."""
        norm = normalise_key(key)
        path = self.root / norm
        if if_ver is not None:
            known = self._known(norm)
            if not _holds(known, if_ver, _read_head(path, known), lambda: self._stat(path)):
                return None
        ver = ver_of(in_folder(path, lambda: atomic_write(path, data, durable=durable)))
        self._remember(norm, ver, data)
        return ver

    def renew(self, key: str, ver: Ver) -> Ver | None:
        """Rewrite the first byte in place (the file server stamps the write; utime would send the node's clock).

        Lost unless the file still holds what ``ver`` named (``_holds``: the
        bytes this store last wrote there, else size and mtime, never the
        inode). One open: fstat, pread, pwrite, fstat.
        """
        norm = normalise_key(key)
        fd = _open_unlinked(str(self.root / norm), os.O_RDWR)  # a link: no lease is one
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_mtime <= RELEASED_MTIME:
                return None  # released (or not a file): lost, and left as it is
            data = os.pread(fd, LEASE_BYTES, 0)
            if not _holds(self._known(norm), ver, data, lambda: st):
                return None  # another lease stands there now, or it was rewritten or touched since ``ver``
            try:
                os.pwrite(fd, data[:1] or b"\n", 0)
            except OSError as exc:
                if not is_disk_full(exc):
                    raise
                os.utime(fd, None)  # as touch does: a full disk still lets the lease live
            new = ver_of(os.fstat(fd))
        finally:
            os.close(fd)
        self._remember(norm, new, data or b"\n")
        return new

    def upload(self, key: str, local_path: str | os.PathLike, *, create_once: bool) -> Meta | None:
        """Copied whole to a temp name beside the key (``BulkWriter``, past the page cache, fsynced), then
        linked (``create_once``: EEXIST is None unless the bytes there are ours, as ``publish_once`` decides)
        or renamed over it. A killed upload leaves only the temp, a dot name no listing shows."""
        norm = normalise_key(key)
        path = self.root / norm
        with open(local_path, "rb", buffering=0) as src:
            tmp, st = stage_blocks(path, blocks(src), direct=True, fsync=True)
        self._forget(norm)
        if create_once:
            won = link_staged(tmp, path, st, lambda: filecmp.cmp(tmp, path, shallow=False), durable=True)
            return None if won is None else self._meta(won, None)
        rename_staged(tmp, path)
        return self._meta(st, None)

    def download(self, key: str, local_path: str | os.PathLike) -> Meta | None:
        """Copied to a temp name beside ``local_path``, renamed over it; not fsynced (node-local scratch, which
        a crash of the node takes with the attempt)."""
        opened = self._open_file(key)
        if opened is None:
            return None
        fd, st = opened
        with os.fdopen(fd, "rb", buffering=0) as src:
            tmp, _ = stage_blocks(local_path, blocks(src), direct=False, fsync=False)
        rename_staged(tmp, local_path, durable=False)
        return self._meta(st, None)

    def open_range(self, key: str, start: int, end: int) -> bytes | None:
        opened = self._open_file(key)
        if opened is None:
            return None
        fd, parts, at = opened[0], [], start
        try:
            while at < end and (chunk := os.pread(fd, end - at, at)):  # whole, or short where the file ends
                parts.append(chunk)
                at += len(chunk)
        finally:
            os.close(fd)
        return b"".join(parts)

    def open_read(self, key: str) -> BinaryIO | None:
        # open's own fstat refuses a folder: one open and one fstat, as a plain open() of the path costs
        try:
            return open(os.path.join(self._root, normalise_key(key)), "rb", buffering=0, opener=_open_no_link)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def release(self, key: str, ver: Ver | None = None) -> bool:
        path = self.path(key)
        if ver is not None and self._ver(path) != ver:
            return False
        try:
            os.utime(path, (RELEASED_MTIME, RELEASED_MTIME))  # one call, as claims.py always released
        except FileNotFoundError:
            return False
        return True

    def read(self, key: str, now: float | None = None) -> tuple[bytes, Meta] | None:
        opened = self._open_file(key)
        if opened is None:
            return None
        fd, st = opened
        try:
            chunks = [os.read(fd, st.st_size + 1)]  # one read when the file is what fstat said (a record is)
            if len(chunks[0]) != st.st_size:  # it changed meanwhile, or a short read: read on to its end
                while chunk := os.read(fd, 1 << 16):
                    chunks.append(chunk)
        finally:
            os.close(fd)
        return b"".join(chunks), self._meta(st, now)

    def head(self, key: str, now: float | None = None) -> Meta | None:
        """One lstat. What occupies the name, not followed: a planted link keeps the name taken (a create
        there fails) and ages by its own mtime, as claims.py always read it; a folder is no key."""
        try:
            st = os.lstat(self.path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return None if stat.S_ISDIR(st.st_mode) else self._meta(st, now)

    def delete(self, key: str, if_ver: Ver | None = None) -> bool:
        path = self.path(key)
        if if_ver is not None and self._ver(path) != if_ver:
            return False
        try:
            os.unlink(path)
        except FileNotFoundError:
            return if_ver is None
        return True

    def list(self, prefix: str) -> Iterator[Entry]:
        base = normalise_prefix(prefix)
        found = []
        for folder, dirs, files in os.walk(self.root / base if base else self.root):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            rel = Path(folder).relative_to(self.root).as_posix()
            for name in files:
                key = name if rel == "." else f"{rel}/{name}"
                st = None if is_internal(key) else self._stat(Path(folder) / name)
                if st is not None:
                    found.append(Entry(key, st.st_size, ver_of(st), st.st_mtime))
        yield from sorted(found, key=lambda e: e.key.encode())  # S3's order: by the key's UTF-8 bytes

    def names(self, prefix: str) -> list[str]:
        base = normalise_prefix(prefix)
        try:
            found = os.listdir(os.path.join(self._root, base))  # one listing, nothing stat'd
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [n for n in found if not n.startswith(".")]  # ``is_internal`` of one part, on 100,000 names

    def stamp(self, prefix: str) -> str | None:
        """The folder's mtime in nanoseconds (one stat, links followed as a folder's path always was)."""
        try:
            return str(os.stat(os.path.join(self._root, normalise_prefix(prefix))).st_mtime_ns)
        except (FileNotFoundError, NotADirectoryError):
            return ""

    def now(self) -> float:
        return server_now(self.root / self.clock_key)

    def _open_file(self, key: str) -> tuple[int, os.stat_result] | None:
        """A read descriptor on ``key``'s regular file and its fstat; None when no key is there (missing, a
        link, a folder): ``read``, ``download`` and ``open_range`` read through it."""
        fd = _open_unlinked(os.path.join(self._root, normalise_key(key)), os.O_RDONLY)
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None
        return fd, st

    def _meta(self, st: os.stat_result, now: float | None) -> Meta:
        # stat first, clock second (when not given): the age can only come out a little larger, never negative
        clock = self.now if now is None else now
        return Meta(st.st_size, ver_of(st), st.st_mtime, clock, st.st_mtime <= RELEASED_MTIME)

    def _known(self, key: str) -> tuple[Ver, bytes] | None:
        """The version this store's last create, replace or renew of ``key`` handed out, and the bytes it wrote."""
        with self._leases_lock:
            return self._leases.get(key)

    def _remember(self, key: str, ver: Ver, data: bytes) -> None:
        with self._leases_lock:
            self._leases.pop(key, None)  # a larger write than is kept still forgets the bytes it replaced
            if len(data) >= LEASE_BYTES:
                return  # no lease nor small record: renew would compare only its first LEASE_BYTES
            self._leases[key] = (ver, data)  # newest last, so the oldest is dropped first
            while len(self._leases) > LEASES_KEPT:
                del self._leases[next(iter(self._leases))]

    def _forget(self, key: str) -> None:
        """An upload replaced ``key``'s bytes: what this store last wrote there no longer stands."""
        with self._leases_lock:
            self._leases.pop(key, None)

    def _ver(self, path: Path) -> Ver | None:
        st = self._stat(path)
        return None if st is None else ver_of(st)

    @staticmethod
    def _stat(path: Path) -> os.stat_result | None:
        """A regular file's lstat; None when missing, a folder or a link (no key is either)."""
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return st if stat.S_ISREG(st.st_mode) else None


def _same_but_inode(ver: Ver, st: os.stat_result) -> bool:
    """Does ``st`` have ``ver``'s mtime and size (``ver_of``'s last two parts)?"""
    return ver.split("-", 1)[-1] == f"{st.st_mtime_ns}-{st.st_size}"


def _holds(
    known: tuple[Ver, bytes] | None, ver: Ver, data: bytes | None, stat_now: Callable[[], os.stat_result | None]
) -> bool:
    """Does a key still hold what ``ver`` named (``replace(if_ver)`` and ``renew``)? ``known``: what this
    store's last write of it handed out and wrote; ``data``: its bytes now, at least one more than ``known``'s
    (None: unreadable or missing); ``stat_now``: its stat, taken only if needed.

    While that last write stands (the same bytes), only its version holds: an older one of ours is stale even
    where size and mtime agree (one timestamp tick can hold two writes). That version with other bytes:
    rewritten since. Any other version (another process's, nothing remembered): its size and mtime, the inode
    left out, since sshfs may renumber one file.
    """
    if known is not None and data is not None and data == known[1]:
        return ver == known[0]
    if known is not None and ver == known[0]:
        return False
    st = stat_now()
    return st is not None and _same_but_inode(ver, st)


def _read_head(path: Path, known: tuple[Ver, bytes] | None) -> bytes | None:
    """Enough of ``path`` to tell whether it holds ``known``'s bytes (one open, read, close); None when
    nothing is remembered to compare with, or nothing readable is there (missing, a link, a folder, a FIFO)."""
    if known is None:
        return None
    fd = _open_unlinked(str(path), os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    if fd is None:
        return None
    try:
        return os.read(fd, len(known[1]) + 1)
    except OSError:
        return None  # a folder (EISDIR), or a FIFO with no writer
    finally:
        os.close(fd)


def _open_no_link(path: str, flags: int) -> int:
    """``open``'s opener: never through a symbolic link; a link reads as missing."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileNotFoundError(errno.ENOENT, "a symbolic link, not followed", path) from None
        raise


def _open_unlinked(path: str, flags: int) -> int | None:
    """A descriptor on ``path`` itself, never through a symbolic link; None when nothing (or a link) is there."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise
