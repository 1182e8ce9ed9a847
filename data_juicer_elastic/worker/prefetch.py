"""Prefetch: the node never waits between shards.

A sequential worker leaves its node idle between two shards while it
joins, re-reads and publishes one output, claims the next shard, hashes it
and reads it in. A prefetching worker splits each attempt into three stages
and overlaps them: while shard k is processed (in the main thread, where
SIGTERM lands), shard k+1 is already claimed, checked against the manifest
and loaded by the runner (loader thread), and shard k-1's output is joined,
verified and published (finisher thread). ``prefetch`` is how many claimed
shards may wait behind the one being processed.

Every attempt still goes through the claim loop's own steps (its folder,
attempt record, heartbeat, shard check, output re-read, superseded check,
publish-once), so the protocol is unchanged: each claimed shard holds one
live, renewed lease; a superseded attempt never publishes; done comes only
after verification. Claims made ahead count for ``max_shards`` and the claim
limit, and for tail pacing (this worker's backlog delays it in the
earliest-finish simulation, so near the end it leaves shards to idle
workers). SIGTERM or SIGINT ends every attempt in flight as interrupted and
releases its lease at once.

A runner opts in with three methods, ``load(shard, output, job_dir)`` (any
thread), ``process(loaded)`` (main thread) and ``finish(processed)`` (any
thread); a plain runner callable is run whole in the process stage.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any

from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.job.claims import heartbeat
from data_juicer_elastic.job.records.failed import failure_message
from data_juicer_elastic.storage.files import disk_full_in, no_space_error
from data_juicer_elastic.worker.attempt import TERMINAL, Attempt, ShardMismatch, claim_note, verified_shard
from data_juicer_elastic.worker.disk_full import NoSpace, give_back
from data_juicer_elastic.worker.fencing import Fenced
from data_juicer_elastic.worker.loop import Worker, WorkerResult
from data_juicer_elastic.worker.outputs import inspect_output
from data_juicer_elastic.worker.signals import Interrupted, received, signals_raise_interrupted

DEFAULT_PREFETCH = 1
# How long a stopping worker waits for shard loads still running in the background. The runner is closed
# after the worker returns; a load still in Ray then touches a shut-down runtime, and Ray's core worker
# ends the whole process (exit 1, not the worker's own code).
LOAD_SETTLE_SECS = 60.0


@dataclass
class Stages:
    """A runner's three stages (a plain runner: everything in ``process``)."""

    load: Callable[[str, str, str], Any]
    process: Callable[[Any], Any]
    finish: Callable[[Any], None]

    @classmethod
    def of(cls, runner: Any) -> Stages:
        if all(callable(getattr(runner, n, None)) for n in ("load", "process", "finish")):
            return cls(runner.load, runner.process, runner.finish)
        return cls(lambda *args: args, lambda args: runner(*args), lambda _: None)


class StagedAttempt(Attempt):
    """One attempt split into open (+ load), process and finish; each step is the claim loop's own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcome: str | None = None
        self.lock = threading.Lock()
        self.beat: Any = None  # the lease's refresher, from open() on
        self.processing = (0.0, 0.0)  # monotonic start and end of the process stage
        self.running = False  # in the process stage now: only then may a lost race stop the runner
        self.opened = time.monotonic()  # when it was claimed and opened (this node's clock)

    def open(self, stages: Stages, in_background: bool) -> bool:
        """Folder, record, heartbeat, shard check, then the load; False if the attempt already ended."""
        self.opened = time.monotonic()
        self._make_folder()
        self._save()
        self.log(
            f"claimed {self.name}{claim_note(self.job, self.lease.shard, self.lease.attempt, self.lease.backup_of)}"
        )
        beat = heartbeat(self.store, self.lease, self.policy.heartbeat_secs, self.log, on_lost=self._lost_race)
        self.beat = beat.__enter__()
        try:
            shard = verified_shard(self.job, self.lease.shard)
        except ShardMismatch as exc:  # retrying cannot heal an edited shard
            self.fail(exc, terminal=True)
            return False
        args = (str(shard), str(self.output), str(self.job.gen_dir))  # names the generation
        self.loaded = in_thread(stages.load, *args) if in_background else at_once(stages.load, *args)
        return True

    def process(self, stages: Stages) -> Any:
        """The runner's process stage (main thread); None if the attempt ended (failed, fenced)."""
        if self._beaten():  # another attempt published done while this one waited
            self.beat.__exit__(None, None, None)
            self.outcome = self._fenced()
            return None
        try:
            loaded = self.loaded.result()
            start = time.monotonic()
            self._note_processing_start(start)
            self.running = True
            self.stopper.arm()
            try:
                processed = stages.process(loaded)
            finally:
                self.stopper.disarm()
                self.running = False
            self.processing = (start, time.monotonic())
            return processed
        except Fenced:  # the heartbeat found the attempt fenced and stopped the runner
            self.beat.__exit__(None, None, None)
            self.outcome = self._fenced()
            return None
        except Interrupted:
            raise
        except Exception as exc:  # the runner's failure fails the attempt, not the worker
            if (signum := received()) is not None:  # the runner wrapped our Interrupted in its own error
                raise Interrupted(signum) from exc
            if full := disk_full_in(exc):
                error = give_back(self.job, self.store, self.lease, self.record, NoSpace(self.output, full), self.log)
                raise error from exc
            self.fail(exc)
            return None

    def _note_processing_start(self, start: float) -> None:
        """A shard that waited behind another since its claim: speculation times it from now, not its claim.

        The shared clock's claim time plus this node's monotonic wait: no clock of another node is involved.
        """
        waited = start - self.opened
        if waited >= 1.0 and self.lease.claimed_at > 0:
            self.record.processing_at = self.lease.claimed_at + waited
            self._save()

    def finish(self, stages: Stages, processed: Any) -> str:
        """Join, re-read, publish (finisher thread); ``NoSpace`` escapes to stop the worker."""
        try:
            stages.finish(processed)
            digest = inspect_output(self.output)
        except Exception as exc:
            if full := disk_full_in(exc):
                raise NoSpace(self.output, full) from exc
            with self.lock:
                return self.outcome or self.fail(exc)
        self.beat.__exit__(None, None, None)
        with self.lock:
            if self.outcome is not None:  # abandoned meanwhile (SIGTERM)
                return self.outcome
            if self._beaten():
                self.outcome = self._fenced()
            else:
                self.outcome = self._publish(digest)
            return self.outcome

    def _beaten(self) -> bool:
        """Superseded, or another attempt of the shard (a backup, or the one this backs up) published done."""
        lost = getattr(self, "beat", None) is not None and self.beat.lost.is_set()
        return lost or not self.store.is_current(self.lease) or self.job.done_path(self.lease.shard).exists()

    def _lost_race(self) -> None:
        """Stop the runner only if it is running this attempt (another may be processed while this one waits)."""
        if self.running:
            super()._lost_race()

    def fail(self, exc: Exception, terminal: bool = False) -> str:
        self.beat.__exit__(None, None, None)
        self.outcome = self._failed(exc, terminal or isinstance(exc, TERMINAL))
        return self.outcome

    def abandon(self, outcome: str, error: str | None = None) -> None:
        """End now as ``outcome`` (interrupted, given back) and release the lease, unless already ended."""
        with self.lock:
            if self.outcome is not None:
                return
            self.outcome = outcome
        if self.beat is not None:  # None: stopped before open() started it
            self.beat.__exit__(None, None, None)
        try:
            self._end(outcome, error)
        except OSError:
            pass
        self.store.release(self.lease)


class PrefetchWorker(Worker):
    """The claim loop with the next shards claimed and loaded ahead (see the module docstring)."""

    def __init__(self, job_dir: Any, runner: Any, *, prefetch: int = DEFAULT_PREFETCH, **options: Any) -> None:
        super().__init__(job_dir, runner, **options)
        self.depth = max(int(prefetch), 0)
        self.stages = Stages.of(runner)
        self.waiting: deque[StagedAttempt] = deque()
        self.finishing: list[tuple[StagedAttempt, Future]] = []
        self.current: StagedAttempt | None = None
        self.stopping = threading.Event()
        self.timings: list[tuple[float, float]] = []  # (start, end) of each process stage, in order
        self.chooser.backlog = self.backlog  # tail pacing counts the shards held ahead
        self._loaded_once = False
        self._lock = threading.Lock()  # stopping vs. a claim made ahead in another thread
        self._ahead: Future | None = None  # that claim
        self._last_scan: tuple[bool, set[str]] = (False, set())
        self._loads: list[Future] = []  # loads started in the background and maybe not finished

    def backlog(self) -> float:
        """Seconds before this worker could start a shard it claimed now."""
        return (self.pace.seconds or 0.0) * (len(self.waiting) + (self.current is not None))

    # the loop ---------------------------------------------------------------
    def run(self) -> WorkerResult:
        result = WorkerResult(exit_code=0)
        self.log(f"worker started on host={self.host} pid={self.store.pid} job_dir={self.job.root}")
        with signals_raise_interrupted(), self.stopper:
            try:
                self._loop(result)
            except Interrupted as exc:
                self._abandon("interrupted")
                result.exit_code, result.message = 128 + exc.signum, f"interrupted by {exc}"
            except OSError as exc:  # a full disk while claiming: the lease was released
                self._abandon("no-space")
                if not (full := disk_full_in(exc)):
                    raise
                error = no_space_error(exc.filename or self.job.claims_dir, full, "claiming a shard")
                result.exit_code, result.message = error.exit_code, str(error)
            except ElasticError as exc:  # a full disk during an attempt, a tampered job dir
                self._abandon("no-space" if "no space left" in str(exc) else "interrupted")
                result.exit_code, result.message = exc.exit_code, str(exc)
            finally:
                self._let_loads_end()
                self.store.flush()
        return result

    def _let_loads_end(self) -> None:
        """Wait (bounded) for loads of abandoned attempts: nothing may use the runner after it closes."""
        _, running = wait(list(self._loads), timeout=LOAD_SETTLE_SECS)
        if running:
            self.log(f"{len(running)} shard load(s) still run in the background; closing the runner anyway")

    def _loop(self, result: WorkerResult) -> None:
        while True:
            self._collect(result, block=False)
            ended = self._should_end(result)
            if ended is not None:
                self._drain(result)
                if not (ended[0] == 0 and result.exit_code):  # a failure found while draining wins
                    result.exit_code, result.message = ended
                return
            if not self.waiting:
                self._top_up(result)
            if not self.waiting:
                if self.finishing:
                    self._collect(result, block=True)
                elif self._idle(result):
                    return
                continue
            self.current = self.waiting.popleft()
            self._ahead = in_thread(self._top_up, result)  # the next shard: claimed and loaded while this one runs
            self._process(self.current)
            self.current = None
            self._ahead.result()  # its errors (a full disk, a tampered job dir) stop the worker here

    def _should_end(self, result: WorkerResult) -> tuple[int, str] | None:
        if self.should_stop():
            return 1, "stopped before the job completed"
        if self.max_shards is not None and len(result.completed) >= self.max_shards:
            return 0, f"--max-shards {self.max_shards} reached"
        if self.claim_limit is not None and self.claimed >= self.claim_limit and not self._busy():
            return 0, f"claimed its share of {self.claim_limit} shard(s)"
        failed = self.chooser.failures.check()  # one stat of the failed folder; listed only when it changed
        if failed:
            return 2, failure_message(self.job, sorted(failed)[0])
        return None

    def _busy(self) -> bool:
        return bool(self.waiting or self.finishing or self.current)

    def _unfinished(self) -> int:
        return len(self.waiting) + len(self.finishing) + (self.current is not None)

    def _may_claim(self, completed: int) -> bool:
        if self.max_shards is not None and completed + self._unfinished() >= self.max_shards:
            return False
        return self.claim_limit is None or self.claimed < self.claim_limit

    def _top_up(self, result: WorkerResult) -> None:
        """Claim until ``depth`` shards wait (one, when nothing runs), each loading at once."""
        want = self.depth if self.current is not None else 1
        while len(self.waiting) < want and self._may_claim(len(result.completed)):
            lease, complete, failed = self.claim_next()
            if lease is None:
                self._last_scan = (complete, failed)
                return
            self.claimed += 1
            final = self._last_claim(len(result.completed) + self._unfinished())
            attempt = self.new_attempt(StagedAttempt, lease, final)
            try:
                if not self._open(attempt):
                    continue
            except Interrupted:  # the first load runs in the main thread, where no list holds the attempt yet
                attempt.abandon("interrupted")
                raise
            with self._lock:
                if not self.stopping.is_set():
                    self.waiting.append(attempt)
                    continue
            attempt.abandon("interrupted")  # the worker stopped while this claim was made
            return

    def _open(self, attempt: StagedAttempt) -> bool:
        try:
            opened = attempt.open(self.stages, in_background=self._loaded_once)
        except NoSpace as exc:
            raise give_back(self.job, self.store, attempt.lease, attempt.record, exc, self.log) from exc.error
        except ElasticError:  # a tampered job dir: nothing ran, so the shard is left claimable
            self.store.release(attempt.lease)
            raise
        # The first load runs in this thread: a runner may start its runtime (Ray) on it.
        self._loaded_once = True
        if opened:
            self._loads = [f for f in self._loads if not f.done()] + [attempt.loaded]
        return opened

    def _idle(self, result: WorkerResult) -> bool:
        """Nothing claimed or running: end (job over, stop when idle) or wait a poll interval."""
        (complete, failed), self._last_scan = self._last_scan, (False, set())
        if failed:
            result.exit_code, result.message = 2, failure_message(self.job, sorted(failed)[0])
            return True
        if complete:
            result.message = f"all {len(self.chooser.order)} shards done"
            return True
        if not self._may_claim(len(result.completed)):
            result.message = f"claimed its share of {self.claim_limit} shard(s)"
            return True
        if self.stop_when_idle:
            result.exit_code, result.message = 1, "no claimable shard left; others still running"
            return True
        self._say_what_it_waits_for()  # the same line the one-at-a-time loop logs
        time.sleep(self.policy.poll_interval_secs)
        return False

    def _process(self, attempt: StagedAttempt) -> None:
        """Its processing in this (the main) thread; then its finish goes to a finisher thread."""
        processed = attempt.process(self.stages)
        if attempt.outcome is None:
            self.timings.append(attempt.processing)
            self.finishing.append((attempt, in_thread(attempt.finish, self.stages, processed)))

    # results ------------------------------------------------------------------
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
                raise give_back(self.job, self.store, attempt.lease, attempt.record, error, self.log) from error.error
            if error is not None:
                raise error
            if future.result() == "done":
                result.completed.append(attempt.lease.shard)
                self.pace.add(attempt.processing[1] - attempt.processing[0])

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


def in_thread(fn: Callable[..., Any], *args: Any) -> Future:
    """``fn(*args)`` in a daemon thread (a stopping worker never waits for it to exit)."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # handed to whoever waits on the future
            future.set_exception(exc)

    threading.Thread(target=run, name=f"dje-{getattr(fn, '__name__', 'stage')}", daemon=True).start()
    return future


def at_once(fn: Callable[..., Any], *args: Any) -> Future:
    """``fn(*args)`` in this thread, as a finished future (its error re-raised by ``result()``)."""
    future: Future = Future()
    try:
        future.set_result(fn(*args))
    except Exception as exc:
        future.set_exception(exc)
    return future
