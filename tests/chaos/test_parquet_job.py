"""A job prepared from Parquet input goes through the protocol unchanged (issue 34): a worker killed mid-shard
is taken over by another host after its lease times out, a retried done shard is redone alone, status and the
report count its shards, a second generation over the same shards runs and merges, and a backup on a fast host
wins over a straggler.

The shards are descriptors (row group runs of the input files); ``tests.runners:parquet_rows`` reads them as
the Ray runner does and writes the rows as JSONL, so a merge must give back the input's rows in order.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from data_juicer_elastic.cli import main as cli_main
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.job.versions import current_versions
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare
from data_juicer_elastic.report import collect, write_report
from data_juicer_elastic.status import job_status

from ..jobs import (
    RECIPE,
    REPO,
    assert_taken_over_after_timeout,
    attempt_outcomes,
    check_done_exactly_once,
    done_attempts,
    env_with,
    kill_group,
    last_heartbeat,
    spawn_worker,
    started_shard,
    wait_for,
)

SHARDS = 6
LOCK = 3.0
FILES = {"a.parquet": (0, [40, 25, 35, 30]), "sub/b.parquet": (130, [20, 50, 30, 20])}  # first id, row groups
ROWS = sum(sum(groups) for _, groups in FILES.values())


def _rows(first: int, n: int) -> list[dict]:
    return [
        {
            "id": i,
            "text": f"row {i} " + "x" * (i * 7 % 40),
            "meta": None if i % 5 == 0 else {"src": f"s{i % 3}", "w": i / 4},
            "tags": [f"t{j}" for j in range(i % 3)],
        }
        for i in range(first, first + n)
    ]


def write_input(folder: Path) -> list[dict]:
    """Two Parquet files, several row groups each; returns every row in input order."""
    expected = []
    for name, (first, groups) in FILES.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = _rows(first, sum(groups))
        table = pa.Table.from_pylist(rows)
        with pq.ParquetWriter(path, table.schema) as w:
            pos = 0
            for n in groups:
                w.write_table(table.slice(pos, n), row_group_size=n)
                pos += n
        assert pq.ParquetFile(path).metadata.num_row_groups == len(groups)
        expected += rows
    return expected


def _request(tmp: Path, recipe: bytes = RECIPE) -> PrepareRequest:
    settings = {"lock_timeout_secs": LOCK, "heartbeat_secs": 0.5, "poll_interval_secs": 0.1, "max_retries": 2}
    return PrepareRequest(
        dataset_path=str(tmp / "input"),
        job_dir=str(tmp / "job"),
        recipe_text=recipe,
        policy=Policy(num_shards=SHARDS, **settings),
        versions=current_versions(),
    )


def make_parquet_job(tmp: Path) -> tuple[JobDir, list[dict]]:
    expected = write_input(tmp / "input")
    prepare(_request(tmp), log=lambda *_: None)
    job = JobDir(tmp / "job")
    m = job.manifest()
    assert m.parquet is not None and m.total_rows == ROWS and len(m.shards) == SHARDS
    return job, expected


def merged_rows(job: JobDir, out: Path) -> list[dict]:
    """Merge (replacing ``out``); the merge record names exactly the done records' attempts."""
    from data_juicer_elastic.merge import merge

    merge(job, str(out), overwrite=True, log=lambda *_: None)
    record = orjson.loads(job.merge_record_path.read_bytes())
    assert {s["shard"]: s["attempt"] for s in record["shards"]} == done_attempts(job)
    return [orjson.loads(line) for line in out.read_bytes().splitlines()]


def run_to_end(job: JobDir, host: str, log: Path, **env: str) -> None:
    proc = spawn_worker(job, "parquet_rows", log=log, DJ_ELASTIC_HOSTNAME=host, **env)
    try:
        assert proc.wait(timeout=180) == 0, log.read_text()[-4000:]
    finally:
        kill_group(proc)


def dj_elastic(*args: str, code: int = 0) -> subprocess.CompletedProcess:
    """``dj-elastic ARGS`` in a process of its own; it must exit ``code`` (status: 1 while incomplete)."""
    out = subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", *args], capture_output=True, cwd=REPO, env=env_with()
    )
    assert out.returncode == code, out.stderr.decode()[-3000:]
    return out


def test_a_killed_worker_is_taken_over_by_another_host_and_the_merge_is_the_input(tmp_path):
    job, expected = make_parquet_job(tmp_path)
    slow = job.manifest().shards[2].id
    log = tmp_path / "victim.log"
    victim = spawn_worker(
        job, "parquet_rows", log=log, DJ_ELASTIC_HOSTNAME="victim", DJE_TEST_SLOW_SHARDS=slow, DJE_TEST_SLEEP="600"
    )
    try:
        wait_for((job.attempts_dir / slow / "0001" / "started").exists, "the slow shard to start", proc=victim, log=log)
    finally:
        kill_group(victim, signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL
    beat = last_heartbeat(job, slow, 1)
    assert not job.done_path(slow).exists()

    run_to_end(job, "rescuer", tmp_path / "rescuer.log")
    done = check_done_exactly_once(job)
    assert done[slow] == 2 and attempt_outcomes(job)[slow] == ["running", "done"]
    assert_taken_over_after_timeout(job, slow, 1, beat)
    hosts = {sid: orjson.loads(job.done_path(sid).read_bytes()).get("host") for sid in done}
    assert hosts[slow] == "rescuer", hosts
    assert merged_rows(job, tmp_path / "out.jsonl") == expected


def test_a_retried_done_shard_is_redone_alone(tmp_path):
    job, expected = make_parquet_job(tmp_path)
    run_to_end(job, "n1", tmp_path / "n1.log")
    check_done_exactly_once(job)
    assert merged_rows(job, tmp_path / "out.jsonl") == expected
    sid = job.manifest().shards[4].id
    assert cli_main(["retry", "--job-dir", str(job.root), "--shard-id", sid]) == 0
    assert job_status(job).counts["pending"] == 1

    run_to_end(job, "n2", tmp_path / "n2.log")
    outcomes = attempt_outcomes(job)
    assert outcomes[sid] == ["done", "done"]
    assert all(o == ["done"] for s, o in outcomes.items() if s != sid), outcomes
    assert done_attempts(job)[sid] == 2
    assert merged_rows(job, tmp_path / "out.jsonl") == expected


def test_status_and_report_count_the_shards(tmp_path):
    job, _ = make_parquet_job(tmp_path)
    before = orjson.loads(dj_elastic("status", "--job-dir", str(job.root), "--json", code=1).stdout)
    assert before["counts"]["pending"] == SHARDS and before["input_rows"] == ROWS and not before["complete"]

    run_to_end(job, "n1", tmp_path / "n1.log")
    summary = orjson.loads(dj_elastic("status", "--job-dir", str(job.root), "--json").stdout)
    assert summary["counts"]["done"] == SHARDS and summary["complete"]
    assert summary["input_rows"] == summary["input_rows_done"] == ROWS and summary["output_rows"] == ROWS
    detail = orjson.loads(dj_elastic("status", "--job-dir", str(job.root), "--json", "--shards").stdout)
    assert [s["id"] for s in detail["shards"]] == [s.id for s in job.manifest().shards]
    assert {s["state"] for s in detail["shards"]} == {"done"}
    assert sum(s["input_rows"] for s in detail["shards"]) == sum(s["rows"] for s in detail["shards"]) == ROWS
    text = dj_elastic("status", "--job-dir", str(job.root), "--shards").stdout.decode()
    assert all(s.id in text for s in job.manifest().shards), text

    facts = collect(job.gen_dir)
    assert facts.state == "finished" and [s["id"] for s in facts.shards] == [s.id for s in job.manifest().shards]
    assert sum(s["rows"] for s in facts.shards) == ROWS and len(facts.winners()) == SHARDS
    page = write_report(job.gen_dir).read_text()
    assert all(s.id in page for s in job.manifest().shards)
    out = dj_elastic("report", "--job-dir", str(job.root), "--output", str(tmp_path / "r.html")).stdout.decode()
    assert "report written to" in out
    assert all(s.id in (tmp_path / "r.html").read_text() for s in job.manifest().shards)


def test_a_second_generation_runs_over_the_same_shards_and_merges(tmp_path):
    job, expected = make_parquet_job(tmp_path)
    run_to_end(job, "n1", tmp_path / "n1.log")
    first = JobDir(job.root)
    assert merged_rows(first, tmp_path / "a.jsonl") == expected
    shards = sorted(p.read_bytes() for p in job.shards_dir.iterdir())

    changed = RECIPE.replace(b"protocol-test", b"protocol-test-b")
    assert not prepare(_request(tmp_path, changed), log=lambda *_: None).created
    second = JobDir(job.root)
    assert second.generation != first.generation and first.generation in second.generation_ids()
    assert second.recipe_path.read_bytes() == changed
    assert sorted(p.read_bytes() for p in job.shards_dir.iterdir()) == shards  # not prepared again
    assert not second.done_ids()

    run_to_end(second, "n2", tmp_path / "n2.log")
    check_done_exactly_once(second)
    for sid in second.done_ids():
        output = orjson.loads(second.done_path(sid).read_bytes())["output"]
        assert output.startswith(f"generations/{second.generation}/attempts/"), output
    assert merged_rows(second, tmp_path / "b.jsonl") == expected
    assert job_status(JobDir(job.root, first.generation)).complete


def test_a_backup_on_a_fast_host_wins_over_a_straggler(tmp_path):
    job, expected = make_parquet_job(tmp_path)
    eager = ("--speculation-min-secs", "0.5", "--speculation-quantile", "0.5", "--speculation-multiplier", "3")
    common = {"DJE_TEST_SLOW_HOSTS": "slow", "DJE_TEST_UNTIL_DONE": "1"}
    slow = spawn_worker(
        job,
        "parquet_rows",
        *eager,
        "--prefetch-shards",
        "0",
        log=tmp_path / "slow.log",
        DJ_ELASTIC_HOSTNAME="slow",
        **common,
    )
    fast = None
    try:
        sid = started_shard(job)  # the slow host holds this shard until someone else finishes it
        fast = spawn_worker(
            job,
            "parquet_rows",
            *eager,
            "--prefetch-shards",
            "0",
            log=tmp_path / "fast.log",
            DJ_ELASTIC_HOSTNAME="fast",
            **common,
        )
        assert fast.wait(timeout=120) == 0, (tmp_path / "fast.log").read_text()[-4000:]
        assert slow.wait(timeout=60) == 0, (tmp_path / "slow.log").read_text()[-4000:]
    finally:
        for p in (slow, fast):
            if p is not None:
                kill_group(p)
    outcomes = attempt_outcomes(job)
    assert outcomes[sid] == ["lost-race", "done"]
    assert all(o == ["done"] for s, o in outcomes.items() if s != sid), outcomes
    record = orjson.loads(job.done_path(sid).read_bytes())
    assert (record["attempt"], record["host"], record["backup"]) == (2, "fast", True)
    assert check_done_exactly_once(job)[sid] == 2
    assert merged_rows(job, tmp_path / "out.jsonl") == expected  # the loser's output is not merged
    assert {s.id: s for s in job_status(job).shards}[sid].backup == {"won": 2}
