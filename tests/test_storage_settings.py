"""``elastic_shard.storage`` (issue 36): endpoint, region, addressing style and dialect of every S3 client.

The recipe's block (and ``dj-elastic --endpoint-url``) becomes the process's environment, which every store
reads and every child inherits; unknown keys are refused as other ``elastic_shard`` keys are. The ``oss``
dialect is checked by the headers botocore sends (a ``before-send`` hook, as
tests/benchmarks/bench_s3_requests.py counts requests): moto does not enforce ``x-oss-forbid-overwrite``,
so what OSS does with them is not tested here (docs/OBJECT_STORE.md names the sources). A small job on S3
with fake credentials leaves neither key in any object it wrote nor in its processes' output.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.storage.dialects import FORBID_OVERWRITE, NoCompareAndSwap
from data_juicer_elastic.storage.probe import StoreRefused, probe_once
from data_juicer_elastic.storage.s3 import S3Store
from data_juicer_elastic.storage.s3_upload import MIN_PART, MultipartWrite
from data_juicer_elastic.storage.settings import DIALECT_ENV, ENDPOINT_ENVS, REGION_ENVS, StorageSettings
from data_juicer_elastic.storage.store import store_for

from .jobs import make_job
from .reference import REPO, env_with
from .s3server import use_env
from .test_jobdir_s3 import mirror
from .test_plugin import one_op_recipe, parse  # noqa: F401 (parse: Data-Juicer's init_configs, a fixture)
from .test_store_contract import BUCKET, moto_env  # noqa: F401 (moto_env: the server, one per module)

pytest.importorskip("boto3")
pytest.importorskip("moto")

OURS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", DIALECT_ENV)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No S3 setting in the environment; whatever a test applies is undone after it (``delenv`` alone records
    nothing for a variable that was not set, so a ``setenv`` first makes the undo delete what ``apply`` wrote)."""
    for name in (*OURS, "DJ_ELASTIC_S3_ADDRESSING_STYLE"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


# --------------------------------------------------------------------------- the settings and the recipe block
def test_settings_come_from_the_environment_and_apply_back_to_it():
    env = {"AWS_ENDPOINT_URL": "http://minio.lan:9000", "AWS_DEFAULT_REGION": "eu-1", DIALECT_ENV: "oss"}
    got = StorageSettings.from_env(env)
    assert got == StorageSettings("http://minio.lan:9000", "eu-1", None, "oss") and got.dialect_name == "oss"
    assert (
        StorageSettings.from_env({"AWS_ENDPOINT_URL_S3": "https://a", "AWS_ENDPOINT_URL": "https://b"}).endpoint_url
        == "https://a"
    )
    assert StorageSettings.from_env({}).dialect_name == "s3"
    out: dict[str, str] = {"AWS_REGION": "kept"}
    StorageSettings(endpoint_url="https://oss-cn-hangzhou.aliyuncs.com", addressing_style="virtual").apply(out)
    # S3's own variable only: the generic AWS_ENDPOINT_URL would send every service (STS, for a role) there
    assert [out.get(n) for n in ENDPOINT_ENVS] == ["https://oss-cn-hangzhou.aliyuncs.com", None]
    assert out["AWS_REGION"] == "kept"
    assert StorageSettings.from_env(out).addressing_style == "virtual"  # what a child process reads back
    StorageSettings(region="us-west-2").apply(out)
    assert [out[n] for n in REGION_ENVS] == ["us-west-2"] * 2


@pytest.mark.parametrize(
    "endpoint, problem",
    [
        ("http://AKIAH43:s3cr3t-h43@minio.lan:9000", "the URL holds credentials"),
        ("minio.lan:9000", "is not an http(s) URL"),
        ("https://minio.lan/?x=1", "takes no query"),
    ],
)
def test_a_bad_endpoint_is_named_and_a_credential_never_echoed(endpoint: str, problem: str):
    found = StorageSettings(endpoint_url=endpoint).problems()
    assert len(found) == 1 and found[0].startswith("elastic_shard.storage.endpoint_url: ") and problem in found[0]
    assert "s3cr3t" not in found[0]
    with pytest.raises(UserError, match="endpoint_url"):
        S3Store(BUCKET, "", StorageSettings(endpoint_url=endpoint))


def test_the_recipe_block_is_parsed_and_typed(tmp_path, parse):  # noqa: F811
    from data_juicer_elastic.plugin.schema import settings_from_cfg

    block = {"endpoint_url": "http://minio.lan:9000", "region": "eu-1", "addressing_style": "path", "dialect": "oss"}
    recipe = one_op_recipe(tmp_path, elastic_shard={"job_dir": str(tmp_path / "job"), "storage": block})
    assert settings_from_cfg(parse("--config", str(recipe))).storage == StorageSettings(**block)
    plain = parse("--config", str(one_op_recipe(tmp_path)))
    assert settings_from_cfg(plain).storage == StorageSettings()  # no block: the environment's


@pytest.mark.parametrize(
    "storage, named",
    [
        ({"endpoint": "http://minio.lan:9000"}, "elastic_shard.storage.endpoint"),
        ({"dialect": "gcs"}, "elastic_shard.storage.dialect"),
        ({"addressing_style": "dns"}, "elastic_shard.storage.addressing_style"),
    ],
)
def test_an_unknown_key_or_value_of_the_block_is_refused_naming_it(tmp_path, parse, capsys, storage, named):  # noqa: F811
    recipe = one_op_recipe(tmp_path, elastic_shard={"job_dir": str(tmp_path / "job"), "storage": storage})
    with pytest.raises(SystemExit) as exc:
        parse("--config", str(recipe))
    assert exc.value.code == 2 and named in capsys.readouterr().err


def test_a_value_where_the_block_belongs_is_refused_naming_it(tmp_path, parse):  # noqa: F811
    recipe = one_op_recipe(tmp_path, elastic_shard={"job_dir": str(tmp_path / "job"), "storage": "http://m.lan:9000"})
    with pytest.raises(UserError, match=r"elastic_shard\.storage: got 'http://m\.lan:9000'; it is a block"):
        parse("--config", str(recipe))


def test_credentials_in_the_endpoint_are_refused_at_parse_time_unechoed(tmp_path, parse):  # noqa: F811
    storage = {"endpoint_url": "http://AKIAH43:s3cr3t-h43@minio.lan:9000"}
    recipe = one_op_recipe(tmp_path, elastic_shard={"job_dir": str(tmp_path / "job"), "storage": storage})
    with pytest.raises(UserError, match=r"elastic_shard\.storage\.endpoint_url: the URL holds credentials") as exc:
        parse("--config", str(recipe))
    assert "s3cr3t" not in str(exc.value) and not (tmp_path / "job").exists()


def test_the_executor_makes_the_block_the_process_settings(tmp_path, parse, clean_env):  # noqa: F811
    """``job_spec`` applies the block before any store is built: ``store_for`` then speaks to that endpoint in
    that dialect, and a child process (prepare's, a local Ray) inherits it through the environment."""
    from data_juicer_elastic.plugin.executor import job_spec

    block = {"endpoint_url": "http://127.0.0.1:9", "dialect": "oss", "region": "eu-1"}
    recipe = one_op_recipe(tmp_path, elastic_shard={"job_dir": str(tmp_path / "job"), "storage": block})
    job_spec(parse("--config", str(recipe)), "process: []\n")
    store = store_for(f"s3://{BUCKET}/jobs/x")
    assert (
        isinstance(store, S3Store)
        and store.describe() == f"s3://{BUCKET}/jobs/x (endpoint http://127.0.0.1:9, dialect oss)"
    )
    assert store.client.meta.region_name == "eu-1"
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from data_juicer_elastic.storage.settings import StorageSettings as S; print(S.from_env())",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env_with(),
    )
    assert "endpoint_url='http://127.0.0.1:9'" in child.stdout and "dialect='oss'" in child.stdout


# --------------------------------------------------------------------------- the dialects, by the headers sent
class Sent:
    """Every request's operation and headers, as botocore sends them (after the dialect's hook)."""

    def __init__(self, store: S3Store) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        store.client.meta.events.register("before-send.s3", self.on_send)

    def on_send(self, event_name: str, request: Any, **_: Any) -> None:
        headers = {k.lower(): v.decode() if isinstance(v, bytes) else str(v) for k, v in request.headers.items()}
        self.requests.append((event_name.rsplit(".", 1)[-1], headers))

    def of(self, op: str) -> list[dict[str, str]]:
        return [h for o, h in self.requests if o == op]


def store_in(dialect: str, moto_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[S3Store, Sent]:  # noqa: F811
    use_env(monkeypatch, moto_env)
    store = S3Store(BUCKET, f"jobs/{uuid.uuid4().hex[:12]}", StorageSettings(dialect=dialect))
    store.conditions()  # the startup probe's own requests first (once an endpoint), so only the test's are seen
    return store, Sent(store)


def multipart(store: S3Store, key: str, expect: str | None) -> None:
    with MultipartWrite(store, key, expect, MIN_PART) as up:
        up.write(b"row\n" * 10)
        up.complete()


def test_the_s3_dialect_sends_if_none_match_and_if_match(moto_env, monkeypatch):  # noqa: F811
    store, sent = store_in("s3", moto_env, monkeypatch)
    assert store.create("a", b"1\n") is not None and store.create("a", b"2\n") is None
    ver = store.head("a").ver  # type: ignore[union-attr]
    assert store.replace("a", b"3\n", if_ver=ver) is not None
    multipart(store, "big", None)
    puts = sent.of("PutObject")
    assert [h.get("if-none-match") for h in puts] == ["*", "*", None] and puts[2]["if-match"] == ver
    assert not any(FORBID_OVERWRITE in h for _, h in sent.requests)
    [initiate], [complete] = sent.of("CreateMultipartUpload"), sent.of("CompleteMultipartUpload")
    assert "if-none-match" not in initiate and complete["if-none-match"] == "*"  # S3 has no precondition on Initiate


def test_the_oss_dialect_sends_forbid_overwrite_and_never_a_precondition(moto_env, monkeypatch):  # noqa: F811
    store, sent = store_in("oss", moto_env, monkeypatch)
    assert store.create("a", b"1\n") is not None
    multipart(store, "big", None)  # create-once: the header on Initiate and on Complete
    multipart(store, "big", store.head("big").ver)  # type: ignore[union-attr]  # a replace the merge saw: no header
    [put] = sent.of("PutObject")
    first, second = sent.of("CreateMultipartUpload"), sent.of("CompleteMultipartUpload")
    for h in (put, first[0], second[0]):
        assert h[FORBID_OVERWRITE] == "true" and "if-none-match" not in h and "if-match" not in h
    assert FORBID_OVERWRITE not in first[1] and FORBID_OVERWRITE not in second[1] and "if-match" not in second[1]
    assert store.create("a", b"2\n") is not None, "moto does not enforce x-oss-forbid-overwrite (OSS answers 409)"
    before = len(sent.requests)
    with pytest.raises(NoCompareAndSwap, match="no compare-and-swap"):
        store.replace("a", b"3\n", if_ver=store.head("a").ver)  # type: ignore[union-attr]
    assert [op for op, _ in sent.requests[before:]] == ["HeadObject"]  # the conditional PUT was never sent


def test_the_probe_refuses_an_oss_job_dir_before_any_request(moto_env, monkeypatch):  # noqa: F811
    """OSS has no compare-and-swap on a write, so lease renewals would race: a job dir there is refused by
    the probe (exit 2 through StoreRefused), naming the store and where the job dir may go instead."""
    store, sent = store_in("oss", moto_env, monkeypatch)
    with pytest.raises(StoreRefused) as exc:
        probe_once(store, print)
    message = str(exc.value)
    assert message.startswith(
        f"{store.url} (endpoint {moto_env['AWS_ENDPOINT_URL']}, dialect oss): storage dialect oss"
    )
    assert "lease renewals could race" in message and "AWS S3, MinIO or a shared POSIX directory" in message
    assert sent.requests == []


# --------------------------------------------------------------------------- nothing secret written
KEY_ID, SECRET = "AKIADJEH43FAKEKEYIDX", "dje-h43-fake-secret-ZmFrZSBzZWNyZXQ"


def test_a_job_on_s3_writes_no_credential_anywhere(tmp_path, moto_env, monkeypatch):  # noqa: F811
    """A worker and a merge (``dj-elastic``, the endpoint by ``--endpoint-url`` only) on an s3:// job dir with
    fake keys in the environment: no object in the bucket and no line of their output holds either key; the
    endpoint is named (the probe's line)."""
    env = {**moto_env, "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET}
    endpoint = env.pop("AWS_ENDPOINT_URL")
    local = make_job(tmp_path, rows=40, shards=4)
    url, _ = mirror(local, monkeypatch, {**env, "AWS_ENDPOINT_URL": endpoint})
    child = env_with(**env, AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null")
    child.pop("AWS_ENDPOINT_URL", None)
    child.pop("AWS_ENDPOINT_URL_S3", None)
    cli = [sys.executable, "-m", "data_juicer_elastic.cli"]
    out = ""
    for args in (
        ["worker", "--runner", "tests.runners:copy"],
        ["merge", "--output", f"{url}-export/merged.jsonl"],
        ["status", "--shards"],
    ):
        done = subprocess.run(
            [*cli, args[0], "--job-dir", url, "--endpoint-url", endpoint, *args[1:]],
            cwd=REPO,
            env=child,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        out += done.stdout + done.stderr
    assert f"(endpoint {endpoint})" in out
    client = S3Store(BUCKET, "", StorageSettings(endpoint_url=endpoint)).client
    keys = [
        o["Key"] for p in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET) for o in p.get("Contents", ())
    ]
    ours = [k for k in keys if k.startswith(url.removeprefix(f"s3://{BUCKET}/"))]
    assert any(k.endswith("merged.jsonl") for k in ours) and any("/done/" in k for k in ours), ours
    for key in ours:
        body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        assert KEY_ID.encode() not in body and SECRET.encode() not in body, key
    assert KEY_ID not in out and SECRET not in out
    scratch = [p for p in Path(tmp_path).rglob("*") if p.is_file()]
    assert not any(SECRET.encode() in p.read_bytes() for p in scratch)
