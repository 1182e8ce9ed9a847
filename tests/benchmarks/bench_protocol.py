"""Protocol benchmarks B5a, B5b, B6 and B9 (not a pytest module: run it directly).

    . .venv/bin/activate && python tests/benchmarks/bench_protocol.py [--rounds 3]

Every figure comes from real ``dj-elastic`` processes over jobs prepared in a
fresh temporary directory with deterministic data (``tests.jobs.write_corpus``).

B5a  protocol cost.  A job of 2,000 one-row shards (2,000 rows in all) is run by
     32 ``dj-elastic worker --runner tests.runners:copy`` processes.  Wall time
     runs from the first spawn until the last worker has exited; the figure is
     that wall time divided by the shard count (ms per shard).  Target <= 20 ms.
     The runner does almost nothing, so the figure is the claim/lease/publish
     protocol plus process start-up.  Each round prepares a new job.

B5b  status cost.  A 10,000-shard job is prepared and 32 copy workers run on it
     for a fixed time and are then interrupted, leaving a mix of done shards,
     stale claims (attempt directories without a done record) and untouched
     shards.  ``dj-elastic status --json --job-dir J`` is then timed as a
     subprocess (interpreter start-up included).  Target <= 1 s.

B6   balance.  4 workers with ``tests.runners:weighted``: worker i sleeps
     t_i = DJE_TEST_UNIT * w_i seconds per shard, with w = (4, 4, 2, 1), over a
     64-shard job.  Worker i completes 1/t_i shards per second, so a perfectly
     balanced run (fractional shards allowed, no overhead) takes

         ideal = 64 / sum_i(1 / t_i)

     seconds (with unit 0.6 s: 64 / (2 * (1/2.4) + 1/1.2 + 1/0.6) = 19.2 s).
     Makespan is the wall time from the first spawn until the last worker has
     exited; the figure is makespan / ideal.  Target <= 1.15.

     Each round runs the job with speculation on (``--speculation-min-secs``,
     default 1 s, as in B9: the target) and off (reported), one after the other,
     so B6 also checks that backups do not make a balanced run worse.

B9   stragglers.  4 workers with ``tests.runners:per_row`` over a 64-shard job of
     ``--b9-rows-per-shard`` rows each: every row costs DJE_TEST_ROW_COST = c
     seconds times the worker's weight.  Weights start at (1, 1, 10, 1); once 32
     shards are done the last worker's weight becomes 20 (it slows down inside its
     current shard).  With u = c * rows per shard, the fluid ideal is

         ideal = 32 / (3.1 / u) + 32 / (2.15 / u)

     (75.6 s for the default u = 20 rows * 0.15 s = 3 s).  Each round runs the same job twice, speculation on
     (``--speculation-min-secs``) and off (``--no-speculation``), side by side in
     time; the figure is makespan / ideal.  Target on <= 1.10; off is reported.

Each benchmark runs ``--rounds`` rounds (default 3) and reports the median.
Workers use short leases (heartbeat 0.5 s, lock timeout 3 s, poll 0.05 s).
Exit code 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.jobs import make_job, spawn_worker  # noqa: E402

FAST = {"heartbeat_secs": 0.5, "lock_timeout_secs": 3.0, "poll_interval_secs": 0.05, "max_retries": 2}


def run_workers(
    job,
    n: int,
    runner: str,
    envs: list[dict[str, str]] | None = None,
    timeout: float = 600.0,
    extra: tuple[str, ...] = (),
) -> tuple[float, list[int]]:
    """Spawn ``n`` workers (``extra`` on their command lines); seconds until all have exited, and their exit codes."""
    envs = envs or [{} for _ in range(n)]
    t0 = time.perf_counter()
    procs = [spawn_worker(job, runner, *extra, **envs[i]) for i in range(n)]
    deadline = t0 + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            raise RuntimeError(f"workers did not finish within {timeout}s") from None
    return time.perf_counter() - t0, [p.returncode for p in procs]


def check_all_done(job) -> None:
    done = len(job.done_ids())
    total = len(job.manifest().shards)
    if done != total:
        raise RuntimeError(f"only {done}/{total} shards done")


def bench_b5a(tmp: Path, rounds: int, shards: int, workers: int) -> list[float]:
    per_shard_ms = []
    for r in range(rounds):
        job = make_job(tmp / f"b5a-{r}", rows=shards, shards=shards, **FAST)
        wall, codes = run_workers(job, workers, "copy")
        check_all_done(job)
        ms = wall * 1000 / shards
        per_shard_ms.append(ms)
        print(
            f"B5a round {r + 1}: {workers} workers, {shards} shards, wall {wall:.2f} s, "
            f"{ms:.2f} ms/shard, exit codes {sorted(set(codes))}",
            flush=True,
        )
    return per_shard_ms


def bench_b5b(tmp: Path, rounds: int, shards: int, workers: int, run_secs: float) -> tuple[list[float], dict]:
    t = time.perf_counter()
    job = make_job(tmp / "b5b", rows=shards, shards=shards, **FAST)
    print(
        f"B5b: prepared {shards} shards in {time.perf_counter() - t:.1f} s; "
        f"running {workers} copy workers for {run_secs:.0f} s",
        flush=True,
    )
    procs = [spawn_worker(job, "copy") for _ in range(workers)]
    time.sleep(run_secs)
    for p in procs:  # a mix: some interrupted (released), some killed (stale claims left behind)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL if procs.index(p) % 2 else signal.SIGTERM)
    for p in procs:
        p.wait()
    cmd = [sys.executable, "-m", "data_juicer_elastic.cli", "status", "--json", "--job-dir", str(job.root)]
    times, summary = [], {}
    for r in range(max(rounds, 3)):
        t0 = time.perf_counter()
        res = subprocess.run(cmd, cwd=REPO, capture_output=True)
        dt = time.perf_counter() - t0
        if res.returncode not in (0, 1):
            raise RuntimeError(f"status failed ({res.returncode}): {res.stderr.decode()[-2000:]}")
        times.append(dt)
        st = json.loads(res.stdout)
        summary = {k: v for k, v in st.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
        print(f"B5b round {r + 1}: status --json {dt * 1000:.0f} ms (exit {res.returncode})", flush=True)
    done = len(job.done_ids())
    attempted = sum(1 for _ in job.attempts_dir.iterdir()) if job.attempts_dir.exists() else 0
    print(
        f"B5b job state: {done} done, {attempted - done} attempted but not done, "
        f"{shards - attempted} never attempted; status scalars: {summary}",
        flush=True,
    )
    return times, {"done": done, "attempted": attempted}


def bench_b6(
    tmp: Path, rounds: int, shards: int, unit: float, weights: tuple[float, ...], min_secs: float
) -> dict[str, list[float]]:
    """Speculation on (the target) and off (reported), one after the other in each round."""
    ideal = shards / sum(1 / (unit * w) for w in weights)
    ratios: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(rounds):
        for mode, extra in speculation_modes(min_secs).items():
            job = make_job(tmp / f"b6-{r}-{mode}", rows=shards, shards=shards, **FAST)
            envs = [
                {"DJE_TEST_UNIT": str(unit), "DJE_TEST_WEIGHT": str(w), "DJ_ELASTIC_HOSTNAME": f"b6-node-{i}"}
                for i, w in enumerate(weights)
            ]
            makespan, codes = run_workers(job, len(weights), "weighted", envs, extra=extra)
            check_all_done(job)
            ratios[mode].append(makespan / ideal)
            print(
                f"B6 round {r + 1} speculation {mode}: makespan {makespan:.2f} s, ideal {ideal:.2f} s, "
                f"ratio {makespan / ideal:.3f}, shards won by a backup {backups_won(job)}, "
                f"exit codes {sorted(set(codes))}",
                flush=True,
            )
    return ratios


def speculation_modes(min_secs: float) -> dict[str, tuple[str, ...]]:
    return {"on": ("--speculation-min-secs", str(min_secs)), "off": ("--no-speculation",)}


def backups_won(job) -> int:
    return sum(
        1
        for n in os.listdir(job.done_dir)
        if n.endswith(".json") and json.loads((job.done_dir / n).read_bytes()).get("backup") is True
    )


def b9_ideal(shards: int, u: float, before: tuple[float, ...], after: tuple[float, ...], at: int) -> float:
    """Fluid makespan: every worker works all the time at its speed, fractions of shards allowed."""
    return at / sum(1 / (u * w) for w in before) + (shards - at) / sum(1 / (u * w) for w in after)


def bench_b9(tmp: Path, rounds: int, rows_per_shard: int, row_cost: float, min_secs: float) -> dict[str, list[float]]:
    shards, at = 64, 32
    before, after = (1.0, 1.0, 10.0, 1.0), (1.0, 1.0, 10.0, 20.0)
    ideal = b9_ideal(shards, row_cost * rows_per_shard, before, after, at)
    ratios: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(rounds):
        for mode, extra in speculation_modes(min_secs).items():
            job = make_job(tmp / f"b9-{r}-{mode}", rows=shards * rows_per_shard, shards=shards, **FAST)
            envs = [
                {"DJE_TEST_ROW_COST": str(row_cost), "DJE_TEST_WEIGHT": str(w), "DJ_ELASTIC_HOSTNAME": f"b9-node-{i}"}
                for i, w in enumerate(before)
            ]
            envs[3].update(DJE_TEST_WEIGHT_LATER=str(after[3]), DJE_TEST_SLOW_AT=str(at))
            makespan, codes = run_workers(job, len(before), "per_row", envs, extra=extra)
            check_all_done(job)
            backups = backups_won(job)
            ratios[mode].append(makespan / ideal)
            print(
                f"B9 round {r + 1} speculation {mode}: makespan {makespan:.2f} s, ideal {ideal:.2f} s, "
                f"ratio {makespan / ideal:.3f}, shards won by a backup {backups}, exit codes {sorted(set(codes))}",
                flush=True,
            )
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", nargs="+", choices=["B5a", "B5b", "B6", "B9"], default=["B5a", "B5b", "B6", "B9"])
    ap.add_argument("--b5a-shards", type=int, default=2000)
    ap.add_argument("--b5a-workers", type=int, default=32)
    ap.add_argument("--b5b-shards", type=int, default=10000)
    ap.add_argument("--b5b-run-secs", type=float, default=30.0)
    ap.add_argument("--b6-unit", type=float, default=0.6)
    ap.add_argument("--b6-shards", type=int, default=64)
    ap.add_argument("--b9-rows-per-shard", type=int, default=20)
    ap.add_argument("--b9-row-cost", type=float, default=0.15, help="seconds per row at weight 1")
    ap.add_argument("--speculation-min-secs", type=float, default=1.0, help="B6 and B9 workers (speculation on)")
    a = ap.parse_args()
    weights = (4.0, 4.0, 2.0, 1.0)
    rows = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dje-bench-protocol-") as d:
        tmp = Path(d)
        if "B5a" in a.only:
            ms = statistics.median(bench_b5a(tmp, a.rounds, a.b5a_shards, a.b5a_workers))
            rows.append(
                (
                    "B5a",
                    f"wall ms per shard, {a.b5a_workers} copy workers, {a.b5a_shards} one-row shards",
                    f"{ms:.2f} ms",
                    "<= 20 ms",
                    ms <= 20,
                )
            )
        if "B5b" in a.only:
            times, state = bench_b5b(tmp, a.rounds, a.b5b_shards, 32, a.b5b_run_secs)
            s = statistics.median(times)
            rows.append(
                (
                    "B5b",
                    f"`status --json` wall time, {a.b5b_shards} shards ({state['done']} done)",
                    f"{s:.3f} s",
                    "<= 1 s",
                    s <= 1.0,
                )
            )
        if "B6" in a.only:
            b6 = bench_b6(tmp, a.rounds, a.b6_shards, a.b6_unit, weights, a.speculation_min_secs)
            on, off = statistics.median(b6["on"]), statistics.median(b6["off"])
            what = f"makespan / ideal, 4 workers at speed 1/4:1/4:1/2:1, {a.b6_shards} shards"
            rows.append(("B6", what + ", speculation on", f"{on:.3f}", "<= 1.15", on <= 1.15))
            rows.append(("B6", what + ", speculation off", f"{off:.3f}", "reported", True))
        if "B9" in a.only:
            b9 = bench_b9(tmp, a.rounds, a.b9_rows_per_shard, a.b9_row_cost, a.speculation_min_secs)
            on, off = statistics.median(b9["on"]), statistics.median(b9["off"])
            what = "makespan / ideal, 4 workers over 64 shards, one 10x slower, one 20x slower from half way"
            rows.append(("B9", what + ", speculation on", f"{on:.3f}", "<= 1.10", on <= 1.10))
            rows.append(("B9", what + ", speculation off", f"{off:.3f}", "reported", True))
    print(f"\ntotal run time {time.perf_counter() - t_start:.0f} s, rounds {a.rounds}\n")
    print("| id | measures | median | target |")
    print("|---|---|---|---|")
    for rid, what, med, target, ok in rows:
        print(f"| {rid} | {what} | {med} | {target} ({'met' if ok else 'MISSED'}) |")
    missed = [rid for rid, *_, ok in rows if not ok]
    if missed:
        print(f"target missed: {', '.join(missed)}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
