"""The local chaos suite's faults on an ``s3://`` job dir (a moto server, tests/s3server.py).

What tests/chaos/test_faults.py and test_clock_skew.py do to workers on a shared folder, done to workers whose
job dir is a prefix of the server's bucket: random kills and restarts, a stale lease many workers find at once,
a stalled worker that resumes, kills between the output and the done record, a skewed clock, and a store that
stops answering for a while. Each test ends with every shard done exactly once and the merge equal to the input
(tests/jobs.py's checks, which read through the store when the job dir is on one). The lock timeout is 6 s:
S3 stamps whole seconds, and an attempt whose heartbeat stalls for half the timeout does not publish (its
lease may look stale), which a loaded 2-core machine with a single-threaded server reached at 3 s.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.job.claims import claim_store
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.attempt import load_attempt
from data_juicer_elastic.status import job_status

from ..jobs import (
    assert_taken_over_after_timeout,
    attempt_outcomes,
    check_done_exactly_once,
    input_bytes,
    kill_group,
    last_heartbeat,
    make_job,
    merge_and_check,
    spawn,
    spawn_worker,
    wait_for,
)
from ..require import require
from .test_clock_skew import skewed_owner_then_rescuer
from .test_faults import TARGET, _racer, catches

LEASE = {"lock_timeout_secs": 6.0, "heartbeat_secs": 0.5, "poll_interval_secs": 0.1}
SID = "part-00000-of-00001"


def _s3_job(tmp: Path, url: str, rows: int, shards: int, **policy) -> JobDir:
    job = make_job(tmp, rows=rows, shards=shards, job_dir=url, **{**LEASE, **policy})
    assert job.on_object_store
    return job


def _claims(job: JobDir) -> list[str]:
    return sorted(job.store.names(job.key(job.claims_dir)))


def _output(job: JobDir, sid: str, attempt: int) -> bytes | None:
    got = job.store.read(job.key(job.attempt_output(sid, attempt)))
    return None if got is None else got[0]


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else ""


def _server_pid() -> int:
    """The moto server this test talks to: this process's one child running ``tests.s3server``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except (OSError, ValueError):
            continue
        if ppid == os.getpid() and b"tests.s3server" in cmd:
            found.append(int(entry))
    assert len(found) == 1, f"moto servers started by this process: {found}"
    return found[0]


# random kills and restarts ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_random_kills_and_restarts_on_s3_lose_nothing(tmp_path, s3_url):
    """4 workers over 48 shards of 1 s each (12 s of work at least: 4 kills and more at 1 to 2.5 s apart; 32 of
    0.4 s once ended after 3 in CI); a driver SIGKILLs or SIGTERMs a random one, starts another."""
    shards = 48
    job = _s3_job(tmp_path, s3_url, rows=10 * shards, shards=shards, max_retries=1000)
    seed = int(os.environ.get("DJE_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    logs: dict[int, Path] = {}

    def start():
        log = tmp_path / f"worker-{len(logs)}.log"
        proc = spawn_worker(job, "slow_copy", log=log, DJE_TEST_SLEEP="1.0")
        logs[proc.pid] = log
        return proc

    live = [start() for _ in range(4)]
    signalled: list[tuple[object, int, bool, bool]] = []  # process, signal, job done by then, handler in place
    deadline = time.monotonic() + 240
    landed = False
    try:
        while len(signalled) < 16 and len(job.done_ids()) < shards:
            assert time.monotonic() < deadline, f"seed {seed}: the kills did not end"
            time.sleep(rng.uniform(1.0, 2.5))  # past a new worker's start (boto3, the probe) most times
            inside = None
            if not landed:  # SIGKILL a worker inside a shard until one kill lands there, whatever the load
                victim, *inside = wait_for(lambda: _running_worker(job, live), "a worker inside a shard", timeout=120)
                sig = signal.SIGKILL
            else:
                victim = rng.choice([p for p in live if p.poll() is None] or [None])
                sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
            if victim is None:
                break
            handled = catches(victim.pid, sig)
            kill_group(victim, sig)
            if inside:
                victim.wait(timeout=60)
                record = load_attempt(job, *inside)
                landed = record is not None and record.outcome == "running"  # not finished before the kill
            signalled.append((victim, sig, len(job.done_ids()) == shards, handled))
            live.remove(victim)
            live.append(start())
        for p in live:
            code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            assert code == 0, f"seed {seed}: exit {code}\n{_tail(logs[p.pid])}"
    finally:
        for p in live:
            kill_group(p)
    for p, sig, finished, handled in signalled:
        code = p.wait(timeout=120)
        if finished and code == 0:
            continue
        expected = {-signal.SIGKILL} if sig == signal.SIGKILL else {128 + signal.SIGTERM}
        if sig == signal.SIGTERM and not handled:  # before the interpreter ran any code of this package
            expected.add(-signal.SIGTERM)
        assert code in expected, f"seed {seed}: {signal.Signals(sig).name} -> exit {code}\n{_tail(logs[p.pid])}"
    check_done_exactly_once(job)
    merge_and_check(job, tmp_path / "merged.jsonl")
    outcomes = attempt_outcomes(job)
    cut = sum(o.count("interrupted") + o.count("running") + o.count("missing") for o in outcomes.values())
    print(f"chaos on s3 seed={seed} signals={len(signalled)} attempts cut short={cut}")
    assert len(signalled) >= 4, f"seed {seed}: the job finished before the driver got going"
    assert cut >= 1, f"seed {seed}: no kill landed inside a shard"
    assert job_status(job).complete


def _running_worker(job: JobDir, live: list) -> tuple[object, str, int] | None:
    """A live worker whose latest attempt record of some shard says it is running that shard now: the worker,
    the shard, the attempt."""
    pids = {p.pid: p for p in live if p.poll() is None}
    for shard, outcomes in attempt_outcomes(job).items():
        record = load_attempt(job, shard, len(outcomes)) if outcomes and outcomes[-1] == "running" else None
        if record is not None and record.pid in pids:
            return pids[record.pid], shard, len(outcomes)
    return None


# racing takeovers -----------------------------------------------------------------------------------------
def test_stale_lease_on_s3_found_by_many_workers_at_once_has_one_winner_every_round(tmp_path, s3_url):
    """Each round 8 processes run the real claim decision at once on a stale lease: ``If-None-Match: *`` on
    the next attempt's key lets exactly one through. An S3 timestamp cannot be set back, and 8 racers on a
    loaded machine may take longer than a short lock timeout to decide (then a lease that aged out while
    they decided is rightly taken over again), so the timeout is long and the dead winner's lease is
    released instead: it reads as infinitely stale, the same decision."""
    rounds, racers = 4, 8
    job = _s3_job(tmp_path, s3_url, rows=5, shards=1, max_retries=100, lock_timeout_secs=300.0)
    ctx = mp.get_context("fork")  # each racer builds its own store (client) after the fork
    start, finish, results = ctx.Barrier(racers + 1), ctx.Barrier(racers + 1), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(job.root), start, finish, results, rounds)) for _ in range(racers)]
    for p in procs:
        p.start()
    driver = claim_store(job, "driver")
    try:
        for r in range(rounds):
            start.wait(timeout=120)
            got = [results.get(timeout=120) for _ in range(racers)]
            finish.wait(timeout=120)
            assert [attempt for _, attempt in got if attempt is not None] == [r + 1], f"round {r}: {got}"
            driver.release_attempt(SID, r + 1)  # the winner dies at once
            assert not driver.is_live(SID, r + 1, driver.now())
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert _claims(job) == [f"{SID}@{a:04d}" for a in range(1, rounds + 1)]


# a stalled worker -----------------------------------------------------------------------------------------
def test_stalled_worker_on_s3_resumes_cannot_publish_and_merge_uses_the_winner(tmp_path, s3_url):
    job = _s3_job(tmp_path, s3_url, rows=10, shards=1)
    release, log = tmp_path / "release", tmp_path / "stalled.log"
    stalled = spawn_worker(job, "tag", log=log, DJE_TEST_HOLD=str(release))
    try:
        wait_for(lambda: "running" in attempt_outcomes(job).get(SID, []), "attempt 1", proc=stalled, log=log)
        os.kill(stalled.pid, signal.SIGSTOP)
        last_beat = last_heartbeat(job, SID, 1)
        rescued = tmp_path / "rescuer.log"
        rescuer = spawn_worker(job, "tag", log=rescued)
        assert rescuer.wait(timeout=90) == 0, _tail(rescued)
        assert_taken_over_after_timeout(job, SID, 1, last_beat)
        release.touch()
        os.kill(stalled.pid, signal.SIGCONT)
        assert stalled.wait(timeout=120) == 0, _tail(log)  # cannot publish; sees the job done; exits cleanly
    finally:
        os.kill(stalled.pid, signal.SIGCONT) if stalled.poll() is None else None
        kill_group(stalled)
    assert attempt_outcomes(job)[SID] == ["superseded", "done"], _tail(log) + _tail(tmp_path / "rescuer.log")
    assert check_done_exactly_once(job) == {SID: 2}
    superseded = _output(job, SID, 1)  # uploaded under its own attempt, never named by a done record
    assert superseded is None or {orjson.loads(row)["_attempt"] for row in superseded.splitlines()} == {"0001"}
    expected = b"".join(
        orjson.dumps({**orjson.loads(row), "_attempt": "0002"}) + b"\n" for row in input_bytes(job).splitlines()
    )
    merge_and_check(job, tmp_path / "merged.jsonl", expected)


# killed at precise points -----------------------------------------------------------------------------------
@pytest.mark.parametrize("point", ["mid-output", "after-output", "verified", "uploaded", "published"])
def test_worker_on_s3_killed_between_output_and_done_record(tmp_path, s3_url, point):
    """Killed while writing its output (in node-local scratch), after writing it, after checking it, after
    uploading it, and after publishing the done record."""
    job = _s3_job(tmp_path, s3_url, rows=40, shards=4, max_retries=2)
    env = {"DJE_TEST_DIE_SHARDS": TARGET, "DJ_ELASTIC_HOSTNAME": "victim"}  # the rescuer cannot prove it gone
    log = tmp_path / "victim.log"
    if point in ("mid-output", "after-output"):
        half = "1" if point == "mid-output" else ""
        victim = spawn_worker(job, "die_after_output", log=log, DJE_TEST_DIE_HALF=half, **env)
    else:
        cmd = [sys.executable, "-m", "tests.chaos.killpoint", point, "--job-dir", str(job.root)]
        victim = spawn(cmd, log=log, **env)
    assert victim.wait(timeout=90) == -signal.SIGKILL, _tail(log)
    last_beat = last_heartbeat(job, TARGET, 1)
    uploaded = _output(job, TARGET, 1)
    assert (uploaded is not None) == (point in ("uploaded", "published")), point  # scratch until uploaded
    rescued = tmp_path / "rescuer.log"
    rescuer = spawn_worker(job, "copy", log=rescued)
    assert rescuer.wait(timeout=90) == 0, _tail(rescued)
    done = check_done_exactly_once(job)
    if point == "published":  # the done record made it: nobody redoes the shard, though attempt.json says running
        assert attempt_outcomes(job)[TARGET] == ["running"] and done[TARGET] == 1
    else:
        assert attempt_outcomes(job)[TARGET] == ["running", "done"] and done[TARGET] == 2, _tail(rescued)
        assert_taken_over_after_timeout(job, TARGET, 1, last_beat)
    merge_and_check(job, tmp_path / "merged.jsonl")


# a skewed clock ---------------------------------------------------------------------------------------------
SHIFT = {"+1h": 3600.0, "-1h": -3600.0}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("skewed", ["owner", "others"])
@pytest.mark.parametrize("offset", ["+1h", "-1h"])
def test_skewed_clock_on_s3_neither_steals_live_leases_nor_keeps_dead_ones(tmp_path, s3_url, offset, skewed):
    """Ages are the store's (a response's ``Date`` minus ``Last-Modified``): a node an hour off judges alike."""
    require(shutil.which("faketime") is not None, "libfaketime (apt-get install faketime)")
    job = _s3_job(tmp_path, s3_url, rows=10, shards=1)
    logs = tmp_path / "logs"
    claims = functools.partial(_claims, job)  # a lease named: the owner's attempt has begun
    skewed_owner_then_rescuer(
        job, logs, offset, skewed, owner_sleep="120", running=claims, claims=claims, renewed=2, wait=90
    )
    # the rescuer's own attempt may lapse on a loaded machine (seen twice at load 30+, both +1h-others): it
    # does not publish, releases its lease and claims the shard again; nothing is done twice either way
    outcomes = attempt_outcomes(job)[SID]
    lapsed = outcomes[1:-1]
    assert outcomes[0] == "running" and outcomes[-1] == "done" and set(lapsed) <= {"superseded"}, (
        logs / "rescuer.log"
    ).read_text()
    assert lapsed.count("superseded") == (logs / "rescuer.log").read_text().count("lease not renewed for")
    check_done_exactly_once(job)
    merge_and_check(job, tmp_path / "merged.jsonl")
    record = load_attempt(job, SID, 1 if skewed == "owner" else len(outcomes))  # started_at: the worker's clock
    assert record is not None and abs(record.started_at - record.claimed_at - SHIFT[offset]) < 60, record


# a store that stops answering -------------------------------------------------------------------------------
STALLS = [
    pytest.param(8.0, id="past-the-lock-timeout"),
    pytest.param(25.0, id="past-the-read-timeout", marks=pytest.mark.slow),  # botocore's read_timeout is 20 s
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("stall", STALLS)
def test_a_store_that_stops_answering_for_a_while_loses_nothing_and_does_nothing_twice(tmp_path, s3_url, stall):
    """The server is SIGSTOPped mid-job: every request waits (or times out and is sent again), heartbeats
    lapse, leases may be taken over once it answers again; still each shard is done exactly once."""
    job = _s3_job(tmp_path, s3_url, rows=120, shards=12, max_retries=100)
    logs = [tmp_path / f"worker-{i}.log" for i in range(3)]
    workers = [spawn_worker(job, "slow_copy", log=log, DJE_TEST_SLEEP="1") for log in logs]
    server = _server_pid()
    try:
        wait_for(lambda: len(job.done_ids()) >= 2, "two shards done", timeout=90, proc=workers[0], log=logs[0])
        before = len(job.done_ids())
        os.kill(server, signal.SIGSTOP)
        try:
            time.sleep(stall)
        finally:
            os.kill(server, signal.SIGCONT)
        codes = [w.wait(timeout=180) for w in workers]
        assert codes == [0, 0, 0], "\n".join(_tail(log) for log in logs)
    finally:
        for w in workers:
            kill_group(w)
    assert before < 12, "the job ended before the store stopped"
    check_done_exactly_once(job)
    merge_and_check(job, tmp_path / "merged.jsonl")
    outcomes = attempt_outcomes(job)
    superseded = sum(o.count("superseded") for o in outcomes.values())
    print(f"stall {stall}s: {before} shards done before it, {superseded} attempts superseded (lapsed or taken over)")
    assert job_status(job).complete
