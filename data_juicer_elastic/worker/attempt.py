"""One attempt at a shard, from its own folder to its outcome.

The attempt's folder is made fresh (one already there is refused), the shard
file is checked against the manifest, the runner writes the output inside
the folder while the lease is renewed, and the output is re-read before a
done record is published. A fenced attempt never publishes: superseded (a
later attempt took its lease) or beaten to the done record by its backup or
by the original it backs up (``lost-race``); the heartbeat notices either and
stops the runner at once (``fencing``). A runner's failure fails the attempt,
not the worker; an edited shard, or a runner's ``PermanentError`` (a row or
recipe error), fails it terminally, since retrying cannot heal it.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from data_juicer_elastic.errors import ElasticError, IntegrityError, PermanentError, one_line
from data_juicer_elastic.job.attempt_files import AttemptDir
from data_juicer_elastic.job.claims import ClaimStore, Lease, heartbeat
from data_juicer_elastic.job.layout import JobDir, attempt_name
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.job.records.attempt import AttemptRecord, attempt_file, load_attempt, write_attempt
from data_juicer_elastic.job.records.done import DoneRecord, load_done, publish_done
from data_juicer_elastic.storage.blocks import digest_file
from data_juicer_elastic.storage.files import disk_full_in, read_record
from data_juicer_elastic.worker.budget import fail_terminally, failure_count
from data_juicer_elastic.worker.disk_full import NoSpace, give_back, space_for
from data_juicer_elastic.worker.fencing import Fenced, RunnerStopper
from data_juicer_elastic.worker.outputs import OutputDigest, inspect_output
from data_juicer_elastic.worker.runner import Runner
from data_juicer_elastic.worker.signals import Interrupted, received


class ShardMismatch(IntegrityError):
    """The shard file is not what the manifest says: edited or truncated after prepare."""


# Failures a retry cannot heal (an edited shard, a runner's row or recipe error): the shard fails at once.
TERMINAL = (ShardMismatch, PermanentError)


class Attempt:
    """One claimed attempt; ``run()`` returns its outcome (``done``, ``failed``, ``superseded``, ``lost-race``)."""

    def __init__(
        self,
        job: JobDir,
        store: ClaimStore,
        lease: Lease,
        runner: Runner,
        policy: Policy,
        log: Callable[[str], None],
        *,
        pace: float | None,
        final: bool,
        stopper: RunnerStopper | None = None,
    ) -> None:
        self.stopper = stopper or RunnerStopper()
        self.job, self.store, self.lease, self.runner, self.policy, self.log = job, store, lease, runner, policy, log
        self.adir = job.attempt_dir(lease.shard, lease.attempt)
        self.output = self.adir / AttemptDir.OUTPUT
        self.name = f"{lease.shard} attempt {attempt_name(lease.attempt)}"
        self.record = AttemptRecord(
            shard=lease.shard,
            attempt=lease.attempt,
            host=store.host,
            pid=os.getpid(),
            token=lease.token,
            started_at=time.time(),
            claimed_at=lease.claimed_at,
            pace=pace,
            final=final,
            backup=lease.backup_of is not None,
            backup_of=lease.backup_of,
        )

    def run(self) -> str:
        try:
            return self._run()
        except NoSpace as exc:
            raise give_back(self.job, self.store, self.lease, self.record, exc, self.log) from exc.error
        except ElasticError:  # a tampered job dir: nothing ran, so the shard is left claimable
            self.store.release(self.lease)
            raise

    def _run(self) -> str:
        self._make_folder()
        self._save()
        self.log(
            f"claimed {self.name}{claim_note(self.job, self.lease.shard, self.lease.attempt, self.lease.backup_of)}"
        )
        beat = heartbeat(self.store, self.lease, self.policy.heartbeat_secs, self.log, on_lost=self._lost_race)
        try:
            with beat:
                shard = verified_shard(self.job, self.lease.shard)
                self.stopper.arm()
                try:
                    self.runner(str(shard), str(self.output), str(self.job.gen_dir))  # names the generation
                finally:
                    self.stopper.disarm()
                digest = inspect_output(self.output)
        except Fenced:  # the heartbeat found the attempt fenced and stopped the runner
            return self._fenced()
        except Interrupted:
            self._end("interrupted")
            self.store.release(self.lease)
            raise
        except TERMINAL as exc:  # retrying cannot heal an edited shard or a bad row
            return self._failed(exc, terminal=True)
        except Exception as exc:  # the runner's failure fails the attempt, not the worker
            if (signum := received()) is not None:  # the runner wrapped our Interrupted in its own error
                self._end("interrupted")
                self.store.release(self.lease)
                raise Interrupted(signum) from exc
            if full := disk_full_in(exc):
                raise NoSpace(self.output, full) from exc
            return self._failed(exc)
        if beat.lost.is_set() or not self.store.is_current(self.lease) or self.job.done_path(self.lease.shard).exists():
            return self._fenced()
        return self._publish(digest)

    def _lost_race(self) -> None:
        """From the heartbeat's thread: stop the runner if another attempt beside this one published done.

        A superseded attempt's runner is left to finish, as before backups existed; it cannot publish.
        """
        if self.store.is_current(self.lease) and self.job.done_path(self.lease.shard).exists():
            self.stopper.fire()

    def _fenced(self) -> str:
        """Record why this attempt does not publish; its lease and folder stay as a superseded attempt's."""
        try:
            winner = None if not self.store.is_current(self.lease) else load_done(self.job, self.lease.shard)
        except (ElasticError, OSError):
            winner = None
        self.store.ledger.drop(self.lease.shard, self.lease.attempt)  # it holds nothing any more
        if winner is not None and winner.attempt != self.lease.attempt:
            self._save("lost-race", f"attempt {winner.attempt} published done first; output not published")
            self.log(f"{self.name} lost the race to attempt {winner.attempt}; not publishing")
            return "lost-race"
        self._save("superseded", "lease taken over by a later attempt; output not published")
        self.log(f"{self.name} superseded; not publishing")
        return "superseded"

    def _make_folder(self) -> None:
        """The attempt's own folder, made now: one already there, or one outside the job dir, is refused."""
        try:
            with space_for(self.adir):
                self.adir.parent.mkdir(parents=True, exist_ok=True)
                self.job.confine(str(self.adir.parent.relative_to(self.job.root)), "attempts folder")
                os.mkdir(self.adir)
        except FileExistsError as exc:
            raise IntegrityError(
                f"{self.adir}: already exists although attempt {self.lease.attempt} of {self.lease.shard} was just "
                "claimed; something other than a worker wrote into the job dir: refusing to use it"
            ) from exc

    def _publish(self, digest: OutputDigest) -> str:
        record = DoneRecord(
            shard=self.lease.shard,
            attempt=self.lease.attempt,
            host=self.store.host,
            pid=os.getpid(),
            rows=digest.rows,
            bytes=digest.bytes,
            sha256=digest.sha256,
            output=str(self.output.relative_to(self.job.root)),
            started_at=self.record.started_at,
            finished_at=time.time(),
            backup=self.lease.backup_of is not None,
            worker=self.store.ledger.worker,
            **op_totals(self.adir),
        )
        with space_for(self.job.done_path(record.shard)):
            published = publish_done(self.job, record)
        if not published:
            return self._fenced()
        spec = self.job.shard(record.shard)
        self.store.ledger.published(
            record.shard,
            record.attempt,
            spec.rows,
            record.rows,
            record.error_rows,
            spec.bytes,
            record.started_at,
            record.finished_at,
        )
        self._save("done")
        seconds = (record.finished_at or 0.0) - self.record.started_at
        dropped = f" ({record.error_rows} row(s) removed by op errors; see {self.adir / 'process.log'})"
        self.log(
            f"done {record.shard} rows={digest.rows} in {seconds:.1f}s attempt {attempt_name(record.attempt)}"
            + (dropped if record.error_rows else "")
        )
        return "done"

    def _failed(self, exc: Exception, terminal: bool = False) -> str:
        error = one_line(f"{type(exc).__name__}: {exc}")  # the whole traceback goes to process.log
        with open(self.adir / AttemptDir.LOG, "a", encoding="utf-8") as f:
            f.write("\n" + "".join(traceback.format_exception(exc)))
        self._end("failed", error)
        failures = failure_count(self.job, self.lease.shard, self.lease.attempt)
        self.log(
            f"{self.name} failed ({failures} failure(s)): {one_line(error, 300)}; log: {self.adir / 'process.log'}"
        )
        if terminal or (failures > self.policy.max_retries and not self._backup_live()):
            fail_terminally(self.job, self.lease.shard, self.lease.attempt, self.store.host, error)
        self.store.release(self.lease)
        return "failed"

    def _backup_live(self) -> bool:
        """Is this attempt's backup running? Then the shard is not failed yet: the backup may finish it."""
        sid, backup = self.lease.shard, self.lease.attempt + 1
        live = self.store.backup_of(sid, backup) == self.lease.attempt and self.store.is_live(
            sid, backup, self.store.now()
        )
        if live:
            self.log(f"{sid}: past its retry budget, but backup attempt {backup} still runs")
        return live

    def _save(self, outcome: str | None = None, error: str | None = None) -> None:
        """Write the attempt record (ending it with ``outcome``); a full disk stops the worker."""
        with space_for(attempt_file(self.adir)):
            if outcome is None:
                write_attempt(self.adir, self.record)
            else:
                self._end(outcome, error)

    def _end(self, outcome: str, error: str | None = None) -> None:
        write_attempt(self.adir, self.record.finish(outcome, error))


def verified_shard(job: JobDir, sid: str) -> Path:
    """The shard's file, after checking its bytes and sha256 against the manifest."""
    spec = job.shard(sid)
    path = job.shard_file(sid)
    try:
        d = digest_file(path)
    except OSError as exc:
        raise ShardMismatch(
            f"{path}: cannot be read ({exc.strerror}); restore it from a backup "
            "or prepare the job again in a new job dir"
        ) from exc
    if (d.bytes, d.sha256) != (spec.bytes, spec.sha256):
        raise ShardMismatch(
            f"{path}: does not match the manifest ({d.bytes} bytes, sha256 {d.sha256[:12]}…; the manifest says "
            f"{spec.bytes} bytes, sha256 {spec.sha256[:12]}…): it changed after prepare, so it is not run; "
            "restore it, or prepare the job again in a new job dir"
        )
    return path


def op_totals(adir: Path) -> dict:
    """Rows in and rows removed by op errors from the runner's ``ops.json`` (none: a runner that counts nothing)."""
    ops = read_record(adir / AttemptDir.OPS)
    return {k: ops[k] for k in ("rows_in", "error_rows") if type(ops.get(k)) is int}


def claim_note(job: JobDir, sid: str, attempt: int, backup_of: int | None = None) -> str:
    """Say when a claim backs up a live attempt, takes over a lost one or retries a failed one (the console's story)."""
    if backup_of is not None:
        prev = load_attempt(job.attempt_dir(sid, backup_of))
        where = f" on host={prev.host}" if prev else ""
        return f" (backing up attempt {attempt_name(backup_of)} of {sid}{where})"
    if attempt < 2:
        return ""
    prev = load_attempt(job.attempt_dir(sid, attempt - 1))
    if prev is None or prev.outcome in (None, "running"):
        who = f"host={prev.host} pid={prev.pid}" if prev else "a worker that left no record"
        return f" (taking over attempt {attempt_name(attempt - 1)} of {who}: its lease went stale)"
    return " (retry after a failure)" if prev.outcome == "failed" else ""
