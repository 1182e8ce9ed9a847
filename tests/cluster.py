"""Simulated nodes of one coordinated job: ``tests.coord_node`` processes with distinct hostnames.

The real coordination (``run_job``) with toy runners instead of Ray, so a test
can start many nodes cheaply; the real ``dj-process`` path is tests/nodes.py.
The job dir (and the export) may be an ``s3://`` URL: the nodes inherit the
test's environment (``AWS_ENDPOINT_URL``, tests/s3server.py), and the readers
here go through the job's store, so they read either kind.
"""

from __future__ import annotations

import sys
from pathlib import Path

from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.attempt import load_attempt
from data_juicer_elastic.job.records.done import load_done
from data_juicer_elastic.storage.store import store_for
from data_juicer_elastic.storage.urls import is_s3

from .jobs import REPO, input_jsonl, write_input
from .nodes import Node, start_node


class Cluster:
    """Starts simulated nodes of one job: the same command, different DJ_ELASTIC_HOSTNAME."""

    def __init__(
        self, tmp: Path, *, rows: int = 160, shards: int = 16, job_dir: str | None = None, export: str | None = None
    ) -> None:
        """``job_dir``, ``export``: URLs (``s3://...``) in place of ``tmp/job`` and ``tmp/out/merged.jsonl``."""
        self.tmp = tmp
        self.dataset = write_input(tmp / "input", rows, shards=shards)  # JSONL or Parquet (DJE_TEST_INPUT)
        self.job = JobDir(job_dir or tmp / "job")
        self.export = tmp / "out" / "merged.jsonl"
        self.export_to = export or str(self.export)  # what the nodes are told
        self.shards = shards
        self.started = 0

    def expected(self) -> bytes:
        """The export an identity run must write: the input as JSONL (``tests.jobs.input_jsonl``)."""
        return input_jsonl(self.dataset)

    def start(self, hosts: list[str], *args: str, run_id: str = "run-1", **env: str) -> list[Node]:
        return [self.start_one(host, *args, run_id=run_id, **env) for host in hosts]

    def start_one(self, host: str, *args: str, run_id: str = "run-1", **env: str) -> Node:
        self.started += 1
        cmd = [sys.executable, "-m", "tests.coord_node", "--job-dir", str(self.job.root)]
        cmd += ["--export", self.export_to, "--dataset", str(self.dataset), "--shards", str(self.shards), *args]
        log = self.tmp / f"node-{self.started}-{host}.log"
        return start_node(cmd, host, log, cwd=REPO, DJ_ELASTIC_RUN_ID=run_id, **env)

    def exported(self) -> bytes | None:
        """The merged export's bytes, wherever it was written; None while there is none."""
        if not is_s3(self.export_to):
            path = Path(self.export_to)
            return path.read_bytes() if path.exists() else None
        folder, _, name = self.export_to.rpartition("/")
        got = store_for(folder).read(name)
        return None if got is None else got[0]


def finish(nodes: list[Node], timeout: float = 300) -> list[int]:
    """Every node's exit code (killing whatever is left once one fails to exit in time)."""
    try:
        return [n.wait(timeout) for n in nodes]
    finally:
        for n in nodes:
            if n.proc.poll() is None:
                n.kill()


def count(nodes: list[Node], text: str) -> int:
    return sum(n.output.count(text) for n in nodes)


def done_hosts(job: JobDir) -> dict[str, int]:
    """host -> shards whose done record it published."""
    hosts: dict[str, int] = {}
    for sid in job.done_ids():
        record = load_done(job, sid)
        assert record is not None, sid
        hosts[record.host] = hosts.get(record.host, 0) + 1
    return hosts


def outcomes(job: JobDir) -> dict[str, list[str]]:
    """shard -> outcomes of attempts 1..last, read through the job's store ("missing": an attempt named by
    its folder or files but without an attempt record, e.g. claimed, then killed before it wrote one)."""
    store, result = job.store, {}
    for shard in sorted(store.names(job.key(job.attempts_dir))):
        numbers = [int(n) for n in store.names(job.key(job.attempts_dir / shard)) if n.isdigit()]
        records = [load_attempt(job, shard, n) for n in range(1, max(numbers, default=0) + 1)]
        result[shard] = [r.outcome if r else "missing" for r in records]
    return result
