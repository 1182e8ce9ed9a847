"""After prepare: this host's claim loop (or a wait for the others), then the finalize election.

One process per host wins that host's election and runs the claim loop with
the host's runner; the others on the host only wait. Waiting for shards never
times out while a lease is live or shards keep finishing; when nothing moved
for ``wait_timeout_secs`` the run is aborted with a message that says who took
part and what is left. Once every shard is done, one process verifies and merges.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from data_juicer_elastic.coordination.elect import coordinate
from data_juicer_elastic.coordination.finalize import finalize_round
from data_juicer_elastic.coordination.run_id import safe_key
from data_juicer_elastic.coordination.rundir import EXIT_FAILED, EXIT_OK, Outcome, RunDir
from data_juicer_elastic.coordination.spec import JobSpec
from data_juicer_elastic.dedup.budget import UnitFailed
from data_juicer_elastic.dedup.driver import Driver, Stopped
from data_juicer_elastic.dedup.progress import brief, dedup_progress
from data_juicer_elastic.errors import ElasticError, IntegrityError
from data_juicer_elastic.folder_export import is_folder_export
from data_juicer_elastic.job.claims import claim_store
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.done import load_done
from data_juicer_elastic.job.records.failed import failure_message
from data_juicer_elastic.job.versions import check_versions
from data_juicer_elastic.merge import merge, merged_already, verify
from data_juicer_elastic.report import write_report
from data_juicer_elastic.status import describe_error_rows, error_rows_by_shard
from data_juicer_elastic.worker.loop import run_worker
from data_juicer_elastic.worker.runner import close_runner
from data_juicer_elastic.worker.scan import refresh_interval
from data_juicer_elastic.worker.sweep import SnapshotCache

Log = Callable[[str], None]


@dataclass
class AfterPrepare:
    """One process once the job dir exists: claim loop or wait, then finalize."""

    spec: JobSpec
    host: str
    log: Log
    job: JobDir
    run: RunDir  # <job_dir>/runs/<run-key>; self.job is the generation this process works on
    # The runner of a claim loop that ended the job: closed after finalize and the verdict line
    # (``close_kept_runner``), so stopping Ray (a second or two) never sits between the job's last shard
    # and its merge.
    runner_kept: object | None = None

    def work_and_finalize(self) -> Outcome:
        return self.work_phase() or self.finalize_phase()

    def close_kept_runner(self) -> None:
        """Close the runner a claim loop that ended the job kept open through finalize."""
        runner, self.runner_kept = self.runner_kept, None
        if runner is not None:
            close_runner(runner)

    # work ---------------------------------------------------------------------------------------
    def work_phase(self) -> Outcome | None:
        """Run this host's claim loop (or wait for it); None once every shard is done."""
        won, ballot = self.run.elect(f"hosts/{safe_key(self.host)}.json", replace_gone=True)
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
            runner = self.spec.make_runner(str(self.job.gen_dir))
        except Exception as exc:
            return self.abort(f"host={self.host} cannot run shards: {type(exc).__name__}: {exc}")
        result = None
        try:
            early = self.dedup_phase(runner)
            if early is not None:
                return early
            result = run_worker(
                self.job,  # this generation, on either store (an s3:// gen_dir would read as a job's root)
                runner,
                host=self.host,
                max_shards=self.shard_quota(),
                prefetch=self.spec.prefetch_shards,
                speculation=self.spec.speculation,
                should_stop=lambda: self.run.aborted() is not None,
                stall_timeout=self.spec.wait_timeout_secs,
                log=self.log,
            )
        finally:
            if result is not None and result.job_complete:
                self.runner_kept = runner
            else:
                close_runner(runner)
        if result.exit_code >= 128:  # this process was told to stop: it leaves, the job goes on
            return Outcome(result.exit_code, f"host={self.host}: {result.message}", self.host, self.run.pid)
        if result.exit_code == EXIT_FAILED:
            return self.abort(result.message)
        if result.stalled:  # the same abort a process that only waits gives
            return self.abort(self.stall_message(self.job.done_ids()))
        return None

    def dedup_phase(self, runner: object) -> Outcome | None:
        """A recipe with deduplicators: every stage unit before the final pass (dedup/driver.py), which the
        claim loop then runs as its shards. An outcome only when the run must stop."""
        stages = getattr(runner, "dedup_stages", None)
        try:
            found = stages(str(self.job.gen_dir)) if callable(stages) else None
            if found is None:
                return None
            claims = claim_store(self.job, self.host)
            stop = lambda: self.run.aborted() is not None  # noqa: E731
            ran = Driver(self.job, *found, claims, should_stop=stop, log=self.log).run()
        except Stopped:
            return self.run.aborted()
        except UnitFailed as exc:
            return self.abort(str(exc))
        except Exception as exc:
            return self.abort(f"host={self.host}: dedup stages failed: {type(exc).__name__}: {exc}")
        self.log(f"host={self.host}: dedup stages done ({ran} units here); the final pass runs as the shards")
        return None

    def shard_quota(self) -> int | None:
        """Most shards this host may complete in this run (completed, not claimed: retries are free)."""
        limits = [self.spec.max_shards]
        if self.spec.require_all_nodes and self.spec.nodes:
            limits.append(math.ceil(len(self.job.manifest().shards) / self.spec.nodes))
        given = [x for x in limits if x is not None]
        return min(given) if given else None

    def wait_for_shards(self) -> Outcome | None:
        """Wait until every shard is done (None), a failure, an abort, or no progress for the timeout.

        Each poll reads the shared snapshot (``worker.sweep``): O(1) calls, whatever the job's size.
        """
        snapshots = self.snapshots()
        last_done, last_progress = -1, time.monotonic()
        while True:
            outcome = self.run.aborted() or self.failed_outcome()
            if outcome:
                return outcome
            snap = snapshots.get()
            if snap.complete:
                return None
            if snap.done != last_done or snap.live:
                last_done, last_progress = snap.done, time.monotonic()
            elif time.monotonic() - last_progress > self.spec.timeout:
                return self.abort(self.stall_message(self.job.done_ids()))
            time.sleep(self.spec.poll_interval_secs)

    def snapshots(self) -> SnapshotCache:
        return SnapshotCache(self.job, claim_store(self.job, self.host), refresh_interval(self.job))

    def failed_outcome(self) -> Outcome | None:
        failed = sorted(self.job.failed_ids())
        return self.abort(failure_message(self.job, failed[0])) if failed else None

    def abort(self, message: str) -> Outcome:
        """Stop the run; the process whose abort wins writes the job report, since a failed job is read most."""
        outcome = self.run.abort(message)
        if (outcome.host, outcome.pid) == (self.host, self.run.pid):
            self.write_report()
        return outcome

    def all_done(self) -> bool:
        return self.snapshots().get().complete

    def stall_message(self, done: set[str]) -> str:
        shards = self.job.manifest().shards.ids()
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
        """Merge the generation once: skip it when already merged, else stand in its finalize election."""
        # the election's key first, then the checks: a merge that ends in between is seen by the check,
        # one that ends after it has this key, so a process never stands in a second election for it; and a
        # coordinator told to stop aborts the run before its round fails, so nobody of this run starts a second
        election = finalize_round(self.job, self.spec.export_path, self.run.run_id, self.host)
        aborted = self.run.aborted()
        if aborted:
            return aborted
        outcome = self.already_merged() or coordinate(
            election,
            "finalize",
            self.do_finalize,
            self.spec,
            self.log,
            on_interrupted=lambda o: self.run.abort(o.message),
        )
        return self.run.publish("finalize.result.json", outcome)  # what this run reports

    def already_merged(self) -> Outcome | None:
        """PASS without writing when the generation's merge record still describes the output."""
        record = merged_already(self.job, self.spec.export_path)
        if record is None:
            return None
        hosts: dict[str, int] = {}
        for shard in record["shards"]:
            hosts[shard["host"]] = hosts.get(shard["host"], 0) + 1
        finished = record.get("finished_at", 0)
        started = self.run.record("run.json").get("created_at")
        if isinstance(started, (int, float)) and isinstance(finished, (int, float)) and finished >= started:
            note = ""  # merged by this run (a process of it may read the record before its coordinator publishes)
        else:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(finished))
            note = f" (already merged from these done records at {when}; nothing rewritten)"
        return self.passed(len(record["shards"]), hosts, record["rows"], record["output"], note)

    def passed(self, shards: int, hosts: dict[str, int], rows: int, output: str, note: str) -> Outcome:
        """The run's PASS line, one wording whether this process merged or found the merge done (a process of
        the merging run may see the merge record and publish before the coordinator does)."""
        expected = f" ({len(hosts)} of {self.spec.nodes} expected nodes)" if self.spec.nodes else ""
        message = f"{shards} shards completed by {len(hosts)} host(s){expected}: {_listing(hosts)}; "
        into = f"written to folder {output}" if is_folder_export(output) else f"merged into {output}"
        return Outcome(
            EXIT_OK, f"{message}{rows} rows {into}{dedup_note(self.job)}{note}", self.host, self.run.pid, hosts
        )

    def write_report(self) -> None:
        """The job report in the job dir; a report that cannot be written never fails the job."""
        try:
            self.log(f"job report: {write_report(self.job.gen_dir)}")
        except Exception as exc:  # the merged output is what matters
            self.log(f"job report not written: {type(exc).__name__}: {exc}")

    def do_finalize(self) -> Outcome:
        """Check the records and hosts, then merge (which re-reads and checks every output as it copies)."""
        done = self.already_merged()  # a round that finished while this one was elected
        if done:
            return done
        nodes = self.spec.nodes if self.spec.require_all_nodes else None
        report = verify(self.job, expect_nodes=nodes, check_content=False)
        hosts = dict(report.hosts)
        self.log(f"completion hosts: {_listing(hosts)}")
        if not report.ok or not report.complete:
            raise IntegrityError("verify refused the job: " + "; ".join(report.problems or ["incomplete"]))
        merged = merge(self.job, self.spec.export_path, overwrite=self.spec.overwrite_output, log=self.log)
        self.write_report()
        dropped = describe_error_rows(error_rows_by_shard(self.job))
        return self.passed(merged.shards, hosts, merged.rows, merged.output, f"; {dropped}" if dropped else "")


def dedup_note(job: JobDir) -> str:
    """``; dedup: d0 exact removed 40 rows, d1 minhash removed 27 rows`` for a recipe with deduplicators, else
    "" (the PASS line of a job without them is unchanged); a job that passed has every join done."""
    try:
        words = brief(dedup_progress(job))
    except (OSError, ValueError, ElasticError) as exc:  # the merged output is what matters
        words = f"dedup: not read ({type(exc).__name__}: {exc})"
    return f"; {words}" if words else ""


def _listing(hosts: dict[str, int]) -> str:
    return ", ".join(f"{h}={n}" for h, n in sorted(hosts.items()))


def _hosts_of(job: JobDir, done: set[str]) -> dict[str, int]:
    hosts: dict[str, int] = {}
    for sid in done:
        try:
            record = load_done(job, sid)
        except IntegrityError:
            record = None
        host = record.host if record else "?"
        hosts[host] = hosts.get(host, 0) + 1
    return hosts


def _some(items: list[str], limit: int = 8) -> str:
    return ", ".join(items[:limit]) + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")
