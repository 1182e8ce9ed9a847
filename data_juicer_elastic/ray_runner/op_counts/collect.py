"""Rows in and out of every op of one attempt, and the rows an op error removed.

Data-Juicer's RayExecutor counts nothing per op (its default executor logs
"Left N samples"), and a ``.count()`` per op would run the pipeline again. So
the ops' own batch calls count (hooks) into per-process counters in a
node-local folder of the attempt (tally), and :func:`collect` sums them
into ``ops.json`` in the attempt dir, which status, verify and the report read.

Ops whose batches no hook sees (a Deduplicator or Pipeline runs its own Ray
stages; an adaptive-batching actor is not an op class) get their rows out
from their neighbours: the rows the next op counted in, or the shard's output
rows for the last op; ``None`` where neither is known.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from data_juicer_elastic.job.attempt_files import AttemptDir
from data_juicer_elastic.ray_runner.op_counts import tally
from data_juicer_elastic.storage.files import dumps_json

COUNT_ENV = "DJ_ELASTIC_COUNT_OPS"  # "0" turns the counting off (tests/benchmarks/bench_op_counts_paired.py)
_IN, _OUT, _ERR, _IN_CALLS, _OUT_CALLS = range(tally.WIDTH)


def enabled() -> bool:
    """Counting is on unless switched off, and Data-Juicer's methods it wraps are as expected."""
    if os.environ.get(COUNT_ENV, "1").strip() in ("0", "false", "no"):
        return False
    from data_juicer_elastic.patches.data_juicer import counting_ops

    return counting_ops()


def new_sink() -> str:
    """A node-local folder for one attempt's counters."""
    return tempfile.mkdtemp(prefix="dje-ops-")


def per_op(names: list[tuple[str, str]], counters: list[list[int]], rows_in: int, rows_out: int | None) -> list[dict]:
    """One record per op: rows in (the rows the op before let out), rows out, rows its errors removed,
    and whether its own calls counted its rows out (else they come from its neighbours)."""
    counters = counters + [[0] * tally.WIDTH] * (len(names) - len(counters))
    ops: list[dict] = []
    rows: int | None = rows_in
    for i, (name, kind) in enumerate(names):
        mine, after = counters[i], counters[i + 1] if i + 1 < len(names) else None
        if rows == 0:
            out: int | None = 0
        elif mine[_OUT_CALLS]:
            out = mine[_OUT]
        elif after is not None:
            out = after[_IN] if after[_IN_CALLS] else None
        else:
            out = rows_out
        counted = bool(mine[_OUT_CALLS])
        ops.append(
            {"op": name, "kind": kind, "rows_in": rows, "rows_out": out, "error_rows": mine[_ERR], "counted": counted}
        )
        rows = out
    return ops


def collect(sink: str, names: list[tuple[str, str]], rows_in: int, rows_out: int | None, attempt_dir: Path) -> dict:
    """Sum the counters into ``<attempt>/ops.json`` and drop the folder; returns the record."""
    counters = tally.read(sink)
    shutil.rmtree(sink, ignore_errors=True)
    ops = per_op(names, counters, rows_in, rows_out)
    if rows_out is None:
        rows_out = ops[-1]["rows_out"] if ops else rows_in
    record = {"rows_in": rows_in, "rows_out": rows_out, "error_rows": sum(o["error_rows"] for o in ops), "ops": ops}
    # Whole or absent (temp name, then rename), but not fsynced: the worker copies rows_in and error_rows
    # into the done record, which is; this spares each shard one more fsync on a busy shared disk.
    files = AttemptDir(attempt_dir)
    tmp = files.path / f".{files.OPS}.tmp"
    tmp.write_bytes(dumps_json(record))
    os.replace(tmp, files.ops)
    return record
