"""Stop signals reach a real ``dj-process`` (real Ray) at chosen moments: exit 128+N, nothing held.

DESIGN.md invariant 9. Each moment is found through the files the process
writes (a mark its prepare leaves while it holds with every shard staged, this
host's claim-loop ballot, a marker the slow op writes from its Ray worker),
never by sleeping. Ray's ``ray.init``
installs its own SIGTERM handlers (Python and native) and Data-Juicer calls
``ray.init`` again for every shard, so these runs are the only proof.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from data_juicer_elastic.job.claims import RELEASED_MTIME
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.status import job_status
from tests.jobs import wait_for
from tests.reference import DJ_PROCESS, env_with, write_jsonl

pytestmark = pytest.mark.slow

SLOW_OP = '''
import os
import time
from pathlib import Path

from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("dje_test_slow_mapper")
class DjeTestSlowMapper(Mapper):
    """Sleeps DJE_TEST_SLOW seconds per row (0 when unset) after touching DJE_TEST_MARKER."""

    def process_single(self, sample):
        marker = os.environ.get("DJE_TEST_MARKER")
        if marker:
            Path(marker).touch()
        time.sleep(float(os.environ.get("DJE_TEST_SLOW", "0")))
        return sample


if os.environ.get("DJE_TEST_IN_PREPARE"):
    # The test's harness, loaded with the recipe's custom operators in the dj-process that prepares: its
    # prepare holds with every shard staged and nothing published, after leaving the named file.
    from data_juicer_elastic.prepare import staging

    def held_publish(self):
        Path(os.environ["DJE_TEST_IN_PREPARE"]).touch()
        while True:
            time.sleep(0.05)

    staging.Staging.publish = held_publish
'''


def slow_job(tmp: Path, rows: int = 24, shards: int = 2) -> Path:
    """A recipe over ``rows`` rows whose op is slow only when DJE_TEST_SLOW is set."""
    ops = tmp / "dje_slow_ops.py"
    ops.write_text(textwrap.dedent(SLOW_OP))
    write_jsonl(tmp / "data.jsonl", [{"id": i, "text": f"row {i}"} for i in range(rows)])
    recipe = {
        "project_name": "signals",
        "dataset_path": str(tmp / "data.jsonl"),
        "export_path": str(tmp / "out" / "merged.jsonl"),
        "np": 1,
        "custom_operator_paths": [str(ops)],
        "executor_type": "elastic_shard",
        "elastic_shard": {
            "job_dir": str(tmp / "job"),
            "num_shards": shards,
            "max_retries": 0,
            "heartbeat_secs": 1.0,
            "lock_timeout_secs": 600.0,  # only a release frees a lease within this test
            "poll_interval_secs": 0.3,
            "wait_timeout_secs": 300.0,
        },
        "process": [{"dje_test_slow_mapper": None}],
    }
    path = tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def start(recipe: Path, log: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [DJ_PROCESS, "--config", str(recipe)],
        cwd=recipe.parent,
        env=env_with(**env),
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen, sig: int, log: Path) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"dj-process did not exit after {sig!r}:\n{log.read_text()[-4000:]}") from None


def finish(recipe: Path, tmp: Path) -> None:
    """Another process (fast op, new run) finishes the job the stopped ones left."""
    log = tmp / "finisher.log"
    proc = start(recipe, log)
    assert proc.wait(timeout=600) == 0, log.read_text()[-4000:]
    assert len((tmp / "out" / "merged.jsonl").read_text().splitlines()) == 24


def found(root: Path, pattern: str) -> list[str]:
    """Files under ``root`` matching ``pattern`` at any depth (the job dir's layout may nest them)."""
    return glob.glob(str(root / "**" / pattern), recursive=True)


def released(job: Path) -> bool:
    claims = found(job, "claims/*")
    return bool(claims) and all(os.stat(c).st_mtime <= RELEASED_MTIME for c in claims)


def test_sigterm_while_waiting_and_mid_shard_releases_and_exits_143(tmp_path):
    recipe = slow_job(tmp_path)
    job = tmp_path / "job"
    marker = tmp_path / "op-started"
    env = {"DJE_TEST_SLOW": "30", "DJE_TEST_MARKER": str(marker), "DJ_ELASTIC_RUN_ID": "run-signals"}
    worker_log, waiter_log = tmp_path / "worker.log", tmp_path / "waiter.log"
    worker = start(recipe, worker_log, **env)
    try:
        wait_for(
            lambda: found(job, "hosts/*.json"), "the claim loop's host ballot", proc=worker, log=worker_log, timeout=300
        )
        waiter = start(recipe, waiter_log, **env)  # same run, same host: it only waits
        wait_for(
            lambda: len(found(job, "members/*.json")) == 2,
            "the second process to wait",
            proc=waiter,
            log=waiter_log,
            timeout=300,
        )
        wait_for(marker.exists, "the slow op to start in a Ray worker", proc=worker, log=worker_log, timeout=300)
        assert stop(waiter, signal.SIGTERM, waiter_log) == 128 + signal.SIGTERM, waiter_log.read_text()[-4000:]
        assert worker.poll() is None  # the job goes on without the waiter
        assert stop(worker, signal.SIGTERM, worker_log) == 128 + signal.SIGTERM, worker_log.read_text()[-4000:]
    finally:
        for p in (worker, locals().get("waiter")):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    text = worker_log.read_text()
    assert text.index("FAIL: host=") < text.index("dj-process: error:"), "the FAIL line comes first"
    assert released(job), "the lease must be released at once"
    status = job_status(JobDir(job))
    assert status.counts["running"] == 0 and status.counts["done"] == 0
    outcomes = [json.loads(Path(p).read_text())["outcome"] for p in found(job, "attempts/*/*/attempt.json")]
    # the running attempt and, with prefetch on (the default), the one claimed ahead: both interrupted, both released
    assert outcomes and set(outcomes) == {"interrupted"} and len(outcomes) <= 2, outcomes
    finish(recipe, tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT, signal.SIGTERM])
def test_stop_signal_during_ray_startup_exits_128_plus_n(tmp_path, sig):
    recipe = slow_job(tmp_path)
    job = tmp_path / "job"
    log = tmp_path / "run.log"
    proc = start(recipe, log, DJE_TEST_SLOW="30")
    try:
        # the host ballot is taken right before this host's runner starts Ray and parses the recipe
        wait_for(lambda: found(job, "hosts/*.json"), "the claim loop's host ballot", proc=proc, log=log, timeout=300)
        assert stop(proc, sig, log) == 128 + sig, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    claims = found(job, "claims/*")
    assert not claims or released(job), "a lease taken meanwhile must be released"
    if sig == signal.SIGTERM:  # one new run proves the stopped one left the job resumable (the same for each)
        finish(recipe, tmp_path)


def test_sigint_inside_prepare_leaves_no_half_job_and_exits_130(tmp_path):
    recipe = slow_job(tmp_path)
    log, marker = tmp_path / "run.log", tmp_path / "in-prepare"
    proc = start(recipe, log, DJE_TEST_SLOW="30", DJE_TEST_IN_PREPARE=str(marker))
    try:
        wait_for(marker.exists, "prepare to stage every shard", proc=proc, log=log, timeout=300)
        assert stop(proc, signal.SIGINT, log) == 128 + signal.SIGINT, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # no manifest, no shards, no staging folder: only the runs' own state and Data-Juicer's work dir
    assert set(os.listdir(tmp_path / "job")) <= {"runs", "dj-work"}, os.listdir(tmp_path / "job")
    assert "FAIL: " in log.read_text() and "Traceback" not in log.read_text(), log.read_text()[-4000:]
    finish(recipe, tmp_path)
