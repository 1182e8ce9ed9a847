"""Prepare of Parquet (``--files`` files of ~22 MB, row groups of 20,000 rows) against reading it once with pyarrow.

    python tests/benchmarks/bench_prepare_parquet.py [WORK_DIR] [--files 9]   (default /tmp/dje-bench-parquet)

9 files are about 200 MB; 90 files about 2 GB (the issue's figure).

Prepare reads the footers, hashes every byte once (the shard sources' digests) and writes one small
descriptor per shard; pyarrow's read_table decodes every row.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.prep_helpers import request, run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", nargs="?", default="/tmp/dje-bench-parquet")
    ap.add_argument("--files", type=int, default=9)
    a = ap.parse_args()
    work = Path(a.work)
    root = work / "data"
    if not root.exists() or len(os.listdir(root)) != a.files:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        rng = np.random.default_rng(0)
        for f in range(a.files):
            n = 200_000
            raw = rng.integers(0, 2**63, size=(n, 6), dtype=np.int64)
            text = pa.array([r.tobytes().hex() for r in raw])
            t = pa.table({"id": np.arange(f * n, (f + 1) * n), "text": text, "x": rng.random(n)})
            pq.write_table(t, root / f"p{f}.parquet", row_group_size=20_000)
    size = sum(p.stat().st_size for p in root.iterdir())
    print(f"input {size / 1e6:.1f} MB, {len(os.listdir(root))} files")
    for rep in range(2):
        t0 = time.perf_counter()
        table = pq.read_table(root)
        t_read = time.perf_counter() - t0
        num_rows = table.num_rows
        shutil.rmtree(work / "job", ignore_errors=True)
        t0 = time.perf_counter()
        run(request(root, work / "job", 16))
        t_prep = time.perf_counter() - t0
        written = sum(p.stat().st_size for p in (work / "job").rglob("*") if p.is_file())
        del table
        print(
            f"rep {rep}: pyarrow read_table {t_read:.3f} s ({num_rows} rows); "
            f"prepare 16 shards {t_prep:.3f} s; ratio {t_prep / t_read:.2f}; "
            f"job dir bytes written per input byte {written / size:.6f}"
        )


if __name__ == "__main__":
    main()
