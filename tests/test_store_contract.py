"""One contract for both storage backends (docs/OBJECT_STORE.md sections 1 and 3, plan steps 1, 6, 7, 8).

Every test runs on a ``PosixStore`` in a temp folder and on an ``S3Store``
against a real moto server in its own process (tests/s3server.py,
single-threaded, so its check-then-write is atomic). No test times anything:
the one bound on an age is a sanity check of the clock (an hour off would be
a time-zone bug), far above any pause.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.storage import probe
from data_juicer_elastic.storage.posix import PosixStore
from data_juicer_elastic.storage.probe import StoreRefused, check_create_once
from data_juicer_elastic.storage.store import Meta, Store, normalise_key, store_for
from tests.s3server import s3_server

pytest.importorskip("boto3")
pytest.importorskip("moto")

BUCKET = "dje-test"
RACERS, ROUNDS = 16, 10
CLOCK_SANITY_SECS = 60.0  # far above any pause here, far below a time-zone error


@pytest.fixture(scope="module")
def moto_env() -> Iterator[dict[str, str]]:
    with s3_server(BUCKET) as env:
        yield env


@pytest.fixture(scope="module")
def moto_env_no_create_once() -> Iterator[dict[str, str]]:
    """A server whose middleware strips If-None-Match: a store that ignores create-once."""
    with s3_server(BUCKET, strip=["If-None-Match"]) as env:
        yield env


def use_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Point boto3's standard chain at the server and nothing else (no profile, config or credential file)."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def s3_store(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Store:
    use_env(monkeypatch, env)
    return store_for(f"s3://{BUCKET}/jobs/{uuid.uuid4().hex[:12]}")  # a fresh prefix per test


@pytest.fixture(params=["posix", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    if request.param == "posix":
        return store_for(str(tmp_path / "job"))
    return s3_store(monkeypatch, request.getfixturevalue("moto_env"))


def race_to_create(store: Store, key: str, bodies: list[bytes]) -> list[str | None]:
    """One thread per body, released together by a barrier, each creating ``key``: what each create returned."""
    barrier, results = threading.Barrier(len(bodies)), [None] * len(bodies)

    def race(i: int) -> None:
        barrier.wait()
        results[i] = store.create(key, bodies[i])

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_create_once_under_a_race(store: Store):
    """16 threads create one key at once, 10 rounds: exactly one wins, and the key holds the winner's bytes."""
    for round_no in range(ROUNDS):
        key = f"generations/g/state/claims/part-{round_no:05d}@0001"
        bodies = [f"racer {i} of round {round_no}\n".encode() for i in range(RACERS)]
        results = race_to_create(store, key, bodies)
        winners = [i for i, ver in enumerate(results) if ver is not None]
        assert len(winners) == 1, (round_no, results)
        got = store.read(key)
        assert got is not None
        assert got[0] == bodies[winners[0]] and got[1].ver == results[winners[0]]


def test_create_refuses_an_existing_key_and_keeps_it(store: Store):
    assert store.create("done/a.json", b"first\n") is not None
    assert store.create("done/a.json", b"second\n") is None
    got = store.read("done/a.json")
    assert got is not None and got[0] == b"first\n"


def test_replace_with_a_stale_version_changes_nothing(store: Store):
    v1 = store.create("state/progress.json", b"one\n")
    assert v1 is not None
    v2 = store.replace("state/progress.json", b"two\n", if_ver=v1)
    assert v2 is not None and v2 != v1
    assert store.replace("state/progress.json", b"three\n", if_ver=v1) is None
    got = store.read("state/progress.json")
    assert got is not None and got[0] == b"two\n" and got[1].ver == v2
    v3 = store.replace("state/progress.json", b"four\n")  # unconditional
    assert v3 is not None and v3 not in (v1, v2)
    assert store.replace("state/missing.json", b"x\n", if_ver=v3) is None  # a key that is gone has changed
    assert store.head("state/missing.json") is None


def test_replace_creates_a_missing_key(store: Store):
    ver = store.replace("workers/host-1.json", b"{}\n")
    assert ver is not None
    meta = store.head("workers/host-1.json")
    assert meta is not None and meta.ver == ver


def test_read_and_head_agree(store: Store):
    data = b'{"rows": 3}\n'
    ver = store.create("generations/g/state/done/part-00001-of-00002.json", data)
    got = store.read("generations/g/state/done/part-00001-of-00002.json")
    meta = store.head("generations/g/state/done/part-00001-of-00002.json")
    assert got is not None and meta is not None
    assert got[0] == data
    assert (got[1].ver, got[1].size) == (meta.ver, meta.size) == (ver, len(data))
    assert store.read("generations/g/state/done/nothing.json") is None
    assert store.head("generations/g/state/done/nothing.json") is None


def test_head_age_is_on_the_store_clock(store: Store):
    store.create("claims/part-00000@0001", b"lease\n")
    meta = store.head("claims/part-00000@0001")
    assert isinstance(meta, Meta)
    assert 0.0 <= meta.age == meta.store_now - meta.modified < CLOCK_SANITY_SECS
    now = store.now()
    assert meta.modified <= now < meta.modified + CLOCK_SANITY_SECS


def test_list_returns_exactly_the_keys_under_a_prefix(store: Store):
    inside = ["L/a", "L/b/c", "L/b/d", "L/z.json"]
    for key in [*inside, "Lx/e", "L.json", "M/f"]:
        assert store.create(key, key.encode()) is not None
    assert check_create_once(store) is None  # leaves nothing, and its folder is internal anyway
    store.now()  # the clock key is internal too
    listed = list(store.list("L"))
    assert [e.key for e in listed] == inside  # recursive, key order, nothing of the siblings
    for entry in listed:
        meta = store.head(entry.key)
        assert meta is not None and (entry.size, entry.ver) == (meta.size, meta.ver) == (len(entry.key), meta.ver)
    assert [e.key for e in store.list("L/b/")] == ["L/b/c", "L/b/d"]
    assert list(store.list("nothing")) == []
    assert [e.key for e in store.list("")] == sorted([*inside, "L.json", "Lx/e", "M/f"])


def test_delete(store: Store):
    v1 = store.create("retry/part-00003.json", b"one\n")
    assert v1 is not None
    v2 = store.replace("retry/part-00003.json", b"two\n")
    assert store.delete("retry/part-00003.json", if_ver=v1) is False  # stale: nothing removed
    assert store.head("retry/part-00003.json") is not None
    assert store.delete("retry/part-00003.json", if_ver=v2) is True
    assert store.head("retry/part-00003.json") is None and store.read("retry/part-00003.json") is None
    assert store.delete("retry/part-00003.json") is True  # gone already is fine
    assert store.delete("retry/part-00003.json", if_ver=v2) is False
    assert store.create("retry/part-00003.json", b"three\n") is not None  # a deleted key can be created again
    assert store.delete("retry/part-00003.json") is True
    assert list(store.list("retry")) == []


@pytest.mark.parametrize("bad", ["../x", "/abs", "a/../../x", "a/../b", "", "."])
def test_keys_are_confined(store: Store, bad: str):
    for call in (
        lambda: store.create(bad, b"x"),
        lambda: store.replace(bad, b"x"),
        lambda: store.read(bad),
        lambda: store.head(bad),
        lambda: store.delete(bad),
    ):
        with pytest.raises(ValueError) as err:
            call()
        assert repr(bad) in str(err.value)
    if bad not in ("", "."):  # those two are the whole store as a prefix
        with pytest.raises(ValueError, match=r"absolute|'\.\.'"):
            list(store.list(bad))


def test_keys_are_normalised(store: Store):
    assert normalise_key("a//b/./c/") == "a/b/c"
    ver = store.create("a//b/./c", b"x")
    meta = store.head("a/b/c")
    assert meta is not None and meta.ver == ver
    assert [e.key for e in store.list("./a/")] == ["a/b/c"]


def test_probe_passes_and_leaves_nothing(store: Store, monkeypatch: pytest.MonkeyPatch):
    key = f".probe/test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(probe, "probe_key", lambda: key)
    check_create_once(store)
    assert store.head(key) is None


def test_probe_refuses_a_store_that_ignores_if_none_match(
    moto_env_no_create_once: dict[str, str], monkeypatch: pytest.MonkeyPatch
):
    store = s3_store(monkeypatch, moto_env_no_create_once)
    with pytest.raises(StoreRefused) as err:
        check_create_once(store)
    message = str(err.value)
    assert moto_env_no_create_once["AWS_ENDPOINT_URL"] in message and store.url in message
    assert "If-None-Match" in message and "create-once" in message
    assert isinstance(err.value, UserError) and err.value.exit_code == 2
    assert list(store.client.list_objects_v2(Bucket=BUCKET, Prefix=store.prefix).get("Contents", [])) == []


# --------------------------------------------------------------------------- S3 only: a reply lost, then a resend


def force_one_resend(store, operation: str = "PutObject") -> list[int]:
    """Make botocore send ``operation`` once more after its first reply, as if that reply were lost."""
    sends: list[int] = []

    def needs_retry(attempts: int, **kwargs) -> float | None:
        sends.append(attempts)
        return 0.0 if attempts == 1 else None

    store.client.meta.events.register_first(f"needs-retry.s3.{operation}", needs_retry)
    return sends


def test_s3_create_resent_after_its_own_success_is_ours(moto_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    """The first send created the key, its reply was lost; the resend gets 412: the stored bytes say it is ours."""
    store = s3_store(monkeypatch, moto_env)
    sends = force_one_resend(store)
    ver = store.create("done/x.json", b"ours\n")
    assert sends[:2] == [1, 2]  # it was sent twice
    meta = store.head("done/x.json")
    assert ver is not None and meta is not None and ver == meta.ver


def test_s3_replace_resent_after_its_own_success_is_ours(moto_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    """The If-Match replace landed, its reply was lost; the resend gets 412 (the ETag moved, by us): resolved alike."""
    store = s3_store(monkeypatch, moto_env)
    v1 = store.create("state/progress.json", b"one\n")
    sends = force_one_resend(store)
    v2 = store.replace("state/progress.json", b"two\n", if_ver=v1)
    assert sends[:2] == [1, 2]
    meta = store.head("state/progress.json")
    assert v2 is not None and meta is not None and v2 == meta.ver != v1


def test_s3_create_resent_onto_a_foreign_key_loses(moto_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    store = s3_store(monkeypatch, moto_env)
    assert store.create("done/x.json", b"theirs\n") is not None
    sends = force_one_resend(store)
    assert store.create("done/x.json", b"ours\n") is None
    assert sends[:2] == [1, 2]
    got = store.read("done/x.json")
    assert got is not None and got[0] == b"theirs\n"


# --------------------------------------------------------------------------- store_for and the optional boto3


def test_store_for(tmp_path: Path, moto_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    assert isinstance(store_for(str(tmp_path)), PosixStore) and store_for(str(tmp_path)).root == tmp_path
    assert store_for(f"file://{tmp_path}").root == tmp_path  # type: ignore[attr-defined]
    use_env(monkeypatch, moto_env)
    s3 = store_for(f"s3://{BUCKET}//jobs/run-1/")
    assert (s3.bucket, s3.prefix) == (BUCKET, "jobs/run-1")  # type: ignore[attr-defined]
    assert s3.describe() == f"s3://{BUCKET}/jobs/run-1 (endpoint {moto_env['AWS_ENDPOINT_URL']})"
    assert isinstance(s3, Store) and isinstance(store_for(str(tmp_path)), Store)
    for bad in ("gs://b/p", "s3:///p", "file://otherhost/p", "s3://b/../p"):
        with pytest.raises(ValueError, match=r"s3://|file://|'\.\.'|scheme"):
            store_for(bad)


def test_missing_boto3_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 -> ImportError
    with pytest.raises(UserError, match=r"pip install 'data-juicer-elastic\[s3\]'"):
        store_for("s3://bucket/prefix")


def test_the_storage_modules_import_without_boto3():
    code = (
        "import sys; sys.modules['boto3'] = sys.modules['botocore'] = None\n"
        "import data_juicer_elastic.storage.store, data_juicer_elastic.storage.s3, data_juicer_elastic.storage.probe"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
