"""Chaos on the store (docs/OBJECT_STORE.md section 6 step 12): the whole coordinated job, several node
processes racing on one ``s3://`` job dir on a moto server and on Ceph RGW (tests/rgw.py), and kills.

Each node is a ``tests.coord_node`` process (the real ``run_job`` with toy runners, no Ray) given
``--job-dir s3://...``; it inherits the server's environment. The elections, the prepare, the leases, the
records, each attempt's files (run in node-local scratch, uploaded) and the merge's reads all go through the
store: a local file call on the job dir raises TypeError (``ObjectPath``), which a node reports as a failure.
Every test ends with each shard done exactly once and the merged export equal to the input.
"""

from __future__ import annotations

import os
import re
import signal
import uuid
from pathlib import Path

import pytest

from data_juicer_elastic.job.records.done import load_done
from data_juicer_elastic.prepare.existing import prepared_shard_count

from ..cluster import Cluster, count, done_hosts, finish, outcomes
from ..jobs import wait_for
from ..s3server import use_env
from ..test_store_contract import BUCKET, moto_env  # noqa: F401 (moto_env: the server, one per module)


@pytest.fixture(params=["moto", "rgw"])
def s3_url(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh prefix of each server's bucket (moto, Ceph RGW); this process and its nodes talk to it."""
    use_env(monkeypatch, request.getfixturevalue(f"{request.param}_env"))
    return f"s3://{BUCKET}/chaos/{uuid.uuid4().hex[:12]}"


def _nothing_local(c: Cluster, url: str) -> None:
    """No node wrote the job dir on the local disk: not at the path an ``ObjectPath`` spells
    (``/<bucket>/<prefix>``, where ``Path(job.root)`` would put it), nor at the cluster's default."""
    assert not Path(url.replace("s3://", "/", 1)).exists() and not (c.tmp / "job").exists()


def _done_once(c: Cluster) -> dict[str, list[str]]:
    """Every shard of the manifest has a done record, and exactly one of its attempts says done."""
    shards = c.job.manifest().shards.ids()
    assert c.job.done_ids() == set(shards)
    got = outcomes(c.job)
    assert sorted(got) == sorted(shards) and all(o.count("done") == 1 for o in got.values()), got
    return got


def test_four_nodes_on_an_s3_job_dir_every_shard_once_merged_once(tmp_path: Path, s3_url: str):
    c = Cluster(tmp_path, rows=160, shards=16, job_dir=s3_url, export=f"{s3_url}-export/merged.jsonl")
    nodes = c.start([f"node-{i}" for i in range(4)], "--nodes", "4")
    assert finish(nodes) == [0, 0, 0, 0], [n.output for n in nodes]
    assert count(nodes, "elected as prepare coordinator") == 1
    assert count(nodes, "elected as finalize coordinator") == 1 and count(nodes, "merged 16 shards,") == 1
    assert all(o == ["done"] for o in _done_once(c).values())
    assert sum(done_hosts(c.job).values()) == 16
    finals = {n.last_line() for n in nodes}
    assert len(finals) == 1 and finals.pop().startswith("PASS: 16 shards completed by"), finals
    assert c.exported() == c.expected()
    assert not c.export.parent.exists()
    _nothing_local(c, s3_url)
    assert prepared_shard_count(s3_url) == 16 and prepared_shard_count(f"{s3_url}-none") is None


def test_a_node_killed_mid_shard_its_lease_is_taken_over_after_the_lapse(tmp_path: Path, s3_url: str):
    c = Cluster(tmp_path, rows=80, shards=8, job_dir=s3_url)
    common = ("--lock-timeout", "3")
    # alone, it prepares, then holds its first shard (slow_copy waits for a file that never appears)
    victim = c.start_one("node-0", *common, "--runner", "slow_copy", DJE_TEST_HOLD=str(tmp_path / "never"))
    line = wait_for(
        lambda: re.search(r"claimed (\S+) attempt 0001", victim.output), "a claim", proc=victim.proc, log=victim.log
    )
    held = line.group(1)
    victim.kill()  # kill -9, the node whole
    assert victim.proc.returncode == -signal.SIGKILL
    others = c.start(["node-1", "node-2", "node-3"], *common)
    assert finish(others) == [0, 0, 0], [n.output for n in others]
    got = _done_once(c)
    assert got[held][0] in ("running", "missing"), got  # the killed attempt never ended
    record = load_done(c.job, held)
    assert record is not None and record.attempt >= 2 and record.host != "node-0", record
    assert "node-0" not in done_hosts(c.job)
    assert count(others, "elected as finalize coordinator") == 1
    assert c.exported() == c.expected()
    _nothing_local(c, s3_url)


def test_finalize_coordinator_killed_mid_merge_then_a_new_run_merges_once(tmp_path: Path, s3_url: str):
    c = Cluster(tmp_path, rows=80, shards=8, job_dir=s3_url)
    c.export.parent.mkdir()
    # every node would kill itself half way through a merge; only the finalize coordinator merges
    nodes = c.start(["node-0", "node-1", "node-2"], "--signal-mid-merge", "KILL", "--wait-timeout", "5", run_id="first")
    codes = sorted(n.wait(180) for n in nodes)
    assert codes == sorted([-signal.SIGKILL, 2, 2]), [n.output for n in nodes]
    [victim] = [n for n in nodes if n.proc.returncode == -signal.SIGKILL]
    assert "elected as finalize coordinator" in victim.output
    for n in nodes:
        if n is not victim:
            line = n.last_line()
            assert "heartbeat stopped" in line and f"pid={victim.proc.pid}" in line, line
    assert c.exported() is None, "a partial merged output is visible"
    assert os.listdir(c.export.parent), "killed before its merge made a temp file"  # the kill was inside it
    before = outcomes(c.job)

    again = c.start(["node-0", "node-1"], run_id="second")
    assert finish(again) == [0, 0], [n.output for n in again]
    assert c.exported() == c.expected()
    assert outcomes(c.job) == before, "the new run redid shards"
    assert count(again, "elected as finalize coordinator") == 1 and count(again, "merged 8 shards,") == 1
    _nothing_local(c, s3_url)
