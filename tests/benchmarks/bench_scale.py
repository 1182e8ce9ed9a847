"""Scale benchmarks B10, B11, B12 (and B12s): coordination that costs the same per shard at any size.

    python tests/benchmarks/bench_scale.py [--b10-shards 1000,5000] [--b10-workers 8,32] [--b12-shards 20000]
        [--b12-workers 64] [--b12s-shards 2000] [--skip b12s]

Every figure comes from real ``dj-elastic worker --runner tests.runners:copy`` processes over one-row
shards. File-system calls are COUNTED, never timed: each worker runs under ``strace -f`` and every
system call whose path lies in the job dir, or whose file descriptor was opened there, is one call;
the bytes ``getdents64`` returned on such descriptors are the directory listings read.

B10  per shard claimed, run and published, all workers together: calls and listing bytes, at each
     size in ``--b10-shards`` and each worker count in ``--b10-workers``. Targets: <= 60 calls and
     <= 8 KB of listings per shard; flat within 1.2x across the sizes and the worker counts.
B11  per process: calls of one progress tick (``watch.ProgressTicker``'s read) and of one idle poll
     (a worker with nothing to claim while another holds the last shard), on a job with few and one
     with many shards done. Target: flat within 1.2x.
B12  a simulated job of ``--b12-workers`` worker processes with distinct DJ_ELASTIC_HOSTNAME over
     ``--b12-shards`` one-row shards, then again with a tenth of the workers killed -9 at random moments
     and restarted. Every shard done exactly once, output identical to the input; the per-shard time of
     the last tenth of the shards within 1.3x of the first tenth (both measured in the same run).
B12s the same over two loopback sshfs mounts (``tests/chaos/sshfs.py``; root, sshd and sshfs needed).

Exit code 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.jobs import check_done_exactly_once, kill_group, make_job, merge_and_check, spawn, worker_cmd  # noqa: E402

FAST = {"heartbeat_secs": 0.5, "lock_timeout_secs": 3.0, "poll_interval_secs": 0.05, "max_retries": 2}
# B10 counts idle polls too: a poll every second (the default is 5 s) instead of the tests' 0.05 s
COUNTED = {**FAST, "poll_interval_secs": 1.0}
# Many more simulated nodes than cores: each process gets 2/256 of a core at 256 workers here, so FAST's
# timings starve it. 255 idle workers polling every 50 ms took the two cores at the tail (the last 200
# shards took three minutes), and a heartbeat every 0.5 s against a 3 s lease lapsed 203 times in 100,000
# shards. The default policy polls every 5 s with 300 s leases; this keeps the same ratios to the CPU each
# process really gets (a restarted node still takes its dead predecessor's leases over at once).
CROWDED = {"heartbeat_secs": 2.0, "lock_timeout_secs": 12.0, "poll_interval_secs": 1.0, "max_retries": 2}
CROWDED_PER_CORE = 16  # worker processes per core from which B12 uses CROWDED

# --- counting system calls ----------------------------------------------------------------------

_LINE = re.compile(r"^(\d+)\s+(.*)$")
_CALL = re.compile(r"^([a-z0-9_]+)\((.*)\)\s+=\s+(-?\d+|\?)")
_PATHS = re.compile(r'"((?:[^"\\]|\\.)*)"')
_DIGITS = re.compile(r"[0-9a-f]*[0-9][0-9a-f]*")


@dataclass
class Count:
    calls: int = 0
    listing_bytes: int = 0
    meta: int = 0  # what a file server sees as metadata requests: calls naming a path, getdents64, fsync
    # folder listed (relative to the job dir, digits as N) -> [bytes read, getdents64 calls that returned some]
    listings: dict[str, list[int]] = field(default_factory=dict)

    def add(self, other: Count) -> None:
        self.calls += other.calls
        self.listing_bytes += other.listing_bytes
        self.meta += other.meta
        for folder, (size, reads) in other.listings.items():
            mine = self.listings.setdefault(folder, [0, 0])
            mine[0] += size
            mine[1] += reads


def count_trace(trace: Path, root: str) -> Count:
    """Calls on ``root`` (by path or by a descriptor opened under it) and getdents64 bytes, from one strace -f log."""
    root = root.rstrip("/")
    group: dict[str, str] = {}  # thread id -> the id of the process whose descriptor table it shares
    fds: dict[tuple[str, str], str | None] = {}  # (process, fd) -> the path under root it was opened on
    pending: dict[str, str] = {}
    total = Count()
    with open(trace, errors="replace") as f:
        for raw in f:
            m = _LINE.match(raw)
            if not m:
                continue
            tid, text = m.group(1), m.group(2)
            if text.endswith("<unfinished ...>"):
                pending[tid] = text[: -len("<unfinished ...>")]
                continue
            if text.startswith("<..."):
                head = pending.pop(tid, "")
                text = head + text.split("resumed>", 1)[-1]
            call = _CALL.match(text)
            if not call:
                continue
            name, args, ret = call.groups()
            proc = group.setdefault(tid, tid)
            if name in ("clone", "clone3", "vfork", "fork") and ret.isdigit():
                shares = "CLONE_FILES" in args or "CLONE_THREAD" in args
                group[ret] = proc if shares else ret
                if not shares:  # a forked child starts with a copy of the table
                    for (p, fd), ours in list(fds.items()):
                        if p == proc:
                            fds[(ret, fd)] = ours
                continue
            paths = _PATHS.findall(args)
            on_root = any(p == root or p.startswith(root + "/") for p in paths)
            first = args.split(",", 1)[0].strip()
            by_fd = fds.get((proc, first)) if first.isdigit() else None
            if name in ("open", "openat", "creat") and ret.isdigit():
                fds[(proc, ret)] = next((p for p in paths if p == root or p.startswith(root + "/")), None)
            if name == "close" and first.isdigit():
                fds.pop((proc, first), None)
            if name in ("dup", "dup2", "dup3", "fcntl") and ret.isdigit() and by_fd:
                fds[(proc, ret)] = by_fd
            if on_root or by_fd:
                total.calls += 1
                total.meta += bool(on_root) or name in ("getdents64", "fsync", "fdatasync")
                if name == "getdents64" and by_fd and ret.isdigit():
                    total.listing_bytes += int(ret)
                    folder = _DIGITS.sub("N", by_fd[len(root) :]) or "/"
                    seen = total.listings.setdefault(folder, [0, 0])
                    seen[0] += int(ret)
                    seen[1] += int(ret) > 0
    return total


def strace_prefix(out: Path, *more: str) -> list[str]:
    calls = ",".join(("%file", "%desc", "%process", *more))
    return ["strace", "-f", "-qq", "-s", "512", "-e", f"trace={calls}", "-e", "signal=none", "-o", str(out)]


def counted_workers(job, n: int, tmp: Path, runner: str = "copy", extra: tuple[str, ...] = (), timeout: float = 900):
    """Run ``n`` workers to the end, each under strace; (calls and listing bytes on the job dir, exit codes)."""
    tmp.mkdir(parents=True, exist_ok=True)
    traces = [tmp / f"trace-{i}" for i in range(n)]
    procs = [
        spawn([*strace_prefix(traces[i]), *worker_cmd(job, runner, *extra)], DJ_ELASTIC_HOSTNAME=f"node-{i:03d}")
        for i in range(n)
    ]
    codes = _wait_all(procs, timeout)
    total = Count()
    for t in traces:
        total.add(count_trace(t, str(job.root)))
        t.unlink()
    return total, codes


def _wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                kill_group(q)
            raise RuntimeError(f"workers did not finish within {timeout}s") from None
    return [p.returncode for p in procs]


@dataclass
class PerShard:
    """What a job of workers cost, divided by its shards."""

    calls: float
    listing: float  # listing bytes
    meta: float  # metadata calls
    codes: list[int]
    listings: dict[str, float]  # listing bytes per folder listed (see ``Count.listings``)
    per_read: dict[str, float]  # bytes one getdents64 call that returned entries read, per folder (average)


def per_shard(job, n_workers: int, tmp: Path) -> PerShard:
    """Run ``n_workers`` to the end under strace; their cost per shard (every shard checked done once)."""
    shards = len(job.manifest().shards)
    count, codes = counted_workers(job, n_workers, tmp)
    check_done_exactly_once(job)
    return PerShard(
        count.calls / shards,
        count.listing_bytes / shards,
        count.meta / shards,
        codes,
        {folder: size / shards for folder, (size, _) in count.listings.items()},
        {folder: size / max(reads, 1) for folder, (size, reads) in count.listings.items()},
    )


def startup_calls(job, tmp: Path) -> Count:
    """What one worker costs on a job with nothing to claim (its start-up and its end), to subtract."""
    count, _ = counted_workers(job, 1, tmp / "startup")
    return count


# --- B10 -----------------------------------------------------------------------------------------


def bench_b10(tmp: Path, sizes: list[int], workers: list[int]) -> tuple[dict, bool]:
    """Calls and listing bytes per shard; also net of what starting each worker process costs (per node)."""
    rows = {}
    for n in workers:
        for shards in sizes:
            job = make_job(tmp / f"b10-{n}-{shards}", rows=shards, shards=shards, **COUNTED)
            cost = per_shard(job, n, tmp / f"b10-{n}-{shards}-traces")
            calls, listing, meta, codes = cost.calls, cost.listing, cost.meta, cost.codes
            start = startup_calls(job, tmp / f"b10-{n}-{shards}-traces")
            net = calls - n * start.calls / shards
            net_meta = meta - n * start.meta / shards
            rows[(n, shards)] = (calls, listing, net, net_meta)
            print(
                f"B10 {n} workers, {shards} shards: {calls:.1f} calls/shard ({net:.1f} net of {start.calls} calls "
                f"per process start); metadata calls {meta:.1f} ({net_meta:.1f} net); {listing:.0f} B of "
                f"listings/shard, exit codes {sorted(set(codes))}",
                flush=True,
            )
    nets = [r[2] for r in rows.values()]
    metas = [r[3] for r in rows.values()]
    calls = [r[0] for r in rows.values()]
    listing = [r[1] for r in rows.values()]
    ratio_net = max(nets) / min(nets)
    print(
        f"B10 summary: calls/shard {min(calls):.1f}..{max(calls):.1f} (ratio {max(calls) / min(calls):.2f}); "
        f"net of process start {min(nets):.1f}..{max(nets):.1f} (ratio {ratio_net:.2f}, target <= 1.2x); "
        f"metadata calls net {min(metas):.1f}..{max(metas):.1f} (target <= 60); "
        f"listings {min(listing):.0f}..{max(listing):.0f} B/shard (target <= 8192 B)",
        flush=True,
    )
    return rows, max(metas) <= 60 and ratio_net <= 1.2 and max(listing) <= 8192


# --- B11 -----------------------------------------------------------------------------------------


def idle_and_tick_calls(tmp: Path, shards: int) -> tuple[float, float]:
    """(calls per progress tick, calls per idle poll) of one process on a job with all shards done but one."""
    job = make_job(tmp / f"b11-{shards}", rows=shards, shards=shards, **FAST)
    _wait_all([spawn(worker_cmd(job, "copy", "--max-shards", str(shards - 1)))], 3600)
    hold = tmp / f"b11-{shards}-hold"
    holder = spawn(worker_cmd(job, "slow_copy"), DJE_TEST_HOLD=str(hold), DJ_ELASTIC_HOSTNAME="holder")
    try:
        _wait_until(lambda: _started(job))
        ticks = 10
        code = (
            "import time\n"
            "from data_juicer_elastic.watch import ProgressReader\n"
            f"r = ProgressReader({str(job.root)!r}); r.line()\n"  # the manifest is read once per process
            "open('/dev/null').close()\n"  # the mark: calls after it are the ticks'
            f"for _ in range({ticks}):\n"
            "    time.sleep(0.6); r.line()\n"  # ticks further apart than the snapshot's refresh interval
        )
        tick = _marked_calls(tmp / f"b11-{shards}-ticks", [sys.executable, "-c", code], str(job.root)) / ticks
        trace = tmp / f"b11-{shards}-idle"
        idle = spawn(
            [*strace_prefix(trace, "clock_nanosleep"), *worker_cmd(job, "copy", "--prefetch-shards", "0")],
            DJ_ELASTIC_HOSTNAME="idler",
        )
        time.sleep(4.0)
        kill_group(idle)
        idle.wait()
        return tick, _per_poll(trace, str(job.root))
    finally:
        hold.touch()
        holder.wait(timeout=60)


def _per_poll(trace: Path, root: str) -> float:
    """Calls on ``root`` between the idle worker's first and last poll sleep, per sleep."""
    lines = trace.read_text(errors="replace").splitlines()
    sleeps = [i for i, line in enumerate(lines) if "clock_nanosleep" in line and "resumed" not in line]
    if len(sleeps) < 3:
        raise RuntimeError(f"{trace}: the worker never idled")
    part = trace.with_suffix(".polls")
    part.write_text("\n".join(lines[sleeps[0] : sleeps[-1]]) + "\n")
    return count_trace(part, root).calls / (len(sleeps) - 1)


def _started(job) -> bool:
    return job.attempts_dir.exists() and any((d / "0001" / "started").exists() for d in job.attempts_dir.iterdir())


def _wait_until(pred, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.05)


def _marked_calls(trace: Path, cmd: list[str], root: str) -> float:
    """Calls on ``root`` after the process opened /dev/null (everything before is start-up)."""
    res = subprocess.run([*strace_prefix(trace), *cmd], cwd=REPO, capture_output=True, text=True, env=_env())
    if res.returncode:
        raise RuntimeError(res.stderr[-2000:])
    lines = trace.read_text(errors="replace").splitlines()
    cut = next(i for i, line in enumerate(lines) if 'openat(AT_FDCWD, "/dev/null"' in line)
    part = trace.with_suffix(".after")
    part.write_text("\n".join(lines[cut + 1 :]) + "\n")
    return count_trace(part, root).calls


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def bench_b11(tmp: Path, sizes: list[int]) -> bool:
    figures = {n: idle_and_tick_calls(tmp, n) for n in sizes}
    for n, (tick, idle) in figures.items():
        print(f"B11 {n} shards done: {tick:.1f} calls per progress tick, {idle:.1f} calls per idle poll", flush=True)
    ticks = [t for t, _ in figures.values()]
    idles = [i for _, i in figures.values()]
    rt, ri = max(ticks) / max(min(ticks), 1e-9), max(idles) / max(min(idles), 1e-9)
    print(f"B11 summary: tick ratio {rt:.2f}, idle poll ratio {ri:.2f} (target <= 1.2 each)", flush=True)
    return rt <= 1.2 and ri <= 1.2


# --- B12 -----------------------------------------------------------------------------------------


def done_times(job) -> list[float]:
    """Finish times of the done records, in finish order."""
    import orjson

    times = []
    for name in os.listdir(job.done_dir):
        if name.endswith(".json") and not name.startswith("."):
            times.append(orjson.loads((job.done_dir / name).read_bytes())["finished_at"])
    return sorted(times)


def dump_done(job, path: Path, run_dir: Path) -> None:
    """Each done record's shard, attempt, worker and times, one JSON line each, and for a shard done at a later
    attempt the records of its earlier ones (how each ended) and the logs of the workers involved: a look
    after the job dir is gone (``--dump``)."""
    import orjson

    path.parent.mkdir(parents=True, exist_ok=True)
    workers: set[str] = set()
    with open(path, "wb") as out:
        for name in sorted(os.listdir(job.done_dir)):
            if not name.endswith(".json") or name.startswith("."):
                continue
            rec = orjson.loads((job.done_dir / name).read_bytes())
            keep = {k: rec.get(k) for k in ("shard", "attempt", "worker", "host", "started_at", "finished_at")}
            if rec["attempt"] > 1:
                keep["earlier"] = []
                for n in range(1, rec["attempt"]):
                    record = job.attempt_dir(rec["shard"], n) / "attempt.json"
                    earlier = orjson.loads(record.read_bytes()) if record.exists() else None
                    keep["earlier"].append(earlier)
                    if earlier:
                        workers.add(str(earlier.get("host")))
                workers.add(str(rec.get("host")))
            out.write(orjson.dumps(keep) + b"\n")
    logs = path.with_name(path.stem + "-logs")
    logs.mkdir(parents=True, exist_ok=True)
    for host in workers:  # sim-node-<i>, whose log is run_dir/w<i>.log
        index = host.rsplit("-", 1)[-1]
        log = run_dir / f"w{int(index)}.log" if index.isdigit() else None
        if log is not None and log.exists():
            shutil.copy(log, logs / log.name)


def tenth_ratio(times: list[float]) -> tuple[float, float, float]:
    """(seconds per shard of the first tenth, of the last tenth, their ratio) from sorted finish times."""
    k = max(len(times) // 10, 2)
    first = (times[k - 1] - times[0]) / (k - 1)
    last = (times[-1] - times[-k]) / (k - 1)
    return first, last, last / first if first > 0 else float("inf")


def run_b12(job, workers: int, kill_fraction: float, tmp: Path, timeout: float, seed: int = 7) -> tuple[float, list]:
    """Run ``workers`` workers (distinct hosts); kill -9 ``kill_fraction`` of them at random moments and restart."""
    rng = random.Random(seed)
    procs = [
        spawn(worker_cmd(job, "copy"), DJ_ELASTIC_HOSTNAME=f"sim-node-{i:03d}", log=tmp / f"w{i}.log")
        for i in range(workers)
    ]
    t0 = time.monotonic()
    victims = rng.sample(range(workers), int(workers * kill_fraction))
    total = len(job.manifest().shards)
    kills = sorted((rng.uniform(0.05, 0.8), v) for v in victims)  # at these fractions of the shards done
    killed = 0
    while any(p.poll() is None for p in procs):
        if time.monotonic() - t0 > timeout:
            for p in procs:
                kill_group(p)
            raise RuntimeError(f"B12 did not finish in {timeout}s")
        if kills:
            done = _done_count(job)
            while kills and done >= kills[0][0] * total:
                _, v = kills.pop(0)
                kill_group(procs[v], signal.SIGKILL)
                procs[v].wait()
                procs[v] = spawn(
                    worker_cmd(job, "copy"), DJ_ELASTIC_HOSTNAME=f"sim-node-{v:03d}", log=tmp / f"w{v}.log"
                )
                killed += 1
        time.sleep(0.5)
    wall = time.monotonic() - t0
    codes = [p.returncode for p in procs]
    return wall, codes


def _done_count(job) -> int:
    with os.scandir(job.done_dir) as it:
        return sum(1 for e in it if e.name.endswith(".json"))


def bench_b12(
    tmp: Path,
    shards: int,
    workers: int,
    timeout: float,
    label: str = "B12",
    job_dir: Path | None = None,
    kills: tuple[float, ...] = (0.0, 0.1),
    dump: Path | None = None,
):
    ok = True
    for kill in kills:
        name = f"{label.lower()}-{'kill' if kill else 'clean'}"
        policy = CROWDED if workers > CROWDED_PER_CORE * (os.cpu_count() or 1) else FAST
        job = make_job(tmp / name, rows=shards, shards=shards, job_dir=(job_dir / name) if job_dir else None, **policy)
        wall, codes = run_b12(job, workers, kill, tmp / name, timeout)
        check_done_exactly_once(job)
        merge_and_check(job, tmp / name / "merged.jsonl")
        first, last, ratio = tenth_ratio(done_times(job))
        if dump:
            dump_done(job, dump / f"{name}.jsonl", tmp / name)
        print(
            f"{label} {workers} workers, {shards} shards, {'CROWDED' if policy is CROWDED else 'FAST'} policy, "
            f"{'a tenth killed -9 and restarted' if kill else 'no kills'}: "
            f"wall {wall:.1f}s, first tenth {first * 1000:.2f} ms/shard, last tenth {last * 1000:.2f} ms/shard, "
            f"ratio {ratio:.2f} (target <= 1.3); exit codes {sorted(set(codes))}; output identical",
            flush=True,
        )
        ok = ok and ratio <= 1.3
    return ok


def bench_b12s(
    tmp: Path, shards: int, workers: int, timeout: float, kills: tuple[float, ...], dump: Path | None = None
) -> bool | None:
    from tests.chaos.sshfs import SshfsPair

    pair = SshfsPair(tmp / "sshfs")
    reason = pair.unavailable()
    if reason:
        print(f"B12s skipped: {reason}", flush=True)
        return None
    pair.start()
    try:
        return bench_b12(tmp, shards, workers, timeout, "B12s", job_dir=pair.mounts[0], kills=kills, dump=dump)
    finally:
        pair.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--b10-shards", default="1000,5000")
    ap.add_argument("--b10-workers", default="8,32")
    ap.add_argument("--b11-shards", default="1000,10000")
    ap.add_argument("--b12-shards", type=int, default=20000)
    ap.add_argument("--b12-workers", type=int, default=64)
    ap.add_argument("--b12s-shards", type=int, default=2000)
    ap.add_argument("--b12s-workers", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument(
        "--b12-kills",
        type=lambda v: tuple(float(x) for x in v.split(",")),
        default=(0.0, 0.1),
        help="B12's runs: the fraction of workers killed -9 and restarted in each (default 0,0.1)",
    )
    ap.add_argument("--dump", type=Path, help="B12/B12s: write each run's done records (times, attempts) here")
    ap.add_argument("--skip", default="", help="comma-separated: b10,b11,b12,b12s")
    a = ap.parse_args()
    if not shutil.which("strace"):
        print("strace is needed for B10 and B11 (apt-get install strace)", file=sys.stderr)
        return 2
    skip = set(filter(None, a.skip.split(",")))
    ok = True
    with tempfile.TemporaryDirectory(prefix="dje-scale-") as d:
        tmp = Path(d)
        if "b10" not in skip:
            ok &= bench_b10(tmp, [int(x) for x in a.b10_shards.split(",")], [int(x) for x in a.b10_workers.split(",")])[
                1
            ]
        if "b11" not in skip:
            ok &= bench_b11(tmp, [int(x) for x in a.b11_shards.split(",")])
        if "b12" not in skip:
            ok &= bench_b12(tmp, a.b12_shards, a.b12_workers, a.timeout, kills=a.b12_kills, dump=a.dump)
        if "b12s" not in skip:
            ok &= bench_b12s(tmp, a.b12s_shards, a.b12s_workers, a.timeout, a.b12_kills, a.dump) is not False
    print("PASS" if ok else "MISS", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
