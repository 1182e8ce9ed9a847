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

Nothing here imports Ray or Data-Juicer: the recipe side comes in through
``JobSpec.make_prepare_request`` and ``JobSpec.make_runner``.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from data_juicer_elastic.errors import ElasticError, IntegrityError, UserError
from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.job.identity import hostname
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.versions import check_versions
from data_juicer_elastic.merge import merge, verify
from data_juicer_elastic.prepare.driver import prepare
from data_juicer_elastic.status import failure_message
from data_juicer_elastic.storage.files import (
    atomic_write,
    dumps_json,
    publish_once,
    read_json,
    read_record,
    server_now,
    touch,
)
from data_juicer_elastic.worker.loop import Interrupted, Runner, run_worker, signals_raise_interrupted

if TYPE_CHECKING:
    from data_juicer_elastic.prepare.driver import PrepareRequest

Log = Callable[[str], None]

RUN_ID_ENV = "DJ_ELASTIC_RUN_ID"
# Launcher job ids, in order of preference; each is shared by every process of one submission.
LAUNCHER_RUN_ID_ENVS = ("PAI_JOB_ID", "DLC_JOB_ID", "JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
# Set by launchers that start several processes; > 1 means this process is not alone.
WORLD_SIZE_ENVS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS")
LOCAL_RANK_ENVS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID")

EXIT_OK, EXIT_FAILED = 0, 2


@dataclass(frozen=True)
class JobSpec:
    """What every process of one submission is asked to do.

    ``make_prepare_request`` is called only by the prepare coordinator (it
    validates the recipe and may raise ``UserError``); ``make_runner`` only by
    the one claim-loop process of each host (it starts that host's Ray). A
    runner with a ``close()`` method is closed when the claim loop ends.

    ``nodes`` is informational in elastic mode. With ``require_all_nodes``
    every host completes at most ``ceil(shards / nodes)`` shards in this run,
    so the job can only finish when all ``nodes`` hosts took part; a missing
    node fails the job once nothing has progressed for ``wait_timeout_secs``.

    ``overwrite_output`` defaults to True because ``export_path`` is the
    recipe's own output, which ``dj-process`` overwrites too; rerunning a
    finished job then merges the same verified outputs again.
    """

    job_dir: str
    export_path: str
    make_prepare_request: Callable[[], PrepareRequest]
    make_runner: Callable[[], Runner]
    run_id: str | None = None
    nodes: int | None = None
    require_all_nodes: bool = False
    max_shards: int | None = None
    prefetch_shards: int = 1
    wait_timeout_secs: float | None = 3600.0
    poll_interval_secs: float = 5.0
    allow_version_mismatch: bool = False
    overwrite_output: bool = True

    def check(self) -> None:
        if self.nodes is not None and self.nodes < 1:
            raise UserError(f"elastic_shard.nodes must be at least 1, got {self.nodes}")
        if self.require_all_nodes and not self.nodes:
            raise UserError("elastic_shard.require_all_nodes needs elastic_shard.nodes (how many nodes must take part)")
        if self.max_shards is not None and self.max_shards < 1:
            raise UserError(f"elastic_shard.max_shards must be at least 1, got {self.max_shards}")
        if self.prefetch_shards < 0:
            raise UserError(f"elastic_shard.prefetch_shards must be 0 or more, got {self.prefetch_shards}")
        if (self.wait_timeout_secs is not None and self.wait_timeout_secs <= 0) or self.poll_interval_secs <= 0:
            raise UserError("elastic_shard.wait_timeout_secs and poll_interval_secs must be positive")

    @property
    def timeout(self) -> float:
        """``wait_timeout_secs``, where None (wait indefinitely) is infinity."""
        return math.inf if self.wait_timeout_secs is None else self.wait_timeout_secs


@dataclass(frozen=True)
class Outcome:
    """A published result: every process that reads it exits with ``exit_code``."""

    exit_code: int
    message: str
    host: str = ""
    pid: int = 0
    hosts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping) -> Outcome:
        return cls(
            int(d["exit_code"]),
            str(d["message"]),
            str(d.get("host", "")),
            int(d.get("pid", 0)),
            dict(d.get("hosts") or {}),
        )


# run id ------------------------------------------------------------------------------------------


def resolve_run_id(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The submission's id: explicit, ``DJ_ELASTIC_RUN_ID``, a launcher's job id, or a fresh one.

    A fresh id is only safe for a lone process: several processes of one
    launch would each invent their own and never meet.
    """
    env = os.environ if env is None else env
    if explicit:
        return explicit
    for name in (RUN_ID_ENV, *LAUNCHER_RUN_ID_ENVS):
        value = env.get(name, "").strip()
        if value and value.lower() != "none":  # torchrun's default --rdzv-id is "none"
            if name == "SLURM_JOB_ID" and env.get("SLURM_STEP_ID"):
                value += "." + env["SLURM_STEP_ID"]  # each srun step is its own submission
            return value
    sizes = {name: env[name] for name in WORLD_SIZE_ENVS if _int(env.get(name)) > 1}
    if sizes:
        found = ", ".join(f"{k}={v}" for k, v in sizes.items())
        raise UserError(
            f"this launch starts several processes ({found}) but none of {', '.join(LAUNCHER_RUN_ID_ENVS)} is set, "
            "so they cannot tell they belong to one submission; set the same unique id on every process with "
            f"elastic_shard.run_id or the {RUN_ID_ENV} environment variable (a new id for each submission)"
        )
    return f"local-{uuid.uuid4().hex[:12]}"


def local_rank(env: Mapping[str, str] | None = None) -> int | None:
    """The launcher's rank of this process on its host, if any (logged only: hosts elect)."""
    env = os.environ if env is None else env
    for name in LOCAL_RANK_ENVS:
        if name in env:
            return _int(env[name])
    return None


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def safe_key(text: str, limit: int = 48) -> str:
    """A file name for ``text``: readable prefix plus a hash, so distinct texts never collide."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:limit].strip("._-") or "x"
    return f"{readable}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


# the run directories -----------------------------------------------------------------------------


def lobbies_dir(job_dir: str | os.PathLike) -> Path:
    """Prepare elections live beside the job dir: prepare creates the job dir whole, by one rename."""
    job = Path(os.path.abspath(job_dir))
    return job.parent / f".{job.name}.runs"


def lobby_root(job_dir: str | os.PathLike, run_id: str) -> Path:
    """Where the prepare election of one run lives."""
    return lobbies_dir(job_dir) / safe_key(run_id)


def run_root(job_dir: str | os.PathLike, run_id: str) -> Path:
    """Where everything after prepare lives: ``<job_dir>/runs/<run-key>/``."""
    return Path(os.path.abspath(job_dir)) / "runs" / safe_key(run_id)


@dataclass(frozen=True)
class RunDir:
    """One folder of a run's coordination state: elections, outcomes, abort, members."""

    root: Path
    run_id: str
    host: str
    pid: int

    @classmethod
    def open(cls, root: Path, run_id: str, host: str, subdirs: tuple[str, ...] = ("hosts", "members")) -> RunDir:
        try:
            for sub in (*subdirs, "clock"):
                (root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(
                f"{root}: cannot create the run's coordination folder ({exc.strerror}); "
                "check that the job dir's parent is on the shared filesystem and writable"
            ) from exc
        publish_once(root / "run.json", dumps_json({"run_id": run_id, "created_at": time.time()}))
        return cls(root, run_id, host, os.getpid())

    def path(self, name: str) -> Path:
        return self.root / name

    def now(self) -> float:
        return server_now(self.root / "clock" / f"{safe_key(self.host)}-{self.pid}")

    def register(self, rank: int | None) -> None:
        record = {"host": self.host, "pid": self.pid, "local_rank": rank, "at": time.time()}
        atomic_write(self.root / "members" / f"{safe_key(self.host)}-{self.pid}.json", dumps_json(record))

    def member_hosts(self) -> list[str]:
        names = [n for n in os.listdir(self.root / "members") if n.endswith(".json") and not n.startswith(".")]
        return sorted({read_record(self.root / "members" / n).get("host", "?") for n in names})

    def elect(self, name: str) -> tuple[bool, dict]:
        """Stand in the election ``name``: (won, the winner's ballot)."""
        ballot = {"host": self.host, "pid": self.pid, "at": time.time()}
        if publish_once(self.path(name), dumps_json(ballot)):
            return True, ballot
        return False, read_record(self.path(name))

    def publish(self, name: str, outcome: Outcome) -> Outcome:
        """Publish ``outcome`` unless one is there already; return the one that counts."""
        if publish_once(self.path(name), dumps_json(asdict(outcome))):
            return outcome
        return self.read(name) or outcome

    def read(self, name: str) -> Outcome | None:
        try:
            return Outcome.from_dict(read_json(self.path(name)))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return Outcome(EXIT_FAILED, f"{self.path(name)} is unreadable ({exc!r})")

    def abort(self, message: str) -> Outcome:
        """Stop the whole run; the first abort wins and every process reports it."""
        return self.publish("abort.json", Outcome(EXIT_FAILED, message, self.host, self.pid))

    def aborted(self) -> Outcome | None:
        return self.read("abort.json")

    def heartbeat_age(self, name: str) -> float:
        try:
            return self.now() - os.stat(self.path(name)).st_mtime
        except FileNotFoundError:
            return 0.0


class Pulse:
    """Renews an election file's mtime while its winner works, so waiters can tell it is alive."""

    def __init__(self, path: Path, interval: float) -> None:
        self.path = path
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pulse-{path.name}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                touch(self.path)
            except OSError:
                continue  # a flaky mount: the heartbeat just ages meanwhile

    def __enter__(self) -> Pulse:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# one process's part -----------------------------------------------------------------------------


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
    """One process from start to prepare's outcome; ``_AfterPrepare`` takes it from there."""

    spec: JobSpec
    run_id: str
    host: str
    log: Log

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def pulse_interval(self) -> float:
        return min(self.spec.poll_interval_secs, self.spec.timeout / 4)

    def execute(self) -> int:
        rank = local_rank()
        self.log(
            f"run {self.run_id} on host={self.host} pid={self.pid}"
            + (f" local_rank={rank}" if rank is not None else "")
            + f" job_dir={self.spec.job_dir}"
        )
        lobby = RunDir.open(lobby_root(self.spec.job_dir, self.run_id), self.run_id, self.host, subdirs=())
        self.note_replay(lobby)
        outcome = self.coordinate(lobby, "prepare", self.do_prepare)
        if outcome.exit_code == EXIT_OK:
            job = JobDir(self.spec.job_dir)
            run = RunDir.open(run_root(job.root, self.run_id), self.run_id, self.host)
            run.register(rank)
            outcome = _AfterPrepare(self.spec, self.run_id, self.host, self.log, job, run).work_and_finalize()
        return self.report(outcome)

    def note_replay(self, lobby: RunDir) -> None:
        """Say so when this run id already ended: its recorded outcome is all a process will get."""
        prepared = lobby.read("prepare.result.json")
        run = run_root(self.spec.job_dir, self.run_id)
        ended = (
            (prepared if prepared and prepared.exit_code else None)
            or _outcome(run / "finalize.result.json")
            or _outcome(run / "abort.json")
        )
        if ended:
            self.log(
                f"run {self.run_id} already ended (exit {ended.exit_code}); reporting its recorded outcome. "
                "To run the job again, submit it with a new run id"
            )

    def report(self, outcome: Outcome) -> int:
        self.log(("PASS: " if outcome.exit_code == EXIT_OK else "FAIL: ") + outcome.message)
        return outcome.exit_code

    # coordinator roles ------------------------------------------------------------------------
    def coordinate(self, run: RunDir, role: str, work: Callable[[], Outcome]) -> Outcome:
        """Win ``role``'s election and publish ``work()``'s outcome, or wait for the winner's."""
        won, ballot = run.elect(f"{role}.coordinator.json")
        if not won:
            self.log(f"{role} coordinator is host={ballot.get('host')} pid={ballot.get('pid')}; waiting for it")
            return self.wait_for_result(run, role, ballot)
        self.log(f"elected as {role} coordinator")
        result = f"{role}.result.json"
        with Pulse(run.path(f"{role}.coordinator.json"), self.pulse_interval):
            try:
                with signals_raise_interrupted():
                    outcome = work()
            except ElasticError as exc:
                outcome = Outcome(exc.exit_code, f"{role} failed on host={self.host}: {exc}")
            except Interrupted as exc:
                run.publish(
                    result,
                    Outcome(
                        EXIT_FAILED,
                        f"the {role} coordinator on host={self.host} was interrupted ({exc}); submit the job again",
                    ),
                )
                raise
            except Exception as exc:  # a bug or an unexpected OS error: still tell the others
                self.log(traceback.format_exc())
                outcome = Outcome(EXIT_FAILED, f"{role} failed on host={self.host}: {type(exc).__name__}: {exc}")
            return run.publish(result, outcome)

    def wait_for_result(self, run: RunDir, role: str, ballot: dict) -> Outcome:
        """Poll for the coordinator's outcome; when its heartbeat stops, publish its failure instead."""
        timeout = self.spec.timeout
        result = f"{role}.result.json"
        while True:
            outcome = run.read(result) or run.aborted()
            if outcome:
                return outcome
            age = run.heartbeat_age(f"{role}.coordinator.json")
            if age > timeout:
                return run.publish(
                    result,
                    Outcome(
                        EXIT_FAILED,
                        (
                            f"the {role} coordinator (host={ballot.get('host')} pid={ballot.get('pid')}) published no "
                            f"result and its heartbeat stopped {age:.0f}s ago (wait_timeout_secs={timeout:g}); it was "
                            "probably killed. Submit the job again (a new run id): the job directory is reused and "
                            "only "
                            "unfinished work is redone"
                        ),
                        self.host,
                        self.pid,
                    ),
                )
            time.sleep(self.spec.poll_interval_secs)

    # prepare ------------------------------------------------------------------------------------
    def do_prepare(self) -> Outcome:
        request = self.spec.make_prepare_request()
        self.check_strict_split(request.policy.num_shards)
        result = prepare(request, log=self.log)
        m = result.manifest
        return Outcome(EXIT_OK, f"prepared {len(m.shards)} shards ({m.total_rows} rows)", self.host, self.pid)

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


@dataclass
class _AfterPrepare(_Session):
    """The same process once the job dir exists: claim loop or wait, then finalize."""

    job: JobDir
    run: RunDir  # <job_dir>/runs/<run-key>

    def work_and_finalize(self) -> Outcome:
        return self.work_phase() or self.finalize_phase()

    # work ---------------------------------------------------------------------------------------
    def work_phase(self) -> Outcome | None:
        """Run this host's claim loop (or wait for it); None once every shard is done."""
        won, ballot = self.run.elect(f"hosts/{safe_key(self.host)}.json")
        if not won:
            self.log(
                f"pid={ballot.get('pid')} runs the claim loop for host={self.host}; "
                "this process waits for the job result"
            )
            return self.wait_for_shards()
        early = self.run.aborted() or self.failed_outcome()
        if early or self.all_done():  # nothing to claim: do not start a runner
            return early
        return self.claim_loop() or self.wait_for_shards()

    def claim_loop(self) -> Outcome | None:
        """Work shards with this host's runner; an outcome only when this process must stop now."""
        try:
            check_versions(self.job.manifest().versions, allow_mismatch=self.spec.allow_version_mismatch)
            runner = self.spec.make_runner()
        except Exception as exc:
            return self.run.abort(f"host={self.host} cannot run shards: {type(exc).__name__}: {exc}")
        try:
            result = run_worker(
                self.job.root,
                runner,
                host=self.host,
                max_shards=self.shard_quota(),
                prefetch=self.spec.prefetch_shards,
                should_stop=lambda: self.run.aborted() is not None,
                log=self.log,
            )
        finally:
            _close(runner)
        if result.exit_code >= 128:  # this process was told to stop: it leaves, the job goes on
            return Outcome(result.exit_code, f"host={self.host}: {result.message}", self.host, self.pid)
        if result.exit_code == EXIT_FAILED:
            return self.run.abort(result.message)
        return None

    def shard_quota(self) -> int | None:
        """Most shards this host may complete in this run (completed, not claimed: retries are free)."""
        limits = [self.spec.max_shards]
        if self.spec.require_all_nodes and self.spec.nodes:
            limits.append(math.ceil(len(self.job.manifest().shards) / self.spec.nodes))
        given = [x for x in limits if x is not None]
        return min(given) if given else None

    def wait_for_shards(self) -> Outcome | None:
        """Wait until every shard is done (None), a failure, an abort, or no progress for the timeout."""
        store = ClaimStore(self.job, lock_timeout=self.job.manifest().policy.lock_timeout_secs, host=self.host)
        total = len(self.job.manifest().shards)
        last_done, last_progress = -1, time.monotonic()
        while True:
            outcome = self.run.aborted() or self.failed_outcome()
            if outcome:
                return outcome
            done = self.job.done_ids()
            if len(done) == total:
                return None
            if len(done) != last_done or _any_live(store, done):
                last_done, last_progress = len(done), time.monotonic()
            elif time.monotonic() - last_progress > self.spec.timeout:
                return self.run.abort(self.stall_message(done))
            time.sleep(self.spec.poll_interval_secs)

    def failed_outcome(self) -> Outcome | None:
        failed = sorted(self.job.failed_ids())
        return self.run.abort(failure_message(self.job, failed[0])) if failed else None

    def all_done(self) -> bool:
        return len(self.job.done_ids()) == len(self.job.manifest().shards)

    def stall_message(self, done: set[str]) -> str:
        shards = [s.id for s in self.job.manifest().shards]
        left = [s for s in shards if s not in done]
        seen = self.run.member_hosts()
        done_by = _hosts_of(self.job, done)
        parts = [
            f"no shard finished and none was running for {self.spec.wait_timeout_secs:g}s "
            f"(wait_timeout_secs); {len(left)} of {len(shards)} shards are not done: {_some(left)}",
            f"hosts seen in this run: {len(seen)} ({', '.join(seen)})",
            "done by host: " + (", ".join(f"{h}={n}" for h, n in sorted(done_by.items())) or "none"),
        ]
        if self.spec.require_all_nodes and self.spec.nodes:
            missing = max(self.spec.nodes - len(seen), 1)
            parts.append(
                f"require_all_nodes expects {self.spec.nodes} nodes and lets each complete at most "
                f"{self.shard_quota()} shard(s), so {missing} missing node(s) must take part"
            )
        else:
            parts.append("no live worker is left; start more nodes or submit the job again")
        return "; ".join(parts)

    # finalize -----------------------------------------------------------------------------------
    def finalize_phase(self) -> Outcome:
        return self.run.aborted() or self.coordinate(self.run, "finalize", self.do_finalize)

    def do_finalize(self) -> Outcome:
        """Check the records and hosts, then merge (which re-reads and checks every output as it copies)."""
        nodes = self.spec.nodes if self.spec.require_all_nodes else None
        report = verify(self.job, expect_nodes=nodes, check_content=False)
        hosts = dict(report.hosts)
        listing = ", ".join(f"{h}={n}" for h, n in sorted(hosts.items()))
        self.log(f"completion hosts: {listing}")
        if not report.ok or not report.complete:
            raise IntegrityError("verify refused the job: " + "; ".join(report.problems or ["incomplete"]))
        merged = merge(self.job, self.spec.export_path, overwrite=self.spec.overwrite_output, log=self.log)
        expected = f" ({len(hosts)} of {self.spec.nodes} expected nodes)" if self.spec.nodes else ""
        return Outcome(
            EXIT_OK,
            f"{merged.shards} shards completed by {len(hosts)} host(s){expected}: {listing}; "
            f"{merged.rows} rows merged into {merged.output}",
            self.host,
            self.pid,
            hosts,
        )


# read-only view ----------------------------------------------------------------------------------


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
    job = Path(os.path.abspath(job_dir))
    lobbies = lobbies_dir(job)
    keys = {e.name for base in (lobbies, job / "runs") if base.is_dir() for e in os.scandir(base) if e.is_dir()}
    summaries = [_summary(lobbies / key, job / "runs" / key) for key in keys]
    return sorted(summaries, key=lambda r: r.created_at)


def _summary(lobby: Path, run: Path) -> RunSummary:
    info = read_record(lobby / "run.json") or read_record(run / "run.json")
    prepare_result, finalize = _outcome(lobby / "prepare.result.json"), _outcome(run / "finalize.result.json")
    failed_prepare = prepare_result if prepare_result and prepare_result.exit_code else None
    hosts_dir, members_dir = run / "hosts", run / "members"
    loops = [read_record(hosts_dir / n) for n in (os.listdir(hosts_dir) if hosts_dir.is_dir() else ())]
    members = [read_record(members_dir / n) for n in (os.listdir(members_dir) if members_dir.is_dir() else ())]
    return RunSummary(
        run_id=str(info.get("run_id", run.name)),
        created_at=float(info.get("created_at", 0.0)),
        prepared_by=_who(lobby / "prepare.coordinator.json"),
        claim_loops={b["host"]: b.get("pid", 0) for b in loops if "host" in b},
        members=sorted({m["host"] for m in members if "host" in m}),
        finalized_by=_who(run / "finalize.coordinator.json"),
        outcome=finalize or _outcome(run / "abort.json") or failed_prepare,
    )


def _who(ballot: Path) -> str:
    b = read_record(ballot)
    return f"{b['host']} pid {b.get('pid')}" if "host" in b else ""


def _outcome(path: Path) -> Outcome | None:
    d = read_record(path)
    try:
        return Outcome.from_dict(d) if d else None
    except (KeyError, TypeError, ValueError):
        return None


# helpers -----------------------------------------------------------------------------------------


def strict_split_ok(shards: int, nodes: int) -> bool:
    """True when ``nodes - 1`` hosts, each capped at ``ceil(shards / nodes)``, cannot do every shard."""
    return shards >= nodes and (nodes - 1) * math.ceil(shards / nodes) < shards


def _any_live(store: ClaimStore, done: set[str]) -> bool:
    pending = {sid: n for sid, n in store.latest_attempts().items() if sid not in done}
    if not pending:
        return False
    now = store.now()
    return any(store.is_live(sid, n, now) for sid, n in pending.items())


def _hosts_of(job: JobDir, done: set[str]) -> dict[str, int]:
    hosts: dict[str, int] = {}
    for sid in done:
        host = read_record(job.done_path(sid)).get("host", "?")
        hosts[host] = hosts.get(host, 0) + 1
    return hosts


def _some(items: list[str], limit: int = 8) -> str:
    return ", ".join(items[:limit]) + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


def _close(runner: object) -> None:
    close = getattr(runner, "close", None)
    if callable(close):
        close()
