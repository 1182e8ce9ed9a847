"""B7 (warm models across shards) and B8 (idle gap between shards).

    python tests/benchmarks/bench_warm.py b7 [--rounds 1] [--rows 16000] [--shards 8] [--load-secs 3] [--baseline DIR]
    python tests/benchmarks/bench_warm.py b8 [--rows 200000] [--shards 16]

B7: a model-backed op (tests/ops/slow_model_ops.py: its "model" loads in
``--load-secs`` on first use and records each load), ``ray_execution_mode:
actor``, ``num_proc: 1``, over ``--rows`` rows: ``dj-process`` with
elastic_shard (``--shards`` shards, one node) against plain ``executor_type:
ray``, each a fresh subprocess with its own Ray, each going first in turn.
``--baseline DIR`` adds a third run per round, the elastic executor of the
checkout at DIR (e.g. a ``git worktree`` of an earlier commit), so before and
after are measured side by side on the same machine state.
Prints wall times, the ratio elastic/ray (target <= 1.10) and the model loads
of each run (target: elastic loads == the op's concurrency, 1).

B8: B1's data and ops (200,000 rows, 16 shards: whitespace_normalization_mapper,
text_length_filter), one worker in this process (``run_worker`` with
``RayShardRunner``, prefetch at its default where the code has it). The
processing of a shard is timed from the construction of its RayExecutor to
the end of ``RayExecutor.run`` (the same two points on any version of this
code); the gap is the next shard's start minus this one's end. Prints the
median gap over the shards, the median processing time, and their ratio
(target < 5%).

The code measured is whatever ``data_juicer_elastic`` imports: to measure
another checkout, put it first on PYTHONPATH. Exits 1 if a target is missed.
Not collected by pytest.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_end_to_end import DJ_PROCESS, PROCESS, count_rows, generate  # noqa: E402

from tests.reference import OFFLINE  # noqa: E402  (bench_end_to_end put the repository root on sys.path)

OPS = HERE.parent / "ops" / "slow_model_ops.py"
B7_TARGET, B8_TARGET = 1.10, 0.05


def _op(loads: Path, load_secs: float) -> dict:
    return {
        "slow_model_mapper": {
            "loads_file": str(loads),
            "load_secs": load_secs,
            "ray_execution_mode": "actor",
            "num_proc": 1,
        }
    }


def _dj_process(config: Path, log: Path, pythonpath: str | None = None) -> float:
    env = {**os.environ, **OFFLINE}
    if pythonpath:  # the elastic executor of another checkout (its package shadows the installed one)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run([DJ_PROCESS, "--config", str(config)], env=env, stdout=out, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if code.returncode != 0:
        sys.exit(f"dj-process --config {config} exited {code.returncode}; see {log}")
    return wall


def b7(a: argparse.Namespace, tmp: Path) -> bool:
    data = tmp / "input.jsonl"
    generate(data, a.rows)
    kinds = ["elastic", "ray"] + (["baseline"] if a.baseline else [])
    walls: dict[str, list[float]] = {k: [] for k in kinds}
    loads: dict[str, list[int]] = {k: [] for k in kinds}
    for r in range(a.rounds):
        for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:  # each kind goes first in turn
            run = tmp / f"{kind}-{r}"
            run.mkdir()
            record = run / "loads.txt"
            recipe = {
                "project_name": f"b7-{kind}",
                "dataset_path": str(data),
                "export_path": str(run / "out.jsonl"),
                "custom_operator_paths": [str(OPS)],
                "process": [_op(record, a.load_secs)],
            }
            if kind == "ray":
                recipe.update(executor_type="ray", ray_address="local")
            else:
                recipe.update(
                    executor_type="elastic_shard", elastic_shard={"job_dir": str(run / "job"), "num_shards": a.shards}
                )
            config = run / "recipe.yaml"
            config.write_text(yaml.safe_dump(recipe))
            wall = _dj_process(config, run / "log.txt", a.baseline if kind == "baseline" else None)
            rows = count_rows(run / "out.jsonl")
            if rows != a.rows:
                sys.exit(f"{kind} round {r}: {rows} output rows, expected {a.rows}")
            walls[kind].append(wall)
            loads[kind].append(len(record.read_text().splitlines()))
            print(f"round {r} {kind:8s} wall {wall:6.1f}s model loads {loads[kind][-1]}", flush=True)
    ratio, pairs = _ratios(walls, "elastic")
    ok = ratio <= B7_TARGET and all(n == 1 for n in loads["elastic"])
    print(
        f"B7 elastic/ray wall {ratio:.2f} (target <= {B7_TARGET}; median of rounds {pairs:.2f}); median elastic "
        f"{statistics.median(walls['elastic']):.1f}s, ray {statistics.median(walls['ray']):.1f}s; model loads "
        f"elastic {loads['elastic']} ray {loads['ray']} (target: elastic == 1) -> {'PASS' if ok else 'FAIL'}"
    )
    if a.baseline:
        base, base_pairs = _ratios(walls, "baseline")
        print(
            f"baseline ({a.baseline}) elastic/ray wall {base:.2f} (median of rounds {base_pairs:.2f}); median "
            f"{statistics.median(walls['baseline']):.1f}s; model loads {loads['baseline']}"
        )
    return ok


def _ratios(walls: dict[str, list[float]], kind: str) -> tuple[float, float]:
    """``kind``'s wall against ray's: median over median, and the median of the rounds' own ratios."""
    over_medians = statistics.median(walls[kind]) / statistics.median(walls["ray"])
    of_rounds = statistics.median(k / r for k, r in zip(walls[kind], walls["ray"], strict=True))
    return over_medians, of_rounds


def _time_executor(spans: list[list[float]]) -> None:
    """Record (start, end) of each shard's processing: RayExecutor() to the end of RayExecutor.run."""
    from data_juicer.core.executor import ray_executor

    cls = ray_executor.RayExecutor
    init, run = cls.__init__, cls.run

    def timed_init(self, *args, **kwargs):
        spans.append([time.monotonic(), 0.0])
        init(self, *args, **kwargs)

    def timed_run(self, *args, **kwargs):
        try:
            return run(self, *args, **kwargs)
        finally:
            spans[-1][1] = time.monotonic()

    cls.__init__, cls.run = timed_init, timed_run


def b8(a: argparse.Namespace, tmp: Path) -> bool:
    import inspect

    from data_juicer_elastic.job.manifest import Policy
    from data_juicer_elastic.prepare.driver import PrepareRequest, prepare
    from data_juicer_elastic.ray_runner.runner import RayShardRunner
    from data_juicer_elastic.worker.loop import run_worker

    os.environ.update(OFFLINE)
    data = tmp / "input.jsonl"
    generate(data, a.rows)
    recipe = yaml.safe_dump({"project_name": "b8", "process": PROCESS}).encode()
    policy = Policy(num_shards=a.shards, lock_timeout_secs=300, heartbeat_secs=10, poll_interval_secs=1)
    prepare(PrepareRequest(str(data), str(tmp / "job"), recipe, policy), log=lambda *_: None)
    spans: list[list[float]] = []
    _time_executor(spans)
    options = {"prefetch": 1} if "prefetch" in inspect.signature(run_worker).parameters else {}
    runner = RayShardRunner()
    try:
        result = run_worker(tmp / "job", runner, log=lambda *_: None, **options)
    finally:
        runner.close()
    if result.exit_code != 0 or len(spans) != a.shards:
        sys.exit(f"worker exit {result.exit_code} ({result.message}); {len(spans)} shards timed")
    gaps = [nxt[0] - cur[1] for cur, nxt in itertools.pairwise(spans)]
    runs = [end - start for start, end in spans]
    ratio = statistics.median(gaps) / statistics.median(runs)
    ok = ratio < B8_TARGET
    print(f"gaps (s): {' '.join(f'{g:.3f}' for g in gaps)}")
    print(
        f"B8 median gap {statistics.median(gaps) * 1000:.0f} ms, median processing {statistics.median(runs):.2f}s "
        f"per shard of {a.rows // a.shards} rows: gap/processing {ratio:.1%} (target < {B8_TARGET:.0%}), "
        f"prefetch {options.get('prefetch', 'n/a')} -> {'PASS' if ok else 'FAIL'}"
    )
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("which", choices=["b7", "b8"])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--shards", type=int, default=None)
    p.add_argument("--load-secs", type=float, default=3.0)
    p.add_argument("--dir", default=None)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--baseline", default=None, help="b7: also run the elastic executor of this checkout's root")
    a = p.parse_args()
    a.rows = a.rows or (16000 if a.which == "b7" else 200000)
    a.shards = a.shards or (8 if a.which == "b7" else 16)
    tmp = Path(a.dir or tempfile.mkdtemp(prefix=f"dje-{a.which}-"))
    tmp.mkdir(parents=True, exist_ok=True)
    print(f"code: {__import__('data_juicer_elastic').__file__}", flush=True)
    try:
        ok = b7(a, tmp) if a.which == "b7" else b8(a, tmp)
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
