"""Small runners for protocol tests: real callables run by real worker processes.

Behaviour is steered by environment variables so the same runner can be
named on a ``dj-elastic worker --runner tests.runners:NAME`` command line.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path


def _shard_name(shard_path: str) -> str:
    return Path(shard_path).name.removesuffix(".jsonl")


def copy(shard_path: str, output_path: str, job_dir: str) -> None:
    """Identity: the output is the shard."""
    shutil.copyfile(shard_path, output_path)


def slow_copy(shard_path: str, output_path: str, job_dir: str) -> None:
    """Sleeps DJE_TEST_SLEEP seconds (only for shards listed in DJE_TEST_SLOW_SHARDS, if set)."""
    slow = os.environ.get("DJE_TEST_SLOW_SHARDS")
    if not slow or _shard_name(shard_path) in slow.split(","):
        Path(output_path).parent.joinpath("started").touch()
        time.sleep(float(os.environ.get("DJE_TEST_SLEEP", "30")))
    copy(shard_path, output_path, job_dir)


def fail(shard_path: str, output_path: str, job_dir: str) -> None:
    """Fails shards listed in DJE_TEST_FAIL_SHARDS (all if unset), copies the rest."""
    failing = os.environ.get("DJE_TEST_FAIL_SHARDS")
    if not failing or _shard_name(shard_path) in failing.split(","):
        raise RuntimeError(f"injected failure for {_shard_name(shard_path)}")
    copy(shard_path, output_path, job_dir)


def weighted(shard_path: str, output_path: str, job_dir: str) -> None:
    """Sleeps DJE_TEST_UNIT seconds times this worker's DJE_TEST_WEIGHT (a slow or fast node)."""
    time.sleep(float(os.environ.get("DJE_TEST_UNIT", "0.05")) * float(os.environ.get("DJE_TEST_WEIGHT", "1")))
    copy(shard_path, output_path, job_dir)
