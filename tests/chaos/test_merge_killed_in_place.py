"""A merge SIGKILLed after its output is in place and before merge.json (issue 44): the next merge knows the
output as this generation's own (by the intent record written before it was put in place) and replaces it
with a line, instead of refusing it as foreign; an output changed since is still refused."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.merge import merge

from ..jobs import make_job, spawn
from ..prep_helpers import fake_done


def _job(tmp_path: Path, shards: int = 3) -> tuple[JobDir, bytes]:
    job = make_job(tmp_path, rows=shards * 4, shards=shards)
    parts = []
    for i, spec in enumerate(job.manifest().shards):
        parts.append(orjson.dumps({"shard": i, "text": "y" * 100}) + b"\n")
        fake_done(job, spec.id, content=parts[-1])
    return job, b"".join(parts)


def _killed_after_placing(job: JobDir, out: Path) -> None:
    cmd = [sys.executable, "-m", "tests.chaos.killpoint", "placed", "--job-dir", str(job.root), "--output", str(out)]
    assert spawn(cmd).wait(timeout=120) == -signal.SIGKILL
    assert out.exists() and not job.merge_record_path.exists(), "the kill was not between placing and recording"


@pytest.mark.timeout(240)
def test_an_output_placed_by_a_killed_merge_is_this_jobs_own(tmp_path: Path) -> None:
    job, expected = _job(tmp_path)
    out = tmp_path / "out" / "merged.jsonl"
    _killed_after_placing(job, out)
    assert out.read_bytes() == expected
    lines: list[str] = []
    merge(job, str(out), log=lines.append)
    assert out.read_bytes() == expected and job.merge_record_path.exists()
    assert any("replacing this generation's earlier merge" in line for line in lines), lines


@pytest.mark.timeout(240)
def test_an_output_changed_after_the_killed_merge_is_still_refused(tmp_path: Path) -> None:
    job, _ = _job(tmp_path)
    out = tmp_path / "out" / "merged.jsonl"
    _killed_after_placing(job, out)
    out.write_bytes(b'{"text": "edited by hand"}\n')
    with pytest.raises(UserError, match="no merge of this job dir wrote it"):
        merge(job, str(out), log=lambda *_: None)
    assert out.read_bytes() == b'{"text": "edited by hand"}\n'
