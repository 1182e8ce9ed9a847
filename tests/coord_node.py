"""One simulated node of a coordinated job: ``python -m tests.coord_node ...``.

The coordination (``run_job``) with toy runners instead of Ray, so protocol
tests can start many nodes cheaply: it builds a ``JobSpec`` from its
arguments (a prepare request over a test corpus, a runner from
``tests.runners``) and runs the real ``run_job``. Tests start several of
these with distinct ``DJ_ELASTIC_HOSTNAME`` values and one run id; the real
``dj-process`` path is tested by tests/test_nodes.py.

Timeouts default generously (a starved process on a loaded machine must
not look dead); a test that needs one to expire passes it explicitly.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from data_juicer_elastic.coordination.session import JobSpec, run_job
from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.job.versions import current_versions
from data_juicer_elastic.prepare.driver import PrepareRequest
from data_juicer_elastic.worker.speculation import Speculation

from . import runners
from .chaos.killpoint import signal_half_way_through_merges, signal_in_prepare
from .jobs import RECIPE


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--job-dir", required=True)
    p.add_argument("--export", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--runner", default="copy", help="a name in tests.runners")
    p.add_argument("--run-id", default=None)
    p.add_argument("--nodes", type=int, default=None)
    p.add_argument("--strict", action="store_true", help="require_all_nodes")
    p.add_argument("--max-shards", type=int, default=None)
    p.add_argument("--max-retries", type=int, default=2)
    p.add_argument("--wait-timeout", type=float, default=120.0)
    p.add_argument("--poll", type=float, default=0.1)
    p.add_argument("--lock-timeout", type=float, default=60.0)
    p.add_argument("--prepare-sleep", type=float, default=0.0, help="the prepare factory sleeps this long first")
    p.add_argument("--prepare-error", default=None, help="the prepare factory raises UserError(this)")
    p.add_argument("--mark-dir", default=None, help="make_runner leaves <host>-<pid> here")
    p.add_argument("--project", default=None, help="the recipe's project_name (a different recipe)")
    p.add_argument("--speculation-min-secs", type=float, default=None, help="speculation on with this minimum")
    p.add_argument("--signal-mid-merge", default=None, help="signal itself (KILL, TERM) half way through a merge")
    p.add_argument("--signal-in-prepare", default=None, help="POINT:SIG (tests/chaos/killpoint.py), e.g. staged:TERM")
    p.add_argument("--recorded-version", default=None, help="prepare records this Data-Juicer version, not ours")
    p.add_argument("--allow-version-mismatch", action="store_true")
    return p.parse_args(argv)


def build_spec(a: argparse.Namespace) -> JobSpec:
    def make_prepare_request() -> PrepareRequest:
        time.sleep(a.prepare_sleep)
        if a.prepare_error:
            raise UserError(a.prepare_error)
        policy = Policy(
            num_shards=a.shards,
            lock_timeout_secs=a.lock_timeout,
            heartbeat_secs=0.3,
            poll_interval_secs=a.poll,
            max_retries=a.max_retries,
        )
        recipe = RECIPE if a.project is None else RECIPE.replace(b"protocol-test", a.project.encode())
        versions = current_versions()
        if a.recorded_version:
            versions["data_juicer"] = a.recorded_version
        return PrepareRequest(
            dataset_path=a.dataset, job_dir=a.job_dir, recipe_text=recipe, policy=policy, versions=versions
        )

    def make_runner(job_dir: str):
        if a.mark_dir:
            host = os.environ.get("DJ_ELASTIC_HOSTNAME", "host")
            Path(a.mark_dir).mkdir(parents=True, exist_ok=True)
            Path(a.mark_dir, f"{host}-{os.getpid()}").touch()
        return getattr(runners, a.runner)

    return JobSpec(
        job_dir=a.job_dir,
        export_path=a.export,
        make_prepare_request=make_prepare_request,
        make_runner=make_runner,
        run_id=a.run_id,
        nodes=a.nodes,
        require_all_nodes=a.strict,
        max_shards=a.max_shards,
        wait_timeout_secs=a.wait_timeout,
        poll_interval_secs=a.poll,
        allow_version_mismatch=a.allow_version_mismatch,
        speculation=Speculation(min_secs=a.speculation_min_secs, quantile=0.5, multiplier=3.0)
        if a.speculation_min_secs is not None
        else Speculation(),
    )


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if a.signal_mid_merge:
        signal_half_way_through_merges(signal.Signals[f"SIG{a.signal_mid_merge}"])
    if a.signal_in_prepare:
        point, sig = a.signal_in_prepare.split(":")
        signal_in_prepare(point, signal.Signals[f"SIG{sig}"])
    return run_job(build_spec(a), log=lambda line: print(line, flush=True))


if __name__ == "__main__":
    sys.exit(main())
