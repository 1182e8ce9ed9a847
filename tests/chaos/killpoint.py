"""A worker or merge process that SIGKILLs itself at one precise point of the protocol.

    python -m tests.chaos.killpoint POINT --job-dir DIR [--output FILE]

POINT is one of
  verified   the attempt's output was re-read and checked; the done record is not published yet
  uploaded   the output is in the job dir too (uploaded, where the attempt ran in node-local scratch); no
             done record yet
  published  the done record is published; attempt.json still says "running"
  copy       merge has copied half the shards' outputs into its temp file (flushed), not the rest
  merge      the merged temp file is complete and fsynced, not yet renamed into place
  placed     the merged output is in place, merge.json not written yet

Worker points die at the first shard named in DJE_TEST_DIE_SHARDS (any shard when unset) and
otherwise run the real claim loop with the identity runner; the merge point runs the real merge.
Only this harness is patched: the protocol code runs unchanged up to the kill.

Prepare points (``signal_in_prepare``, used by ``tests.coord_node --signal-in-prepare POINT:SIG``):
  staged              every shard and the manifest are written in the staging folder, nothing published
  shards-published    the shards are renamed into place, the manifest is not linked yet
  manifest-published  the manifest is linked, the recipe's generation is not started yet
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from data_juicer_elastic import merge as merge_mod
from data_juicer_elastic.job.layout import SHARD_ID_RE, JobDir
from data_juicer_elastic.prepare import driver as driver_mod
from data_juicer_elastic.prepare import staging as staging_mod
from data_juicer_elastic.worker import attempt as attempt_mod
from data_juicer_elastic.worker.loop import run_worker

from ..runners import copy


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _targeted(shard: str) -> bool:
    names = os.environ.get("DJE_TEST_DIE_SHARDS")
    return not names or shard in names.split(",")


def signal_half_way_through_merges(signum: int = signal.SIGKILL) -> None:
    """Any merge in this process sends it ``signum`` once half the shards' outputs reached its temp file."""
    copy_one = merge_mod._copy_one

    def copy_then_signal(job, done, writer, *args):
        index, total = map(int, SHARD_ID_RE.match(done[0].shard).groups())
        if index == total // 2:
            writer._wait()  # the buffers already handed off reach the temp file
            os.kill(os.getpid(), signum)
        return copy_one(job, done, writer, *args)

    merge_mod._copy_one = copy_then_signal


PREPARE_POINTS = ("staged", "shards-published", "manifest-published")


def signal_in_prepare(point: str, signum: int = signal.SIGKILL) -> None:
    """Any prepare in this process sends it ``signum`` at ``point`` (see the module's docstring)."""

    def signalled(real):
        def call(*args, **kwargs):
            if point != "shards-published" or str(args[0]).endswith("manifest.json"):
                os.kill(os.getpid(), signum)
            return real(*args, **kwargs)

        return call

    if point == "staged":
        staging_mod.Staging.publish = signalled(staging_mod.Staging.publish)
    elif point == "shards-published":
        staging_mod.publish_once = signalled(staging_mod.publish_once)  # its manifest link, after the rename
    elif point == "manifest-published":
        driver_mod.ensure_generation = signalled(driver_mod.ensure_generation)
    else:
        raise ValueError(f"unknown prepare point {point!r}; one of {', '.join(PREPARE_POINTS)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("point", choices=["verified", "uploaded", "published", "copy", "merge", "placed"])
    p.add_argument("--job-dir", required=True)
    p.add_argument("--output", default=None)
    a = p.parse_args(argv)

    if a.point == "verified":
        inspect = attempt_mod.inspect_output

        def inspect_then_die(path):
            digest = inspect(path)
            if _targeted(Path(path).parent.parent.name):
                _die()
            return digest

        attempt_mod.inspect_output = inspect_then_die
    elif a.point in ("uploaded", "published"):
        publish = attempt_mod.publish_done  # on either store: the attempt publishes through it

        def die_around_publish(job, record, deadline=None):
            if a.point == "uploaded" and _targeted(record.shard):
                _die()
            won = publish(job, record, deadline)
            if won and _targeted(record.shard):
                _die()
            return won

        attempt_mod.publish_done = die_around_publish
    else:
        job = JobDir(a.job_dir)
        if a.point == "copy":
            signal_half_way_through_merges()
        elif a.point == "placed":
            merge_mod._record = lambda *args, **kwargs: _die()
        else:

            def die_before_rename(job, tmp, out, overwrite):
                _die()

            merge_mod._put_in_place = die_before_rename
        merge_mod.merge(job, a.output, overwrite=a.point != "placed", log=lambda *_: None)
        return 0
    return run_worker(a.job_dir, copy, log=lambda *_: None).exit_code


if __name__ == "__main__":
    sys.exit(main())
