"""The claim protocol with real worker processes racing on a real directory."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.cli import main as cli_main
from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.merge import merge
from data_juicer_elastic.status import job_status
from data_juicer_elastic.worker.loop import run_worker

from .jobs import (
    REPO,
    assert_taken_over_after_timeout,
    attempt_outcomes,
    env_with,
    input_bytes,
    kill_group,
    last_heartbeat,
    make_job,
    spawn_worker,
    wait_for,
)
from .runners import copy


def test_eight_workers_race_over_80_shards_each_done_once(tmp_path):
    job = make_job(tmp_path, rows=400, shards=80)
    procs = [spawn_worker(job, "copy") for _ in range(8)]
    codes = [p.wait(timeout=240) for p in procs]
    assert codes == [0] * 8
    outcomes = attempt_outcomes(job)
    assert len(outcomes) == 80
    # every shard ran its runner once and published once: no duplicate, no superseded work
    assert all(o == ["done"] for o in outcomes.values()), {k: v for k, v in outcomes.items() if v != ["done"]}
    assert len(os.listdir(job.done_dir)) == 80
    out = tmp_path / "merged.jsonl"
    merge(job, str(out), log=lambda *_: None)
    assert out.read_bytes() == input_bytes(job)


def test_kill9_mid_shard_then_another_worker_finishes_after_lease_expires(tmp_path):
    job = make_job(tmp_path, rows=60, shards=6, lock_timeout_secs=2.0, heartbeat_secs=0.3)
    # another host name: a rescuer of the victim's own host would prove it gone and take over at once
    victim = spawn_worker(
        job, "slow_copy", DJE_TEST_SLEEP="60", DJE_TEST_SLOW_SHARDS="part-00003-of-00006", DJ_ELASTIC_HOSTNAME="victim"
    )
    started = job.attempts_dir / "part-00003-of-00006" / "0001" / "started"
    # the victim works through shards in its own order; wait until it is inside the slow one
    wait_for(started.exists, timeout=60)
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    last_beat = last_heartbeat(job, "part-00003-of-00006", 1)
    rescuer = spawn_worker(job, "copy")
    assert rescuer.wait(timeout=60) == 0
    assert_taken_over_after_timeout(job, "part-00003-of-00006", 1, last_beat)
    outcomes = attempt_outcomes(job)
    assert outcomes["part-00003-of-00006"] == ["running", "done"]
    out = tmp_path / "merged.jsonl"
    merge(job, str(out), log=lambda *_: None)
    assert out.read_bytes() == input_bytes(job)


def test_sigterm_records_interrupted_and_releases_the_lease_at_once(tmp_path):
    job = make_job(tmp_path, rows=10, shards=1, lock_timeout_secs=600.0)
    worker = spawn_worker(job, "slow_copy", DJE_TEST_SLEEP="60")
    wait_for((job.attempts_dir / "part-00000-of-00001" / "0001" / "started").exists)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=120) == 128 + signal.SIGTERM
    assert attempt_outcomes(job)["part-00000-of-00001"] == ["interrupted"]
    assert job_status(job).counts["pending"] == 1
    # with a 600 s lock timeout, only the release makes it claimable now
    result = run_worker(job.root, copy, log=lambda *_: None)
    assert result.exit_code == 0
    assert attempt_outcomes(job)["part-00000-of-00001"] == ["interrupted", "done"]


def test_sigterm_while_the_worker_still_imports_exits_143(tmp_path):
    """DESIGN invariant 9 from the process's first imports on: a scheduler may stop a node as it starts."""
    job = make_job(tmp_path, rows=10, shards=1)
    gate = tmp_path / "import-gate"
    path = os.pathsep.join([str(REPO / "tests" / "chaos" / "slow_import"), env_with()["PYTHONPATH"]])
    worker = spawn_worker(job, "copy", log=tmp_path / "w.log", PYTHONPATH=path, DJE_TEST_IMPORT_GATE=str(gate))
    try:
        wait_for(Path(f"{gate}.entered").exists, "the worker to import orjson", proc=worker, log=tmp_path / "w.log")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 128 + signal.SIGTERM, (tmp_path / "w.log").read_text()
    finally:
        kill_group(worker)
    assert not job.attempts_dir.exists() or not os.listdir(job.attempts_dir), "it claimed a shard"


def test_retry_budget_terminal_failure_then_retry_keeps_history(tmp_path, capsys):
    job = make_job(tmp_path, rows=40, shards=4, max_retries=1)
    env = {"DJE_TEST_FAIL_SHARDS": "part-00002-of-00004"}
    p = spawn_worker(job, "fail", **env)
    assert p.wait(timeout=60) == 2
    assert attempt_outcomes(job)["part-00002-of-00004"] == ["failed", "failed"]
    record = orjson.loads(job.failed_path("part-00002-of-00004").read_bytes())
    assert record["failures"] == 2 and "injected failure" in record["error"]
    assert (job.root / record["log"]).exists()
    assert cli_main(["status", "--job-dir", str(job.root)]) == 2
    # retry: the failed record is archived, never deleted, and the budget starts afresh
    assert cli_main(["retry", "--job-dir", str(job.root), "--all-failed"]) == 0
    assert not job.failed_path("part-00002-of-00004").exists()
    archived = [n for n in os.listdir(job.history_dir) if "part-00002-of-00004.failed" in n]
    assert len(archived) == 1
    assert run_worker(job.root, copy, log=lambda *_: None).exit_code == 0
    assert attempt_outcomes(job)["part-00002-of-00004"] == ["failed", "failed", "done"]
    assert cli_main(["verify", "--job-dir", str(job.root)]) == 0


def test_a_second_retry_archives_the_first_retry_record_and_each_done_record(tmp_path):
    from data_juicer_elastic.job.records.retry import requeue

    job = make_job(tmp_path, rows=10, shards=1)
    sid = job.manifest().shards[0].id
    first_done = b""
    for n in (1, 2):
        assert run_worker(job.root, copy, log=lambda *_: None).exit_code == 0
        first_done = first_done or job.done_path(sid).read_bytes()
        earlier = job.retry_path(sid).read_bytes() if n == 2 else None
        assert requeue(job, [sid]) == [sid]
        assert not job.done_path(sid).exists()
        assert orjson.loads(job.retry_path(sid).read_bytes())["after_attempt"] == n
    history = {n.rsplit(".", 2)[-2]: [] for n in os.listdir(job.history_dir)}
    for name in sorted(os.listdir(job.history_dir)):
        history[name.rsplit(".", 2)[-2]].append((job.history_dir / name).read_bytes())
    assert len(history["done"]) == 2 and first_done in history["done"]
    assert history["retry"] == [earlier]  # the first retry record, as it was
    archived = orjson.loads(job.retry_path(sid).read_bytes())["archived"]
    assert [a["attempt"] for a in archived] == [1, 2]


def _race_for_stale_lease(job_root: str, barrier, results) -> None:
    from data_juicer_elastic.job.layout import JobDir

    store = ClaimStore(JobDir(job_root), lock_timeout=1.0, host=f"racer-{os.getpid()}")
    barrier.wait()
    lease = store.try_claim("part-00000-of-00001", 1)
    results.put(lease is not None)


def test_racing_takeover_of_one_stale_lease_has_one_winner(tmp_path):
    job = make_job(tmp_path, rows=5, shards=1)
    store = ClaimStore(job, lock_timeout=1.0, host="dead")
    lease = store.try_claim("part-00000-of-00001", 0)
    os.utime(lease.path, (1, 1))  # long dead
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_race_for_stale_lease, args=(str(job.root), barrier, results)) for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    wins = [results.get(timeout=120) for _ in procs]
    assert wins.count(True) == 1
    assert sorted(os.listdir(job.claims_dir)) == ["part-00000-of-00001@0001", "part-00000-of-00001@0002"]


def test_live_lease_is_not_taken_and_staleness_uses_the_file_clock(tmp_path):
    job = make_job(tmp_path, rows=5, shards=1)
    owner = ClaimStore(job, lock_timeout=5.0, host="a")
    lease = owner.try_claim("part-00000-of-00001", 0)
    other = ClaimStore(job, lock_timeout=5.0, host="b")
    now = other.now()
    assert abs(now - os.stat(lease.path).st_mtime) < 2.0
    assert other.is_live("part-00000-of-00001", 1, now)
    os.utime(lease.path, (now - 10, now - 10))
    assert not other.is_live("part-00000-of-00001", 1, other.now())
    assert other.try_claim("part-00000-of-00001", 1) is not None
    assert not owner.is_current(lease)


def test_stalled_worker_is_superseded_and_cannot_publish(tmp_path):
    job = make_job(tmp_path, rows=10, shards=1, lock_timeout_secs=1.5, heartbeat_secs=0.2)
    sid = "part-00000-of-00001"
    release = tmp_path / "release"
    stalled = spawn_worker(job, "slow_copy", DJE_TEST_HOLD=str(release))
    wait_for((job.attempts_dir / sid / "0001" / "started").exists)
    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        last_beat = last_heartbeat(job, sid, 1)
        rescuer = spawn_worker(job, "copy")
        assert rescuer.wait(timeout=60) == 0
        assert_taken_over_after_timeout(job, sid, 1, last_beat)
    finally:
        release.touch()  # the stalled runner finishes once resumed
        os.kill(stalled.pid, signal.SIGCONT)
    assert stalled.wait(timeout=120) == 0  # resumes, cannot publish, sees the job done, exits cleanly
    assert attempt_outcomes(job)[sid] == ["superseded", "done"]
    assert orjson.loads(job.done_path(sid).read_bytes())["attempt"] == 2


def test_status_json_counts_and_shards(tmp_path, capsys):
    job = make_job(tmp_path, rows=30, shards=3)
    run_worker(job.root, copy, max_shards=2, log=lambda *_: None)
    assert cli_main(["status", "--job-dir", str(job.root), "--json"]) == 1
    data = orjson.loads(capsys.readouterr().out)
    assert data["counts"] == {"pending": 1, "running": 0, "stale": 0, "done": 2, "failed": 0}
    # the summary lists only shards started and not done (here none); every shard is --shards' detail
    assert data["shards"] == [] and data["shard_count"] == 3 and data["per_shard"] is False
    assert cli_main(["status", "--job-dir", str(job.root), "--json", "--shards"]) == 1
    detail = orjson.loads(capsys.readouterr().out)
    assert detail["counts"] == data["counts"] and detail["per_shard"] is True
    assert {"id", "state", "host", "attempts", "rows"} <= set(detail["shards"][0])
    assert [s["state"] for s in detail["shards"]] == ["done", "done", "pending"]
    assert {k: v for k, v in detail.items() if k not in ("shards", "per_shard")} == {
        k: v for k, v in data.items() if k not in ("shards", "per_shard")
    }


@pytest.mark.parametrize("argv", [["worker", "--job-dir", "/nonexistent/job"], ["status", "--job-dir", "/nope"]])
def test_missing_job_dir_is_a_user_error(argv, capsys):
    assert cli_main(argv) == 2
    assert "no manifest.json" in capsys.readouterr().err


def test_cli_worker_unknown_runner_exit_2(tmp_path):
    job = make_job(tmp_path, rows=5, shards=1)
    cmd = [sys.executable, "-m", "data_juicer_elastic.cli", "worker", "--job-dir", str(job.root), "--runner", "nope:x"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path))
    assert p.returncode == 2 and "--runner 'nope:x'" in p.stderr


def test_retry_all_failed_with_nothing_failed_says_so_and_succeeds(tmp_path, capsys):
    """Nothing to requeue is the state asked for, not a usage error: exit 0 (a script's retry step passes)."""
    job = make_job(tmp_path, rows=20, shards=2)
    assert cli_main(["retry", "--job-dir", str(job.root), "--all-failed"]) == 0
    out, err = capsys.readouterr()
    assert "no shard has failed: nothing to requeue" in out and err == "", (out, err)
    assert "--shard-id" in out  # how a done shard is requeued, which --all-failed never does
    assert not any(job.history_dir.iterdir()) and not job.retry_path(job.manifest().shards[0].id).exists()
    # naming no shard at all is still a usage error
    assert cli_main(["retry", "--job-dir", str(job.root)]) == 2
    assert "name shards with --shard-id, or use --all-failed" in capsys.readouterr().err
