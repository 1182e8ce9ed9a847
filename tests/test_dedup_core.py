"""Staged dedup (docs/DEDUP.md) against Data-Juicer's own ops on the whole input, row for row and in order.

The stages run in-process here (hash per shard -> key files -> bucket decisions -> join -> filter), through the
very modules the worker loop will call; the reference is Data-Juicer's ``compute_hash`` then ``process``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_juicer_elastic.dedup import decide, join, keyfile, records
from data_juicer_elastic.dedup.plan import plan
from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.ray_runner import dedup_keys

EXACT = {"document_deduplicator": {"lowercase": True, "ignore_non_character": False}}
MINHASH = {
    "document_minhash_deduplicator": {
        "tokenization": "space",
        "window_size": 3,
        "num_permutations": 128,
        "num_bands": 16,
        "num_rows_per_band": 8,
    }
}
WORDS = [f"w{i}" for i in range(3000)]
Row = dict[str, Any]


def long_filter(rows: list[tuple[int, Row]]) -> list[tuple[int, Row]]:
    """A per-row filter between the dedups (stands in for any Filter op: a segment's ops run on each shard)."""
    return [(i, r) for i, r in rows if len(r["text"].split()) >= 6]


def reference(rows: list[Row], ops: Sequence[Any], between: Callable | None) -> list[str]:
    """Data-Juicer on the whole input: each dedup's ``compute_hash`` on every row, then its ``process``."""
    from data_juicer.core.data import NestedDataset

    ds = NestedDataset.from_list([dict(r) for r in rows])
    for n, op in enumerate(ops):
        if n and between is not None:
            ds = NestedDataset.from_list([r for _, r in between([(i, dict(r)) for i, r in enumerate(ds.to_list())])])
        ds = ds.map(op.compute_hash)
        ds, _ = op.process(ds)
    return [r["text"] for r in ds.to_list()]


def staged(
    rows: list[Row], ops: Sequence[tuple[Any, str]], shards: int, buckets: int, between: Callable | None
) -> list[str]:
    """The stages over ``shards`` contiguous input shards; a dict of bytes stands in for the job dir."""
    starts = [len(rows) * s // shards for s in range(shards)]
    ends = [*starts[1:], len(rows)]
    parts = [[(i, rows[i]) for i in range(a, b)] for a, b in zip(starts, ends, strict=True)]
    for n, (op, kind) in enumerate(ops):
        if n and between is not None:
            parts = [between(p) for p in parts]
        keyfiles = [dedup_keys.shard_keyfile(op, kind, [r for _, r in p], [i for i, _ in p], buckets) for p in parts]
        readers = [keyfile.from_bytes(f) for f in keyfiles]
        tables = [keyfile.read_table(r) for r in readers]
        bucket_out = []
        for b in range(buckets):
            slices = [keyfile.read_bucket(r, t, b) for r, t in zip(readers, tables, strict=True)]
            if kind == "exact":
                bucket_out.append(records.encode_indices(decide.exact_removed(slices)))
            else:
                bucket_out.append(records.encode_edges(decide.minhash_edges(slices)))
        if kind == "exact":
            removed = join.exact_removed(records.decode_indices(f) for f in bucket_out)
        else:
            removed = join.minhash_removed(records.decode_edges(f) for f in bucket_out)
        removed_file = join.removed_file(removed, starts)
        parts = [
            [(i, r) for i, r in p if i not in join.removed_for_shard(keyfile.from_bytes(removed_file), s)]
            for s, p in enumerate(parts)
        ]
    return [r["text"] for p in parts for _, r in p]


def build(entry: dict[str, dict]) -> tuple[Any, str]:
    (stage,) = plan([entry]).dedups
    return dedup_keys.build_op(stage), stage.kind


@pytest.fixture(scope="module")
def exact_op():
    return build(EXACT)


@pytest.fixture(scope="module")
def minhash_op():
    return build(MINHASH)


def text(rng: random.Random, n: int = 40) -> list[str]:
    return [rng.choice(WORDS) for _ in range(n)]


def edit(words: list[str], rng: random.Random, positions: range) -> list[str]:
    out = list(words)
    for p in positions:
        out[p] = rng.choice(WORDS)
    return out


def planted_corpus(seed: int = 7) -> tuple[list[Row], list[tuple[int, int, int]]]:
    """Far rows, exact copies (some differing in case only), near copies, chains A~B~C, short rows; shuffled."""
    rng = random.Random(seed)
    docs: list[str] = [" ".join(text(rng)) for _ in range(60)]
    docs += [docs[k].upper() if k % 2 else docs[k] for k in range(0, 60, 5)]
    docs += [" ".join(edit(docs[k].split(), rng, range(0, 2))) for k in range(1, 60, 6)]
    chains = []
    for _ in range(12):
        a = text(rng)
        b = edit(a, rng, range(0, 5))
        c = edit(b, rng, range(35, 40))
        chains.append(tuple(" ".join(x) for x in (a, b, c)))
        docs += chains[-1]
    docs += [" ".join(text(rng, 4)) for _ in range(6)]
    rng.shuffle(docs)
    where = {d: i for i, d in enumerate(docs)}
    return [{"text": d} for d in docs], [tuple(where[x] for x in c) for c in chains]


def band_linked(op: Any, x: str, y: str) -> bool:
    ka, kb = (set(dedup_keys.row_keys(op, "minhash", {"text": t})) for t in (x, y))
    return bool(ka & kb)


def test_planted_corpus_matches_data_juicer(exact_op, minhash_op):
    rows, chains = planted_corpus()
    op = minhash_op[0]
    true_chains = [
        c
        for c in chains
        if band_linked(op, rows[c[0]]["text"], rows[c[1]]["text"])
        and band_linked(op, rows[c[1]]["text"], rows[c[2]]["text"])
        and not band_linked(op, rows[c[0]]["text"], rows[c[2]]["text"])
    ]
    assert true_chains, "the corpus plants no chain the LSH sees as A~B~C without A~C"
    want = reference(rows, [exact_op[0], minhash_op[0]], long_filter)
    for shards, buckets in [(1, 1), (4, 3), (7, 16), (len(rows), 5)]:
        got = staged(rows, [exact_op, minhash_op], shards, buckets, long_filter)
        assert got == want, (shards, buckets)
    print(f"planted: {len(rows)} rows, {len(true_chains)} chains, {len(want)} kept")
    assert len(want) < len(rows) - 6 - len(true_chains)  # copies, near copies and chains all removed something
    for c in true_chains:  # a chain keeps only its first row, though its ends are not near each other
        kept = [rows[i]["text"] in want for i in sorted(c)]
        assert kept == [True, False, False]


@pytest.mark.parametrize("entry", [EXACT, MINHASH], ids=["exact", "minhash"])
def test_each_dedup_alone_matches(entry, exact_op, minhash_op):
    rows, _ = planted_corpus(seed=11)
    op = exact_op if entry is EXACT else minhash_op
    want = reference(rows, [op[0]], None)
    assert staged(rows, [op], 5, 7, None) == want
    assert len(want) < len(rows)
    print(f"{op[1]} alone: {len(rows)} rows, {len(want)} kept")


VOCAB = ["a", "b", "c", "d", "e"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    docs=st.lists(st.lists(st.sampled_from(VOCAB), min_size=0, max_size=7).map(" ".join), min_size=0, max_size=30),
    shards=st.integers(1, 6),
    buckets=st.integers(1, 9),
    kind=st.sampled_from(["exact", "minhash", "both"]),
)
def test_property_random_corpora(docs, shards, buckets, kind, exact_op, minhash_op):
    """Small vocabularies make exact copies, band collisions and chains common; empty texts included."""
    rows = [{"text": d} for d in docs]
    chosen = {"exact": [exact_op], "minhash": [minhash_op], "both": [exact_op, minhash_op]}[kind]
    shards = max(1, min(shards, len(rows)))
    assert staged(rows, chosen, shards, buckets, None) == reference(rows, [o for o, _ in chosen], None)


def test_plan_cuts_at_each_dedup_and_maps_ray_twins():
    process = [
        {"whitespace_normalization_mapper": None},
        {"ray_document_deduplicator": {"backend": "redis", "lowercase": True}},
        "text_length_filter",
        {"ray_bts_minhash_deduplicator": {"union_find_parallel_num": 4, "window_size": 3}},
    ]
    got = plan(process)
    assert [len(s.ops) for s in got.segments] == [1, 1, 0]
    first, second = got.dedups
    assert (first.builder, first.kind, dict(first.args)) == ("document_deduplicator", "exact", {"lowercase": True})
    assert (second.builder, dict(second.args)) == ("document_minhash_deduplicator", {"window_size": 3})
    assert [(s.name, s.dedup) for s in got.stages] == [
        ("hash", 0),
        ("bucket", 0),
        ("join", 0),
        ("hash", 1),
        ("bucket", 1),
        ("join", 1),
        ("final", 2),
    ]
    assert [s.name for s in plan(["text_length_filter"]).stages] == ["final"]
    with pytest.raises(ValueError, match=r"document_simhash_deduplicator .*run here: document_deduplicator"):
        plan([{"document_simhash_deduplicator": {}}])


def test_keyfile_buckets_by_range_through_the_store(tmp_path):
    from data_juicer_elastic.storage.posix import PosixStore

    recs = [(keyfile.bucket_of(bytes([k]) * 4, 5), bytes([k]) * 4, 100 - k) for k in range(40)]
    data = keyfile.encode(recs, 5, 4)
    store = PosixStore(tmp_path)
    assert store.create("dedup/0/keys/part-0", data) is not None
    read = keyfile.from_store(store, "dedup/0/keys/part-0")
    table = keyfile.read_table(read)
    for b in range(5):
        want = sorted((k, i) for bb, k, i in recs if bb == b)
        assert keyfile.read_bucket(read, table, b) == want == keyfile.read_one(read, b)
    assert sum(len(keyfile.read_bucket(read, table, b)) for b in range(5)) == 40
    cut = keyfile.from_bytes(data[:-3])  # the table is whole; the last bucket holding records is cut
    last = max(b for b, _, _ in recs)
    with pytest.raises(IntegrityError, match="cut"):
        keyfile.read_bucket(cut, keyfile.read_table(cut), last)
    with pytest.raises(IntegrityError, match="cut"):
        keyfile.read_table(keyfile.from_bytes(data[:30]))
    with pytest.raises(IntegrityError, match="missing"):
        keyfile.read_table(keyfile.from_store(store, "dedup/0/keys/part-9"))
    with pytest.raises(IntegrityError):
        records.decode_edges(records.encode_edges([(1, 2), (1, 3)])[:-1])


def test_join_keeps_component_minimum_across_buckets():
    edges = [[(5, 9), (2, 7)], [(7, 9)], [(30, 31)]]  # 2-7, 7-9, 5-9: one component led by 2
    removed = join.minhash_removed(edges)
    assert removed == [5, 7, 9, 31]
    starts = [0, 6, 30]
    data = join.removed_file(removed, starts)
    got = [join.removed_for_shard(keyfile.from_bytes(data), s) for s in range(3)]
    assert got == [{5}, {7, 9}, {31}]
