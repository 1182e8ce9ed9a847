"""Rows in and out of every op of one attempt, and the rows an op error removed.

Data-Juicer's RayExecutor counts nothing per op (its default executor logs
"Left N samples"), and a ``.count()`` per op would run the pipeline again. So
the ops' own batch calls count (count_hooks) into per-process counters in a
node-local folder of the attempt (op_tally), and :func:`collect` sums them
into ``ops.json`` in the attempt dir, which status, verify and the report read.

Ops whose batches no hook sees (a Deduplicator or Pipeline runs its own Ray
stages; an adaptive-batching actor is not an op class) get their rows out
from their neighbours: the rows the next op counted in, or the shard's output
rows for the last op; ``None`` where neither is known.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from data_juicer_elastic.plugin import op_tally
from data_juicer_elastic.plugin.count_hooks import Target, count_op, planning
from data_juicer_elastic.status import OPS_NAME
from data_juicer_elastic.storage.files import dumps_json

COUNT_ENV = "DJ_ELASTIC_COUNT_OPS"  # "0" turns the counting off (tests/benchmarks/bench_op_counts_paired.py)
_IN, _OUT, _ERR, _IN_CALLS, _OUT_CALLS = range(op_tally.WIDTH)


def enabled() -> bool:
    return os.environ.get(COUNT_ENV, "1").strip() not in ("0", "false", "no")


@functools.cache
def counting_dataset_class() -> type:
    """A RayDataset whose Mappers and Filters count their rows into the folder given to ``count_into``."""
    from data_juicer.core.data.ray_dataset import RayDataset
    from data_juicer.ops.base_op import Filter, Mapper

    class CountingRayDataset(RayDataset):
        count_sink: str | None = None
        op_names: list[tuple[str, str]]  # (name, kind) per op index

        def count_into(self, sink: str | None) -> None:
            self.count_sink, self.op_names, self._targets = sink, [], {}

        def _run_single_op(self, op: Any, cached_columns: Any = None, tracer: Any = None, stats_only: bool = False):
            if self.count_sink is None:
                return super()._run_single_op(op, cached_columns, tracer=tracer, stats_only=stats_only)
            target = self._targets.get(id(op))  # Data-Juicer plans an op again without its runtime_env
            if target is None:
                target = self._targets[id(op)] = Target(self.count_sink, len(self.op_names))
                self.op_names.append((op._name, _kind(op)))
                count_op(op, target)
            with planning(target if isinstance(op, (Mapper, Filter)) else None):
                return super()._run_single_op(op, cached_columns, tracer=tracer, stats_only=stats_only)

    return CountingRayDataset


def _kind(op: Any) -> str:
    from data_juicer.ops.base_op import Filter, Mapper

    return "Filter" if isinstance(op, Filter) else "Mapper" if isinstance(op, Mapper) else type(op).__mro__[1].__name__


def new_sink() -> str:
    """A node-local folder for one attempt's counters."""
    return tempfile.mkdtemp(prefix="dje-ops-")


def per_op(names: list[tuple[str, str]], counters: list[list[int]], rows_in: int, rows_out: int | None) -> list[dict]:
    """One record per op: rows in (the rows the op before let out), rows out, rows its errors removed,
    and whether its own calls counted its rows out (else they come from its neighbours)."""
    counters = counters + [[0] * op_tally.WIDTH] * (len(names) - len(counters))
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
    counters = op_tally.read(sink)
    shutil.rmtree(sink, ignore_errors=True)
    ops = per_op(names, counters, rows_in, rows_out)
    if rows_out is None:
        rows_out = ops[-1]["rows_out"] if ops else rows_in
    record = {"rows_in": rows_in, "rows_out": rows_out, "error_rows": sum(o["error_rows"] for o in ops), "ops": ops}
    # Whole or absent (temp name, then rename), but not fsynced: the worker copies rows_in and error_rows
    # into the done record, which is; this spares each shard one more fsync on a busy shared disk.
    tmp = attempt_dir / f".{OPS_NAME}.tmp"
    tmp.write_bytes(dumps_json(record))
    os.replace(tmp, attempt_dir / OPS_NAME)
    return record
