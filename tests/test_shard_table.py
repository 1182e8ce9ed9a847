"""The manifest's shard table: a process holds two columns, and reads a shard's facts a block at a time."""

from __future__ import annotations

import gc

import pytest

from data_juicer_elastic.job.layout import JobDir, shard_id
from data_juicer_elastic.job.shard_table import BLOCK, ShardSpec, ShardTable

from .benchmarks.synthetic import synthetic_job

SHARDS = 3 * BLOCK + 5  # a last block that is not full


def _live_specs() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is ShardSpec)


def test_a_loaded_manifest_holds_no_shard_spec_and_a_lookup_parses_one_block(tmp_path):
    synthetic_job(tmp_path / "job", 5000)
    before = _live_specs()
    job = JobDir(tmp_path / "job")
    table = job.manifest().shards
    assert len(table) == 5000 and sum(table.rows) == 5000
    assert _live_specs() == before  # every block was checked at load, none kept
    spec = job.shard(shard_id(4321, 5000))
    assert spec.id == shard_id(4321, 5000) and spec.first_row == 4321 and spec.path == f"shards/{spec.id}.jsonl"
    assert _live_specs() - before <= BLOCK
    assert job.shard(shard_id(4320, 5000)).first_row == 4320  # the same block, kept


def test_the_table_reads_back_what_prepare_wrote(tmp_path):
    _, specs = synthetic_job(tmp_path / "job", SHARDS)
    table = JobDir(tmp_path / "job").manifest().shards
    assert list(table) == list(specs) and table == ShardTable.of(specs)
    assert table[-1] == specs[-1] and table[BLOCK : BLOCK + 2] == list(specs[BLOCK : BLOCK + 2])
    assert table.ids() == [s.id for s in specs]
    rows, sizes = table.rows_by_id(), table.bytes_by_id()
    assert dict(rows) == {s.id: s.rows for s in specs} and dict(sizes) == {s.id: s.bytes for s in specs}
    for foreign in (shard_id(0, SHARDS + 1), shard_id(SHARDS, SHARDS), "part-x-of-y", "nonsense"):
        assert table.position(foreign) is None and foreign not in rows
    with pytest.raises(IndexError):
        table[SHARDS]
