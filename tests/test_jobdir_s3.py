"""A job dir given as an ``s3://`` URL (``JobDir`` on the S3 store, against a moto server).

Prepare does not write to a store yet, so each test prepares a job on disk and mirrors its files, key for
key, under a fresh prefix: what a prepare on the store will publish. ``JobDir(url)`` must then read the
same manifest, generations and records as ``JobDir(path)``, through the store only: its paths are
``ObjectPath``s, which no local file call takes.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.merge import merge, verify
from data_juicer_elastic.status import job_status
from data_juicer_elastic.storage.store import Store, store_for
from data_juicer_elastic.storage.urls import ObjectPath
from data_juicer_elastic.worker.loop import run_worker

from .jobs import make_job
from .prep_helpers import finish_all, shard_bytes
from .runners import copy
from .s3server import use_env
from .test_store_contract import BUCKET, moto_env  # noqa: F401 (moto_env: the server, one per module)


def mirror(local: JobDir, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> tuple[str, Store]:
    """Every file of the job dir ``local`` copied to a fresh prefix of the bucket: its URL and store."""
    use_env(monkeypatch, env)
    url = f"s3://{BUCKET}/jobs/{uuid.uuid4().hex[:12]}"
    store = store_for(url)
    for folder, _, files in os.walk(local.root):
        for name in files:
            path = Path(folder) / name
            if not name.startswith(".") and not path.is_symlink():
                assert store.upload(local.key(path), path, create_once=True) is not None
    return url, store


def test_a_job_dir_on_s3_reads_as_the_same_job(tmp_path, moto_env, monkeypatch):  # noqa: F811
    local = make_job(tmp_path, rows=300, shards=70)  # two blocks of the shard table
    finish_all(local, hosts=("n1", "n2"))
    url, _ = mirror(local, monkeypatch, moto_env)
    job = JobDir(url)
    assert isinstance(job.root, ObjectPath) and str(job.root) == url and job.on_object_store
    assert job.exists() and not job.legacy()
    assert job.generation == local.generation and job.generation_ids() == local.generation_ids()
    assert str(job.gen_dir) == f"{url}/generations/{local.generation}"
    ours, theirs = job.manifest(), local.manifest()
    assert ours.to_dict() == theirs.to_dict() and list(ours.shards) == list(theirs.shards)
    assert job.done_ids() == local.done_ids() and len(job.done_ids()) == 70
    sid = theirs.shards[69].id
    assert job.key(job.shard_file(sid)) == local.key(local.shard_file(sid))
    with pytest.raises(TypeError, match="not a local file"):
        open(job.shard_file(sid), "rb")  # a reader not moved onto the store fails loudly, never reads the disk
    with pytest.raises(ValueError, match="null byte"):
        Path(job.shard_file(sid)).stat()  # Path() takes the parts without fspath: they still name no local file
    assert JobDir(job.root).generation == job.generation  # an ObjectPath names the job again
    store = JobDir(url).store  # a prepare killed before a new generation's record: its name only, not a generation
    assert store.create("generations/0123456789abcdef/recipe.yaml", b"process: []\n") is not None
    assert JobDir(url).generation_ids() == local.generation_ids() and JobDir(url).generation == local.generation


def test_a_missing_or_edited_job_on_s3_is_refused_naming_its_url(tmp_path, moto_env, monkeypatch):  # noqa: F811
    local = make_job(tmp_path, rows=300, shards=70)
    url, store = mirror(local, monkeypatch, moto_env)
    with pytest.raises(UserError, match=f"{url}-none: no manifest.json; run `dj-elastic prepare`"):
        JobDir(f"{url}-none").manifest()
    table = store.read("shards/_table.jsonl")
    assert table is not None
    edited = table[0].replace(b'"rows":', b'"rows": ', 1)
    assert store.replace("shards/_table.jsonl", edited) is not None
    with pytest.raises(IntegrityError, match=rf"{url}/shards/_table.jsonl: block 0 .* was edited after prepare"):
        JobDir(url).manifest()


def test_a_worker_then_merge_verify_and_status_run_on_an_s3_job_dir(tmp_path, moto_env, monkeypatch):  # noqa: F811
    """Leases, heartbeats, lanes, records and each attempt's files (run in node-local scratch, uploaded)
    on the store; the merge reads the outputs back through it, to a local file, an object and a folder."""
    local = make_job(tmp_path, rows=120, shards=12)
    url, _ = mirror(local, monkeypatch, moto_env)
    result = run_worker(JobDir(url), copy, host="node-a", log=lambda *_: None)
    assert result.exit_code == 0 and len(result.completed) == 12 and result.job_complete, result
    assert not any(local.attempts_dir.iterdir()) and not local.done_ids(), "the local copy was written to"
    want = b"".join(shard_bytes(local.root))
    job = JobDir(url)
    assert job_status(job).complete and len(job.done_ids()) == 12
    merge(job, str(tmp_path / "out.jsonl"), log=lambda *_: None)
    assert (tmp_path / "out.jsonl").read_bytes() == want and verify(JobDir(url)).ok
    merge(JobDir(url), f"{url}-export/merged.jsonl", log=lambda *_: None)
    got = store_for(f"{url}-export").read("merged.jsonl")
    assert got is not None and got[0] == want
    done = merge(JobDir(url), str(tmp_path / "parts") + "/", log=lambda *_: None)
    parts = sorted((tmp_path / "parts").glob("part-*"))
    assert done.rows == 120 and b"".join(p.read_bytes() for p in parts) == want


def test_loading_a_job_on_s3_reads_its_generation_record_once(tmp_path, moto_env, monkeypatch):  # noqa: F811
    """The generation's existence and its record come from one GET (a HEAD, then that GET, was two)."""
    local = make_job(tmp_path, rows=30, shards=3)
    url, _ = mirror(local, monkeypatch, moto_env)
    job = JobDir(url)
    asked: list[str] = []
    for name in ("head", "read"):
        method = getattr(job.store, name)

        def counted(key: str, *args, _name=name, _method=method, **kwargs):
            if key.endswith("generation.json"):
                asked.append(_name)
            return _method(key, *args, **kwargs)

        monkeypatch.setattr(job.store, name, counted)
    assert job.manifest().recipe_sha256 and str(job.gen_dir).endswith(local.generation)
    assert asked == ["read"]


def test_the_ray_runners_shard_facts_on_s3_head_the_manifest_once_a_process(tmp_path, moto_env, monkeypatch):  # noqa: F811
    """manifest.json is created once on a store: the runner's look-ups per shard (facts, schema, block size)
    read it once, not a HEAD each (3-4 a shard)."""
    from data_juicer_elastic.ray_runner import arrow_schema

    local = make_job(tmp_path, rows=30, shards=3)
    url, _ = mirror(local, monkeypatch, moto_env)
    job = JobDir(url)
    heads: list[str] = []
    head = job.store.head

    def counted(key: str, *args, **kwargs):
        if key.endswith("manifest.json"):
            heads.append(key)
        return head(key, *args, **kwargs)

    monkeypatch.setattr(job.store, "head", counted)
    facts = [arrow_schema.shard_facts(f"{s.id}.jsonl", job=job) for s in job.manifest().shards for _ in range(3)]
    assert all(f is not None and f.longest_line for f in facts), facts
    assert arrow_schema.recorded_columns(job) == local.manifest().columns
    assert len(heads) <= 1, heads
