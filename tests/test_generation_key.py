"""The recipe generation is keyed by what changes output rows only (issue 44): a user who follows the
refusal of a foreign output by adding ``elastic_shard.overwrite_output: true``, or who tunes speculation,
works in the same generation and reruns no shard. Prepared through ``dj-elastic prepare``'s path (the
recipe parsed by Data-Juicer's ``init_configs`` with the hook, then prepare), no Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.plugin.recipe_job import prepare_from_recipe

from .test_plugin import QUIET_ENV, REPO, write_recipe


@pytest.fixture
def prepare_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write the recipe with these elastic_shard keys and op arguments, prepare it; the current generation."""
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("RAY_JOB", raising=False)
    for key, value in QUIET_ENV.items():
        monkeypatch.setenv(key, value)

    def run(name: str, min_len: int = 5, **elastic: object) -> str:
        recipe = write_recipe(
            tmp_path / f"{name}.yaml",
            dataset_path=str(REPO / "demos/data/text"),
            export_path=str(tmp_path / "out.jsonl"),
            executor_type="elastic_shard",
            elastic_shard={"job_dir": str(tmp_path / "job"), "num_shards": 2, **elastic},
            process=[{"text_length_filter": {"min_len": min_len}}],
        )
        prepare_from_recipe(str(recipe))
        return JobDir(str(tmp_path / "job")).generation

    return run


def test_overwrite_output_and_speculation_keys_leave_the_generation_as_it_is(prepare_recipe, tmp_path) -> None:
    first = prepare_recipe("plain")
    same = [
        prepare_recipe("overwrite", overwrite_output=True),
        prepare_recipe("speculation", speculation=False, speculation_multiplier=3.0, speculation_min_secs=9.0),
    ]
    assert same == [first, first]
    assert prepare_recipe("edited", min_len=6) != first  # an op argument is a new generation: the key is live
    assert len(JobDir(str(tmp_path / "job")).generation_ids()) == 2
