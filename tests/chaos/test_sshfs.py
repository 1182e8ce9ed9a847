"""The protocol over a network file system with client-side caches: two sshfs mounts of one directory.

Each mount stands for one node (its own sshfs stat/dir cache and kernel FUSE
attribute cache, 1 s each), so a node sees the other's writes late, as on a
NAS. sftp stamps mtimes in whole seconds: leases here use lock_timeout 4 s,
comfortably above heartbeat + cache + granularity.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest

from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare
from data_juicer_elastic.storage.files import create_exclusive, publish_once, server_now
from data_juicer_elastic.storage.posix import PosixStore

from ..jobs import (
    RECIPE,
    attempt_outcomes,
    check_done_exactly_once,
    kill_group,
    last_heartbeat,
    merge_and_check,
    spawn_worker,
    started_shard,
    takeover_delay,
    wait_for,
    write_input,
)

pytestmark = [pytest.mark.sshfs, pytest.mark.slow]

FAST = {"lock_timeout_secs": 4.0, "heartbeat_secs": 0.5, "poll_interval_secs": 0.2}
CACHE_SECS = 1.0  # sshfs.CACHE_OPTIONS: attr/entry/stat caches of one second


def _job(pair, tmp_path: Path, *, rows: int, shards: int, **policy) -> tuple[JobDir, JobDir]:
    """A job prepared through node a; its JobDir as node a and as node b see it."""
    _, a, b = pair.fresh()
    corpus = write_input(tmp_path / "input", rows, shards=shards)
    req = PrepareRequest(
        dataset_path=str(corpus),
        job_dir=str(a / "job"),
        recipe_text=RECIPE,
        policy=Policy(num_shards=shards, **{**FAST, **policy}),
    )
    prepare(req, log=lambda *_: None)
    return JobDir(a / "job"), JobDir(b / "job")


# the primitives ---------------------------------------------------------------------------------------
def _race(folder: str, kind: str, rounds: int, start, results) -> None:
    for r in range(rounds):
        start.wait()
        path = Path(folder) / f"{kind}-{r}"
        try:
            data = f"{os.getpid()}\n".encode()
            won = create_exclusive(path, b"x") if kind == "excl" else publish_once(path, data) is not None
        except OSError as exc:
            won = f"error {exc!r}"
        results.put((r, won))


@pytest.mark.parametrize("kind", ["excl", "link"])
def test_exclusive_create_and_publish_once_have_one_winner_across_mounts(sshfs_pair, kind):
    rounds, per_mount = 15, 2
    _, a, b = sshfs_pair.fresh()
    ctx = mp.get_context("fork")
    start, results = ctx.Barrier(2 * per_mount), ctx.Queue()
    procs = [
        ctx.Process(target=_race, args=(str(folder), kind, rounds, start, results))
        for folder in (a, b)
        for _ in range(per_mount)
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in range(rounds * len(procs))]
    for p in procs:
        p.join(30)
    for r in range(rounds):
        wins = [won for rnd, won in got if rnd == r]
        assert wins.count(True) == 1 and wins.count(False) == len(procs) - 1, (r, wins)
    if kind == "link":  # the published bytes are whole and the temps are gone, seen from both nodes
        for r in range(rounds):
            assert (a / f"link-{r}").read_bytes() == (b / f"link-{r}").read_bytes()
            assert int((b / f"link-{r}").read_bytes()) in {p.pid for p in procs}
        assert not [n for n in os.listdir(b) if ".tmp-" in n]


def test_rename_replaces_whole_and_the_server_clock_agrees_across_mounts(sshfs_pair):
    _, a, b = sshfs_pair.fresh()
    for i in range(5):
        tmp = a / f".t{i}"
        tmp.write_bytes(f"version {i}\n".encode() * 1000)
        os.replace(tmp, a / "target")
        expected = f"version {i}\n".encode() * 1000
        wait_for(lambda expected=expected: (b / "target").read_bytes() == expected, timeout=60)
    clock_a, clock_b = server_now(a / "clock-a"), server_now(b / "clock-b")
    assert abs(clock_a - clock_b) <= 2.0
    assert abs(clock_a - time.time()) <= 5.0  # the same machine here: one clock


def test_a_record_s_version_from_its_temp_file_is_the_one_the_mounts_then_see(sshfs_pair):
    """A create or replace takes its version from the temp file's fstat before the link or rename; over sshfs
    (its own inode numbers, whole-second mtimes) that must be the size and mtime a later stat reports, or a
    process with nothing remembered would refuse the writer's version (and the writer its own, renumbered)."""
    _, a, b = sshfs_pair.fresh()
    key, running, ended = "attempts/p/0001/attempt.json", b'{"outcome": "running"}\n', b'{"outcome": "done"}\n'
    writer = PosixStore(a)
    created = writer.create(key, running, durable=False)
    head = writer.head(key)
    assert created is not None and head is not None
    assert (created.modified, created.size) == (head.modified, head.size)
    ver = writer.replace(key, ended, if_ver=created.ver, durable=False)
    assert ver is not None
    wait_for(lambda: (b / key).read_bytes() == ended, timeout=60)
    theirs = PosixStore(a).replace(key, running, if_ver=ver, durable=False)  # by size and mtime only
    assert theirs is not None
    assert writer.replace(key, ended, if_ver=ver) is None  # the bytes it wrote are gone: refused
    wait_for(lambda: (b / key).read_bytes() == running, timeout=60)
    seen = PosixStore(b).head(key)  # node b: its own inode number, the same size and mtime
    assert seen is not None and PosixStore(b).replace(key, ended, if_ver=seen.ver) is not None


def test_heartbeat_and_release_across_mounts(sshfs_pair, tmp_path):
    job_a, job_b = _job(sshfs_pair, tmp_path, rows=10, shards=1)
    sid = "part-00000-of-00001"
    owner = ClaimStore(job_a, lock_timeout=4.0, host="node-a")
    other = ClaimStore(job_b, lock_timeout=4.0, host="node-b")
    lease = owner.try_claim(sid, 0)
    for _ in range(6):  # renewed through node a, judged live through node b for longer than the timeout
        owner.renew(lease)
        time.sleep(1.0)
        assert other.is_live(sid, 1, other.now())
    wait_for(lambda: not other.is_live(sid, 1, other.now()), timeout=60)  # stops renewing: stale soon
    owner.renew(lease)
    owner.release(lease)  # released through node a: claimable through node b at once
    wait_for(lambda: other.heartbeat_age(sid, 1, other.now()) == float("inf"), timeout=60)
    assert other.try_claim(sid, 1) is not None and not owner.is_current(lease)


# workers ------------------------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_workers_on_two_mounts_race_each_shard_done_once(sshfs_pair, tmp_path):
    job_a, job_b = _job(sshfs_pair, tmp_path, rows=240, shards=24)
    procs = [spawn_worker(job, "weighted", DJE_TEST_UNIT="0.05") for job in (job_a, job_b, job_a, job_b)]
    try:
        assert [p.wait(timeout=150) for p in procs] == [0, 0, 0, 0]
    finally:
        for p in procs:
            kill_group(p)
    # attempt.json is replaced by rename through either mount; node b's attribute cache may still hold the
    # size of the version it saw last (a truncated read) until it expires: read after that, as NFS promises
    time.sleep(2 * CACHE_SECS)
    check_done_exactly_once(job_b)
    merge_and_check(job_b, tmp_path / "merged.jsonl")


@pytest.mark.timeout(120)
def test_kill9_on_one_mount_is_taken_over_from_the_other(sshfs_pair, tmp_path):
    job_a, job_b = _job(sshfs_pair, tmp_path, rows=40, shards=4)
    target = "part-00002-of-00004"
    # the two mounts stand for two nodes: two host names (a node of the victim's own host takes a dead
    # process's lease over at once, tests/test_restart.py)
    victim = spawn_worker(
        job_a, "slow_copy", DJE_TEST_SLEEP="60", DJE_TEST_SLOW_SHARDS=target, DJ_ELASTIC_HOSTNAME="node-a"
    )
    try:
        wait_for((job_a.attempts_dir / target / "0001" / "started").exists, timeout=60)
    finally:
        kill_group(victim, signal.SIGKILL)
    victim.wait(timeout=120)
    time.sleep(CACHE_SECS)  # node a's attribute cache may still hold an older mtime
    last_beat = last_heartbeat(job_a, target, 1)
    rescuer = spawn_worker(job_b, "copy", DJ_ELASTIC_HOSTNAME="node-b")
    assert rescuer.wait(timeout=60) == 0
    # node b judges the lease by what its cache shows, up to CACHE_SECS old, on 1 s mtimes (sftp)
    delay = takeover_delay(job_b, target, 1, last_beat)
    assert delay >= FAST["lock_timeout_secs"] - CACHE_SECS - 1, f"a dead lease was taken over after {delay}s"
    assert attempt_outcomes(job_b)[target] == ["running", "done"]
    check_done_exactly_once(job_b)
    merge_and_check(job_a, tmp_path / "merged.jsonl")


@pytest.mark.timeout(120)
def test_sigterm_on_one_mount_releases_the_shard_to_the_other_at_once(sshfs_pair, tmp_path):
    job_a, job_b = _job(sshfs_pair, tmp_path, rows=10, shards=1, lock_timeout_secs=120.0)
    sid = "part-00000-of-00001"
    worker = spawn_worker(job_a, "slow_copy", DJE_TEST_SLEEP="60")
    try:
        wait_for((job_a.attempts_dir / sid / "0001" / "started").exists, timeout=60)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        kill_group(worker)
    t0 = time.monotonic()
    rescuer = spawn_worker(job_b, "copy")
    assert rescuer.wait(timeout=60) == 0
    assert time.monotonic() - t0 < 60, "the released lease was treated as live"
    assert attempt_outcomes(job_b)[sid] == ["interrupted", "done"]
    merge_and_check(job_b, tmp_path / "merged.jsonl")


@pytest.mark.timeout(120)
def test_stalled_worker_on_one_mount_cannot_publish_after_takeover_from_the_other(sshfs_pair, tmp_path):
    job_a, job_b = _job(sshfs_pair, tmp_path, rows=10, shards=1)
    sid = "part-00000-of-00001"
    release = tmp_path / "release"
    stalled = spawn_worker(job_a, "tag", DJE_TEST_HOLD=str(release))
    try:
        wait_for((job_a.attempts_dir / sid / "0001" / "started").exists, timeout=60)
        os.kill(stalled.pid, signal.SIGSTOP)
        rescuer = spawn_worker(job_b, "tag")
        assert rescuer.wait(timeout=60) == 0
        release.touch()
        os.kill(stalled.pid, signal.SIGCONT)
        assert stalled.wait(timeout=60) == 0
    finally:
        if stalled.poll() is None:
            os.kill(stalled.pid, signal.SIGCONT)
        kill_group(stalled)
    assert attempt_outcomes(job_a)[sid] == ["superseded", "done"]
    assert check_done_exactly_once(job_a) == {sid: 2}


@pytest.mark.timeout(180)
def test_backup_on_the_other_mount_wins_and_the_slow_original_cannot_publish(sshfs_pair, tmp_path):
    job_a, job_b = _job(sshfs_pair, tmp_path, rows=40, shards=4)
    eager = ("--speculation-min-secs", "0.5", "--speculation-quantile", "0.5", "--speculation-multiplier", "3")
    env = {"DJE_TEST_SLOW_HOSTS": "node-a", "DJE_TEST_UNTIL_DONE": "1"}
    slow = spawn_worker(job_a, "straggler", *eager, DJ_ELASTIC_HOSTNAME="node-a", **env)
    fast = None
    try:
        sid = started_shard(job_a)
        fast = spawn_worker(job_b, "straggler", *eager, DJ_ELASTIC_HOSTNAME="node-b", **env)
        assert [p.wait(timeout=120) for p in (fast, slow)] == [0, 0]
    finally:
        for p in (slow, fast):
            if p is not None:
                kill_group(p)
    assert attempt_outcomes(job_b)[sid] == ["lost-race", "done"]  # read as each record settles on that mount
    assert check_done_exactly_once(job_a)[sid] == 2
    merge_and_check(job_b, tmp_path / "merged.jsonl")
