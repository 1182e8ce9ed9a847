"""What loading the manifest costs a process: seconds and resident memory, at 1,000 and 100,000 shards.

    python tests/benchmarks/bench_manifest.py [--shards 1000 100000] [--dir /tmp/dje-bench-manifest] [--rounds 3]

Not a pytest module. Each job dir is synthetic (``synthetic.synthetic_job``: one-row shards, kept
under --dir for the next run). Each round is a fresh Python process that imports the worker, then
loads the manifest as a worker does (``JobDir.manifest()`` and the claim order's shard ids) and
reads one shard's spec; it reports the load's wall time and the process's resident memory before
and after. Prints the ratio of the largest job to the smallest, per shard and in all.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PROBE = """
import json, sys, time
def rss():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024
import data_juicer_elastic.worker.loop  # what a worker has imported before it loads the manifest
from data_juicer_elastic.job.layout import JobDir
before, t = rss(), time.perf_counter()
job = JobDir(sys.argv[1])
ids = job.manifest().shards.ids()
spec = job.shard(ids[len(ids) * 7 // 9])
print(json.dumps({"seconds": time.perf_counter() - t, "before": before, "after": rss()}))
"""


def measure(root: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(root)], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    return json.loads(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, nargs="+", default=[1000, 100000])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/dje-bench-manifest"))
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    from tests.benchmarks.synthetic import synthetic_job

    figures = {}
    for n in a.shards:
        root = a.dir / f"job-{n}"
        if not (root / "manifest.json").exists():
            synthetic_job(root, n)
        runs = [measure(root) for _ in range(a.rounds)]
        seconds = statistics.median(r["seconds"] for r in runs)
        grew = statistics.median(r["after"] - r["before"] for r in runs)
        figures[n] = seconds, grew
        print(f"{n:>7,} shards: load {seconds:.3f} s, resident memory +{grew:.1f} MB (median of {a.rounds})")
    small, big = min(figures), max(figures)
    (s0, m0), (s1, m1) = figures[small], figures[big]
    print(
        f"{big:,} vs {small:,} shards: load time x{s1 / s0:.1f}, memory x{m1 / max(m0, 0.1):.1f} (shards x{big / small:.0f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
