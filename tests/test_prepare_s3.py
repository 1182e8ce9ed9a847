"""Prepare onto a job dir given as an ``s3://`` URL (prepare.on_store, against a moto server).

The build runs in node-local scratch and is published key by key: shards, the shard table, then
``manifest.json`` created last. The store must then hold exactly the keys and bytes a local prepare of
the same request writes (only the timestamps prepare records differ), a repeat is a no-op, a different
request is refused as locally, racing prepares end with one manifest, and ``JobDir(url)`` reads the same job.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.layout import JobDir, generation_id
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.job.versions import current_versions
from data_juicer_elastic.prepare.driver import PrepareRequest, PrepareResult, prepare
from data_juicer_elastic.storage.store import Store, store_for

from .jobs import RECIPE, REPO, write_input
from .s3server import use_env
from .test_store_contract import BUCKET, moto_env  # noqa: F401 (moto_env: the server, one per module)

pytest.importorskip("boto3")
pytest.importorskip("moto")

SHARDS = 7
STAMPED = {"manifest.json": "created_at", "current.json": "at"}  # a record's one timestamp (generation.json too)
RACERS = 3


def request(corpus: Path, job_dir: str, *, shards: int = SHARDS, recipe: bytes = RECIPE, **policy) -> PrepareRequest:
    return PrepareRequest(
        dataset_path=str(corpus),
        job_dir=job_dir,
        recipe_text=recipe,
        policy=Policy(num_shards=shards, **policy),
        versions=current_versions(),
    )


def quiet(req: PrepareRequest) -> PrepareResult:
    return prepare(req, log=lambda *_: None)


def fresh_url(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> tuple[str, Store]:
    use_env(monkeypatch, env)
    url = f"s3://{BUCKET}/jobs/{uuid.uuid4().hex[:12]}"
    return url, store_for(url)


def local_keys(root: Path) -> dict[str, bytes]:
    """Every file of a local job dir by its key (hidden names are POSIX-only bookkeeping)."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            if not name.startswith("."):
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


def store_keys(store: Store) -> dict[str, bytes]:
    out = {}
    for entry in store.list(""):
        got = store.read(entry.key)
        assert got is not None, entry.key
        out[entry.key] = got[0]
    return out


def unstamped(key: str, data: bytes) -> bytes | dict:
    """A key's bytes, or for a record carrying a timestamp, its content without it."""
    field = "created_at" if key.endswith("generation.json") else STAMPED.get(key)
    if field is None:
        return data
    record = orjson.loads(data)
    assert isinstance(record.pop(field), float)
    return record


def same_job(local: dict[str, bytes], remote: dict[str, bytes]) -> None:
    assert sorted(remote) == sorted(local)
    for key in local:
        assert unstamped(key, remote[key]) == unstamped(key, local[key]), key


def without_stamp(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "created_at"}


def test_prepare_on_s3_writes_the_keys_and_bytes_of_a_local_prepare(tmp_path, moto_env, monkeypatch):  # noqa: F811
    corpus = write_input(tmp_path / "input", 300, shards=SHARDS)
    url, store = fresh_url(monkeypatch, moto_env)
    local = quiet(request(corpus, str(tmp_path / "job")))
    remote = quiet(request(corpus, url))
    assert remote.created and local.created and remote.rows == local.rows == 300
    keys = store_keys(store)
    assert f"shards/part-00006-of-0000{SHARDS}.jsonl" in keys and "shards/_table.jsonl" in keys
    same_job(local_keys(tmp_path / "job"), keys)
    job = JobDir(url)
    assert job.on_object_store and job.generation == generation_id(remote.manifest.recipe_sha256)
    theirs = JobDir(tmp_path / "job").manifest()
    assert without_stamp(job.manifest().to_dict()) == without_stamp(theirs.to_dict())
    assert list(job.manifest().shards) == list(theirs.shards)


def test_a_repeat_is_a_no_op_a_new_recipe_a_new_generation_a_different_request_refused(
    tmp_path,
    moto_env,  # noqa: F811
    monkeypatch,
):
    corpus = write_input(tmp_path / "input", 200, shards=SHARDS)
    url, store = fresh_url(monkeypatch, moto_env)
    assert quiet(request(corpus, url)).created
    before = {e.key: e.ver for e in store.list("")}
    again = quiet(request(corpus, url))
    assert not again.created and {e.key: e.ver for e in store.list("")} == before  # nothing written

    with pytest.raises(UserError, match=r"num_shards: 7 in job dir, 5 requested"):
        quiet(request(corpus, url, shards=5))
    with pytest.raises(UserError, match=r"media_keys: \['images', 'audios', 'videos'\] in job dir"):
        quiet(dataclasses.replace(request(corpus, url), media_keys=("pictures",)))
    assert {e.key: e.ver for e in store.list("")} == before

    recipe2 = RECIPE + b"np: 2\n"
    second = quiet(request(corpus, url, recipe=recipe2, max_retries=5))
    assert not second.created and second.manifest.policy.max_retries == 5  # the shards are reused
    job = JobDir(url)
    gen2 = generation_id(second.manifest.recipe_sha256)
    assert job.generation == gen2 and len(job.generation_ids()) == 2
    assert store.read(f"generations/{gen2}/recipe.yaml")[0] == recipe2  # type: ignore[index]
    back = quiet(request(corpus, url, max_retries=7))  # the first recipe again, a new run-time policy
    assert JobDir(url).generation == generation_id(back.manifest.recipe_sha256)
    assert JobDir(url).manifest().policy.max_retries == 7


def test_a_prepare_completes_its_own_leftovers_and_refuses_another_requests(tmp_path, moto_env, monkeypatch):  # noqa: F811
    corpus = write_input(tmp_path / "input", 200, shards=SHARDS)
    quiet(request(corpus, str(tmp_path / "job")))
    local = local_keys(tmp_path / "job")
    url, store = fresh_url(monkeypatch, moto_env)
    first, last = f"shards/part-00000-of-0000{SHARDS}.jsonl", f"shards/part-00006-of-0000{SHARDS}.jsonl"
    store.create(first, local[first])  # a prepare of the same request stopped mid-upload
    assert quiet(request(corpus, url)).created
    same_job(local, store_keys(store))

    url, store = fresh_url(monkeypatch, moto_env)
    store.create(last, b'{"text": "another request\'s shard"}\n')
    with pytest.raises(UserError, match=rf"{url}/{last}: holds other bytes than this prepare's .* no manifest.json"):
        quiet(request(corpus, url))
    assert store.head("manifest.json") is None

    url, store = fresh_url(monkeypatch, moto_env)
    store.create("notes.txt", b"somebody's")
    with pytest.raises(UserError, match=rf"{url}: exists, is not empty \(notes.txt\) and holds no manifest.json"):
        quiet(request(corpus, url))


RACER = """
import os, sys, time
from pathlib import Path
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.job.versions import current_versions
from data_juicer_elastic.prepare import on_store
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare

corpus, url, shards, ready, me = sys.argv[1:]
publish = on_store.StoreStaging.publish

def together(self):  # every racer built before any publishes: the race is on the store's create-once
    Path(ready, me).touch()
    while len(os.listdir(ready)) < {racers}:
        time.sleep(0.01)
    return publish(self)

on_store.StoreStaging.publish = together
req = PrepareRequest(dataset_path=corpus, job_dir=url, recipe_text={recipe!r}, policy=Policy(num_shards=int(shards)),
                     versions=current_versions())
print("created" if prepare(req, log=lambda *_: None, jobs=0).created else "reused")
"""


def test_racing_prepares_end_with_one_manifest(tmp_path, moto_env, monkeypatch):  # noqa: F811
    corpus = write_input(tmp_path / "input", 400, shards=SHARDS)
    url, store = fresh_url(monkeypatch, moto_env)
    ready = tmp_path / "ready"
    ready.mkdir()
    code = RACER.format(racers=RACERS, recipe=RECIPE)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(corpus), url, str(SHARDS), str(ready), str(i)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(RACERS)
    ]
    said = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        said.append(out.strip())
    assert sorted(said) == ["created"] + ["reused"] * (RACERS - 1)
    local = quiet(request(corpus, str(tmp_path / "job")))
    assert local.created
    same_job(local_keys(tmp_path / "job"), store_keys(store))
