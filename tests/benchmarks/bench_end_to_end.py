"""B1: end-to-end wall time of ``dj-process`` with elastic_shard against plain executor_type ray.

    python tests/benchmarks/bench_end_to_end.py [--rounds 3] [--rows 200000] [--shards 16] [--dir DIR] [--keep]
        [--parquet]

Generates deterministic JSONL (``{"text": ...}`` rows of short English-ish
text) and two recipes with the same process list
(whitespace_normalization_mapper, text_length_filter 10..10000):

  (a) executor_type: elastic_shard, elastic_shard.job_dir fresh per round, num_shards 16;
  (b) executor_type: ray, ray_address: local.

Each round runs ``dj-process --config a.yaml`` and ``dj-process --config b.yaml``
(alternating which goes first), each as a fresh subprocess with its own Ray,
offline, and times its wall seconds. Every run must exit 0 and the elastic
merged output must hold the same rows with the same values as the Ray output,
in input order (compared row by row, by each row's ``id``, with
tests/reference.py's rules). Prints per-round times, medians, the ratio
elastic/ray (target <= 1.15) and a markdown table row, and exits 1 when the
target is missed. Child CPU seconds are printed too: on a shared machine wall
times depend on what else runs.

With ``--parquet`` the same rows are written as a folder of Parquet files
(``PARQUET_FILES`` files of several row groups each, at least two per shard) and
both recipes read that folder: elastic_shard's shards are runs of its row groups
(read in place), Ray's loader reads it with ``ray.data.read_parquet`` (Data-Juicer's
RayLocalJsonDataLoadStrategy picks the reader from the folder's first file's
suffix). The exports stay JSONL and are compared as above.

Not collected by pytest (file name does not match test_*.py).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.reference
from tests.reference import assert_matches_reference, env_with, read_rows

TARGET = 1.15
DJ_PROCESS = str(Path(sys.executable).parent / "dj-process")
PROCESS = [{"whitespace_normalization_mapper": None}, {"text_length_filter": {"min_len": 10, "max_len": 10000}}]


PARQUET_FILES = 2


def generate(path: Path, rows: int) -> None:
    with open(path, "w") as f:
        for row in generate_rows(rows):
            f.write(json.dumps(row) + "\n")


def generate_parquet(folder: Path, rows: int, shards: int) -> None:
    """The rows of ``generate`` as ``PARQUET_FILES`` Parquet files in ``folder``, in id order by file name, with
    row groups small enough that every shard gets at least two."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    all_rows = list(generate_rows(rows))
    group = max(1, rows // (2 * max(shards, PARQUET_FILES)))
    per_file = -(-rows // PARQUET_FILES)
    for k in range(PARQUET_FILES):
        chunk = all_rows[k * per_file : (k + 1) * per_file]
        if chunk:
            table = pa.Table.from_pylist(chunk, schema=pa.schema([("id", pa.int64()), ("text", pa.string())]))
            pq.write_table(table, folder / f"part-{k:05d}.parquet", row_group_size=group)


def generate_rows(rows: int):
    rnd = random.Random(0)
    words = [
        "".join(rnd.choice("etaoinshrdlucmfwypvbgkjqxz"[: rnd.randint(8, 26)]) for _ in range(rnd.randint(1, 9)))
        for _ in range(3000)
    ]
    for i in range(rows):
        n = rnd.randint(1, 40)  # some rows fall under min_len 10 and are filtered
        sentence = " ".join(rnd.choice(words) for _ in range(n))
        if i % 7 == 0:
            sentence = "  " + sentence.replace(" ", "\u00a0 ", 3) + " \t"  # something for whitespace normalization
        yield {"id": i, "text": sentence.capitalize() + "."}


def count_rows(path: Path) -> int:
    """Lines of a JSONL file, or of all files in Ray's output folder."""
    files = (
        [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    )
    n = 0
    for f in files:
        with open(f, "rb") as fh:
            n += sum(1 for line in fh if line.strip())
    return n


def run(config: Path, cwd: Path, timeout: int) -> tuple[float, float, str]:
    env = env_with()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(
        [DJ_PROCESS, "--config", str(config)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    log = out.stdout + out.stderr
    if out.returncode != 0:
        sys.exit(f"{config.name}: dj-process exited {out.returncode}\n{log[-5000:]}")
    return wall, cpu, log


def b1_parser(doc: str | None, *, rounds: bool = True) -> argparse.ArgumentParser:
    """The arguments every B1-shaped benchmark takes: B1's rows, shards and prepare processes."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if rounds:
        ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--np", type=int, default=2)
    return ap


def main() -> None:
    ap = b1_parser(__doc__)
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a fresh temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (job dirs, outputs, logs)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per dj-process run")
    ap.add_argument("--parquet", action="store_true", help="both recipes read the rows as a folder of Parquet files")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")

    work = args.dir or Path(tempfile.mkdtemp(prefix="dje-b1-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / ("parquet" if args.parquet else "data.jsonl")
    t0 = time.perf_counter()
    if args.parquet:
        generate_parquet(data, args.rows, args.shards)
    else:
        generate(data, args.rows)
    size = sum(p.stat().st_size for p in data.iterdir()) if data.is_dir() else data.stat().st_size
    print(f"generated {args.rows} rows ({size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f}s at {data}", flush=True)

    base = {"dataset_path": str(data), "np": args.np, "process": PROCESS}
    times: dict[str, list[float]] = {"elastic": [], "ray": []}
    cpus: dict[str, list[float]] = {"elastic": [], "ray": []}
    try:
        for r in range(1, args.rounds + 1):
            rd = work / f"round{r}"
            rd.mkdir()
            a = rd / "a.yaml"
            a.write_text(
                yaml.safe_dump(
                    {
                        "project_name": f"b1-elastic-{r}",
                        **base,
                        "export_path": str(rd / "elastic" / "out.jsonl"),
                        "executor_type": "elastic_shard",
                        "elastic_shard": {"job_dir": str(rd / "job"), "num_shards": args.shards},
                    },
                    sort_keys=False,
                )
            )
            b = rd / "b.yaml"
            b.write_text(
                yaml.safe_dump(
                    {
                        "project_name": f"b1-ray-{r}",
                        **base,
                        "export_path": str(rd / "ray" / "out.jsonl"),
                        "executor_type": "ray",
                        "ray_address": "local",
                    },
                    sort_keys=False,
                )
            )
            order = [("elastic", a), ("ray", b)] if r % 2 else [("ray", b), ("elastic", a)]
            for name, cfg in order:
                wall, cpu, log = run(cfg, rd, args.timeout)
                (rd / f"{name}.log").write_text(log)
                times[name].append(wall)
                cpus[name].append(cpu)
            n_elastic = count_rows(rd / "elastic" / "out.jsonl")
            n_ray = count_rows(rd / "ray" / "out.jsonl")
            if n_elastic != n_ray or n_ray == 0:
                sys.exit(f"round {r}: elastic wrote {n_elastic} rows, ray wrote {n_ray}")
            try:
                merged, reference = read_rows(rd / "elastic" / "out.jsonl"), read_rows(rd / "ray" / "out.jsonl")
                assert_matches_reference(merged, reference, list(range(args.rows)))
            except AssertionError as exc:
                sys.exit(f"round {r}: the elastic output differs from the ray output: {exc}")
            print(
                f"round {r} ({order[0][0]} first): elastic {times['elastic'][-1]:.1f}s "
                f"(cpu {cpus['elastic'][-1]:.1f}s)  ray {times['ray'][-1]:.1f}s (cpu {cpus['ray'][-1]:.1f}s)  "
                f"ratio {times['elastic'][-1] / times['ray'][-1]:.3f}  rows out {n_ray}",
                flush=True,
            )
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    me, mr = statistics.median(times["elastic"]), statistics.median(times["ray"])
    ce, cr = statistics.median(cpus["elastic"]), statistics.median(cpus["ray"])
    ratio = me / mr
    print(f"median wall: elastic {me:.1f}s  ray {mr:.1f}s  ratio elastic/ray {ratio:.3f} (target <= {TARGET})")
    print(f"median child cpu: elastic {ce:.1f}s  ray {cr:.1f}s  ratio {ce / cr:.3f}")
    print(
        f"| B1{' Parquet' if args.parquet else ''} | {args.rows} rows, {args.shards} shards, np {args.np}, {args.rounds} rounds | "
        f"elastic {me:.1f}s / ray {mr:.1f}s | {ratio:.2f} | <= {TARGET} |"
    )
    if ratio > TARGET:
        sys.exit(f"B1 target missed: elastic/ray {ratio:.3f} > {TARGET}")


if __name__ == "__main__":
    main()
