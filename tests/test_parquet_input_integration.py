"""Parquet input end to end (issue 34): a folder of Parquet files through ``dj-process`` with
``executor_type: elastic_shard``, against one plain ``executor_type: ray`` run over the same folder:
the JSONL output and the Parquet output, rows compared by id with that run's JSONL output."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from .reference import differences, dj_process, elastic_recipe, meanwhile, read_rows, reference_recipe, run_elastic

pytestmark = pytest.mark.slow


def _table(start: int, n: int) -> pa.Table:
    rows = []
    for i in range(start, start + n):
        rows.append(
            {
                "id": i,
                "text": f"  sample   {i}\t" + "word  " * (i % 9) + ("short" if i % 10 == 0 else "text body here"),
                "meta": None if i % 6 == 0 else {"src": f"s{i % 3}", "w": i * 0.25, "note": None if i % 4 else "n"},
                "tags": None if i % 5 == 0 else [f"t{j}" for j in range(i % 4)],
                "score": None if i % 7 == 0 else i / 3,
                "seen": None if i % 8 == 0 else datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=i * 37),
            }
        )
    return pa.Table.from_pylist(rows)


def _write(path, table: pa.Table, groups: list[int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, table.schema) as w:
        pos = 0
        for n in groups:
            w.write_table(table.slice(pos, n), row_group_size=n)
            pos += n


def _by_id(rows: list[dict]) -> dict[int, dict]:
    return {r["id"]: r for r in rows}


def test_parquet_folder_matches_one_ray_run(tmp_path):
    data = tmp_path / "data"
    _write(data / "a.parquet", _table(0, 2000), [300, 900, 100, 700])
    _write(data / "b.parquet", _table(2000, 1500), [1000, 200, 300])
    process = [{"whitespace_normalization_mapper": {}}, {"text_length_filter": {"min_len": 20}}]

    # JSONL out
    out = tmp_path / "out" / "merged.jsonl"
    config = elastic_recipe(tmp_path / "pq_in.yaml", data, out, tmp_path / "job", process=process)
    ref_config = reference_recipe(config, tmp_path / "ref")
    with meanwhile(
        lambda: dj_process("--config", str(ref_config), cwd=tmp_path, env={"DJ_ELASTIC_DISABLE": "1"})
    ) as ref:
        run_elastic(config, tmp_path)
    merged = read_rows(out)
    done = ref.result()
    assert done.returncode == 0, done.stderr[-5000:]
    reference = read_rows(tmp_path / "ref" / "reference.jsonl")
    ids = [r["id"] for r in merged]
    assert ids == sorted(ids) and 0 < len(ids) < 3500  # input order; the filter removed some
    assert set(ids) == {r["id"] for r in reference} and len(ids) == len(reference)
    ref = _by_id(reference)
    problems = [d for r in merged for d in differences(r, ref[r["id"]], f"id={r['id']}")]
    assert not problems, problems[:20]
    assert all("\t" not in r["text"] and r["text"] == r["text"].strip() for r in merged)  # the mapper ran

    # Parquet out, same job dir and shards (a recipe change is a new generation)
    pq_out = tmp_path / "out" / "merged.parquet"
    recipe = yaml.safe_load(config.read_text())
    recipe["export_path"] = str(pq_out)
    config.write_text(yaml.safe_dump(recipe, sort_keys=False))
    run_elastic(config, tmp_path)
    table = pq.read_table(pq_out)
    # text and stats as the ray run above wrote them (its JSON export rounds floats to 10 digits: the other columns are
    # compared with the input's, which the recipe leaves alone; a ray run's own Parquet export is compared
    # with ours in test_parquet_integration)
    got = _by_id(table.to_pylist())
    assert list(got) == ids, "the Parquet output holds other rows than the JSONL output, or another order"
    source = _by_id(pq.read_table(data).to_pylist())
    added = ("text", "__dj__stats__")  # what the recipe writes
    expected = {i: {**source[i], **{k: ref[i][k] for k in added if k in ref[i]}} for i in ids}
    problems = [d for i in ids for d in differences(got[i], expected[i], f"id={i}")]
    assert not problems, json.dumps(problems[:10], default=str)
    for name in ("meta", "tags", "id", "text", "score", "seen"):  # the input's own types, as the files hold them
        assert table.schema.field(name).type == pq.read_schema(data / "a.parquet").field(name).type, name
