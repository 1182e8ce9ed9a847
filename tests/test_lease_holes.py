"""The lease protocol's last holes (issue 43): each test fails on the code before its fix.

Real servers only (moto in its own process, tests/s3server.py); no test times anything.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import orjson
import pytest
from botocore.exceptions import ReadTimeoutError

from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.attempt import load_attempt
from data_juicer_elastic.storage.keys import Meta
from data_juicer_elastic.storage.lapse import lapse_clock
from data_juicer_elastic.storage.refresher import LeaseRefresher
from data_juicer_elastic.storage.s3 import S3Store
from data_juicer_elastic.storage.s3_deadline import MIN_TIMEOUT, send_bound, timeouts_for
from data_juicer_elastic.storage.store import store_for
from data_juicer_elastic.worker.loop import run_worker

from .jobs import make_job, wait_for
from .runners import copy
from .s3server import s3_server, use_env
from .test_jobdir_s3 import mirror
from .test_store_contract import BUCKET


@pytest.fixture(scope="module")
def moto_env() -> Iterator[dict[str, str]]:
    with s3_server(BUCKET) as env:
        yield env


def s3_job(tmp_path, monkeypatch, env) -> JobDir:
    url, _ = mirror(make_job(tmp_path, rows=4, shards=1), monkeypatch, env)
    return JobDir(url)


def test_a_lease_renewed_1_2_s_ago_on_whole_second_stamps_is_live_at_a_2_s_timeout(tmp_path, moto_env, monkeypatch):
    """Renewed at 100.9, read at 102.1: S3 says Last-Modified 100, Date 102, an age of 2 for 1.2 s. Stale only
    past the timeout plus the store's 1 s resolution: at Date 103 (at least 2.1 s) it is."""
    job = s3_job(tmp_path, monkeypatch, moto_env)
    claims = ClaimStore(job, lock_timeout=2.0, host="node-a")
    sid = job.manifest().shards[0].id
    assert claims.try_claim(sid, 0) is not None
    real_head = claims.store.head
    stamps = {"modified": 100.0, "clock": 102.0}

    def whole_seconds(key: str, now: float | None = None):
        meta = real_head(key, now)
        return None if meta is None else dataclasses.replace(meta, **stamps)

    monkeypatch.setattr(claims.store, "head", whole_seconds)
    assert claims.is_live(sid, 1, 102.0)
    stamps["clock"] = 103.0
    assert not claims.is_live(sid, 1, 103.0)


LEASE = b'{"attempt": 1, "host": "node-a", "shard": "part-00000", "token": "ours"}\n'
THEIRS = b'{"attempt": 1, "host": "node-b", "shard": "part-00000", "token": "theirs"}\n'
KEY = "state/claims/part-00000@0001"


def s3_store(monkeypatch, env) -> S3Store:
    use_env(monkeypatch, env)
    store = store_for(f"s3://{BUCKET}/jobs/{uuid.uuid4().hex[:12]}")
    assert isinstance(store, S3Store)
    store.conditions()  # the startup probe's own PUTs first, so a reply dropped later is a beat's
    return store


def drop_replies(store: S3Store) -> list[int]:
    """Arm by appending 1: the next PutObject lands on the server, then its reply is lost (a read timeout)."""
    armed: list[int] = []

    def lost_reply(**kwargs) -> None:
        if armed:
            armed.pop()
            raise ReadTimeoutError(endpoint_url=store.endpoint)

    store.client.meta.events.register("after-call.s3.PutObject", lost_reply)
    return armed


def lease_with_a_reply_to_drop(monkeypatch, env) -> tuple[S3Store, Meta, list[int]]:
    """A fresh lease on the server, and the next PutObject's reply armed to be lost after it lands."""
    store = s3_store(monkeypatch, env)
    meta = store.create(KEY, LEASE, exclusive=True)
    assert meta is not None
    drop = drop_replies(store)
    drop.append(1)
    return store, meta, drop


def beats(store: S3Store) -> int:
    got = store.read(KEY)
    return 0 if got is None else int(orjson.loads(got[0]).get("beat", 0))


def test_a_beat_that_landed_unanswered_is_ours_on_the_next_renew(moto_env, monkeypatch):
    """The PUT landed, the client saw a timeout; the next renew (same version) gets 412, finds its own beat's
    token there, adopts its ETag and beats on. Before: lost, and the owner dropped its live lease."""
    store, meta, _ = lease_with_a_reply_to_drop(monkeypatch, moto_env)
    with pytest.raises(store.errors):
        store.renew(KEY, meta.ver)
    assert beats(store) == 1  # it landed
    new = store.renew(KEY, meta.ver)
    assert new is not None and beats(store) == 2 and store.head(KEY).ver == new
    assert store.renew(KEY, new) is not None and beats(store) == 3


def test_the_refresher_keeps_a_lease_whose_beat_landed_unanswered(moto_env, monkeypatch):
    store, meta, drop = lease_with_a_reply_to_drop(monkeypatch, moto_env)
    logged: list[str] = []
    with LeaseRefresher(store, KEY, meta.ver, 0.05, log=logged.append) as lease:
        wait_for(lambda: beats(store) >= 4 or lease.lost.is_set(), "four beats, or the lease lost")
        assert not lease.lost.is_set(), logged
    assert not drop and "cannot renew the lease" in logged[0]


@pytest.mark.parametrize("foreign", ["replace", "release"])
def test_a_foreign_write_after_an_unanswered_beat_is_still_lost(moto_env, monkeypatch, foreign):
    """Our beat landed unanswered, then another process replaced the lease (or released it, keeping our
    body and token but marked released): the next renew is refused and their write is left as it is."""
    store, meta, _ = lease_with_a_reply_to_drop(monkeypatch, moto_env)
    with pytest.raises(store.errors):
        store.renew(KEY, meta.ver)
    other = store_for(store.url)
    if foreign == "replace":
        assert other.replace(KEY, THEIRS) is not None
    else:
        assert other.release(KEY)
    theirs = store.read(KEY)
    assert store.renew(KEY, meta.ver) is None
    assert store.read(KEY)[0] == theirs[0] and store.head(KEY).ver == theirs[1].ver


def test_a_store_error_while_publishing_fails_the_attempt_not_the_worker(tmp_path, moto_env, monkeypatch):
    """The done record's PUT goes to a server that was stopped (connection refused): the attempt fails,
    recorded so, and the worker ends on its own terms (exit 2, the shard failed), not on the store's error."""
    url, _ = mirror(make_job(tmp_path, rows=4, shards=1, max_retries=0), monkeypatch, moto_env)
    with s3_server(BUCKET) as stopped:
        dead = stopped["AWS_ENDPOINT_URL"]
    job = JobDir(url)
    live = job.store.endpoint.rstrip("/")

    def to_the_stopped_server(request, **kwargs) -> None:
        if "/done/" in request.url:
            request.url = request.url.replace(live, dead.rstrip("/"), 1)

    job.store.client.meta.events.register_first("before-send.s3.PutObject", to_the_stopped_server)
    result = run_worker(job, copy, host="node-a", log=lambda *_: None)
    assert result.exit_code == 2 and not result.completed, result
    sid = job.manifest().shards[0].id
    record = load_attempt(job, sid, 1)
    # the refused connection, or (a loaded machine, the beat before the publish slow) the deadline's refusal:
    # either way a store error ended the attempt, not the worker
    assert record is not None and record.outcome == "failed", record
    assert "Could not connect" in (record.error or "") or "DeadlineMissed" in (record.error or ""), record.error
    assert not job.done_ids()


def sends(store: S3Store) -> list[str]:
    """The URL of every request the client sends from now on (a ``before-send`` hook on all of S3)."""
    seen: list[str] = []
    store.client.meta.events.register("before-send.s3", lambda request, **kwargs: seen.append(request.url))
    return seen


def test_a_publish_whose_deadline_is_too_near_for_one_send_is_not_sent(moto_env, monkeypatch):
    """Less time left than the shortest send (connect, write, reply at ``MIN_TIMEOUT`` each): refused before
    anything is sent, a store error, no key. Before: the PUT went out whatever the time left."""
    store = s3_store(monkeypatch, moto_env)
    seen = sends(store)
    with pytest.raises(store.errors, match="deadline"):
        store.create("done/a.json", b"{}\n", deadline=lapse_clock() + 2 * MIN_TIMEOUT)
    assert seen == [] and store.head("done/a.json") is None


def test_a_publish_right_after_a_beat_at_a_3_s_lock_timeout_lands(moto_env, monkeypatch):
    """A 3 s lease leaves a publish sent just after a beat about 3 s: less than one send of the client's
    own (5 s to connect, 20 s to read), so it goes out with timeouts from the time left, and lands."""
    store = s3_store(monkeypatch, moto_env)
    meta = store.create(KEY, LEASE, exclusive=True)
    assert meta is not None
    sent = lapse_clock()
    assert store.renew(KEY, meta.ver) is not None
    assert store.create("done/a.json", b"{}\n", deadline=sent + 3.0) is not None
    assert store.read("done/a.json")[0] == b"{}\n"


@pytest.mark.parametrize("left", [0.8, 1.0, 2.5, 3.0, 7.7, 44.9, 45.0, 600.0])
def test_the_timeouts_of_a_send_fit_in_the_time_left(left):
    """Connect + write + reply within what is left, never above the client's own timeouts; the client's
    own where they fit; none below three ``MIN_TIMEOUT``."""
    connect, read = timeouts_for(left, 5.0, 20.0)
    assert send_bound(connect, read) <= left and connect <= 5.0 and read <= 20.0
    assert (connect, read) == (5.0, 20.0) if left >= 45.0 else read >= left / 3 / 2 ** (1 / 4) - 1e-9
    assert timeouts_for(3 * MIN_TIMEOUT - 0.01, 5.0, 20.0) is None


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_posix_create_past_its_deadline_writes_nothing(tmp_path, exclusive):
    store = store_for(str(tmp_path / "job"))
    with pytest.raises(store.errors, match="deadline"):
        store.create("done/a.json", b"{}\n", exclusive=exclusive, deadline=lapse_clock() - 0.01)
    folder = tmp_path / "job" / "done"
    assert store.head("done/a.json") is None and not (folder.exists() and list(folder.iterdir()))  # no temp either
    assert store.create("done/a.json", b"{}\n", exclusive=exclusive, deadline=lapse_clock() + 60.0) is not None
