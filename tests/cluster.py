"""Simulated nodes of one coordinated job: ``tests.coord_node`` processes with distinct hostnames.

The real coordination (``run_job``) with toy runners instead of Ray, so a test
can start many nodes cheaply; the real ``dj-process`` path is tests/nodes.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import orjson

from data_juicer_elastic.job.layout import JobDir

from .jobs import REPO, input_jsonl, write_input
from .nodes import Node, start_node


class Cluster:
    """Starts simulated nodes of one job: the same command, different DJ_ELASTIC_HOSTNAME."""

    def __init__(self, tmp: Path, *, rows: int = 160, shards: int = 16) -> None:
        self.tmp = tmp
        self.dataset = write_input(tmp / "input", rows, shards=shards)  # JSONL or Parquet (DJE_TEST_INPUT)
        self.job = JobDir(tmp / "job")
        self.export = tmp / "out" / "merged.jsonl"
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
        cmd += ["--export", str(self.export), "--dataset", str(self.dataset), "--shards", str(self.shards), *args]
        log = self.tmp / f"node-{self.started}-{host}.log"
        return start_node(cmd, host, log, cwd=REPO, DJ_ELASTIC_RUN_ID=run_id, **env)


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
    for name in os.listdir(job.done_dir):
        host = orjson.loads((job.done_dir / name).read_bytes())["host"]
        hosts[host] = hosts.get(host, 0) + 1
    return hosts
