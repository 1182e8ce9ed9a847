"""A new user's mistakes through the stock ``dj-process`` (real Ray): refused early, named, not retried in vain.

An op argument typo is refused at parse time with Data-Juicer's own words;
a row with a repeated key is refused at prepare with its file and line; a
20 MB row runs; a row Ray's reader refuses fails its shard at the first
attempt, naming the input file and line; ``status`` shows one line per
failure.
"""

from __future__ import annotations

import glob
import re

import pytest

from tests.reference import dj_process, elastic_recipe, read_rows, write_jsonl

pytestmark = pytest.mark.slow
ANSI = re.compile(r"\x1b\[")


def test_op_argument_typo_is_refused_at_parse_time_and_nothing_is_written(tmp_path):
    data = tmp_path / "data.jsonl"
    write_jsonl(data, [{"text": f"row {i}"} for i in range(8)])
    config = elastic_recipe(
        tmp_path / "typo.yaml",
        data,
        tmp_path / "out" / "merged.jsonl",
        tmp_path / "job",
        process=[{"whitespace_normalization_mapper": None}, {"text_length_filter": {"min_lenn": 5}}],
    )
    out = dj_process("--config", str(config), cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "process[1] text_length_filter: Unknown parameter 'min_lenn'" in out.stderr
    assert "did you mean: min_len" in out.stderr
    assert not (tmp_path / "job").exists() and not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "typo.yaml"]


def test_a_job_dir_url_other_than_s3_is_refused_at_parse_time(tmp_path):
    """``job_dir: oss://...`` is not taken for a relative folder ``oss:/...``: refused by name, the S3 form
    named, nothing written (an ``s3://`` job dir runs: tests/test_dj_process_s3.py)."""
    data = tmp_path / "data.jsonl"
    write_jsonl(data, [{"text": f"row {i}"} for i in range(8)])
    process = [{"whitespace_normalization_mapper": None}]
    config = elastic_recipe(
        tmp_path / "oss.yaml", data, tmp_path / "out" / "m.jsonl", "oss://bucket/jobs/run-1", process
    )
    out = dj_process("--config", str(config), cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "elastic_shard.job_dir 'oss://bucket/jobs/run-1' is a URL of a kind" in out.stderr, out.stderr[-3000:]
    assert "s3://bucket/prefix" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "oss.yaml"]


def test_a_repeated_key_is_refused_at_prepare_with_file_and_line(tmp_path):
    data = tmp_path / "in" / "data.jsonl"
    write_jsonl(data, [{"id": i, "text": f"row {i}"} for i in range(6)])
    lines = data.read_text().splitlines()
    lines[3] = '{"id": 3, "text": "a", "text": "b"}'
    data.write_text("\n".join(lines) + "\n")
    config = elastic_recipe(
        tmp_path / "dup.yaml", data.parent, tmp_path / "out" / "m.jsonl", tmp_path / "job", process=[]
    )
    config.write_text(config.read_text().replace("process: []", "process:\n- whitespace_normalization_mapper: null"))
    out = dj_process("--config", str(config), cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    assert f"{data}:4" in out.stderr and "'text' appears twice" in out.stderr, out.stderr[-3000:]
    assert not (tmp_path / "job" / "manifest.json").exists()


def test_a_20mb_row_runs(tmp_path):
    data = tmp_path / "data.jsonl"
    rows = [{"id": i, "text": f"row {i}"} for i in range(8)]
    rows[5]["text"] = "w" * (20 << 20)
    write_jsonl(data, rows)
    config = elastic_recipe(
        tmp_path / "big.yaml",
        data,
        tmp_path / "out" / "merged.jsonl",
        tmp_path / "job",
        process=[{"text_length_filter": {"min_len": 1}}],
    )
    out = dj_process("--config", str(config), cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    merged = read_rows(tmp_path / "out" / "merged.jsonl")
    assert [r["id"] for r in merged] == list(range(8)) and len(merged[5]["text"]) == 20 << 20


def test_a_row_the_reader_would_refuse_is_refused_at_prepare_naming_file_and_line(tmp_path):
    """A string column turning into an object: Arrow refuses it (a whole-input ray run fails); prepare, which
    records the whole input's schema, refuses the input before any shard runs (it used to fail its shard)."""
    data = tmp_path / "data.jsonl"
    rows = [{"id": i, "text": f"row {i}"} for i in range(40)]
    rows[27]["text"] = {"oops": 1}
    write_jsonl(data, rows)
    config = elastic_recipe(
        tmp_path / "bad.yaml",
        data,
        tmp_path / "out" / "merged.jsonl",
        tmp_path / "job",
        process=[{"whitespace_normalization_mapper": None}],
    )
    out = dj_process("--config", str(config), cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    said = f"{data}:28: key 'text' holds an object here but a string at {data}:1"
    assert said in out.stderr, out.stderr[-3000:]
    assert not (tmp_path / "job" / "manifest.json").exists()
    assert not glob.glob(str(tmp_path / "job" / "**" / "attempts" / "*"), recursive=True)
