"""The join: every bucket's edges into components, each keeping its smallest global index; the rest removed.

Nodes are only rows that have an edge, so memory grows with the duplicate edges, never with the rows. The result
goes out as one key file whose buckets are the input shards, so each filter shard reads one byte range.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from data_juicer_elastic.dedup import keyfile


class UnionFind:
    """Disjoint sets whose root is always the set's smallest member (as Data-Juicer's ``UnionFind``), so a
    component's root is its first row in input order; path halving keeps it iterative at any depth."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        parent = self.parent
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, x: int, y: int) -> None:
        rx, ry = self.find(x), self.find(y)
        if rx != ry:
            low, high = min(rx, ry), max(rx, ry)
            self.parent[high] = low


def minhash_removed(edge_batches: Iterable[Iterable[tuple[int, int]]]) -> list[int]:
    """Every row with an edge whose component's smallest index is not its own, sorted."""
    uf = UnionFind()
    for edges in edge_batches:
        for u, v in edges:
            uf.union(u, v)
    return sorted(x for x in uf.parent if uf.find(x) != x)


def exact_removed(removed_batches: Iterable[Iterable[int]]) -> list[int]:
    """Exact dedup needs no union: buckets' removed lists are disjoint (a row has one hash); merged and sorted."""
    return sorted({i for batch in removed_batches for i in batch})


def shard_of(index: int, shard_starts: Sequence[int]) -> int:
    """The input shard holding global ``index``: ``shard_starts`` are each shard's first index, ascending."""
    shard = bisect.bisect_right(shard_starts, index) - 1
    if shard < 0:
        raise ValueError(f"index {index} is before the first shard's start {shard_starts[0]}")
    return shard


def removed_file(removed: Iterable[int], shard_starts: Sequence[int]) -> bytes:
    """The removed indices as one key file (empty keys) bucketed by input shard, for the filter pass."""
    records = ((shard_of(i, shard_starts), b"", i) for i in removed)
    return keyfile.encode(records, len(shard_starts), 0)


def removed_for_shard(read: keyfile.ReadRange, shard: int, where: str = "removed file") -> set[int]:
    """One input shard's removed global indices, read as its own byte range of the join's file."""
    return {index for _, index in keyfile.read_one(read, shard, where)}
