"""The claim loop: claim a shard, run it, verify the output, publish done.

How a shard is processed is the runner's business (see ``runner.Runner``);
the loop only guarantees the protocol: one live lease per shard, output
written inside the attempt's own directory, a done record published only
after the output was re-read, a superseded attempt never publishing, and a
per-shard retry budget after which the shard fails terminally and the job
stops. The parts live beside this module: ``scan`` (which shard next),
``attempt`` (one attempt's lifecycle), ``budget`` (the retry budget),
``disk_full`` (a full disk stops the worker without counting against the
shard), ``signals`` (SIGTERM/SIGINT stop the running shard at once),
``speculation`` (backups of late shards) and ``fencing`` (a fenced attempt's
runner is stopped).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.job.claims import Lease, claim_store
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.failed import failure_message
from data_juicer_elastic.storage.files import disk_full_in, no_space_error
from data_juicer_elastic.storage.host import hostname
from data_juicer_elastic.worker.attempt import Attempt
from data_juicer_elastic.worker.fencing import RunnerStopper
from data_juicer_elastic.worker.pacing import Pace
from data_juicer_elastic.worker.runner import Runner
from data_juicer_elastic.worker.scan import ClaimChooser, Scan
from data_juicer_elastic.worker.signals import Interrupted, signals_raise_interrupted
from data_juicer_elastic.worker.speculation import Speculation

AttemptT = TypeVar("AttemptT", bound=Attempt)


@dataclass
class WorkerResult:
    exit_code: int
    completed: list[str] = field(default_factory=list)
    message: str = ""


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
        speculation: Speculation | None = None,
        should_stop: Callable[[], bool] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.job = JobDir(job_dir, shared_link_check=True)
        self.policy = self.job.manifest().policy
        self.runner = runner
        self.host = host or hostname()
        self.max_shards = max_shards
        self.claim_limit = claim_limit
        self.stop_when_idle = stop_when_idle
        self.should_stop = should_stop or (lambda: False)
        self.log = log
        self.store = claim_store(self.job, self.host)
        self.pace = Pace()
        self.chooser = ClaimChooser(self.job, self.store, self.pace, log, speculation)
        self.stopper = RunnerStopper()
        self.claimed = 0
        self._waited: list[str] = []  # the leased shards it last said it waits for

    def claim_next(self) -> Scan:
        """Claim the next shard: (its lease or None, whether every shard is done, the failed shards)."""
        return self.chooser.claim_next()

    def new_attempt(self, kind: type[AttemptT], lease: Lease, final: bool) -> AttemptT:
        """An attempt of ``kind`` on this worker's job, lease store, runner and pace."""
        return kind(
            self.job,
            self.store,
            lease,
            self.runner,
            self.policy,
            self.log,
            pace=self.pace.seconds,
            final=final,
            stopper=self.stopper,
        )

    def run_attempt(self, lease: Lease, final: bool) -> str:
        """Run one claimed attempt to its outcome; a finished one feeds this worker's pace."""
        t0 = time.monotonic()
        outcome = self.new_attempt(Attempt, lease, final).run()
        if outcome == "done":
            self.pace.add(time.monotonic() - t0)
        return outcome

    def run(self) -> WorkerResult:
        result = WorkerResult(exit_code=0)
        self.log(f"worker started on host={self.host} pid={os.getpid()} job_dir={self.job.root}")
        with signals_raise_interrupted(), self.stopper:
            try:
                while not self._step(result):
                    pass
            except Interrupted as exc:
                result.exit_code, result.message = 128 + exc.signum, f"interrupted by {exc}"
            except OSError as exc:  # a full disk while claiming: the lease was released
                if not (full := disk_full_in(exc)):
                    raise
                error = no_space_error(exc.filename or self.job.claims_dir, full, "claiming a shard")
                result.exit_code, result.message = error.exit_code, str(error)
            except ElasticError as exc:  # a full disk during an attempt, a tampered job dir
                result.exit_code, result.message = exc.exit_code, str(exc)
            finally:
                self.store.flush()
        return result

    def _step(self, result: WorkerResult) -> bool:
        """Claim and run one shard; True (with ``result`` filled in) once the loop should end."""
        ended = self._limit_reached(len(result.completed))
        if ended is None:
            lease, complete, failed = self.claim_next()
            ended = self._finished(lease, complete, failed)
            if ended is None and lease is None:
                self._say_what_it_waits_for()
                time.sleep(self.policy.poll_interval_secs)
                return False
        if ended is not None:
            result.exit_code, result.message = ended
            return True
        self.claimed += 1
        if self.run_attempt(lease, final=self._last_claim(len(result.completed))) == "done":
            result.completed.append(lease.shard)
        return False

    def _say_what_it_waits_for(self) -> None:
        """One line each time the set of leases it waits on changes: whose, and when each may be taken over.

        From the sweep's snapshot the claim just looked at: no lease is listed or read here.
        """
        snap = self.chooser.last
        freshest = {}  # a shard with a running backup holds two live attempts: it is one shard to wait for
        for b in snap.live if snap else []:
            if b.shard not in freshest or b.age < freshest[b.shard].age:
                freshest[b.shard] = b
        waits = []
        for b in sorted(freshest.values(), key=lambda b: b.shard):
            free_at = time.strftime("%H:%M:%S", time.localtime(time.time() + self.policy.lock_timeout_secs - b.age))
            waits.append(
                (b.shard, f"{b.shard} (host={b.host}, renewed {b.age:.0f}s ago, free at {free_at} unless renewed)")
            )
        if waits and [w[0] for w in waits] != self._waited:
            more = f"; ... ({len(waits) - 8} more)" if len(waits) > 8 else ""
            listing = "; ".join(w[1] for w in waits[:8]) + more
            self.log(f"waiting for {len(waits)} shard(s) leased by other workers: {listing}")
        self._waited = [w[0] for w in waits]

    def _limit_reached(self, completed: int) -> tuple[int, str] | None:
        if self.should_stop():
            return 1, "stopped before the job completed"
        if self.max_shards is not None and completed >= self.max_shards:
            return 0, f"--max-shards {self.max_shards} reached"
        if self.claim_limit is not None and self.claimed >= self.claim_limit:
            return 0, f"claimed its share of {self.claim_limit} shard(s)"
        return None

    def _finished(self, lease: Lease | None, complete: bool, failed: set[str]) -> tuple[int, str] | None:
        """The loop's end when the job is over for this worker; None to go on."""
        if failed:
            return 2, failure_message(self.job, sorted(failed)[0])
        if complete:
            return 0, f"all {len(self.chooser.order)} shards done"
        if lease is None and self.stop_when_idle:
            return 1, "no claimable shard left; others still running"
        return None

    def _last_claim(self, completed: int) -> bool:
        """True if this worker's limits let it take no shard after the one it just claimed."""
        return (self.claim_limit is not None and self.claimed >= self.claim_limit) or (
            self.max_shards is not None and completed + 1 >= self.max_shards
        )


def run_worker(job_dir: str | os.PathLike, runner: Runner, *, prefetch: int = 0, **options) -> WorkerResult:
    """Run the claim loop until the job is complete, failed, or a limit is reached.

    ``prefetch`` > 0: claim and load that many shards ahead of the one being
    processed (``worker.prefetch``); 0 runs one attempt at a time.
    """
    if prefetch > 0:
        from data_juicer_elastic.worker.prefetch import PrefetchWorker

        return PrefetchWorker(job_dir, runner, prefetch=prefetch, **options).run()
    return Worker(job_dir, runner, **options).run()
