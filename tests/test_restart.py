"""A node killed and started again under the same host name works again at once (issues 35 and 37).

Real processes, real kill -9, a real job dir. Leases here have a 300 s lock timeout, so anything that happens
within the tests' bounds happened because the dead holder was proven gone (or its attempt ended), not because
its lease went stale.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

from data_juicer_elastic.cli import main as cli_main
from data_juicer_elastic.coordination.rundir import RunDir
from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.status import job_status
from data_juicer_elastic.storage.files import create_exclusive, dumps_json
from data_juicer_elastic.storage.host import boot_id, start_time
from data_juicer_elastic.storage.posix import PosixStore

from .cluster import Cluster, finish
from .jobs import attempt_outcomes, kill_group, make_job, spawn_worker, wait_for

LOCK = 300.0  # no lease goes stale by its age in these tests
SID = "part-00000-of-00001"


def _dead_pid() -> int:
    """The pid of a process that ran on this host and is gone (reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _kill9(proc: subprocess.Popen) -> None:
    kill_group(proc, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


# leases -------------------------------------------------------------------------------------------
def test_killed_workers_lease_is_taken_over_at_once_by_its_host_not_by_another(tmp_path):
    job = make_job(tmp_path, rows=10, shards=1, lock_timeout_secs=LOCK)
    victim = spawn_worker(job, "slow_copy", DJE_TEST_SLEEP="600", DJ_ELASTIC_HOSTNAME="n1")
    try:
        wait_for((job.attempts_dir / SID / "0001" / "started").exists, "attempt 1 to start", proc=victim)
    finally:
        _kill9(victim)
    # another host cannot prove n1's process gone: the lease stays live for it until lock_timeout
    other = ClaimStore(job, lock_timeout=LOCK, host="n2")
    assert other.is_live(SID, 1, other.now())
    log = tmp_path / "n2.log"
    n2 = spawn_worker(job, "copy", log=log, DJ_ELASTIC_HOSTNAME="n2")
    try:
        wait_for(lambda: "worker started" in log.read_text(), "n2's worker to start", proc=n2, log=log)
        time.sleep(3)  # some 30 polls of n2's claim loop
        assert not job.claims_dir.joinpath(f"{SID}@0002").exists(), log.read_text()
    finally:
        kill_group(n2, signal.SIGTERM)
        n2.wait(timeout=60)
    # n1 started again: its dead process's lease is stale at once
    n1 = spawn_worker(job, "copy", log=tmp_path / "n1.log", DJ_ELASTIC_HOSTNAME="n1")
    try:
        wait_for(job.claims_dir.joinpath(f"{SID}@0002").exists, "n1 to take over", timeout=30, proc=n1)
        assert n1.wait(timeout=60) == 0
    finally:
        kill_group(n1)
    assert attempt_outcomes(job)[SID] == ["running", "done"]


def test_a_lease_whose_pid_runs_another_process_is_stale_for_its_host(tmp_path):
    job = make_job(tmp_path, rows=10, shards=1, lock_timeout_secs=LOCK)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        started = wait_for(lambda: start_time(sleeper.pid), "the sleeper's start time")
        leases = {
            1: {"pid": sleeper.pid, "start": started, "boot": boot_id()},  # that very process: live
            2: {"pid": sleeper.pid, "start": started + 1, "boot": boot_id()},  # its pid, reused since
            3: {"pid": sleeper.pid, "start": started, "boot": "another-boot"},  # recorded before a reboot
            4: {"pid": _dead_pid()},  # gone (a lease of an older version records no start time)
            5: {"pid": sleeper.pid},
        }
        for attempt, who in leases.items():
            assert create_exclusive(job.claims_dir / f"{SID}@{attempt:04d}", dumps_json({"host": "n1", **who}))
        same, other = (ClaimStore(job, lock_timeout=LOCK, host=h) for h in ("n1", "n2"))
        now = same.now()
        assert {a: same.is_live(SID, a, now) for a in leases} == {1: True, 2: False, 3: False, 4: False, 5: True}
        assert all(other.is_live(SID, a, now) for a in leases)
    finally:
        sleeper.kill()
        sleeper.wait()


# the host's claim loop election -------------------------------------------------------------------
def test_restarted_node_wins_its_hosts_claim_loop_again_and_takes_its_lease_over(tmp_path):
    c = Cluster(tmp_path, rows=20, shards=1)
    args = ("--lock-timeout", str(LOCK), "--wait-timeout", "600")
    [first] = c.start(["n1"], "--runner", "slow_copy", *args, DJE_TEST_SLEEP="600")
    try:
        started = f"generations/*/attempts/{SID}/0001/started"  # c.job's generation is not made yet
        wait_for(lambda: list(c.job.root.glob(started)), "attempt 1 to start", proc=first.proc)
    finally:
        first.kill()
    [again] = c.start(["n1"], "--runner", "copy", *args)  # same host name, same run id
    assert finish([again], timeout=60) == [0], again.output
    assert "runs the claim loop for host=n1" not in again.output
    assert "worker started on host=n1" in again.output
    assert attempt_outcomes(c.job)[SID] == ["running", "done"]
    assert c.export.read_bytes() == c.dataset.read_bytes()


def _stand(root: str, barrier, results, leave) -> None:
    run = RunDir.at(PosixStore(root), "run", "run-1", "n1")
    barrier.wait()
    won, ballot = run.elect("hosts/n1.json", replace_gone=True)
    results.put((os.getpid(), won, ballot.get("pid")))
    leave.wait(120)  # a winner that exited would be gone, and rightly replaced, before the test looks


def test_of_several_restarted_processes_exactly_one_replaces_the_dead_ballot(tmp_path):
    run = RunDir.open(PosixStore(tmp_path), "run", "run-1", "n1")
    dead = {"host": "n1", "pid": _dead_pid(), "at": time.time(), "boot": boot_id()}
    assert run.store.create(run.key("hosts/n1.json"), dumps_json(dead))
    ctx = mp.get_context("fork")
    barrier, results, leave = ctx.Barrier(4), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_stand, args=(str(tmp_path), barrier, results, leave)) for _ in range(4)]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=60) for _ in procs]
    finally:
        leave.set()
        for p in procs:
            p.join(60)
    winners = [pid for pid, won, _ in got if won]
    assert len(winners) == 1, got
    assert all(holder == winners[0] for _, _, holder in got), got
    # a ballot of another host is never judged gone, dead pid or not
    other = RunDir.at(PosixStore(tmp_path), "run", "run-1", "n2")
    assert run.store.create(run.key("hosts/n3.json"), dumps_json({**dead, "host": "n3"}))
    assert other.elect("hosts/n3.json", replace_gone=True) == (False, {**dead, "host": "n3"})


# retry of a done shard ----------------------------------------------------------------------------
def test_retried_done_shard_is_claimable_at_once(tmp_path):
    job = make_job(tmp_path, rows=20, shards=2, lock_timeout_secs=LOCK)
    first = spawn_worker(job, "copy", DJ_ELASTIC_HOSTNAME="n1")
    assert first.wait(timeout=120) == 0
    sid = "part-00001-of-00002"
    assert cli_main(["retry", "--job-dir", str(job.root), "--shard-id", sid]) == 0
    assert job_status(job).counts["pending"] == 1
    # another host: the finished attempt's process being gone proves nothing to it, only that the attempt ended
    log = tmp_path / "n2.log"
    rerun = spawn_worker(job, "copy", log=log, DJ_ELASTIC_HOSTNAME="n2")
    try:
        wait_for(job.done_path(sid).exists, "the retried shard to be redone", timeout=30, proc=rerun, log=log)
        assert rerun.wait(timeout=60) == 0
    finally:
        kill_group(rerun)
    assert attempt_outcomes(job)[sid] == ["done", "done"]
