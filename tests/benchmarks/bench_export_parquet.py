"""Parquet exports (issue 34), side by side; not a pytest module.

    python tests/benchmarks/bench_export_parquet.py [--mb 200] [--shards 16] [--rounds 3]

Each shard gets a done record and the processed.parquet + sidecar a Parquet-exporting runner writes.
P1: ``merge(job, "x.parquet")`` vs pyarrow reading the same part files and writing one file
(``pq.ParquetWriter``, no checks): ratio = pyarrow s / merge s, target >= 0.8.
P2: ``merge(job, "parts/")`` (parts linked, all one schema) vs P1's merge: ratio = folder s / file s, target <= 0.02.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from data_juicer_elastic.job.layout import JobDir  # noqa: E402
from data_juicer_elastic.merge import merge  # noqa: E402
from data_juicer_elastic.parquet_out import OUTPUT, SIDECAR, write_shard_parquet  # noqa: E402
from tests.prep_helpers import fake_done, request, run, write_rows  # noqa: E402


def build(root: Path, mb: int, shards: int) -> JobDir:
    write_rows(root / "ds" / "a.jsonl", [{"id": i, "text": "x"} for i in range(shards * 4)])
    run(request(root / "ds", root / "job", shards))
    job = JobDir(root / "job")
    per = mb * 1_000_000 // shards // 200
    for spec in job.manifest().shards:
        out = fake_done(job, spec.id)
        ids = pa.array(range(per), pa.int64())
        text = pa.array([f"row {i} " + "lorem ipsum dolor " * 9 for i in range(per)])
        meta = pa.array([{"w": i / 7, "tags": ["a", "b"]} for i in range(per)])
        write_shard_parquet(pa.table({"id": ids, "text": text, "meta": meta}), out.parent, None)
        side = out.with_name(SIDECAR)  # the fake done record counts the shard's rows: the sidecar must agree
        side.write_bytes(orjson.dumps({**orjson.loads(side.read_bytes()), "rows": out.read_bytes().count(b"\n")}))
    return job


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dje-bench-pq-"))
    try:
        job = build(root, a.mb, a.shards)
        parts = [job.attempt_output(s.id, 1).with_name(OUTPUT) for s in job.manifest().shards]
        times: dict[str, list[float]] = {"merge": [], "pyarrow": [], "folder": []}
        for _ in range(a.rounds):
            t = time.perf_counter()
            merge(job, str(root / "m.parquet"), overwrite=True, log=lambda *_: None)
            times["merge"].append(time.perf_counter() - t)
            t = time.perf_counter()
            with pq.ParquetWriter(root / "p.parquet", pq.read_schema(parts[0])) as w:
                for p in parts:
                    f = pq.ParquetFile(p)
                    for i in range(f.num_row_groups):
                        w.write_table(f.read_row_group(i))
            with open(root / "p.parquet", "rb+") as fh:
                os.fsync(fh.fileno())
            times["pyarrow"].append(time.perf_counter() - t)
            shutil.rmtree(root / "parts", ignore_errors=True)
            t = time.perf_counter()
            merge(job, str(root / "parts"), overwrite=True, log=lambda *_: None)
            times["folder"].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        size = os.path.getsize(root / "m.parquet") / 1e6
        print(f"{a.shards} shards, {size:.0f} MB of Parquet, {a.rounds} rounds, medians: {med}")
        p1, p2 = med["pyarrow"] / med["merge"], med["folder"] / med["merge"]
        print(f"P1 one-file merge vs pyarrow rewrite: ratio {p1:.2f} (target >= 0.8)")
        print(f"P2 folder export vs one-file merge: ratio {p2:.4f} (target <= 0.02)")
        return 0 if p1 >= 0.8 and p2 <= 0.02 else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
