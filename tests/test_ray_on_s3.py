"""The real Ray runner on a job dir given as an ``s3://`` URL (a moto server), against the same job on disk.

Each test prepares one request twice, onto a local job dir and straight onto the store (``prepare()``),
runs a worker with the runner the executor builds (``plugin.executor.make_runner`` on the generation's
folder, as ``coordination.work`` calls it) over both, merges each to a local file and compares the bytes.
On the store the runner reads its shard from node-local scratch, writes its output and ``ops.json``
there, and finds the job (recipe, manifest, the input's recorded schema) from its third argument, the
generation's URL: nothing of the job is a local file there.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.job.versions import current_versions
from data_juicer_elastic.merge import merge
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare
from data_juicer_elastic.worker.loop import run_worker

from .s3server import use_env
from .test_store_contract import BUCKET, moto_env  # noqa: F401 (moto_env: the server, one per module)

pytest.importorskip("boto3")
pytest.importorskip("moto")
pytestmark = pytest.mark.slow

SHARDS = 4
ROWS = 40
POLICY = {"lock_timeout_secs": 60.0, "heartbeat_secs": 1.0, "poll_interval_secs": 0.2, "max_retries": 1}


def rows() -> list[dict[str, Any]]:
    """An email for the mapper to remove; ``score`` holds floats in the last rows only, so a shard before
    them read without the input's recorded schema (double) writes ``0`` where the job writes ``0.0``."""
    return [
        {"id": i, "text": f"row {i} mail user{i}@example.com now", "score": i if i < ROWS - 4 else i + 0.5}
        for i in range(ROWS)
    ]


def recipe(**extra: Any) -> bytes:
    return yaml.safe_dump({"project_name": "ray-on-s3", **extra, "process": [{"clean_email_mapper": None}]}).encode()


@pytest.fixture(scope="module")
def runners() -> Iterator[list]:
    """The runners the tests built; closed (Ray stopped) once the module is done."""
    made: list = []
    yield made
    for runner in made:
        runner.close()


def both_jobs(tmp: Path, dataset: Path, recipe_text: bytes, url: str) -> tuple[JobDir, JobDir]:
    """The same request prepared on disk and onto the store."""
    jobs = []
    for where in (str(tmp / "job"), url):
        req = PrepareRequest(
            dataset_path=str(dataset),
            job_dir=where,
            recipe_text=recipe_text,
            policy=Policy(num_shards=SHARDS, **POLICY),
            versions=current_versions(),
        )
        prepare(req, log=lambda *_: None)
        jobs.append(JobDir(where))
    return jobs[0], jobs[1]


def run_both(local: JobDir, remote: JobDir, runners: list) -> None:
    """One worker per job, each with the runner ``make_runner`` builds for the job's generation folder."""
    from data_juicer_elastic.plugin.executor import make_runner

    for job in (local, remote):
        runner = make_runner(str(job.gen_dir))  # what coordination.work hands it: on the store, a URL
        runners.append(runner)
        result = run_worker(JobDir(str(job.root)), runner, host="node-a", log=lambda *_: None)
        assert result.exit_code == 0 and len(result.completed) == SHARDS and result.job_complete, result


def fresh_url(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> str:
    use_env(monkeypatch, env)
    return f"s3://{BUCKET}/jobs/{uuid.uuid4().hex[:12]}"


def attempt_files(job: JobDir) -> dict[str, list[str]]:
    """The files each shard's first attempt left in the job dir, by name, but Data-Juicer's work dir: its
    event log and plan, which no reader of the job dir reads, stay in node-local scratch on a store."""
    names: dict[str, list[str]] = {}
    for sid in sorted(job.done_ids()):
        prefix = job.key(job.attempt_dir(sid, 1)) + "/"
        keys = [e.key.removeprefix(prefix) for e in job.store.list(prefix)]
        assert not job.on_object_store or not any(k.startswith("work/") for k in keys), keys
        names[sid] = sorted(k for k in keys if not k.startswith("work/"))
    return names


def test_jsonl_job_on_s3_merges_the_bytes_of_the_same_job_on_disk(tmp_path, moto_env, monkeypatch, runners):  # noqa: F811
    url = fresh_url(monkeypatch, moto_env)
    data = tmp_path / "input" / "data.jsonl"
    data.parent.mkdir()
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows()))
    local, remote = both_jobs(tmp_path, data, recipe(), url)
    run_both(local, remote, runners)
    merge(local, str(tmp_path / "local.jsonl"), log=lambda *_: None)
    merge(JobDir(url), str(tmp_path / "s3.jsonl"), log=lambda *_: None)
    want = (tmp_path / "local.jsonl").read_bytes()
    assert (tmp_path / "s3.jsonl").read_bytes() == want
    got = [orjson.loads(line) for line in want.splitlines()]
    assert [r["id"] for r in got] == list(range(ROWS)) and "example.com" not in want.decode()
    assert got[0]["score"] == 0.0 and b'"score":0.0' in want.splitlines()[0]  # the recorded schema: doubles
    files = attempt_files(JobDir(url))
    assert files == attempt_files(local) and files, files  # output, ops.json, process.log, attempt.json
    assert all("ops.json" in names and "processed.jsonl" in names for names in files.values()), files
    job = JobDir(url)
    ops = [orjson.loads(job.store.read(f"{job.key(job.attempt_dir(sid, 1))}/ops.json")[0]) for sid in files]
    assert sum(o["rows_in"] for o in ops) == sum(o["rows_out"] for o in ops) == ROWS, ops
    assert all(o["ops"][0]["op"] == "clean_email_mapper" and o["ops"][0]["counted"] for o in ops), ops


def test_parquet_input_and_export_on_s3_merge_the_bytes_of_the_same_job_on_disk(
    tmp_path,
    moto_env,  # noqa: F811
    monkeypatch,
    runners,
):
    """Shards that describe row groups of a local Parquet input; the recipe exports Parquet, so each attempt
    also writes ``processed.parquet`` and its sidecar, which the merge reads back from the store."""
    url = fresh_url(monkeypatch, moto_env)
    data = tmp_path / "input" / "data.parquet"
    data.parent.mkdir()
    pq.write_table(pa.Table.from_pylist([{**r, "score": float(r["score"])} for r in rows()]), data, row_group_size=5)
    out = tmp_path / "out" / "merged.parquet"
    local, remote = both_jobs(tmp_path, data, recipe(export_path=str(out)), url)
    assert local.manifest().parquet is not None
    run_both(local, remote, runners)
    merge(local, str(tmp_path / "local.parquet"), log=lambda *_: None)
    merge(JobDir(url), str(tmp_path / "s3.parquet"), log=lambda *_: None)
    want = (tmp_path / "local.parquet").read_bytes()
    assert (tmp_path / "s3.parquet").read_bytes() == want
    table = pq.read_table(tmp_path / "local.parquet")
    assert table.column("id").to_pylist() == list(range(ROWS))
    assert not any("example.com" in t for t in table.column("text").to_pylist())
    files = attempt_files(JobDir(url))
    assert files == attempt_files(local) and all("processed.parquet" in names for names in files.values()), files
