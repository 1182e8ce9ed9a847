"""Sequential writing of large new files (shards, the merged output), past the page cache.

Why: on virtual machines every newly written page-cache page may first be
faulted in from the host, which costs more CPU than hashing the same bytes;
and nobody on this node rereads a shard or the merged output soon. So data
is staged in aligned buffers and written with O_DIRECT in large aligned
chunks. A direct write returns only once the device has the data, so each
full buffer is written by a background thread while the caller fills the
next one: the caller's parsing and hashing overlap the device time, and the
closing fsync has only metadata left to do. The aligned buffers are private
anonymous mappings kept for the next writer in this process: mapping fresh
ones per shard showed up as a tenth of prepare's CPU in page faults and
unmapping. Where O_DIRECT is refused (tmpfs before Linux 6.6, many FUSE
mounts) the writer falls back to ordinary writes; the bytes on disk are the
same either way.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

ALIGN = 4096
BUFFER = 4 << 20
_DIRECT = getattr(os, "O_DIRECT", 0)
_SPARE_LIMIT = 4  # buffers kept for reuse per process (two per writer)

_spare: list[mmap.mmap] = []
_spare_lock = threading.Lock()


def _take_buffer() -> mmap.mmap:
    with _spare_lock:
        if _spare:
            return _spare.pop()
    return mmap.mmap(-1, BUFFER, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # page-aligned


def _give_back(buf: mmap.mmap) -> None:
    with _spare_lock:
        if len(_spare) < _SPARE_LIMIT:
            _spare.append(buf)
            return
    buf.close()


class BulkWriter:
    """Write-only, append-only file; ``close(fsync=True)`` makes it durable."""

    def __init__(self, path: str | os.PathLike, *, exclusive: bool = True, direct: bool = True) -> None:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
        self.direct = bool(direct and _DIRECT)
        self.fd = self._open(path, flags)
        self.size = 0
        self._fill = 0
        self._pending: Future | None = None  # the background write of the other buffer
        self._io: ThreadPoolExecutor | None = None
        self._bufs: list[mmap.mmap] = []
        self._views: list[memoryview] = []
        if self.direct:
            self._io = ThreadPoolExecutor(1, thread_name_prefix="dje-bulk-write")
            self._bufs = [_take_buffer(), _take_buffer()]
            self._views = [memoryview(b) for b in self._bufs]

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
        if not self._views:
            _write_all(self.fd, view)
            return
        while view:
            n = min(len(view), BUFFER - self._fill)
            self._views[0][self._fill : self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
            if self._fill == BUFFER:
                self._hand_off()

    def _hand_off(self) -> None:
        """Start writing the full front buffer in the background; fill the other one meanwhile."""
        self._wait()
        self._pending = self._io.submit(self._write_chunk, self._views[0])  # type: ignore[union-attr]
        self._views.reverse()
        self._fill = 0

    def _wait(self) -> None:
        """Finish the background write, raising its error here, in the caller."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _write_chunk(self, chunk: memoryview) -> None:
        """An aligned chunk, direct if the file system lets us; buffered from the first refusal on."""
        if self.direct:
            try:
                _write_all(self.fd, chunk)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._buffered()
        _write_all(self.fd, chunk)

    def _buffered(self) -> None:
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~_DIRECT)
        self.direct = False

    def close(self, fsync: bool = True) -> None:
        try:
            self._wait()
            if self._fill:
                self._write_tail()
            if fsync:
                os.fsync(self.fd)
        except BaseException:
            self._release(reuse=False)
            raise
        self._release(reuse=True)

    def _write_tail(self) -> None:
        """What is left in the front buffer: its aligned part direct, the rest with a plain write."""
        tail = self._views[0][: self._fill]
        aligned = self._fill - self._fill % ALIGN
        self._write_chunk(tail[:aligned])
        if aligned < self._fill:
            if self.direct:
                self._buffered()
            _write_all(self.fd, tail[aligned:])

    def _release(self, reuse: bool) -> None:
        """Close the file; hand the buffers on after a clean close (nothing can still hold a slice)."""
        if self._io is not None:
            self._io.shutdown(wait=True)
        os.close(self.fd)
        for view in self._views:
            view.release()
        for buf in self._bufs:
            if reuse:
                _give_back(buf)
                continue
            try:
                buf.close()
            except BufferError:
                pass  # a failed write's traceback still holds a slice; the mmap goes when it does
        self._views, self._bufs = [], []

    def __enter__(self) -> BulkWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()

    def abandon(self) -> None:
        """The file is being thrown away: nothing more is written and no error may mask the real one."""
        self._fill = 0
        try:
            self._wait()
        except OSError:
            pass
        self._release(reuse=False)


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]
