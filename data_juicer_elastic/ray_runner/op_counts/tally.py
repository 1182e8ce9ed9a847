"""Per-process row counters of one attempt, in a small memory-mapped file of the attempt's count folder.

An op's batch call runs in whatever Ray worker process Ray picks, once per
batch (once per row for a single-sample op), and nothing tells that process
when its task or the execution ends. So each process keeps its counters in a
shared file mapping: adding to them is a memory write, not a syscall, and
the runner reads every process's file once Ray's execution has returned (the
runner and its Ray workers share the node, hence the page cache).

One file per process (pid and a random tag: no two processes write the same
bytes), holding ``FIELDS`` as int64 per op index, grown when a higher op
index comes. Ray reuses worker processes across attempts, so mappings are
keyed by the attempt's folder and dropped once that folder is gone.
"""

from __future__ import annotations

import mmap
import os
import secrets
import threading
from array import array
from dataclasses import dataclass

FIELDS = ("in", "out", "err", "in_calls", "out_calls")  # calls: which counter ran at all, even on 0 rows
WIDTH = len(FIELDS)
_INITIAL_OPS = 16
_lock = threading.Lock()


@dataclass
class _Mapping:
    fd: int
    mm: mmap.mmap
    view: memoryview  # int64 counters over ``mm``

    def close(self) -> None:
        self.view.release()
        self.mm.close()
        os.close(self.fd)


_mappings: dict[str, _Mapping] = {}  # count folder -> this process's counters there


def add(sink: str, index: int, delta: tuple[int, int, int, int, int]) -> None:
    """Add ``delta`` (one value per ``FIELDS``) to op ``index``'s counters of the attempt counting into ``sink``."""
    base = index * WIDTH
    with _lock:
        m = _mappings.get(sink)
        if m is None or len(m.view) < base + WIDTH:
            try:
                m = _map(sink, index)
            except OSError:  # the folder is gone: a batch of an attempt that already ended counts for nothing
                return
        view = m.view
        for k, value in enumerate(delta):
            if value:
                view[base + k] += value


def _map(sink: str, index: int) -> _Mapping:
    old = _mappings.pop(sink, None)
    if old is None:
        _forget_gone_sinks()
        name = os.path.join(sink, f"{os.getpid()}-{secrets.token_hex(4)}.counts")
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    else:
        fd = os.dup(old.fd)
        old.close()
    size = max(_INITIAL_OPS, 2 * (index + 1)) * WIDTH * 8
    os.ftruncate(fd, max(size, os.fstat(fd).st_size))
    mm = mmap.mmap(fd, size)
    _mappings[sink] = m = _Mapping(fd, mm, memoryview(mm).cast("q"))
    return m


def _forget_gone_sinks() -> None:
    for sink in [s for s in _mappings if not os.path.isdir(s)]:
        _mappings.pop(sink).close()


os.register_at_fork(after_in_child=_mappings.clear)  # a forked child counts into files of its own


def read(sink: str) -> list[list[int]]:
    """Every process's counters in ``sink`` summed: one list of ``FIELDS`` values per op index."""
    totals = array("q")
    for name in os.listdir(sink):
        if not name.endswith(".counts"):
            continue
        with open(os.path.join(sink, name), "rb") as f:
            counters = array("q", f.read())
        if len(counters) > len(totals):
            totals.extend([0] * (len(counters) - len(totals)))
        for i, value in enumerate(counters):
            totals[i] += value
    return [list(totals[i : i + WIDTH]) for i in range(0, len(totals), WIDTH)]
