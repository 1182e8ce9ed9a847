"""``dj-elastic status`` on a job of 100,000 one-row done shards: plain, ``--json`` and ``--shards``.

    python tests/benchmarks/bench_status.py [--shards 100000] [--dir /tmp/dje-bench-status] [--rounds 3]
        [--status-secs 2.0]

Not a pytest module. The job dir is built synthetically and cheaply (kept under
--dir for the next run): a sealed manifest, one done record and one lease per
shard, and the worker records 16 hosts (one worker process each) would have
left, their totals summing the done records; ``running`` shards are live,
named by their worker's record. Per view it prints the median wall time of a
fresh ``python -m data_juicer_elastic.cli status`` process (imports count) and
the files it opened (``strace -f -e trace=openat,open`` when strace is
there): in the job dir, done records among them, and in all (imports too). It exits 1 when a summary view (plain or --json) takes longer than
--status-secs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from data_juicer_elastic.job.claims import lease_name  # noqa: E402
from data_juicer_elastic.job.layout import JobDir  # noqa: E402
from data_juicer_elastic.job.records.attempt import AttemptRecord, write_attempt  # noqa: E402
from data_juicer_elastic.job.records.done import DoneRecord, expected_output  # noqa: E402
from data_juicer_elastic.job.records.workers import WorkerRecord, write_worker  # noqa: E402
from data_juicer_elastic.storage.files import dumps_json  # noqa: E402
from tests.benchmarks.bench_views import timed  # noqa: E402
from tests.benchmarks.synthetic import ROW, ROW_SHA, synthetic_job  # noqa: E402

HOSTS = [f"node-{i:02d}" for i in range(16)]
SPAN = 3600.0  # the synthetic job ran for an hour


def build_job(root: Path, n: int, running: int = 8) -> JobDir:
    """``n`` one-row shards, the last ``running`` live, the others done, with the worker records to match."""
    marker = root / ".built"
    if marker.exists():
        return JobDir(root)
    shutil.rmtree(root, ignore_errors=True)
    job, shards = synthetic_job(root, n)
    now = time.time()
    t0 = now - SPAN
    step = SPAN / max(n / len(HOSTS), 1)
    workers = {h: WorkerRecord(worker=f"{h}-{1000 + k}-bench", host=h, pid=1000 + k) for k, h in enumerate(HOSTS)}
    for i, spec in enumerate(shards):
        h = HOSTS[i % len(HOSTS)]
        w = workers[h]
        start = t0 + (i // len(HOSTS)) * step * 0.98
        lease = job.claims_dir / lease_name(spec.id, 1)
        lease.write_bytes(dumps_json({"host": h, "pid": w.pid, "worker": w.worker}))
        if i >= n - running:
            os.utime(lease, (now, now))
            adir = job.attempt_dir(spec.id, 1)
            adir.mkdir(parents=True)
            write_attempt(job, AttemptRecord(spec.id, 1, h, w.pid, "t", now - 1, now - 1, None, False))
            w.pairs.append((spec.id, 1))
            continue
        end = start + step * 0.95
        os.utime(lease, (end, end))
        done = DoneRecord(
            spec.id, 1, h, 1, len(ROW), ROW_SHA, expected_output(job, spec.id, 1), w.pid, start, end, worker=w.worker
        )
        (job.done_dir / f"{spec.id}.json").write_bytes(dumps_json(done.to_dict()))
        w.published += 1
        w.input_rows += 1
        w.output_rows += 1
        w.bytes_in += len(ROW)
        w.secs += end - start
        w.first_start = start if w.first_start is None else min(w.first_start, start)
        w.last_finish = end if w.last_finish is None else max(w.last_finish, end)
        w.rates = [*w.rates[-15:], len(ROW) / (end - start)]
    for w in workers.values():
        write_worker(job.store, job.key(job.workers_dir), w)
    marker.touch()
    return job


def opens(cmd: list[str], job: JobDir) -> str:
    """``<in the job dir> (<all>)`` openat calls of ``cmd`` and its children, by strace ("?" without it)."""
    if not shutil.which("strace"):
        return "?"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(["strace", "-f", "-e", "trace=openat,open", *cmd], capture_output=True, text=True, env=env)
    paths = re.findall(r'open(?:at)?\(.*?"([^"]+)"', out.stderr)
    in_job = [p for p in paths if p.startswith(str(job.root))]
    done = sum(1 for p in in_job if "/state/done/" in p)
    return f"{len(in_job)} in the job dir ({done} done records), {len(paths)} in all"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, nargs="+", default=[100000])
    p.add_argument("--dir", default="/tmp/dje-bench-status")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--status-secs", type=float, default=2.0)
    a = p.parse_args()
    misses = []
    status = [sys.executable, "-m", "data_juicer_elastic.cli", "status"]
    for n in a.shards:
        t = time.perf_counter()
        job = build_job(Path(a.dir) / f"job-{n}", n)
        print(f"{n:,} shards built in {time.perf_counter() - t:.0f} s ({job.root})")
        for view in ([], ["--json"], ["--shards"], ["--json", "--shards"]):
            cmd = [*status, "--job-dir", str(job.root), *view]
            times = sorted(timed(cmd)[0] for _ in range(a.rounds))
            best = times[len(times) // 2]
            name = " ".join(["status", *view])
            print(f"{name:<24} {n:>7,} shards: {best:6.2f} s (median of {a.rounds}), opens: {opens(cmd, job)}")
            if "--shards" not in view and best > a.status_secs:
                misses.append(f"{name} of {n:,} shards took {best:.2f} s > {a.status_secs} s")
    for m in misses:
        print("MISS", m)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
