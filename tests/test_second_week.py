"""Issue 37, "a user's second week": what the console of a successful multi-node run shows.

Three real ``dj-process`` nodes of one run (tests/nodes.py) with the export
path beside the job dir, not inside it.
"""

from __future__ import annotations

import gzip
import re

import pytest

from .nodes import Nodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory):
    """One run of three nodes started together; the export folder beside a job dir two levels down."""
    tmp = tmp_path_factory.mktemp("three")
    nodes = Nodes(tmp, rows=30, shards=3, job_dir=str(tmp / "jobs" / "job1"))
    try:
        started = [nodes.start(host) for host in ("n1", "n2", "n3")]
        codes = {node.host: node.wait(600) for node in started}
    finally:
        nodes.stop_all()
    assert codes == {"n1": 0, "n2": 0, "n3": 0}, nodes.logs()
    return nodes


def test_no_node_of_a_passed_run_prints_a_traceback(three_nodes):
    for node in three_nodes.nodes:
        assert "PASS:" in node.output, node.tail()
        for sign in ("Traceback", "Exception ignored", "FileNotFoundError"):
            assert sign not in node.output, f"{node.host}:\n{node.output}"


def test_start_up_and_per_op_noise_stays_off_every_node_console(three_nodes):
    for node in three_nodes.nodes:
        for noise in (
            "Neither the required memory nor cpu",
            "No config file found in work directory",
            "Token authentication is enabled",
            "Found multiple active Ray instances",
        ):
            assert noise not in node.output, f"{node.host}:\n{node.output}"


def test_data_juicer_log_files_stay_in_each_process_log_folder(three_nodes):
    """Data-Juicer names its log files after the export path relative to its work dir; they stay in the
    log folder of each process's own work dir, never in one shared folder of the job."""
    work = three_nodes.tmp / "jobs" / "job1" / "dj-work"
    runs = sorted(p for p in work.iterdir() if p.is_dir() and p.name != "out")
    assert len(runs) == 3, sorted(work.iterdir())
    logs = sorted(str(p.relative_to(work)) for p in work.rglob("*_time_*"))
    assert logs, "no Data-Juicer log file found"
    for run in runs:
        assert list((run / "logs").glob("export_merged.jsonl_time_*_DEBUG.txt*")), logs
        [main] = [p for p in (run / "logs").glob("export_merged.jsonl_time_*") if re.search(r"_\d+\.txt", p.name)]
        text = (gzip.open(main) if main.suffix == ".gz" else open(main, "rb")).read().decode()
        assert "dataset_path config is set" in text and "PASS:" in text, text[-3000:]  # start-up lines kept
    assert all(name.split("/")[1] == "logs" for name in logs), logs
