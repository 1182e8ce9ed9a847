"""B12s with every worker under ``strace -f -ttt``: path calls on the job dir per shard, per tenth of the run.

Diagnoses a last tenth slower than the first over sshfs: which folders' calls grow. Counts the calls that
name a path under the job dir (descriptor calls are left out), by call and folder, in each tenth of the
shards' finish times.

    python tests/benchmarks/trace_b12s.py [--shards 4000] [--workers 16] [--no-trace] DIR
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.benchmarks.bench_scale import FAST, done_times, tenth_ratio  # noqa: E402
from tests.chaos.sshfs import SshfsPair  # noqa: E402
from tests.jobs import make_job, spawn, worker_cmd  # noqa: E402

CALL = re.compile(r"^\d+\s+(\d+\.\d+)\s+(\w+)\(")


def folder_of(rest: str) -> str:
    """The job-relative folder a traced path names, shard names and digits folded."""
    path = re.sub(r"part-\d+-of-\d+", "P", rest.split('"')[0])
    return re.sub(r"\d+", "N", "/".join(path.strip("/").split("/")[:4]))


def count(traces: list[Path], root: str, edges: list[float]) -> list[collections.Counter]:
    tenths = [collections.Counter() for _ in range(10)]
    for trace in traces:
        for line in open(trace, errors="replace"):
            m = CALL.match(line) if root in line else None
            if not m or float(m.group(1)) < edges[0]:
                continue
            k = next((j for j in range(10) if float(m.group(1)) <= edges[j + 1]), None)
            if k is not None:
                tenths[k][(m.group(2), folder_of(line.split(root, 1)[1]))] += 1
    return tenths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--shards", type=int, default=4000)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--no-trace", action="store_true")
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    pair = SshfsPair(a.dir / "sshfs")
    reason = pair.unavailable()
    if reason:
        print(f"skipped: {reason}")
        return 0
    pair.start()
    try:
        job = make_job(a.dir / "b", rows=a.shards, shards=a.shards, job_dir=pair.mounts[0] / "job", **FAST)
        traces = [a.dir / f"trace-{i}" for i in range(a.workers)]
        procs = []
        for i in range(a.workers):
            cmd = worker_cmd(job, "copy")
            if not a.no_trace:
                calls = ["-e", "trace=%file,%desc", "-e", "signal=none", "-o", str(traces[i])]
                cmd = ["strace", "-f", "-qq", "-ttt", *calls, *cmd]
            procs.append(spawn(cmd, DJ_ELASTIC_HOSTNAME=f"sim-node-{i:03d}", log=a.dir / f"w{i}.log"))
        started = time.time()
        codes = sorted({p.wait() for p in procs})
        times = done_times(job)
        first, last, ratio = tenth_ratio(times)
        print(
            f"wall {time.time() - started:.1f}s, exit codes {codes}; first tenth {first * 1000:.2f} ms/shard, "
            f"last {last * 1000:.2f}, ratio {ratio:.2f}"
        )
        if a.no_trace:
            return 0
        n = len(times)
        edges = [times[0]] + [times[min(n - 1, (k + 1) * n // 10 - 1)] for k in range(10)]
        tenths = count(traces, str(job.root), edges)
        for k, calls in enumerate(tenths):
            print(f"tenth {k}: {sum(calls.values()) / (n / 10):.1f} calls a shard")
        for k in (1, 9):
            print(f"tenth {k}, the largest:")
            for key, c in tenths[k].most_common(12):
                print(f"    {c / (n / 10):6.2f}  {key}")
    finally:
        pair.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
