"""JSONL and Parquet input on S3 with a local job dir (docs/OBJECT_STORE.md section 6, step 10).

Real moto server in its own process (tests/s3server.py), real prepare, real
worker processes with the copy runner. The S3 input must give exactly the
shards and shard table the same bytes give on local disk; only the recorded
dataset path and the files' fingerprints (size + ETag for an object, size +
mtime for a file) differ.
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.errors import PermanentError, UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.shard_table import TABLE_NAME
from data_juicer_elastic.merge import merge
from data_juicer_elastic.prepare.parquet import read_descriptor, schema_of
from data_juicer_elastic.prepare.source import objects_for
from tests.jobs import REPO, env_with, spawn_worker
from tests.prep_helpers import request, run, shard_bytes, text_rows, write_rows
from tests.reference import elastic_recipe, meanwhile, read_rows, run_elastic
from tests.s3server import s3_server, use_env
from tests.test_prepare_parquet import _table, write_parquet

pytest.importorskip("boto3")
pytest.importorskip("moto")
zstandard = pytest.importorskip("zstandard")

BUCKET = "dje-input"


@pytest.fixture(scope="module")
def moto_env() -> Iterator[dict[str, str]]:
    with s3_server(BUCKET) as env:
        yield env


@pytest.fixture
def s3(moto_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """A boto3 client of the server; this process's (cached) input client is made afresh for it."""
    import boto3

    use_env(monkeypatch, moto_env)
    objects_for.cache_clear()
    yield boto3.session.Session().client("s3")
    objects_for.cache_clear()


def upload(client, root: Path, prefix: str) -> None:
    """Every file under ``root`` (or ``root`` itself) as the object ``prefix/<relative path>``."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    for path in files:
        rel = path.name if root.is_file() else path.relative_to(root).as_posix()
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{rel}", Body=path.read_bytes())


def corpus(root: Path) -> Path:
    """A folder of JSONL files (nested, a very long line, one without a final newline) plus files left out."""
    write_rows(root / "b.jsonl", text_rows(60, 100))
    write_rows(root / "a" / "z.jsonl", text_rows(45, 200), newline_at_end=False)
    write_rows(root / "a.jsonl", [*text_rows(20, 300), {"text": "y" * 5000, "id": 999}, *text_rows(9, 400)])
    (root / "notes.txt").write_text("not an input")
    (root / ".hidden.txt").write_text("hidden")
    return root


def manifest_dict(job_dir: Path) -> dict:
    return orjson.loads((job_dir / "manifest.json").read_bytes())


def assert_same_shards(local_job: Path, s3_job: Path, url: str) -> None:
    """Byte-identical shards and shard table; the manifests differ only in the dataset path and fingerprints."""
    assert shard_bytes(s3_job) == shard_bytes(local_job)
    assert (s3_job / TABLE_NAME).read_bytes() == (local_job / TABLE_NAME).read_bytes()
    local, remote = manifest_dict(local_job), manifest_dict(s3_job)
    assert remote["dataset_path"] == url
    for f_local, f_remote in zip(local["files"], remote["files"], strict=True):
        assert "etag" not in f_local and f_remote["etag"].startswith('"') and f_remote["mtime_ns"] == 0
        assert {**f_remote, "mtime_ns": f_local["mtime_ns"], "etag": None} == {**f_local, "etag": None}
    ignored = ("dataset_path", "files", "created_at", "digest")
    assert {k: v for k, v in remote.items() if k not in ignored} == {k: v for k, v in local.items() if k not in ignored}


@pytest.mark.parametrize(
    "shards, jobs, packed", [(1, 0, False), (4, 0, False), (13, 2, False), (1, 0, True), (5, 0, True), (9, 2, True)]
)
def test_a_prefix_gives_the_shards_of_the_same_folder_on_disk(
    tmp_path: Path, s3, shards: int, jobs: int, packed: bool
) -> None:
    """``packed``: a.jsonl gzipped and a/z.jsonl zstd-compressed, the JSONL kinds one local folder may mix."""
    root = (mixed_corpus if packed else corpus)(tmp_path / "ds")
    folder = f"folder-{shards}-{packed}"
    upload(s3, root, f"{folder}/ds")
    s3.put_object(Bucket=BUCKET, Key=f"{folder}/ds/empty-marker/", Body=b"")  # a console's "folder"
    s3.put_object(Bucket=BUCKET, Key=f"{folder}/dsx.jsonl", Body=b'{"text": "beside the prefix"}\n')
    url = f"s3://{BUCKET}/{folder}/ds/"
    run(request(root, tmp_path / "local", shards), jobs=jobs)
    remote, logs = run(request(url, tmp_path / "remote", shards), jobs=jobs)
    names = ["a.jsonl.gz", "a/z.jsonl.zst", "b.jsonl"] if packed else ["a.jsonl", "a/z.jsonl", "b.jsonl"]
    assert [f.path for f in remote.manifest.files] == names
    assert_same_shards(tmp_path / "local", tmp_path / "remote", url)
    assert any("skipped 1 file(s)" in line and "notes.txt" in line for line in logs), logs


@pytest.mark.parametrize("shards", [1, 3, 7])
def test_an_object_gives_the_shards_of_the_same_file_on_disk(tmp_path: Path, s3, shards: int) -> None:
    data = write_rows(tmp_path / "data.jsonl", text_rows(120), newline_at_end=False)
    upload(s3, data, "file")
    url = f"s3://{BUCKET}/file/data.jsonl"
    run(request(data, tmp_path / "local", shards))
    remote, _ = run(request(url, tmp_path / "remote", shards))
    assert remote.manifest.input_kind == "file" and remote.manifest.files[0].path == "data.jsonl"
    assert_same_shards(tmp_path / "local", tmp_path / "remote", url)


def test_an_object_edited_since_prepare_is_refused_on_re_prepare(tmp_path: Path, s3) -> None:
    data = write_rows(tmp_path / "data.jsonl", text_rows(40))
    upload(s3, data, "edit")
    req = request(f"s3://{BUCKET}/edit/data.jsonl", tmp_path / "job", 3)
    first, _ = run(req)
    again, logs = run(req)  # unchanged: nothing to do
    assert not again.created and "already prepared" in logs[0]
    edited = data.read_bytes().replace(b"row 7 ", b"row 8 ")  # the same size, another ETag
    s3.put_object(Bucket=BUCKET, Key="edit/data.jsonl", Body=edited)
    etag = s3.head_object(Bucket=BUCKET, Key="edit/data.jsonl")["ETag"]
    with pytest.raises(UserError, match=r"input data\.jsonl: changed since prepare") as err:
        run(req)
    assert f"ETag {first.manifest.files[0].etag} -> {etag}" in str(err.value)


@pytest.mark.parametrize(
    "url, expected",
    [
        ("s3://no-such-bucket/data.jsonl", "the bucket 'no-such-bucket' does not exist"),
        (f"s3://{BUCKET}/nothing/here.jsonl", "does not exist (no object at this key and none under it"),
        (f"s3://{BUCKET}/nothing/", "does not exist"),
    ],
)
def test_a_missing_bucket_or_key_is_refused_naming_the_url(tmp_path: Path, s3, url: str, expected: str) -> None:
    with pytest.raises(UserError, match="does not exist") as err:
        run(request(url, tmp_path / "job", 2))
    assert url in str(err.value) and expected in str(err.value)
    assert not (tmp_path / "job" / "manifest.json").exists()


def compress(path: Path, codec: str) -> Path:
    """``path`` replaced by its ``.gz`` or ``.zst`` form (multi-frame for zst, as a streaming writer makes)."""
    data = path.read_bytes()
    out = path.with_name(f"{path.name}.{codec}")
    if codec == "gz":
        out.write_bytes(gzip.compress(data, mtime=0))
    else:
        cctx = zstandard.ZstdCompressor()
        out.write_bytes(b"".join(cctx.compress(data[i : i + 1000]) for i in range(0, len(data), 1000)))
    path.unlink()
    return out


def mixed_corpus(root: Path) -> Path:
    """The corpus with a.jsonl gzipped and a/z.jsonl zstd-compressed: a folder of JSONL kinds local disk takes."""
    corpus(root)
    compress(root / "a.jsonl", "gz")
    compress(root / "a" / "z.jsonl", "zst")
    return root


@pytest.mark.parametrize("codec", ["gz", "zst"])
def test_a_compressed_object_gives_the_shards_of_the_same_file_on_disk(tmp_path: Path, s3, codec: str) -> None:
    data = compress(write_rows(tmp_path / "data.jsonl", text_rows(3000, width=300)), codec)  # > 1 MiB plain
    upload(s3, data, "packed")
    url = f"s3://{BUCKET}/packed/{data.name}"
    run(request(data, tmp_path / "local", 4))
    remote, _ = run(request(url, tmp_path / "remote", 4))
    assert remote.manifest.files[0].path == data.name and remote.manifest.total_rows == 3000
    assert_same_shards(tmp_path / "local", tmp_path / "remote", url)


def parquet_corpus(root: Path) -> Path:
    write_parquet(root / "a.parquet", _table(0, 1000), [100, 400, 50, 450])
    write_parquet(root / "sub" / "b.parquet", _table(1000, 600, width=60), [300, 200, 100])
    (root / "notes.txt").write_text("not an input")
    return root


def descriptors(job_dir: Path) -> list[dict]:
    """Each shard's descriptor without where its files are (path, mtime, ETag): the rest must match."""
    where = ("path", "mtime_ns", "etag")
    return [
        {**d, "sources": [{k: v for k, v in src.items() if k not in where} for src in d["sources"]]}
        for d in map(orjson.loads, shard_bytes(job_dir))
    ]


def tables(job_dir: Path) -> list:
    """The rows each shard's descriptor reads (the runner's ``read_descriptor``), as Python rows."""
    job = JobDir(job_dir)
    schema = schema_of(job.manifest().parquet)
    return [[t.to_pylist() for t in read_descriptor(str(job.shard_file(s.id)), schema)] for s in job.manifest().shards]


@pytest.mark.parametrize("shards", [1, 3, 7])
def test_a_parquet_prefix_gives_the_shards_of_the_same_folder_on_disk(tmp_path: Path, s3, shards: int) -> None:
    """The descriptors differ only in where the files are (URL and ETag for a path and mtime), so the table's
    per-shard digests and sizes do too; the row groups, byte ranges, range digests and rows read are the same."""
    root = parquet_corpus(tmp_path / "ds")
    upload(s3, root, f"pq-{shards}/ds")
    url = f"s3://{BUCKET}/pq-{shards}/ds/"
    run(request(root, tmp_path / "local", shards))
    remote, logs = run(request(url, tmp_path / "remote", shards))
    assert [f.path for f in remote.manifest.files] == ["a.parquet", "sub/b.parquet"]
    assert any("skipped 1 file(s)" in line and "notes.txt" in line for line in logs), logs
    local_job, s3_job = tmp_path / "local", tmp_path / "remote"
    assert descriptors(s3_job) == descriptors(local_job)
    first = orjson.loads(shard_bytes(s3_job)[0])["sources"][0]
    assert first["path"] == url + "a.parquet" and first["mtime_ns"] == 0
    assert first["etag"] == s3.head_object(Bucket=BUCKET, Key=f"pq-{shards}/ds/a.parquet")["ETag"]
    placeless = [
        {k: v for k, v in orjson.loads(line).items() if k not in ("sha256", "bytes")}
        for line in (s3_job / TABLE_NAME).read_bytes().splitlines()
    ]
    assert placeless == [
        {k: v for k, v in orjson.loads(line).items() if k not in ("sha256", "bytes")}
        for line in (local_job / TABLE_NAME).read_bytes().splitlines()
    ]
    local, remote_m = manifest_dict(local_job), manifest_dict(s3_job)
    for f_local, f_remote in zip(local["files"], remote_m["files"], strict=True):
        assert {**f_remote, "mtime_ns": f_local["mtime_ns"], "etag": None} == {**f_local, "etag": None}
    ignored = ("dataset_path", "files", "created_at", "digest", "shard_table", "total_bytes")  # descriptors' sizes
    assert {k: v for k, v in remote_m.items() if k not in ignored} == {
        k: v for k, v in local.items() if k not in ignored
    }
    assert tables(s3_job) == tables(local_job)


def test_a_parquet_object_edited_since_prepare_is_refused_by_prepare_and_the_runner(tmp_path: Path, s3) -> None:
    data = write_parquet(tmp_path / "d.parquet", _table(0, 300), [100, 200])
    upload(s3, data, "pq-edit")
    req = request(f"s3://{BUCKET}/pq-edit/d.parquet", tmp_path / "job", 2)
    run(req)
    write_parquet(data, _table(5, 300), [100, 200])
    upload(s3, data, "pq-edit")
    with pytest.raises(UserError, match=r"input d\.parquet: changed since prepare \((size|ETag)"):
        run(req)
    job = JobDir(tmp_path / "job")
    shard = str(job.shard_file(job.manifest().shards[0].id))
    with pytest.raises(PermanentError, match=r"d\.parquet: changed since prepare .*etag"):
        read_descriptor(shard, schema_of(job.manifest().parquet))


def test_an_edited_compressed_object_is_refused_on_re_prepare(tmp_path: Path, s3) -> None:
    data = compress(write_rows(tmp_path / "d.jsonl", text_rows(40)), "gz")
    upload(s3, data, "gz-edit")
    req = request(f"s3://{BUCKET}/gz-edit/d.jsonl.gz", tmp_path / "job", 2)
    run(req)
    s3.put_object(Bucket=BUCKET, Key="gz-edit/d.jsonl.gz", Body=gzip.compress(b'{"text": "other"}\n' * 40))
    with pytest.raises(UserError, match=r"input d\.jsonl\.gz: changed since prepare"):
        run(req)


def test_a_prefix_mixing_jsonl_and_parquet_is_refused_as_the_same_folder_is(tmp_path: Path, s3) -> None:
    root = tmp_path / "ds"
    write_parquet(root / "p.parquet", _table(0, 10), [10])
    compress(write_rows(root / "j.jsonl", text_rows(5)), "zst")
    upload(s3, root, "kinds")
    for dataset in (root, f"s3://{BUCKET}/kinds/"):
        with pytest.raises(UserError, match=re.escape(f"{dataset}: mixes JSONL and Parquet inputs (e.g. j.jsonl.zst")):
            run(request(dataset, tmp_path / "job", 1))
    assert not (tmp_path / "job" / "manifest.json").exists()


def test_relative_media_paths_resolve_against_the_object_folder(tmp_path: Path, s3) -> None:
    s3.put_object(Bucket=BUCKET, Key="media/in/rows.jsonl", Body=b'{"text": "a", "images": ["img/1.png"]}\n')
    run(request(f"s3://{BUCKET}/media/in/rows.jsonl", tmp_path / "job", 1))
    [data] = shard_bytes(tmp_path / "job")
    assert orjson.loads(data)["images"] == [f"s3://{BUCKET}/media/in/img/1.png"]


def test_workers_run_an_s3_prepared_job_from_the_job_dir(tmp_path: Path, s3) -> None:
    """The rest of the job is unchanged: real workers (copy runner) read the job dir's shards; merge equals input."""
    root = corpus(tmp_path / "ds")
    upload(s3, root, "workers/ds")
    run(request(f"s3://{BUCKET}/workers/ds/", tmp_path / "job", 6))
    job = JobDir(tmp_path / "job")
    procs = [spawn_worker(job, "copy", log=tmp_path / f"w{i}.log") for i in range(2)]
    assert [p.wait(timeout=240) for p in procs] == [0, 0], (tmp_path / "w0.log").read_text()[-3000:]
    merge(job, str(tmp_path / "merged.jsonl"), log=lambda *_: None)
    a, z, b = ((root / p).read_bytes() for p in ("a.jsonl", "a/z.jsonl", "b.jsonl"))
    assert (tmp_path / "merged.jsonl").read_bytes() == a + z + b"\n" + b  # z's last line gained its newline


@pytest.mark.slow  # imports Data-Juicer to parse the recipe
def test_dj_elastic_prepare_exits_2_naming_a_missing_key(tmp_path: Path, s3, moto_env: dict[str, str]) -> None:
    """Through the command line: the recipe's s3:// dataset_path passes validation; prepare exits 2 naming it."""
    url = f"s3://{BUCKET}/absent/data.jsonl"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"dataset_path: {url}\nexport_path: {tmp_path / 'out.jsonl'}\nexecutor_type: elastic_shard\n"
        f"elastic_shard: {{job_dir: {tmp_path / 'job'}, num_shards: 2}}\n"
        "process:\n  - whitespace_normalization_mapper: {}\n"
    )
    env = {k: os.environ[k] for k in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")} | moto_env
    out = subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", "prepare", "--config", str(recipe)],
        cwd=REPO,
        env=env_with(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert f"{url}: does not exist" in out.stderr
    assert moto_env["AWS_SECRET_ACCESS_KEY"] not in out.stderr + out.stdout
    assert not (tmp_path / "job" / "manifest.json").exists()


@pytest.mark.slow
def test_dj_process_on_an_s3_prefix_merges_what_the_same_local_folder_gives(tmp_path: Path, s3) -> None:
    """One real ``dj-process`` run each (Ray, the Data-Juicer runner): the S3 input's output equals the local one's."""
    root = corpus(tmp_path / "ds")
    upload(s3, root, "e2e/ds")
    url = f"s3://{BUCKET}/e2e/ds/"
    process = [{"whitespace_normalization_mapper": None}, {"text_length_filter": {"min_len": 50}}]

    def output(name: str, dataset: str) -> bytes:
        out = tmp_path / f"out-{name}" / "merged.jsonl"
        config = elastic_recipe(tmp_path / f"{name}.yaml", dataset, out, tmp_path / f"job-{name}", process)
        run_elastic(config, tmp_path, "--elastic_shard.num_shards", "3")
        return out.read_bytes()

    with meanwhile(lambda: output("local", str(root))) as local:
        outputs = {"s3": output("s3", url)}
    outputs["local"] = local.result()
    assert manifest_dict(tmp_path / "job-s3")["dataset_path"] == url
    rows = read_rows(tmp_path / "out-s3" / "merged.jsonl")
    assert 0 < len(rows) < 135 and all(len(r["text"]) >= 50 for r in rows)  # the filter ran: some rows dropped
    assert outputs["s3"] == outputs["local"]
