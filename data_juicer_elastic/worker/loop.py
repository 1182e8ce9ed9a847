"""The claim loop: claim a shard, run it, verify the output, publish done; one loop for every runner.

How a shard is processed is the runner's business (see ``runner.Runner``);
the loop only guarantees the protocol: one live lease per shard, output
written inside the attempt's own directory, a done record published only
after the output was re-read and only under a live lease, a superseded
attempt never publishing, and a per-shard retry budget after which the shard
fails terminally and the job stops.

Look-ahead (``prefetch``, the recipe's ``prefetch_shards``): while shard k is
processed in the main thread (where SIGTERM lands), up to ``prefetch`` more
shards are claimed, checked and loaded by the runner in a background thread,
and shard k-1's output is joined, verified and published by a finisher
thread, so the node never waits between shards. ``prefetch=0`` is the same
loop with no look-ahead: each attempt is opened, processed and finished in
the main thread, one after the other. Claims made ahead hold a renewed lease
each, count toward ``max_shards`` and the claim limit, and toward tail
pacing (this worker's backlog delays it in the earliest-finish simulation).

The parts live beside this module: ``attempt`` (one attempt's three steps),
``stages`` (a runner's load/process/finish), ``scan`` (which shard next),
``budget`` (the retry budget), ``disk_full`` (a full disk stops the worker
without counting against the shard), ``signals`` (SIGTERM/SIGINT stop every
attempt in flight at once), ``speculation`` (backups of late shards) and
``fencing`` (a fenced attempt's runner is stopped).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.job.claims import Lease, claim_store
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.failed import failure_message
from data_juicer_elastic.storage.files import disk_full_in, no_space_error
from data_juicer_elastic.storage.host import hostname
from data_juicer_elastic.worker.attempt import Attempt
from data_juicer_elastic.worker.disk_full import NoSpace, give_back
from data_juicer_elastic.worker.fencing import RunnerStopper
from data_juicer_elastic.worker.pacing import Pace
from data_juicer_elastic.worker.placement import scratch_base
from data_juicer_elastic.worker.runner import Runner
from data_juicer_elastic.worker.scan import ClaimChooser, Scan
from data_juicer_elastic.worker.signals import Interrupted, signals_raise_interrupted
from data_juicer_elastic.worker.speculation import Speculation
from data_juicer_elastic.worker.stages import Stages, in_thread
from data_juicer_elastic.worker.waiting import TailWait

DEFAULT_PREFETCH = 1
# How long a stopping worker waits for shard loads still running in the background. The runner is closed
# after the worker returns; a load still in Ray then touches a shut-down runtime, and Ray's core worker
# ends the whole process (exit 1, not the worker's own code).
LOAD_SETTLE_SECS = 60.0


@dataclass
class WorkerResult:
    exit_code: int
    completed: list[str] = field(default_factory=list)
    message: str = ""
    job_complete: bool = False  # it ended because every shard is done
    stalled: bool = False  # it ended because nothing moved for ``stall_timeout`` while it had nothing to claim


@dataclass(frozen=True)
class End:
    """Why the loop ends: the exit code and the line that says so."""

    exit_code: int
    message: str


def end_of(exc: BaseException, job: JobDir) -> tuple[End, str] | None:
    """The one mapping from an exception that stops the worker to its end and the outcome of attempts in
    flight; None for an exception the worker does not own (it propagates)."""
    if isinstance(exc, Interrupted):
        return End(128 + exc.signum, f"interrupted by {exc}"), "interrupted"
    if isinstance(exc, OSError) and (full := disk_full_in(exc)):  # while claiming: the lease was released
        error = no_space_error(exc.filename or job.claims_dir, full, "claiming a shard")
        return End(error.exit_code, str(error)), "no-space"
    if isinstance(exc, ElasticError):  # a full disk during an attempt, a tampered job dir
        return End(exc.exit_code, str(exc)), "no-space" if "no space left" in str(exc) else "interrupted"
    return None


class Worker:
    """One worker process's view of one job: claims, runs and publishes shards until the job is over for it."""

    def __init__(
        self,
        job_dir: str | os.PathLike | JobDir,
        runner: Runner,
        *,
        prefetch: int = 0,
        host: str | None = None,
        max_shards: int | None = None,
        claim_limit: int | None = None,
        stop_when_idle: bool = False,
        speculation: Speculation | None = None,
        should_stop: Callable[[], bool] | None = None,
        stall_timeout: float | None = None,
        scratch: str | os.PathLike | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        """``scratch``: run every attempt in node-local scratch under this folder and upload its files, as on an
        object store; None: chosen by the job dir's store (in place on POSIX). Not a user's option: tests force
        the object store's path on a POSIX job dir with it."""
        # a JobDir the caller already opened keeps its loaded manifest (its table is checked once a process)
        self.job = job_dir if isinstance(job_dir, JobDir) else JobDir(job_dir, shared_link_check=True)
        self.policy = self.job.manifest().policy
        self.stages = Stages.of(runner)
        self.depth = max(int(prefetch), 0)
        self.host = host or hostname()
        self.max_shards = max_shards
        self.claim_limit = claim_limit
        self.stop_when_idle = stop_when_idle
        self.should_stop = should_stop or (lambda: False)
        self.log = log
        self.scratch = None if scratch is None else scratch_base(self.job, scratch)
        self.store = claim_store(self.job, self.host)
        self.pace = Pace()
        self.chooser = ClaimChooser(self.job, self.store, self.pace, log, speculation)
        self.chooser.backlog = self.backlog  # tail pacing counts the shards held ahead
        self.tail = TailWait(self.job, self.chooser, self.policy, log)
        self.stopper = RunnerStopper()
        self.stall_timeout = stall_timeout  # None: an idle worker waits as long as the job lasts
        self._progress: tuple[int, float] = (-1, time.monotonic())  # (done count seen, when it last moved)
        self.claimed = 0
        self.waiting: deque[Attempt] = deque()  # claimed and loading, not processed yet
        self.finishing: list[tuple[Attempt, Future]] = []
        self.current: Attempt | None = None
        self.stopping = threading.Event()
        self._lock = threading.Lock()  # stopping vs. a claim made ahead in another thread
        self._ahead: Future | None = None  # that claim
        self._last_scan: tuple[bool, set[str]] = (False, set())
        self._loaded_once = False
        self._loads: list[Future] = []  # loads started in the background and maybe not finished

    # one attempt ---------------------------------------------------------------------------------
    def claim_next(self) -> Scan:
        """Claim the next shard: (its lease or None, whether every shard is done, the failed shards)."""
        return self.chooser.claim_next()

    def new_attempt(self, lease: Lease, final: bool) -> Attempt:
        return Attempt(
            self.job,
            self.store,
            lease,
            self.policy,
            self.log,
            pace=self.pace.seconds,
            final=final,
            stopper=self.stopper,
            scratch=self.scratch,
        )

    def run_attempt(self, lease: Lease, final: bool) -> str:
        """Run one claimed attempt to its outcome in this thread; a finished one feeds this worker's pace."""
        attempt = self.new_attempt(lease, final)
        if self._open(attempt, in_background=False):
            processed = attempt.process(self.stages)
            if attempt.outcome is None:
                self._count_pace(attempt, attempt.finish(self.stages, processed))
        return attempt.outcome or "failed"

    def backlog(self) -> float:
        """Seconds before this worker could start a shard it claimed now."""
        return (self.pace.seconds or 0.0) * (len(self.waiting) + (self.current is not None))

    # the loop ------------------------------------------------------------------------------------
    def run(self) -> WorkerResult:
        result = WorkerResult(exit_code=0)
        self.log(f"worker started on host={self.host} pid={self.store.pid} job_dir={self.job.root}")
        with signals_raise_interrupted(), self.stopper:
            try:
                self._loop(result)
            except (Interrupted, OSError, ElasticError) as exc:
                ended = end_of(exc, self.job)
                if ended is None:
                    self._abandon("interrupted")
                    raise
                end, outcome = ended
                self._abandon(outcome)
                result.exit_code, result.message = end.exit_code, end.message
            finally:
                self._release(result)
        return result

    def _release(self, result: WorkerResult) -> None:
        """Let loads end and write this worker's ledger, also when a stop lands meanwhile: the stop is then
        this worker's end (128 + N), and the second try runs through, since repeats of a signal are ignored."""
        for _ in range(2):
            try:
                self._let_loads_end()
                self.store.flush()
                return
            except Interrupted as exc:
                result.exit_code, result.message = 128 + exc.signum, f"interrupted by {exc}"

    def _loop(self, result: WorkerResult) -> None:
        while True:
            self._collect(result, block=False)
            ended = self._should_end(result)
            if ended is not None:
                self._drain(result)
                if not (ended.exit_code == 0 and result.exit_code):  # a failure found while draining wins
                    result.exit_code, result.message = ended.exit_code, ended.message
                return
            if not self.waiting:
                self._top_up(result)
            if not self.waiting:
                if self.finishing:
                    self._collect(result, block=True)
                    continue
                ended = self._when_idle(result)
                if ended is not None:
                    result.exit_code, result.message = ended.exit_code, ended.message
                    return
                continue
            self.current = self.waiting.popleft()
            if self.depth:  # the next shard: claimed and loaded while this one runs
                self._ahead = in_thread(self._top_up, result)
            self._process(self.current)
            self.current = None
            if self._ahead is not None:
                self._ahead.result()  # its errors (a full disk, a tampered job dir) stop the worker here
                self._ahead = None

    # end conditions ------------------------------------------------------------------------------
    def _should_end(self, result: WorkerResult) -> End | None:
        """Checked before every claim: a stop asked for, a limit reached, a shard failed terminally."""
        if self.should_stop():
            return End(1, "stopped before the job completed")
        if self.max_shards is not None and len(result.completed) >= self.max_shards:
            return End(0, f"--max-shards {self.max_shards} reached")
        if self.claim_limit is not None and self.claimed >= self.claim_limit and not self._busy():
            return End(0, f"claimed its share of {self.claim_limit} shard(s)")
        failed = self.chooser.failures.check()  # one stat of the failed folder; listed only when it changed
        if failed:
            return End(2, failure_message(self.job, sorted(failed)[0]))
        return None

    def _when_idle(self, result: WorkerResult) -> End | None:
        """Nothing claimed or running: the job's end, this worker's, or a wait until something changes."""
        (complete, failed), self._last_scan = self._last_scan, (False, set())
        if failed:
            return End(2, failure_message(self.job, sorted(failed)[0]))
        if complete:
            result.job_complete = True
            return End(0, f"all {len(self.chooser.order)} shards done")
        if not self._may_claim(len(result.completed)):
            return End(0, f"claimed its share of {self.claim_limit} shard(s)")
        if self.stop_when_idle:
            return End(1, "no claimable shard left; others still running")
        if self._stalled():
            result.stalled = True
            return End(1, f"nothing claimable, running or finishing for {self.stall_timeout:g}s")
        self.tail.wait()
        return None

    def _stalled(self) -> bool:
        """Idle with nothing live and no shard finishing for ``stall_timeout``: the job cannot move on its own."""
        snap, now = self.chooser.last, time.monotonic()
        done = snap.done if snap is not None else -1
        if snap is None or snap.live or done != self._progress[0]:
            self._progress = (done, now)
            return False
        return self.stall_timeout is not None and now - self._progress[1] > self.stall_timeout

    def _busy(self) -> bool:
        return bool(self.waiting or self.finishing or self.current)

    def _unfinished(self) -> int:
        return len(self.waiting) + len(self.finishing) + (self.current is not None)

    def _may_claim(self, completed: int) -> bool:
        if self.max_shards is not None and completed + self._unfinished() >= self.max_shards:
            return False
        return self.claim_limit is None or self.claimed < self.claim_limit

    def _last_claim(self, completed: int) -> bool:
        """True if this worker's limits let it take no shard after the one it just claimed."""
        return (self.claim_limit is not None and self.claimed >= self.claim_limit) or (
            self.max_shards is not None and completed + 1 >= self.max_shards
        )

    # claiming ------------------------------------------------------------------------------------
    def _top_up(self, result: WorkerResult) -> None:
        """Claim until ``depth`` shards wait (one, when nothing runs), each loading at once."""
        want = self.depth if self.current is not None else 1
        while len(self.waiting) < want and self._may_claim(len(result.completed)):
            lease, complete, failed = self.claim_next()
            if lease is None:
                self._last_scan = (complete, failed)
                return
            self.claimed += 1
            attempt = self.new_attempt(lease, self._last_claim(len(result.completed) + self._unfinished()))
            try:
                if not self._open(attempt, in_background=self.depth > 0 and self._loaded_once):
                    continue
            except Interrupted:  # a load in the main thread, where no list holds the attempt yet
                attempt.abandon("interrupted")
                raise
            with self._lock:
                if not self.stopping.is_set():
                    self.waiting.append(attempt)
                    continue
            attempt.abandon("interrupted")  # the worker stopped while this claim was made
            return

    def _open(self, attempt: Attempt, in_background: bool) -> bool:
        try:
            opened = attempt.open(self.stages, in_background)
        except NoSpace as exc:
            raise give_back(self.job, self.store, attempt.lease, attempt.end, exc, self.log) from exc.error
        except ElasticError:  # a tampered job dir: nothing ran, so the shard is left claimable
            self.store.release(attempt.lease)
            raise
        # The first load runs in the main thread: a runner may start its runtime (Ray) on it.
        self._loaded_once = True
        if opened and attempt.loaded is not None:
            self._loads = [f for f in self._loads if not f.done()] + [attempt.loaded]
        return opened

    # processing and results ----------------------------------------------------------------------
    def _process(self, attempt: Attempt) -> None:
        """Its processing in this (the main) thread; then its finish: in a finisher thread with look-ahead,
        here without."""
        processed = attempt.process(self.stages)
        if attempt.outcome is not None:
            return
        if self.depth:
            self.finishing.append((attempt, in_thread(attempt.finish, self.stages, processed)))
            return
        future: Future = Future()
        try:
            future.set_result(attempt.finish(self.stages, processed))
        except NoSpace as exc:
            future.set_exception(exc)
        self.finishing.append((attempt, future))

    def _collect(self, result: WorkerResult, block: bool) -> None:
        """Outcomes of finished attempts: done ones count, and feed the pace."""
        if block and self.finishing:
            self.finishing[0][1].exception()
        for pair in list(self.finishing):
            attempt, future = pair
            if not future.done():
                continue
            self.finishing.remove(pair)
            error = future.exception()
            if isinstance(error, NoSpace):  # only a full disk escapes the finish stage
                raise give_back(self.job, self.store, attempt.lease, attempt.end, error, self.log) from error.error
            if error is not None:
                raise error
            if self._count_pace(attempt, future.result()):
                result.completed.append(attempt.lease.shard)
                self._progress = (-1, time.monotonic())

    def _count_pace(self, attempt: Attempt, outcome: str) -> bool:
        """A done attempt feeds the pace with its processing time (not its wait behind another shard)."""
        if outcome != "done":
            return False
        self.pace.add(attempt.processing[1] - attempt.processing[0])
        return True

    # stopping ------------------------------------------------------------------------------------
    def _drain(self, result: WorkerResult) -> None:
        """Let attempts being finished end; give back shards claimed ahead and not started."""
        while self.finishing:
            self._collect(result, block=True)
        while self.waiting:
            self.waiting.popleft().abandon("interrupted", "claimed ahead; the worker stopped before running it")

    def _abandon(self, outcome: str) -> None:
        """Stop now: every attempt in flight ends as ``outcome`` and its lease is released."""
        with self._lock:
            self.stopping.set()
        if self._ahead is not None:  # a claim being made ahead ends itself once it sees the stop
            try:
                self._ahead.exception(timeout=10)
            except TimeoutError:
                pass
        attempts = [*self.waiting, *(a for a, _ in self.finishing)] + ([self.current] if self.current else [])
        self.waiting.clear()
        self.finishing.clear()
        for attempt in attempts:
            attempt.abandon(outcome)

    def _let_loads_end(self) -> None:
        """Wait (bounded) for loads of abandoned attempts: nothing may use the runner after it closes."""
        _, running = wait(list(self._loads), timeout=LOAD_SETTLE_SECS)
        if running:
            self.log(f"{len(running)} shard load(s) still run in the background; closing the runner anyway")


def run_worker(
    job_dir: str | os.PathLike | JobDir, runner: Runner, *, prefetch: int = 0, **options: Any
) -> WorkerResult:
    """Run the claim loop until the job is complete, failed, or a limit is reached.

    ``prefetch`` > 0: claim and load that many shards ahead of the one being processed; 0: one at a time.
    """
    return Worker(job_dir, runner, prefetch=prefetch, **options).run()
