"""Byte-balanced, contiguous shard boundaries, found with a few small reads.

The input files are seen as one stream (their plain bytes concatenated in
order). Shard k should start near k/n of the total bytes; each target is
moved forward to the next line start. Where targets collide (very long lines,
few rows) the largest range that still holds two or more lines is split until
there are exactly n non-empty ranges, or it is clear there are fewer than n
rows. Nothing here parses JSON: validation happens when the shards are written.
On an s3:// input each first search is a ranged GET, so they run ``parallel``
at a time (the answers do not depend on their order).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from data_juicer_elastic.prepare.source import read_blocks

SCAN = 1 << 20


class TooFewRows(Exception):
    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.rows = rows


@dataclass(frozen=True)
class Piece:
    """A byte range of one input file inside a shard; it starts and ends at line boundaries."""

    file: int  # index into the input list
    start: int
    end: int


class Stream:
    """Line starts over the concatenation of the input files (global byte offsets)."""

    def __init__(self, paths: list[str], sizes: list[int]) -> None:
        self.paths = paths
        self._lock = threading.Lock()  # the scan cache below, when searches run on several threads
        self.offsets = [0]
        for size in sizes:
            self.offsets.append(self.offsets[-1] + size)
        # scans already done: every pos in [low[a], a] has line start a (no newline in between)
        self._answers: list[int] = []
        self._low: dict[int, int] = {}

    @property
    def total(self) -> int:
        return self.offsets[-1]

    def line_start_at_or_after(self, pos: int) -> int:
        """The first line start >= ``pos`` (a file start always is one; the end counts as one)."""
        if pos >= self.total:
            return self.total
        i = bisect.bisect_right(self.offsets, pos) - 1
        if pos == self.offsets[i]:
            return pos
        with self._lock:
            k = bisect.bisect_left(self._answers, pos)
            if k < len(self._answers) and self._low[self._answers[k]] <= pos:
                return self._answers[k]  # inside a stretch scanned before (one huge line, many targets)
        size = self.offsets[i + 1] - self.offsets[i]
        nl = _find_newline(self.paths[i], pos - self.offsets[i] - 1, size)
        answer = self.offsets[i + 1] if nl < 0 else self.offsets[i] + nl + 1
        with self._lock:
            if answer not in self._low:
                bisect.insort(self._answers, answer)
            self._low[answer] = min(pos, self._low.get(answer, pos))
        return answer

    def pieces(self, start: int, end: int) -> list[Piece]:
        """Split the global range [start, end) at file borders."""
        out = []
        i = bisect.bisect_right(self.offsets, start) - 1
        while start < end:
            stop = min(end, self.offsets[i + 1])
            if stop > start:
                out.append(Piece(i, start - self.offsets[i], stop - self.offsets[i]))
            start = stop
            i += 1
        return out


def _find_newline(path: str, pos: int, size: int) -> int:
    """Offset of the first b"\\n" at or after ``pos`` in ``path`` (``size`` bytes long), or -1."""
    for block in read_blocks(path, pos, size, SCAN):
        hit = block.find(b"\n")
        if hit >= 0:
            return pos + hit
        pos += len(block)
    return -1


def plan(paths: list[str], sizes: list[int], n: int, parallel: int = 1) -> tuple[Stream, list[tuple[int, int]]]:
    """Exactly ``n`` non-empty contiguous global ranges covering the input, balanced by bytes.

    ``parallel``: how many first searches run at once (threads; 1: one after another).
    """
    stream = Stream(paths, sizes)
    total = stream.total
    targets = [k * total // n for k in range(1, n)]
    if parallel > 1 and len(targets) > 1:
        with ThreadPoolExecutor(min(parallel, len(targets))) as pool:
            cuts = set(pool.map(stream.line_start_at_or_after, targets))
    else:
        cuts = {stream.line_start_at_or_after(t) for t in targets}
    cuts.discard(0)
    cuts.discard(total)
    _split_until(stream, cuts, n)
    bounds = [0, *sorted(cuts), total]
    return stream, list(itertools.pairwise(bounds))


def _split_until(stream: Stream, cuts: set[int], n: int) -> None:
    """Split the largest range that holds two or more lines until there are n - 1 cuts."""
    bounds = [0, *sorted(cuts), stream.total]
    heap = [(a - b, a, b) for a, b in itertools.pairwise(bounds)]  # largest range first
    heapq.heapify(heap)
    while len(cuts) < n - 1:
        if not heap:  # every range is a single line
            raise TooFewRows(len(cuts) + 1)
        _, a, b = heapq.heappop(heap)
        cut = _interior_line_start(stream, a, b)
        if cut is None:
            continue
        cuts.add(cut)
        heapq.heappush(heap, (a - cut, a, cut))
        heapq.heappush(heap, (cut - b, cut, b))


def _interior_line_start(stream: Stream, a: int, b: int) -> int | None:
    """A line start strictly inside (a, b), near the middle when there is one there."""
    for probe in ((a + b) // 2, a + 1):
        cut = stream.line_start_at_or_after(probe)
        if a < cut < b:
            return cut
    return None
