"""One attempt at a shard, from its own folder to its outcome, in three steps the worker loop schedules.

``open``: the attempt's folder is made fresh (one already there is refused;
in node-local scratch where the job dir is no shared folder, ``placement``),
its record written, its lease renewed from then on, the shard file checked
against the manifest, and the runner's load started. ``process``: the
runner's work, in the main thread. ``finish``: the runner's finish, the
output re-read, and the done record published. A fenced attempt never
publishes: superseded (a later attempt took its lease), beaten to the done
record by its backup or by the original it backs up (``lost-race``; the
heartbeat notices and stops the runner at once, ``fencing``), or lapsed (its
lease went unrenewed long enough that another process may have judged it
stale: a frozen process, a hung mount). A runner's failure fails the
attempt, not the worker; an edited shard, or a runner's ``PermanentError``
(a row or recipe error), fails it terminally, since retrying cannot heal it.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from data_juicer_elastic.errors import ElasticError, IntegrityError, PermanentError, one_line
from data_juicer_elastic.job.attempt_files import AttemptDir
from data_juicer_elastic.job.claims import ClaimStore, Lease, heartbeat
from data_juicer_elastic.job.layout import JobDir, attempt_name
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.job.records.attempt import AttemptRecord, attempt_file, load_attempt, write_attempt
from data_juicer_elastic.job.records.done import DoneRecord, is_done, load_done, publish_done
from data_juicer_elastic.storage.blocks import digest_file
from data_juicer_elastic.storage.files import disk_full_in, read_record
from data_juicer_elastic.storage.keys import Ver
from data_juicer_elastic.worker.budget import fail_terminally, failure_count
from data_juicer_elastic.worker.disk_full import NoSpace, give_back, space_for
from data_juicer_elastic.worker.fencing import Fenced, RunnerStopper
from data_juicer_elastic.worker.outputs import OutputDigest, inspect_output
from data_juicer_elastic.worker.placement import placement_for
from data_juicer_elastic.worker.signals import Interrupted, received
from data_juicer_elastic.worker.stages import Stages, at_once, in_thread


class ShardMismatch(IntegrityError):
    """The shard file is not what the manifest says: edited or truncated after prepare."""


# Failures a retry cannot heal (an edited shard, a runner's row or recipe error): the shard fails at once.
TERMINAL = (ShardMismatch, PermanentError)


class Attempt:
    """One claimed attempt; its outcome (``done``, ``failed``, ``superseded``, ``lost-race``, ...) once it ends."""

    def __init__(
        self,
        job: JobDir,
        store: ClaimStore,
        lease: Lease,
        policy: Policy,
        log: Callable[[str], None],
        *,
        pace: float | None,
        final: bool,
        stopper: RunnerStopper,
        scratch: Path | None = None,
    ) -> None:
        self.job, self.store, self.lease, self.policy, self.log = job, store, lease, policy, log
        self.stopper = stopper
        self.adir = job.attempt_dir(lease.shard, lease.attempt)  # in the job dir: what records and messages name
        self.placement = placement_for(job, lease.shard, lease.attempt, scratch)
        self.files = AttemptDir(self.placement.folder)  # where the runner writes: adir itself, or scratch
        self.output = self.files.output
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
        self.ver: Ver | None = None  # what this attempt's last write of its record left (None: none yet)
        self.outcome: str | None = None
        self.lock = threading.Lock()  # the finisher thread's outcome against a stopping worker's
        self.beat: Any = None  # the lease's refresher, from open() on
        self.loaded: Future | None = None
        self.processing = (0.0, 0.0)  # monotonic start and end of the process stage
        self.processing_wall = 0.0  # time.time() when processing began: the shard's time counts from here
        self.opened = time.monotonic()  # when it was claimed and opened (this node's clock)

    # the three steps ------------------------------------------------------------------------------
    def open(self, stages: Stages, in_background: bool) -> bool:
        """Folder, record, heartbeat, shard check, then the load; False if the attempt already ended."""
        self.opened = time.monotonic()
        self.placement.make()
        try:
            self._save()
        except ElasticError:  # a record already there: the attempt never started
            self.placement.drop()
            raise
        self.log(
            f"claimed {self.name}{claim_note(self.job, self.lease.shard, self.lease.attempt, self.lease.backup_of)}"
        )
        beat = heartbeat(self.store, self.lease, self.policy.heartbeat_secs, self.log, on_lost=self._lost_race)
        self.beat = beat.__enter__()
        try:
            shard = verified_shard(self.job, self.lease.shard, self.placement.shard(self.lease.shard))
        except ShardMismatch as exc:  # retrying cannot heal an edited shard
            self.fail(exc, terminal=True)
            return False
        except NoSpace:  # scratch is full: the loop gives the shard back
            self.beat.__exit__(None, None, None)
            raise
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
            self.processing_wall = time.time()
            self._note_processing_start(start)
            self.stopper.arm(self)
            try:
                processed = stages.process(loaded)
            finally:
                self.stopper.disarm()
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
                error = give_back(self.job, self.store, self.lease, self.end, NoSpace(self.output, full), self.log)
                raise error from exc
            self.fail(exc)
            return None

    def finish(self, stages: Stages, processed: Any) -> str:
        """Join, re-read, publish (any thread); ``NoSpace`` escapes to stop the worker."""
        try:
            stages.finish(processed)
            digest = inspect_output(self.output)
            self.placement.keep(digest)  # still under the renewed lease: an upload may take a while
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
            elif (gap := self.beat.longest_gap()) >= self.lapse_limit():
                self.outcome = self._lapsed(gap)
            else:
                self.outcome = self._publish(digest)
            return self.outcome

    def _note_processing_start(self, start: float) -> None:
        """A shard that waited behind another since its claim: speculation times it from now, not its claim.

        The shared clock's claim time plus this node's monotonic wait: no clock of another node is involved.
        """
        waited = start - self.opened
        if waited >= 1.0 and self.lease.claimed_at > 0:
            self.record.processing_at = self.lease.claimed_at + waited
            self._save()

    # endings --------------------------------------------------------------------------------------
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
            self.end(outcome, error)
        except OSError:
            pass
        self.store.release(self.lease)

    def lapse_limit(self) -> float:
        """Unrenewed this long, the lease may have looked stale to others (their limit is the lock timeout):
        halfway between the renewal period and the lock timeout leaves both sides a wide margin."""
        return (self.policy.heartbeat_secs + self.policy.lock_timeout_secs) / 2

    def _beaten(self) -> bool:
        """Superseded, or another attempt of the shard (a backup, or the one this backs up) published done."""
        lost = self.beat is not None and self.beat.lost.is_set()
        return lost or not self.store.is_current(self.lease) or is_done(self.job, self.lease.shard)

    def _lost_race(self) -> None:
        """From the heartbeat's thread: stop the runner if another attempt beside this one published done.

        Only this attempt's runner: the stopper drops the call when another attempt is the one running.
        A superseded attempt's runner is left to finish; it cannot publish.
        """
        if self.store.is_current(self.lease) and is_done(self.job, self.lease.shard):
            self.stopper.fire(self)

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

    def _lapsed(self, gap: float) -> str:
        """The lease went unrenewed past ``lapse_limit``: another process may be taking it over right now,
        so this attempt does not publish; its lease is released, so the shard is claimable at once."""
        why = (
            f"lease not renewed for {gap:.0f}s (lock_timeout_secs {self.policy.lock_timeout_secs:g}): "
            "another worker may have taken it over; output not published"
        )
        self._save("superseded", why)
        self.store.ledger.drop(self.lease.shard, self.lease.attempt)
        self.store.release(self.lease)
        self.log(f"{self.name}: {why}")
        return "superseded"

    def _publish(self, digest: OutputDigest) -> str:
        record = DoneRecord(
            shard=self.lease.shard,
            attempt=self.lease.attempt,
            host=self.store.host,
            pid=os.getpid(),
            rows=digest.rows,
            bytes=digest.bytes,
            sha256=digest.sha256,
            output=self.job.relative(self.job.attempt_output(self.lease.shard, self.lease.attempt)),
            started_at=self.processing_wall or self.record.started_at,  # the shard's own time, not its wait
            finished_at=time.time(),
            backup=self.lease.backup_of is not None,
            worker=self.store.ledger.worker,
            **op_totals(self.files.path),
        )
        try:
            with space_for(self.job.done_path(record.shard)):
                published = publish_done(self.job, record, self._deadline())
        except self.job.store.errors as exc:  # the endpoint down, a mount gone: this attempt ends, not the worker
            return self._unpublished(exc)
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
        seconds = (record.finished_at or 0.0) - (record.started_at or 0.0)
        log_path = self.adir / AttemptDir.LOG
        dropped = f" ({record.error_rows} row(s) removed by op errors; see {log_path})"
        self.log(
            f"done {record.shard} rows={digest.rows} in {seconds:.1f}s attempt {attempt_name(record.attempt)}"
            + (dropped if record.error_rows else "")
        )
        return "done"

    def _deadline(self) -> float:
        """The publish's deadline on ``lapse_clock``: no store stamp of the lease is older than the last beat
        sent, so until ``lock_timeout`` past it no other process can judge the lease stale."""
        return self.beat.renewed_at + self.policy.lock_timeout_secs

    def _unpublished(self, exc: Exception) -> str:
        """A store error while publishing: the attempt fails and is retried like any failure; where even its
        failure cannot be recorded, nothing is released and its lease lapses, so another attempt retries."""
        self.log(f"{self.name}: its done record could not be published ({one_line(str(exc), 300)})")
        try:
            return self._failed(exc)
        except self.job.store.errors as again:
            self.log(f"{self.name}: its failure not recorded either ({one_line(str(again), 300)}); its lease lapses")
            return "failed"

    def _failed(self, exc: Exception, terminal: bool = False) -> str:
        error = one_line(f"{type(exc).__name__}: {exc}")  # the whole traceback goes to the attempt's log
        log_path = self.adir / AttemptDir.LOG
        with open(self.files.log, "a", encoding="utf-8") as f:
            f.write("\n" + "".join(traceback.format_exception(exc)))
        try:
            self.placement.keep()  # the log and op counts, for the failure message, status and report
        except (IntegrityError, *self.job.store.errors) as kept_exc:  # best effort: the failure still counts
            self.log(f"{self.name}: its log was not kept ({one_line(str(kept_exc), 300)})")
        self.end("failed", error)
        failures = failure_count(self.job, self.lease.shard, self.lease.attempt)
        self.log(f"{self.name} failed ({failures} failure(s)): {one_line(error, 300)}; log: {log_path}")
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
                self._write(self.record)
            else:
                self.end(outcome, error)

    def end(self, outcome: str, error: str | None = None) -> None:
        """Record how the attempt ended, in the version of its record this attempt's last write left; every
        ending passes here, so the attempt's scratch (if any) goes with it."""
        try:
            self._write(self.record.finish(outcome, error))
        finally:
            self.placement.drop()

    def _write(self, record: AttemptRecord) -> None:
        """Create the record (the first write), then replace the version this attempt's last write left."""
        self.ver = write_attempt(self.job, record, self.ver)


def verified_shard(job: JobDir, sid: str, path: Path) -> Path:
    """``path``, the shard's file the runner reads (the job dir's, or its copy in scratch), after checking its
    bytes and sha256 against the manifest. Messages name the job dir's file: that is what a person restores."""
    spec = job.shard(sid)
    try:
        d = digest_file(path)
    except OSError as exc:
        raise ShardMismatch(
            f"{job.shard_file(sid)}: cannot be read ({exc.strerror}); restore it from a backup "
            "or prepare the job again in a new job dir"
        ) from exc
    if (d.bytes, d.sha256) != (spec.bytes, spec.sha256):
        raise ShardMismatch(
            f"{job.shard_file(sid)}: does not match the manifest ({d.bytes} bytes, sha256 {d.sha256[:12]}…; the "
            f"manifest says {spec.bytes} bytes, sha256 {spec.sha256[:12]}…): it changed after prepare, so it is "
            "not run; restore it, or prepare the job again in a new job dir"
        )
    return path


def op_totals(adir: Path) -> dict:
    """Rows in and rows removed by op errors from the runner's ``ops.json`` (none: a runner that counts nothing)."""
    ops = read_record(adir / AttemptDir.OPS)
    return {k: ops[k] for k in ("rows_in", "error_rows") if type(ops.get(k)) is int}


def claim_note(job: JobDir, sid: str, attempt: int, backup_of: int | None = None) -> str:
    """Say when a claim backs up a live attempt, takes over a lost one or retries a failed one (the console's story)."""
    if backup_of is not None:
        prev = load_attempt(job, sid, backup_of)
        where = f" on host={prev.host}" if prev else ""
        return f" (backing up attempt {attempt_name(backup_of)} of {sid}{where})"
    if attempt < 2:
        return ""
    prev = load_attempt(job, sid, attempt - 1)
    if prev is None or prev.outcome in (None, "running"):
        who = f"host={prev.host} pid={prev.pid}" if prev else "a worker that left no record"
        return f" (taking over attempt {attempt_name(attempt - 1)} of {who}: its lease went stale)"
    return " (retry after a failure)" if prev.outcome == "failed" else ""
