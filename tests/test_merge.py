"""verify and merge: the ordered, verified, atomic merge and every refusal."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.merge import merge, verify
from data_juicer_elastic.storage.files import dumps_json, read_json

from .prep_helpers import fake_done, finish_all, request, run, shard_bytes, text_rows, write_rows


@pytest.fixture
def job(tmp_path: Path) -> JobDir:
    root = tmp_path / "ds"
    rows = text_rows(120)
    rows[5]["images"] = ["pics/5.png"]
    write_rows(root / "a.jsonl", rows)
    write_rows(root / "sub" / "b.jsonl", text_rows(80, 500), newline_at_end=False)
    run(request(root, tmp_path / "job", 5))
    return JobDir(tmp_path / "job")


def _no_temp_files(folder: Path) -> bool:
    return not [n for n in os.listdir(folder) if ".tmp-" in n]


def _logs() -> tuple[list[str], object]:
    logs: list[str] = []
    return logs, logs.append


# merge -------------------------------------------------------------------------
def test_merge_of_identity_outputs_is_the_normalised_input(tmp_path: Path, job: JobDir) -> None:
    finish_all(job, hosts=("node-a", "node-b"))
    out = tmp_path / "out" / "merged.jsonl"
    logs, log = _logs()
    result = merge(job, str(out), log=log)
    root = tmp_path / "ds"
    expected = (root / "a.jsonl").read_bytes() + (root / "sub" / "b.jsonl").read_bytes() + b"\n"
    expected = expected.replace(b'"pics/5.png"', f'"{root}/pics/5.png"'.encode())
    merged = out.read_bytes()
    assert merged == expected == b"".join(shard_bytes(job.root))
    assert orjson.loads(merged.splitlines()[5])["images"] == [f"{root}/pics/5.png"]
    assert (result.rows, result.bytes, result.shards, result.output) == (200, len(merged), 5, str(out))
    record = read_json(job.merge_record_path)
    assert record["output"] == str(out) and record["rows"] == 200 and record["bytes"] == len(merged)
    assert record["sha256"] == hashlib.sha256(merged).hexdigest()
    assert [s["shard"] for s in record["shards"]] == [s.id for s in job.manifest().shards]
    done = {sid: read_json(job.done_path(sid)) for sid in job.done_ids()}
    assert [s["host"] for s in record["shards"]] == [done[s["shard"]]["host"] for s in record["shards"]]
    assert sorted(s["host"] for s in record["shards"]) == ["node-a"] * 3 + ["node-b"] * 2
    assert all(s["attempt"] == 1 for s in record["shards"])
    assert record["started_at"] <= record["finished_at"]
    assert "200 rows" in logs[0] and "MB/s" in logs[0]
    assert _no_temp_files(out.parent)


def test_fake_done_records_are_what_the_real_worker_writes(tmp_path: Path, job: JobDir) -> None:
    finish_all(job)
    sid = job.manifest().shards[0].id
    real = read_json(job.done_path(sid))
    os.unlink(job.done_path(sid))
    fake_done(job, sid, host=real["host"])
    fake = read_json(job.done_path(sid))
    assert sorted(fake) == sorted(real)
    volatile = ("pid", "started_at", "finished_at", "worker")  # worker: the process record's random id
    assert {k: v for k, v in fake.items() if k not in volatile} == {k: v for k, v in real.items() if k not in volatile}


def test_merge_uses_the_recorded_attempt(tmp_path: Path, job: JobDir) -> None:
    finish_all(job)
    sid = job.manifest().shards[2].id
    os.unlink(job.done_path(sid))
    filtered = b'{"text": "only row"}\n'
    fake_done(job, sid, attempt=3, host="node-c", content=filtered)
    out = tmp_path / "merged.jsonl"
    result = merge(job, str(out), log=lambda m: None)
    parts = shard_bytes(job.root)
    assert out.read_bytes() == parts[0] + parts[1] + filtered + parts[3] + parts[4]
    assert result.rows == sum(p.count(b"\n") for p in parts) - parts[2].count(b"\n") + 1
    assert read_json(job.merge_record_path)["shards"][2] == {
        "shard": sid,
        "attempt": 3,
        "host": "node-c",
        "rows": 1,
        "bytes": len(filtered),
        "sha256": hashlib.sha256(filtered).hexdigest(),
    }


def test_empty_output_shard_is_fine(tmp_path: Path, job: JobDir) -> None:
    for i, spec in enumerate(job.manifest().shards):
        fake_done(job, spec.id, content=b"" if i == 1 else None)
    result = merge(job, str(tmp_path / "m.jsonl"), log=lambda m: None)
    assert result.rows == 200 - job.manifest().shards[1].rows


def test_existing_output_needs_overwrite(tmp_path: Path, job: JobDir) -> None:
    finish_all(job)
    out = tmp_path / "merged.jsonl"
    out.write_bytes(b"old\n")
    with pytest.raises(
        UserError, match=rf"{out}: already exists and no merge of this job dir wrote it; set elastic_shard"
    ):
        merge(job, str(out), log=lambda m: None)
    assert out.read_bytes() == b"old\n" and _no_temp_files(tmp_path)
    merge(job, str(out), overwrite=True, log=lambda m: None)
    assert out.read_bytes() == b"".join(shard_bytes(job.root))
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(UserError, match="is a directory"):  # a .jsonl path names one file
        merge(job, str(tmp_path / "dir.jsonl"), overwrite=True, log=lambda m: None)
    with pytest.raises(UserError, match=r"not part files of an export \(dir.jsonl, ds, job\)"):
        merge(job, str(tmp_path), overwrite=True, log=lambda m: None)  # no suffix: a folder, never over others' files


def test_incomplete_job_is_refused(tmp_path: Path, job: JobDir) -> None:
    for spec in job.manifest().shards[:3]:
        fake_done(job, spec.id)
    out = tmp_path / "merged.jsonl"
    with pytest.raises(IntegrityError, match="2 of 5 shards are not done") as err:
        merge(job, str(out), log=lambda m: None)
    assert "part-00003-of-00005" in str(err.value) and "dj-elastic status" in str(err.value)
    assert not out.exists() and _no_temp_files(tmp_path)
    assert not job.merge_record_path.exists()


def _tamper(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[10] ^= 1  # same size, same rows, different bytes
    path.write_bytes(bytes(data))


def test_tampered_output_is_refused_and_no_temp_is_left(tmp_path: Path, job: JobDir) -> None:
    finish_all(job)
    sid = job.manifest().shards[3].id
    _tamper(job.attempt_output(sid, 1))
    out = tmp_path / "out" / "merged.jsonl"
    with pytest.raises(IntegrityError) as err:
        merge(job, str(out), log=lambda m: None)
    msg = str(err.value)
    assert f"shard {sid}" in msg and str(job.attempt_output(sid, 1)) in msg and "sha256" in msg
    assert not out.exists() and _no_temp_files(out.parent) and not job.merge_record_path.exists()


def test_truncated_output_is_refused(tmp_path: Path, job: JobDir) -> None:
    finish_all(job)
    sid = job.manifest().shards[0].id
    path = job.attempt_output(sid, 1)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(IntegrityError, match="does not end with a newline") as err:
        merge(job, str(tmp_path / "m.jsonl"), log=lambda m: None)
    assert "bytes" in str(err.value)
    assert not (tmp_path / "m.jsonl").exists() and _no_temp_files(tmp_path)


def _edit_record(job: JobDir, sid: str, **changes: object) -> None:
    path = job.done_path(sid)
    record = read_json(path)
    record.update(changes)
    path.write_bytes(dumps_json(record))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"rows": 999}, "999"),
        ({"bytes": 1}, "record says 1"),
        ({"sha256": "0" * 64}, "sha256"),
        ({"sha256": "nothex"}, "64 hex digits"),
        ({"attempt": 2}, "/attempts/part-00001-of-00005/0002/processed.jsonl'"),
        ({"attempt": "1"}, "attempt is '1'"),
        ({"shard": "part-00000-of-00005"}, "expected 'part-00001-of-00005'"),
        ({"output": "../../../etc/passwd"}, "outside the job directory"),
        ({"output": "/etc/passwd"}, "outside the job directory"),
        ({"output": "shards/part-00001-of-00005.jsonl"}, "expected 'generations/"),
    ],
)
def test_edited_done_record_is_refused(tmp_path: Path, job: JobDir, changes: dict, message: str) -> None:
    finish_all(job)
    sid = job.manifest().shards[1].id
    _edit_record(job, sid, **changes)
    with pytest.raises(IntegrityError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        merge(job, str(tmp_path / "m.jsonl"), log=lambda m: None)
    assert sid in str(err.value)
    assert not (tmp_path / "m.jsonl").exists() and _no_temp_files(tmp_path)
    report = verify(job)
    assert not report.ok and report.complete and any(sid in p for p in report.problems)


def test_output_symlinked_outside_the_job_dir_is_refused(tmp_path: Path, job: JobDir) -> None:
    finish_all(job)
    sid = job.manifest().shards[0].id
    adir = job.attempt_dir(sid, 1)
    outside = tmp_path / "elsewhere"
    os.rename(adir, outside)
    os.symlink(outside, adir)
    with pytest.raises(IntegrityError, match="resolves outside the job directory"):
        merge(job, str(tmp_path / "m.jsonl"), log=lambda m: None)
    assert not (tmp_path / "m.jsonl").exists()


def test_missing_output_file_is_refused(tmp_path: Path, job: JobDir) -> None:
    finish_all(job)
    sid = job.manifest().shards[4].id
    os.unlink(job.attempt_output(sid, 1))
    with pytest.raises(IntegrityError, match=f"shard {sid}: .* cannot be read"):
        merge(job, str(tmp_path / "m.jsonl"), log=lambda m: None)
    assert _no_temp_files(tmp_path)
    assert any("cannot be read" in p for p in verify(job).problems)


# verify -------------------------------------------------------------------------
def test_verify_complete_and_hosts(job: JobDir) -> None:
    finish_all(job, hosts=("n1", "n2", "n3"))
    report = verify(job)
    assert report.complete and report.ok and not report.problems
    assert report.hosts == {"n1": 2, "n2": 2, "n3": 1}
    assert all(c.ok and c.rows == s.rows for c, s in zip(report.shards, job.manifest().shards, strict=True))
    assert verify(job, expect_nodes=3).ok
    short = verify(job, expect_nodes=4)
    assert not short.ok and "only 3 host(s)" in short.problems[0]


def test_verify_incomplete_is_not_a_problem(job: JobDir) -> None:
    for spec in job.manifest().shards[:2]:
        fake_done(job, spec.id)
    report = verify(job, expect_nodes=5)
    assert not report.complete and report.ok and report.problems == []
    assert [c.ok for c in report.shards] == [True, True, False, False, False]
    assert report.shards[2].problem == "not done yet"


def test_verify_reports_failed_and_tampered_shards(job: JobDir) -> None:
    finish_all(job)
    specs = job.manifest().shards
    os.unlink(job.done_path(specs[0].id))
    job.failed_path(specs[0].id).write_bytes(dumps_json({"shard": specs[0].id, "error": "boom"}))
    _tamper(job.attempt_output(specs[2].id, 1))
    report = verify(job)
    assert not report.complete and not report.ok and len(report.problems) == 2
    assert "failed terminally" in report.problems[0] and "dj-elastic retry" in report.problems[0]
    assert specs[2].id in report.problems[1]
    assert verify(job, check_content=False).problems == [report.problems[0]]
