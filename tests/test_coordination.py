"""Coordination with simulated nodes: real processes, distinct hostnames, one shared directory."""

from __future__ import annotations

import os
import re
import signal

import orjson
import pytest

from data_juicer_elastic.coordination.run_id import resolve_run_id, safe_key
from data_juicer_elastic.coordination.spec import strict_split_ok
from data_juicer_elastic.errors import UserError
from data_juicer_elastic.report import REPORT_NAME

from .cluster import Cluster, count, done_hosts, finish
from .coord_summary import run_summaries
from .jobs import attempt_outcomes, wait_for

# whole jobs ---------------------------------------------------------------------------------------


def test_four_nodes_elastic_every_shard_once_merged_once_same_exit_code(tmp_path):
    c = Cluster(tmp_path, rows=320, shards=16)
    # each host's first shard waits until all four hold a lease, so every node must take part
    nodes = c.start([f"node-{i}" for i in range(4)], "--runner", "together", "--nodes", "4", DJE_TEST_HOSTS="4")
    assert finish(nodes) == [0, 0, 0, 0], [n.output for n in nodes]
    assert count(nodes, "elected as prepare coordinator") == 1
    assert count(nodes, "elected as finalize coordinator") == 1
    hosts = done_hosts(c.job)
    assert sorted(hosts) == [f"node-{i}" for i in range(4)], f"not every node did work: {hosts}"
    assert count(nodes, "worker started on host=") == 4
    assert sum(hosts.values()) == 16
    finals = {n.last_line() for n in nodes}
    assert len(finals) == 1, finals
    assert finals.pop().startswith(f"PASS: 16 shards completed by {len(hosts)} host(s) ({len(hosts)} of 4 expected")
    assert all(o == ["done"] for o in attempt_outcomes(c.job).values())
    assert c.export.read_bytes() == c.dataset.read_bytes()
    [run] = run_summaries(c.job.root)
    assert run.run_id == "run-1" and run.outcome.exit_code == 0 and set(hosts) <= set(run.claim_loops)
    assert "[ok]" in run.describe() and "finalize by node-" in run.describe()


def test_elastic_two_of_four_expected_nodes_still_completes(tmp_path):
    c = Cluster(tmp_path, rows=80, shards=8)
    nodes = c.start(["node-0", "node-1"], "--nodes", "4")
    assert finish(nodes) == [0, 0], [n.output for n in nodes]
    assert all("PASS: 8 shards completed by" in n.last_line() for n in nodes)
    assert c.export.read_bytes() == c.dataset.read_bytes()


def test_strict_three_nodes_each_do_their_share(tmp_path):
    c = Cluster(tmp_path, rows=90, shards=9)
    nodes = c.start(["node-0", "node-1", "node-2"], "--nodes", "3", "--strict")
    assert finish(nodes) == [0, 0, 0], [n.output for n in nodes]
    assert done_hosts(c.job) == {"node-0": 3, "node-1": 3, "node-2": 3}
    assert all(n.last_line().startswith("PASS: 9 shards completed by 3 host(s)") for n in nodes)


def test_strict_with_a_node_missing_fails_naming_hosts_and_shards(tmp_path):
    c = Cluster(tmp_path, rows=60, shards=6)
    nodes = c.start(["node-0", "node-1"], "--nodes", "3", "--strict", "--wait-timeout", "3")
    assert finish(nodes) == [2, 2], [n.output for n in nodes]
    assert done_hosts(c.job) == {"node-0": 2, "node-1": 2}
    message = nodes[0].last_line()
    assert message == nodes[1].last_line()
    assert "2 of 6 shards are not done" in message
    assert "hosts seen in this run: 2 (node-0, node-1)" in message
    assert "require_all_nodes expects 3 nodes" in message and "1 missing node(s)" in message
    assert not c.export.exists()


def test_strict_split_that_lets_fewer_nodes_finish_is_refused(tmp_path):
    c = Cluster(tmp_path, rows=40, shards=4)
    nodes = c.start(["node-0"], "--nodes", "3", "--strict")
    assert finish(nodes) == [2]
    assert "use num_shards=5, a multiple of 3 or any number from 6 up" in nodes[0].last_line()
    assert os.listdir(c.job.root) == ["runs"] and not c.job.exists()


def test_prepare_failure_reaches_every_process(tmp_path):
    c = Cluster(tmp_path, rows=20, shards=2)
    nodes = c.start(["node-0", "node-1", "node-2"], "--prepare-error", "recipe.yaml: unknown key 'procss'")
    assert finish(nodes) == [2, 2, 2]
    for n in nodes:
        assert re.match(r"FAIL: prepare failed on host=node-\d: recipe.yaml: unknown key 'procss'$", n.last_line())
    assert count(nodes, "elected as prepare coordinator") == 1
    assert os.listdir(c.job.root) == ["runs"]  # nothing but the election state, inside the job dir
    assert os.listdir(c.job.runs_dir) == [safe_key("run-1")]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # nothing beside it


def test_terminal_shard_failure_stops_every_process(tmp_path):
    c = Cluster(tmp_path, rows=80, shards=8)
    bad = "part-00005-of-00008"
    # the abort, not the (long) wait timeout, must end every process: the FAIL line names the shard
    args = ("--runner", "fail", "--max-retries", "0", "--wait-timeout", "600")
    nodes = c.start(["node-0", "node-1", "node-2"], *args, DJE_TEST_FAIL_SHARDS=bad)
    nodes.append(c.start_one("node-0", *args, DJE_TEST_FAIL_SHARDS=bad, LOCAL_RANK="1"))  # a pure waiter
    assert finish(nodes) == [2, 2, 2, 2]
    for n in nodes:
        line = n.last_line()
        assert line.startswith(f"FAIL: shard {bad} failed terminally"), line
        assert f"attempts/{bad}/0001/process.log" in line and "dj-elastic retry" in line
    assert (c.job.runs_dir / safe_key("run-1") / "abort.json").exists()
    assert not c.export.exists()
    page = (c.job.gen_dir / REPORT_NAME).read_text()  # written once, by the process whose abort won
    assert bad in page and "failed" in page
    assert sum("job report: " in n.output for n in nodes) == 1


def test_killed_prepare_coordinator_times_out_then_a_new_run_finishes(tmp_path):
    c = Cluster(tmp_path, rows=60, shards=6)
    nodes = c.start(["node-0", "node-1", "node-2"], "--prepare-sleep", "600", "--wait-timeout", "3", run_id="first")
    ballot = c.job.runs_dir / safe_key("first") / "prepare.coordinator.json"
    wait_for(ballot.exists, timeout=120)
    victim = orjson.loads(ballot.read_bytes())["pid"]
    os.kill(victim, signal.SIGKILL)
    codes = {n.host: n.wait(120) for n in nodes}
    survivors = [n for n in nodes if n.proc.pid != victim]
    assert sorted(codes.values()) == [-signal.SIGKILL, 2, 2]
    for n in survivors:
        assert "published no result and its heartbeat stopped" in n.last_line()
        assert f"pid={victim}" in n.last_line() and "Submit the job again" in n.last_line()
    assert not c.job.exists()

    again = c.start(["node-0", "node-1", "node-2"], run_id="second")
    assert finish(again) == [0, 0, 0], [n.output for n in again]
    assert c.export.read_bytes() == c.dataset.read_bytes()
    before = attempt_outcomes(c.job)

    # a third submission finds nothing left: it verifies and merges again, and runs no shard
    third = c.start(["node-0", "node-1"], run_id="third")
    assert finish(third) == [0, 0]
    assert attempt_outcomes(c.job) == before
    assert all("PASS: 6 shards completed" in n.last_line() for n in third)
    # reusing an ended run id replays its recorded outcome and says how to run again
    [replay] = c.start(["node-5"], run_id="first")
    assert finish([replay]) == [2]
    assert "run first already ended (exit 2)" in replay.output and "published no result" in replay.last_line()
    runs = run_summaries(c.job.root)
    assert [(r.run_id, r.outcome.exit_code) for r in runs] == [("first", 2), ("second", 0), ("third", 0)]
    assert runs[0].prepared_by == f"{next(n.host for n in nodes if n.proc.pid == victim)} pid {victim}"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_finalize_coordinator_signalled_mid_merge_then_a_new_run_merges_once(tmp_path, sig):
    c = Cluster(tmp_path, rows=80, shards=8)
    c.export.parent.mkdir()
    # every node would be signalled half way through a merge; only the finalize coordinator merges
    args = ("--signal-mid-merge", sig.name[3:], "--wait-timeout", "3")
    nodes = c.start(["node-0", "node-1", "node-2"], *args, run_id="first")
    codes = sorted(n.wait(120) for n in nodes)
    code = -sig if sig == signal.SIGKILL else 128 + sig
    assert codes == sorted([code, 2, 2]), [n.output for n in nodes]
    [victim] = [n for n in nodes if n.proc.returncode == code]
    assert "elected as finalize coordinator" in victim.output
    for n in nodes:
        if n is not victim:
            line = n.last_line()
            if sig == signal.SIGKILL:  # noticed when its heartbeat stops
                assert "heartbeat stopped" in line and f"pid={victim.proc.pid}" in line, line
            else:  # it says so itself
                assert f"the finalize coordinator on host={victim.host} was interrupted" in line, line
            assert "Submit the job again" in line or "submit the job again" in line, line
    assert not c.export.exists(), "a partial merged output is visible"
    temps = os.listdir(c.export.parent)
    if sig == signal.SIGKILL:
        assert temps, "killed before its merge made a temp file"  # the kill was inside the merge
    else:
        assert temps == [], "an interrupted merge left its temp file"
    before = attempt_outcomes(c.job)

    again = c.start(["node-0", "node-1"], run_id="second")
    assert finish(again) == [0, 0], [n.output for n in again]
    assert c.export.read_bytes() == c.dataset.read_bytes()
    assert attempt_outcomes(c.job) == before, "the new run redid shards"
    assert count(again, "elected as finalize coordinator") == 1


def test_two_ranks_on_one_host_run_one_claim_loop(tmp_path):
    c = Cluster(tmp_path, rows=80, shards=8)
    marks = tmp_path / "marks"
    args = ("--mark-dir", str(marks), "--runner", "weighted")
    nodes = [
        c.start_one("node-0", *args, LOCAL_RANK="0", DJE_TEST_UNIT="0.1"),
        c.start_one("node-0", *args, LOCAL_RANK="1", DJE_TEST_UNIT="0.1"),
        c.start_one("node-1", *args, LOCAL_RANK="0", DJE_TEST_UNIT="0.1"),
    ]
    assert finish(nodes) == [0, 0, 0], [n.output for n in nodes]
    runners_started = sorted(m.rsplit("-", 1)[0] for m in os.listdir(marks))
    assert runners_started.count("node-0") == 1 and set(done_hosts(c.job)) <= set(runners_started)
    assert count(nodes[:2], "worker started on host=node-0") == 1
    assert count(nodes[:2], "runs the claim loop for host=node-0") == 1
    assert len({n.last_line() for n in nodes}) == 1


# run ids and helpers ------------------------------------------------------------------------------


def test_run_id_precedence():
    assert resolve_run_id("explicit", {"PAI_JOB_ID": "p"}) == "explicit"
    assert resolve_run_id(None, {"DJ_ELASTIC_RUN_ID": "mine", "PAI_JOB_ID": "p"}) == "mine"
    assert resolve_run_id(None, {"DLC_JOB_ID": "d", "SLURM_JOB_ID": "7"}) == "d"
    assert resolve_run_id(None, {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "2", "WORLD_SIZE": "4"}) == "7.2"
    assert resolve_run_id(None, {"TORCHELASTIC_RUN_ID": "job-9", "WORLD_SIZE": "8"}) == "job-9"


@pytest.mark.parametrize(
    "env",
    [
        {"WORLD_SIZE": "4"},
        {"OMPI_COMM_WORLD_SIZE": "2"},
        {"PMI_SIZE": "3"},
        {"SLURM_NTASKS": "2"},
        {"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "2"},
    ],
)
def test_several_processes_without_a_job_id_are_refused(env):
    with pytest.raises(UserError, match="set the same unique id on every process"):
        resolve_run_id(None, env)


def test_a_lone_process_gets_a_fresh_run_id():
    first, second = resolve_run_id(None, {"WORLD_SIZE": "1"}), resolve_run_id(None, {})
    assert first != second and first.startswith("local-")


def test_run_keys_are_safe_and_distinct():
    assert safe_key("a/b").startswith("a_b-") and safe_key("a/b") != safe_key("a_b")
    assert safe_key("../..").startswith("x-")
    assert len(safe_key("x" * 500)) <= 60


@pytest.mark.parametrize(
    ("shards", "nodes", "ok"),
    [(9, 3, True), (16, 3, True), (10, 4, True), (4, 3, False), (2, 3, False), (3, 3, True), (5, 1, True)],
)
def test_strict_split(shards, nodes, ok):
    assert strict_split_ok(shards, nodes) is ok
