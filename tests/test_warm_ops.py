"""Warm actors across shards, with prefetch on: real worker processes, real Ray, a model-backed op.

The op (tests/ops/) loads a "model" on first use and appends ``pid
CUDA_VISIBLE_DEVICES`` to a file each time: the tests count loads, never
time. One test runs on a node-local Ray started with logical GPUs (``ray
start --head --num-gpus 2``), the op taking its CUDA path, so Data-Juicer
puts it in actor mode with ``num_gpus`` and Ray places each warm actor on
its own GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from data_juicer_elastic.job.layout import JobDir
from tests.jobs import REPO, attempt_outcomes, env_with, make_job

OPS = REPO / "tests" / "ops"
SHARDS = 8
ROWS = 400
pytestmark = pytest.mark.slow


def warm_job(tmp: Path, op: dict, ops_file: str, ray_address: str = "local") -> JobDir:
    """A prepared job (tests/jobs.py) whose recipe runs ``op`` from ``tests/ops/<ops_file>``."""
    recipe = {"project_name": "warm", "custom_operator_paths": [str(OPS / ops_file)], "process": [op]}
    return make_job(
        tmp,
        rows=ROWS,
        shards=SHARDS,
        recipe=yaml.safe_dump(recipe).encode(),
        lock_timeout_secs=120,
        heartbeat_secs=2,
        poll_interval_secs=0.5,
        ray_address=ray_address,
    )


def run_worker(job: JobDir, *extra: str, timeout: float = 900, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "data_juicer_elastic.cli", "worker", "--job-dir", str(job.root), *extra]
    environment = env_with(RAY_USAGE_STATS_ENABLED="0", **env)
    proc = subprocess.run(cmd, env=environment, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"worker exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def outputs(job: JobDir) -> list[dict]:
    rows = []
    for shard in job.manifest().shards:
        done = json.loads(job.done_path(shard.id).read_text())
        with open(job.root / done["output"]) as f:
            rows += [json.loads(line) for line in f]
    return rows


def first_op_counts(job: JobDir) -> list[dict]:
    """The first op's record in each done attempt's ops.json."""
    ops = []
    for shard in job.manifest().shards:
        done = json.loads(job.done_path(shard.id).read_text())
        ops.append(json.loads((job.root / done["output"]).parent.joinpath("ops.json").read_text())["ops"][0])
    return ops


def loads(path: Path) -> list[tuple[str, str]]:
    return [tuple(f"{line} ".split(" ")[:2]) for line in path.read_text().splitlines()]


def test_actor_mode_op_loads_once_per_actor_across_shards(tmp_path):
    """8 shards, concurrency 2, prefetch on: 2 model loads in 2 processes, outputs those of the op, in order."""
    record = tmp_path / "loads.txt"
    op = {
        "slow_model_mapper": {
            "loads_file": str(record),
            "load_secs": 1.0,
            "ray_execution_mode": "actor",
            "num_proc": 2,
            "num_cpus": 0.5,
            "batch_size": 10,
        }
    }
    job = warm_job(tmp_path, op, "slow_model_ops.py")
    run_worker(job, "--prefetch-shards", "1")
    assert len(job.done_ids()) == SHARDS
    got = loads(record)
    assert len(got) == 2 and len({pid for pid, _ in got}) == 2, got
    rows = outputs(job)
    assert [r["id"] for r in rows] == list(range(ROWS))
    assert all(r["text_len"] == len(r["text"]) for r in rows)
    ops = first_op_counts(job)
    assert all(o["counted"] for o in ops)  # by the warm actors' op itself
    assert sum(o["rows_in"] for o in ops) == sum(o["rows_out"] for o in ops) == ROWS


def test_an_actor_dying_mid_shard_fails_that_attempt_and_is_replaced(tmp_path):
    """The actor kills itself on its first batch after the flag appears: one failed attempt, retried; one more load."""
    record, flag = tmp_path / "loads.txt", tmp_path / "die"
    op = {
        "slow_model_mapper": {
            "loads_file": str(record),
            "load_secs": 0.2,
            "die_file": str(flag),
            "ray_execution_mode": "actor",
            "num_proc": 1,
        }
    }
    job = warm_job(tmp_path, op, "slow_model_ops.py")
    flag.touch()
    run_worker(job, "--prefetch-shards", "1")
    assert not flag.exists()
    outcomes = attempt_outcomes(job)
    assert sorted(o for v in outcomes.values() for o in v).count("failed") == 1, outcomes
    assert len(job.done_ids()) == SHARDS
    got = loads(record)
    assert len(got) == 2 and len({pid for pid, _ in got}) == 2, got  # the first actor, then its replacement
    assert [r["id"] for r in outputs(job)] == list(range(ROWS))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gpu_ray(tmp_path):
    """A node-local Ray head with 2 logical GPUs, in its own session; stopped by its process group."""
    port = _free_port()
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay under 107 bytes
    # Its workers inherit this environment (PYTHONPATH: this repo); no token auth, so the worker can join it.
    env = env_with(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    head = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-gpus=2",
            "--num-cpus=4",
            "--include-dashboard=false",
            "--object-store-memory=200000000",
            f"--temp-dir={ray_tmp}",
        ],
        env=env,
        start_new_session=True,
        stdout=open(tmp_path / "ray.log", "w"),
        stderr=subprocess.STDOUT,
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while "will now block forever" not in (tmp_path / "ray.log").read_text():
            assert head.poll() is None, f"ray start exited: {(tmp_path / 'ray.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "waiting for `ray start --head --num-gpus 2` to report it is up"
            time.sleep(1)
        yield address
    finally:
        # SIGTERM to `ray start` alone: it drains the node through its GCS, then stops its processes. A SIGTERM
        # to the whole group stopped the GCS too, and the drain waited out its 30 s RPC timeout at every run.
        if head.poll() is None:
            head.send_signal(signal.SIGTERM)
            try:
                head.wait(60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(head.pid, signal.SIGKILL)  # whatever of the group outlived it
        except ProcessLookupError:
            pass
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_gpu_op_keeps_one_warm_actor_per_gpu_with_prefetch(tmp_path, gpu_ray):
    """A CUDA op with num_gpus 1 on 2 logical GPUs: Data-Juicer's own choice, actors, concurrency 2; each
    warm actor holds its GPU for the whole job, two loads on two different GPUs, and prefetching the next
    shard never waits on those GPUs."""
    record = tmp_path / "loads.txt"
    op = {"gpu_model_mapper": {"loads_file": str(record), "load_secs": 0.5, "num_gpus": 1}}
    job = warm_job(tmp_path, op, "gpu_model_ops.py", ray_address=gpu_ray)
    # The worker joins with the head's auth mode, whatever this process's environment holds.
    proc = run_worker(job, "--prefetch-shards", "1", RAY_AUTH_MODE="disabled")
    assert len(job.done_ids()) == SHARDS
    got = loads(record)
    assert len(got) == 2 and len({pid for pid, _ in got}) == 2, got
    assert sorted(gpu for _, gpu in got) == ["0", "1"], got  # one logical GPU each, as Ray assigned them
    rows = outputs(job)
    assert [r["id"] for r in rows] == list(range(ROWS))
    assert all(r["text_len"] == 2 * len(r["text"]) for r in rows)
    logs = "".join(p.read_text() for p in job.root.glob("attempts/*/*/process.log")) + proc.stdout + proc.stderr
    assert "2 warm actor(s) (1 CPU, 1 GPU each)" in logs
