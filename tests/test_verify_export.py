"""``dj-elastic verify`` on a local export: the one file and the folder, each checked against what merge.json
recorded of it, through the code the S3 forms use (those: test_s3_export.py; a Parquet file: test_parquet_export.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from data_juicer_elastic.folder_export import SUCCESS
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.merge import merge, merged_already, verify

from .jobs import REPO
from .prep_helpers import finish_all, request, run, text_rows, write_rows


def _quiet(*_: object) -> None:
    pass


def _job(root: Path, rows: int = 90, width: int = 40) -> JobDir:
    write_rows(root / "ds" / "a.jsonl", text_rows(rows, width=width))
    run(request(root / "ds", root / "job", 6))
    job = JobDir(root / "job")
    finish_all(job, hosts=("node-a", "node-b"))
    return job


def _problems(job: JobDir, *says: str) -> list[str]:
    """verify's problems, checked to be there, each naming every one of ``says``."""
    report = verify(job)
    assert not report.ok and report.complete and report.problems, report.problems
    for problem in report.problems:
        assert all(s in problem for s in says), (says, problem)
    return report.problems


def _verify_cli(job: JobDir) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", "verify", "--job-dir", str(job.root)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )


def test_verify_checks_a_local_file_against_merge_json(tmp_path: Path) -> None:
    job = _job(tmp_path)
    out = tmp_path / "x" / "out.jsonl"
    merge(job, str(out), log=_quiet)
    assert verify(job).problems == []
    data = out.read_bytes()
    out.write_bytes(data.replace(b"row", b"ROW", 1))  # in place: same size and inode, other bytes
    (problem,) = _problems(job, str(out), "merge.json", "sha256", f"dj-elastic merge --output {out} --overwrite")
    assert "bytes" not in problem and "rows" not in problem, problem
    cli = _verify_cli(job)
    assert cli.returncode == 2 and str(out) in cli.stderr, cli.stdout + cli.stderr
    out.write_bytes(data + b'{"text": "one more"}\n')
    _problems(job, str(out), f"bytes {len(data) + 21}", "rows 91", "sha256")
    out.unlink()
    assert _problems(job, str(out), "is gone")
    assert _verify_cli(job).returncode == 2
    merge(job, str(out), overwrite=True, log=_quiet)  # what the line says to do
    assert verify(job).ok and _verify_cli(job).returncode == 0


def test_verify_refuses_a_folder_that_holds_another_jobs_export(tmp_path: Path) -> None:
    job = _job(tmp_path / "a")
    other = _job(tmp_path / "b", rows=60, width=10)
    folder = tmp_path / "out" / "parts"
    merge(job, f"{folder}/", log=_quiet)
    assert verify(job).problems == []
    merge(other, f"{folder}/", overwrite=True, log=_quiet)  # another job's export, complete and self-consistent
    assert verify(other).ok and merged_already(job, str(folder)) is None
    (problem,) = _problems(job, f"{folder}/{SUCCESS}", "merge.json", f"dj-elastic merge --output {folder}/ --overwrite")
    assert "is not the one merge.json recorded" in problem and "part-" not in problem  # one line, no part noise
    cli = _verify_cli(job)
    assert cli.returncode == 2 and f"{folder}/{SUCCESS}" in cli.stderr, cli.stdout + cli.stderr
    merge(job, f"{folder}/", overwrite=True, log=_quiet)  # what the line says to do
    assert verify(job).ok
    (folder / SUCCESS).unlink()
    _problems(job, str(folder), f"no {SUCCESS}: the export is not complete")
