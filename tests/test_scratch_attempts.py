"""Attempts through node-local scratch (docs/OBJECT_STORE.md step 9), forced on a POSIX job dir.

An object store has no attempt folder to write into, so the runner reads a downloaded shard and writes in
scratch, and the worker uploads the attempt's files before it publishes done. A job dir on S3 is refused
still, so these tests force that path on POSIX (``Worker(scratch=...)``) and hold it to the direct path:
the same merged bytes, nothing half-published by a kill, scratch removed however an attempt ends, and a
full scratch disk reported as a full job dir is.

    python -m tests.test_scratch_attempts JOB_DIR SCRATCH {run,upload}

runs one such worker (``run``: the holding runner; ``upload``: SIGKILL itself before an output's upload
lands), for the kill tests.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.job.attempt_files import AttemptDir
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.merge import verify
from data_juicer_elastic.storage import posix as posix_mod
from data_juicer_elastic.worker.loop import run_worker

from . import runners
from .chaos.conftest import small_disk  # noqa: F401  (a fixture)
from .jobs import (
    attempt_outcomes,
    check_done_exactly_once,
    done_attempts,
    make_job,
    merge_and_check,
    spawn,
    wait_for,
)

NO_SPACE = "no space left on device"


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if not p.is_dir()] if folder.exists() else []


def _done_digests(job: JobDir) -> dict[str, tuple]:
    records = (orjson.loads((job.done_dir / f"{sid}.json").read_bytes()) for sid in done_attempts(job))
    return {r["shard"]: (r["rows"], r["bytes"], r["sha256"], r["output"]) for r in records}


def test_scratch_output_is_the_direct_output(tmp_path):
    seen: list[tuple[str, str]] = []

    def copy(shard_path: str, output_path: str, job_dir: str) -> None:
        seen.append((shard_path, output_path))
        Path(output_path).parent.joinpath(AttemptDir.OPS).write_bytes(b'{"rows_in": 1}')
        runners.copy(shard_path, output_path, job_dir)

    direct, scratched = (make_job(tmp_path / name, rows=60, shards=4) for name in ("direct", "scratch"))
    scratch = tmp_path / "node-scratch"
    assert run_worker(direct.root, copy, log=lambda *_: None).exit_code == 0
    assert all(Path(out).is_relative_to(direct.root) for _, out in seen)  # POSIX: the job dir itself
    seen.clear()
    assert run_worker(scratched.root, copy, scratch=scratch, log=lambda *_: None).exit_code == 0
    assert len(seen) == 4 and all(Path(p).is_relative_to(scratch) for pair in seen for p in pair)
    assert _files(scratch) == [], "scratch was left after the attempts ended"

    check_done_exactly_once(scratched)
    assert _done_digests(scratched) == _done_digests(direct)
    merged = merge_and_check(scratched, tmp_path / "scratch.jsonl")
    assert merged == merge_and_check(direct, tmp_path / "direct.jsonl")
    for spec in scratched.manifest().shards:
        adir = scratched.attempt_dir(spec.id, 1)
        assert sorted(os.listdir(adir)) == [AttemptDir.RECORD, AttemptDir.OPS, AttemptDir.OUTPUT]
        assert orjson.loads((adir / AttemptDir.RECORD).read_bytes())["outcome"] == "done"
        assert orjson.loads((scratched.done_dir / f"{spec.id}.json").read_bytes())["rows_in"] == 1


def test_a_failed_attempt_keeps_its_log_and_leaves_no_scratch(tmp_path, monkeypatch):
    job = make_job(tmp_path, rows=40, shards=4, max_retries=0)
    target = job.manifest().shards[1].id
    monkeypatch.setenv("DJE_TEST_FAIL_SHARDS", target)
    scratch = tmp_path / "node-scratch"
    result = run_worker(job.root, runners.fail, scratch=scratch, log=lambda *_: None)
    assert result.exit_code == 2 and target in result.message
    assert "Traceback" in (job.attempt_dir(target, 1) / AttemptDir.LOG).read_text()
    assert not (job.attempt_dir(target, 1) / AttemptDir.OUTPUT).exists()
    assert attempt_outcomes(job)[target] == ["failed"]
    assert _files(scratch) == [], "scratch was left after a failed attempt"


@pytest.mark.parametrize("point", ["run", "upload"])
def test_a_worker_killed_in_scratch_publishes_nothing_and_the_shard_is_redone(tmp_path, point):
    job = make_job(tmp_path, rows=40, shards=4, lock_timeout_secs=2.0, heartbeat_secs=0.2)
    scratch = tmp_path / "node-scratch"
    cmd = [sys.executable, "-m", "tests.test_scratch_attempts", str(job.root), str(scratch), point]
    victim = spawn(cmd, DJE_TEST_HOLD=str(tmp_path / "never"), log=tmp_path / "victim.log")
    if point == "run":  # the runner holds inside its attempt: kill -9 from outside
        wait_for(lambda: any(p.name == "started" for p in _files(scratch)), "a runner started", proc=victim)
        victim.kill()
    assert victim.wait(timeout=60) == -signal.SIGKILL, (tmp_path / "victim.log").read_text()
    killed = [d.name for d in job.attempts_dir.iterdir()]
    assert len(killed) == 1 and not done_attempts(job)
    left = os.listdir(job.attempt_dir(killed[0], 1))
    assert AttemptDir.OUTPUT not in left, "a killed upload left the output at its name"
    if point == "upload":
        assert any(n.startswith(".") for n in left), left  # its staged temp: the upload really was under way

    assert [p for p in _files(scratch) if f"/{killed[0]}/0001/" in str(p)], "the killed worker left no scratch"
    assert run_worker(job.root, runners.copy, scratch=scratch, log=lambda *_: None).exit_code == 0
    done = check_done_exactly_once(job)
    assert done[killed[0]] == 2 and attempt_outcomes(job)[killed[0]] == ["running", "done"]
    assert _files(scratch) == [], "the killed worker's scratch (its shard, its partial output) was left"
    merge_and_check(job, tmp_path / "merged.jsonl")
    assert verify(job).ok


@pytest.mark.timeout(120)
def test_a_full_scratch_disk_stops_the_worker_as_a_full_job_dir_does(tmp_path, small_disk):  # noqa: F811
    scratch = small_disk.mount("512k")
    job = make_job(tmp_path, rows=24000, shards=4)
    sizes = [s.bytes for s in job.manifest().shards]
    assert all(256 << 10 < b < 512 << 10 for b in sizes), sizes  # a shard fits; with its output it does not
    result = run_worker(job.root, runners.copy, scratch=scratch, log=lambda *_: None)
    assert result.exit_code == 2 and NO_SPACE in result.message and str(scratch) in result.message, result.message
    assert "not counted as failed" in result.message
    assert not os.listdir(job.failed_dir) and not done_attempts(job)
    assert ["no-space"] in attempt_outcomes(job).values()
    assert _files(scratch) == [], "the attempt's scratch was left on the full disk"
    small_disk.resize(scratch, "16m")
    assert run_worker(job.root, runners.copy, scratch=scratch, log=lambda *_: None).exit_code == 0
    check_done_exactly_once(job)
    merge_and_check(job, tmp_path / "merged.jsonl")


def main(job_dir: str, scratch: str, point: str) -> int:
    if point == "upload":
        link = posix_mod.link_staged  # the upload's last step: its staged temp linked to the key

        def die_before_the_output_lands(tmp, path, *args, **kwargs):
            if Path(path).name == AttemptDir.OUTPUT:
                os.kill(os.getpid(), signal.SIGKILL)
            return link(tmp, path, *args, **kwargs)

        posix_mod.link_staged = die_before_the_output_lands
    runner = runners.slow_copy if point == "run" else runners.copy
    return run_worker(job_dir, runner, scratch=scratch, log=print).exit_code


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
