"""Tampered and hostile job directories: every edit is detected and refused, no path is followed out.

Edited done records and outputs at merge time are covered one by one in
tests/test_merge.py; here the same and more are driven through real worker,
verify and merge processes.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.cli import main as cli_main
from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.job.records.failed import failure_message
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare
from data_juicer_elastic.storage.files import dumps_json
from data_juicer_elastic.worker.loop import run_worker

from ..jobs import REPO, attempt_outcomes, env_with, make_job, worker_cmd, write_corpus
from ..runners import copy

PACKAGE = REPO / "data_juicer_elastic"


def _worker(job: JobDir) -> subprocess.CompletedProcess:
    return subprocess.run(
        worker_cmd(job, "copy"), cwd=REPO, env=env_with(), capture_output=True, text=True, timeout=120
    )


def _flip(path: Path, offset: int = 5) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


# shards --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("edit", ["flip-a-byte", "truncate", "append-a-row", "replace-with-symlink"])
def test_edited_shard_is_refused_not_run(tmp_path, edit):
    job = make_job(tmp_path, rows=40, shards=4)
    sid = "part-00001-of-00004"
    shard = job.shard_file(sid)
    if edit == "flip-a-byte":
        _flip(shard)
    elif edit == "truncate":
        shard.write_bytes(shard.read_bytes()[:-10])
    elif edit == "append-a-row":
        with open(shard, "ab") as f:
            f.write(b'{"id": -1, "text": "smuggled"}\n')
    else:
        outside = write_corpus(tmp_path / "outside.jsonl", 10)
        shard.unlink()
        shard.symlink_to(outside)
    p = _worker(job)
    assert p.returncode == 2, p.stdout + p.stderr
    assert not job.done_path(sid).exists()
    assert not job.attempt_output(sid, 1).exists(), "the runner ran on the edited shard"
    if edit == "replace-with-symlink":  # refused when the manifest is loaded: no worker starts at all
        assert f"shard path 'shards/{sid}.jsonl'" in p.stderr and "resolves outside the job directory" in p.stderr
        assert not os.listdir(job.attempts_dir)
        return
    assert f"shard {sid} failed terminally" in p.stderr and "does not match the manifest" in p.stderr, p.stderr
    assert str(shard) in p.stderr and "dj-elastic retry" in p.stderr
    assert job.failed_path(sid).exists()
    assert attempt_outcomes(job)[sid] == ["failed"]  # refused at once: a retry cannot heal it


# outputs and done records, end to end -------------------------------------------------------------------
def test_edited_output_and_done_record_after_the_worker_are_refused_by_verify_and_merge(tmp_path, capsys):
    job = make_job(tmp_path, rows=40, shards=4)
    assert run_worker(job.root, copy, log=lambda *_: None).exit_code == 0
    out = tmp_path / "merged.jsonl"
    sid = "part-00002-of-00004"
    _flip(job.attempt_output(sid, 1))
    assert cli_main(["verify", "--job-dir", str(job.root)]) == 2
    assert cli_main(["merge", "--job-dir", str(job.root), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"shard {sid}" in err and "sha256" in err and not out.exists()
    _flip(job.attempt_output(sid, 1))  # restored
    record = orjson.loads(job.done_path(sid).read_bytes())
    for field, value in [
        ("rows", 1),
        ("output", "../../../../etc/passwd"),
        ("output", "/etc/passwd"),
        ("attempt", 7),
        ("sha256", "0" * 64),
    ]:
        job.done_path(sid).write_bytes(dumps_json({**record, field: value}))
        assert cli_main(["merge", "--job-dir", str(job.root), "--output", str(out)]) == 2
        err = capsys.readouterr().err
        assert sid in err and not out.exists(), (field, err)
        if field == "output":
            assert "outside the job directory" in err
    job.done_path(sid).write_bytes(dumps_json(record))
    assert cli_main(["merge", "--job-dir", str(job.root), "--output", str(out)]) == 0


def test_failed_record_naming_a_log_outside_is_not_followed(tmp_path):
    job = make_job(tmp_path, rows=20, shards=2)
    sid = "part-00000-of-00002"
    job.failed_path(sid).write_bytes(
        dumps_json(
            {
                "shard": sid,
                "attempt": 1,
                "host": "h",
                "pid": 1,
                "error": "boom",
                "log": "../../../etc/passwd",
                "failures": 3,
            }
        )
    )
    result = run_worker(job.root, copy, log=lambda *_: None)
    assert result.exit_code == 2 and "/etc/passwd" not in result.message and str(job.failed_path(sid)) in result.message
    assert "etc/passwd" not in failure_message(job, sid).replace("../../../etc/passwd", "")


def test_attempt_folder_planted_by_someone_else_is_refused(tmp_path):
    """A symlink planted where the next attempt's folder goes would make the worker write outside."""
    job = make_job(tmp_path, rows=10, shards=1)
    sid = "part-00000-of-00001"
    outside = tmp_path / "outside"
    outside.mkdir()
    job.attempt_dir(sid, 1).parent.mkdir(parents=True)
    job.attempt_dir(sid, 1).symlink_to(outside)
    result = run_worker(job.root, copy, log=lambda *_: None)
    assert result.exit_code == 2 and "already exists" in result.message
    assert os.listdir(outside) == [], "the worker wrote through a planted symlink"
    # the whole attempts/<shard> folder swapped for a link out of the job dir
    job.attempt_dir(sid, 1).unlink()
    os.rmdir(job.attempt_dir(sid, 1).parent)
    job.attempt_dir(sid, 1).parent.symlink_to(outside)
    result = run_worker(job.root, copy, log=lambda *_: None)
    assert result.exit_code == 2 and "outside the job directory" in result.message
    assert os.listdir(outside) == []


# the manifest ------------------------------------------------------------------------------------------
def _edit_manifest(job: JobDir, change, *, reseal: bool = False) -> None:
    raw = orjson.loads(job.manifest_path.read_bytes())
    change(raw)
    if reseal:  # a forger who recomputes the digest: the structural checks must still hold
        from data_juicer_elastic.job.manifest import manifest_digest

        raw["digest"] = manifest_digest(raw)
    job.manifest_path.write_bytes(dumps_json(raw))


MANIFEST_EDITS = {
    "max_retries": lambda m: m["policy"].update(max_retries=99),
    "lock_timeout": lambda m: m["policy"].update(lock_timeout_secs=1e9),
    "shard_rows": lambda m: m["shard_table"]["rows"].__setitem__(1, 1),
    "shard_block_digest": lambda m: m["shard_table"]["block_sha256"].__setitem__(0, "0" * 64),
    "total_rows": lambda m: m.update(total_rows=1),
    "dataset_path": lambda m: m.update(dataset_path="/elsewhere"),
    "digest_removed": lambda m: m.pop("digest"),
}


def _refused_everywhere(job: JobDir, path: Path, capsys) -> None:
    for argv in (["status"], ["verify"], ["merge", "--output", str(job.root.parent / "m.jsonl")]):
        assert cli_main([argv[0], "--job-dir", str(job.root), *argv[1:]]) == 2
        err = capsys.readouterr().err
        assert str(path) in err and "edited" in err, err
    with pytest.raises(IntegrityError, match="edited"):
        run_worker(job.root, copy, log=lambda *_: None)
    assert not os.listdir(job.attempts_dir)


@pytest.mark.parametrize("edit", sorted(MANIFEST_EDITS))
def test_edited_manifest_is_refused_everywhere(tmp_path, edit, capsys):
    job = make_job(tmp_path, rows=20, shards=2)
    _edit_manifest(job, MANIFEST_EDITS[edit])
    _refused_everywhere(job, job.manifest_path, capsys)


def _table(job: JobDir) -> Path:
    return job.root / "shards" / "_table.jsonl"


def _edit_line(job: JobDir, i: int, change) -> None:
    lines = _table(job).read_bytes().splitlines(keepends=True)
    line = orjson.loads(lines[i])
    change(line)
    lines[i] = orjson.dumps(line, option=orjson.OPT_SORT_KEYS) + b"\n"
    _table(job).write_bytes(b"".join(lines))


TABLE_EDITS = {
    "shard_sha256": lambda job: _edit_line(job, 1, lambda s: s.update(sha256="0" * 64)),
    "source_file": lambda job: _edit_line(job, 0, lambda s: s["sources"][0].update(file="../../etc/passwd")),
    "lines_swapped": lambda job: _table(job).write_bytes(b"".join(_table(job).read_bytes().splitlines(True)[::-1])),
    "line_appended": lambda job: _table(job).write_bytes(_table(job).read_bytes() + b"{}\n"),
    "truncated": lambda job: _table(job).write_bytes(_table(job).read_bytes()[:-2]),
}


@pytest.mark.parametrize("edit", sorted(TABLE_EDITS))
def test_edited_shard_table_is_refused_everywhere(tmp_path, edit, capsys):
    job = make_job(tmp_path, rows=20, shards=2)
    TABLE_EDITS[edit](job)
    _refused_everywhere(job, _table(job), capsys)


def _reseal_table(job: JobDir) -> None:
    """A forger who recomputes the block digest and the manifest's: the table must still agree with itself."""
    import hashlib

    raw = orjson.loads(job.manifest_path.read_bytes())
    data = _table(job).read_bytes()
    raw["shard_table"]["block_sha256"] = [hashlib.sha256(data).hexdigest()]
    raw["shard_table"]["block_ends"] = [len(data)]
    _edit_manifest(job, lambda m: m.update(shard_table=raw["shard_table"]), reseal=True)


@pytest.mark.parametrize(
    "forge",
    [
        lambda job: _edit_line(job, 0, lambda s: s.update(path="../../outside.jsonl")),  # ids and paths are not stored
        lambda job: _edit_line(job, 0, lambda s: s.update(rows=s["rows"] + 1)),  # the column says otherwise
        lambda job: _table(job).write_bytes(b"".join(_table(job).read_bytes().splitlines(True)[::-1])),
    ],
    ids=["path", "rows", "swapped"],
)
def test_a_resealed_shard_table_that_disagrees_with_itself_is_refused(tmp_path, forge):
    job = make_job(tmp_path, rows=20, shards=2)
    forge(job)
    _reseal_table(job)
    with pytest.raises(IntegrityError, match=r"_table\.jsonl"):
        list(JobDir(job.root).manifest().shards)


def test_identical_prepare_of_an_edited_manifest_is_refused_not_repaired(tmp_path):
    job = make_job(tmp_path, rows=20, shards=2)
    _edit_manifest(job, MANIFEST_EDITS["max_retries"])
    m = orjson.loads(job.manifest_path.read_bytes())
    req = PrepareRequest(
        dataset_path=m["dataset_path"],
        job_dir=str(job.root),
        recipe_text=job.recipe_path.read_bytes(),
        policy=Policy(**{**m["policy"], "max_retries": 2}),
    )
    with pytest.raises(IntegrityError, match="edited"):
        prepare(req, log=lambda *_: None)


# nothing in a job dir is executed -------------------------------------------------------------------------
def test_recipe_with_python_tags_is_refused_and_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    recipe = f"process: []\nx: !!python/object/apply:os.system ['touch {marker}']\n".encode()
    corpus = write_corpus(tmp_path / "in.jsonl", 10)
    with pytest.raises(UserError, match="recipe is not valid YAML"):
        prepare(PrepareRequest(str(corpus), str(tmp_path / "job"), recipe, Policy(num_shards=1)), log=lambda *_: None)
    assert not marker.exists() and not (tmp_path / "job").exists()


UNSAFE = re.compile(
    r"\byaml\.(load|unsafe_load|full_load|load_all)\(|\b(pickle|marshal|dill)\.loads?\(|"
    r"\beval\(|\bexec\(|\bruntime_load\b|shell=True"
)


# prepare's worker pool pickles tasks and results over pipes to the child processes it started itself
ALLOWED = {("prepare/pool.py", "pickle.loads")}


def test_no_module_loads_job_dir_content_unsafely():
    """Job dir files are JSON (orjson) or YAML read with yaml.safe_load; nothing is unpickled or evaluated."""
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            found = UNSAFE.search(code)
            if found and (path.relative_to(PACKAGE).as_posix(), found.group(0).rstrip("(")) not in ALLOWED:
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_lease_planted_as_a_symlink_is_not_followed(tmp_path):
    """A symlink named like the next lease, pointing at a file outside that stays fresh: not a live lease."""
    import threading
    import time

    from data_juicer_elastic.job.claims import ClaimStore
    from data_juicer_elastic.status import job_status

    job = make_job(tmp_path, rows=10, shards=1, lock_timeout_secs=1.5)
    sid = "part-00000-of-00001"
    outside = tmp_path / "outside.json"
    outside.write_bytes(b'{"host": "intruder"}\n')
    ClaimStore(job, lock_timeout=1.5, host="dead").try_claim(sid, 0)  # attempt 1, then it dies
    (job.claims_dir / f"{sid}@0002").symlink_to(outside)
    stop = threading.Event()

    def keep_fresh():
        while not stop.wait(0.2):
            os.utime(outside, None)

    toucher = threading.Thread(target=keep_fresh)
    toucher.start()
    try:
        time.sleep(2.0)  # the planted link's own mtime and attempt 1 are now both past the timeout
        assert job_status(job).shards[0].host is None  # the planted target is not read as a lease
        result = run_worker(job.root, copy, log=lambda *_: None)
    finally:
        stop.set()
        toucher.join()
    assert result.exit_code == 0
    assert orjson.loads(job.done_path(sid).read_bytes())["attempt"] == 3
    assert outside.read_bytes() == b'{"host": "intruder"}\n'


@pytest.mark.parametrize("record", [b'{"after_attempt": "3"}\n', b"[1]\n", b"{not json\n"])
def test_edited_retry_record_is_refused(tmp_path, record):
    job = make_job(tmp_path, rows=10, shards=1)
    job.retry_path("part-00000-of-00001").write_bytes(record)
    result = run_worker(job.root, copy, log=lambda *_: None)
    assert result.exit_code == 2 and str(job.retry_path("part-00000-of-00001")) in result.message
    assert not os.listdir(job.done_dir)


def test_an_attempt_record_rewritten_by_another_writer_is_refused_not_overwritten(tmp_path):
    """attempt.json is created once, then replaced only in the version its worker's last write left."""
    from data_juicer_elastic.job.records.attempt import AttemptRecord, write_attempt

    job = make_job(tmp_path, rows=10, shards=1)
    sid = job.manifest().shards[0].id
    record = AttemptRecord(sid, 1, "node-a", 11, "t", 1.0, 1.0, None, False)
    ver = write_attempt(job, record)
    ver = write_attempt(job, record, ver)  # the worker's own version: replaced
    path = job.attempt_dir(sid, 1) / "attempt.json"
    foreign = b'{"outcome": "done", "host": "intruder"}\n'
    path.write_bytes(foreign)
    with pytest.raises(IntegrityError, match="written by something other than the worker"):
        write_attempt(job, record.finish("failed", "boom"), ver)
    with pytest.raises(IntegrityError, match="written by something other than the worker"):
        write_attempt(job, record)  # a second first write (a create): the name is taken
    assert path.read_bytes() == foreign


def test_retry_refuses_a_link_planted_as_the_done_record(tmp_path):
    """A link at the done record's name holds the name (workers skip the shard) but is no record: retry
    neither follows nor moves it, and says so."""
    from data_juicer_elastic.job.records.retry import requeue

    job = make_job(tmp_path, rows=10, shards=1)
    sid = job.manifest().shards[0].id
    assert run_worker(job.root, copy, log=lambda *_: None).exit_code == 0
    outside = tmp_path / "outside.json"
    outside.write_bytes(job.done_path(sid).read_bytes())
    job.done_path(sid).unlink()
    job.done_path(sid).symlink_to(outside)
    with pytest.raises(IntegrityError, match="not a record"):
        requeue(job, [sid])
    assert job.done_path(sid).is_symlink() and outside.exists()
    assert not [n for n in os.listdir(job.history_dir) if n.endswith(".done.json")]
