"""Several real ``dj-process --config recipe.yaml`` processes forming one submission.

Each node is the stock ``dj-process`` with its own ``DJ_ELASTIC_HOSTNAME``
and its own node-local Ray, started in its own session so a test can kill or
stop the node whole (the process and the Ray it started). All nodes read one
recipe file the test writes and share one run id, as a launcher would give
them. A gate operator (a custom Mapper, identity on the data) lets a test
hold a chosen node inside a shard: a node whose environment names a gate
folder blocks in its first row until ``<gate>/open`` exists, after leaving
``<gate>/entered``.

Moments a test can wait for, all read from the job dir: a host's claim-loop
election (its Ray is starting), a host's lease, a gate entered (mid-shard),
a done record, the finalize election, ``merge.json``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import orjson
import yaml

from data_juicer_elastic.coordination.rundir import run_root
from data_juicer_elastic.job.claims import parse_lease_name
from data_juicer_elastic.job.layout import JobDir

from .reference import DJ_PROCESS, env_with, write_jsonl

RUN_ID = "nodes-run"

GATE_OPS = '''
import os
import time
from pathlib import Path

from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("dje_test_gate_mapper")
class DjeTestGateMapper(Mapper):
    """Identity; on a node whose environment sets DJE_TEST_GATE, blocks until <gate>/open exists."""

    def process_single(self, sample):
        gate = os.environ.get("DJE_TEST_GATE")
        if gate and not Path(gate, "open").exists():
            Path(gate, "entered").touch()
            while not Path(gate, "open").exists():
                time.sleep(0.05)
        return sample
'''


def corpus_rows(n: int) -> list[dict]:
    """Texts of varied length with extra whitespace; a score column mixing ints and floats."""
    rows = []
    for i in range(n):
        row = {"id": i, "text": f"  row {i}   " + "word " * (i * 7 % 19)}
        if i % 5 == 0:
            row["score"] = i if i % 10 else i + 0.25
        rows.append(row)
    return rows


def session_pids(sid: int) -> list[int]:
    """Every live process of session ``sid`` (field 6 of /proc/PID/stat), the leader first."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != b"Z":
            pids.append(int(entry))
    return sorted(pids, key=lambda p: p != sid)


@dataclass
class Node:
    """One started node (a ``dj-process``, a ``tests.coord_node``, a worker): its process, log and gate."""

    host: str
    proc: subprocess.Popen
    log: Path
    gate: Path | None = None

    def signal(self, sig: int) -> None:
        """Signal the node whole: the process and every process of its session (its Ray, whose
        workers sit in process groups of their own), as a node that dies or freezes would."""
        for pid in session_pids(self.proc.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """Kill the node and whatever it left running (idempotent; for clean-up)."""
        self.signal(signal.SIGKILL)
        self.signal(signal.SIGCONT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        self.signal(signal.SIGKILL)  # Ray processes the node left behind when it exited

    def wait(self, timeout: float = 300) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node {self.host} did not exit within {timeout:g}s:\n{self.tail()}") from None

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, chars: int = 4000) -> str:
        return self.output[-chars:]

    def last_line(self) -> str:
        lines = self.output.strip().splitlines()
        return lines[-1] if lines else ""

    def result(self) -> str:
        """The job's outcome as this node logged it: the text after its last PASS: or FAIL:."""
        lines = [x for x in self.output.splitlines() if "PASS:" in x or "FAIL:" in x]
        return lines[-1].split("PASS:", 1)[-1].split("FAIL:", 1)[-1].strip() if lines else ""


def start_node(cmd: list[str], host: str, log: Path, *, cwd: Path, gate: Path | None = None, **env: str) -> Node:
    """Start ``cmd`` as node ``host`` in a session of its own (so a test can signal it whole), output to ``log``."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env_with(DJ_ELASTIC_HOSTNAME=host, **env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Node(host, proc, log, gate)


class Nodes:
    """One job: the input, the user's recipe file, and the dj-process nodes started on it."""

    def __init__(self, tmp: Path, *, rows: int = 400, shards: int = 4, **elastic: object) -> None:
        self.tmp = tmp
        self.shards = shards
        self.dataset = tmp / "data" / "corpus.jsonl"
        write_jsonl(self.dataset, corpus_rows(rows))
        ops = tmp / "ops" / "dje_test_gate_ops.py"
        ops.parent.mkdir(parents=True, exist_ok=True)
        ops.write_text(GATE_OPS)
        self.job = JobDir(tmp / "job")
        self.export = tmp / "out" / "merged.jsonl"
        settings = {
            "job_dir": str(self.job.root),
            "num_shards": shards,
            "max_retries": 2,
            "heartbeat_secs": 0.5,
            "lock_timeout_secs": 8.0,
            "poll_interval_secs": 0.2,
            "wait_timeout_secs": 600.0,
            "prefetch_shards": 0,  # a gated node holds exactly the shard it runs (prefetch: tests/test_prefetch.py)
        }
        settings.update(elastic)
        self.lock_timeout = float(settings["lock_timeout_secs"])
        recipe = {
            "project_name": "nodes",
            "dataset_path": str(self.dataset),
            "export_path": str(self.export),
            "np": 1,
            "executor_type": "elastic_shard",
            "elastic_shard": settings,
            "custom_operator_paths": [str(ops)],
            "process": [
                {"whitespace_normalization_mapper": None},
                {"dje_test_gate_mapper": None},
                {"text_length_filter": {"min_len": 14}},
            ],
        }
        self.recipe = tmp / "recipe.yaml"
        self.recipe.write_text(yaml.safe_dump(recipe, sort_keys=False))
        self.nodes: list[Node] = []

    # starting and stopping ----------------------------------------------------------------
    def start(self, host: str, *, gated: bool = False, **env: str) -> Node:
        log = self.tmp / f"node-{len(self.nodes)}-{host}.log"
        gate = None
        if gated:
            gate = self.tmp / f"gate-{host}-{len(self.nodes)}"
            gate.mkdir()
            env["DJE_TEST_GATE"] = str(gate)
        env.setdefault("DJ_ELASTIC_RUN_ID", RUN_ID)
        node = start_node([DJ_PROCESS, "--config", str(self.recipe)], host, log, cwd=self.tmp, gate=gate, **env)
        self.nodes.append(node)
        return node

    def stop_all(self) -> None:
        for node in self.nodes:
            node.kill()

    def logs(self) -> str:
        return "\n".join(f"--- {n.host} (pid {n.proc.pid})\n{n.tail()}" for n in self.nodes)

    # moments, read from the job dir -----------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        return run_root(self.job.root, RUN_ID)

    def claim_loop_elected(self, host: str) -> bool:
        """The host won its claim-loop election: it is starting its runner (Ray) or working."""
        return any(self._ballot_host(p) == host for p in (self.run_dir / "hosts").glob("*.json"))

    def leases_of(self, host: str) -> list[tuple[str, int]]:
        """(shard, attempt) of every lease file naming ``host`` as its owner."""
        found = []
        claims = self.job.claims_dir
        for name in os.listdir(claims) if claims.is_dir() else ():
            parsed = parse_lease_name(name)
            if parsed and self._ballot_host(claims / name) == host:
                found.append(parsed)
        return sorted(found)

    def done_records(self) -> dict[str, dict]:
        return {n[:-5]: orjson.loads((self.job.done_dir / n).read_bytes()) for n in self._names(self.job.done_dir)}

    def attempt_record(self, shard: str, attempt: int) -> dict:
        return orjson.loads((self.job.attempt_dir(shard, attempt) / "attempt.json").read_bytes())

    def finalize_elected(self) -> bool:
        """Someone won the generation's finalize election (it is keyed by the done records, not the run)."""
        return any(self.job.finalize_dir.glob("*/finalize.coordinator.json"))

    @staticmethod
    def _ballot_host(path: Path) -> str | None:
        try:
            return orjson.loads(path.read_bytes()).get("host")
        except (OSError, ValueError, AttributeError):
            return None

    @staticmethod
    def _names(folder: Path) -> list[str]:
        names = os.listdir(folder) if folder.is_dir() else []
        return [n for n in names if n.endswith(".json") and not n.startswith(".")]
