"""``dj-elastic status`` summarises without opening a done record; ``--shards`` reads them (issue 35 item 1)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import orjson
import pytest

from data_juicer_elastic.cli import main as cli_main
from data_juicer_elastic.worker.loop import run_worker

from .jobs import REPO, env_with, make_job
from .require import require
from .runners import copy

SHARDS = 300
SUMMARY = ("counts", "hosts", "input_rows", "input_rows_done", "output_rows", "progress", "complete", "failed")


def status_json(job, *extra: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", "status", "--job-dir", str(job.root), "--json", *extra],
        capture_output=True,
        cwd=REPO,
        env=env_with(),
    )
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    return orjson.loads(out.stdout)


def summary(data: dict) -> dict:
    return {k: data[k] for k in SUMMARY} | {"rate": data["rows_per_sec"] is not None}


@pytest.fixture(scope="module")
def done_job(tmp_path_factory):
    """A job of 300 shards, all done by one real worker (the copy runner)."""
    job = make_job(tmp_path_factory.mktemp("status"), rows=2 * SHARDS, shards=SHARDS)
    assert run_worker(job.root, copy, log=lambda *_: None).exit_code == 0
    return job


def test_the_summary_never_reads_a_done_record(done_job, tmp_path):
    job = done_job
    before = status_json(job, "--shards")
    assert before["counts"]["done"] == SHARDS and before["output_rows"] == 2 * SHARDS
    records = sorted(job.done_dir.iterdir())
    saved = {p: p.read_bytes() for p in records}
    try:
        for p in records:  # garbage: a reader of these would find no host, no rows, no times
            p.write_bytes(b"\x00not a done record")
        after = status_json(job)
        assert summary(after) == summary(before), "the summary read the done records"
        assert after["per_shard"] is False and after["shards"] == [] and after["shard_count"] == SHARDS
        text = subprocess.run(
            [sys.executable, "-m", "data_juicer_elastic.cli", "status", "--job-dir", str(job.root)],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env_with(),
        )
        assert text.returncode == 0 and f"done {SHARDS} " in text.stdout, text.stdout + text.stderr
        assert f"{2 * SHARDS} output rows" in text.stdout and "hosts: " in text.stdout, text.stdout
        assert "?=" not in text.stdout, text.stdout
        detail = status_json(job, "--shards")  # the per-shard view reads them: it sees the garbage
        assert detail["per_shard"] is True and detail["output_rows"] == 0 and len(detail["shards"]) == SHARDS
    finally:
        for p, data in saved.items():
            p.write_bytes(data)


def test_the_summary_opens_no_done_record_and_few_files_of_the_job(done_job):
    require(shutil.which("strace") is not None, "strace counts the opens (apt-get install strace)")
    job = done_job
    for extra, most in (((), 30), (("--json",), 30)):
        cmd = [sys.executable, "-m", "data_juicer_elastic.cli", "status", "--job-dir", str(job.root), *extra]
        out = subprocess.run(
            ["strace", "-f", "-e", "trace=openat,open", *cmd], capture_output=True, text=True, cwd=REPO, env=env_with()
        )
        assert out.returncode == 0, out.stderr[-3000:]
        opened = re.findall(r'open(?:at)?\(.*?"([^"]+)"', out.stderr)
        in_job = [p for p in opened if p.startswith(str(job.root))]
        assert not [p for p in in_job if "/state/done/" in p], "a done record was opened"
        assert len(in_job) <= most, in_job  # the manifest, generation files, the worker record, the clock probe


def test_without_worker_records_the_summary_reads_the_done_records(done_job, tmp_path):
    """A job dir run before worker records (or one whose records are lost): the summary falls back to them."""
    job = done_job
    before = status_json(job, "--shards")
    kept = tmp_path / "workers"
    shutil.move(job.workers_dir, kept)
    try:
        assert summary(status_json(job)) == summary(before)
    finally:
        shutil.move(kept, job.workers_dir)


def test_shards_option_gives_the_per_shard_table(done_job, capsys):
    assert cli_main(["status", "--job-dir", str(done_job.root), "--shards"]) == 0
    out = capsys.readouterr().out
    assert "part-00000-of-00300" in out and out.count(" done ") >= SHARDS
    assert cli_main(["status", "--job-dir", str(done_job.root)]) == 0
    assert "part-00000-of-00300" not in capsys.readouterr().out


def test_after_a_retried_done_shard_is_redone_the_summary_still_reads_no_done_record(tmp_path):
    job = make_job(tmp_path, rows=40, shards=4)
    assert run_worker(job.root, copy, host="a", log=lambda *_: None).exit_code == 0
    assert cli_main(["retry", "--job-dir", str(job.root), "--shard-id", "part-00001-of-00004"]) == 0
    assert run_worker(job.root, copy, host="b", log=lambda *_: None).exit_code == 0
    before = status_json(job, "--shards")
    assert before["counts"]["done"] == 4 and before["output_rows"] == 40 and before["hosts"] == {"a": 3, "b": 1}
    records = sorted(job.done_dir.iterdir())
    saved = {p: p.read_bytes() for p in records}
    try:
        for p in records:
            p.write_bytes(b"\x00not a done record")
        after = status_json(job)
        assert summary(after) == summary(before), "the summary read the done records"
    finally:
        for p, data in saved.items():
            p.write_bytes(data)
