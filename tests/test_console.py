"""What a real ``dj-process`` run prints: the job's story on the console, the details in each attempt's log.

Also the rows an op error removed under Data-Juicer's default ``skip_op_error``:
counted per op and shard, and shown by the PASS line, ``status`` and ``verify``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

from data_juicer_elastic.job.layout import JobDir

from .jobs import REPO, env_with
from .reference import dj_process, elastic_recipe, read_rows, write_jsonl

SHARDS = 16
CURSED = (7, 93)
OPS = """
from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("dje_test_cursed_mapper")
class DjeTestCursedMapper(Mapper):
    def process_single(self, sample):
        if sample["id"] in (7, 93):
            raise ValueError(f"row {sample['id']} is cursed")
        return sample
"""


def recipe(tmp_path, shards: int, **extra):
    ops = tmp_path / "dje_cursed_ops.py"
    ops.write_text(textwrap.dedent(OPS))
    data = tmp_path / "data.jsonl"
    write_jsonl(data, [{"id": i, "text": f"text {i} " + "word " * (i % 9)} for i in range(160)])
    config = elastic_recipe(
        tmp_path / "story.yaml",
        data,
        tmp_path / "out" / "merged.jsonl",
        tmp_path / "job",
        process=[{"dje_test_cursed_mapper": None}, {"text_length_filter": {"min_len": 20}}],
        custom_operator_paths=[str(ops)],
        **extra,
    )
    cfg = config.read_text().replace("num_shards: 4", f"num_shards: {shards}")
    config.write_text(cfg)
    return config


def elastic(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "data_juicer_elastic.cli", *args]
    return subprocess.run(cmd, cwd=REPO, env=env_with(), capture_output=True, text=True, timeout=120)


def test_story_console_of_a_16_shard_run_and_rows_removed_by_op_errors(tmp_path):
    out = dj_process("--config", str(recipe(tmp_path, SHARDS)), cwd=tmp_path)
    console = out.stdout + out.stderr
    assert out.returncode == 0, console[-5000:]
    shards = [f"part-{i:05d}-of-{SHARDS:05d}" for i in range(SHARDS)]
    for sid in shards:
        assert len(re.findall(rf"\| claimed {sid} attempt", console)) == 1, (sid, console)
        assert len(re.findall(rf"\| done {sid} rows=\d+ in [\d.]+s", console)) == 1, (sid, console)
    assert "EVENT[" not in console  # Data-Juicer's op events
    assert "Execution plan" not in console and "MapBatches(" not in console  # Ray's plans, worker output
    assert "Configuration table" not in console and "╒" not in console
    assert len(console.splitlines()) < 3 * SHARDS + 30, console

    job = tmp_path / "job"
    generation = JobDir(job)  # attempts and the report lie in the recipe's generation
    attempts = generation.attempts_dir
    logs = "".join(p.read_text() for p in attempts.glob("*/0001/process.log"))
    assert logs.count("EVENT[job_complete]") == SHARDS  # the details are in each attempt's log
    assert "row 7 is cursed" in logs and "row 93 is cursed" in logs

    ops = [json.loads(p.read_text()) for p in attempts.glob("*/0001/ops.json")]
    assert len(ops) == SHARDS
    assert sum(o["error_rows"] for o in ops) == len(CURSED)
    assert sum(o["ops"][0]["rows_in"] for o in ops) == 160
    assert sum(o["ops"][0]["error_rows"] for o in ops) == len(CURSED)
    merged = read_rows(tmp_path / "out" / "merged.jsonl")
    assert sum(o["rows_out"] for o in ops) == len(merged) and not {r["id"] for r in merged} & set(CURSED)
    pass_line = next(line for line in console.splitlines() if "PASS:" in line)
    assert f"{len(CURSED)} row(s) removed by op errors" in pass_line, pass_line

    status = elastic("status", "--job-dir", str(job))
    assert status.returncode == 0 and f"op errors: {len(CURSED)} row(s)" in status.stdout, status.stdout
    verify = elastic("verify", "--job-dir", str(job))
    assert verify.returncode == 0 and f"{len(CURSED)} row(s) removed by op errors" in verify.stdout, verify.stdout
    assert (generation.gen_dir / "report.html").exists()


@pytest.mark.slow  # a second Ray run; the story run above is the fast tier's one real dj-process job
def test_full_console_is_one_switch_away(tmp_path):
    out = dj_process("--config", str(recipe(tmp_path, 2)), cwd=tmp_path, env={"DJ_ELASTIC_CONSOLE": "full"})
    console = out.stdout + out.stderr
    assert out.returncode == 0, console[-5000:]
    assert "EVENT[" in console and "Configuration table" in console


def test_ray_worker_lines_arriving_after_their_attempt_go_to_its_log(tmp_path):
    """Ray forwards worker output late: a line after the attempt ended lands in that attempt's log."""
    from data_juicer_elastic import console

    first = tmp_path / "first.log"
    with console.attempt_log(first):
        console._worker_lines_to_attempt_log({"pid": 7, "lines": ["while it ran"]})
    console._worker_lines_to_attempt_log({"pid": 7, "lines": ["after it ended"]})
    text = first.read_text()
    assert "while it ran" in text and "(ray worker pid=7) after it ended" in text, text


def test_late_worker_lines_with_their_own_time_go_to_the_attempt_that_ran_then(tmp_path, monkeypatch):
    """Issue 26: a stamped line that arrives while a later attempt runs still goes to the attempt of its time."""
    from datetime import datetime, timedelta

    from data_juicer_elastic import console

    monkeypatch.setattr(console, "_attempt_times", type(console._attempt_times)(maxlen=16))
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    with console.attempt_log(first):
        written = datetime.now()
    stamp = written.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    console._attempt_times[-1] = (first, written - timedelta(seconds=1))  # it began before the line
    with console.attempt_log(second):
        console._attempt_times[-1] = (second, written + timedelta(seconds=1))  # it began after the line
        console._worker_lines_to_attempt_log(
            {"pid": 9, "task_name": "MapBatches", "lines": [f"{stamp} | INFO | op:1 - late", "plain, unstamped"]}
        )
    assert "late" in first.read_text() and "late" not in second.read_text()
    assert "(MapBatches pid=9) plain, unstamped" in second.read_text()  # no time: the attempt running now


WARNINGS_PROBE = """
import sys, warnings
from loguru import logger
logger.remove()
logger.add(sys.stderr, level="INFO")  # as Data-Juicer sets its console up
from data_juicer_elastic import console
assert console.install_story_console("story")
def numpy_like():
    warnings.warn("Mean of empty slice", RuntimeWarning)
def numpy_like_elsewhere():
    warnings.warn("Mean of empty slice", RuntimeWarning)
numpy_like()
numpy_like_elsewhere()  # the same text from another line: once on the console
with console.attempt_log(sys.argv[1]):
    warnings.warn("Use 'expr' instead of 'fn' when possible for performant filters.")
    logger.warning("Warning: The Ray cluster currently does not have any available CPUs. The Dataset job will hang")
    logger.info("an attempt's detail")
"""


def test_misleading_and_repeated_warnings_stay_off_the_story_console(tmp_path):
    """Issue 24: Ray's 'no available CPUs' and 'use expr' warnings in the attempt's log only; a warning once."""
    log = tmp_path / "process.log"
    out = subprocess.run(
        [sys.executable, "-c", WARNINGS_PROBE, str(log)], capture_output=True, text=True, env=env_with(), timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("RuntimeWarning: Mean of empty slice") == 1, out.stderr
    assert "warnings.warn(" not in out.stderr and ".py:" not in out.stderr  # no source line on the console
    assert "available CPUs" not in out.stderr and "instead of 'fn'" not in out.stderr, out.stderr
    assert "an attempt's detail" not in out.stderr
    text = log.read_text()
    assert "available CPUs" in text and "Use 'expr' instead of 'fn'" in text and "an attempt's detail" in text
