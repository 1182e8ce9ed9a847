"""B1c (paired): the per-op counting's cost per shard, measured inside one worker.

    python tests/benchmarks/bench_op_counts_paired.py [--rows 200000] [--shards 16] [--repeats 3]

Wall times of whole ``dj-process`` runs on a shared machine swing by 30% from
one run to the next, far more than the 2% this is about. So this runs B1's
recipe and shards (see bench_end_to_end.py) through one ``RayShardRunner``
(one Ray runtime, warm) and runs every shard with the counting on and off
back to back, alternating which goes first, ``--repeats`` times. Load drifts
alike for both halves of a pair; the ratio of the summed times on/off is the
counting's cost. Exits 1 above 1.02.

Not collected by pytest (file name does not match test_*.py).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from bench_end_to_end import PROCESS, b1_parser, generate

from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare
from data_juicer_elastic.ray_runner.op_counts.collect import COUNT_ENV
from data_juicer_elastic.ray_runner.runner import RayShardRunner

TARGET = 1.02


def timed_run(runner: RayShardRunner, job: JobDir, sid: str, tag: str, counting: bool) -> float:
    os.environ[COUNT_ENV] = "1" if counting else "0"
    adir = job.root / "bench" / sid / tag
    adir.mkdir(parents=True)
    t0 = time.perf_counter()
    runner.run(str(job.shard_file(sid)), str(adir / "processed.jsonl"), str(job.gen_dir))  # names the generation
    seconds = time.perf_counter() - t0
    if (adir / "ops.json").exists() != counting:
        sys.exit(f"{sid} {tag}: ops.json {'missing' if counting else 'written'}")
    return seconds


def main() -> None:
    ap = b1_parser(__doc__, rounds=False)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dje-b1c-"))
    runner = RayShardRunner()
    try:
        generate(work / "data.jsonl", args.rows)
        recipe = {"project_name": "b1c", "executor_type": "ray", "np": args.np, "process": PROCESS}
        req = PrepareRequest(
            dataset_path=str(work / "data.jsonl"),
            job_dir=str(work / "job"),
            recipe_text=yaml.safe_dump(recipe).encode(),
            policy=Policy(num_shards=args.shards),
        )
        prepare(req, log=lambda *_: None)
        job = JobDir(req.job_dir)
        shards = [s.id for s in job.manifest().shards]
        timed_run(runner, job, shards[0], "warm-up", True)  # Ray and worker start-up are not the counting's
        on, off = [], []
        for r in range(args.repeats):
            for i, sid in enumerate(shards):
                first = (i + r) % 2 == 0
                for counting in (first, not first):
                    seconds = timed_run(runner, job, sid, f"{r}-{int(counting)}", counting)
                    (on if counting else off).append(seconds)
            ratio = sum(on) / sum(off)
            print(f"repeat {r + 1}: on {sum(on):.2f}s, off {sum(off):.2f}s so far, ratio {ratio:.4f}", flush=True)
    finally:
        runner.close()
        shutil.rmtree(work, ignore_errors=True)
    ratio = sum(on) / sum(off)
    med = statistics.median(a / b for a, b in zip(on, off, strict=True))
    print(f"per-shard seconds: on median {statistics.median(on):.3f}, off median {statistics.median(off):.3f}")
    print(f"ratio on/off: summed {ratio:.4f}, median of pairs {med:.4f} (target <= {TARGET})")
    sys.exit(0 if ratio <= TARGET else 1)


if __name__ == "__main__":
    main()
