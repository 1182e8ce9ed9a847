"""Parquet export end to end (issue 34): the elastic export against one plain executor_type: ray run's
Parquet export of the same recipe and input, read with pyarrow: same rows, values and types."""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from data_juicer_elastic.folder_export import verify_folder

from .reference import REPO, dj_process, elastic_recipe, env_with, meanwhile, reference_recipe, run_elastic, write_jsonl

pytestmark = pytest.mark.slow


def _rows() -> list[dict]:
    rows = []
    for i in range(160):
        row = {"id": i, "text": f"sample {i} " + "word, " * (i % 11) + "x1" * (i % 4), "score": i / 7}
        row["meta"] = None if i % 6 == 0 else {"src": f"s{i % 3}", "tags": ["a", "b"][: i % 3], "w": i * 0.1}
        if i % 5:
            row["opt"] = f"o{i}"
        rows.append(row)
    return rows


def _by_id(table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: r["id"])


def test_parquet_export_matches_one_ray_runs_parquet_export(tmp_path):
    data = tmp_path / "data.jsonl"
    write_jsonl(data, _rows())
    out = tmp_path / "out" / "merged.parquet"
    process = [{"alphanumeric_filter": {"min_ratio": 0.5}}, {"text_length_filter": {"min_len": 12}}]
    config = elastic_recipe(tmp_path / "pq.yaml", data, out, tmp_path / "job", process=process)
    ref_config = reference_recipe(config, tmp_path / "ref")
    recipe = yaml.safe_load(ref_config.read_text())
    recipe["export_path"] = str(tmp_path / "ref" / "reference.parquet")
    ref_config.write_text(yaml.safe_dump(recipe, sort_keys=False))
    with meanwhile(
        lambda: dj_process("--config", str(ref_config), cwd=tmp_path, env={"DJ_ELASTIC_DISABLE": "1"})
    ) as ref:
        run_elastic(config, tmp_path)
    merged = pq.read_table(out)
    done = ref.result()
    assert done.returncode == 0, done.stderr[-5000:]
    reference = pq.read_table(tmp_path / "ref" / "reference.parquet")

    rows = merged.to_pylist()
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)  # input order
    assert 0 < len(rows) < 160 and _by_id(merged) == _by_id(reference)
    for name in reference.column_names:  # types included: structs, lists, the ops' stats
        assert merged.schema.field(name).type == reference.schema.field(name).type, name

    again = run_elastic(config, tmp_path)  # a rerun finds it merged: nothing rewritten
    assert "nothing rewritten" in again.stdout + again.stderr

    # the same generation exported as a folder of Parquet parts, one schema, the same rows
    folder = tmp_path / "parts"
    cmd = [sys.executable, "-m", "data_juicer_elastic.cli", "merge", "--job-dir", str(tmp_path / "job")]
    got = subprocess.run([*cmd, "--output", f"{folder}/"], cwd=REPO, env=env_with(), capture_output=True, text=True)
    assert got.returncode == 0, got.stdout + got.stderr
    parts = sorted(folder.glob("part-*.parquet"))
    assert len(parts) == 4 and len({str(pq.read_schema(p)) for p in parts}) == 1
    assert pq.read_table(folder).to_pylist() == rows and verify_folder(folder) == []
