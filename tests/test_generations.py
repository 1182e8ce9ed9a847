"""Generations and idempotent finalize with real processes (toy runners through the real coordination).

A changed recipe reuses the shards in a new generation; nodes started by hand
(no run id in common) merge once; a finished job is not merged again; a
process whose recipe differs from its run's refuses to work.
"""

from __future__ import annotations

import gzip
import os
import shutil
import time
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Policy, manifest_digest
from data_juicer_elastic.merge import merge
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare
from data_juicer_elastic.status import job_status
from data_juicer_elastic.storage.files import dumps_json
from data_juicer_elastic.worker.loop import run_worker

from .cluster import Cluster, count, finish
from .jobs import RECIPE, make_job, stat_of, tree_stats
from .prep_helpers import shard_bytes, with_inline_shards
from .runners import copy


def rows(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_changed_recipe_reuses_shards_in_a_new_generation_and_never_mixes(tmp_path):
    c = Cluster(tmp_path, rows=60, shards=6)
    first = c.start(["node-0", "node-1"], "--runner", "project", "--project", "alpha", run_id="r1")
    assert finish(first) == [0, 0], [n.output for n in first]
    gen_a = JobDir(c.job.root)
    shards = tree_stats(c.job.shards_dir)
    manifest = stat_of(c.job.manifest_path)
    outputs_a = tree_stats(gen_a.gen_dir)
    assert {r["project"] for r in rows(c.export)} == {"alpha"}

    second = c.start(["node-0", "node-1"], "--runner", "project", "--project", "beta", run_id="r2")
    assert finish(second) == [0, 0], [n.output for n in second]
    gen_b = JobDir(c.job.root)
    assert gen_b.generation != gen_a.generation and gen_a.generation in gen_b.generation_ids()
    assert tree_stats(c.job.shards_dir) == shards and stat_of(c.job.manifest_path) == manifest  # not prepared again
    merged = rows(c.export)
    assert {r["project"] for r in merged} == {"beta"} and [r["id"] for r in merged] == list(range(60))
    assert tree_stats(gen_a.gen_dir) == outputs_a  # the old generation's outputs are untouched
    for sid in gen_b.done_ids():  # and every new done record names an output of the new generation
        output = orjson.loads(gen_b.done_path(sid).read_bytes())["output"]
        assert output.startswith(f"generations/{gen_b.generation}/attempts/"), output
    assert job_status(JobDir(c.job.root, gen_a.generation)).complete  # status can still name the old one


def test_hand_started_nodes_merge_once_and_a_rerun_rewrites_nothing(tmp_path):
    c = Cluster(tmp_path, rows=80, shards=8)
    # no run id at all: each node invents its own, as two people starting dj-process by hand would
    nodes = c.start(["node-0", "node-1", "node-2"], "--runner", "weighted", run_id="", DJE_TEST_UNIT="0.05")
    assert finish(nodes) == [0, 0, 0], [n.output for n in nodes]
    assert count(nodes, "elected as prepare coordinator") == 3  # three runs ...
    assert count(nodes, "merged 8 shards") == 1, [n.output for n in nodes]  # ... one merge
    assert all(n.last_line().startswith("PASS: 8 shards completed") for n in nodes)
    assert c.export.read_bytes() == b"".join(shard_bytes(c.job.root))
    before = stat_of(c.export), stat_of(c.job.merge_record_path)

    again = c.start(["node-3"], run_id="")
    assert finish(again) == [0]
    assert "nothing rewritten" in again[0].last_line() and count(again, "merged 8 shards") == 0
    assert (stat_of(c.export), stat_of(c.job.merge_record_path)) == before

    c.export.unlink()  # the output is gone: the next run merges it again
    third = c.start(["node-4"], run_id="")
    assert finish(third) == [0] and count(third, "merged 8 shards") == 1
    assert c.export.read_bytes() == b"".join(shard_bytes(c.job.root))


def test_a_process_whose_recipe_differs_from_its_runs_refuses_to_work(tmp_path):
    c = Cluster(tmp_path, rows=40, shards=4)
    hold = tmp_path / "release"  # the run cannot end before the refusal (else "already ended" is the answer)
    env = {"DJE_TEST_HOLD": str(hold)}
    args = ("--runner", "slow_copy", "--project")
    nodes = [c.start_one("node-0", *args, "alpha", **env), c.start_one("node-1", *args, "beta", **env)]
    try:
        deadline = time.monotonic() + 300
        while all(n.proc.poll() is None for n in nodes) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        hold.touch()
    codes = finish(nodes)
    assert sorted(codes) == [0, 2], [n.output for n in nodes]
    refused = nodes[codes.index(2)]
    line = refused.last_line()
    assert line.startswith("FAIL: this process's recipe differs from the one this run prepared"), line
    assert "project_name:" in line and "'alpha'" in line and "'beta'" in line, line
    assert count([refused], "worker started") == 0
    assert len(JobDir(c.job.root).generation_ids()) == 1


def _as_schema_3(job: JobDir) -> None:
    """Rewrite a freshly prepared job dir the way a schema-3 prepare laid it out (one recipe, no generations)."""
    gdir = job.gen_dir
    for name in ("recipe.yaml", "attempts", "state"):
        os.rename(gdir / name, job.root / name)
    (job.root / "runs").mkdir()
    for name in ("generations", "current.json"):
        path = job.root / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    raw = with_inline_shards(job.root, orjson.loads(job.manifest_path.read_bytes()))  # schema 3 listed them inline
    raw["schema_version"] = 3
    raw["digest"] = manifest_digest(raw)
    job.manifest_path.write_bytes(dumps_json(raw))


def test_a_schema_3_job_dir_stays_readable_and_refuses_a_recipe_change_saying_why(tmp_path):
    job = make_job(tmp_path, rows=30, shards=3)
    policy = job.manifest().policy
    _as_schema_3(job)
    legacy = JobDir(job.root)
    assert legacy.generation == "" and legacy.gen_dir == job.root and legacy.recipe_path == job.root / "recipe.yaml"
    assert run_worker(legacy.gen_dir, copy, log=lambda *_: None).exit_code == 0
    merge(legacy, str(tmp_path / "out.jsonl"), log=lambda *_: None)
    assert (tmp_path / "out.jsonl").read_bytes() == b"".join(shard_bytes(legacy.root))
    assert job_status(legacy).complete
    request = PrepareRequest(str(tmp_path / "input" / "data.jsonl"), str(job.root), RECIPE, policy)
    assert not prepare(request, log=lambda *_: None).created  # the same request: a no-op
    with pytest.raises(UserError, match=r"recipe: sha256 .*schema 3.* one recipe per job dir"):
        prepare(PrepareRequest(request.dataset_path, request.job_dir, RECIPE + b"# edited\n", policy))


@pytest.mark.parametrize("compressed", [False, True])
def test_an_input_copied_or_restored_is_reused_after_its_digests_are_checked(tmp_path, compressed):
    plain = tmp_path / "rows.jsonl"
    plain.write_bytes(b"".join(orjson.dumps({"id": i, "text": "t" * (i % 9)}) + b"\n" for i in range(40))[:-1])
    data = tmp_path / "in" / ("data.jsonl.gz" if compressed else "data.jsonl")
    data.parent.mkdir()
    data.write_bytes(gzip.compress(plain.read_bytes(), mtime=0) if compressed else plain.read_bytes())
    request = PrepareRequest(str(data), str(tmp_path / "job"), RECIPE, Policy(num_shards=3))
    prepare(request, log=lambda *_: None)
    shards = tree_stats(tmp_path / "job" / "shards")

    copied = data.read_bytes()  # a copy back in place: same bytes, new inode and mtime
    data.unlink()
    data.write_bytes(copied)
    os.utime(data, ns=(10**18, 10**18))
    assert not prepare(request, log=lambda *_: None).created
    assert tree_stats(tmp_path / "job" / "shards") == shards

    if not compressed:  # the same size, other bytes: refused, naming the file
        data.write_bytes(copied.replace(b'"id":7,', b'"id":8,', 1))
        with pytest.raises(UserError, match=r"input data.jsonl: changed since prepare \(same size"):
            prepare(request, log=lambda *_: None)
