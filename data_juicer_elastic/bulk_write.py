"""Sequential writing of large new files (shards, the merged output), past the page cache.

Why: on virtual machines every newly written page-cache page may first be
faulted in from the host, which costs more CPU than hashing the same bytes;
and nobody on this node rereads a shard or the merged output soon. So data
is staged in an aligned buffer and written with O_DIRECT in large aligned
chunks. Where O_DIRECT is refused (tmpfs, many FUSE mounts) the writer
falls back to ordinary writes; the bytes on disk are the same either way.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os

ALIGN = 4096
BUFFER = 4 << 20
_DIRECT = getattr(os, "O_DIRECT", 0)


class BulkWriter:
    """Write-only, append-only file; ``close(fsync=True)`` makes it durable."""

    def __init__(self, path: str | os.PathLike, *, exclusive: bool = True, direct: bool = True) -> None:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
        self.direct = bool(direct and _DIRECT)
        self.fd = self._open(path, flags)
        self._buf = mmap.mmap(-1, BUFFER) if self.direct else None  # page-aligned
        self._view = memoryview(self._buf) if self._buf is not None else None
        self._fill = 0
        self.size = 0

    def _open(self, path: str | os.PathLike, flags: int) -> int:
        if self.direct:
            try:
                return os.open(path, flags | _DIRECT, 0o644)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct = False
        return os.open(path, flags, 0o644)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        self.size += len(view)
        if not self.direct:
            _write_all(self.fd, view)
            return
        while view:
            n = min(len(view), BUFFER - self._fill)
            self._view[self._fill : self._fill + n] = view[:n]  # type: ignore[index]
            self._fill += n
            view = view[n:]
            if self._fill == BUFFER:
                self._flush(BUFFER)

    def _flush(self, n: int) -> None:
        """Write the first ``n`` (aligned) buffered bytes; switch to buffered I/O if refused."""
        chunk = self._view[:n]  # type: ignore[index]
        if self.direct:
            try:
                _write_all(self.fd, chunk)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._buffered()
                _write_all(self.fd, chunk)
        else:
            _write_all(self.fd, chunk)
        self._view[: self._fill - n] = self._view[n : self._fill]  # type: ignore[index]
        self._fill -= n

    def _buffered(self) -> None:
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~_DIRECT)
        self.direct = False

    def close(self, fsync: bool = True) -> None:
        try:
            if self._fill:
                aligned = self._fill - self._fill % ALIGN
                if aligned:
                    self._flush(aligned)
                if self._fill:  # an unaligned tail: plain write
                    if self.direct:
                        self._buffered()
                    self._flush(self._fill)
            if fsync:
                os.fsync(self.fd)
        finally:
            os.close(self.fd)
            if self._view is not None:
                self._view.release()
                try:
                    self._buf.close()  # type: ignore[union-attr]
                except BufferError:
                    pass  # a failed write's traceback still holds a slice; the mmap goes when it does

    def __enter__(self) -> BulkWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._fill = 0  # the file is being abandoned: flushing could only raise over the real error
            self.close(fsync=False)


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]
