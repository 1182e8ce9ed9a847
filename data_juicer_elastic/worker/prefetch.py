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
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.job.claims import Heartbeat, Lease
from data_juicer_elastic.job.layout import attempt_name
from data_juicer_elastic.status import failure_message
from data_juicer_elastic.storage.files import disk_full_in, no_space_error
from data_juicer_elastic.worker.loop import (
    Interrupted,
    ShardMismatch,
    Worker,
    WorkerResult,
    _NoSpace,
    signals_raise_interrupted,
)
from data_juicer_elastic.worker.outputs import inspect_output

DEFAULT_PREFETCH = 1


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


@dataclass
class InFlight:
    """One claimed attempt on its way through the stages."""

    lease: Lease
    info: dict
    adir: Path
    output: Path
    heartbeat: Heartbeat
    loaded: Future | None = None
    outcome: str | None = None  # set once the attempt has ended
    lock: threading.Lock = field(default_factory=threading.Lock)
    processing: tuple[float, float] = (0.0, 0.0)  # monotonic start and end of the process stage


class PrefetchWorker(Worker):
    """The claim loop with the next shards claimed and loaded ahead (see the module docstring)."""

    def __init__(self, job_dir: Any, runner: Any, *, prefetch: int = DEFAULT_PREFETCH, **options: Any) -> None:
        super().__init__(job_dir, runner, **options)
        self.depth = max(int(prefetch), 0)
        self.stages = Stages.of(runner)
        self.waiting: deque[InFlight] = deque()
        self.finishing: list[tuple[InFlight, Future]] = []
        self.current: InFlight | None = None
        self.stopping = threading.Event()
        self.timings: list[tuple[float, float]] = []  # (start, end) of each process stage, in order
        self._loaded_once = False
        self._lock = threading.Lock()  # stopping vs. a claim made ahead in another thread
        self._ahead: Future | None = None  # that claim

    def backlog(self) -> float:
        pace = self.pace.seconds or 0.0
        return pace * (len(self.waiting) + (self.current is not None))

    # the loop ---------------------------------------------------------------
    def run(self) -> WorkerResult:
        result = WorkerResult(exit_code=0)
        self.log(f"worker started on host={self.host} pid={self.pid} job_dir={self.job.root} prefetch={self.depth}")
        with signals_raise_interrupted():
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
        return result

    @property
    def pid(self) -> int:
        return self.store.pid

    def _loop(self, result: WorkerResult) -> None:
        while True:
            self._collect(result, block=False)
            ended = self._should_end(result)
            if ended is not None:
                self._drain(result)
                if ended[0] == 0 and result.exit_code:  # a failure found while draining wins
                    return
                result.exit_code, result.message = ended
                return
            if not self.waiting:
                self._top_up(result)
            if not self.waiting:
                if self.finishing:
                    self._collect(result, block=True)
                    continue
                if self._idle(result):
                    return
                continue
            item = self.waiting.popleft()
            self.current = item
            self._ahead = in_thread(self._top_up, result)  # the next shard: claimed and loaded while this one runs
            self._process(item)
            self.current = None
            self._ahead.result()  # its errors (a full disk, a tampered job dir) stop the worker here

    def _should_end(self, result: WorkerResult) -> tuple[int, str] | None:
        if self.should_stop():
            return 1, "stopped before the job completed"
        if self.max_shards is not None and len(result.completed) >= self.max_shards:
            return 0, f"--max-shards {self.max_shards} reached"
        if self.claim_limit is not None and self.claimed >= self.claim_limit and not self._busy():
            return 0, f"claimed its share of {self.claim_limit} shard(s)"
        failed = self.job.failed_ids() if result.exit_code == 0 else set()
        if failed:
            return 2, failure_message(self.job, sorted(failed)[0])
        return None

    def _busy(self) -> bool:
        return bool(self.waiting or self.finishing or self.current)

    def _may_claim(self, completed: int) -> bool:
        unfinished = len(self.waiting) + len(self.finishing) + (self.current is not None)
        if self.max_shards is not None and completed + unfinished >= self.max_shards:
            return False
        return self.claim_limit is None or self.claimed < self.claim_limit

    def _top_up(self, result: WorkerResult) -> None:
        """Claim until ``depth`` shards wait (one, when nothing runs), each loading at once."""
        want = self.depth if self.current is not None else 1
        while len(self.waiting) < want and self._may_claim(len(result.completed)):
            lease, done, failed = self._claim_next()
            if lease is None:
                self._last_scan = (done, failed)
                return
            self.claimed += 1
            unfinished = len(self.waiting) + len(self.finishing) + (self.current is not None)
            item = self._open(lease, final=self._last_claim(len(result.completed) + unfinished))
            if item is None:
                continue
            with self._lock:
                if not self.stopping.is_set():
                    self.waiting.append(item)
                    continue
            self._end(item, "interrupted")  # the worker stopped while this claim was made
            return

    def _idle(self, result: WorkerResult) -> bool:
        """Nothing claimed or running: end (job over, stop when idle) or wait a poll interval."""
        done, failed = getattr(self, "_last_scan", (set(), set()))
        self._last_scan = (set(), set())
        if failed:
            result.exit_code, result.message = 2, failure_message(self.job, sorted(failed)[0])
            return True
        if len(done) == len(self.order):
            result.message = f"all {len(self.order)} shards done"
            return True
        if not self._may_claim(len(result.completed)):
            result.message = f"claimed its share of {self.claim_limit} shard(s)"
            return True
        if self.stop_when_idle:
            result.exit_code, result.message = 1, "no claimable shard left; others still running"
            return True
        time.sleep(self.policy.poll_interval_secs)
        return False

    # the stages ---------------------------------------------------------------
    def _open(self, lease: Lease, final: bool) -> InFlight | None:
        """Folder, attempt record, heartbeat, shard check; then the load starts in the loader thread."""
        info = self._attempt_info(lease, final)
        try:
            adir = self._new_attempt_dir(lease.shard, lease.attempt)
            self._write_info(adir, info)
        except _NoSpace as exc:
            raise self._stop_on_full_disk(lease, info, exc) from exc.error
        except ElasticError:
            self.store.release(lease)
            raise
        self.log(f"claimed {lease.shard} attempt {attempt_name(lease.attempt)}")
        heartbeat = Heartbeat(self.store, lease, self.policy.heartbeat_secs).__enter__()
        item = InFlight(lease, info, adir, adir / "processed.jsonl", heartbeat)
        try:
            shard = self._verified_shard(lease.shard)
        except ShardMismatch as exc:  # retrying cannot heal an edited shard
            self._failed(item, exc, terminal=True)
            return None
        args = (str(shard), str(item.output), str(self.job.root))
        # The first load runs here: a runner may start its runtime (Ray) on it, best in the main thread.
        item.loaded = in_thread(self.stages.load, *args) if self._loaded_once else at_once(self.stages.load, *args)
        self._loaded_once = True
        return item

    def _process(self, item: InFlight) -> None:
        """The shard's processing, in this (the main) thread; then its finish goes to the finisher thread."""
        try:
            loaded = item.loaded.result()
            start = time.monotonic()
            processed = self.stages.process(loaded)
            item.processing = (start, time.monotonic())
        except Interrupted:
            raise
        except Exception as exc:
            if full := disk_full_in(exc):
                raise self._stop_on_full_disk(item.lease, item.info, _NoSpace(item.output, full)) from exc
            self._failed(item, exc)
            return
        self.timings.append(item.processing)
        self.finishing.append((item, in_thread(self._finish_stage, item, processed)))

    def _finish_stage(self, item: InFlight, processed: Any) -> str:
        """Join, re-read and publish (finisher thread); the process stage of the next shard runs meanwhile."""
        try:
            self.stages.finish(processed)
            digest = inspect_output(item.output)
        except Exception as exc:
            if disk_full_in(exc):
                raise
            with item.lock:
                return item.outcome or self._failed(item, exc)
        item.heartbeat.__exit__(None, None, None)
        with item.lock:
            if item.outcome is not None:  # abandoned meanwhile (SIGTERM)
                return item.outcome
            item.outcome = self._conclude(
                item.lease, item.adir, item.info, item.output, digest, item.heartbeat.superseded.is_set()
            )
            return item.outcome

    def _failed(self, item: InFlight, exc: Exception, terminal: bool = False) -> str:
        item.heartbeat.__exit__(None, None, None)
        item.outcome = self._attempt_failed(item.lease, item.adir, item.info, exc, terminal)
        return item.outcome

    # results ------------------------------------------------------------------
    def _collect(self, result: WorkerResult, block: bool) -> None:
        """Outcomes of finished attempts: done ones count, and feed the pace."""
        if block and self.finishing:
            self.finishing[0][1].exception()
        for pair in list(self.finishing):
            item, future = pair
            if not future.done():
                continue
            self.finishing.remove(pair)
            error = future.exception()
            if error is not None:  # only a full disk escapes the finish stage
                full = disk_full_in(error)
                raise self._stop_on_full_disk(item.lease, item.info, _NoSpace(item.output, full)) from error
            if future.result() == "done":
                result.completed.append(item.lease.shard)
                self.pace.add(item.processing[1] - item.processing[0])

    def _drain(self, result: WorkerResult) -> None:
        """Let attempts being finished end; give back shards claimed ahead and not started."""
        while self.finishing:
            self._collect(result, block=True)
        while self.waiting:
            self._end(self.waiting.popleft(), "interrupted", "claimed ahead; the worker stopped before running it")

    def _abandon(self, outcome: str) -> None:
        """Stop now: every attempt in flight ends as ``outcome`` and its lease is released."""
        with self._lock:
            self.stopping.set()
        if self._ahead is not None:  # a claim being made ahead ends itself once it sees the stop
            try:
                self._ahead.exception(timeout=10)
            except TimeoutError:
                pass
        items = [*self.waiting, *(i for i, _ in self.finishing)] + ([self.current] if self.current else [])
        self.waiting.clear()
        self.finishing.clear()
        for item in items:
            self._end(item, outcome)

    def _end(self, item: InFlight, outcome: str, error: str | None = None) -> None:
        with item.lock:
            if item.outcome is not None:
                return
            item.outcome = outcome
        item.heartbeat.__exit__(None, None, None)
        try:
            self._finish(item.adir, item.info, outcome, error)
        except OSError:
            pass
        self.store.release(item.lease)


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
