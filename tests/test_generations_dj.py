"""Recipe edits and hand-started nodes through the stock ``dj-process`` (real Data-Juicer, real Ray).

Prepare once, edit a threshold, rerun: the shards are not rewritten, the new
output reflects the new recipe, the old generation's outputs are untouched.
Two ``dj-process`` started by hand (distinct hostnames, no run id) finish one
job and write its output once; rerunning the finished job rewrites nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from data_juicer_elastic.job.layout import JobDir

from .jobs import stat_of, tree_stats
from .reference import DJ_PROCESS, dj_process, elastic_recipe, env_with, read_rows, write_jsonl

pytestmark = pytest.mark.slow

TEXTS = [f"row {i} " + "x" * (i * 7 % 40) for i in range(80)]  # lengths 6..46, spread over every shard


def filter_recipe(tmp_path: Path, min_len: int, **elastic: object) -> Path:
    """A text_length_filter recipe over TEXTS; ``elastic`` overrides elastic_shard keys."""
    write_jsonl(tmp_path / "in" / "data.jsonl", [{"id": i, "text": t} for i, t in enumerate(TEXTS)])
    path = elastic_recipe(
        tmp_path / "recipe.yaml",
        tmp_path / "in" / "data.jsonl",
        tmp_path / "out" / "merged.jsonl",
        tmp_path / "job",
        [{"text_length_filter": {"min_len": min_len}}],
    )
    recipe = yaml.safe_load(path.read_text())
    recipe["elastic_shard"].update(elastic)
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def kept(min_len: int) -> list[int]:
    return [i for i, t in enumerate(TEXTS) if len(t) >= min_len]


def test_edited_threshold_reuses_the_shards_and_never_mixes_generations(tmp_path):
    config = filter_recipe(tmp_path, 15)
    first = dj_process("--config", str(config), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    job = JobDir(tmp_path / "job")
    old = JobDir(job.root, job.generation)
    assert [r["id"] for r in read_rows(tmp_path / "out" / "merged.jsonl")] == kept(15)
    shards, old_outputs = tree_stats(job.shards_dir), tree_stats(old.gen_dir)
    manifest = stat_of(job.manifest_path)

    config = filter_recipe(tmp_path, 30, lock_timeout_secs=90.0)  # an edited threshold and a run-time policy
    second = dj_process("--config", str(config), cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-4000:]
    new = JobDir(job.root)
    assert new.generation != old.generation and new.manifest().policy.lock_timeout_secs == 90.0
    assert tree_stats(job.shards_dir) == shards and stat_of(job.manifest_path) == manifest  # not prepared again
    assert [r["id"] for r in read_rows(tmp_path / "out" / "merged.jsonl")] == kept(30)
    assert tree_stats(old.gen_dir) == old_outputs  # the old generation untouched
    new_rows = [json.loads(line) for p in new.attempts_dir.rglob("processed.jsonl") for line in p.open()]
    assert sorted(r["id"] for r in new_rows) == kept(30)  # nothing of the old recipe in the new generation
    assert "min_len: 30" in new.recipe_path.read_text() and "min_len: 15" in old.recipe_path.read_text()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # nothing beside the job dir


def test_two_hand_started_dj_process_merge_once_and_a_rerun_rewrites_nothing(tmp_path):
    config = filter_recipe(tmp_path, 15)
    env = env_with()  # what a person starting dj-process by hand has: no run id, no launcher variables
    procs = [
        subprocess.Popen(
            [DJ_PROCESS, "--config", str(config)],
            cwd=tmp_path,
            env={**env, "DJ_ELASTIC_HOSTNAME": host},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for host in ("hand-a", "hand-b")
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-3000:] for o in outputs]
    assert sum(o.count("merged 4 shards") for o in outputs) == 1, [o[-3000:] for o in outputs]
    export = tmp_path / "out" / "merged.jsonl"
    job = JobDir(tmp_path / "job")
    assert [r["id"] for r in read_rows(export)] == kept(15)
    before = stat_of(export), stat_of(job.merge_record_path)

    again = subprocess.run(
        [DJ_PROCESS, "--config", str(config)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing rewritten" in again.stdout + again.stderr and "merged 4 shards" not in again.stdout + again.stderr
    assert (stat_of(export), stat_of(job.merge_record_path)) == before
    # Every run's own Data-Juicer work dir lies inside the job dir, none beside the export file.
    assert sorted(p.name for p in export.parent.iterdir()) == ["merged.jsonl"]
    assert len(list((tmp_path / "job" / "dj-work").iterdir())) == 3
