"""A ``dj-process`` node killed -9 inside a dedup stage unit (docs/DEDUP.md), then restarted: both final processes
exit 0 and the merged export equals Data-Juicer's default executor, row for row.

The kill lands by state: both nodes name the unit and a gate folder (dedup/driver.py ``test_gate``); whichever
claims the unit first stops in it once its outputs are written, before its done record, its lease renewed, and
leaves ``entered``. The test kills that node whole (its session: the process and its Ray), opens the gate so no
later attempt stops, and restarts the node; the unit's done record then names a later attempt than the killed one,
whose written outputs stay unpublished beside it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from data_juicer_elastic.dedup.driver import GATE_ENV, GATE_UNIT_ENV
from data_juicer_elastic.storage.store import Store, store_for
from tests.reference import write_jsonl
from tests.test_dedup_job import check, corpus, elastic_config, reference, start

pytestmark = pytest.mark.slow

UNITS = ["d0-bucket-00001", "d1-join", "d0-hash-part-00002-of-00004"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict], list[dict]]:
    """The planted corpus and Data-Juicer's default executor's result on it, once for every kill."""
    tmp = tmp_path_factory.mktemp("dedup-kill")
    rows = corpus()
    path = tmp / "data" / "corpus.jsonl"
    write_jsonl(path, rows)
    return path, rows, reference(tmp / "reference", path)


def wait_entered(gate: Path, nodes: list) -> str:
    """The host that stopped in the gated unit; fails if every node exits first."""
    while not (gate / "entered").exists():
        if all(n.proc.poll() is not None for n in nodes):
            raise AssertionError("no node reached the gated unit:\n" + "\n".join(n.tail() for n in nodes))
        time.sleep(0.1)
    return (gate / "entered").read_text()


def unit_done(store: Store, unit: str) -> dict:
    """The unit's done record, found by listing the job (it sits in its generation's ``state/stage-done``)."""
    (key,) = [e.key for e in store.list("generations") if e.key.endswith(f"/state/stage-done/{unit}.json")]
    got = store.read(key)
    assert got is not None
    return json.loads(got[0])


def killed_in_unit_and_restarted(tmp: Path, config: Path, unit: str, **env: str) -> None:
    """Two nodes gated at ``unit``; the one that stops in it is killed -9 whole, then restarted ungated; every
    node that ran to the end exits 0."""
    gate = tmp / "gate"
    gate.mkdir()
    env.update({GATE_ENV: str(gate), GATE_UNIT_ENV: unit})
    nodes = [start(tmp, config, host, n, **env) for n, host in enumerate(["node-a", "node-b"])]
    try:
        host = wait_entered(gate, nodes)
        victim = next(n for n in nodes if n.host == host)
        victim.kill()
        assert victim.proc.returncode == -9
        (gate / "open").touch()
        del env[GATE_ENV], env[GATE_UNIT_ENV]
        nodes.append(start(tmp, config, host, len(nodes), **env))  # the same host, restarted, ungated
        for node in nodes:
            if node is not victim:
                assert node.wait(600) == 0, node.tail()
    finally:
        for node in nodes:
            node.kill()


def check_taken_over(store: Store, unit: str) -> None:
    """The unit's done record names a later attempt than the killed first one, whose outputs were written."""
    done = unit_done(store, unit)
    assert done["attempt"] >= 2, done  # the killed attempt 1 never published
    for name, out in done["outputs"].items():
        first = f"{out['key'].rsplit('/', 2)[0]}/0001/{name}"
        assert store.head(first) is not None, f"the killed attempt had not written {first}"


@pytest.mark.parametrize("unit", UNITS)
def test_a_node_killed_inside_a_unit_and_restarted_equals_the_default_executor(tmp_path, dataset, unit):
    path, rows, want = dataset
    killed_in_unit_and_restarted(tmp_path, elastic_config(tmp_path, path), unit)
    check(tmp_path, rows, want)
    check_taken_over(store_for(str(tmp_path / "job")), unit)
