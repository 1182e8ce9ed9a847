"""Shared helpers for protocol tests: corpora, prepared jobs, real worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson

from data_juicer_elastic.jobdir import JobDir, Policy
from data_juicer_elastic.prepare import PrepareRequest, prepare

REPO = Path(__file__).resolve().parent.parent
RECIPE = b"project_name: protocol-test\nprocess:\n  - whitespace_normalization_mapper: {}\n"


def write_corpus(path: Path, rows: int, width: int = 40) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for i in range(rows):
            f.write(orjson.dumps({"id": i, "text": f"row {i} " + "x" * (i * 7 % width)}) + b"\n")
    return path


def make_job(tmp: Path, *, rows: int = 100, shards: int = 10, **policy) -> JobDir:
    """A prepared job over a fresh corpus; fast leases so tests finish quickly."""
    settings = {"lock_timeout_secs": 3.0, "heartbeat_secs": 0.5, "poll_interval_secs": 0.1, "max_retries": 2}
    settings.update(policy)
    corpus = write_corpus(tmp / "input" / "data.jsonl", rows)
    req = PrepareRequest(
        dataset_path=str(corpus),
        job_dir=str(tmp / "job"),
        recipe_text=RECIPE,
        policy=Policy(num_shards=shards, **settings),
    )
    prepare(req, log=lambda *_: None)
    return JobDir(tmp / "job")


def worker_cmd(job: JobDir, runner: str = "copy", *extra: str) -> list[str]:
    return [sys.executable, "-m", "data_juicer_elastic.cli", "worker", "--job-dir", str(job.root),
            "--runner", f"tests.runners:{runner}", *extra]


def env_with(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def spawn_worker(job: JobDir, runner: str = "copy", *extra: str, log: Path | None = None, **env: str) -> subprocess.Popen:
    out = open(log, "ab") if log else subprocess.DEVNULL
    return subprocess.Popen(worker_cmd(job, runner, *extra), cwd=REPO, env=env_with(**env),
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        time.sleep(interval)


def attempt_outcomes(job: JobDir) -> dict[str, list[str]]:
    """shard -> outcomes of its attempts, in attempt order."""
    result: dict[str, list[str]] = {}
    for shard_dir in sorted(job.attempts_dir.iterdir()):
        outcomes = []
        for adir in sorted(shard_dir.iterdir()):
            try:
                outcomes.append(orjson.loads((adir / "attempt.json").read_bytes())["outcome"])
            except FileNotFoundError:
                outcomes.append("missing")
        result[shard_dir.name] = outcomes
    return result


def concatenated_shards(job: JobDir) -> bytes:
    return b"".join((job.root / s.path).read_bytes() for s in job.manifest().shards)
