"""B1c: what counting rows per op costs B1 (``dj-process`` elastic_shard, 16 shards).

    python tests/benchmarks/bench_op_counts.py [--rounds 3] [--rows 200000] [--shards 16]

Runs B1's elastic recipe (see bench_end_to_end.py) twice per round, with the
per-op counting on (the default) and off (``DJ_ELASTIC_COUNT_OPS=0``),
alternating which goes first, each a fresh ``dj-process`` with its own Ray.
Prints the wall times and the summed attempt times (done records'
finished_at - started_at: the shards' own work, without Ray start-up), and
their median ratios on/off; exits 1 if the attempt-time ratio exceeds 1.02.
On a busy machine, look at the spread between rounds before trusting 2%.

Not collected by pytest (file name does not match test_*.py).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from bench_end_to_end import PROCESS, b1_parser, count_rows, generate, run

TARGET = 1.02


def attempt_seconds(job: Path) -> float:
    total = 0.0
    for rec in (job / "state" / "done").glob("*.json"):
        d = json.loads(rec.read_text())
        total += d["finished_at"] - d["started_at"]
    return total


def one_run(rd: Path, data: Path, shards: int, np_: int, counting: bool) -> tuple[float, float, int]:
    name = "on" if counting else "off"
    cfg = rd / f"{name}.yaml"
    recipe = {
        "project_name": f"b1c-{name}",
        "dataset_path": str(data),
        "np": np_,
        "process": PROCESS,
        "export_path": str(rd / name / "out.jsonl"),
        "executor_type": "elastic_shard",
        "elastic_shard": {"job_dir": str(rd / f"job-{name}"), "num_shards": shards},
    }
    cfg.write_text(yaml.safe_dump(recipe, sort_keys=False))
    os.environ["DJ_ELASTIC_COUNT_OPS"] = "1" if counting else "0"
    wall, _cpu, log = run(cfg, rd, 1800)
    (rd / f"{name}.log").write_text(log)
    has_counts = any((rd / f"job-{name}").glob("attempts/*/*/ops.json"))
    if has_counts != counting:
        sys.exit(f"{name}: ops.json {'missing' if counting else 'written'}")
    return wall, attempt_seconds(rd / f"job-{name}"), count_rows(rd / name / "out.jsonl")


def main() -> None:
    args = b1_parser(__doc__).parse_args()
    work = Path(tempfile.mkdtemp(prefix="dje-b1c-"))
    wall: dict[bool, list[float]] = {True: [], False: []}
    busy: dict[bool, list[float]] = {True: [], False: []}
    try:
        data = work / "data.jsonl"
        generate(data, args.rows)
        for r in range(1, args.rounds + 1):
            rd = work / f"round{r}"
            rd.mkdir()
            rows = {}
            for counting in (True, False) if r % 2 else (False, True):
                w, b, rows[counting] = one_run(rd, data, args.shards, args.np, counting)
                wall[counting].append(w)
                busy[counting].append(b)
            if rows[True] != rows[False]:
                sys.exit(f"round {r}: {rows[True]} rows with counting, {rows[False]} without")
            print(
                f"round {r}: counting on {wall[True][-1]:.1f}s wall / {busy[True][-1]:.1f}s in attempts; "
                f"off {wall[False][-1]:.1f}s / {busy[False][-1]:.1f}s",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rw = statistics.median(wall[True]) / statistics.median(wall[False])
    rb = statistics.median(busy[True]) / statistics.median(busy[False])
    print(f"median ratio on/off: wall {rw:.3f}, attempt time {rb:.3f} (target <= {TARGET})")
    print(f"| B1c | {args.rows} rows, {args.shards} shards, {args.rounds} rounds | wall {rw:.3f} | attempts {rb:.3f} |")
    sys.exit(0 if rb <= TARGET else 1)


if __name__ == "__main__":
    main()
