"""One contract for both storage backends (docs/OBJECT_STORE.md sections 1 and 3, plan steps 1, 6, 7, 8).

Every test runs on a ``PosixStore`` in a temp folder and on an ``S3Store``
against two real servers, each in its own processes: moto (tests/s3server.py,
single-threaded, so its check-then-write is atomic) and Ceph RGW
(tests/rgw.py, a one-node Ceph). No test times anything:
the one bound on an age is a sanity check of the clock (an hour off would be
a time-zone bug), far above any pause.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.storage import conditions, probe, s3_upload
from data_juicer_elastic.storage.blocks import blocks
from data_juicer_elastic.storage.posix import PosixStore
from data_juicer_elastic.storage.probe import Capabilities, StoreRefused, check_create_once, probe_store
from data_juicer_elastic.storage.store import Meta, Store, Ver, normalise_key, store_for
from tests.jobs import REPO, env_with, wait_for
from tests.s3server import s3_server, use_env

pytest.importorskip("boto3")
pytest.importorskip("moto")

BUCKET = "dje-test"
RACERS, ROUNDS = 16, 10
CLOCK_SANITY_SECS = 60.0  # far above any pause here, far below a time-zone error
LEASE = b'{"attempt": 1, "host": "node-a", "shard": "part-00000", "token": "ours"}\n'
THEIRS = b'{"attempt": 1, "host": "node-b", "shard": "part-00000", "token": "theirs"}\n'


@pytest.fixture(scope="module")
def moto_env() -> Iterator[dict[str, str]]:
    with s3_server(BUCKET) as env:
        yield env


@pytest.fixture(scope="module")
def moto_env_no_create_once() -> Iterator[dict[str, str]]:
    """A server whose middleware strips If-None-Match: a store that ignores create-once."""
    with s3_server(BUCKET, strip=["If-None-Match"]) as env:
        yield env


@pytest.fixture(scope="module")
def moto_env_no_if_match() -> Iterator[dict[str, str]]:
    """A server whose middleware strips If-Match: a store that ignores conditional replaces."""
    with s3_server(BUCKET, strip=["If-Match"]) as env:
        yield env


def s3_store(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Store:
    use_env(monkeypatch, env)
    return store_for(f"s3://{BUCKET}/jobs/{uuid.uuid4().hex[:12]}")  # a fresh prefix per test


@pytest.fixture(params=["moto", "rgw"])
def s3_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The env of each S3 server the suite runs: moto, and Ceph RGW (``rgw_env``, tests/rgw.py)."""
    return request.getfixturevalue(f"{request.param}_env")


@pytest.fixture(params=["posix", "moto", "rgw"])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    if request.param == "posix":
        return store_for(str(tmp_path / "job"))
    return s3_store(monkeypatch, request.getfixturevalue(f"{request.param}_env"))


def race_to_create(store: Store, key: str, bodies: list[bytes], exclusive: bool = False) -> list[str | None]:
    """One thread per body, released together by a barrier, each creating ``key``: what each create returned."""
    barrier, results = threading.Barrier(len(bodies)), [None] * len(bodies)

    def race(i: int) -> None:
        barrier.wait()
        meta = store.create(key, bodies[i], exclusive=exclusive)
        results[i] = None if meta is None else meta.ver

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def made(store: Store, key: str, data: bytes, *, exclusive: bool = False) -> Ver:
    """Create ``key`` (it must not be there yet): the version created."""
    meta = store.create(key, data, exclusive=exclusive)
    assert meta is not None, key
    return meta.ver


@pytest.mark.parametrize("exclusive", [False, True])
def test_create_once_under_a_race(store: Store, exclusive: bool):
    """16 threads create one key at once, 10 rounds: exactly one wins, and the key holds the winner's bytes."""
    for round_no in range(ROUNDS):
        key = f"generations/g/state/claims/part-{round_no:05d}@0001"
        bodies = [f"racer {i} of round {round_no}\n".encode() for i in range(RACERS)]
        results = race_to_create(store, key, bodies, exclusive)
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


def is_posix(store: Store) -> bool:
    return isinstance(store, PosixStore)


@pytest.mark.parametrize("exclusive", [False, True])
def test_create_hands_back_its_version_and_stamp(store: Store, exclusive: bool):
    """What ``claimed_at`` needs: the created key's version and its store stamp, from the create itself."""
    key = "generations/g/state/claims/part-00000@0001"
    created = store.create(key, LEASE, exclusive=exclusive)
    head = store.head(key)
    assert created is not None and head is not None
    assert (created.ver, created.size, created.released) == (head.ver, len(LEASE), False)
    if is_posix(store):
        assert created.modified == head.modified  # the file's mtime
    else:
        assert head.modified <= created.modified <= head.store_now  # the PUT's Date; Last-Modified is truncated
    assert created.modified <= store.now() < created.modified + CLOCK_SANITY_SECS
    assert store.create(key, THEIRS, exclusive=exclusive) is None
    got = store.read(key)
    assert got is not None and got[0] == LEASE


def test_a_held_now_ages_a_key_without_reading_the_clock(store: Store, monkeypatch: pytest.MonkeyPatch):
    """``head``/``read`` given a ``now`` age by it (POSIX: one lstat, no clock probe); without one, a caller
    that never asks for the age never reads the clock either (``read_lease``, ``create``)."""
    key = "generations/g/state/claims/part-00001@0001"
    made(store, key, LEASE)
    t = store.now()

    def no_clock() -> float:
        raise AssertionError("the clock was read")

    monkeypatch.setattr(store, "now", no_clock)
    head = store.head(key, now=t)
    got = store.read(key, now=t)
    assert head is not None and got is not None
    for meta in (head, got[1]):
        if is_posix(store):
            assert meta.store_now == t and meta.age == t - meta.modified
        else:
            assert meta.store_now >= t  # the response's own Date, never older than a reading taken before
    plain = store.read(key)
    assert plain is not None and plain[0] == LEASE and plain[1].ver == head.ver
    created = store.create("generations/g/state/claims/part-00002@0001", LEASE, exclusive=True)
    assert created is not None and created.modified > 0
    assert store.head("generations/g/state/claims/part-00003@0001", now=t) is None
    monkeypatch.undo()
    late = store.head(key)
    assert late is not None and 0.0 <= late.age < CLOCK_SANITY_SECS  # asked for: read then


def test_replace_with_a_stale_version_changes_nothing(store: Store):
    v1 = made(store, "state/progress.json", b"one\n")
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
    ver = made(store, "generations/g/state/done/part-00001-of-00002.json", data)
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


def test_names_are_one_level_of_a_folder(store: Store):
    for key in ["N/a", "N/b/c", "N/b/d", "N/.tmp-x", "N/.probe/y", "Nx/e", "N.json"]:
        assert store.create(key, key.encode()) is not None
    store.now()  # the clock key is internal
    assert sorted(store.names("N")) == ["a", "b"]  # keys and sub-folders, once each; internal names left out
    assert sorted(store.names("./N/b/")) == ["c", "d"]
    assert sorted(store.names("")) == ["N", "N.json", "Nx"]
    assert store.names("nothing") == [] and store.names("N/a") == []  # a missing folder; a key is no folder
    with pytest.raises(ValueError, match=r"absolute|'\.\.'"):
        store.names("../N")


def test_stamp_moves_when_a_name_comes_or_goes(store: Store):
    """POSIX: the folder's mtime ("" while it is missing); S3 keeps no folder, so no stamp: None, and the
    reader lists instead. The folder is dated back before each change, so a change within one timestamp
    tick of the last read cannot hide a move."""
    from data_juicer_elastic.storage.s3 import S3Store

    with pytest.raises(ValueError):
        store.stamp("../outside")
    if isinstance(store, S3Store):
        store.create("failed/a.json", b"a")
        assert store.stamp("failed") is None and store.stamp("missing") is None
        return
    assert store.stamp("failed") == ""
    store.create("failed/a.json", b"a")
    folder = store.path("failed")

    def dated_back() -> str:
        os.utime(folder, ns=(10**9, 10**9))
        return store.stamp("failed")

    before = dated_back()
    assert before not in ("", None) and store.stamp("failed") == before  # nothing changed: the same stamp
    store.create("failed/b.json", b"b")
    assert store.stamp("failed") != before
    before = dated_back()
    store.delete("failed/a.json")
    assert store.stamp("failed") != before
    before = dated_back()
    store.replace("failed/b.json", b"b2")  # a rename over a name: the folder is written too
    assert store.stamp("failed") != before


def test_posix_names_stat_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Names only: a listing of leases costs one ``listdir``, never a stat per name (``list`` stats each)."""
    store = PosixStore(tmp_path)
    for key in ("claims/s@0001", "claims/s@0002"):
        assert store.create(key, b"{}") is not None
    os.symlink("elsewhere", tmp_path / "claims" / "t@0001")  # a planted link is a name like any other

    def refuse(*args, **kwargs):
        raise AssertionError("names must not stat")

    for call in ("stat", "lstat", "scandir"):
        monkeypatch.setattr(os, call, refuse)
    assert sorted(store.names("claims")) == ["s@0001", "s@0002", "t@0001"]


def honours(store: Store, condition: str) -> bool:
    """Whether the probe found ``condition`` (a ``Capabilities`` field) kept on this store; POSIX keeps all."""
    return is_posix(store) or getattr(store.conditions(), condition)  # type: ignore[attr-defined]


def test_delete(store: Store):
    v1 = made(store, "retry/part-00003.json", b"one\n")
    assert v1 is not None
    v2 = store.replace("retry/part-00003.json", b"two\n")
    if not honours(store, "delete_if_match"):  # RGW: refused before anything is deleted, naming the endpoint
        with pytest.raises(StoreRefused, match=f"{store.endpoint}.*If-Match on DELETE"):  # type: ignore[attr-defined]
            store.delete("retry/part-00003.json", if_ver=v2)
        assert store.head("retry/part-00003.json") is not None and store.delete("retry/part-00003.json") is True
        return
    assert store.delete("retry/part-00003.json", if_ver=v1) is False  # stale: nothing removed
    assert store.head("retry/part-00003.json") is not None
    assert store.delete("retry/part-00003.json", if_ver=v2) is True
    assert store.head("retry/part-00003.json") is None and store.read("retry/part-00003.json") is None
    assert store.delete("retry/part-00003.json") is True  # gone already is fine
    assert store.delete("retry/part-00003.json", if_ver=v2) is False
    assert store.create("retry/part-00003.json", b"three\n") is not None  # a deleted key can be created again
    assert store.delete("retry/part-00003.json") is True
    assert list(store.list("retry")) == []


def wait_for_the_clock_to_pass(store: Store, t: float) -> None:
    """Poll the store's clock until it reads later than ``t`` (POSIX: the next timestamp tick; S3: the next
    whole second), so a write after it is stamped later than ``t``. A liveness bound only: nothing is timed."""
    deadline = time.monotonic() + CLOCK_SANITY_SECS
    while store.now() <= t:
        assert time.monotonic() < deadline, f"the store's clock did not pass {t} in {CLOCK_SANITY_SECS:g}s"
        time.sleep(0.05)


def body_of(store: Store, key: str) -> dict:
    got = store.read(key)
    assert got is not None
    body = orjson.loads(got[0])
    assert isinstance(body, dict)
    return body


def test_renew_stamps_the_store_clock_and_moves_the_version(store: Store):
    key = "generations/g/state/claims/part-00000@0001"
    v1 = made(store, key, LEASE)
    m1 = store.head(key)
    assert v1 is not None and m1 is not None and not m1.released
    wait_for_the_clock_to_pass(store, m1.modified)
    v2 = store.renew(key, v1)
    m2 = store.head(key)
    assert v2 is not None and m2 is not None and v2 == m2.ver != v1
    assert m1.modified < m2.modified <= m2.store_now  # stamped by the store, on its clock
    assert not m2.released
    v3 = store.renew(key, v2)  # the version renew handed back renews again
    m3 = store.head(key)
    assert v3 is not None and m3 is not None and v3 == m3.ver and m3.modified >= m2.modified
    assert orjson.loads(LEASE).items() <= body_of(store, key).items()  # the lease's own fields are kept


def test_renew_with_a_stale_version_is_lost_and_writes_nothing(store: Store):
    key = "generations/g/state/claims/part-00000@0001"
    v1 = made(store, key, LEASE)
    assert v1 is not None
    v2 = store.renew(key, v1)
    assert v2 is not None
    v3 = store.replace(key, THEIRS)  # somebody put another lease in its place
    assert v3 is not None
    assert store.renew(key, v2) is None  # the version of our last beat
    assert store.renew(key, v1) is None  # and the one before it
    got = store.read(key)
    assert got is not None and got[0] == THEIRS and got[1].ver == v3
    assert store.delete(key) is True
    assert store.renew(key, v3) is None  # gone: lost, and not written back
    assert store.head(key) is None


def put_in_place(path: Path, data: bytes, mtime_ns: int) -> None:
    """``data`` at ``path`` under a new inode with the mtime given: what sshfs shows when it renumbers a file."""
    tmp = path.with_name(".renumbered")
    tmp.write_bytes(data)
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, path)


def test_posix_renew_compares_the_bytes_not_the_inode(tmp_path: Path):
    """sshfs may number one file differently over time: a lease with the same bytes is still ours (as the
    refresher has always compared); another lease of the same size and mtime is not. Another process, with
    no bytes remembered, renews by the version's size and mtime."""
    store, key = PosixStore(tmp_path), "claims/part-00000@0001"
    ver = made(store, key, LEASE, exclusive=True)
    path = store.path(key)
    st = os.lstat(path)
    put_in_place(path, LEASE, st.st_mtime_ns)
    assert os.lstat(path).st_ino != st.st_ino and store.head(key).ver != ver  # type: ignore[union-attr]
    ver = store.renew(key, ver)
    assert ver is not None and store.head(key).ver == ver  # type: ignore[union-attr]
    other = PosixStore(tmp_path)  # another process: nothing remembered
    ver = other.renew(key, ver)
    assert ver is not None and path.read_bytes() == LEASE
    st = os.lstat(path)
    forged = LEASE.replace(b"node-a", b"node-x")
    assert len(forged) == len(LEASE)
    put_in_place(path, forged, st.st_mtime_ns)
    assert other.renew(key, ver) is None  # the bytes it renewed differ now
    assert path.read_bytes() == forged and os.lstat(path).st_mtime_ns == st.st_mtime_ns  # nothing written


def test_posix_replace_compares_the_bytes_not_the_inode(tmp_path: Path):
    """``replace(if_ver)`` compares as ``renew`` does: sshfs may renumber attempt.json between an attempt's two
    writes, and the record is still the writer's; bytes of the same size and mtime that it did not write are
    not. Another process, with nothing remembered, compares size and mtime."""
    store, key = PosixStore(tmp_path), "attempts/part-00000/0001/attempt.json"
    running, ended = b'{"outcome": "running"}\n', b'{"outcome": "done"}\n'
    ver = made(store, key, running)
    path = store.path(key)
    st = os.lstat(path)
    put_in_place(path, running, st.st_mtime_ns)
    assert os.lstat(path).st_ino != st.st_ino and store.head(key).ver != ver  # type: ignore[union-attr]
    ver = store.replace(key, ended, if_ver=ver)
    assert ver is not None and path.read_bytes() == ended
    put_in_place(path, ended, os.lstat(path).st_mtime_ns)
    other = PosixStore(tmp_path)  # another process: by size and mtime
    theirs = other.replace(key, running, if_ver=ver)
    assert theirs is not None and path.read_bytes() == running
    forged = b'{"outcome": "crashed"}\n'
    assert len(forged) == len(running)
    put_in_place(path, forged, os.lstat(path).st_mtime_ns)
    assert other.replace(key, ended, if_ver=theirs) is None  # the bytes it wrote differ now
    assert path.read_bytes() == forged


def test_posix_replace_refuses_its_own_older_version_within_one_timestamp(tmp_path: Path):
    """Two writes inside one timestamp tick have the same size and mtime; with the inode left out, the bytes
    this store wrote last tell its older version from its newer one."""
    store, key = PosixStore(tmp_path), "state/progress.json"
    v1 = made(store, key, b"one\n")
    mtime = os.lstat(store.path(key)).st_mtime_ns
    v2 = store.replace(key, b"two\n", if_ver=v1)
    assert v2 is not None
    os.utime(store.path(key), ns=(mtime, mtime))  # as if both writes fell in one tick
    assert store.replace(key, b"three\n", if_ver=v1) is None
    assert store.read(key)[0] == b"two\n"  # type: ignore[index]
    assert store.replace(key, b"four\n", if_ver=v2) is not None  # its own last version, by its bytes


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_write_that_need_not_be_durable_keeps_the_contract(store: Store, exclusive: bool):
    """``durable=False`` changes what a power loss may undo, nothing else: create-once and ``if_ver`` hold."""
    key = "attempts/part-00000/0001/attempt.json"
    v1 = store.create(key, b"running\n", exclusive=exclusive, durable=False)
    assert v1 is not None and store.create(key, b"again\n", exclusive=exclusive, durable=False) is None
    v2 = store.replace(key, b"done\n", if_ver=v1.ver, durable=False)
    assert v2 is not None and store.replace(key, b"stale\n", if_ver=v1.ver, durable=False) is None
    got = store.read(key)
    assert got is not None and got[0] == b"done\n" and got[1].ver == v2


@pytest.mark.parametrize("exclusive", [False, True])
def test_posix_durable_false_fsyncs_the_file_not_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exclusive: bool
):
    """POSIX: a durable write fsyncs the file, then its folder after the link or rename; ``durable=False``
    only the file (a power loss may roll the name back, a reader never sees a cut record)."""
    store, synced = PosixStore(tmp_path), []
    fsync = os.fsync

    def seen(fd: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", seen)
    for durable in (True, False):
        synced.clear()
        created = store.create(f"d-{durable}/a.json", b"one\n", exclusive=exclusive, durable=durable)
        assert created is not None
        assert synced == (["file", "folder"] if durable else ["file"])
        synced.clear()
        assert store.replace(f"d-{durable}/a.json", b"two\n", if_ver=created.ver, durable=durable) is not None
        assert synced == (["file", "folder"] if durable else ["file"])


def test_posix_head_sees_a_planted_link_without_following_it(tmp_path: Path):
    """A link named like a lease keeps the name taken and ages by its own mtime; its target is never read,
    renewed or released (claims.py always read lease names so)."""
    store, key = PosixStore(tmp_path), "claims/part-00000@0002"
    outside = tmp_path / "outside.json"
    outside.write_bytes(THEIRS)
    (tmp_path / "claims").mkdir()
    store.path(key).symlink_to(outside)
    head = store.head(key)
    assert head is not None and head.modified == os.lstat(store.path(key)).st_mtime
    assert store.read(key) is None and store.create(key, LEASE, exclusive=True) is None
    assert store.renew(key, head.ver) is None and outside.read_bytes() == THEIRS


def test_release(store: Store):
    key = "generations/g/state/claims/part-00003@0002"
    assert store.release(key) is False  # nothing there
    v1 = made(store, key, LEASE)
    assert v1 is not None
    v2 = store.replace(key, THEIRS)
    assert store.release(key, v1) is False  # somebody else's lease now: left alone
    meta = store.head(key)
    assert meta is not None and not meta.released and meta.ver == v2
    assert store.release(key, v2) is True
    meta = store.head(key)
    got = store.read(key)
    assert meta is not None and meta.released and got is not None and got[1].released
    assert orjson.loads(THEIRS).items() <= orjson.loads(got[0]).items()
    assert store.renew(key, v2) is None  # the version it had before the release
    assert store.renew(key, meta.ver) is None  # and the released one: a released lease is never renewed
    meta = store.head(key)
    assert meta is not None and meta.released
    assert store.release(key) is True  # already released, whoever asks
    assert store.create(key, LEASE) is None  # the key stays taken: the next attempt is a new key


def test_release_without_a_version(store: Store):
    key = "generations/g/state/claims/part-00004@0001"
    v1 = made(store, key, LEASE)
    assert v1 is not None and store.renew(key, v1) is not None
    assert store.release(key) is True
    meta = store.head(key)
    assert meta is not None and meta.released


@pytest.mark.parametrize("bad", ["../x", "/abs", "a/../../x", "a/../b", "", "."])
def test_keys_are_confined(store: Store, bad: str):
    for call in (
        lambda: store.create(bad, b"x"),
        lambda: store.replace(bad, b"x"),
        lambda: store.read(bad),
        lambda: store.head(bad),
        lambda: store.delete(bad),
        lambda: store.renew(bad, "v"),
        lambda: store.release(bad),
    ):
        with pytest.raises(ValueError) as err:
            call()
        assert repr(bad) in str(err.value)
    if bad not in ("", "."):  # those two are the whole store as a prefix
        with pytest.raises(ValueError, match=r"absolute|'\.\.'"):
            list(store.list(bad))


def test_keys_are_normalised(store: Store):
    assert normalise_key("a//b/./c/") == "a/b/c"
    ver = made(store, "a//b/./c", b"x")
    meta = store.head("a/b/c")
    assert meta is not None and meta.ver == ver
    assert [e.key for e in store.list("./a/")] == ["a/b/c"]


def test_probe_passes_and_leaves_nothing(store: Store, monkeypatch: pytest.MonkeyPatch):
    key = f".probe/test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(probe, "probe_key", lambda: key)
    check_create_once(store)
    assert store.head(key) is None


HONOURED = {  # what the probe measures on each server: moto 5.2.6, Ceph RGW 16.2.15 (docs/OBJECT_STORE.md section 3)
    "posix": Capabilities(if_match=True),
    "moto": Capabilities(if_match=True, copy_once=False),
    "rgw": Capabilities(if_match=True, etag_quoted=False, delete_if_match=False, complete_once=False, copy_once=False),
}


def test_probe_finds_what_each_server_honours_and_leaves_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
):
    """Each conditional request the protocol sends, as the server at hand keeps it: RGW takes If-Match only
    with a bare ETag and ignores If-None-Match on Complete and Copy and If-Match on DELETE."""
    used: list[str] = []
    monkeypatch.setattr(probe, "probe_key", lambda: used.append(f".probe/test-{uuid.uuid4().hex[:8]}") or used[-1])
    found = probe_store(store)
    assert found == HONOURED[request.node.callspec.params["store"]]
    assert used and all(store.head(key) is None for key in used) and list(store.list("")) == []
    line = found.line(store)
    assert line.startswith(f"store: {store.describe()}: create-once yes, If-Match yes (ETag ")
    for said in ("GET If-Match", "DELETE If-Match", "Complete If-None-Match", "Copy If-None-Match"):
        assert f"{said} {'yes' if found.__dict__[LABEL_FIELDS[said]] else 'no'}" in line


LABEL_FIELDS = {label: name for name, label in conditions.LABELS.items() if label}


def test_if_match_goes_out_in_the_form_the_probe_found(s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    """Every conditional request on a version sends the ETag as the server takes it: on RGW a quoted current
    ETag is refused (412), so a renew, a replace, a GET on a version and a release all failed when sent
    quoted; here each succeeds on its current version and is refused on a stale one."""
    store = s3_store(monkeypatch, s3_env)
    key = "claims/part-00000@0001"
    v1 = made(store, key, LEASE)
    v2 = store.renew(key, v1)
    assert v2 is not None and store.replace(key, LEASE, if_ver=v1) is None
    v3 = store.replace(key, LEASE, if_ver=v2)
    assert v3 is not None and store._get(store._full(key), v3) is not None  # type: ignore[attr-defined]
    assert store._get(store._full(key), v2) is None  # type: ignore[attr-defined]
    assert store.release(key, v3) is True and body_of(store, key)["released"] is True


def test_probe_reports_if_match_off_on_a_store_that_ignores_it(
    moto_env_no_if_match: dict[str, str], monkeypatch: pytest.MonkeyPatch
):
    """Stripped If-Match: a replace on a stale version goes through, so the capability is off; create-once
    still holds, so the store is not refused."""
    store = s3_store(monkeypatch, moto_env_no_if_match)
    found = probe_store(store)
    stripped = Capabilities(if_match=False, get_if_match=False, delete_if_match=False, copy_once=False)
    assert found == stripped  # If-Match stripped from every request; If-None-Match kept but on Copy, as by moto
    assert "create-once yes, If-Match no (ETag quoted)" in found.line(store)
    assert list(store.client.list_objects_v2(Bucket=BUCKET, Prefix=store.prefix).get("Contents", [])) == []


def test_probe_store_refuses_a_store_that_ignores_if_none_match(
    moto_env_no_create_once: dict[str, str], monkeypatch: pytest.MonkeyPatch
):
    with pytest.raises(StoreRefused, match="If-None-Match"):
        probe_store(s3_store(monkeypatch, moto_env_no_create_once))


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


# --------------------------------------------------------------------------- bulk data: upload, download, open_range

OUT = "attempts/part-00000/0001/output.jsonl"
SIZES = {"empty": 0, "small": 1000, "multipart": s3_upload.MIN_PART + 1000}  # multipart: two parts on S3


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """One PUT only up to S3's smallest part, so a multipart upload takes a file of a few MiB."""
    monkeypatch.setattr(s3_upload, "PART_SIZE", s3_upload.MIN_PART)


def local_file(path: Path, size: int, seed: int = 0) -> bytes:
    data = random.Random(seed).randbytes(size)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def leftovers(store: Store, key: str) -> list[str]:
    """What an upload left beside ``key`` that nobody may see: POSIX temp files, S3 incomplete uploads."""
    if is_posix(store):
        folder = store.path(key).parent  # type: ignore[attr-defined]
        return sorted(n for n in os.listdir(folder) if n.startswith(".")) if folder.exists() else []
    full = f"{store.prefix}/{normalise_key(key)}"  # type: ignore[attr-defined]
    uploads = store.client.list_multipart_uploads(Bucket=BUCKET, Prefix=full).get("Uploads", [])  # type: ignore[attr-defined]
    return [u["UploadId"] for u in uploads]


@pytest.mark.parametrize("create_once", [True, False])
@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_upload_then_download_is_byte_identical(
    store: Store, tmp_path: Path, small_parts: None, size: int, create_once: bool
):
    data = local_file(tmp_path / "scratch" / "out.jsonl", size)
    meta = store.upload(OUT, tmp_path / "scratch" / "out.jsonl", create_once=create_once)
    head = store.head(OUT)
    assert meta is not None and head is not None and (meta.size, meta.ver) == (head.size, head.ver) == (size, head.ver)
    assert meta.modified <= store.now() < meta.modified + CLOCK_SANITY_SECS
    if not is_posix(store):  # two parts: it went by multipart; a create-once is one PUT where Complete ignores it
        by_parts = size > s3_upload.MIN_PART and (not create_once or honours(store, "complete_once"))
        assert meta.ver.endswith('-2"') == by_parts
    dest = tmp_path / "next" / "shard.jsonl"  # its folder is made
    got = store.download(OUT, dest)
    assert got is not None and (got.size, got.ver) == (size, meta.ver)
    assert dest.read_bytes() == data and os.listdir(dest.parent) == ["shard.jsonl"]  # no temp left
    assert store.names("attempts/part-00000/0001") == ["output.jsonl"] and leftovers(store, OUT) == []


@pytest.mark.parametrize("size", [SIZES["small"], SIZES["multipart"]], ids=["small", "multipart"])
def test_upload_replaces_unless_create_once(store: Store, tmp_path: Path, small_parts: None, size: int):
    """create_once onto an existing key: None, the bytes there kept, nothing left behind; else replaced."""
    made(store, OUT, b"theirs\n")
    data = local_file(tmp_path / "out.jsonl", size)
    assert store.upload(OUT, tmp_path / "out.jsonl", create_once=True) is None
    got = store.read(OUT)
    assert got is not None and got[0] == b"theirs\n" and leftovers(store, OUT) == []
    meta = store.upload(OUT, tmp_path / "out.jsonl", create_once=False)
    head = store.head(OUT)
    assert meta is not None and head is not None and meta.ver == head.ver != got[1].ver
    assert store.download(OUT, tmp_path / "back") is not None and (tmp_path / "back").read_bytes() == data
    assert store.names("attempts/part-00000/0001") == ["output.jsonl"] and leftovers(store, OUT) == []


def test_download_of_a_missing_key_makes_no_local_file(store: Store, tmp_path: Path):
    assert store.download(OUT, tmp_path / "scratch" / "shard.jsonl") is None
    assert not (tmp_path / "scratch").exists()
    (tmp_path / "old").write_bytes(b"old\n")
    assert store.download(OUT, tmp_path / "old") is None and (tmp_path / "old").read_bytes() == b"old\n"


def test_download_replaces_a_local_file(store: Store, tmp_path: Path):
    made(store, OUT, b"new bytes\n")
    local = local_file(tmp_path / "scratch" / "shard.jsonl", 5000) and tmp_path / "scratch" / "shard.jsonl"
    assert store.download(OUT, local) is not None
    assert local.read_bytes() == b"new bytes\n" and os.listdir(local.parent) == ["shard.jsonl"]


def test_open_range(store: Store):
    made(store, "shards/part-00000.jsonl", b"0123456789")
    ranges = [(0, 4), (3, 10), (8, 20), (10, 12), (12, 20), (5, 5)]
    got = [store.open_range("shards/part-00000.jsonl", a, b) for a, b in ranges]
    assert got == [b"0123", b"3456789", b"89", b"", b"", b""]
    assert store.open_range("shards/part-00001.jsonl", 0, 4) is None


@pytest.mark.parametrize("size", [0, 1000, 4096 * 3], ids=["empty", "small", "whole-blocks"])
def test_open_read_streams_the_key_in_blocks(store: Store, tmp_path: Path, size: int):
    data = local_file(tmp_path / "out.jsonl", size)
    assert store.upload(OUT, tmp_path / "out.jsonl", create_once=True) is not None
    stream = store.open_read(OUT)
    assert stream is not None
    with stream:
        got = [bytes(b) for b in blocks(stream, bytearray(4096))]
    assert b"".join(got) == data and all(len(b) == 4096 for b in got[:-1]) and len(got) == -(-size // 4096)
    assert store.open_read("attempts/part-00000/0002/output.jsonl") is None
    if is_posix(store):  # a link or a folder at the key reads as missing, as for ``read``
        os.symlink(store.path(OUT), store.path(OUT).with_name("link"))  # type: ignore[attr-defined]
        assert store.open_read("attempts/part-00000/0001/link") is None
        assert store.open_read("attempts/part-00000") is None


def test_posix_upload_onto_its_own_bytes_is_ours(tmp_path: Path):
    """An NFS LINK retransmitted after the server made it answers EEXIST: the bytes there are this upload's
    (another inode here, as a resent link may show), so it is ours, as ``publish_once`` decides."""
    store = PosixStore(tmp_path / "job")
    data = local_file(tmp_path / "out.jsonl", 100_000)
    local_file(store.path(OUT), 100_000)  # the same bytes, another inode
    meta = store.upload(OUT, tmp_path / "out.jsonl", create_once=True)
    assert meta is not None and meta.ver == store.head(OUT).ver  # type: ignore[union-attr]
    local_file(tmp_path / "other.jsonl", 100_000, seed=1)
    assert store.upload(OUT, tmp_path / "other.jsonl", create_once=True) is None
    assert store.path(OUT).read_bytes() == data and leftovers(store, OUT) == []


KILLED_UPLOAD = """
import sys, time
from data_juicer_elastic.storage import s3_upload
from data_juicer_elastic.storage.store import store_for
store = store_for(sys.argv[1])
s3_upload.PART_SIZE = s3_upload.MIN_PART
if hasattr(store, "client"):
    def pause(params, **kwargs):
        if params["PartNumber"] == 2:  # the first part sent: say so, then wait for the kill
            print("paused", flush=True)
            time.sleep(3600)
    store.client.meta.events.register("before-parameter-build.s3.UploadPart", pause)
store.upload(sys.argv[2], sys.argv[3], create_once=sys.argv[4] == "1")
"""


def test_a_killed_upload_leaves_no_key(store: Store, tmp_path: Path):
    """kill -9 mid-upload: no key, nothing listed; what it left (a POSIX temp, an S3 incomplete upload) is
    there but hidden. POSIX reads a FIFO, so the copy is under way once 1 MiB went in; S3 pauses in part 2."""
    local = tmp_path / "out.jsonl"
    if is_posix(store):
        os.mkfifo(local)
    else:
        local_file(local, 2 * s3_upload.MIN_PART + 1000)
    where = str(store.root) if is_posix(store) else store.url  # type: ignore[attr-defined]
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_UPLOAD, where, OUT, str(local), "1" if honours(store, "complete_once") else ""],
        cwd=REPO,
        env=env_with(),  # the moto server's AWS_* from use_env
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        if is_posix(store):
            fd = wait_for(lambda: fifo_writer(local), "the upload to open its source", proc=proc)
            os.set_blocking(fd, True)
            with open(fd, "wb") as fifo:  # each write returns once the child read it: the copy is under way
                fifo.write(random.Random(0).randbytes(1 << 20))
                os.killpg(proc.pid, signal.SIGKILL)
        else:
            assert proc.stdout is not None and proc.stdout.readline() == "paused\n"
            os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert store.head(OUT) is None and store.names("attempts/part-00000/0001") == [] and list(store.list("")) == []
    assert len(leftovers(store, OUT)) == 1  # killed mid-copy: what it left is there, unseen


def fifo_writer(path: Path) -> int | None:
    """A descriptor writing to the FIFO ``path`` once a reader has it open; None before (ENXIO)."""
    try:
        return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return None
        raise


# --------------------------------------------------------------------------- S3 only: a reply lost, then a resend


def force_one_resend(store, operation: str = "PutObject") -> list[int]:
    """Make botocore send ``operation`` once more after its first reply, as if that reply were lost."""
    sends: list[int] = []

    def needs_retry(attempts: int, **kwargs) -> float | None:
        sends.append(attempts)
        return 0.0 if attempts == 1 else None

    store.client.meta.events.register_first(f"needs-retry.s3.{operation}", needs_retry)
    return sends


def test_s3_create_resent_after_its_own_success_is_ours(s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    """The first send created the key, its reply was lost; the resend gets 412: the stored bytes say it is ours."""
    store = s3_store(monkeypatch, s3_env)
    sends = force_one_resend(store)
    ver = made(store, "done/x.json", b"ours\n")
    assert sends[:2] == [1, 2]  # it was sent twice
    meta = store.head("done/x.json")
    assert ver is not None and meta is not None and ver == meta.ver


def test_s3_replace_resent_after_its_own_success_is_ours(s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    """The If-Match replace landed, its reply was lost; the resend gets 412 (the ETag moved, by us): resolved alike."""
    store = s3_store(monkeypatch, s3_env)
    v1 = made(store, "state/progress.json", b"one\n")
    sends = force_one_resend(store)
    v2 = store.replace("state/progress.json", b"two\n", if_ver=v1)
    assert sends[:2] == [1, 2]
    meta = store.head("state/progress.json")
    assert v2 is not None and meta is not None and v2 == meta.ver != v1


def test_s3_create_resent_onto_a_foreign_key_loses(s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    store = s3_store(monkeypatch, s3_env)
    assert store.create("done/x.json", b"theirs\n") is not None
    sends = force_one_resend(store)
    assert store.create("done/x.json", b"ours\n") is None
    assert sends[:2] == [1, 2]
    got = store.read("done/x.json")
    assert got is not None and got[0] == b"theirs\n"


@pytest.mark.parametrize(
    ("operation", "size"), [("PutObject", SIZES["small"]), ("CompleteMultipartUpload", SIZES["multipart"])]
)
def test_s3_upload_resent_after_its_own_success_is_ours(
    s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, small_parts: None, operation, size
):
    """The create-once PUT or Complete landed, its reply was lost and it was sent again: ours. The resent PUT
    gets 412 and the stored bytes decide; moto answers a resent Complete of the same upload 200 (idempotent,
    as AWS is), so ``MultipartWrite._ours_after_resend`` (412 or NoSuchUpload) is not reached here."""
    store = s3_store(monkeypatch, s3_env)
    data = local_file(tmp_path / "out.jsonl", size)
    sends = force_one_resend(store, operation)  # RGW: a Complete only where no create-once is asked
    meta = store.upload(
        OUT, tmp_path / "out.jsonl", create_once=operation == "PutObject" or honours(store, "complete_once")
    )
    assert sends[:2] == [1, 2]
    head = store.head(OUT)
    assert meta is not None and head is not None and meta.ver == head.ver
    assert store.download(OUT, tmp_path / "back") is not None and (tmp_path / "back").read_bytes() == data
    assert leftovers(store, OUT) == []


@pytest.fixture(scope="module")
def moto_env_forgets_completed() -> Iterator[dict[str, str]]:
    """A server that answers a repeated Complete of one upload NoSuchUpload (as stores that drop it may)."""
    with s3_server(BUCKET, forget_completed=True) as env:
        yield env


def test_s3_complete_resent_to_a_store_that_forgot_the_upload_is_ours_by_its_etag(
    moto_env_forgets_completed: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, small_parts: None
):
    """The Complete landed, its reply was lost; the resend gets NoSuchUpload: the object's ETag is the one our
    parts make (``MultipartWrite._ours_after_resend``), so the upload is ours, not refused."""
    store = s3_store(monkeypatch, moto_env_forgets_completed)
    data = local_file(tmp_path / "out.jsonl", SIZES["multipart"])
    sends = force_one_resend(store, "CompleteMultipartUpload")
    meta = store.upload(OUT, tmp_path / "out.jsonl", create_once=True)
    assert sends[:2] == [1, 2]
    head = store.head(OUT)
    assert meta is not None and head is not None and meta.ver == head.ver and meta.size == len(data)
    assert store.download(OUT, tmp_path / "back") is not None and (tmp_path / "back").read_bytes() == data
    assert leftovers(store, OUT) == []


def test_s3_upload_resent_onto_a_foreign_key_loses(
    s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    store = s3_store(monkeypatch, s3_env)
    made(store, OUT, b"theirs\n")
    local_file(tmp_path / "out.jsonl", SIZES["small"])
    sends = force_one_resend(store)
    assert store.upload(OUT, tmp_path / "out.jsonl", create_once=True) is None
    got = store.read(OUT)
    assert sends[:2] == [1, 2] and got is not None and got[0] == b"theirs\n"


def test_s3_renew_counts_beats_and_release_marks_the_metadata(s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    """Each beat rewrites the body with ``beat`` + 1 (a new ETag even within one second); another process's
    store, with nothing remembered, renews through one GET; release sets ``x-amz-meta-dje-released``."""
    store = s3_store(monkeypatch, s3_env)
    key = "claims/part-00000@0001"
    ver = made(store, key, LEASE)
    vers = [ver]
    for _ in range(3):
        ver = store.renew(key, ver)
        vers.append(ver)
    assert None not in vers and len(set(vers)) == 4
    body = body_of(store, key)
    assert body["beat"] == 3 and isinstance(body["writer_time"], float)
    other = store_for(store.url)  # a fresh client: another process
    ver = other.renew(key, ver)
    assert ver is not None and body_of(store, key)["beat"] == 4
    assert store.renew(key, vers[-1]) is None  # the first store's beat is stale now
    assert other.release(key, ver) is True
    full = f"{store.prefix}/{key}"  # type: ignore[attr-defined]
    head = store.client.head_object(Bucket=BUCKET, Key=full)  # type: ignore[attr-defined]
    assert head["Metadata"] == {"dje-released": "1"} and body_of(store, key)["released"] is True


def test_s3_renew_resent_after_its_own_success_is_ours(s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    """A beat landed, its reply was lost; the resend's 412 is our own ETag move: the beat is not lost."""
    store = s3_store(monkeypatch, s3_env)
    v1 = made(store, "claims/part-00000@0001", LEASE)
    assert v1 is not None
    sends = force_one_resend(store)
    v2 = store.renew("claims/part-00000@0001", v1)
    assert sends[:2] == [1, 2]
    meta = store.head("claims/part-00000@0001")
    assert v2 is not None and meta is not None and v2 == meta.ver != v1


def test_s3_renew_refuses_a_body_that_is_not_a_lease(s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    store = s3_store(monkeypatch, s3_env)
    ver = made(store, "state/numbers.txt", b"1 2 3\n")
    assert ver is not None
    with pytest.raises(ValueError, match=r"state/numbers\.txt"):
        store.renew("state/numbers.txt", ver)


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
