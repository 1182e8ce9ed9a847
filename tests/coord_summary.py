"""What one submission did, read back from its coordination folders (for the tests' checks)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from data_juicer_elastic.coordination.rundir import EXIT_OK, Outcome, read_outcome
from data_juicer_elastic.storage.files import read_record
from data_juicer_elastic.storage.posix import PosixStore


@dataclass(frozen=True)
class RunSummary:
    """What one submission did, for ``dj-elastic status``: who coordinated, who worked, how it ended."""

    run_id: str
    created_at: float
    prepared_by: str  # "host pid", "" if no election yet
    claim_loops: dict[str, int]  # host -> pid of its claim-loop process
    members: list[str]  # hosts of every process that got past prepare
    finalized_by: str
    outcome: Outcome | None  # the finalize result, else the abort, else a failed prepare

    def describe(self) -> str:
        state = "running" if self.outcome is None else ("ok" if self.outcome.exit_code == EXIT_OK else "failed")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.created_at)) if self.created_at else "?"
        loops = ", ".join(f"{h}(pid {p})" for h, p in sorted(self.claim_loops.items())) or "none"
        line = (
            f"run {self.run_id} [{state}] started {when}; {len(self.members)} host(s) joined; "
            f"prepare by {self.prepared_by or '-'}, claim loops: {loops}, finalize by {self.finalized_by or '-'}"
        )
        return line + (f"\n  {self.outcome.message}" if self.outcome else "")


def run_summaries(job_dir: str | os.PathLike) -> list[RunSummary]:
    """Every run that touched ``job_dir``, oldest first (reads only)."""
    runs = Path(os.path.abspath(job_dir)) / "runs"
    keys = [e.name for e in os.scandir(runs) if e.is_dir()] if runs.is_dir() else []
    return sorted((_summary(runs / key) for key in keys), key=lambda r: r.created_at)


def _summary(run: Path) -> RunSummary:
    info = read_record(run / "run.json")
    store = PosixStore(run)
    prepare_result, finalize = read_outcome(store, "prepare.result.json"), read_outcome(store, "finalize.result.json")
    failed_prepare = prepare_result if prepare_result and prepare_result.exit_code else None
    hosts_dir, members_dir = run / "hosts", run / "members"
    loops = [read_record(hosts_dir / n) for n in (os.listdir(hosts_dir) if hosts_dir.is_dir() else ())]
    members = [read_record(members_dir / n) for n in (os.listdir(members_dir) if members_dir.is_dir() else ())]
    return RunSummary(
        run_id=str(info.get("run_id", run.name)),
        created_at=float(info.get("created_at", 0.0)),
        prepared_by=_who(run / "prepare.coordinator.json"),
        claim_loops={b["host"]: b.get("pid", 0) for b in loops if "host" in b},
        members=sorted({m["host"] for m in members if "host" in m}),
        finalized_by=f"{finalize.host} pid {finalize.pid}" if finalize and finalize.host else "",
        outcome=finalize or read_outcome(store, "abort.json") or failed_prepare,
    )


def _who(ballot: Path) -> str:
    b = read_record(ballot)
    return f"{b['host']} pid {b.get('pid')}" if "host" in b else ""
