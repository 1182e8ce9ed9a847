"""A run's coordination folder on an S3 job dir (coordination.rundir on S3Store, against a moto server).

``RunDir`` is made from the job's store and the folder's key; on S3 it ages ballots by the store's own clock
(a HEAD's ``Date``), with no per-process probe, and its records are the same creates, replaces and reads.
"""

from __future__ import annotations

import time

import orjson
import pytest

from data_juicer_elastic.coordination.elect import coordinate
from data_juicer_elastic.coordination.rundir import EXIT_FAILED, EXIT_OK, Outcome, RunDir, run_key
from data_juicer_elastic.coordination.spec import JobSpec
from data_juicer_elastic.storage.files import dumps_json
from data_juicer_elastic.storage.store import Store

from .jobs import wait_for
from .test_store_contract import BUCKET, moto_env, s3_store  # noqa: F401 (moto_env: the server, one per module)

CLOCK_SANITY_SECS = 3600.0  # a clock read off the wrong source (a time zone) is hours off; a pause here never is


@pytest.fixture
def store(moto_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Store:  # noqa: F811
    return s3_store(monkeypatch, moto_env)  # a fresh job dir per test


def test_elections_outcomes_and_members_on_an_s3_job_dir(store):
    run = RunDir.open(store, run_key("r1"), "r1", "n1")
    other = RunDir.open(store, run_key("r1"), "r1", "n2")
    assert run.store is store  # the store's clock is its own: no probe key of this process's
    assert run.record("run.json")["run_id"] == "r1" and other.record("run.json") == run.record("run.json")

    won, ballot = run.elect("prepare.coordinator.json")
    assert won and other.elect("prepare.coordinator.json") == (False, ballot)
    assert 0.0 <= other.heartbeat_age("prepare.coordinator.json") < CLOCK_SANITY_SECS
    assert other.heartbeat_age("finalize.coordinator.json") == 0.0  # no ballot yet

    first = Outcome(EXIT_OK, "prepared", "n1", run.pid)
    assert run.publish("prepare.result.json", first) == first
    assert other.publish("prepare.result.json", Outcome(EXIT_FAILED, "late")) == first
    assert other.read("prepare.result.json") == first and run.aborted() is None
    assert other.abort("stop").message == "stop" and run.aborted() == Outcome(EXIT_FAILED, "stop", "n2", other.pid)

    run.register(0)
    other.register(1)
    assert run.member_hosts() == ["n1", "n2"]
    assert run.where("abort.json").startswith(f"s3://{BUCKET}/jobs/")


def test_a_ballot_of_a_gone_process_of_this_host_is_succeeded_once_on_s3(store):
    run = RunDir.open(store, run_key("r1"), "r1", "n1")
    gone = {"host": "n1", "pid": 1, "at": time.time(), "boot": "another-boot"}  # another boot: provably gone
    assert store.create(run.key("hosts/n1.json"), dumps_json(gone)) is not None
    won, ballot = run.elect("hosts/n1.json", replace_gone=True)
    assert won and run.record("hosts/n1.json") == ballot
    again = RunDir.at(store, run_key("r1"), "r1", "n1", pid=run.pid + 1)
    assert again.elect("hosts/n1.json", replace_gone=True) == (False, ballot)  # the successor runs: kept
    assert store.renew(run.key("hosts/n1.json"), run.won["hosts/n1.json"]) is not None  # the replace's version


def test_the_coordinator_renews_its_ballot_on_an_s3_job_dir(store):
    """The winner's refresher renews the ballot from the version its create handed out (``RunDir.won``):
    each beat is one If-Match PUT that counts up the body's ``beat``."""
    run = RunDir.open(store, run_key("r1"), "r1", "n1")
    spec = JobSpec(store.url, "", _unused, _unused, poll_interval_secs=0.05, wait_timeout_secs=60.0)
    logged: list[str] = []

    def work() -> Outcome:
        wait_for(lambda: run.record("prepare.coordinator.json").get("beat", 0) >= 2, "two beats of the ballot")
        return Outcome(EXIT_OK, "prepared")

    assert coordinate(run, "prepare", work, spec, logged.append) == Outcome(EXIT_OK, "prepared")
    assert not any("lease lost" in line or "cannot renew" in line for line in logged), logged
    ballot = orjson.loads(store.read(run.key("prepare.coordinator.json"))[0])
    assert ballot["host"] == "n1" and ballot["pid"] == run.pid


def _unused(*_: object) -> object:
    raise AssertionError("a coordinator's election needs no job to prepare or run")
