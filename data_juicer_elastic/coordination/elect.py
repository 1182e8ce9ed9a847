"""A coordinator role (prepare, finalize): one process wins it and works, the others wait.

The winner renews its ballot through the store while it works (a
``LeaseRefresher``, from the version its election wrote) and publishes its
outcome, whatever happens: an error becomes a failed outcome, an
interruption too. A waiter publishes the coordinator's failure itself once
that heartbeat is older than ``wait_timeout_secs`` by the store's clock, so
nobody waits forever on a killed coordinator.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable

from data_juicer_elastic.coordination.rundir import EXIT_FAILED, Outcome, RunDir
from data_juicer_elastic.coordination.spec import JobSpec
from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.storage.refresher import LeaseRefresher
from data_juicer_elastic.worker.signals import Interrupted, signals_raise_interrupted

Log = Callable[[str], None]


def coordinate(
    run: RunDir,
    role: str,
    work: Callable[[], Outcome],
    spec: JobSpec,
    log: Log,
    on_interrupted: Callable[[Outcome], object] | None = None,
    *,
    replace_gone: bool = False,
) -> Outcome:
    """Win ``role``'s election and publish ``work()``'s outcome, or wait for the winner's.

    ``on_interrupted`` sees the failure of a coordinator told to stop before the election publishes it.
    With ``replace_gone``, a winner of this host that provably no longer runs (a node killed and started
    again) is succeeded at once rather than waited for until its heartbeat runs out.
    """
    name = f"{role}.coordinator.json"
    published = run.read(f"{role}.result.json")
    if published is not None:  # a process started after the coordinator ended: nothing to wait for
        ballot = run.record(name)
        log(f"{role} was done by host={ballot.get('host')} pid={ballot.get('pid')}")
        return published
    before = run.record(name) if replace_gone else {}
    won, ballot = run.elect(name, replace_gone=replace_gone)
    if not won:
        log(f"{role} coordinator is host={ballot.get('host')} pid={ballot.get('pid')}; waiting for it")
        return wait_for_result(run, role, ballot, spec)
    if before:
        gone = f"host={before.get('host')} pid={before.get('pid')}"
        log(f"elected as {role} coordinator, taking over from {gone}, which is gone (killed and restarted?)")
    else:
        log(f"elected as {role} coordinator")
    interval = min(spec.poll_interval_secs, spec.timeout / 4)
    with LeaseRefresher(run.store, run.key(name), run.won[name], interval, log=log):
        return run.publish(f"{role}.result.json", _work(run, role, work, log, on_interrupted))


def _work(
    run: RunDir, role: str, work: Callable[[], Outcome], log: Log, on_interrupted: Callable[[Outcome], object] | None
) -> Outcome:
    """``work()``'s outcome, or a failed one naming what went wrong; an interruption is published, then raised."""
    try:
        with signals_raise_interrupted():
            return work()
    except ElasticError as exc:
        return Outcome(exc.exit_code, f"{role} failed on host={run.host}: {exc}")
    except Interrupted as exc:
        message = f"the {role} coordinator on host={run.host} was interrupted ({exc}); submit the job again"
        failed = Outcome(EXIT_FAILED, message, run.host, run.pid)
        if on_interrupted is not None:
            on_interrupted(failed)
        run.publish(f"{role}.result.json", failed)
        raise
    except Exception as exc:  # a bug or an unexpected OS error: still tell the others
        log(traceback.format_exc())
        return Outcome(EXIT_FAILED, f"{role} failed on host={run.host}: {type(exc).__name__}: {exc}")


def wait_for_result(run: RunDir, role: str, ballot: dict, spec: JobSpec) -> Outcome:
    """Poll for the coordinator's outcome; when its heartbeat stops, publish its failure instead."""
    result = f"{role}.result.json"
    while True:
        outcome = run.read(result) or run.aborted()
        if outcome:
            return outcome
        age = run.heartbeat_age(f"{role}.coordinator.json")
        if age > spec.timeout:
            message = (
                f"the {role} coordinator (host={ballot.get('host')} pid={ballot.get('pid')}) published no "
                f"result and its heartbeat stopped {age:.0f}s ago (wait_timeout_secs={spec.timeout:g}); it was "
                "probably killed. Submit the job again (a new run id): the job directory is reused and only "
                "unfinished work is redone"
            )
            return run.publish(result, Outcome(EXIT_FAILED, message, run.host, run.pid))
        time.sleep(spec.poll_interval_secs)
