"""Small texts a user reads (issue 44): each one says what happened, in the order it happened.

* a node restarted after the prepare coordinator (this host's dead process) died takes prepare over, or
  reads its published result, and never says it is "waiting for" a process that is gone;
* no progress line follows the job's PASS line (the runner closes after it);
* a typo in an ``elastic_shard`` key gets "did you mean ...?", as a typo in an op's argument does.

(A folder export's PASS line, "rows written to folder", is tested in tests/test_folder_export.py.)
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import yaml

from data_juicer_elastic.coordination.elect import coordinate
from data_juicer_elastic.coordination.rundir import EXIT_OK, Outcome, RunDir
from data_juicer_elastic.storage.files import dumps_json
from data_juicer_elastic.storage.host import boot_id
from data_juicer_elastic.storage.posix import PosixStore
from data_juicer_elastic.watch import ProgressTicker

from .reference import dj_process

SPEC = SimpleNamespace(poll_interval_secs=0.05, timeout=600.0)  # a wait for the dead would hang the test


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _run_with_dead_coordinator(tmp_path: Path) -> tuple[RunDir, int]:
    run = RunDir.open(PosixStore(tmp_path), "runs/r1", "r1", "n1")
    dead = {"host": "n1", "pid": _dead_pid(), "at": time.time(), "boot": boot_id()}
    assert run.store.create(run.key("prepare.coordinator.json"), dumps_json(dead))
    return run, dead["pid"]


def test_a_restarted_node_takes_prepare_over_from_its_dead_coordinator(tmp_path: Path):
    run, dead = _run_with_dead_coordinator(tmp_path)
    lines: list[str] = []
    outcome = coordinate(run, "prepare", lambda: Outcome(EXIT_OK, "prepared"), SPEC, lines.append, replace_gone=True)
    assert outcome.message == "prepared", lines
    assert not [x for x in lines if "waiting for" in x], lines
    assert f"elected as prepare coordinator, taking over from host=n1 pid={dead}, which is gone" in lines[0], lines


def test_a_node_started_after_prepare_ended_reads_its_result(tmp_path: Path):
    run, dead = _run_with_dead_coordinator(tmp_path)
    run.publish("prepare.result.json", Outcome(EXIT_OK, "prepared before", "n1", dead))
    lines: list[str] = []
    outcome = coordinate(run, "prepare", lambda: Outcome(2, "prepared again"), SPEC, lines.append, replace_gone=True)
    assert outcome.message == "prepared before"
    assert lines == [f"prepare was done by host=n1 pid={dead}"], lines


def test_no_progress_line_after_the_verdict(tmp_path: Path):
    """A tick whose read began before PASS is not logged after it (the read is held until PASS is out)."""
    reading, release = threading.Event(), threading.Event()
    logged: list[str] = []
    ticker = ProgressTicker(str(tmp_path), 0.01, logged.append)

    def slow_line() -> str:
        reading.set()
        release.wait(30)
        return "progress: 3/4 shards done"

    ticker.reader = SimpleNamespace(line=slow_line)
    with ticker:
        log = ticker.story(logged.append)
        assert reading.wait(30)
        log("PASS: 4 shards completed")
        release.set()
        ticker._thread.join(30)
        log("stopping Ray")  # what the process says after the verdict still goes out
    assert logged == ["PASS: 4 shards completed", "stopping Ray"], logged


def test_an_elastic_shard_key_typo_gets_did_you_mean(tmp_path: Path):
    recipe = {
        "dataset_path": str(tmp_path / "in.jsonl"),
        "export_path": str(tmp_path / "out.jsonl"),
        "executor_type": "elastic_shard",
        "elastic_shard": {"job_dir": str(tmp_path / "job")},
        "process": [{"text_length_filter": {"min_len": 2}}],
    }
    (tmp_path / "in.jsonl").write_text('{"text": "hello"}\n')
    for name, typo, meant in (
        ("shards", {"num_shard": 4}, "num_shards"),
        ("s3", {"storage": {"endpoint": "x"}}, "storage.endpoint_url"),
    ):
        config = tmp_path / f"{name}.yaml"
        config.write_text(yaml.safe_dump({**recipe, "elastic_shard": {**recipe["elastic_shard"], **typo}}))
        out = dj_process("--config", str(config), cwd=tmp_path, timeout=120)
        assert out.returncode != 0
        assert f"did you mean 'elastic_shard.{meant}'?" in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "job").exists()
