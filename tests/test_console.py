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
    from data_juicer_elastic.plugin import console

    first = tmp_path / "first.log"
    with console.attempt_log(first):
        console._worker_lines_to_attempt_log({"pid": 7, "lines": ["while it ran"]})
    console._worker_lines_to_attempt_log({"pid": 7, "lines": ["after it ended"]})
    text = first.read_text()
    assert "while it ran" in text and "(ray worker pid=7) after it ended" in text, text
