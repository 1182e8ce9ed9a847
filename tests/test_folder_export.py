"""Folder export: part files linked from the verified outputs, ``_SUCCESS`` last; killed at every step; verify."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.folder_export import SUCCESS, is_folder_export, verify_folder
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.merge import merge, merged_already, verify
from data_juicer_elastic.storage.files import read_json, remove_dead_temps, temp_name
from data_juicer_elastic.storage.host import hostname

from .jobs import REPO, env_with, make_job, write_corpus
from .prep_helpers import fake_done, finish_all, request, run, shard_bytes, text_rows, write_rows

SHARDS = 6


@pytest.fixture
def job(tmp_path: Path) -> JobDir:
    write_rows(tmp_path / "ds" / "a.jsonl", text_rows(90))
    run(request(tmp_path / "ds", tmp_path / "job", SHARDS))
    job = JobDir(tmp_path / "job")
    finish_all(job, hosts=("node-a", "node-b"))
    return job


def _quiet(*_: object) -> None:
    pass


def _outputs(job: JobDir) -> dict[str, Path]:
    return {sid: job.attempt_output(sid, read_json(job.done_path(sid))["attempt"]) for sid in sorted(job.done_ids())}


def _attempt_dirs(job: JobDir) -> list[str]:
    return sorted(str(p.relative_to(job.attempts_dir)) for p in job.attempts_dir.glob("*/*"))


def test_which_paths_name_a_folder() -> None:
    assert is_folder_export("out/result") and is_folder_export("out/result/") and is_folder_export("out/r.jsonl/")
    assert not is_folder_export("out/result.jsonl") and not is_folder_export("out/merged.txt")


def test_export_links_each_output_as_an_ordered_part_and_writes_success_last(tmp_path: Path, job: JobDir) -> None:
    folder = tmp_path / "out" / "parts"
    logs: list[str] = []
    result = merge(job, f"{folder}/", log=logs.append)
    outputs = _outputs(job)
    parts = sorted(n for n in os.listdir(folder) if n != SUCCESS)
    assert parts == [f"{sid}.jsonl" for sid in outputs]
    for sid, out in outputs.items():  # no byte copied: each part is the attempt output itself
        assert os.path.samefile(folder / f"{sid}.jsonl", out)
    merged = b"".join((folder / p).read_bytes() for p in parts)
    assert merged == b"".join(shard_bytes(job.root)) and (result.rows, result.bytes) == (90, len(merged))
    manifest = read_json(folder / SUCCESS)
    assert [p["file"] for p in manifest["parts"]] == parts and manifest["rows"] == 90
    for p in manifest["parts"]:
        done = read_json(job.done_path(p["shard"]))
        assert {k: p[k] for k in ("attempt", "rows", "bytes", "sha256", "host")} == {
            k: done[k] for k in ("attempt", "rows", "bytes", "sha256", "host")
        }
    record = read_json(job.merge_record_path)
    assert record["kind"] == "folder" and record["output"] == str(folder) and record["rows"] == 90
    assert f"{SHARDS} linked, 0 already there, 0 copied" in logs[0]
    assert verify(job).ok and verify_folder(folder) == []

    # a rerun finds it merged and rewrites nothing; an explicit second export keeps every part and _SUCCESS
    assert merged_already(job, str(folder)) is not None
    before = {n: os.stat(folder / n) for n in os.listdir(folder)}
    merge(job, str(folder), log=logs.append)
    after = {n: os.stat(folder / n) for n in os.listdir(folder)}
    assert {n: (s.st_ino, s.st_mtime_ns) for n, s in before.items()} == {
        n: (s.st_ino, s.st_mtime_ns) for n, s in after.items()
    }
    assert f"0 linked, {SHARDS} already there" in logs[-1]


def test_verify_refuses_a_tampered_or_missing_part(tmp_path: Path, job: JobDir) -> None:
    folder = tmp_path / "parts"
    merge(job, str(folder), log=_quiet)
    part = folder / f"{job.manifest().shards[2].id}.jsonl"
    data = part.read_bytes()
    part.unlink()  # replaced by another file of the same size: the attempt output is untouched
    part.write_bytes(data.replace(b"row", b"ROW", 1))
    report = verify(job)
    assert not report.ok and report.complete
    assert [p for p in report.problems if part.name in p and "sha256" in p and SUCCESS in p], report.problems
    cli = subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", "verify", "--job-dir", str(job.root)],
        cwd=REPO,
        env=env_with(),
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 2 and part.name in cli.stderr, cli.stderr
    part.unlink()
    assert any("cannot be read" in p for p in verify_folder(folder))
    (folder / SUCCESS).unlink()
    assert "not complete" in verify_folder(folder)[0]


def test_an_output_changed_after_its_done_record_is_refused(tmp_path: Path, job: JobDir) -> None:
    out = next(iter(_outputs(job).values()))
    with open(out, "ab") as f:
        f.write(b'{"text": "extra"}\n')
    with pytest.raises(IntegrityError, match="bytes, its done record says"):
        merge(job, str(tmp_path / "parts"), log=_quiet)
    assert not (tmp_path / "parts" / SUCCESS).exists()


def test_a_folder_of_other_files_or_another_export_is_not_overwritten_unasked(tmp_path: Path, job: JobDir) -> None:
    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not part files of an export"):
        merge(job, str(folder), overwrite=True, log=_quiet)
    assert (folder / "notes.txt").read_text() == "mine"
    os.unlink(folder / "notes.txt")
    merge(job, str(folder), log=_quiet)
    sid = job.manifest().shards[0].id
    manifest = read_json(folder / SUCCESS)
    manifest["parts"][0]["sha256"] = "0" * 64  # a complete export of other outputs
    (folder / SUCCESS).write_bytes(orjson.dumps(manifest))
    with pytest.raises(UserError, match="complete export of other outputs and no merge of this job dir wrote it"):
        merge(job, str(folder), log=_quiet)
    merge(job, str(folder), overwrite=True, log=_quiet)
    assert read_json(folder / SUCCESS)["parts"][0]["sha256"] == read_json(job.done_path(sid))["sha256"]


def test_a_folder_on_another_file_system_gets_checked_copies(tmp_path: Path, job: JobDir) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system (/dev/shm) to export to")
    folder = shm / f"dje-export-{os.getpid()}-{time.monotonic_ns()}"
    logs: list[str] = []
    try:
        merge(job, str(folder), log=logs.append)
        assert f"{SHARDS} part(s) were copied" in logs[0] and f"0 linked, 0 already there, {SHARDS} copied" in logs[1]
        assert verify_folder(folder) == []
        assert b"".join((folder / f"{s}.jsonl").read_bytes() for s in _outputs(job)) == b"".join(shard_bytes(job.root))
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)


# killed -------------------------------------------------------------------------------------------------
KILLER = """
import os, signal, sys
from data_juicer_elastic import folder_export, merge as merge_mod
from data_juicer_elastic.job.layout import JobDir

point, job_dir, output = sys.argv[1:4]
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
if point == "mid-part":  # a part linked under its temp name, not yet renamed into place
    replace = os.replace
    os.replace = lambda a, b: die() if ".tmp-" in str(a) else replace(a, b)
elif point == "half-parts":
    publish, count = folder_export._publish_part, [0]
    def half(*args):
        count[0] += 1
        if count[0] > 3:
            die()
        return publish(*args)
    folder_export._publish_part = half
elif point == "before-success":  # every part in place and fsynced, _SUCCESS not written
    folder_export.atomic_write = lambda *a: die()
elif point == "before-record":  # _SUCCESS written, merge.json not
    merge_mod._record = lambda *a, **k: die()
merge_mod.merge(JobDir(job_dir), output, log=print)
"""


@pytest.mark.parametrize("point", ["mid-part", "half-parts", "before-success", "before-record"])
def test_export_killed_at_each_step_is_incomplete_then_a_rerun_finishes_it(tmp_path, point) -> None:
    job = make_job(tmp_path, rows=60, shards=SHARDS)
    for spec in job.manifest().shards:
        fake_done(job, spec.id)
    folder = tmp_path / "parts"
    attempts = _attempt_dirs(job)
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, point, str(job.root), str(folder)], cwd=REPO, env=env_with(), timeout=120
    )
    assert killed.returncode == -signal.SIGKILL
    if point == "before-record":
        assert verify_folder(folder) == []  # complete: _SUCCESS is there, and merge.json is not
    else:
        assert not (folder / SUCCESS).exists() and "not complete" in verify_folder(folder)[0]
    assert merged_already(job, str(folder)) is None
    if point == "mid-part":
        assert [n for n in os.listdir(folder) if ".tmp-" in n], "the kill left no temp link behind"
    success = (folder / SUCCESS).stat() if point == "before-record" else None

    logs: list[str] = []
    merge(job, str(folder), log=logs.append)  # the rerun: no shard runs again, parts in place are kept
    assert _attempt_dirs(job) == attempts
    assert verify_folder(folder) == [] and verify(job).ok
    assert sorted(os.listdir(folder)) == sorted([SUCCESS, *(f"{s.id}.jsonl" for s in job.manifest().shards)])
    kept = int(logs[-1].split(" already there")[0].rsplit(", ", 1)[1])
    assert kept == {"mid-part": 0, "half-parts": 3, "before-success": SHARDS, "before-record": SHARDS}[point], logs
    if success is not None:  # nothing rewritten: the _SUCCESS the killed export wrote stays
        assert (folder / SUCCESS).stat().st_ino == success.st_ino
    assert merged_already(job, str(folder)) is not None


def test_job_run_exports_a_folder_once_and_a_rerun_rewrites_nothing(tmp_path: Path) -> None:
    """The whole job (coordination, finalize) into a folder: work.py calls merge() unchanged."""
    dataset = write_corpus(tmp_path / "input" / "data.jsonl", 80)
    folder = tmp_path / "exported"
    cmd = [sys.executable, "-m", "tests.coord_node", "--job-dir", str(tmp_path / "job"), "--export", f"{folder}/"]
    cmd += ["--dataset", str(dataset), "--shards", "4"]
    first = subprocess.run(cmd, cwd=REPO, env=env_with(), capture_output=True, text=True, timeout=240)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "exported 4 shards" in first.stdout and f"80 rows written to folder {folder}" in first.stdout
    stamp = {n: os.stat(folder / n).st_mtime_ns for n in os.listdir(folder)}
    again = subprocess.run(cmd, cwd=REPO, env=env_with(), capture_output=True, text=True, timeout=240)
    assert again.returncode == 0 and "nothing rewritten" in again.stdout, again.stdout + again.stderr
    assert {n: os.stat(folder / n).st_mtime_ns for n in os.listdir(folder)} == stamp
    assert verify_folder(folder) == []


# temp files of killed merges ------------------------------------------------------------------------------
def test_temps_of_dead_processes_go_and_live_or_recent_ones_stay(tmp_path: Path) -> None:
    out = tmp_path / "merged.jsonl"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        names = {
            "live": f".merged.jsonl.tmp-{hostname()}-{sleeper.pid}-0123abcd",
            "dead": f".merged.jsonl.tmp-{hostname()}-{dead.pid}-0123abcd",
            "other-recent": ".merged.jsonl.tmp-other-host-7-0123abcd",
            "other-old": ".merged.jsonl.tmp-other-host-8-0123abcd",
            "another-file": f".other.jsonl.tmp-{hostname()}-{dead.pid}-0123abcd",
        }
        for name in names.values():
            (tmp_path / name).write_bytes(b"x")
        old = time.time() - 2 * 3600
        os.utime(tmp_path / names["other-old"], (old, old))
        assert temp_name(out).name.startswith(f".merged.jsonl.tmp-{hostname()}-{os.getpid()}-")
        assert remove_dead_temps(out) == 2
        left = set(os.listdir(tmp_path))
        assert left == {names["live"], names["other-recent"], names["another-file"]}
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_recipe_may_name_a_folder_or_a_jsonl_or_parquet_file_and_nothing_else() -> None:
    from data_juicer_elastic.plugin.validation import _export_problems

    for ok in ("/out/result/", "/out/result", "/out/merged.jsonl", "/out/merged.parquet"):
        assert _export_problems({"export_path": ok}) == [], ok
    for bad in ("/out/result.csv", "/out/result.json/"):
        message = _export_problems({"export_path": bad})[0]
        assert "must be a file ending in .jsonl or .parquet, or a folder" in message
