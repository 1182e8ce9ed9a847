"""RayShardRunner: real Ray, real RayExecutor, one Ray runtime for the whole module."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest
import yaml
from jsonargparse import Namespace

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare
from data_juicer_elastic.ray_runner import shard_io
from data_juicer_elastic.ray_runner.configs import attempt_config
from data_juicer_elastic.ray_runner.runner import RayShardRunner
from data_juicer_elastic.ray_runner.shard_io import join_parts
from tests.reference import OFFLINE

for _key, _value in OFFLINE.items():
    os.environ.setdefault(_key, _value)

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


def rows(start: int, count: int) -> list[dict]:
    out = []
    for i in range(start, start + count):
        text = "  " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(i % 9)) + "  "
        row = {"id": i, "text": text}
        if i % 4 == 0:
            row["score"] = i if i % 8 else i + 0.5  # ints and floats in one column
        out.append(row)
    return out


def runner_dir(root: Path, recipe: dict, shards: dict[str, list[dict]]) -> Path:
    """A job directory as the runner sees it: recipe.yaml and shard files (no manifest needed)."""
    (root / "shards").mkdir(parents=True)
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    for name, shard_rows in shards.items():
        with open(root / "shards" / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in shard_rows)
    return root


def attempt(job: Path, shard: str, n: int = 1) -> tuple[str, str]:
    adir = job / "attempts" / shard / f"{n:04d}"
    adir.mkdir(parents=True)
    return str(job / "shards" / f"{shard}.jsonl"), str(adir / "processed.jsonl")


def read(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def ray_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("RAY_") or k == "PYTHONBREAKPOINT"}


@pytest.fixture(scope="module")
def runner():
    before = ray_settings()
    r = RayShardRunner()
    yield r
    r.close()
    # ray.init exported RAY_AUTH_MODE=token (and more); left there, the workers this process starts later
    # could not take results from a cluster without token auth (test_warm_ops' logical-GPU head hung)
    assert ray_settings() == before


BASE_RECIPE = {
    "project_name": "runner-test",
    "executor_type": "ray",
    "read_options": {"block_size": 2048},
    "process": [{"whitespace_normalization_mapper": None}, {"text_length_filter": {"min_len": 12}}],
}


@pytest.mark.slow
def test_shards_keep_row_order_and_write_only_inside_the_attempt(runner, tmp_path, monkeypatch):
    job = runner_dir(tmp_path / "job", BASE_RECIPE, {"part-a": rows(0, 300), "part-b": rows(300, 150)})
    from ray.data import DataContext

    # tiny blocks, so each shard is written as several part files the join must order
    monkeypatch.setattr(DataContext.get_current(), "target_max_block_size", 4096)
    parts_seen = []
    real_part_files = shard_io.part_files
    monkeypatch.setattr(shard_io, "part_files", lambda d: parts_seen.append(real_part_files(d)) or parts_seen[-1])
    for shard, source in (("part-a", rows(0, 300)), ("part-b", rows(300, 150))):
        shard_path, output = attempt(job, shard)
        runner(shard_path, output, str(job))
        got = read(output)
        expected = [r for r in source if len(r["text"].strip()) >= 12]
        assert [r["id"] for r in got] == [r["id"] for r in expected]
        assert all(r["text"] == s["text"].strip() for r, s in zip(got, expected, strict=True))
        assert all(r["__dj__stats__"]["text_len"] == len(r["text"]) for r in got)
        assert all(r.get("score") == s.get("score") for r, s in zip(got, expected, strict=True))  # 4 == 4.0 holds
        adir = Path(output).parent
        assert sorted(p.name for p in adir.iterdir()) == ["ops.json", "process.log", "processed.jsonl", "work"]
        assert op_counts(adir) == [(len(source), len(source), 0), (len(source), len(expected), 0)]
        log = (adir / "process.log").read_text()
        assert "ray_executor" in log and f"{shard}.jsonl" in log
    assert all(len(parts) > 1 for parts in parts_seen), [len(p) for p in parts_seen]
    assert sorted(p.name for p in job.iterdir()) == ["attempts", "recipe.yaml", "shards"]
    assert len(runner._jobs) == 1  # the recipe was parsed once for both shards


def op_counts(adir: Path) -> list[tuple[int, int, int]]:
    """(rows in, rows out, error rows) per op, from the attempt's ops.json; every op counted its own rows out."""
    record = json.loads((adir / "ops.json").read_text())
    assert all(o["counted"] for o in record["ops"]), record
    return [(o["rows_in"], o["rows_out"], o["error_rows"]) for o in record["ops"]]


@pytest.mark.slow
def test_actor_mode_ops_count_their_rows_warm_and_cold(runner, tmp_path, monkeypatch):
    """The Mapper's and the Filter's batches run in warm actors, then (no pool granted) in Ray Data's own."""
    actors = {"ray_execution_mode": "actor", "num_proc": 1, "num_cpus": 0.25}
    recipe = {
        **BASE_RECIPE,
        "process": [{"whitespace_normalization_mapper": actors}, {"text_length_filter": {"min_len": 12, **actors}}],
    }
    source = rows(0, 120)
    kept = sum(len(r["text"].strip()) >= 12 for r in source)
    job = runner_dir(tmp_path / "job", recipe, {"part-a": source})
    shard_path, output = attempt(job, "part-a", 1)
    warm = None
    try:
        runner(shard_path, output, str(job))
        warm = runner._jobs[str(job)].warm
        assert len(warm.pools) == 2
        assert op_counts(Path(output).parent) == [(120, 120, 0), (120, kept, 0)]
        monkeypatch.setattr(type(warm), "rewrite", lambda *_, **__: None)  # as when a pool would not fit
        shard_path, output = attempt(job, "part-a", 2)
        runner(shard_path, output, str(job))
        assert op_counts(Path(output).parent) == [(120, 120, 0), (120, kept, 0)]
        assert len(read(output)) == kept
    finally:
        if warm is not None:
            warm.close()  # the module's other tests get the node's CPUs back


@pytest.mark.slow
def test_failing_op_fails_the_attempt_not_the_worker(runner, tmp_path):
    bad = {
        **BASE_RECIPE,
        "skip_op_error": False,
        "strict_preflight": False,  # fails inside a Ray task
        "process": [{"text_length_filter": {"min_len": 1, "text_key": "no_such_column"}}],
    }
    job = runner_dir(tmp_path / "bad", bad, {"part-a": rows(0, 20)})
    with pytest.raises(Exception) as exc:
        runner(*attempt(job, "part-a"), str(job))
    assert "no_such_column" in str(exc.value)
    assert "no_such_column" in (job / "attempts/part-a/0001/process.log").read_text()
    # the same runner (same Ray) goes on with the next job and an empty result
    good = runner_dir(
        tmp_path / "good",
        {**BASE_RECIPE, "process": [{"text_length_filter": {"min_len": 10_000}}]},
        {"part-a": rows(0, 20)},
    )
    shard_path, output = attempt(good, "part-a")
    runner(shard_path, output, str(good))
    assert Path(output).read_bytes() == b""


@pytest.mark.slow
def test_per_shard_overhead_is_reported(runner, tmp_path):
    """Not a benchmark: records what a warm runner spends on tiny shards (printed with -s)."""
    job = runner_dir(tmp_path / "job", BASE_RECIPE, {f"p{i}": rows(i * 10, 10) for i in range(4)})
    before = len(runner.timings)
    for i in range(4):
        runner(*attempt(job, f"p{i}"), str(job))
    spent = [t["setup"] + t["run"] + t["join"] for t in runner.timings[before:]]
    print(
        f"\nper-shard seconds on a warm runner (10-row shards): {[round(s, 2) for s in spent]}, "
        f"median {statistics.median(spent):.2f}"
    )
    assert all(t["setup"] < 0.5 for t in runner.timings[before + 1 :])  # parse/Ray setup done once


def test_changed_recipe_snapshot_is_refused(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(0, 10)))
    recipe = yaml.safe_dump(BASE_RECIPE).encode()
    prepare(PrepareRequest(str(data), str(tmp_path / "job"), recipe, Policy(num_shards=2)), log=lambda _: None)
    generation = JobDir(tmp_path / "job")
    generation.recipe_path.write_bytes(recipe + b"np: 3\n")
    with pytest.raises(IntegrityError, match="changed after prepare"):
        RayShardRunner().prepare_job(str(generation.gen_dir))


def test_custom_operators_inside_the_job_dir_are_refused(tmp_path):
    job = runner_dir(tmp_path / "job", {**BASE_RECIPE, "custom_operator_paths": [str(tmp_path / "job" / "ops.py")]}, {})
    with pytest.raises(UserError, match="inside the job directory"):
        RayShardRunner().prepare_job(str(job))


def test_attempt_config_points_every_path_into_the_attempt(tmp_path):
    base = Namespace(
        dataset_path="/data/in",
        export_path="/out/x.jsonl",
        export_type=None,
        work_dir="/out/job1",
        event_log_dir="/out/job1/logs",
        checkpoint_dir="/out/job1/checkpoints",
        partition_dir="/p",
        metadata_dir="/m",
        results_dir="/r",
        event_log_file="/e",
        job_summary_file="/s",
        backed_up_config_path="/b",
        process=[
            {"a_mapper": {"work_dir": "/out/job1", "x": 1}},
            {"b_filter": {"work_dir": "/elsewhere"}},
            {"c_mapper": None},
        ],
    )
    adir = str(tmp_path / "attempt")
    cfg = attempt_config(base, "/job/shards/part-1.jsonl", adir)
    assert cfg.dataset_path == "/job/shards/part-1.jsonl" and cfg.export_type == "jsonl"
    for key in (
        "export_path",
        "work_dir",
        "event_log_dir",
        "checkpoint_dir",
        "partition_dir",
        "metadata_dir",
        "results_dir",
        "event_log_file",
        "job_summary_file",
        "backed_up_config_path",
    ):
        assert getattr(cfg, key).startswith(adir + os.sep), key
    assert cfg.process[0]["a_mapper"] == {"work_dir": os.path.join(adir, "work"), "x": 1}
    assert cfg.process[1]["b_filter"] == {"work_dir": "/elsewhere"}  # set by the recipe: kept
    assert base.work_dir == "/out/job1" and base.process[0]["a_mapper"]["work_dir"] == "/out/job1"


def test_join_parts_orders_by_write_task(tmp_path):
    export = tmp_path / "export.jsonl"
    export.mkdir()
    prefix = "abc_0123456789abcdef"
    (export / f"{prefix}_000010.json").write_text('{"i": 3}\n')
    (export / f"{prefix}_000002.json").write_text('{"i": 1}\n{"i": 2}')  # no final newline
    (export / f"{prefix}_000000.json").write_text('{"i": 0}\n')
    (export / ".hidden").write_text("ignored")
    out = tmp_path / "processed.jsonl"
    assert join_parts(export, out) == 4
    assert [json.loads(x)["i"] for x in out.read_text().splitlines()] == [0, 1, 2, 3]
    (export / "other_999_000001.json").write_text("{}\n")
    with pytest.raises(IntegrityError, match="different writes"):
        join_parts(export, out)
    (export / "other_999_000001.json").unlink()
    (export / "stray.txt").write_text("x")
    with pytest.raises(IntegrityError, match="unexpected file"):
        join_parts(export, out)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")  # Data-Juicer writes an empty file when nothing is left
    assert join_parts(empty, out) == 0 and out.read_bytes() == b""


def test_join_parts_fails_closed_on_a_missing_or_odd_export(tmp_path):
    """An export that vanished or is not what Ray writes fails the attempt instead of publishing 0 rows."""
    out = tmp_path / "processed.jsonl"
    with pytest.raises(IntegrityError, match="export is missing"):
        join_parts(tmp_path / "missing", out)
    assert not out.exists()
    stray = tmp_path / "export.jsonl"
    stray.write_text('{"i": 0}\n')
    with pytest.raises(IntegrityError, match="neither Ray's export folder nor an empty file"):
        join_parts(stray, out)
    assert not out.exists()
