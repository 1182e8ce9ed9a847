"""Issue 43's headline on a real S3 server: everything on the store, one node killed -9 mid-shard, restarted.

Two stock ``dj-process --config recipe.yaml`` nodes (tests/nodes.py) with the job dir, the input
(``dataset_path``) and the export (``export_path``) all under one prefix of the server's bucket, on moto and on
Ceph RGW 16.2.15 (tests/rgw.py). Node A is held inside its first shard by the gate operator; once its attempt
record on the store says ``running`` it is killed whole (SIGKILL, its Ray with it) and started again. Both final
processes must exit 0, ``dj-elastic verify`` must pass, and the exported object must hold the bytes the same
recipe exports from a local job dir to a local file. Each node logs the probe's capability line once: on RGW it
names what the server ignores (DELETE If-Match, Complete and Copy If-None-Match).
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest
import yaml

from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.attempt import load_attempt
from data_juicer_elastic.job.records.done import load_done
from data_juicer_elastic.storage.store import store_for

from .jobs import wait_for
from .nodes import Nodes
from .s3server import use_env
from .test_dj_process_s3 import aws_env, verify_cli
from .test_store_contract import BUCKET, moto_env  # noqa: F401 (the moto server, one per module)

pytest.importorskip("boto3")
pytest.importorskip("moto")
pytestmark = pytest.mark.slow

# What each server honours, as the probe's line says it (storage/conditions.py Capabilities.line)
SAYS = {
    "moto": "If-Match yes (ETag quoted), GET If-Match yes, DELETE If-Match yes",
    "rgw": "If-Match yes (ETag unquoted), GET If-Match yes, DELETE If-Match no, Complete If-None-Match no, "
    "Copy If-None-Match no",
}


@pytest.fixture(params=["moto", "rgw"])
def server(request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    """(name, env) of each S3 server: moto, and Ceph RGW (``rgw_env``, tests/conftest.py)."""
    return request.param, request.getfixturevalue(f"{request.param}_env")


def on_the_store(nodes: Nodes, prefix: str) -> tuple[str, str]:
    """Put the nodes' input under ``prefix`` and point their recipe at it, the job dir and the export there
    too; returns (job dir URL, export URL)."""
    job, export = f"{prefix}/job", f"{prefix}/out/merged.jsonl"
    store_for(f"{prefix}/input").replace("corpus.jsonl", nodes.dataset.read_bytes())
    recipe = yaml.safe_load(nodes.recipe.read_text())
    recipe["dataset_path"], recipe["export_path"] = f"{prefix}/input/corpus.jsonl", export
    recipe["elastic_shard"]["job_dir"] = job
    nodes.recipe.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return job, export


def running_attempt_of(job: JobDir, host: str) -> tuple[str, int] | None:
    """(shard, attempt) of an attempt record on the store naming ``host`` that says ``running``."""
    for sid in job.manifest().shards.ids():
        for attempt in (1, 2, 3):
            record = load_attempt(job, sid, attempt)
            if record is not None and record.host == host and record.outcome == "running":
                return sid, attempt
    return None


@pytest.mark.timeout(2400)
def test_all_on_s3_one_node_killed_mid_shard_and_restarted_exports_the_local_bytes(
    tmp_path: Path, server: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
):
    name, env = server
    use_env(monkeypatch, env)  # this process reads the job's records and the export on the store
    on_store, on_disk = Nodes(tmp_path / "s3"), Nodes(tmp_path / "disk")
    url, export = on_the_store(on_store, f"s3://{BUCKET}/rgw-job/{uuid.uuid4().hex[:12]}")
    job = JobDir(url)
    try:
        a = on_store.start("node-a", gated=True, **aws_env(env))
        b = on_store.start("node-b", **aws_env(env))
        alone = on_disk.start("node-a")  # the same recipe on a local job dir, input and export: nothing shared
        assert a.gate is not None
        wait_for(lambda: (a.gate / "entered").exists(), "node-a inside a shard", timeout=900, proc=a.proc, log=a.log)
        shard, attempt = wait_for(lambda: running_attempt_of(job, "node-a"), "node-a's running attempt", timeout=300)
        a.signal(signal.SIGKILL)
        assert a.wait() == -signal.SIGKILL
        again = on_store.start("node-a", **aws_env(env))
        codes = [b.wait(1200), again.wait(1200)]
        assert alone.wait(1200) == 0, on_disk.logs()
    finally:
        on_store.stop_all()
        on_disk.stop_all()
    assert codes == [0, 0], on_store.logs()
    for node in (a, b, again):
        line = f"store: {url} (endpoint {env['AWS_ENDPOINT_URL']}): create-once yes, {SAYS[name]}"
        assert node.output.count(line) == 1, node.tail()
    for node in (b, again):
        assert node.result().startswith(f"{on_store.shards} shards completed by"), node.result()
    killed = load_attempt(job, shard, attempt)
    assert killed is not None and killed.outcome == "running"  # killed inside it: it never finished
    done = load_done(job, shard)
    assert done is not None and done.attempt > attempt, done  # taken over by a later attempt
    cli = verify_cli(url, env)
    assert cli.returncode == 0, cli.stdout + cli.stderr[-3000:]
    found = store_for(export.rsplit("/", 1)[0]).read("merged.jsonl")
    assert found is not None and found[0] == on_disk.export.read_bytes() and found[0]
    assert not (tmp_path / "s3" / "job").exists() and not (tmp_path / "s3" / "out").exists()  # nothing local
