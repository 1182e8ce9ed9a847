"""One submission, many identical processes: the whole multi-node job.

The same command is started on every node (and possibly on several ranks per
node). Each process runs ``run_job`` and the processes agree, through the
shared directory alone, on who does what:

1. the run id names the submission (``resolve_run_id``), so a new submission
   gets fresh elections and reuses the job directory as it stands; its
   coordination state lives in ``<job_dir>/runs/<run-key>/``;
2. one process wins the prepare election, validates the recipe and prepares
   (the shards once, then the recipe's generation); the others wait for its
   published outcome, then refuse to work (exit 2, naming what differs) if
   their own recipe or shard settings differ from what it prepared;
3. one process per host wins that host's election and runs the claim loop
   on the generation with the host's runner (Ray); the others only wait;
4. once every shard of the generation is done, finalize: a generation whose
   ``merge.json`` records exactly these done records and whose output is
   still the file it wrote is not merged again; otherwise one process wins
   the generation's finalize election, keyed by the done records and the
   merge record rather than the run id (so processes of different runs, or
   hand-started ones with none, merge once), verifies and merges;
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

import hashlib
import math
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

from data_juicer_elastic.coordination.elect import coordinate
from data_juicer_elastic.coordination.run_id import local_rank, resolve_run_id
from data_juicer_elastic.coordination.rundir import (
    EXIT_FAILED,
    EXIT_OK,
    Outcome,
    RunDir,
    run_key,
)
from data_juicer_elastic.coordination.spec import JobSpec, strict_split_ok
from data_juicer_elastic.coordination.work import AfterPrepare
from data_juicer_elastic.errors import ElasticError, UserError
from data_juicer_elastic.job.layout import JobDir, generation_id
from data_juicer_elastic.prepare.driver import prepare
from data_juicer_elastic.prepare.existing import differences
from data_juicer_elastic.prepare.generation import recipe_differences
from data_juicer_elastic.storage.host import hostname
from data_juicer_elastic.storage.probe import probe_once
from data_juicer_elastic.worker.signals import Interrupted, received, signals_raise_interrupted

Log = Callable[[str], None]

__all__ = ["JobSpec", "Outcome", "run_job"]


def run_job(spec: JobSpec, *, log: Log = print) -> int:
    """Run this process's part of the submission; the exit code is the same on every process.

    A stop signal at any moment (prepare, Ray start-up, a shard, waiting,
    merge) ends it with ``128 + N`` once what it holds is released.
    """
    code = EXIT_FAILED
    with signals_raise_interrupted(suppress=True):
        code = _run_job(spec, log)
    signum = received()
    if signum is not None and code < 128:  # stopped where no handler of ours saw it
        log(f"FAIL: interrupted by {signal.Signals(signum).name}")
    return code if signum is None else 128 + signum


def _run_job(spec: JobSpec, log: Log) -> int:
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
        store = JobDir(self.spec.job_dir).store
        probe_once(store, self.log)  # an object store that lets a second create through is refused (exit 2)
        run = RunDir.open(store, run_key(self.run_id), self.run_id, self.host)
        ended = self.ended_before(run)
        outcome = coordinate(run, "prepare", self.do_prepare, self.spec, self.log, replace_gone=True)
        if outcome.exit_code == EXIT_OK:
            outcome = self.check_same_request(outcome, ended)
        elif ended is not None:
            self.note_replay(ended)
        after = None
        try:
            if outcome.exit_code == EXIT_OK:
                job = JobDir(self.spec.job_dir, outcome.generation, shared_link_check=True)
                run.register(rank)
                after = AfterPrepare(self.spec, self.host, self.log, job, run)
                outcome = after.work_and_finalize()
            self.log(("PASS: " if outcome.exit_code == EXIT_OK else "FAIL: ") + outcome.message)
            return outcome.exit_code
        finally:
            if after is not None:  # after the verdict line: stopping Ray takes a second or two
                after.close_kept_runner()

    def check_same_request(self, prepared: Outcome, ended: Outcome | None = None) -> Outcome:
        """Refuse to work on what the prepare coordinator prepared when this process was asked for something else.

        ``ended``: the run's recorded outcome when the run id had already ended before this process started
        (then one line says so, or, with another recipe, the refusal says it instead)."""
        if prepared.host == self.host and prepared.pid == os.getpid():
            return prepared
        request = self.spec.make_prepare_request()
        job = JobDir(self.spec.job_dir, prepared.generation, shared_link_check=True)
        diffs = differences(job.manifest(), request, None)
        if job.manifest().recipe_sha256 != hashlib.sha256(request.recipe_text).hexdigest():
            theirs = job.store.read(job.key(job.recipe_path))
            if theirs is None:
                diffs.append(f"recipe: the job's snapshot {job.recipe_path} is missing")
            else:
                ours = request.recipe_text.decode("utf-8", "replace")
                diffs += recipe_differences(theirs[0].decode("utf-8", "replace"), ours) or ["recipe: differs"]
        if not diffs:
            if ended is not None:
                self.note_replay(ended)
            return prepared
        if ended is not None:
            message = (
                f"run {self.run_id} already ended (exit {ended.exit_code}) with a different recipe, so this "
                "process's recipe was not run: "
                + "; ".join(diffs)
                + ". To run this recipe, submit it with a new run id (a new generation reuses the shards)"
            )
        else:
            message = (
                f"this process's recipe differs from the one this run prepared (run {self.run_id}, prepared by "
                f"host={prepared.host} pid={prepared.pid}, generation {prepared.generation or '-'}): "
                + "; ".join(diffs)
                + ". It does not work on a recipe it was not given: start every process of a run with the same "
                "recipe; to change the recipe, submit it again as a new run (a new generation reuses the shards)"
            )
        return Outcome(EXIT_FAILED, message, self.host, os.getpid())

    @staticmethod
    def ended_before(run: RunDir) -> Outcome | None:
        """The run's recorded outcome if this run id already ended (a failed prepare, a finalize, an abort)."""
        prepared = run.read("prepare.result.json")
        return (
            (prepared if prepared and prepared.exit_code else None) or run.read("finalize.result.json") or run.aborted()
        ) or None

    def note_replay(self, ended: Outcome) -> None:
        """Say so when this run id already ended: its recorded outcome is all a process will get."""
        self.log(
            f"run {self.run_id} already ended (exit {ended.exit_code}); reporting its recorded outcome. "
            "To run the job again, submit it with a new run id"
        )

    def do_prepare(self) -> Outcome:
        request = self.spec.make_prepare_request()
        self.check_strict_split(request.policy.num_shards)
        result = prepare(request, log=self.log)
        m = result.manifest
        job = JobDir(request.job_dir)
        gen = "" if job.legacy() else generation_id(hashlib.sha256(request.recipe_text).hexdigest())
        return Outcome(
            EXIT_OK,
            f"prepared {len(m.shards)} shards ({m.total_rows} rows), generation {gen or '-'}",
            self.host,
            os.getpid(),
            generation=gen,
        )

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
