"""The versions prepare records, checked again by every worker: a node with others refuses, unless allowed."""

from __future__ import annotations

import pytest

from data_juicer_elastic.cli import main as cli_main
from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.versions import check_versions, current_versions

from .cluster import Cluster, finish
from .jobs import attempt_outcomes, make_job

OTHER = {**current_versions(), "data_juicer": "0.0.1"}


def test_test_jobs_record_this_nodes_versions(tmp_path):
    assert make_job(tmp_path, rows=10, shards=1).manifest().versions == current_versions()


def test_check_names_each_difference_and_the_switch():
    assert check_versions(current_versions()) == []
    with pytest.raises(UserError) as err:
        check_versions(OTHER)
    here = current_versions()["data_juicer"]
    assert f"data_juicer: 0.0.1 in the manifest, {here} on this node" in str(err.value)
    assert "allow_version_mismatch" in str(err.value) and "data_juicer_elastic" not in str(err.value)
    assert check_versions(OTHER, allow_mismatch=True) == [f"data_juicer: 0.0.1 in the manifest, {here} on this node"]


def test_a_worker_with_other_versions_refuses_unless_allowed(tmp_path, capsys):
    job = make_job(tmp_path, rows=20, shards=2, versions=OTHER)
    args = ["worker", "--job-dir", str(job.root), "--runner", "tests.runners:copy"]
    assert cli_main(args) == 2
    assert "version mismatch" in capsys.readouterr().err
    assert not job.attempts_dir.exists() or not any(job.attempts_dir.iterdir()), "it claimed a shard"
    assert cli_main([*args, "--allow-version-mismatch"]) == 0
    assert all(o == ["done"] for o in attempt_outcomes(job).values())


def test_a_coordinated_run_prepared_with_other_versions_stops_naming_them_unless_allowed(tmp_path):
    c = Cluster(tmp_path, rows=20, shards=2)
    [node] = c.start(["node-0"], "--recorded-version", "0.0.1", run_id="first")
    assert finish([node]) == [2], node.output
    assert "version mismatch" in node.last_line() and "data_juicer: 0.0.1 in the manifest" in node.last_line()
    assert not c.export.exists()
    [node] = c.start(["node-0"], "--recorded-version", "0.0.1", "--allow-version-mismatch", run_id="second")
    assert finish([node]) == [0], node.output
    assert c.export.read_bytes() == c.dataset.read_bytes()
