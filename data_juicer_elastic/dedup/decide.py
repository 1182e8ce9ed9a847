"""What one bucket decides, from every hash shard's slice of it (each sorted by key, then index).

A key's rows all land in one bucket, so a bucket sees each key group whole and needs no other bucket. Slices are
merged as streams: memory grows with the largest key group, not with the bucket.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator
from operator import itemgetter

Record = tuple[bytes, int]
Edge = tuple[int, int]


def groups(slices: Iterable[Iterable[Record]]) -> Iterator[list[int]]:
    """Each key's indices in ascending order, keys in order; one index per row even if a shard was read twice."""
    merged = heapq.merge(*slices)
    for _key, recs in itertools.groupby(merged, key=itemgetter(0)):
        indices = sorted({index for _, index in recs})
        yield indices


def exact_removed(slices: Iterable[Iterable[Record]]) -> list[int]:
    """Exact dedup: per hash the smallest global index (the first row in input order) wins; the rest, sorted."""
    removed: list[int] = []
    for indices in groups(slices):
        removed.extend(indices[1:])
    removed.sort()
    return removed


def minhash_edges(slices: Iterable[Iterable[Record]]) -> list[Edge]:
    """MinHash: per (band, value) group, an edge from its smallest index to each other one (a star, as
    Data-Juicer's ``process`` unions each group into its minimum); sorted and without repeats."""
    edges: set[Edge] = set()
    for indices in groups(slices):
        head = indices[0]
        edges.update((head, other) for other in indices[1:])
    return sorted(edges)
