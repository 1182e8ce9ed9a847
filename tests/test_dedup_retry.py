"""A dedup stage unit that raises counts against the job's ``max_retries`` as a shard does (dedup/budget.py): a
failed attempt record and log, its lease released, the unit retried by any node; past the budget the run ends,
exit 2, naming the unit and its log. The failure is real: ``flaky_mapper`` (tests/ops/flaky_ops.py) in the
segment before the first dedup raises on one row, a set number of times, on nodes whose environment says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.nodes import start_node
from tests.reference import DJ_PROCESS, REPO
from tests.test_dedup_job import check, elastic_config, start
from tests.test_dedup_kill import dataset  # noqa: F401 (the module's fixture: the corpus and its reference)

pytestmark = pytest.mark.slow

ROW = 60  # in the second of four input shards
UNIT = "d0-hash-part-00001-of-00004"  # the unit that holds it


def flaky_config(tmp: Path, path: Path, times: int, max_retries: int) -> Path:
    """The dedup recipe with ``flaky_mapper`` first (the identity where DJE_TEST_FLAKY is unset, so the default
    executor's result without it is the expected one)."""
    config = elastic_config(tmp, path)
    body = yaml.safe_load(config.read_text())
    body["custom_operator_paths"] = [str(REPO / "tests" / "ops" / "flaky_ops.py")]
    flaky = {"flaky_mapper": {"row_id": ROW, "times": times, "skip_op_error": False}}
    body["process"] = [flaky, *body["process"]]
    body["elastic_shard"]["max_retries"] = max_retries
    config.write_text(yaml.safe_dump(body, sort_keys=False))
    return config


def run_two(tmp: Path, config: Path, times: int) -> list:
    raised = tmp / "raised"
    raised.mkdir()
    nodes = [start(tmp, config, h, n, DJE_TEST_FLAKY=str(raised)) for n, h in enumerate(["node-a", "node-b"])]
    try:
        codes = [node.wait(600) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert len(list(raised.iterdir())) == times
    return [(code, node) for code, node in zip(codes, nodes, strict=True)]


def failed_attempts(job: Path) -> dict[str, dict]:
    """Each failed unit attempt's record, by ``<unit>/<attempt>``."""
    found = {}
    for record in job.glob("**/attempts/d*-*/*/attempt.json"):
        found[f"{record.parent.parent.name}/{record.parent.name}"] = json.loads(record.read_bytes())
    return found


def test_a_unit_that_raises_once_is_retried_and_the_job_equals_the_default_executor(tmp_path, dataset):  # noqa: F811
    path, rows, want = dataset
    for code, node in run_two(tmp_path, flaky_config(tmp_path, path, times=1, max_retries=1), times=1):
        assert code == 0, node.tail()
    check(tmp_path, rows, want)
    failed = failed_attempts(tmp_path / "job")
    assert list(failed) == ["d0-hash-part-00001-of-00004/0001"], failed
    (record,) = failed.values()
    assert record["outcome"] == "failed" and "planted failure 1 of 1" in record["error"]
    (log,) = (tmp_path / "job").glob("**/attempts/d0-hash-part-00001-of-00004/0001/process.log")
    assert "RuntimeError: planted failure 1 of 1" in log.read_text()


def test_a_unit_past_its_budget_ends_the_job_exit_2_naming_the_unit_and_its_log(tmp_path, dataset):  # noqa: F811
    path = dataset[0]
    ended = run_two(tmp_path, flaky_config(tmp_path, path, times=2, max_retries=1), times=2)
    for code, node in ended:
        assert code == 2, node.tail()
        assert "dedup unit d0-hash-part-00001-of-00004" in node.result(), node.tail()
    message = ended[0][1].result()
    assert "failed terminally" in message and "after 2 failure(s)" in message, message
    log = Path(message.split("; see ", 1)[1].split(";", 1)[0])
    assert log.name == "process.log" and "RuntimeError: planted failure 2 of 2" in log.read_text()
    assert not (tmp_path / "out" / "merged.jsonl").exists()


def test_retry_all_failed_requeues_a_unit_past_its_budget_and_a_new_run_equals_the_default_executor(
    tmp_path,
    dataset,  # noqa: F811
):
    """The terminal failure above, then ``dj-elastic retry --all-failed``, then one node run again (the planted
    cause gone): the job finishes equal to the default executor. Nothing after the failed unit is redone: a
    failed unit published nothing, so no later stage ran; the hash units done before keep their records."""
    path, rows, want = dataset
    config = flaky_config(tmp_path, path, times=2, max_retries=1)
    for code, node in run_two(tmp_path, config, times=2):
        assert code == 2, node.tail()
    (gen,) = (tmp_path / "job" / "generations").iterdir()
    assert (gen / "state" / "failed" / f"{UNIT}.json").exists()
    before = {p.name: p.read_bytes() for p in (gen / "state" / "stage-done").glob("*.json")}
    assert all(name.startswith("d0-hash-") for name in before) and f"{UNIT}.json" not in before, sorted(before)
    retried = cli("retry", "--job-dir", str(tmp_path / "job"), "--all-failed")
    assert retried.returncode == 0 and UNIT in retried.stdout, retried.stderr
    assert not (gen / "state" / "failed" / f"{UNIT}.json").exists()
    assert list((gen / "state" / "history").glob(f"*-{UNIT}.failed.json"))
    assert cli("status", "--job-dir", str(tmp_path / "job")).returncode == 1  # requeued: neither failed nor done
    log = tmp_path / "node-again.log"
    node = start_node([DJ_PROCESS, "--config", str(config)], "node-c", log, cwd=tmp_path, DJ_ELASTIC_RUN_ID="again")
    try:
        assert node.wait(600) == 0, node.tail()
    finally:
        node.kill()
    check(tmp_path, rows, want)
    after = {p.name: p.read_bytes() for p in (gen / "state" / "stage-done").glob("*.json")}
    assert {name: after[name] for name in before} == before  # the units done before the retry were not redone
    assert json.loads(after[f"{UNIT}.json"])["attempt"] == 3  # attempts 1 and 2 failed; the retry's is the third
    status = json.loads(cli("status", "--job-dir", str(tmp_path / "job"), "--json").stdout)
    assert status["complete"] and not status["failed"] and status["dedup"][0]["failed"] == []


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "data_juicer_elastic.cli", *args], capture_output=True, text=True)
