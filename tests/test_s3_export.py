"""Merge and export to S3 (docs/OBJECT_STORE.md section 6 step 11): a POSIX job dir, the output on the moto
server: byte for byte the local export, refused when there, whole or absent after a SIGKILL mid-upload."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.folder_export import SUCCESS
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.merge import merge, merged_already, verify
from data_juicer_elastic.plugin.validation import _export_problems
from data_juicer_elastic.storage import s3_upload
from data_juicer_elastic.storage.files import read_json

from .jobs import REPO, env_with, wait_for
from .prep_helpers import finish_all, request, run, text_rows, write_rows
from .s3server import s3_server, use_env

pytest.importorskip("boto3")
pytest.importorskip("moto")

BUCKET = "dje-out"
SECRET = "h21-secret-never-written"  # the server takes any key: this one must appear nowhere


def _quiet(*_: object) -> None:
    pass


@pytest.fixture(scope="module")
def server() -> Iterator[dict[str, str]]:
    with s3_server(BUCKET) as env:
        yield {**env, "AWS_SECRET_ACCESS_KEY": SECRET}


@pytest.fixture
def client(server: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    import boto3

    use_env(monkeypatch, server)
    return boto3.session.Session().client("s3")


def _job(tmp_path: Path, rows: int = 90, width: int = 40, shards: int = 6) -> JobDir:
    write_rows(tmp_path / "ds" / "a.jsonl", text_rows(rows, width=width))
    run(request(tmp_path / "ds", tmp_path / "job", shards))
    job = JobDir(tmp_path / "job")
    finish_all(job, hosts=("node-a", "node-b"))  # the real worker loop with the copy runner
    return job


def _get(client, key: str) -> bytes:
    return client.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def _no_secret(*places: Path) -> None:
    for place in places:
        for path in [place] if place.is_file() else place.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path


def test_one_object_is_the_local_merge_byte_for_byte_and_an_existing_one_is_refused(tmp_path: Path, client) -> None:
    job = _job(tmp_path)
    local = tmp_path / "local.jsonl"
    merge(job, str(local), log=_quiet)
    url = f"s3://{BUCKET}/out//one.jsonl"
    logs: list[str] = []
    result = merge(job, url, log=logs.append)
    data = _get(client, "out/one.jsonl")
    assert data == local.read_bytes() and result.output == f"s3://{BUCKET}/out/one.jsonl"
    record = read_json(job.merge_record_path)
    head = client.head_object(Bucket=BUCKET, Key="out/one.jsonl")
    assert record["output"] == result.output and record["bytes"] == len(data) == head["ContentLength"]
    assert record["etag"] == head["ETag"] and record["output_stat"] == {"size": len(data), "etag": head["ETag"]}
    assert merged_already(job, url) is not None
    merge(job, url, log=_quiet)  # this job dir's own output: replaced, saying so (export_target)
    client.put_object(Bucket=BUCKET, Key="out/one.jsonl", Body=b"someone else's\n")
    with pytest.raises(UserError, match="already exists and no merge of this job dir wrote it"):
        merge(job, url, log=_quiet)
    assert _get(client, "out/one.jsonl") == b"someone else's\n"
    merge(job, url, overwrite=True, log=_quiet)  # replaced: a new ETag stamps the record
    assert _get(client, "out/one.jsonl") == data and merged_already(job, url) is not None
    client.put_object(Bucket=BUCKET, Key="out/one.jsonl", Body=b"someone else's\n")
    assert merged_already(job, url) is None  # the object changed under the record
    assert not client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")
    _no_secret(job.root)
    assert not [line for line in logs if SECRET in line]


def test_folder_export_puts_the_local_folders_parts_and_success_last(tmp_path: Path, client) -> None:
    job = _job(tmp_path)
    local = tmp_path / "parts"
    merge(job, f"{local}/", log=_quiet)
    url = f"s3://{BUCKET}/folder/parts/"
    merge(job, url, log=_quiet)
    names = sorted(os.listdir(local))
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="folder/parts/")["Contents"]
    assert sorted(o["Key"].rsplit("/", 1)[1] for o in listed) == names and SUCCESS in names
    for name in names:
        assert _get(client, f"folder/parts/{name}") == (local / name).read_bytes(), name
    record = read_json(job.merge_record_path)
    assert record["kind"] == "folder" and record["output"] == f"s3://{BUCKET}/folder/parts"
    assert record["etag"] == client.head_object(Bucket=BUCKET, Key=f"folder/parts/{SUCCESS}")["ETag"]
    assert merged_already(job, url) is not None
    assert not (job.gen_dir / "s3-export").exists()  # the staged links are gone
    # a second export keeps every part; a foreign key in the prefix is refused
    before = {o["Key"]: o["ETag"] for o in listed}
    merge(job, url, overwrite=True, log=_quiet)
    after = client.list_objects_v2(Bucket=BUCKET, Prefix="folder/parts/")["Contents"]
    assert {o["Key"]: o["ETag"] for o in after} == before
    with pytest.raises(UserError, match="holds a complete export"):
        _other_export(job, url)
    client.put_object(Bucket=BUCKET, Key="folder/other/notes.txt", Body=b"x")
    with pytest.raises(UserError, match="not part files"):
        merge(job, f"s3://{BUCKET}/folder/other/", log=_quiet)
    _no_secret(job.root)


def _other_export(job: JobDir, url: str) -> None:
    """An export of other outputs into a complete prefix, without overwrite: its _SUCCESS differs."""
    from data_juicer_elastic.s3_export import upload_folder

    staged = job.root.parent / "staged"
    merge(job, f"{staged}/", log=_quiet)
    (staged / SUCCESS).write_bytes((staged / SUCCESS).read_bytes().replace(b'"rows"', b'"rows" ', 1))
    upload_folder(staged, url, overwrite=False, log=_quiet)


def test_parquet_one_file_is_the_local_parquet_byte_for_byte(tmp_path: Path, client) -> None:
    from .test_parquet_export import _finish, _rows

    write_rows(tmp_path / "ds" / "a.jsonl", _rows(60))
    run(request(tmp_path / "ds", tmp_path / "job", 4))
    job = JobDir(tmp_path / "job")
    _finish(job)
    local = tmp_path / "local.parquet"
    merge(job, str(local), log=_quiet)
    merge(job, f"s3://{BUCKET}/pq/merged.parquet", log=_quiet)
    assert _get(client, "pq/merged.parquet") == local.read_bytes()
    assert read_json(job.merge_record_path)["format"] == "parquet"
    assert verify(job).problems == []  # size and ETag match merge.json (a Parquet file has no sha256 there)
    client.put_object(Bucket=BUCKET, Key="pq/merged.parquet", Body=local.read_bytes()[:-1] + b"x")
    _problems(job, "pq/merged.parquet", "ETag")
    assert not [n for n in os.listdir(job.gen_dir) if "merged.parquet" in n]  # the local temp is gone


def _verify_cli(job: JobDir, server: dict[str, str]) -> subprocess.CompletedProcess:
    """``dj-elastic verify`` in its own process, the endpoint and credentials in its environment only."""
    return subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", "verify", "--job-dir", str(job.root)],
        cwd=REPO,
        env=env_with(**server),
        capture_output=True,
        text=True,
    )


def _problems(job: JobDir, *says: str) -> list[str]:
    """verify's problems, checked to be there, each naming every one of ``says``."""
    report = verify(job)
    assert not report.ok and report.complete and report.problems, report.problems
    for problem in report.problems:
        assert all(s in problem for s in says) and SECRET not in problem, (says, problem)
    return report.problems


def test_verify_re_reads_an_s3_folder_against_its_success(tmp_path: Path, client, server: dict[str, str]) -> None:
    job = _job(tmp_path)
    url = f"s3://{BUCKET}/verify/parts"
    merge(job, f"{url}/", log=_quiet)
    assert verify(job).problems == []
    parts = sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="verify/parts/part-")["Contents"])
    first, second = parts[0], parts[1]
    name = first.rsplit("/", 1)[1]
    data = _get(client, first)
    client.put_object(Bucket=BUCKET, Key=first, Body=data.replace(b"row", b"ROW", 1))  # same size, other bytes
    assert len(_get(client, first)) == len(data)
    _problems(job, f"{url}/{name}", "sha256", SUCCESS)
    cli = _verify_cli(job, server)
    assert cli.returncode == 2 and f"{url}/{name}" in cli.stderr, cli.stdout + cli.stderr
    assert SECRET not in cli.stdout + cli.stderr
    client.put_object(Bucket=BUCKET, Key=first, Body=data)  # restored: clean again
    assert verify(job).ok
    kept = _get(client, second)
    client.delete_object(Bucket=BUCKET, Key=second)
    gone = f"{url}/{second.rsplit('/', 1)[1]}"
    assert _problems(job, gone, "missing") == [f"{gone}: is missing ({SUCCESS} lists it); export the job again"]
    client.put_object(Bucket=BUCKET, Key=second, Body=kept)
    client.put_object(Bucket=BUCKET, Key="verify/parts/part-99999-of-99999.jsonl", Body=b"{}\n")
    client.put_object(Bucket=BUCKET, Key="verify/parts/notes.txt", Body=b"not a part: not reported")
    client.put_object(Bucket=BUCKET, Key="verify/parts-other/part-00000-of-00001.jsonl", Body=b"{}\n")
    extra = f"{url}: part files not in {SUCCESS}: part-99999-of-99999.jsonl; remove them or export again"
    assert _problems(job, url, "part-99999-of-99999.jsonl") == [extra]  # neither notes.txt nor parts-other/
    client.delete_object(Bucket=BUCKET, Key=f"verify/parts/{SUCCESS}")
    assert _problems(job, url, f"no {SUCCESS}: the export is not complete")
    assert _verify_cli(job, server).returncode == 2


def test_verify_refuses_an_s3_folder_that_holds_another_jobs_export(tmp_path: Path, client) -> None:
    job, other = _job(tmp_path / "a"), _job(tmp_path / "b", rows=60, width=10)
    url = f"s3://{BUCKET}/verify/replaced"
    merge(job, f"{url}/", log=_quiet)
    assert verify(job).problems == []
    merge(other, f"{url}/", overwrite=True, log=_quiet)  # another job's export, complete and self-consistent
    assert verify(other).ok
    (problem,) = _problems(job, f"{url}/{SUCCESS}", "merge.json", "ETag", f"--output {url}/ --overwrite")
    assert "is not the one merge.json recorded" in problem, problem
    merge(job, f"{url}/", overwrite=True, log=_quiet)  # what the line says to do
    assert verify(job).ok


def test_verify_checks_one_s3_object_against_merge_json(tmp_path: Path, client, server: dict[str, str]) -> None:
    job = _job(tmp_path)
    url = f"s3://{BUCKET}/verify/one.jsonl"
    merge(job, url, log=_quiet)
    assert verify(job).problems == []
    data = _get(client, "verify/one.jsonl")
    client.put_object(Bucket=BUCKET, Key="verify/one.jsonl", Body=data.replace(b"row", b"ROW", 1))  # same size
    (problem,) = _problems(job, url, "merge.json", "ETag", "sha256")
    assert "bytes" not in problem and "rows" not in problem, problem
    cli = _verify_cli(job, server)
    assert cli.returncode == 2 and url in cli.stderr and SECRET not in cli.stdout + cli.stderr, cli.stderr
    client.put_object(Bucket=BUCKET, Key="verify/one.jsonl", Body=data + b"{}\n")  # longer, one row more
    _problems(job, url, f"bytes {len(data) + 3}", "rows", "sha256")
    client.delete_object(Bucket=BUCKET, Key="verify/one.jsonl")
    assert _problems(job, url, "is gone")


KILLED = """
import sys
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.merge import merge
from data_juicer_elastic.storage import s3_upload
s3_upload.PART_SIZE = s3_upload.MIN_PART  # several parts, so the upload is under way a while
merge(JobDir(sys.argv[1]), sys.argv[2], log=print)
"""


def test_a_merge_killed_mid_upload_leaves_no_object_and_a_rerun_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    job = _job(tmp_path, rows=3000, width=4000, shards=4)  # about 12 MB: three parts of 5 MiB
    local = tmp_path / "local.jsonl"
    merge(job, str(local), log=_quiet)
    with s3_server(BUCKET, latency_ms=150) as env:  # a slow store: each request waits
        use_env(monkeypatch, env)
        client = boto3.session.Session().client("s3")
        url = f"s3://{BUCKET}/big.jsonl"
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLED, str(job.root), url], cwd=REPO, env=env_with(**env), start_new_session=True
        )
        try:
            wait_for(lambda: client.list_multipart_uploads(Bucket=BUCKET).get("Uploads"), "an upload", proc=proc)
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert "Contents" not in client.list_objects_v2(Bucket=BUCKET)  # no partial object
        assert read_json(job.merge_record_path)["output"] == str(local)  # the local merge: no S3 record
        stale = client.list_multipart_uploads(Bucket=BUCKET)["Uploads"]
        monkeypatch.setattr(s3_upload, "STALE_UPLOAD_SECS", 0.0)  # the killed one counts as stale now
        merge(job, url, log=_quiet)
        assert _get(client, "big.jsonl") == local.read_bytes()
        assert not client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")  # aborted, never completed
        assert len(stale) == 1 and read_json(job.merge_record_path)["output"] == url
        assert verify(job).problems == []  # about 12 MB re-hashed by growing ranged GETs, against merge.json


def test_export_path_may_be_s3_for_jsonl_parquet_and_folders_and_no_other_scheme() -> None:
    for ok in ("s3://b/out/r.jsonl", "s3://b/out/r.parquet", "s3://b/out/r/", "s3://b/out/r"):
        assert _export_problems({"export_path": ok}) == [], ok
    for bad, says in (
        ("gs://b/out/r.jsonl", "is remote"),
        ("oss://b/r.jsonl", "is remote"),
        ("s3://b/out/r.csv", "must be a file ending in .jsonl or .parquet"),
        ("s3://b", "s3://bucket/key"),
    ):
        problems = _export_problems({"export_path": bad})
        assert len(problems) == 1 and "export_path" in problems[0] and says in problems[0], (bad, problems)


@pytest.mark.slow
def test_dj_process_exports_to_the_store(tmp_path: Path, client, server: dict[str, str]) -> None:
    """The stock ``dj-process`` with ``export_path: s3://...``: the object is what ``dj-elastic merge`` of the
    same job dir writes locally; no credential in the job dir or the output."""
    from .reference import dj_process, elastic_recipe

    write_rows(tmp_path / "ds" / "a.jsonl", text_rows(40))
    url = f"s3://{BUCKET}/e2e/merged.jsonl"
    config = elastic_recipe(
        tmp_path / "r.yaml",
        tmp_path / "ds",
        url,
        tmp_path / "job",
        [{"whitespace_normalization_mapper": None}],  # type: ignore[arg-type]
    )
    out = dj_process("--config", str(config), cwd=tmp_path, env=server)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert f"merged into {url}" in out.stderr + out.stdout
    local = tmp_path / "local.jsonl"
    merge(JobDir(tmp_path / "job"), str(local), log=_quiet)
    assert _get(client, "e2e/merged.jsonl") == local.read_bytes() and len(local.read_bytes().splitlines()) == 40
    assert SECRET not in out.stdout + out.stderr
    _no_secret(tmp_path / "job")
