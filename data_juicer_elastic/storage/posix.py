"""``PosixStore``: the storage interface on a shared POSIX directory, by today's ``files.py`` primitives.

Nothing here changes how a file is written: ``create`` is ``publish_once``
(temp + link: whole bytes or nothing, first writer wins), ``replace`` is
``atomic_write`` (temp + fsync + rename), ``now`` is ``server_now`` (the file
server's clock), ``renew`` is ``touch`` (the file server stamps the write) and
``release`` sets the mtime to ``RELEASED_MTIME``. Folders are made on demand, since a key implies its parents.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from data_juicer_elastic.storage.files import atomic_write, publish_once, server_now, touch
from data_juicer_elastic.storage.keys import Entry, Meta, Ver, is_internal, normalise_key, normalise_prefix

CLOCK_KEY = ".clock"  # the file ``now`` touches: internal (never listed), one per store
RELEASED_MTIME = 1  # a released lease's mtime, at or below it reads as released (sshfs turns 0 into "now")

T = TypeVar("T")


def ver_of(st: os.stat_result) -> Ver:
    """Inode, mtime and size: a rename, a rewrite or a touch each give a new version."""
    return f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"


class PosixStore:
    """The job dir as a folder on a POSIX file system every node mounts."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"PosixStore({str(self.root)!r})"

    def describe(self) -> str:
        return str(self.root)

    def path(self, key: str) -> Path:
        """The file that holds ``key`` (normalised and confined)."""
        return self.root / normalise_key(key)

    def create(self, key: str, data: bytes) -> Ver | None:
        path = self.path(key)
        if not _in_folder(path, lambda: publish_once(path, data)):
            return None
        return ver_of(os.lstat(path))

    def replace(self, key: str, data: bytes, if_ver: Ver | None = None) -> Ver | None:
        path = self.path(key)
        if if_ver is not None and self._ver(path) != if_ver:
            return None  # compare, then rename: as today (fencing never rested on it)
        _in_folder(path, lambda: atomic_write(path, data))
        return ver_of(os.lstat(path))

    def renew(self, key: str, ver: Ver) -> Ver | None:
        path = self.path(key)
        st = self._stat(path)
        if st is None or ver_of(st) != ver or st.st_mtime <= RELEASED_MTIME:
            return None  # replaced, touched by another, gone or released: lost, and left as it is
        try:
            touch(path)  # a write, so the file server stamps its own clock (utime would send the node's)
        except FileNotFoundError:
            return None
        return self._ver(path)

    def release(self, key: str, ver: Ver | None = None) -> bool:
        path = self.path(key)
        if ver is not None and self._ver(path) != ver:
            return False
        try:
            os.utime(path, (RELEASED_MTIME, RELEASED_MTIME))  # one call, as claims.py always released
        except FileNotFoundError:
            return False
        return True

    def read(self, key: str) -> tuple[bytes, Meta] | None:
        try:
            fd = os.open(self.path(key), os.O_RDONLY | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None  # a link: no key is one
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            chunks = []
            while chunk := os.read(fd, max(st.st_size, 1 << 16)):
                chunks.append(chunk)
        finally:
            os.close(fd)
        return b"".join(chunks), self._meta(st)

    def head(self, key: str) -> Meta | None:
        st = self._stat(self.path(key))
        return None if st is None else self._meta(st)

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

    def now(self) -> float:
        return server_now(self.root / CLOCK_KEY)

    def _meta(self, st: os.stat_result) -> Meta:
        # stat first, clock second: the age can only come out a little larger, never negative
        return Meta(st.st_size, ver_of(st), st.st_mtime, self.now(), st.st_mtime <= RELEASED_MTIME)

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


def _in_folder(path: Path, write: Callable[[], T]) -> T:
    """Run ``write``; if the key's folder is missing, make it and run it again (one mkdir on a miss only)."""
    try:
        return write()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return write()
