"""The front doors on a job dir given as an ``s3://`` URL (a moto server): ``dj-process`` and ``dj-elastic``.

Two stock ``dj-process --config recipe.yaml`` nodes (tests/nodes.py) with ``elastic_shard.job_dir:
s3://...``, a local input and a local export, must export the bytes one node writes for the same recipe on
a local job dir. A store that lets a second create through is refused by the start-up probe before
anything is written: ``dj-elastic`` exits 2 naming the endpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from data_juicer_elastic.storage.store import store_for

from .nodes import Nodes
from .reference import REPO, env_with
from .s3server import s3_server, use_env
from .test_store_contract import BUCKET, moto_env, moto_env_no_create_once  # noqa: F401 (the servers)

pytest.importorskip("boto3")
pytest.importorskip("moto")

CAPABILITIES = "create-once yes, If-Match yes"  # the probe's line on moto (storage/probe.py Capabilities.line)


def aws_env(env: dict[str, str]) -> dict[str, str]:
    """The server's env for a child process, with no profile or credential file of this machine."""
    return {**env, "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


def test_a_store_without_create_once_is_refused_before_anything_is_written(
    tmp_path: Path,
    moto_env_no_create_once: dict[str, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
):
    url = f"s3://{BUCKET}/jobs/{uuid.uuid4().hex[:12]}"
    for command in ("status", "worker"):
        out = subprocess.run(
            [sys.executable, "-m", "data_juicer_elastic.cli", command, "--job-dir", url],
            cwd=REPO,
            env=env_with(**aws_env(moto_env_no_create_once)),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 2, out.stdout + out.stderr[-3000:]
        endpoint = moto_env_no_create_once["AWS_ENDPOINT_URL"]
        assert f"dj-elastic {command}: error: {url} (endpoint {endpoint})" in out.stderr, out.stderr[-3000:]
        assert "accepted a second create" in out.stderr and "create-once yes" not in out.stderr
    use_env(monkeypatch, moto_env_no_create_once)
    assert list(store_for(url).list("")) == []  # the probe's key deleted, nothing else written


def verify_cli(url: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``dj-elastic verify`` of the job dir ``url`` on the server ``env`` names, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", "verify", "--job-dir", url],
        cwd=REPO,
        env=env_with(**aws_env(env)),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_store_with_create_once_is_probed_once_per_command(
    moto_env: dict[str, str],  # noqa: F811
):
    """``verify`` reads the job twice: one probe, one capability line (on stderr: stdout stays the command's)."""
    url = f"s3://{BUCKET}/jobs/{uuid.uuid4().hex[:12]}"
    out = verify_cli(url, moto_env)
    assert out.stderr.count(f"store: {url} (endpoint {moto_env['AWS_ENDPOINT_URL']}): {CAPABILITIES}") == 1, out.stderr[
        -3000:
    ]
    assert "store:" not in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_dj_process_nodes_on_an_s3_job_dir_export_the_bytes_of_a_local_job_dir(tmp_path: Path):
    url = f"s3://{BUCKET}/jobs/{uuid.uuid4().hex[:12]}"
    on_store = Nodes(tmp_path / "s3", job_dir=url)
    on_disk = Nodes(tmp_path / "disk")
    with s3_server(BUCKET) as server:
        try:
            nodes = [on_store.start(host, **aws_env(server)) for host in ("node-a", "node-b")]
            alone = on_disk.start("node-a")  # the same job on a local job dir, at the same time: nothing shared
            codes = [node.wait(900) for node in nodes]
            assert alone.wait(900) == 0, on_disk.logs()
        finally:
            on_store.stop_all()
            on_disk.stop_all()
    assert codes == [0, 0], on_store.logs()
    for node in nodes:
        assert node.output.count(f"store: {url} (endpoint {server['AWS_ENDPOINT_URL']}): {CAPABILITIES}") == 1
        assert node.result().startswith(f"{on_store.shards} shards completed by"), node.result()
    assert not on_store.job.root.exists() and not (tmp_path / "s3" / "s3:").exists()  # no local job folder
    assert on_store.export.read_bytes() == on_disk.export.read_bytes()
    assert on_store.export.stat().st_size > 0
