"""Faults with real processes on a real directory: kills, stalls, races, kills at precise points.

Every test ends with the same checks: each shard has exactly one done record,
no other attempt of it says done, and the merged output equals a fault-free
run's and was copied from the done records' attempts.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import sys
import time
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.merge import merge
from data_juicer_elastic.status import job_status

from ..cluster import Cluster, finish
from ..jobs import (
    assert_taken_over_after_timeout,
    attempt_outcomes,
    check_done_exactly_once,
    input_bytes,
    kill_group,
    last_heartbeat,
    make_job,
    merge_and_check,
    shards_data,
    spawn,
    spawn_worker,
    wait_for,
)
from ..prep_helpers import fake_done
from .killpoint import PREPARE_POINTS


def _logs(tmp: Path, procs_logs: list[Path]) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in procs_logs if p.exists())


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler installed for ``sig`` (its SigCgt mask in /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask >> (sig - 1) & 1)


# chaos ----------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_chaos_random_kills_and_restarts_lose_nothing(tmp_path):
    """8 workers over 64 shards; a driver SIGKILLs or SIGTERMs random workers and starts new ones."""
    job = make_job(
        tmp_path,
        rows=640,
        shards=64,
        lock_timeout_secs=2.0,
        heartbeat_secs=0.25,
        poll_interval_secs=0.1,
        max_retries=1000,
    )
    seed = int(os.environ.get("DJE_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    env = {"DJE_TEST_SLEEP": "0.5"}
    logs: list[Path] = []

    victim_log: dict[int, Path] = {}

    def start() -> object:
        logs.append(tmp_path / f"worker-{len(logs)}.log")
        proc = spawn_worker(job, "slow_copy", log=logs[-1], **env)
        victim_log[proc.pid] = logs[-1]
        return proc

    live = [start() for _ in range(8)]
    ended: list[tuple[object, int, bool, Path]] = []
    kills = {signal.SIGKILL: 0, signal.SIGTERM: 0}
    deadline = time.monotonic() + 180
    try:
        while sum(kills.values()) < 24 and len(os.listdir(job.done_dir)) < 64:
            assert time.monotonic() < deadline, f"seed {seed}: chaos phase did not end"
            time.sleep(rng.uniform(0.15, 0.5))
            running = [p for p in live if p.poll() is None]
            if not running:
                break
            victim = rng.choice(running)
            sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
            handled = catches(victim.pid, sig)  # read just before the signal: a handler is never taken back
            kill_group(victim, sig)
            finished = len(os.listdir(job.done_dir)) == 64  # then the victim may have exited 0 just before
            kills[sig] += 1
            live.remove(victim)
            ended.append((victim, sig, finished, handled, victim_log[victim.pid]))
            live.append(start())
        for p in live:
            remaining = max(1.0, deadline - time.monotonic())
            assert p.wait(timeout=remaining) == 0, f"seed {seed}\n" + _logs(tmp_path, logs)
    finally:
        for p in live:
            kill_group(p)
    before_python = 0
    for p, sig, finished, handled, log in ended:
        code = p.wait(timeout=120)
        if finished and code == 0:
            continue
        if sig == signal.SIGKILL:
            assert code == -signal.SIGKILL, f"seed {seed}: SIGKILLed worker exited {code}"
        elif handled:  # from its first line of its own code on (imports included): 128 + N exactly
            assert code == 128 + signal.SIGTERM, f"seed {seed}: SIGTERMed worker exited {code}\n" + log.read_text()
        else:  # signalled while the interpreter itself started, before any code of this package could run
            before_python += 1
            assert code in (-signal.SIGTERM, 128 + signal.SIGTERM), f"seed {seed}: SIGTERMed worker exited {code}"
    check_done_exactly_once(job)
    merge_and_check(job, tmp_path / "merged.jsonl")
    outcomes = attempt_outcomes(job)
    interrupted = sum(o.count("interrupted") for o in outcomes.values())
    lost = sum(o.count("running") + o.count("missing") for o in outcomes.values())
    print(
        f"chaos seed={seed} kills={ {s.name: n for s, n in kills.items()} } "
        f"interrupted attempts={interrupted} lost attempts={lost} SIGTERMs before the interpreter ran={before_python}"
    )
    assert sum(kills.values()) >= 8, "the job finished before the driver got going"
    assert interrupted + lost >= 1, "no kill landed inside a shard"
    assert job_status(job).complete


# racing takeovers -------------------------------------------------------------------------------------
def _racer(job_root: str, start, finish, results, rounds: int) -> None:
    from data_juicer_elastic.worker.loop import Worker

    from ..runners import copy

    worker = Worker(job_root, copy, host=f"racer-{os.getpid()}", log=lambda *_: None)
    for r in range(rounds):
        start.wait()
        lease, _, _ = worker.claim_next()  # the real decision: listing, staleness, budget, O_EXCL claim
        results.put((r, None if lease is None else lease.attempt))
        finish.wait()


def test_stale_lease_found_by_many_workers_at_once_has_one_winner_every_round(tmp_path):
    rounds, racers = 6, 8
    job = make_job(tmp_path, rows=5, shards=1, max_retries=100)
    sid = "part-00000-of-00001"
    ctx = mp.get_context("fork")
    start, finish, results = ctx.Barrier(racers + 1), ctx.Barrier(racers + 1), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(job.root), start, finish, results, rounds)) for _ in range(racers)]
    for p in procs:
        p.start()
    store = ClaimStore(job, lock_timeout=3.0, host="driver")
    try:
        for r in range(rounds):
            start.wait(timeout=120)
            got = [results.get(timeout=120) for _ in range(racers)]
            finish.wait(timeout=120)
            winners = [attempt for rnd, attempt in got if attempt is not None]
            assert winners == [r + 1], f"round {r}: {got}"
            # the winner dies at once: its lease ages past the timeout before the next round
            now = store.now()
            os.utime(store.lease_path(sid, r + 1), (now - 60, now - 60))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert sorted(os.listdir(job.claims_dir)) == [f"{sid}@{a:04d}" for a in range(1, rounds + 1)]


# a stalled worker --------------------------------------------------------------------------------------
def test_stalled_worker_resumes_cannot_publish_and_merge_uses_the_winner(tmp_path):
    job = make_job(tmp_path, rows=10, shards=1, lock_timeout_secs=1.5, heartbeat_secs=0.2)
    sid = "part-00000-of-00001"
    release = tmp_path / "release"
    stalled = spawn_worker(job, "tag", DJE_TEST_HOLD=str(release))
    try:
        wait_for((job.attempts_dir / sid / "0001" / "started").exists)
        os.kill(stalled.pid, signal.SIGSTOP)
        last_beat = last_heartbeat(job, sid, 1)
        rescuer = spawn_worker(job, "tag")
        assert rescuer.wait(timeout=60) == 0
        assert_taken_over_after_timeout(job, sid, 1, last_beat)
        release.touch()
        os.kill(stalled.pid, signal.SIGCONT)
        assert stalled.wait(timeout=120) == 0  # cannot publish; sees the job done; exits cleanly
    finally:
        os.kill(stalled.pid, signal.SIGCONT) if stalled.poll() is None else None
        kill_group(stalled)
    assert attempt_outcomes(job)[sid] == ["superseded", "done"]
    assert check_done_exactly_once(job) == {sid: 2}
    superseded = job.attempt_output(sid, 1).read_bytes()
    assert {orjson.loads(line)["_attempt"] for line in superseded.splitlines()} == {"0001"}
    expected = b"".join(
        orjson.dumps({**orjson.loads(line), "_attempt": "0002"}) + b"\n" for line in input_bytes(job).splitlines()
    )
    merge_and_check(job, tmp_path / "merged.jsonl", expected)


# killed at precise points --------------------------------------------------------------------------------
TARGET = "part-00002-of-00004"


@pytest.mark.parametrize("point", ["mid-output", "after-output", "verified", "published"])
def test_worker_killed_between_output_and_done_record(tmp_path, point):
    """Killed while writing its output, after writing it, after checking it, and after publishing done."""
    job = make_job(tmp_path, rows=40, shards=4, lock_timeout_secs=2.0, heartbeat_secs=0.2, max_retries=2)
    env = {"DJE_TEST_DIE_SHARDS": TARGET, "DJ_ELASTIC_HOSTNAME": "victim"}  # the rescuer's host cannot prove it gone
    if point in ("mid-output", "after-output"):
        victim = spawn_worker(job, "die_after_output", DJE_TEST_DIE_HALF="1" if point == "mid-output" else "", **env)
    else:
        victim = spawn([sys.executable, "-m", "tests.chaos.killpoint", point, "--job-dir", str(job.root)], **env)
    assert victim.wait(timeout=60) == -signal.SIGKILL
    last_beat = last_heartbeat(job, TARGET, 1)
    assert job.attempt_output(TARGET, 1).exists()
    rescuer = spawn_worker(job, "copy")
    assert rescuer.wait(timeout=60) == 0
    done = check_done_exactly_once(job)
    if point == "published":
        # the done record made it: nobody redoes the shard, although attempt.json never said done
        assert attempt_outcomes(job)[TARGET] == ["running"] and done[TARGET] == 1
    else:
        assert attempt_outcomes(job)[TARGET] == ["running", "done"] and done[TARGET] == 2
        assert_taken_over_after_timeout(job, TARGET, 1, last_beat)
    merge_and_check(job, tmp_path / "merged.jsonl")


# a killed merge ----------------------------------------------------------------------------------------
def _big_job(tmp_path: Path, shards: int = 8, mb_per_shard: int = 8) -> tuple[JobDir, bytes]:
    job = make_job(tmp_path, rows=shards * 4, shards=shards)
    parts = []
    for i, spec in enumerate(job.manifest().shards):
        row = orjson.dumps({"shard": i, "text": "y" * 1000}) + b"\n"
        parts.append(row * (mb_per_shard * 1024 * 1024 // len(row)))
        fake_done(job, spec.id, content=parts[-1])
    return job, b"".join(parts)


def _temps(folder: Path) -> list[str]:
    return [n for n in os.listdir(folder) if ".tmp-" in n]


@pytest.mark.timeout(120)
def test_merge_killed_mid_copy_or_before_rename_never_shows_a_partial_output(tmp_path):
    job, expected = _big_job(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "merged.jsonl"
    old = b'{"old": "output"}\n'
    cmd = [sys.executable, "-m", "tests.chaos.killpoint", "copy", "--job-dir", str(job.root), "--output", str(out)]
    for round_ in range(2):  # killed half way through the copy: without, then with an existing output
        if round_ == 1:
            out.write_bytes(old)  # an existing output survives a killed --overwrite merge whole
        proc = spawn(cmd)
        assert proc.wait(timeout=120) == -signal.SIGKILL
        assert (not out.exists()) if round_ == 0 else out.read_bytes() == old, "a partial merged output is visible"
        assert [n for n in _temps(out_dir) if (out_dir / n).stat().st_size > 0], "the kill was not mid-copy"
    # killed after the temp file is complete, just before the rename
    proc = spawn(
        [sys.executable, "-m", "tests.chaos.killpoint", "merge", "--job-dir", str(job.root), "--output", str(out)]
    )
    assert proc.wait(timeout=120) == -signal.SIGKILL
    assert out.read_bytes() == old
    assert _temps(out_dir), "the killed merges leave their temp files behind"
    # the next merge completes, and clears what the dead merges left on this host
    merge(job, str(out), overwrite=True, log=lambda *_: None)
    assert out.read_bytes() == expected
    assert _temps(out_dir) == []


# a prepare coordinator stopped inside prepare ----------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["KILL", "TERM"])
@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_prepare_coordinator_stopped_inside_prepare_then_a_new_run_finishes(tmp_path, point, sig):
    """Stopped with everything staged, between the shards' rename and the manifest's link, and before the
    generation starts: the run ends (the other node says why), and the next submission finishes the job."""
    c = Cluster(tmp_path, rows=60, shards=6)
    args = ("--signal-in-prepare", f"{point}:{sig.name[3:]}", "--wait-timeout", "3")
    first = c.start(["node-0", "node-1"], *args, run_id="first")
    codes = finish(first, timeout=120)
    code = -signal.SIGKILL if sig == signal.SIGKILL else 128 + signal.SIGTERM
    assert sorted(codes) == sorted([code, 2]), [n.output for n in first]
    [victim] = [n for n in first if n.proc.returncode == code]
    [other] = [n for n in first if n is not victim]
    assert "elected as prepare coordinator" in victim.output
    if sig == signal.SIGTERM:
        assert f"the prepare coordinator on host={victim.host} was interrupted" in other.last_line(), other.output
    else:
        assert "heartbeat stopped" in other.last_line() and f"pid={victim.proc.pid}" in other.last_line()
    root = c.job.root
    published = {"staged": (False, False), "shards-published": (True, False), "manifest-published": (True, True)}
    assert ((root / "shards").is_dir(), (root / "manifest.json").exists()) == published[point]
    if sig == signal.SIGTERM and point == "staged":  # it left nothing but the runs' own state
        assert sorted(os.listdir(root)) == ["runs"], os.listdir(root)
    assert not c.export.exists()

    again = c.start(["node-0", "node-1"], run_id="second")
    assert finish(again) == [0, 0], [n.output for n in again]
    assert c.export.read_bytes() == c.expected()
    clean = Cluster(tmp_path / "clean", rows=60, shards=6)  # the same input prepared without a fault
    [node] = clean.start(["node-0"])
    assert finish([node]) == [0], node.output
    # the same rows in each shard (a Parquet descriptor also names its input's own path and mtime)
    assert shards_data(JobDir(root)) == shards_data(clean.job), "the resumed prepare published other shards"
