"""A dedup stage unit that raises counts against the job's ``max_retries`` as a shard does (dedup/budget.py): a
failed attempt record and log, its lease released, the unit retried by any node; past the budget the run ends,
exit 2, naming the unit and its log. The failure is real: ``flaky_mapper`` (tests/ops/flaky_ops.py) in the
segment before the first dedup raises on one row, a set number of times, on nodes whose environment says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.reference import REPO
from tests.test_dedup_job import check, elastic_config, start
from tests.test_dedup_kill import dataset  # noqa: F401 (the module's fixture: the corpus and its reference)

pytestmark = pytest.mark.slow

ROW = 60  # in the second of four input shards


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
