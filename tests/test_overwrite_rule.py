"""No output lost by surprise (issue 44, ``export_target``), locally and on S3, through the coordinated run
(``JobSpec``'s default, as ``dj-process`` runs it) and ``merge``: an output no merge of this job dir wrote is
refused and kept byte for byte unless overwrite is asked; this job's own earlier output (another recipe
generation's) is replaced with one line naming that generation, which can still be merged again; a rerun of
a finished job rewrites nothing."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic import s3_export
from data_juicer_elastic.export_target import stamp_now
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.merge import merge
from data_juicer_elastic.s3_export import is_s3
from data_juicer_elastic.storage.store import store_for

from .cluster import Cluster, count, finish
from .s3server import use_env
from .test_store_contract import BUCKET, moto_env  # noqa: F401 (moto_env: the server, one per module)

FOREIGN = b'{"text": "someone else\'s"}\n'


@pytest.fixture(params=["local", "s3"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    export = None
    if request.param == "s3":
        use_env(monkeypatch, request.getfixturevalue("moto_env"))  # the nodes inherit the server's settings
        export = f"s3://{BUCKET}/ow/{uuid.uuid4().hex[:12]}/merged.jsonl"
    return Cluster(tmp_path, rows=24, shards=3, export=export)


def _put(where: str, data: bytes) -> None:
    if is_s3(where):
        store_for(os.path.dirname(where)).replace(os.path.basename(where), data)
    else:
        Path(where).parent.mkdir(parents=True, exist_ok=True)
        Path(where).write_bytes(data)


def stamp(where: str) -> dict | None:
    return stamp_now(s3_export.location(where), folder=False)


def _projects(c: Cluster) -> set[str]:
    return {orjson.loads(line)["project"] for line in (c.exported() or b"").splitlines()}


def test_a_foreign_output_is_refused_and_kept_until_overwrite_is_asked(cluster: Cluster) -> None:
    c = cluster
    _put(c.export_to, FOREIGN)
    nodes = c.start(["node-0"])
    assert finish(nodes) == [2], [n.output for n in nodes]
    refusal = f"{c.export_to}: already exists and no merge of this job dir wrote it; set elastic_shard.overwrite_output"
    assert count(nodes, refusal) == 1, nodes[0].output
    assert "Traceback" not in nodes[0].output and c.exported() == FOREIGN  # kept byte for byte
    said: list[str] = []
    merge(JobDir(c.job.root), c.export_to, overwrite=True, log=said.append)  # `dj-elastic merge --overwrite`
    assert c.exported() == c.expected() and not any("replacing" in line for line in said)


def test_own_earlier_generation_is_replaced_saying_so_and_can_be_merged_again(cluster: Cluster) -> None:
    c = cluster
    first = c.start(["node-0"], "--runner", "project", "--project", "alpha", run_id="r1")
    assert finish(first) == [0], [n.output for n in first]
    gen_a = JobDir(c.job.root).generation
    second = c.start(["node-0"], "--runner", "project", "--project", "beta", run_id="r2")
    assert finish(second) == [0], [n.output for n in second]
    gen_b = JobDir(c.job.root).generation
    assert gen_b != gen_a and _projects(c) == {"beta"}
    assert count(second, f"{c.export_to}: replacing generation {gen_a}'s output") == 1, second[0].output
    said: list[str] = []
    merge(JobDir(c.job.root, gen_a), c.export_to, log=said.append)  # the replaced generation, merged again
    assert _projects(c) == {"alpha"} and said[0].startswith(f"{c.export_to}: replacing generation {gen_b}'s output")
    before = stamp(c.export_to)
    third = c.start(["node-0"], "--runner", "project", "--project", "alpha", run_id="r3")  # a finished job again
    assert finish(third) == [0], [n.output for n in third]
    assert stamp(c.export_to) == before and count(third, "replacing") == 0  # rewrote nothing
