"""The whole-job views at scale: ``dj-elastic status`` and ``dj-elastic report`` on 1,000 to 100,000 shards.

    python tests/benchmarks/bench_views.py [--shards 1000 10000 100000] [--dir /tmp/dje-bench-views]
        [--status-secs 2.0] [--report-mb 5] [--no-report]

Not a pytest module. A job dir is built synthetically with the project's own
record writers (manifest, generation, done, attempt records, leases), as a
16-host job over an hour would leave it: most shards done, some retried after
a failure or a killed worker, a few running with live leases. Building it is
not timed (it is kept under --dir for the next run).

Per size it prints the wall time of ``dj-elastic status`` (text, in a fresh
process, so imports count) and the files it opened (``strace -f -c -e
trace=openat`` when strace is there); and the report's size and the time to
write it. It exits 1 when status takes longer than --status-secs at any size
or the report is larger than --report-mb.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from data_juicer_elastic.job.claims import RELEASED_MTIME, lease_name  # noqa: E402
from data_juicer_elastic.job.layout import JobDir  # noqa: E402
from data_juicer_elastic.job.records.attempt import AttemptRecord, write_attempt  # noqa: E402
from data_juicer_elastic.job.records.done import DoneRecord, expected_output  # noqa: E402
from data_juicer_elastic.storage.files import dumps_json  # noqa: E402
from tests.benchmarks.synthetic import ROW, ROW_SHA, synthetic_job  # noqa: E402

HOSTS = [f"node-{i:02d}" for i in range(16)]
SPAN = 3600.0  # the synthetic job ran for an hour


def build_job(root: Path, n: int, running: int = 8, seed: int = 0) -> JobDir:
    """A job dir of ``n`` one-row shards: ``running`` of them live, the rest done (some after a lost or failed try)."""
    marker = root / ".built"
    if marker.exists():
        return JobDir(root)
    shutil.rmtree(root, ignore_errors=True)
    rnd = random.Random(seed)
    job, shards = synthetic_job(root, n)
    now = time.time()
    t0 = now - SPAN
    per_host = n / len(HOSTS)
    step = SPAN / max(per_host, 1)
    for i, spec in enumerate(shards):
        host = HOSTS[i % len(HOSTS)]
        start = t0 + (i // len(HOSTS)) * step * 0.98
        live = i >= n - running
        lost = rnd.random() < 0.002
        failed = not lost and rnd.random() < 0.003
        attempts = []
        if lost or failed:
            attempts.append(("running" if lost else "failed", HOSTS[(i + 1) % len(HOSTS)], start - step, start))
        attempts.append(("running" if live else "done", host, start, now if live else start + step * 0.95))
        for k, (outcome, h, a_start, a_end) in enumerate(attempts, 1):
            adir = job.attempt_dir(spec.id, k)
            adir.mkdir(parents=True)
            rec = AttemptRecord(spec.id, k, h, 1000 + HOSTS.index(h), "t", a_start, a_start, None, False)
            if outcome != "running":
                rec.outcome, rec.finished_at = outcome, a_end
                rec.error = "RuntimeError: injected" if outcome == "failed" else None
            write_attempt(job, rec)
            lease = job.claims_dir / lease_name(spec.id, k)
            lease.write_bytes(b"{}")
            stamp = now if live else (RELEASED_MTIME if outcome == "failed" else a_end)
            os.utime(lease, (stamp, stamp))
            if outcome == "done":
                done = DoneRecord(
                    spec.id, k, h, 1, len(ROW), ROW_SHA, expected_output(job, spec.id, k), rec.pid, a_start, a_end
                )
                (job.done_dir / f"{spec.id}.json").write_bytes(dumps_json(done.to_dict()))
    marker.touch()
    return job


def timed(cmd: list[str]) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - t
    if out.returncode not in (0, 1):
        raise SystemExit(f"{cmd} exited {out.returncode}: {out.stderr[-2000:]}")
    return seconds, out.stdout


def opens(cmd: list[str]) -> int | None:
    """openat calls of ``cmd`` and its children, counted by strace (None without strace)."""
    if not shutil.which("strace"):
        return None
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        ["strace", "-f", "-c", "-e", "trace=openat,open", *cmd], capture_output=True, text=True, env=env, cwd=ROOT
    )
    calls = [
        int(m.group(1)) for m in re.finditer(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)(?:\s+\d+)?\s+open", out.stderr, re.M)
    ]
    return sum(calls) if calls else None


def chromium_load(page: Path) -> float | None:
    """Seconds for headless Chromium to open ``page`` and dump its DOM (None without Chromium)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        return None
    profile = page.parent / f"profile-{os.getpid()}"
    cmd = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={profile}",
        "--dump-dom",
        page.as_uri(),
    ]
    t = time.perf_counter()
    subprocess.run(cmd, capture_output=True, timeout=300)
    seconds = time.perf_counter() - t
    shutil.rmtree(profile, ignore_errors=True)
    return seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, nargs="+", default=[1000, 10000, 100000])
    p.add_argument("--dir", default="/tmp/dje-bench-views")
    p.add_argument("--status-secs", type=float, default=2.0)
    p.add_argument("--report-mb", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-report", action="store_true")
    a = p.parse_args()
    misses = []
    status = [sys.executable, "-m", "data_juicer_elastic.cli", "status", "--job-dir"]
    for n in a.shards:
        t = time.perf_counter()
        job = build_job(Path(a.dir) / f"job-{n}", n)
        built = time.perf_counter() - t
        cmd = [*status, str(job.root)]
        times = sorted(timed(cmd)[0] for _ in range(a.rounds))
        best = times[len(times) // 2]
        print(
            f"status  {n:>7,} shards: {best:6.2f} s (median of {a.rounds}), {opens(cmd)} opens  [built in {built:.0f} s]"
        )
        if best > a.status_secs:
            misses.append(f"status of {n:,} shards took {best:.2f} s > {a.status_secs} s")
        if not a.no_report:
            out = Path(a.dir) / f"report-{n}.html"
            seconds, _ = timed(
                [
                    sys.executable,
                    "-m",
                    "data_juicer_elastic.cli",
                    "report",
                    "--job-dir",
                    str(job.root),
                    "--output",
                    str(out),
                ]
            )
            mb = out.stat().st_size / 1e6
            print(f"report  {n:>7,} shards: {seconds:6.2f} s to write, {mb:.2f} MB  ({out})")
            browser = chromium_load(out)
            if browser is not None:
                print(f"report  {n:>7,} shards: {browser:6.2f} s for headless Chromium to load it and dump the DOM")
            if mb > a.report_mb:
                misses.append(f"report of {n:,} shards is {mb:.1f} MB > {a.report_mb} MB")
    for m in misses:
        print("MISS", m)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
