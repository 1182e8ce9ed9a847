"""Dedup stage units on a real job dir (dedup/units.py): three processes race for them through the shard lease
API, one is killed -9 inside a bucket unit and its unit taken over, and the kept rows equal Data-Juicer's own ops
on the whole input; on POSIX and on an S3 job dir (moto). A unit whose input changed after its done record is
refused, naming the key; the store calls of a hash unit do not grow with the bucket count."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.dedup import keyfile, units
from data_juicer_elastic.dedup.layout import KEYS, OUT, ROWS, DedupLayout, Unit
from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.storage.store import Store, store_for
from tests.dedup_unit_worker import GEN, MARKER, PROCESS, layout_for, recipe_ops
from tests.jobs import REPO, wait_for
from tests.s3server import use_env
from tests.test_dedup_core import build, long_filter, planted_corpus, reference
from tests.test_store_contract import BUCKET, moto_env  # noqa: F401 (the moto server, one per module)

SHARDS, BUCKETS, LOCK_TIMEOUT = 6, 5, 2.0


@pytest.fixture(scope="module")
def corpus() -> tuple[list[dict], list[str]]:
    """The core test's planted corpus and Data-Juicer's own result on it (exact, filter, MinHash)."""
    rows, _ = planted_corpus()
    ops = [build(e)[0] for e in PROCESS]
    return rows, reference(rows, ops, long_filter)


def stage_input(store: Store, rows: list[dict], shards: int = SHARDS) -> DedupLayout:
    """Input shards as prepare leaves them, and the generation's record (what JobDir looks for on S3)."""
    layout = layout_for(len(rows), shards, BUCKETS)
    ends = [*layout.starts[1:], len(rows)]
    for shard, a, z in zip(layout.shards, layout.starts, ends, strict=True):
        store.create(layout.input_key(shard), b"".join(orjson.dumps(r) + b"\n" for r in rows[a:z]))
    store.create(f"generations/{GEN}/generation.json", orjson.dumps({"recipe_sha256": GEN * 4, "created_at": 1.0}))
    return layout


def race(url: str, store: Store, rows: list[dict], log_dir: Path) -> tuple[DedupLayout, str]:
    """Three worker processes; the victim killed -9 once it sits inside a bucket unit. The victim's unit."""
    layout = stage_input(store, rows)
    args = [str(len(rows)), str(SHARDS), str(BUCKETS), str(LOCK_TIMEOUT)]
    procs = {}
    for n, role in enumerate(["victim", "racer", "racer"]):
        log = open(log_dir / f"{n}-{role}.log", "wb")
        cmd = [sys.executable, "-m", "tests.dedup_unit_worker", url, role, *args]
        procs[n] = (subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ)), log)
    victim = procs[0][0]
    got = wait_for(lambda: store.read(MARKER), "the victim inside a bucket unit", timeout=300, proc=victim)
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    for proc, log in procs.values():
        rc = proc.wait(timeout=600)
        log.close()
        assert proc is victim or rc == 0, Path(log.name).read_text()[-3000:]
    return layout, got[0].decode()


@pytest.mark.parametrize("where", ["posix", "s3"])
def test_three_racing_processes_one_killed_in_a_bucket(where, corpus, tmp_path, request, monkeypatch):
    rows, want = corpus
    if where == "posix":
        url = str(tmp_path / "job")
    else:
        use_env(monkeypatch, request.getfixturevalue("moto_env"))
        url = f"s3://{BUCKET}/dedup/{uuid.uuid4().hex[:12]}"
    store = store_for(url)
    layout, victim_unit = race(url, store, rows, tmp_path)
    assert units.units_pending(store, layout) == []
    kept = units.kept_rows(store, layout)
    assert [r["text"] for _, r in kept] == want
    assert [i for i, _ in kept] == sorted(i for i, _ in kept)
    (unit,) = [u for u in layout.units("bucket", 0) + layout.units("bucket", 1) if u.id == victim_unit]
    done = units.load_done(store, layout, unit)
    assert done is not None and done.attempt >= 2  # taken over: the victim's attempt 1 never published
    orphan = layout.output_key(unit, 1, OUT)
    assert store.head(orphan) is not None and done.outputs[OUT].key != orphan
    print(f"{where}: {len(rows)} rows, {len(kept)} kept; {victim_unit} won by attempt {done.attempt}")


# --------------------------------------------------------------------------- in-process
def run_all(store: Store, layout: DedupLayout, ops: units.Ops) -> None:
    """Every unit once, stage by stage, as attempt 1 (no claims: one process)."""
    while pending := units.units_pending(store, layout):
        for unit in pending:
            assert units.publish(store, layout, unit, units.run_unit(store, layout, unit, 1, ops))


@pytest.fixture(scope="module")
def ops() -> units.Ops:
    return recipe_ops()


def test_units_in_process_match_and_publish_once(corpus, ops, tmp_path):
    rows, want = corpus
    store = store_for(str(tmp_path / "job"))
    layout = stage_input(store, rows)
    assert [u.stage for u in units.units_pending(store, layout)] == ["hash"] * SHARDS
    run_all(store, layout, ops)
    assert [r["text"] for _, r in units.kept_rows(store, layout)] == want
    unit = layout.units("join", 0)[0]
    again = units.run_unit(store, layout, unit, 2, ops)
    assert not units.publish(store, layout, unit, again)  # first wins
    assert units.load_done(store, layout, unit).attempt == 1


TAMPER = {  # the output changed, and the unit that reads it
    "keys": (Unit("hash", 0, "part-00002-of-00006"), KEYS, Unit("bucket", 0, "")),
    "bucket": (Unit("bucket", 1, "00003"), OUT, Unit("join", 1)),
    "rows": (Unit("hash", 1, "part-00004-of-00006"), ROWS, Unit("final", 2, "part-00004-of-00006")),
}


@pytest.mark.parametrize("what", sorted(TAMPER))
def test_a_unit_refuses_an_input_changed_after_its_done_record(what, corpus, ops, tmp_path):
    rows, _ = corpus
    store = store_for(str(tmp_path / "job"))
    layout = stage_input(store, rows)
    run_all(store, layout, ops)
    written, name, reader = TAMPER[what]
    key = units.load_done(store, layout, written).outputs[name].key
    path = tmp_path / "job" / key
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # one bit of its last record: sizes and headers still agree
    path.write_bytes(bytes(data))
    if reader.stage == "bucket":  # the bucket whose range holds the changed byte
        table = keyfile.read_table(keyfile.from_bytes(bytes(data)))
        last = max(b for b in range(BUCKETS) if table.span(b)[0] < table.span(b)[1])
        reader = Unit("bucket", 0, f"{last:05d}")
    with pytest.raises(IntegrityError, match=key.replace(".", r"\.")):
        units.run_unit(store, layout, reader, 2, ops)


class Counting:
    """A store that counts its calls by method: what a unit costs in requests."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.calls = inner, collections.Counter()

    def __getattr__(self, name: str):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*a, **kw):
            self.calls[name] += 1
            return attr(*a, **kw)

        return call


def test_store_calls_per_unit_do_not_grow_with_buckets(corpus, ops, tmp_path):
    rows, _ = corpus
    seen = {}
    for buckets in (2, 64):
        store = store_for(str(tmp_path / f"job-{buckets}"))
        layout = stage_input(store, rows)
        layout = DedupLayout(layout.base, layout.shards, layout.starts, buckets, layout.kinds)
        run_all(store, layout, ops)
        counted = Counting(store)
        cost = {}
        for unit in [Unit("hash", 0, layout.shards[1]), Unit("hash", 1, layout.shards[1]), Unit("bucket", 1, "00001")]:
            counted.calls.clear()
            units.run_unit(counted, layout, unit, 2, ops)
            cost[unit.stage + str(unit.dedup)] = dict(counted.calls)
        seen[buckets] = cost
        print(f"{buckets} buckets, {SHARDS} shards: store calls {cost}")
    assert seen[2] == seen[64]
    assert seen[2]["hash0"] == {"read": 4, "create": 3}  # the input; three outputs, each created and re-read
    assert seen[2]["hash1"] == {"read": 7, "create": 3, "open_range": 1}
    assert sum(seen[2]["bucket1"].values()) == 3 * SHARDS + 2  # per shard: done record, index, range
