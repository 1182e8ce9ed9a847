"""Clock skew: a worker whose clock runs an hour fast or slow, under libfaketime, on real processes.

What libfaketime 0.9.10 does (checked by the first test): the wall clock is
shifted, stat() is not (it reports the file system's timestamps), and
utime(path, NULL) stamps the *faked* time instead of letting the file system
stamp its own. That is what a node with a wrong clock does on file systems
whose clients implement "set mtime to now" themselves (sshfs, SMB and other
FUSE/gateway mounts), so leases must be renewed and the server clock probed
by writing, never by utime(NULL).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ..jobs import (
    assert_taken_over_after_timeout,
    attempt_outcomes,
    check_done_exactly_once,
    env_with,
    kill_group,
    last_heartbeat,
    make_job,
    merge_and_check,
    spawn,
    wait_for,
    worker_cmd,
)
from ..require import require


@pytest.fixture(autouse=True)
def _faketime():
    require(shutil.which("faketime") is not None, "libfaketime (apt-get install faketime)")


FAKE_ENV = {"FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def _skewed(offset: str, argv: list[str]) -> list[str]:
    return ["faketime", "-f", offset, sys.executable, "-m", "tests.chaos.skewed", *argv]


def test_what_libfaketime_fakes(tmp_path):
    probe = tmp_path / "probe"
    probe.write_bytes(b"x")
    code = (
        "import os, time, sys; p = sys.argv[1]; before = os.stat(p).st_mtime; os.utime(p, None); "
        "print(round(time.time() - before), round(os.stat(p).st_mtime - before))"
    )
    out = subprocess.run(
        ["faketime", "-f", "+1h", sys.executable, "-c", code, str(probe)],
        env=env_with(**FAKE_ENV),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    # wall clock +1h; utime(NULL) stamps +1h; stat is real (within the seconds a loaded machine takes to start)
    assert all(3600 <= int(x) < 3660 for x in out), out
    assert abs(os.stat(probe).st_mtime - time.time() - 3600) < 60


@pytest.mark.timeout(120)
@pytest.mark.parametrize("skewed", ["owner", "others"])
@pytest.mark.parametrize("offset", ["+1h", "-1h"])
def test_skewed_clock_neither_steals_live_leases_nor_keeps_dead_ones(tmp_path, offset, skewed):
    job = make_job(tmp_path, rows=10, shards=1, lock_timeout_secs=2.0, heartbeat_secs=0.2)
    sid = "part-00000-of-00001"
    skewed_owner_then_rescuer(
        job,
        tmp_path / "logs",
        offset,
        skewed,
        owner_sleep="60",
        running=(job.attempts_dir / sid / "0001" / "started").exists,
        claims=lambda: os.listdir(job.claims_dir),
        renewed=0.4,
        wait=60,
    )
    assert attempt_outcomes(job)[sid] == ["running", "done"]
    check_done_exactly_once(job)
    merge_and_check(job, tmp_path / "merged.jsonl")


def skewed_owner_then_rescuer(
    job, logs, offset: str, skewed: str, *, owner_sleep: str, running, claims, renewed: float, wait: float
) -> float:
    """The scenario of both clock-skew tests (here and tests/chaos/test_chaos_s3.py), with ``skewed`` ("owner"
    or "others") an ``offset`` off: the owner's lease, renewed by ``renewed`` seconds, is left alone by an
    observer on the other clock; the owner dies; a rescuer on the other clock takes the lease over after
    ``lock_timeout``, not an hour off. ``running``: the owner's attempt has begun; ``claims``: the lease
    names. Returns the owner's last heartbeat."""
    sid = job.manifest().shards[0].id
    logs.mkdir()

    def worker(skew: bool, name: str, *extra: str, **env: str):
        cmd = worker_cmd(job, "slow_copy", *extra)
        if skew:
            cmd = _skewed(offset, cmd[3:])  # drop "python -m data_juicer_elastic.cli"
        return spawn(cmd, log=logs / f"{name}.log", **FAKE_ENV, **env)

    # another host than the rescuer's, which could otherwise prove the killed owner gone and take over at once
    owner = worker(skewed == "owner", "owner", DJE_TEST_SLEEP=owner_sleep, DJ_ELASTIC_HOSTNAME="owner")
    try:
        wait_for(running, "the owner's attempt", timeout=60, proc=owner, log=logs / "owner.log")
        first = last_heartbeat(job, sid, 1)
        # a few heartbeats, stamped by whatever clock renews them
        wait_for(lambda: last_heartbeat(job, sid, 1) >= first + renewed, "renewals", proc=owner, log=logs / "owner.log")
        # a worker on the other clock finds the lease live and leaves it alone
        observer = worker(skewed == "others", "observer", "--stop-when-idle")
        assert observer.wait(timeout=wait) == 1, (logs / "observer.log").read_text()
        assert claims() == [f"{sid}@0001"], "a live lease was stolen"
        # the owner dies: its lease goes stale after lock_timeout, not an hour later, whoever judges it
        kill_group(owner, signal.SIGKILL)
        owner.wait(timeout=120)
        last_beat = last_heartbeat(job, sid, 1)
        rescuer = worker(skewed == "others", "rescuer", DJE_TEST_SLEEP="0")
        assert rescuer.wait(timeout=wait) == 0, (logs / "rescuer.log").read_text()
        assert_taken_over_after_timeout(job, sid, 1, last_beat)
    finally:
        kill_group(owner)
    return last_beat
