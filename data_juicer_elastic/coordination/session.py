"""One submission, many identical processes: the whole multi-node job.

The same command is started on every node (and possibly on several ranks per
node). Each process runs ``run_job`` and the processes agree, through the
shared directory alone, on who does what:

1. the run id names the submission (``resolve_run_id``), so a new submission
   gets fresh elections and reuses the job directory as it stands;
2. one process wins the prepare election, validates the recipe and prepares;
   the others wait for its published outcome. Prepare creates the job dir
   whole (by one rename), so this election lives beside it, in
   ``<parent>/.<job-name>.runs/<run-key>/``; a failed prepare leaves only that;
3. everything after prepare lives in ``<job_dir>/runs/<run-key>/``: one
   process per host wins that host's election and runs the claim loop with
   the host's runner (Ray); the others on the host only wait;
4. once every shard is done, one process wins the finalize election, verifies
   and merges; everyone exits with the code it published;
5. a terminal shard failure or a stalled job publishes one abort record, and
   every process exits 2 with its message.

Elections and outcomes are publish-once files: the first writer wins and
nobody reads a half record. A coordinator renews its election file's mtime
while it works; a waiter publishes the coordinator's failure once that
heartbeat is older than ``wait_timeout_secs`` by the shared filesystem's
clock. Waiting for shards never times out while a lease is live or shards
keep finishing.

The parts: ``run_id`` (which submission), ``rundir`` (its folders and
records), ``spec`` (``JobSpec``), ``elect`` (coordinator roles), ``work``
(the claim loop or the wait, then finalize); this module runs them in order.
Nothing here imports Ray or Data-Juicer: the recipe side comes in through
``JobSpec.make_prepare_request`` and ``JobSpec.make_runner``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from data_juicer_elastic.coordination.elect import coordinate
from data_juicer_elastic.coordination.run_id import local_rank, resolve_run_id
from data_juicer_elastic.coordination.rundir import (
    EXIT_FAILED,
    EXIT_OK,
    Outcome,
    RunDir,
    lobby_root,
    read_outcome,
    run_root,
)
from data_juicer_elastic.coordination.spec import JobSpec, strict_split_ok
from data_juicer_elastic.coordination.work import AfterPrepare
from data_juicer_elastic.errors import ElasticError, UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.prepare.driver import prepare
from data_juicer_elastic.storage.host import hostname
from data_juicer_elastic.worker.signals import Interrupted

Log = Callable[[str], None]

__all__ = ["JobSpec", "Outcome", "run_job"]


def run_job(spec: JobSpec, *, log: Log = print) -> int:
    """Run this process's part of the submission; the exit code is the same on every process."""
    try:
        spec.check()
        return _Session(spec, resolve_run_id(spec.run_id), hostname(), log).execute()
    except ElasticError as exc:
        log(f"FAIL: {exc}")
        return exc.exit_code
    except Interrupted as exc:  # told to stop while coordinating; the others read what it published
        log(f"FAIL: interrupted by {exc}")
        return 128 + exc.signum
    except OSError as exc:  # the shared directory failed this process; the others carry on
        log(f"FAIL: {exc}")
        return EXIT_FAILED


@dataclass
class _Session:
    """One process from start to prepare's outcome; ``AfterPrepare`` takes it from there."""

    spec: JobSpec
    run_id: str
    host: str
    log: Log

    def execute(self) -> int:
        rank = local_rank()
        self.log(
            f"run {self.run_id} on host={self.host} pid={os.getpid()}"
            + (f" local_rank={rank}" if rank is not None else "")
            + f" job_dir={self.spec.job_dir}"
        )
        lobby = RunDir.open(lobby_root(self.spec.job_dir, self.run_id), self.run_id, self.host, subdirs=())
        self.note_replay(lobby)
        outcome = coordinate(lobby, "prepare", self.do_prepare, self.spec, self.log)
        if outcome.exit_code == EXIT_OK:
            job = JobDir(self.spec.job_dir)
            run = RunDir.open(run_root(job.root, self.run_id), self.run_id, self.host)
            run.register(rank)
            outcome = AfterPrepare(self.spec, self.host, self.log, job, run).work_and_finalize()
        self.log(("PASS: " if outcome.exit_code == EXIT_OK else "FAIL: ") + outcome.message)
        return outcome.exit_code

    def note_replay(self, lobby: RunDir) -> None:
        """Say so when this run id already ended: its recorded outcome is all a process will get."""
        prepared = lobby.read("prepare.result.json")
        run = run_root(self.spec.job_dir, self.run_id)
        ended = (
            (prepared if prepared and prepared.exit_code else None)
            or read_outcome(run / "finalize.result.json")
            or read_outcome(run / "abort.json")
        )
        if ended:
            self.log(
                f"run {self.run_id} already ended (exit {ended.exit_code}); reporting its recorded outcome. "
                "To run the job again, submit it with a new run id"
            )

    def do_prepare(self) -> Outcome:
        request = self.spec.make_prepare_request()
        self.check_strict_split(request.policy.num_shards)
        result = prepare(request, log=self.log)
        m = result.manifest
        return Outcome(EXIT_OK, f"prepared {len(m.shards)} shards ({m.total_rows} rows)", self.host, os.getpid())

    def check_strict_split(self, shards: int) -> None:
        """Strict participation only works when no ``nodes - 1`` hosts can do every shard alone."""
        nodes = self.spec.nodes
        if not self.spec.require_all_nodes or nodes is None or strict_split_ok(shards, nodes):
            return
        better = next(s for s in range(shards + 1, nodes * nodes + 1) if strict_split_ok(s, nodes))
        raise UserError(
            f"require_all_nodes with nodes={nodes}: with num_shards={shards} each host may do "
            f"{math.ceil(shards / nodes)} shard(s), so {nodes - 1} hosts could finish the job without the last; "
            f"use num_shards={better}, a multiple of {nodes} or any number from {nodes * (nodes - 1)} up; "
            "or turn require_all_nodes off"
        )
