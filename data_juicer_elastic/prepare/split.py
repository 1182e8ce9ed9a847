"""Byte-balanced, contiguous shard boundaries, found with a few small reads.

The input files are seen as one stream (their plain bytes concatenated in
order). Shard k should start near k/n of the total bytes; each target is
moved forward to the next line start. Where targets collide (very long lines,
few rows) the largest range that still holds two or more lines is split until
there are exactly n non-empty ranges, or it is clear there are fewer than n
rows. Nothing here parses JSON: validation happens when the shards are written.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import dataclass

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
        k = bisect.bisect_left(self._answers, pos)
        if k < len(self._answers) and self._low[self._answers[k]] <= pos:
            return self._answers[k]  # inside a stretch scanned before (one huge line, many targets)
        nl = _find_newline(self.paths[i], pos - self.offsets[i] - 1)
        answer = self.offsets[i + 1] if nl < 0 else self.offsets[i] + nl + 1
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


def _find_newline(path: str, pos: int) -> int:
    """Offset of the first b"\\n" at or after ``pos`` in ``path``, or -1."""
    with open(path, "rb", buffering=0) as f:
        f.seek(pos)
        while block := f.read(SCAN):
            hit = block.find(b"\n")
            if hit >= 0:
                return pos + hit
            pos += len(block)
    return -1


def plan(paths: list[str], sizes: list[int], n: int) -> tuple[Stream, list[tuple[int, int]]]:
    """Exactly ``n`` non-empty contiguous global ranges covering the input, balanced by bytes."""
    stream = Stream(paths, sizes)
    total = stream.total
    cuts = {stream.line_start_at_or_after(k * total // n) for k in range(1, n)}
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
