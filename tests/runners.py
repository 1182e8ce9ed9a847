"""Small runners for protocol tests: real callables run by real worker processes.

Behaviour is steered by environment variables so the same runner can be
named on a ``dj-elastic worker --runner tests.runners:NAME`` command line.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

DESCRIPTOR = b'{"format":"parquet",'  # how prepare.parquet's descriptor line starts (orjson, sorted keys)


def _shard_name(shard_path: str) -> str:
    return Path(shard_path).name.removesuffix(".jsonl")


def shard_lines(shard_path: str, job_dir: str) -> Iterator[bytes]:
    """The shard's rows as JSONL lines, whatever the job's input: every runner reads its shard here, so each
    runs unchanged on a Parquet job (DJE_TEST_INPUT=parquet, tests/jobs.py).

    A JSONL shard's lines are its bytes, streamed. A Parquet shard is a descriptor: its row groups are read
    as the Ray runner reads them (``read_descriptor`` with the manifest's schema, ``job_dir`` being the
    generation's folder) and each row written as ``orjson.dumps``, as ``parquet_rows`` does.
    """
    with open(shard_path, "rb") as f:
        first = f.readline()
        if not first.startswith(DESCRIPTOR):
            yield first
            yield from f
            return
    import orjson

    from data_juicer_elastic.job.layout import JobDir
    from data_juicer_elastic.prepare.parquet import read_descriptor, schema_of

    record = JobDir(job_dir).manifest().parquet
    if record is None:  # a JSONL job whose first row merely looks like a descriptor
        with open(shard_path, "rb") as f:
            yield from f
        return
    for table in read_descriptor(shard_path, schema_of(record)):
        for row in table.to_pylist():
            yield orjson.dumps(row) + b"\n"


def copy(shard_path: str, output_path: str, job_dir: str) -> None:
    """Identity: the output is the shard's rows."""
    with open(output_path, "wb") as out:
        out.writelines(shard_lines(shard_path, job_dir))


def _hold() -> None:
    """Until the file DJE_TEST_HOLD names exists (a test's event), else DJE_TEST_SLEEP seconds.

    Sleeps in short slices, as a real runner waits (Ray's waits poll): CPython runs a Python signal handler
    only between bytecodes, so a stop signal caught just before one long ``time.sleep`` entered its system
    call waited out the whole sleep (a SIGTERM test then timed out, about 1 run in 20 under load).
    """
    hold = os.environ.get("DJE_TEST_HOLD")
    if not hold:
        deadline = time.monotonic() + float(os.environ.get("DJE_TEST_SLEEP", "30"))
        while time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        return
    deadline = time.monotonic() + 600
    while not os.path.exists(hold):
        if time.monotonic() > deadline:
            raise RuntimeError(f"runner held 600 s: {hold} never appeared")
        time.sleep(0.02)


def slow_copy(shard_path: str, output_path: str, job_dir: str) -> None:
    """Leaves ``started``, then holds (see ``_hold``), for shards in DJE_TEST_SLOW_SHARDS (all if unset)."""
    slow = os.environ.get("DJE_TEST_SLOW_SHARDS")
    if not slow or _shard_name(shard_path) in slow.split(","):
        Path(output_path).parent.joinpath("started").touch()
        _hold()
    copy(shard_path, output_path, job_dir)


def fail(shard_path: str, output_path: str, job_dir: str) -> None:
    """Fails shards listed in DJE_TEST_FAIL_SHARDS (all if unset), copies the rest."""
    failing = os.environ.get("DJE_TEST_FAIL_SHARDS")
    if not failing or _shard_name(shard_path) in failing.split(","):
        raise RuntimeError(f"injected failure for {_shard_name(shard_path)}")
    copy(shard_path, output_path, job_dir)


def weighted(shard_path: str, output_path: str, job_dir: str) -> None:
    """Sleeps DJE_TEST_UNIT seconds times this worker's DJE_TEST_WEIGHT (a slow or fast node)."""
    time.sleep(float(os.environ.get("DJE_TEST_UNIT", "0.05")) * float(os.environ.get("DJE_TEST_WEIGHT", "1")))
    copy(shard_path, output_path, job_dir)


def together(shard_path: str, output_path: str, job_dir: str) -> None:
    """Holds each shard until DJE_TEST_HOSTS distinct hosts hold leases (up to 300 s), then copies.

    So every started node takes part, whatever the order the machine schedules them in.
    """
    import orjson

    want = int(os.environ.get("DJE_TEST_HOSTS", "2"))
    claims = Path(job_dir) / "state" / "claims"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        hosts = set()
        for lease in claims.iterdir():
            try:
                hosts.add(orjson.loads(lease.read_bytes())["host"])
            except (OSError, ValueError, KeyError):
                continue
        if len(hosts) >= want:
            break
        time.sleep(0.05)
    copy(shard_path, output_path, job_dir)


def _attempt_of(output_path: str) -> str:
    return Path(output_path).parent.name


def tag(shard_path: str, output_path: str, job_dir: str) -> None:
    """Like slow_copy, but every output row records the attempt that wrote it (``_attempt``)."""
    import orjson

    slow = os.environ.get("DJE_TEST_SLOW_SHARDS")
    if not slow or _shard_name(shard_path) in slow.split(","):
        Path(output_path).parent.joinpath("started").touch()
        if os.environ.get("DJE_TEST_HOLD") or os.environ.get("DJE_TEST_SLEEP"):
            _hold()
    attempt = _attempt_of(output_path)
    with open(output_path, "wb") as out:
        for line in shard_lines(shard_path, job_dir):
            out.write(orjson.dumps({**orjson.loads(line), "_attempt": attempt}) + b"\n")


def die_after_output(shard_path: str, output_path: str, job_dir: str) -> None:
    """Writes the whole output, then SIGKILLs its own process (first attempt of DJE_TEST_DIE_SHARDS only).

    DJE_TEST_DIE_HALF=1 dies half way through writing instead.
    """
    import signal

    dying = _shard_name(shard_path) in os.environ.get("DJE_TEST_DIE_SHARDS", "").split(",")
    if not dying or _attempt_of(output_path) != "0001":
        return copy(shard_path, output_path, job_dir)
    data = b"".join(shard_lines(shard_path, job_dir))
    if os.environ.get("DJE_TEST_DIE_HALF"):
        data = data[: len(data) // 2]
    with open(output_path, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


_ran = [0]  # shards this process's straggler runner has started


def _is_backup(output_path: str) -> bool:
    import orjson

    try:
        return bool(orjson.loads((Path(output_path).parent / "attempt.json").read_bytes()).get("backup"))
    except (OSError, ValueError):
        return False


def straggler(shard_path: str, output_path: str, job_dir: str) -> None:
    """A copy that straggles on purpose, for speculation tests.

    It straggles on hosts (DJ_ELASTIC_HOSTNAME) listed in DJE_TEST_SLOW_HOSTS, from this process's
    DJE_TEST_SLOW_AFTER-th shard on (default 0: every shard), and on any host for backup attempts when
    DJE_TEST_SLOW_BACKUPS=1. Straggling touches ``started`` in the attempt dir, then waits until the
    shard's done record exists (DJE_TEST_UNTIL_DONE=1), the file DJE_TEST_GATE exists, or DJE_TEST_SLEEP
    seconds (default 600) have passed, whichever comes first; then the output is written as by ``copy``.
    Shards it does not straggle on take DJE_TEST_BASE seconds (default 0.2), so rates are not noise.
    """
    from data_juicer_elastic.job.layout import JobDir

    _ran[0] += 1
    host = os.environ.get("DJ_ELASTIC_HOSTNAME", "")
    slow_host = host in os.environ.get("DJE_TEST_SLOW_HOSTS", "").split(",") and _ran[0] > int(
        os.environ.get("DJE_TEST_SLOW_AFTER", "0")
    )
    if slow_host or (os.environ.get("DJE_TEST_SLOW_BACKUPS") == "1" and _is_backup(output_path)):
        Path(output_path).parent.joinpath("started").touch()
        done = JobDir(job_dir).done_path(_shard_name(shard_path))
        gate = os.environ.get("DJE_TEST_GATE")
        until_done = os.environ.get("DJE_TEST_UNTIL_DONE") == "1"
        deadline = time.monotonic() + float(os.environ.get("DJE_TEST_SLEEP", "600"))
        while time.monotonic() < deadline:
            if (until_done and done.exists()) or (gate and os.path.exists(gate)):
                break
            time.sleep(0.005)
    else:
        time.sleep(float(os.environ.get("DJE_TEST_BASE", "0.2")))
    copy(shard_path, output_path, job_dir)


_weight_seen = [0.0, 1.0]  # when the done count was last looked at, the weight it gave


def _row_weight(job_dir: str) -> float:
    """DJE_TEST_WEIGHT, or DJE_TEST_WEIGHT_LATER once DJE_TEST_SLOW_AT shards are done (looked up every 0.1 s)."""
    weight = float(os.environ.get("DJE_TEST_WEIGHT", "1"))
    later, at = os.environ.get("DJE_TEST_WEIGHT_LATER"), os.environ.get("DJE_TEST_SLOW_AT")
    if later is None or at is None:
        return weight
    now = time.monotonic()
    if now - _weight_seen[0] >= 0.1:
        done = Path(job_dir, "state", "done")
        count = sum(1 for n in os.listdir(done) if n.endswith(".json") and not n.startswith("."))
        _weight_seen[:] = [now, float(later) if count >= int(at) else weight]
    return _weight_seen[1]


def per_row(shard_path: str, output_path: str, job_dir: str) -> None:
    """A copy that costs DJE_TEST_ROW_COST seconds per row times this node's weight (see ``_row_weight``).

    The weight is applied row by row, so a node made slower mid-job slows down inside its current shard.
    Sleeps run to a deadline, so a busy machine's late wake-ups do not add up over the rows.
    """
    cost = float(os.environ.get("DJE_TEST_ROW_COST", "0.01"))
    due = time.monotonic()
    with open(output_path, "wb") as out:
        for line in shard_lines(shard_path, job_dir):
            due += cost * _row_weight(job_dir)
            time.sleep(max(due - time.monotonic(), 0.0))
            out.write(line)


def story(shard_path: str, output_path: str, job_dir: str) -> None:
    """For the report test: hangs on every shard where DJE_TEST_HANG is set (a node to kill), fails the
    first attempt of DJE_TEST_FAIL_ONCE shards, otherwise keeps every other row after DJE_TEST_UNIT seconds
    and leaves an ``ops.json`` (rows in and out of one pretend Filter) as a counting runner does."""
    import orjson

    adir = Path(output_path).parent
    if os.environ.get("DJE_TEST_HANG"):
        adir.joinpath("started").touch()
        time.sleep(600)
    time.sleep(float(os.environ.get("DJE_TEST_UNIT", "0.2")))
    if _shard_name(shard_path) in os.environ.get("DJE_TEST_FAIL_ONCE", "").split(",") and adir.name == "0001":
        raise RuntimeError(f"injected first-attempt failure for {_shard_name(shard_path)}")
    lines = list(shard_lines(shard_path, job_dir))
    kept = lines[::2]
    Path(output_path).write_bytes(b"".join(kept))
    op = {"op": "every_other_row_filter", "kind": "Filter", "rows_in": len(lines), "rows_out": len(kept)}
    record = {"rows_in": len(lines), "rows_out": len(kept), "error_rows": 0, "ops": [{**op, "error_rows": 0}]}
    adir.joinpath("ops.json").write_bytes(orjson.dumps(record))


def project(shard_path: str, output_path: str, job_dir: str) -> None:
    """Tags every row with the recipe's project_name, read from the generation's recipe.yaml (job_dir)."""
    name = Path(job_dir, "recipe.yaml").read_text().split("project_name:")[1].split()[0]
    with open(output_path, "wb") as out:
        for line in shard_lines(shard_path, job_dir):
            out.write(line.rstrip(b"\n")[:-1] + b', "project": "' + name.encode() + b'"}\n')


def parquet_rows(shard_path: str, output_path: str, job_dir: str) -> None:
    """Identity for a Parquet job: the descriptor's row groups, read as the Ray runner reads them
    (``prepare.parquet.read_descriptor`` with the manifest's schema, in ``shard_lines``), written as JSONL.

    Leaves ``started`` and holds for shards in DJE_TEST_SLOW_SHARDS and on hosts (DJ_ELASTIC_HOSTNAME) in
    DJE_TEST_SLOW_HOSTS: until the shard's done record exists with DJE_TEST_UNTIL_DONE=1 (a straggler a
    backup beats), else as ``_hold`` does.
    """
    from data_juicer_elastic.job.layout import JobDir

    sid = _shard_name(shard_path)
    slow_shard = sid in os.environ.get("DJE_TEST_SLOW_SHARDS", "").split(",")
    slow_hosts = os.environ.get("DJE_TEST_SLOW_HOSTS")
    slow_host = bool(slow_hosts) and os.environ.get("DJ_ELASTIC_HOSTNAME") in slow_hosts.split(",")
    if slow_shard or slow_host:
        Path(output_path).parent.joinpath("started").touch()
        if os.environ.get("DJE_TEST_UNTIL_DONE") == "1":
            done, deadline = JobDir(job_dir).done_path(sid), time.monotonic() + 600
            while not done.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            _hold()
    with open(output_path, "wb") as out:
        out.writelines(shard_lines(shard_path, job_dir))
