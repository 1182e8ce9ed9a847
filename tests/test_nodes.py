"""Several real ``dj-process`` nodes, each with its own Ray, hit by kill -9 and SIGSTOP at chosen moments.

Each test starts the stock ``dj-process --config recipe.yaml`` as three
nodes of one submission (tests/nodes.py) and checks the merged output row by
row against one plain ``executor_type: ray`` run of the same recipe file with
this package switched off (tests/reference.py). The moments are read from the
job dir: a host's claim-loop election (its Ray is starting), a gate entered
inside a shard (mid-shard), a takeover lease, a done record, ``merge.json``.
"""

from __future__ import annotations

import signal

import orjson
import pytest
import yaml

from .jobs import wait_for
from .nodes import Nodes
from .reference import assert_matches_reference, input_ids, read_rows, run_reference

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The user's recipe run once as ``executor_type: ray`` over the input, independently of this package."""
    tmp = tmp_path_factory.mktemp("reference")
    source = Nodes(tmp)
    rows = run_reference(source.recipe, tmp / "ref", cwd=tmp)
    return {"rows": rows, "recipe": yaml.safe_load(source.recipe.read_text()), "input": source.dataset.read_bytes()}


def check_against_reference(nodes: Nodes, reference: dict) -> None:
    recipe = yaml.safe_load(nodes.recipe.read_text())
    assert recipe["process"] == reference["recipe"]["process"], "the reference ran another recipe"
    assert nodes.dataset.read_bytes() == reference["input"], "the reference read another input"
    assert_matches_reference(read_rows(nodes.export), reference["rows"], input_ids(nodes.dataset))
    merged = orjson.loads(nodes.job.merge_record_path.read_bytes())
    assert {s["shard"]: s["attempt"] for s in merged["shards"]} == {
        sid: rec["attempt"] for sid, rec in nodes.done_records().items()
    }, "merge did not use the done records' attempts"


def takeover_delay(nodes: Nodes, shard: str, dead_attempt: int, last_beat: float) -> float:
    """Seconds between the dead lease's last heartbeat and the next attempt's claim (both file-system clock)."""
    return nodes.attempt_record(shard, dead_attempt + 1)["claimed_at"] - last_beat


def test_nodes_killed_at_ray_start_up_and_mid_shard_lose_nothing(tmp_path, reference):
    """C dies while its Ray starts, A dies inside a shard: B takes A's shard over after the lease timeout."""
    nodes = Nodes(tmp_path)
    try:
        a = nodes.start("node-a", gated=True)
        b = nodes.start("node-b")
        c = nodes.start("node-c")
        # Ray start-up: C won its host's claim-loop election and holds no lease yet
        wait_for(lambda: nodes.claim_loop_elected("node-c"), "node-c's claim-loop election", timeout=600)
        assert not nodes.leases_of("node-c"), "node-c claimed before the test could kill it at Ray start-up"
        c.signal(signal.SIGKILL)
        # mid-shard: A's Ray worker is inside the gate, in A's first shard, and B, done with every other
        # shard, is idle: it takes A's shard over as soon as the lease lets it, which the bound below checks
        wait_for(lambda: (a.gate / "entered").exists(), "node-a to enter the gate inside a shard", timeout=600)
        [(shard, attempt)] = nodes.leases_of("node-a")
        wait_for(
            lambda: len(nodes.done_records()) == nodes.shards - 1,
            "node-b to finish every shard but node-a's",
            timeout=600,
        )
        a.signal(signal.SIGKILL)
        assert a.wait() == -signal.SIGKILL and c.wait() == -signal.SIGKILL
        last_beat = nodes.job.claims_dir.joinpath(f"{shard}@{attempt:04d}").stat().st_mtime
        assert b.wait(900) == 0, nodes.logs()
    finally:
        nodes.stop_all()
    assert b.result().startswith(f"{nodes.shards} shards completed by 1 host(s): node-b={nodes.shards}"), b.result()
    assert nodes.attempt_record(shard, attempt)["outcome"] == "running"  # killed: it never finished
    assert nodes.done_records()[shard]["attempt"] == attempt + 1
    delay = takeover_delay(nodes, shard, attempt, last_beat)
    assert delay >= nodes.lock_timeout, f"a dead lease was taken over after {delay:.2f}s < {nodes.lock_timeout}s"
    assert not nodes.leases_of("node-c")
    check_against_reference(nodes, reference)


def test_stopped_nodes_resume_without_publishing_stale_work(tmp_path, reference):
    """A is stopped inside a shard until B took it over, W (a second process on B's host) through finalize."""
    nodes = Nodes(tmp_path)
    try:
        a = nodes.start("node-a", gated=True)
        b = nodes.start("node-b")
        wait_for(lambda: nodes.claim_loop_elected("node-b"), "node-b's claim-loop election", timeout=600)
        w = nodes.start("node-b", LOCAL_RANK="1")  # a pure waiter: node-b's claim loop runs elsewhere
        wait_for(
            lambda: "this process waits for the job result" in w.tail(), "node-b's second process to wait", timeout=600
        )
        w.signal(signal.SIGSTOP)  # waiting, and stopped until the job is finalized
        wait_for(lambda: (a.gate / "entered").exists(), "node-a to enter the gate inside a shard", timeout=600)
        [(shard, attempt)] = nodes.leases_of("node-a")
        wait_for(
            lambda: len(nodes.done_records()) == nodes.shards - 1,
            "node-b to finish every shard but node-a's",
            timeout=600,
        )
        a.signal(signal.SIGSTOP)  # B is idle now: it takes the shard over as soon as the lease lets it
        last_beat = nodes.job.claims_dir.joinpath(f"{shard}@{attempt:04d}").stat().st_mtime
        wait_for(lambda: shard in nodes.done_records(), f"node-b to take over and finish {shard}", timeout=600)
        (a.gate / "open").touch()
        a.signal(signal.SIGCONT)
        wait_for(nodes.job.merge_record_path.exists, "merge.json", timeout=600)
        w.signal(signal.SIGCONT)
        codes = [n.wait(600) for n in (a, b, w)]
    finally:
        nodes.stop_all()
    assert codes == [0, 0, 0], nodes.logs()
    finals = {n.result() for n in (a, b, w)}
    assert len(finals) == 1, finals
    assert finals.pop().startswith(f"{nodes.shards} shards completed by"), nodes.logs()
    assert nodes.attempt_record(shard, attempt)["outcome"] == "superseded"
    assert nodes.done_records()[shard]["attempt"] == attempt + 1
    assert nodes.done_records()[shard]["host"] == "node-b"
    delay = takeover_delay(nodes, shard, attempt, last_beat)
    assert delay >= nodes.lock_timeout, f"a stopped node's lease was taken after {delay:.2f}s < {nodes.lock_timeout}s"
    check_against_reference(nodes, reference)
