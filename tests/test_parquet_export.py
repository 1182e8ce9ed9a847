"""Parquet exports (issue 34): one .parquet file in input order, or a folder of Parquet parts, from the
attempts' processed.parquet (written by the runner from Ray's Arrow blocks), each checked as it is read."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq
import pytest

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.folder_export import SUCCESS, verify_folder
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.merge import merge, merged_already, verify
from data_juicer_elastic.parquet_out import OUTPUT, SIDECAR, write_shard_parquet
from data_juicer_elastic.storage.files import read_json

from .prep_helpers import fake_done, request, run, write_rows

SHARDS = 4


def _rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        row = {"text": f"row {i}", "id": i, "meta": {"a": i * 0.5, "tags": ["x"] * (i % 3)}}
        if i % 5 == 0:
            row["meta"] = None
        rows.append(row)
    return rows


def _finish(job: JobDir, extra: dict | None = None) -> None:
    """Every shard done (identity), with the processed.parquet a parquet-exporting runner writes."""
    from data_juicer_elastic.ray_runner.arrow_schema import arrow_schema

    columns = job.manifest().columns
    for spec in job.manifest().shards:
        out = fake_done(job, spec.id)
        table = pj.read_json(out, parse_options=pj.ParseOptions(explicit_schema=arrow_schema(columns)))
        for name, value in (extra or {}).get(spec.id, {}).items():
            table = table.append_column(name, pa.array([value] * table.num_rows))
        write_shard_parquet(table, out.parent, columns)


@pytest.fixture
def job(tmp_path: Path) -> JobDir:
    write_rows(tmp_path / "ds" / "a.jsonl", _rows(60))
    run(request(tmp_path / "ds", tmp_path / "job", SHARDS))
    return JobDir(tmp_path / "job")


def test_one_parquet_file_in_input_order_with_the_recorded_schema(tmp_path: Path, job: JobDir) -> None:
    _finish(job)
    out = tmp_path / "out" / "merged.parquet"
    result = merge(job, str(out), log=lambda *_: None)
    table = pq.read_table(out)
    assert table.to_pylist() == [{**r, "meta": r["meta"] and {**r["meta"]}} for r in _rows(60)]
    assert table.schema.field("meta").type == pa.struct([("a", pa.float64()), ("tags", pa.list_(pa.string()))])
    assert result.rows == 60 and [n for n in os.listdir(out.parent)] == ["merged.parquet"]
    record = read_json(job.merge_record_path)
    assert record["format"] == "parquet" and record["kind"] == "file" and record["rows"] == 60
    assert merged_already(job, str(out)) is not None
    assert merged_already(job, str(tmp_path / "out" / "merged.jsonl")) is None  # another output, another kind
    lines: list[str] = []
    again = merge(job, str(out), log=lines.append)  # this job's own output: replaced, saying so (the overwrite rule)
    assert again.rows == 60 and pq.read_table(out).to_pylist() == table.to_pylist()
    assert any("replac" in line for line in lines), lines


def test_a_rerun_asking_for_jsonl_at_the_same_name_is_not_already_merged(tmp_path: Path, job: JobDir) -> None:
    _finish(job)
    folder = tmp_path / "parts"
    merge(job, f"{folder}/", log=lambda *_: None)  # the recipe (tests' RECIPE) exports jsonl: a JSONL folder
    assert read_json(job.merge_record_path)["format"] == "jsonl"
    job.recipe_path.write_text(job.recipe_path.read_text() + "\nexport_type: parquet\n")
    assert merged_already(job, str(folder)) is None


def test_a_tampered_parquet_output_is_refused_and_nothing_is_put_in_place(tmp_path: Path, job: JobDir) -> None:
    _finish(job)
    sid = job.manifest().shards[2].id
    path = job.attempt_output(sid, 1).with_name(OUTPUT)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    out = tmp_path / "merged.parquet"
    with pytest.raises(IntegrityError, match=f"shard {sid}: .*does not match its {SIDECAR}"):
        merge(job, str(out), log=lambda *_: None)
    assert sorted(os.listdir(tmp_path)) == ["ds", "job"]


def test_verify_checks_a_local_parquet_file_by_its_stamp(tmp_path: Path, job: JobDir) -> None:
    _finish(job)
    out = tmp_path / "out.parquet"
    merge(job, str(out), log=lambda *_: None)
    assert verify(job).problems == []  # merge.json holds no sha256 of a Parquet file: its size, mtime and inode
    other = tmp_path / "other.parquet"
    other.write_bytes(out.read_bytes()[:-5] + b"xPAR1")  # same size, other bytes, put in place as a new file
    other.replace(out)
    (problem,) = verify(job).problems
    assert all(s in problem for s in (str(out), "merge.json", "ino", "--overwrite")), problem
    out.unlink()
    assert f"{out}: is gone" in verify(job).problems[0]


def test_without_parquet_outputs_a_parquet_export_says_how_to_get_one(tmp_path: Path, job: JobDir) -> None:
    for spec in job.manifest().shards:
        fake_done(job, spec.id)
    with pytest.raises(UserError, match="written as JSONL only"):
        merge(job, str(tmp_path / "m.parquet"), log=lambda *_: None)


def test_parquet_folder_links_parts_of_one_schema_and_rewrites_the_odd_ones(tmp_path: Path, job: JobDir) -> None:
    sids = [s.id for s in job.manifest().shards]
    _finish(job, extra={sids[0]: {"score": None}, sids[1]: {"score": 0.25}, sids[2]: {"score": 1.0}})
    job.recipe_path.write_text(job.recipe_path.read_text() + "\nexport_type: parquet\n")
    folder = tmp_path / "parts"
    result = merge(job, f"{folder}/", log=lambda *_: None)
    names = sorted(os.listdir(folder))
    assert names == [SUCCESS, *[f"{s}.parquet" for s in sids]]
    schemas = {str(pq.read_schema(folder / f"{s}.parquet")) for s in sids}
    assert len(schemas) == 1 and "score: double" in schemas.pop()
    linked = [os.path.samefile(folder / f"{s}.parquet", job.attempt_output(s, 1).with_name(OUTPUT)) for s in sids]
    assert linked == [False, True, True, False]  # null-typed and missing columns rewritten; the rest linked
    table = pq.read_table(folder)  # pyarrow (and Ray) skip _SUCCESS
    assert table.column("id").to_pylist() == list(range(60)) and result.rows == 60
    assert table.column("score").to_pylist()[-1] is None
    assert verify_folder(folder) == [] and verify(job).ok
    record = read_json(job.merge_record_path)
    assert record["format"] == "parquet" and record["kind"] == "folder"
    assert merged_already(job, str(folder)) is not None
    stamp = {n: os.stat(folder / n).st_mtime_ns for n in names}
    merge(job, str(folder), log=lambda *_: None)  # again: everything kept
    assert {n: os.stat(folder / n).st_mtime_ns for n in names} == stamp
    (folder / f"{sids[1]}.parquet").write_bytes(b"x")
    assert "does not match _SUCCESS" in verify_folder(folder)[0]


def test_a_recipe_may_export_parquet() -> None:
    from data_juicer_elastic.plugin.validation import _export_problems

    for ok in ({"export_path": "/o/r.parquet"}, {"export_path": "/o/r/", "export_type": "parquet"}):
        assert _export_problems(ok) == [], ok
    bad = _export_problems({"export_path": "/o/r.jsonl", "export_type": "parquet"})
    assert "disagrees with export_path" in bad[0]
    assert "must be a file ending in .jsonl or .parquet" in _export_problems({"export_path": "/o/r.csv"})[0]
