"""Small things a user trips on, with real worker processes: what is skipped, waited for, lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from data_juicer_elastic.errors import one_line
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.lines import input_line
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare

from .jobs import REPO, attempt_outcomes, env_with, make_job, spawn_worker, wait_for, write_corpus


def test_folder_input_logs_the_files_it_skips(tmp_path):
    root = tmp_path / "data"
    write_corpus(root / "a.jsonl", 5)
    write_corpus(root / "sub" / "b.jsonl", 5)
    (root / "notes.txt").write_text("not data\n")
    (root / "sub" / "table.csv").write_text("a,b\n")
    (root / ".DS_Store").write_bytes(b"\0")
    lines: list[str] = []
    req = PrepareRequest(
        dataset_path=str(root), job_dir=str(tmp_path / "job"), recipe_text=b"process: []\n", policy=Policy(num_shards=2)
    )
    prepare(req, log=lines.append)
    skipped = [line for line in lines if "skipped" in line]
    assert skipped == [
        f"{root}: skipped 2 file(s) not named *.jsonl, *.jsonl.gz or *.jsonl.zst: notes.txt, sub/table.csv"
    ]


def test_one_line_drops_colour_and_keeps_the_raised_exception():
    ray_error = (
        "RayTaskError(ValueError): ray::MapBatches(f)() (pid=1, ip=10.0.0.1)\n"
        '  File "ops.py", line 3, in f\n    raise ValueError("row 7 is cursed")\n'
        "\x1b[36mValueError: row 7 is cursed\x1b[0m\n"
    )
    assert one_line(ray_error) == "ValueError: row 7 is cursed"
    assert one_line("\x1b[31mOSError: disk gone\x1b[0m") == "OSError: disk gone"


def test_a_waiting_worker_says_for_what_and_status_shows_the_lost_attempt(tmp_path):
    job = make_job(tmp_path, rows=20, shards=2, lock_timeout_secs=3.0, heartbeat_secs=0.3)
    slow = "part-00000-of-00002"
    # the victim holds only the shard it runs (one claimed ahead would be a second lease to wait for); on
    # another host, since a worker of its own host would take a dead process's lease over at once
    victim = spawn_worker(
        job,
        "slow_copy",
        "--prefetch-shards",
        "0",
        DJE_TEST_SLEEP="120",
        DJE_TEST_SLOW_SHARDS=slow,
        DJ_ELASTIC_HOSTNAME="node-killed",
    )
    wait_for((job.attempts_dir / slow / "0001" / "started").exists, timeout=60)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    log = tmp_path / "rescuer.log"
    rescuer = spawn_worker(job, "copy", log=log)
    assert rescuer.wait(timeout=120) == 0, log.read_text()
    text = log.read_text()
    waiting = [line for line in text.splitlines() if line.startswith("waiting for 1 shard(s) leased by other workers")]
    assert len(waiting) == 1 and slow in waiting[0] and "unless renewed" in waiting[0], text
    assert attempt_outcomes(job)[slow] == ["running", "done"]  # what the dead attempt left behind
    status = subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", "status", "--job-dir", str(job.root), "--all"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env_with(),
    )
    assert status.returncode == 0, status.stderr
    row = next(line for line in status.stdout.splitlines() if line.startswith(slow))
    assert "1 attempt(s) lost: killed or stalled" in row, status.stdout


def test_a_shard_line_maps_back_to_its_input_file_and_line(tmp_path):
    root = tmp_path / "data"
    write_corpus(root / "a.jsonl", 7)
    write_corpus(root / "b" / "c.jsonl", 5)
    req = PrepareRequest(
        dataset_path=str(root), job_dir=str(tmp_path / "job"), recipe_text=b"process: []\n", policy=Policy(num_shards=1)
    )
    prepare(req, log=lambda *_: None)
    job = JobDir(tmp_path / "job")
    sid = job.manifest().shards[0].id
    assert input_line(job, sid, 0) == f"{root}/a.jsonl:1"
    assert input_line(job, sid, 6) == f"{root}/a.jsonl:7"
    assert input_line(job, sid, 7) == f"{root}/b/c.jsonl:1"
    assert input_line(job, sid, 11) == f"{root}/b/c.jsonl:5"


def test_longest_line_is_exact_for_long_lines(tmp_path):
    from data_juicer_elastic.ray_runner.shard_errors import DEFAULT_BLOCK, block_size_for, longest_line

    path = tmp_path / "s.jsonl"
    long = b'{"t": "' + b"x" * (3 * DEFAULT_BLOCK) + b'"}\n'
    path.write_bytes(b'{"a": 1}\n' * 200_000 + long + b'{"a": 2}\n' * 10)
    assert longest_line(str(path)) == len(long)
    assert block_size_for(str(path)) == 8 * DEFAULT_BLOCK  # a power of two, twice the longest line or more
    short = tmp_path / "short.jsonl"
    short.write_bytes(b'{"a": 1}\n' * 300_000)
    assert block_size_for(str(short)) is None  # the reader's default block holds every line


def test_shard_ids_past_99999_are_shard_ids_and_part_names():
    """A 100,000-shard job names shards with six digits (``:05d`` is a minimum width)."""
    from data_juicer_elastic.folder_export import PART_RE
    from data_juicer_elastic.job.layout import SHARD_ID_RE, shard_id

    for index, count in ((0, 16), (99_999, 100_000), (100_000, 100_001)):
        sid = shard_id(index, count)
        assert SHARD_ID_RE.match(sid) and int(SHARD_ID_RE.match(sid).group(1)) == index
        assert PART_RE.match(f"{sid}.jsonl")
