"""Shared helpers for protocol tests: corpora, prepared jobs, real worker processes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from data_juicer_elastic.job.claims import lease_key
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.job.records._read import load_record
from data_juicer_elastic.job.records.attempt import load_attempt
from data_juicer_elastic.job.records.done import load_done
from data_juicer_elastic.job.versions import current_versions
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare

from .reference import REPO, env_with

__all__ = ["REPO", "env_with"]  # the one environment helper lives in reference.py; many tests import it here
RECIPE = b"project_name: protocol-test\nprocess:\n  - whitespace_normalization_mapper: {}\n"

# The input kind of the jobs ``make_job``, ``write_input`` and tests.cluster make: "jsonl" (default) or
# "parquet", so the protocol suites (tests/chaos) run unchanged on both kinds of shard.
INPUT_KIND = os.environ.get("DJE_TEST_INPUT", "jsonl").strip().lower() or "jsonl"
if INPUT_KIND not in ("jsonl", "parquet"):
    raise ValueError(f"DJE_TEST_INPUT={INPUT_KIND!r}: set jsonl or parquet")
PARQUET_INPUT = INPUT_KIND == "parquet"


def jsonl_only(reason: str) -> Any:
    """Skip a test (or, as ``pytestmark``, a module) on Parquet jobs: ``reason`` says which JSONL bytes it needs.

    pytest is imported here, not at the top: node and worker processes import this module too."""
    import pytest

    return pytest.mark.skipif(PARQUET_INPUT, reason=f"JSONL input only (DJE_TEST_INPUT=parquet): {reason}")


def _corpus_rows(rows: int, width: int) -> list[dict[str, Any]]:
    return [{"id": i, "text": f"row {i} " + "x" * (i * 7 % width)} for i in range(rows)]


def write_corpus(path: Path, rows: int, width: int = 40) -> Path:
    """A JSONL corpus, whatever DJE_TEST_INPUT says (``write_input`` follows it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for row in _corpus_rows(rows, width):
            f.write(orjson.dumps(row) + b"\n")
    return path


def write_parquet_corpus(path: Path, rows: int, *, shards: int, width: int = 40) -> Path:
    """``write_corpus``'s rows as one Parquet file of small row groups (about four per shard, at least one row
    each), since prepare cuts shards at row group boundaries and ``shards`` must stay achievable."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    group = max(1, rows // (4 * max(shards, 1)))
    pq.write_table(pa.Table.from_pylist(_corpus_rows(rows, width)), path, row_group_size=group)
    assert pq.ParquetFile(path).metadata.num_row_groups >= min(shards, rows), path
    return path


def write_input(folder: Path, rows: int, *, shards: int, width: int = 40) -> Path:
    """The input of a test job in ``folder`` (``data.jsonl`` or ``data.parquet``, per DJE_TEST_INPUT)."""
    if PARQUET_INPUT:
        return write_parquet_corpus(folder / "data.parquet", rows, shards=shards, width=width)
    return write_corpus(folder / "data.jsonl", rows, width)


_jsonl_of: dict[tuple[str, int, int], bytes] = {}


def input_jsonl(path: Path) -> bytes:
    """What an identity run over the input file ``path`` merges to: a JSONL file's bytes; for a Parquet file,
    its rows read with pyarrow and written one ``orjson.dumps`` line each, as the runners write them
    (computed once per file version). ``write_corpus`` serialises its rows the same way, so both kinds of
    one corpus give the same bytes."""
    if path.suffix != ".parquet":
        return path.read_bytes()
    import pyarrow.parquet as pq

    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _jsonl_of:
        rows = pq.read_table(path).to_pylist()
        _jsonl_of[key] = b"".join(orjson.dumps(row) + b"\n" for row in rows)
    return _jsonl_of[key]


def make_job(
    tmp: Path,
    *,
    rows: int = 100,
    shards: int = 10,
    job_dir: Path | None = None,
    recipe: bytes = RECIPE,
    versions: dict[str, str] | None = None,
    **policy: Any,
) -> JobDir:
    """A prepared job over a fresh corpus (in ``tmp``; JSONL or Parquet, see ``write_input``); fast leases so
    tests finish quickly.

    The manifest records this node's versions, as every real prepare does (``versions`` overrides them).
    """
    settings = {"lock_timeout_secs": 3.0, "heartbeat_secs": 0.5, "poll_interval_secs": 0.1, "max_retries": 2}
    settings.update(policy)
    corpus = write_input(tmp / "input", rows, shards=shards)
    req = PrepareRequest(
        dataset_path=str(corpus),
        job_dir=str(job_dir or tmp / "job"),
        recipe_text=recipe,
        policy=Policy(num_shards=shards, **settings),
        versions=current_versions() if versions is None else versions,
    )
    prepare(req, log=lambda *_: None)
    job = JobDir(job_dir or tmp / "job")
    assert (job.manifest().parquet is not None) == PARQUET_INPUT, f"{job.root}: not a {INPUT_KIND} job"
    return job


def worker_cmd(job: JobDir, runner: str = "copy", *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "data_juicer_elastic.cli",
        "worker",
        "--job-dir",
        str(job.root),
        "--runner",
        f"tests.runners:{runner}",
        *extra,
    ]


def spawn_worker(
    job: JobDir, runner: str = "copy", *extra: str, log: Path | None = None, **env: str
) -> subprocess.Popen:
    out = open(log, "ab") if log else subprocess.DEVNULL
    return subprocess.Popen(
        worker_cmd(job, runner, *extra),
        cwd=REPO,
        env=env_with(**env),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_for(
    predicate,
    what: str = "",
    *,
    timeout: float = 60.0,
    interval: float = 0.05,
    proc: subprocess.Popen | None = None,
    log: Path | None = None,
):
    """Poll ``predicate`` until it returns something truthy, and return that; fail naming ``what`` was awaited.

    With ``proc``, fail as soon as that process exits first; ``log`` (its output) is quoted in the failure.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        tail = f":\n{log.read_text(errors='replace')[-4000:]}" if log is not None and log.exists() else ""
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process {proc.pid} exited {proc.returncode} before {what or predicate}{tail}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or predicate}{tail}")
        time.sleep(interval)


def attempt_outcomes(job: JobDir) -> dict[str, list[str]]:
    """shard -> outcomes of attempts 1..last, so ``outcomes[n - 1]`` is attempt n's.

    "missing" marks an attempt without a folder or attempt.json (claimed, then killed before it wrote one).
    A job dir on an object store is read through its store (``tests.cluster.outcomes``).
    """
    if job.on_object_store:
        from .cluster import outcomes  # tests.cluster imports this module

        return outcomes(job)
    result: dict[str, list[str]] = {}
    for shard_dir in sorted(job.attempts_dir.iterdir()):
        numbers = [int(adir.name) for adir in shard_dir.iterdir()]
        outcomes = []
        for n in range(1, max(numbers, default=0) + 1):
            try:
                outcomes.append(settled_record(job.attempt_dir(shard_dir.name, n) / "attempt.json")["outcome"])
            except FileNotFoundError:
                outcomes.append("missing")
        result[shard_dir.name] = outcomes
    return result


def settled_record(path: Path, settle_secs: float = 10.0) -> dict:
    """A JSON record as it settles: a record another mount replaced may read cut for a moment (sshfs keeps the
    old size in its attribute cache), so a cut read is read again, as the product's readers wait it out too."""
    deadline = time.monotonic() + settle_secs
    while True:
        try:
            return orjson.loads(path.read_bytes())
        except ValueError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def last_heartbeat(job: JobDir, sid: str, attempt: int) -> float:
    """The mtime of a lease (its last renewal, by the shared filesystem's clock; on an object store its
    ``modified``, by the store's)."""
    if job.on_object_store:
        meta = job.store.head(lease_key(job, sid, attempt))
        assert meta is not None, f"{sid}@{attempt}: no lease"
        return meta.modified
    return os.lstat(job.claims_dir / f"{sid}@{attempt:04d}").st_mtime


def takeover_delay(job: JobDir, sid: str, dead_attempt: int, last_beat: float) -> float:
    """Seconds, by the shared filesystem's clock, from a dead lease's last heartbeat to the next attempt's claim.

    DESIGN invariant 3: a lease is taken over no earlier than ``lock_timeout_secs`` after its last renewal.
    """
    if job.on_object_store:
        record = load_attempt(job, sid, dead_attempt + 1)
        assert record is not None, f"{sid}: attempt {dead_attempt + 1} has no record"
        return record.claimed_at - last_beat
    info = orjson.loads((job.attempt_dir(sid, dead_attempt + 1) / "attempt.json").read_bytes())
    return info["claimed_at"] - last_beat


def assert_taken_over_after_timeout(job: JobDir, sid: str, dead_attempt: int, last_beat: float) -> None:
    timeout = job.manifest().policy.lock_timeout_secs
    delay = takeover_delay(job, sid, dead_attempt, last_beat)
    assert delay >= timeout, (
        f"{sid}: lease {dead_attempt} taken over {delay:.3f}s after its last heartbeat < {timeout}s"
    )


def input_bytes(job: JobDir) -> bytes:
    """The original input file (``write_input``: no media keys, a final newline) as JSONL (``input_jsonl``),
    which an identity run must reproduce byte for byte: the expectation owes nothing to prepare's shards."""
    path = Path(job.manifest().dataset_path)
    assert path.is_file(), f"{path}: these helpers expect a single-file corpus"
    return input_jsonl(path)


def shard_data(job: JobDir, sid: str) -> bytes:
    """The JSONL an identity runner writes for shard ``sid`` (a JSONL shard's bytes, a descriptor's rows)."""
    from .runners import shard_lines

    return b"".join(shard_lines(str(job.shard_file(sid)), str(job.gen_dir)))


def shards_data(job: JobDir) -> list[bytes]:
    """``shard_data`` of every shard, in the manifest's order."""
    return [shard_data(job, s.id) for s in job.manifest().shards]


def spawn(cmd: list[str], *, log: Path | None = None, **env: str) -> subprocess.Popen:
    """Any command from the repo root, in its own session (so a test can signal it alone)."""
    out = open(log, "ab") if log else subprocess.DEVNULL
    return subprocess.Popen(
        cmd, cwd=REPO, env=env_with(**env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def done_attempts(job: JobDir) -> dict[str, int]:
    """shard -> the attempt its done record names (read through the store on an object store)."""
    if job.on_object_store:
        return {sid: _done_attempt(job, sid) for sid in job.done_ids()}
    return {
        name[:-5]: orjson.loads((job.done_dir / name).read_bytes())["attempt"]
        for name in os.listdir(job.done_dir)
        if name.endswith(".json") and not name.startswith(".")
    }


def _done_attempt(job: JobDir, sid: str) -> int:
    record = load_done(job, sid)
    assert record is not None, sid
    return record.attempt


def check_done_exactly_once(job: JobDir) -> dict[str, int]:
    """Every shard has one done record and no other attempt of it claims to be done; returns done_attempts."""
    shards = [s.id for s in job.manifest().shards]
    done = done_attempts(job)
    assert sorted(done) == shards, f"missing done records: {sorted(set(shards) - set(done))}"
    failed = job.failed_ids() if job.on_object_store else os.listdir(job.failed_dir)
    assert not failed, failed
    for sid, outcomes in attempt_outcomes(job).items():
        winner = done[sid]
        others = [i + 1 for i, o in enumerate(outcomes) if o == "done" and i + 1 != winner]
        assert not others, f"{sid}: attempts {others} also say done, but attempt {winner} is the done record"
    return done


def merge_and_check(job: JobDir, out: Path, expected: bytes | None = None) -> bytes:
    """Merge; the output must equal ``expected`` (default: the input, as an identity run gives it back) and
    copy exactly the done records' attempts."""
    from data_juicer_elastic.merge import merge

    merge(job, str(out), log=lambda *_: None)
    merged = out.read_bytes()
    assert merged == (input_bytes(job) if expected is None else expected)
    path = job.merge_record_path
    record = load_record(job.store, job.key(path)) if job.on_object_store else orjson.loads(path.read_bytes())
    assert {s["shard"]: s["attempt"] for s in record["shards"]} == done_attempts(job)
    return merged


def kill_group(proc: subprocess.Popen, sig: int = 9) -> None:
    """Signal a process started by ``spawn``/``spawn_worker`` (its own session) if it still runs."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass


def started_shard(job: JobDir, attempt: str = "0001", timeout: float = 60) -> str:
    """The shard whose attempt ``attempt`` left a ``started`` mark (a test runner straggling in it)."""
    found: list[str] = []

    def look() -> bool:
        if job.attempts_dir.exists():
            found.extend(d.name for d in job.attempts_dir.iterdir() if (d / attempt / "started").exists())
        return bool(found)

    wait_for(look, timeout=timeout)
    return found[0]


def stat_of(path: Path) -> tuple[int, int]:
    """Inode and mtime: a file rewritten in place or replaced shows here."""
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns


def tree_stats(folder: Path) -> dict[str, tuple[int, int, str]]:
    """Every file below ``folder``: inode, mtime and content hash."""
    return {
        str(p.relative_to(folder)): (*stat_of(p), hashlib.sha256(p.read_bytes()).hexdigest())
        for p in folder.rglob("*")
        if p.is_file()
    }
