"""``dj-elastic retry`` on a store that ignores ``If-Match`` on DELETE, and its lock (``state/retry.lock``).

Ceph RGW 16 deletes a key whatever ETag the DELETE names, so ``retry`` was refused there at start: a failed
shard could not be rerun. It now deletes the record it read under a lock that lets one retry of a generation
run at a time (``job.records.retry_lock``). Every server here is real or a real mock (moto, RGW via
``rgw_env``); a second retry is forced into the first one's window (a wrapper around ``_requeue_one`` runs it
there), and a killed retry is a process killed by SIGKILL while it holds the lock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.cli import main as cli_main
from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records import retry as retry_mod
from data_juicer_elastic.job.records import retry_lock
from data_juicer_elastic.storage.host import hostname
from data_juicer_elastic.worker.loop import run_worker

from .jobs import attempt_outcomes, make_job
from .reference import env_with
from .runners import copy, fail
from .test_jobdir_s3 import mirror
from .test_store_contract import moto_env  # noqa: F401 (the server, one per module)

LOCK = "state/retry.lock"
# a retry that SIGKILLs itself at its first archive: the lock, the .archiving name and the retry record stand
KILLED_RETRY = """
import os, signal, sys
from data_juicer_elastic.cli import main
from data_juicer_elastic.job.records import retry
retry._archive = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(params=["posix", "moto", "rgw"])
def where(request: pytest.FixtureRequest) -> str:
    return request.param


def _failed_job(tmp_path: Path, where: str, request: pytest.FixtureRequest, monkeypatch) -> tuple[JobDir, str]:
    """A job of two shards whose second failed terminally (its budget spent): the job and that shard."""
    job = make_job(tmp_path, rows=20, shards=2, max_retries=1)
    if where != "posix":
        url, _ = mirror(job, monkeypatch, request.getfixturevalue(f"{where}_env"))
        job = JobDir(url)
    sid = job.manifest().shards.ids()[1]
    monkeypatch.setenv("DJE_TEST_FAIL_SHARDS", sid)
    assert run_worker(job, fail, host="node-a", log=lambda *_: None).exit_code == 2
    monkeypatch.delenv("DJE_TEST_FAIL_SHARDS")
    assert JobDir(job.root).failed_ids() == {sid}
    return JobDir(job.root), sid


def _retry(job: JobDir) -> int:
    return cli_main(["retry", "--job-dir", str(job.root), "--all-failed"])


def _finishes(job: JobDir, sid: str) -> None:
    """The retry left no lock, no .archiving name and one archived failed record; a worker then runs the
    shard to done and the job verifies."""
    job = JobDir(job.root)
    assert job.store.head(job.key(job.state_dir / "retry.lock")) is None
    assert not [n for n in job.store.names(job.key(job.retry_dir)) if n.endswith(retry_mod.ARCHIVING)]
    history = job.store.names(job.key(job.history_dir))
    assert len([n for n in history if n.endswith(f"-{sid}.failed.json")]) == 1, history
    result = run_worker(job, copy, host="node-b", log=lambda *_: None)
    assert result.exit_code == 0 and result.completed == [sid], result
    assert attempt_outcomes(job)[sid] == ["failed", "failed", "done"]
    assert cli_main(["verify", "--job-dir", str(job.root)]) == 0


@pytest.mark.parametrize("server", ["moto", "rgw"])
def test_retry_reruns_a_failed_shard_on_each_s3_server(
    tmp_path: Path, server: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, capsys
):
    """On RGW the probe finds DELETE If-Match ignored; retry used to be refused there (exit 2) at start."""
    job, sid = _failed_job(tmp_path, server, request, monkeypatch)
    capsys.readouterr()
    assert _retry(job) == 0, capsys.readouterr().err
    assert f"requeued 1 shard(s): {sid}" in capsys.readouterr().out
    assert JobDir(job.root).failed_ids() == set()
    _finishes(job, sid)


def test_two_retries_racing_one_runs_the_other_names_the_lock(
    tmp_path: Path, where: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, capsys
):
    """The second retry starts while the first holds the lock, inside its first shard: refused, exit 2,
    naming the lock and its holder, having written nothing; the first runs to its end."""
    job, sid = _failed_job(tmp_path, where, request, monkeypatch)
    requeue_one, second = retry_mod._requeue_one, []

    def race_then_requeue(*args) -> None:
        if not second:
            capsys.readouterr()
            second.append((_retry(JobDir(job.root)), capsys.readouterr().err))
        requeue_one(*args)

    monkeypatch.setattr(retry_mod, "_requeue_one", race_then_requeue)
    assert retry_mod.requeue(JobDir(job.root), all_failed=True) == [sid]
    rc, err = second[0]
    assert rc == 2, err
    assert f"{LOCK} is held by host={hostname()} pid={os.getpid()}" in err, err
    _finishes(job, sid)


def test_the_lock_of_a_killed_retry_is_taken_over(
    tmp_path: Path, where: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, capsys
):
    """A retry killed -9 at its first archive leaves its lock (and its .archiving name); the next retry on
    the same host finds its process gone, takes the lock over saying so, and requeues the shard."""
    job, sid = _failed_job(tmp_path, where, request, monkeypatch)
    argv = ["retry", "--job-dir", str(job.root), "--all-failed"]
    killed = subprocess.run([sys.executable, "-c", KILLED_RETRY, *argv], env=env_with(), capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    got = job.store.read(job.key(job.state_dir / "retry.lock"))
    assert got is not None
    holder = orjson.loads(got[0])
    assert holder["host"] == hostname() and [n for n in job.store.names(job.key(job.retry_dir)) if ".archiving" in n]
    assert JobDir(job.root).failed_ids() == {sid}  # killed before its archive: the record stands
    capsys.readouterr()
    assert _retry(job) == 0
    err = capsys.readouterr().err
    assert "retry: took over " in err and f"{LOCK} from host={hostname()} pid={holder['pid']}" in err, err
    assert f"its process {holder['pid']} no longer runs on this host" in err, err
    _finishes(job, sid)


def test_another_hosts_lock_is_refused_until_it_is_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    """A lock of another host cannot be proven dead: refused while fresh; taken over once older than
    ``STALE_SECS`` on the store's clock (lowered here so that any age passes)."""
    job, sid = _failed_job(tmp_path, "posix", None, monkeypatch)  # type: ignore[arg-type]
    planted = {"host": "elsewhere", "pid": 4242, "token": "t", "started_at": 0, "stamp": "x/../y"}
    assert job.store.create(job.key(job.state_dir / "retry.lock"), orjson.dumps(planted)) is not None
    capsys.readouterr()
    assert _retry(job) == 2
    assert f"{LOCK} is held by host=elsewhere pid=4242" in capsys.readouterr().err
    assert JobDir(job.root).failed_ids() == {sid}  # nothing written
    monkeypatch.setattr(retry_lock, "STALE_SECS", -1.0)
    assert _retry(job) == 0
    err = capsys.readouterr().err
    assert "took over" in err and f"{LOCK} from host=elsewhere pid=4242" in err and "not renewed for" in err, err
    _finishes(job, sid)


def test_a_retry_whose_lock_was_taken_over_stops_before_deleting(
    tmp_path: Path, where: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
):
    """Another retry takes the lock over (as it would from a holder stopped past ``STALE_SECS``) while this
    one is between shards: this one's next renewal is refused, so it stops with the record still standing
    and leaves the lock to its new holder."""
    job, sid = _failed_job(tmp_path, where, request, monkeypatch)
    key = job.key(job.state_dir / "retry.lock")
    requeue_one, usurper = retry_mod._requeue_one, {"host": "elsewhere", "pid": 7, "token": "theirs"}

    def taken_over_then_requeue(*args) -> None:
        got = job.store.read(key)
        assert got is not None and job.store.replace(key, orjson.dumps(usurper), if_ver=got[1].ver) is not None
        requeue_one(*args)

    monkeypatch.setattr(retry_mod, "_requeue_one", taken_over_then_requeue)
    with pytest.raises(UserError, match=f"{LOCK} was taken over by host=elsewhere pid=7"):
        retry_mod.requeue(JobDir(job.root), all_failed=True)
    assert JobDir(job.root).failed_ids() == {sid}
    got = job.store.read(key)
    assert got is not None and orjson.loads(got[0]) == usurper
