"""The claim loop: claim a shard, run it, verify the output, publish done.

How a shard is processed is the runner's business (see ``Runner``); the loop
only guarantees the protocol: one live lease per shard, output written inside
the attempt's own directory, a done record published only after the output
was re-read, a superseded attempt never publishing, and a per-shard retry
budget after which the shard fails terminally and the job stops.

Before a shard runs, its file is checked against the manifest (bytes and
sha256): an edited shard is refused and fails terminally, since retrying
cannot heal it. A full disk stops the worker with exit 2 and is not counted
against the shard: its unpublished output is removed, its lease released, and
the job goes on once space is freed.
"""

from __future__ import annotations

import importlib
import os
import signal
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from data_juicer_elastic.errors import ElasticError, IntegrityError, UserError
from data_juicer_elastic.job.claims import RELEASED_MTIME, ClaimStore, Heartbeat, Lease
from data_juicer_elastic.job.identity import hostname
from data_juicer_elastic.job.layout import JobDir, attempt_name
from data_juicer_elastic.status import failure_message
from data_juicer_elastic.storage.files import (
    atomic_write,
    disk_full_in,
    dumps_json,
    hash_file,
    no_space_error,
    publish_once,
    read_json,
    read_record,
)
from data_juicer_elastic.worker.outputs import inspect_output
from data_juicer_elastic.worker.pacing import TAIL_LIMIT, BusyWorker, Pace, should_claim

# Outcomes of an attempt that do not count against the retry budget: the
# worker was told to stop, it stalled and someone else took the shard, or the disk was full.
NOT_FAILURES = ("interrupted", "superseded", "done", "duplicate", "no-space")


class Runner(Protocol):
    def __call__(self, shard_path: str, output_path: str, job_dir: str) -> None: ...


class ShardMismatch(IntegrityError):
    """The shard file is not what the manifest says: edited or truncated after prepare."""


class _NoSpace(Exception):
    """The disk filled up while an attempt wrote ``path``."""

    def __init__(self, path: Path, error: OSError) -> None:
        super().__init__(str(error))
        self.path, self.error = path, error


class Interrupted(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT so a running shard stops at once."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class WorkerResult:
    exit_code: int
    completed: list[str] = field(default_factory=list)
    message: str = ""


def load_runner(spec: str) -> Runner:
    """``MODULE:ATTR``; ATTR is the runner, or a factory marked ``runner_factory = True``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UserError(f"--runner {spec!r}: expected MODULE:ATTR, e.g. mypkg.runners:copy_runner")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"--runner {spec!r}: cannot load it ({exc}); check the module is importable") from exc
    return obj() if getattr(obj, "runner_factory", False) else obj


def failure_count(job: JobDir, shard: str, upto: int) -> int:
    """Attempts 1..upto after the last retry that failed or were lost (killed, never finished).

    An attempt that never recorded an outcome but whose lease was released
    was given up on purpose (the shard was done meanwhile, or the disk was
    full): that is no failure.
    """
    base = 0
    if job.retry_path(shard).exists():
        try:
            base = read_json(job.retry_path(shard)).get("after_attempt", 0)
        except (OSError, ValueError, AttributeError):
            base = None
        if type(base) is not int or base < 0:
            raise IntegrityError(
                f"{job.retry_path(shard)}: not a retry record (after_attempt must be a "
                "whole number); restore it or run `dj-elastic retry` for the shard again"
            )
    count = 0
    for attempt in range(base + 1, upto + 1):
        outcome = read_record(job.attempt_dir(shard, attempt) / "attempt.json").get("outcome")  # None: lost
        if outcome not in NOT_FAILURES and not (outcome in (None, "running") and _released(job, shard, attempt)):
            count += 1
    return count


def _released(job: JobDir, shard: str, attempt: int) -> bool:
    try:
        return os.stat(job.claims_dir / f"{shard}@{attempt:04d}").st_mtime <= RELEASED_MTIME
    except OSError:
        return False


class Worker:
    """One worker process's view of one job."""

    def __init__(
        self,
        job_dir: str | os.PathLike,
        runner: Runner,
        *,
        host: str | None = None,
        max_shards: int | None = None,
        claim_limit: int | None = None,
        stop_when_idle: bool = False,
        should_stop: Callable[[], bool] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.job = JobDir(job_dir)
        self.manifest = self.job.manifest()
        self.policy = self.manifest.policy
        self.runner = runner
        self.host = host or hostname()
        self.max_shards = max_shards
        self.claim_limit = claim_limit
        self.stop_when_idle = stop_when_idle
        self.should_stop = should_stop or (lambda: False)
        self.log = log
        self.store = ClaimStore(self.job, lock_timeout=self.policy.lock_timeout_secs, host=self.host)
        self.order = [s.id for s in self.manifest.shards]
        # Start the scan at a per-process offset so racing workers rarely collide.
        self._offset = zlib.crc32(f"{self.host}:{os.getpid()}".encode()) % len(self.order)
        self.claimed = 0
        self.pace = Pace()
        self._waiting = False  # declined to claim at the tail (logged once per stretch)

    # scanning ---------------------------------------------------------------
    def _candidates(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]], set[str], set[str]]:
        """Never-claimed shards, shards with an attempt (live or not), and the done/failed sets."""
        done = self.job.done_ids()
        failed = self.job.failed_ids()
        latest = self.store.latest_attempts()
        ordered = self.order[self._offset :] + self.order[: self._offset]
        free, held = [], []
        for sid in ordered:
            if sid in done or sid in failed:
                continue
            (held if latest.get(sid) else free).append((sid, latest.get(sid, 0)))
        return free, held, done, failed

    def _claim_next(self) -> tuple[Lease | None, set[str], set[str]]:
        free, held, done, failed = self._candidates()
        if failed or len(done) == len(self.order):
            return None, done, failed
        now: float | None = None  # the shared clock, read once and only if a held shard is looked at
        if len(free) > TAIL_LIMIT:  # far from the tail: liveness is checked lazily below
            candidates, unchecked = free + held, True
        else:  # every lease checked now: the live ones are the busy workers pacing counts on
            now = self.store.now() if held else 0.0
            busy = [(sid, n) for sid, n in held if self.store.is_live(sid, n, now)]
            live = {sid for sid, _ in busy}
            candidates, unchecked = free + [(sid, n) for sid, n in held if sid not in live], False
            if candidates and not self._my_turn(len(candidates), busy, now):
                return None, done, failed
        for sid, current in candidates:
            if current and unchecked:
                now = self.store.now() if now is None else now
                if self.store.is_live(sid, current, now):
                    continue
            if failure_count(self.job, sid, current) > self.policy.max_retries:
                self._publish_failed(sid, current, "attempts lost (worker killed or stalled) past the retry budget")
                return None, done, self.job.failed_ids()
            lease = self.store.try_claim(sid, current)
            if lease is None:
                continue
            if self.job.done_path(sid).exists():  # finished while we looked
                self.store.release(lease)
                continue
            return lease, done, failed
        return None, done, failed

    def _my_turn(self, claimable: int, busy: list[tuple[str, int]], now: float) -> bool:
        """Tail pacing (see ``pacing``): False while faster busy workers would finish every claimable shard first."""
        if self.pace.seconds is None:
            return True
        workers = []
        for sid, attempt in busy:
            info = read_record(self.job.attempt_dir(sid, attempt) / "attempt.json")
            if info.get("host") == self.host and info.get("pid") == os.getpid():
                continue  # this worker's own prefetched attempts: its backlog below counts them
            pace, claimed_at = info.get("pace"), info.get("claimed_at")
            if (
                isinstance(pace, (int, float))
                and isinstance(claimed_at, (int, float))
                and claimed_at > 0
                and not info.get("final")
            ):
                workers.append(BusyWorker(float(pace), max(now - claimed_at, 0.0)))
        turn = should_claim(self.pace.seconds, workers, claimable, self.backlog())
        if not turn and not self._waiting:
            self.log(
                f"leaving the last {claimable} shard(s) to faster workers "
                f"(this one takes {self.pace.seconds:.1f}s per shard)"
            )
        self._waiting = not turn
        return turn

    def backlog(self) -> float:
        """Seconds of claimed work this worker has before it could start a shard claimed now."""
        return 0.0

    # running ------------------------------------------------------------------
    def run(self) -> WorkerResult:
        result = WorkerResult(exit_code=0)
        self.log(f"worker started on host={self.host} pid={os.getpid()} job_dir={self.job.root}")
        with signals_raise_interrupted():
            try:
                while True:
                    if self.should_stop():
                        result.exit_code, result.message = 1, "stopped before the job completed"
                        return result
                    if self.max_shards is not None and len(result.completed) >= self.max_shards:
                        result.message = f"--max-shards {self.max_shards} reached"
                        return result
                    if self.claim_limit is not None and self.claimed >= self.claim_limit:
                        result.message = f"claimed its share of {self.claim_limit} shard(s)"
                        return result
                    lease, done, failed = self._claim_next()
                    if failed:
                        sid = sorted(failed)[0]
                        result.exit_code, result.message = 2, failure_message(self.job, sid)
                        return result
                    if len(done) == len(self.order):
                        result.message = f"all {len(self.order)} shards done"
                        return result
                    if lease is None:
                        if self.stop_when_idle:
                            result.exit_code, result.message = 1, "no claimable shard left; others still running"
                            return result
                        time.sleep(self.policy.poll_interval_secs)
                        continue
                    self.claimed += 1
                    outcome = self._run_attempt(lease, final=self._last_claim(len(result.completed)))
                    if outcome == "done":
                        result.completed.append(lease.shard)
            except Interrupted as exc:
                result.exit_code, result.message = 128 + exc.signum, f"interrupted by {exc}"
                return result
            except OSError as exc:  # a full disk while claiming: the lease was released
                if not (full := disk_full_in(exc)):
                    raise
                error = no_space_error(exc.filename or self.job.claims_dir, full, "claiming a shard")
                result.exit_code, result.message = error.exit_code, str(error)
                return result
            except ElasticError as exc:  # a full disk during an attempt, a tampered job dir
                result.exit_code, result.message = exc.exit_code, str(exc)
                return result

    def _last_claim(self, completed: int) -> bool:
        """True if this worker's limits let it take no shard after the one it just claimed."""
        return (self.claim_limit is not None and self.claimed >= self.claim_limit) or (
            self.max_shards is not None and completed + 1 >= self.max_shards
        )

    def _run_attempt(self, lease: Lease, final: bool) -> str:
        info = self._attempt_info(lease, final)
        t0 = time.monotonic()
        try:
            outcome = self._attempt(lease, info)
            if outcome == "done":
                self.pace.add(time.monotonic() - t0)
            return outcome
        except _NoSpace as exc:
            raise self._stop_on_full_disk(lease, info, exc) from exc.error
        except ElasticError:  # a tampered job dir: nothing ran, so the shard is left claimable
            self.store.release(lease)
            raise

    def _attempt_info(self, lease: Lease, final: bool) -> dict:
        """The attempt record as it is written when the attempt starts."""
        return {
            "shard": lease.shard,
            "attempt": lease.attempt,
            "host": self.host,
            "pid": os.getpid(),
            "token": lease.token,
            "started_at": time.time(),
            "outcome": "running",
            "claimed_at": lease.claimed_at,
            "pace": self.pace.seconds,
            "final": final,
        }

    def _attempt(self, lease: Lease, info: dict) -> str:
        sid, attempt = lease.shard, lease.attempt
        adir = self._new_attempt_dir(sid, attempt)
        output = adir / "processed.jsonl"
        self._write_info(adir, info)
        self.log(f"claimed {sid} attempt {attempt_name(attempt)}")
        heartbeat = Heartbeat(self.store, lease, self.policy.heartbeat_secs)
        try:
            with heartbeat:
                shard = self._verified_shard(sid)
                self.runner(str(shard), str(output), str(self.job.root))
                digest = inspect_output(output)
        except Interrupted:
            self._finish(adir, info, "interrupted")
            self.store.release(lease)
            raise
        except ShardMismatch as exc:  # retrying cannot heal an edited shard
            return self._attempt_failed(lease, adir, info, exc, terminal=True)
        except Exception as exc:  # the runner's failure fails the attempt, not the worker
            if full := disk_full_in(exc):
                raise _NoSpace(output, full) from exc
            return self._attempt_failed(lease, adir, info, exc)
        return self._conclude(lease, adir, info, output, digest, heartbeat.superseded.is_set())

    def _conclude(self, lease: Lease, adir: Path, info: dict, output: Path, digest, superseded: bool) -> str:
        """Publish a verified output as done, unless the lease was lost meanwhile (superseded)."""
        sid, attempt = lease.shard, lease.attempt
        if superseded or not self.store.is_current(lease):
            self._finish(adir, info, "superseded", "lease taken over by a later attempt; output not published")
            self.log(f"{sid} attempt {attempt_name(attempt)} superseded; not publishing")
            return "superseded"
        record = {
            "shard": sid,
            "attempt": attempt,
            "host": self.host,
            "pid": os.getpid(),
            "rows": digest.rows,
            "bytes": digest.bytes,
            "sha256": digest.sha256,
            "output": str(output.relative_to(self.job.root)),
            "started_at": info["started_at"],
            "finished_at": time.time(),
        }
        try:
            published = publish_once(self.job.done_path(sid), dumps_json(record))
        except OSError as exc:
            if full := disk_full_in(exc):
                raise _NoSpace(self.job.done_path(sid), full) from exc
            raise
        if not published:
            self._write_info(adir, info, "duplicate", "another attempt published done first")
            return "duplicate"
        self._write_info(adir, info, "done")
        self.log(f"done {sid} rows={digest.rows} attempt {attempt_name(attempt)}")
        return "done"

    def _new_attempt_dir(self, sid: str, attempt: int) -> Path:
        """The attempt's own folder, made now: one already there, or one outside the job dir, is refused."""
        adir = self.job.attempt_dir(sid, attempt)
        try:
            adir.parent.mkdir(parents=True, exist_ok=True)
            self.job.confine(str(adir.parent.relative_to(self.job.root)), "attempts folder")
            os.mkdir(adir)
        except FileExistsError as exc:
            raise IntegrityError(
                f"{adir}: already exists although attempt {attempt} of {sid} was just claimed; "
                "something other than a worker wrote into the job dir: refusing to use it"
            ) from exc
        except OSError as exc:
            if full := disk_full_in(exc):
                raise _NoSpace(adir, full) from exc
            raise
        return adir

    def _write_info(self, adir: Path, info: dict, outcome: str | None = None, error: str | None = None) -> None:
        try:
            if outcome is None:
                atomic_write(adir / "attempt.json", dumps_json(info))
            else:
                self._finish(adir, info, outcome, error)
        except OSError as exc:
            if full := disk_full_in(exc):
                raise _NoSpace(adir / "attempt.json", full) from exc
            raise

    def _verified_shard(self, sid: str) -> Path:
        """The shard's file, after checking its bytes and sha256 against the manifest."""
        spec = self.job.shard(sid)
        path = self.job.shard_file(sid)
        try:
            sha, size = hash_file(str(path))
        except OSError as exc:
            raise ShardMismatch(
                f"{path}: cannot be read ({exc.strerror}); restore it from a backup "
                "or prepare the job again in a new job dir"
            ) from exc
        if (size, sha) != (spec.bytes, spec.sha256):
            raise ShardMismatch(
                f"{path}: does not match the manifest ({size} bytes, sha256 {sha[:12]}…; the manifest says "
                f"{spec.bytes} bytes, sha256 {spec.sha256[:12]}…): it changed after prepare, so it is not run; "
                "restore it, or prepare the job again in a new job dir"
            )
        return path

    def _stop_on_full_disk(self, lease: Lease, info: dict, exc: _NoSpace) -> UserError:
        """Give the shard back uncounted: drop the unpublished output, record why, release the lease."""
        sid, attempt = lease.shard, lease.attempt
        adir = self.job.attempt_dir(sid, attempt)
        published = _read_attempt(self.job, sid) == attempt
        for step in (
            ()
            if published
            else (
                lambda: (adir / "processed.jsonl").unlink(missing_ok=True),  # frees the space it took
                lambda: self._finish(adir, info, "no-space", f"no space left on device writing {exc.path}"),
            )
        ):
            try:
                step()
            except OSError:
                pass
        self.store.release(lease)
        self.log(f"{sid} attempt {attempt_name(attempt)}: no space left on device; stopping")
        return no_space_error(
            exc.path,
            exc.error,
            f"running {sid} attempt {attempt_name(attempt)} "
            "(the shard is not counted as failed and can be claimed again)",
        )

    def _attempt_failed(self, lease: Lease, adir: Path, info: dict, exc: Exception, terminal: bool = False) -> str:
        error = f"{type(exc).__name__}: {exc}"
        with open(adir / "process.log", "a", encoding="utf-8") as f:
            f.write("\n" + "".join(traceback.format_exception(exc)))
        self._finish(adir, info, "failed", error)
        failures = failure_count(self.job, lease.shard, lease.attempt)
        self.log(f"{lease.shard} attempt {attempt_name(lease.attempt)} failed ({failures} failure(s)): {error}")
        if terminal or failures > self.policy.max_retries:
            self._publish_failed(lease.shard, lease.attempt, error)
        self.store.release(lease)
        return "failed"

    def _finish(self, adir: Path, info: dict, outcome: str, error: str | None = None) -> None:
        info.update(outcome=outcome, finished_at=time.time(), error=error)
        atomic_write(adir / "attempt.json", dumps_json(info))

    def _publish_failed(self, sid: str, attempt: int, error: str) -> None:
        log_path = self.job.attempt_dir(sid, attempt) / "process.log"
        record = {
            "shard": sid,
            "attempt": attempt,
            "host": self.host,
            "pid": os.getpid(),
            "error": error,
            "log": str(log_path.relative_to(self.job.root)),
            "failures": failure_count(self.job, sid, attempt),
            "at": time.time(),
        }
        publish_once(self.job.failed_path(sid), dumps_json(record))


def _read_attempt(job: JobDir, sid: str) -> int | None:
    """The attempt the shard's done record names, if there is one."""
    attempt = read_record(job.done_path(sid)).get("attempt")
    return attempt if type(attempt) is int else None


class signals_raise_interrupted:
    """SIGTERM/SIGINT raise ``Interrupted`` in the main thread (no-op in other threads)."""

    def __enter__(self) -> None:
        self._old: dict[int, object] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, _raise_interrupted)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def run_worker(job_dir: str | os.PathLike, runner: Runner, *, prefetch: int = 0, **options) -> WorkerResult:
    """Run the claim loop until the job is complete, failed, or a limit is reached.

    ``prefetch`` > 0: claim and load that many shards ahead of the one being
    processed (``worker.prefetch``); 0 runs one attempt at a time.
    """
    if prefetch > 0:
        from data_juicer_elastic.worker.prefetch import PrefetchWorker

        return PrefetchWorker(job_dir, runner, prefetch=prefetch, **options).run()
    return Worker(job_dir, runner, **options).run()
