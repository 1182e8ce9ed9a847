"""Prepare of a Parquet input (issue 34): row group shards read in place, the schema from the footers."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_juicer_elastic.errors import PermanentError, UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.prepare.parquet import plan_row_groups, read_descriptor, schema_of

from .prep_helpers import request, run, write_rows


def _table(start: int, n: int, width: int = 20) -> pa.Table:
    rows = [
        {
            "id": i,
            "text": f"row {i} " + "x" * (width + i % 13),
            "meta": None if i % 7 == 0 else {"src": f"s{i % 3}", "w": i / 3},
            "tags": [f"t{j}" for j in range(i % 4)] or None,
        }
        for i in range(start, start + n)
    ]
    return pa.Table.from_pylist(rows)


def write_parquet(path: Path, table: pa.Table, row_group_sizes: list[int]) -> Path:
    """One row group per entry of ``row_group_sizes`` (rows), in order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    assert sum(row_group_sizes) == table.num_rows
    with pq.ParquetWriter(path, table.schema) as w:
        pos = 0
        for n in row_group_sizes:
            w.write_table(table.slice(pos, n), row_group_size=n)
            pos += n
    assert pq.ParquetFile(path).metadata.num_row_groups == len(row_group_sizes)
    return path


def _dataset(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    write_parquet(data / "a.parquet", _table(0, 1000), [100, 400, 50, 450])
    write_parquet(data / "sub" / "b.parquet", _table(1000, 600, width=60), [300, 200, 100])
    return data


def _read_all(job_dir: Path) -> list[dict]:
    job = JobDir(job_dir)
    m = job.manifest()
    schema = schema_of(m.parquet)
    rows = []
    for s in m.shards:
        for t in read_descriptor(str(job.shard_file(s.id)), schema):
            rows += t.to_pylist()
    return rows


def test_shards_are_row_group_runs_covering_the_input_in_order(tmp_path):
    data = _dataset(tmp_path)
    result, _ = run(request(data, tmp_path / "job", 3))
    m = result.manifest
    assert m.total_rows == 1600 and [f.path for f in m.files] == ["a.parquet", "sub/b.parquet"]
    assert m.columns is None and "text: string" in m.parquet["schema_text"]
    assert sum(s.rows for s in m.shards) == 1600
    assert [s.first_row for s in m.shards] == [0, m.shards[0].rows, m.shards[0].rows + m.shards[1].rows]
    rows = _read_all(tmp_path / "job")
    assert [r["id"] for r in rows] == list(range(1600))
    assert rows == _table(0, 1000).to_pylist() + _table(1000, 600, width=60).to_pylist()
    # a file's sources cover it whole, in order
    for f in m.files:
        srcs = sorted((src for s in m.shards for src in s.sources if src.file == f.path), key=lambda x: x.start)
        assert srcs[0].start == 0 and srcs[-1].end == f.size
        assert all(a.end == b.start for a, b in itertools.pairwise(srcs))


def test_prepare_is_deterministic(tmp_path):
    data = _dataset(tmp_path)
    a, _ = run(request(data, tmp_path / "j1", 4))
    b, _ = run(request(data, tmp_path / "j2", 4))
    assert a.manifest.digest == b.manifest.digest
    for s in a.manifest.shards:
        assert (tmp_path / "j1" / s.path).read_bytes() == (tmp_path / "j2" / s.path).read_bytes()


def test_plan_balances_row_group_bytes_and_never_splits_one():
    weights = [100, 400, 50, 450, 300, 200, 100]
    assert plan_row_groups(weights, 1) == [(0, 7)]
    # 1600 bytes, targets 533 and 1067: the nearest row group borders are 550 and 1000
    assert plan_row_groups(weights, 3) == [(0, 3), (3, 4), (4, 7)]
    assert plan_row_groups(weights, 7) == [(i, i + 1) for i in range(7)]
    assert plan_row_groups([1000, 1, 1, 1], 3) == [(0, 1), (1, 2), (2, 4)]
    with pytest.raises(ValueError):
        plan_row_groups(weights, 8)


def test_shards_balanced_by_compressed_bytes(tmp_path):
    data = _dataset(tmp_path)
    result, _ = run(request(data, tmp_path / "job", 3))
    sizes = [sum(src.end - src.start for src in s.sources) for s in result.manifest.shards]
    total = sum(sizes)
    assert max(sizes) < 0.6 * total  # row groups of 50..450 rows: a 1/3 split is near, never exact


def test_too_many_shards_for_the_row_groups(tmp_path):
    data = _dataset(tmp_path)
    with pytest.raises(UserError, match="only 7 Parquet row groups"):
        run(request(data, tmp_path / "job", 8))


def test_a_folder_mixing_jsonl_and_parquet_is_refused(tmp_path):
    data = _dataset(tmp_path)
    write_rows(data / "c.jsonl", [{"text": "a"}])
    with pytest.raises(UserError) as err:
        run(request(data, tmp_path / "job", 2))
    msg = str(err.value)
    assert "c.jsonl" in msg and ".parquet" in msg and "one input format" in msg


def test_schema_clash_names_both_files_and_the_column(tmp_path):
    data = tmp_path / "data"
    write_parquet(data / "a.parquet", pa.table({"id": [1, 2], "text": ["a", "b"]}), [2])
    write_parquet(data / "b.parquet", pa.table({"id": ["x", "y"], "text": ["c", "d"]}), [2])
    with pytest.raises(UserError) as err:
        run(request(data, tmp_path / "job", 1))
    msg = str(err.value)
    assert str(data / "a.parquet") in msg and str(data / "b.parquet") in msg and "'id'" in msg


def test_compatible_schemas_are_unified(tmp_path):
    data = tmp_path / "data"
    write_parquet(data / "a.parquet", pa.table({"id": pa.array([1, 2], pa.int32()), "x": [None, None]}), [2])
    write_parquet(data / "b.parquet", pa.table({"id": [3, 4], "x": [1.5, None], "y": ["p", "q"]}), [2])
    result, _ = run(request(data, tmp_path / "job", 2))
    schema = schema_of(result.manifest.parquet)
    assert schema.names == ["id", "x", "y"] and schema.field("id").type == pa.int64()
    assert schema.field("x").type == pa.float64()
    rows = _read_all(tmp_path / "job")
    assert rows == [
        {"id": 1, "x": None, "y": None},
        {"id": 2, "x": None, "y": None},
        {"id": 3, "x": 1.5, "y": "p"},
        {"id": 4, "x": None, "y": "q"},
    ]


def test_an_input_changed_after_prepare_is_refused_naming_it(tmp_path):
    data = _dataset(tmp_path)
    run(request(data, tmp_path / "job", 3))
    job = JobDir(tmp_path / "job")
    m = job.manifest()
    target = data / "sub" / "b.parquet"
    write_parquet(target, _table(1000, 600, width=61), [300, 200, 100])  # rewritten: other bytes
    # the runner refuses the shards that read it
    shard = next(s for s in m.shards if any(src.file == "sub/b.parquet" for src in s.sources))
    with pytest.raises(PermanentError, match=re.escape(str(target))):
        read_descriptor(str(job.shard_file(shard.id)), schema_of(m.parquet))
    # a repeated prepare names it
    with pytest.raises(UserError, match=re.escape("input sub/b.parquet: changed since prepare")):
        run(request(data, tmp_path / "job", 3))


def test_same_bytes_with_a_new_mtime_are_reused(tmp_path):
    data = _dataset(tmp_path)
    run(request(data, tmp_path / "job", 3))
    target = data / "a.parquet"
    st = os.stat(target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _, logs = run(request(data, tmp_path / "job", 3))
    assert any("already prepared" in line for line in logs)
    # same size, other content, moved mtime: re-hashed and refused
    raw = bytearray(target.read_bytes())
    raw[10] ^= 0xFF
    target.write_bytes(bytes(raw))
    with pytest.raises(UserError, match="no longer hashes"):
        run(request(data, tmp_path / "job", 3))


def test_descriptor_is_one_json_line_whose_sha_the_manifest_records(tmp_path):
    import hashlib

    data = _dataset(tmp_path)
    result, _ = run(request(data, tmp_path / "job", 2))
    for s in result.manifest.shards:
        raw = (tmp_path / "job" / s.path).read_bytes()
        assert raw.count(b"\n") == 1 and hashlib.sha256(raw).hexdigest() == s.sha256 and len(raw) == s.bytes
        assert orjson.loads(raw)["format"] == "parquet"


def test_index_keys_refused_for_parquet(tmp_path):
    data = _dataset(tmp_path)
    with pytest.raises(UserError, match="index_keys"):
        run(request(data, tmp_path / "job", 2, index_keys=("uid",)))


def test_auto_num_shards_stays_within_the_row_groups(tmp_path, monkeypatch):
    from data_juicer_elastic.plugin import executor

    monkeypatch.setattr(executor, "AUTO_MIN_SHARD_BYTES", 1)  # a small input may take 8 shards

    data = tmp_path / "data"
    write_parquet(data / "a.parquet", _table(0, 3000), [1000, 1000, 1000])
    assert executor.parquet_row_groups(str(data)) == 3
    assert executor.auto_num_shards(str(data), nodes=None) == 3  # 8 without the cap (nodes unset)


def test_a_single_parquet_file(tmp_path):
    path = write_parquet(tmp_path / "one.parquet", _table(0, 500), [100, 150, 250])
    result, _ = run(request(path, tmp_path / "job", 2))
    m = result.manifest
    assert m.input_kind == "file" and [f.path for f in m.files] == ["one.parquet"] and m.total_rows == 500
    assert [r["id"] for r in _read_all(tmp_path / "job")] == list(range(500))
