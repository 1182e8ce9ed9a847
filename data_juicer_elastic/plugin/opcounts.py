"""Rows in and out of every op of one attempt, and the rows an op error removed.

Data-Juicer's RayExecutor counts nothing per op (its default executor logs
"Left N samples"), and a ``.count()`` per op would run the pipeline again. So
the counting rides along with the work itself:

- after each op a tiny ``map_batches`` step counts the rows of every block
  that leaves the op; Ray fuses it into the op's own tasks, so it costs one
  ``len`` and one short append per block, no extra pass;
- with ``skip_op_error`` on (Data-Juicer's default), an op that raises on a
  batch returns it empty and only logs the error. The op's process methods
  are re-wrapped with Data-Juicer's own ``catch_map_*_exception`` around a
  counter that notes the size of a batch that raised, so Data-Juicer's
  semantics stay and the rows it dropped are counted. (Ops run in Ray actors
  are built inside the actor from their class, so their errors show only as
  rows in minus rows out.)

Ray tasks append ``<kind> <op index> <rows>`` lines to files in a node-local
folder (the runner and its Ray workers share the node); :func:`collect` sums
them into ``ops.json`` in the attempt dir, which status, verify and the report read.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from data_juicer_elastic.status import OPS_NAME
from data_juicer_elastic.storage.files import atomic_write, dumps_json

COUNT_ENV = "DJ_ELASTIC_COUNT_OPS"  # "0" turns the counting off (tests/benchmarks/bench_op_counts.py)


def enabled() -> bool:
    return os.environ.get(COUNT_ENV, "1").strip() not in ("0", "false", "no")


def _append(sink: str, kind: str, index: int, rows: int) -> None:
    with open(os.path.join(sink, f"{os.getpid()}.txt"), "a", encoding="ascii") as f:
        f.write(f"{kind} {index} {rows}\n")


def _count_block(table: Any, *, sink: str, index: int) -> Any:
    _append(sink, "out", index, table.num_rows)
    return table


def _rows_of(samples: Any) -> int:
    """Rows of a batch (a dict of columns) or 1 for a single sample, as Data-Juicer hands them over."""
    if isinstance(samples, dict) and samples:
        first = next(iter(samples.values()))
        if isinstance(first, list) and all(isinstance(v, list) and len(v) == len(first) for v in samples.values()):
            return len(first)
    return 1


def _noting_errors(method: Any, sink: str, index: int) -> Any:
    @functools.wraps(method)
    def counted(samples: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(samples, *args, **kwargs)
        except Exception:
            _append(sink, "err", index, _rows_of(samples))
            raise

    return counted


def count_op_errors(op: Any, sink: str, index: int) -> None:
    """Re-wrap ``op``'s process methods so a batch removed by ``skip_op_error`` is counted."""
    from data_juicer.ops.base_op import Filter, Mapper, catch_map_batches_exception, catch_map_single_exception

    if not getattr(op, "skip_op_error", False) or not isinstance(op, (Mapper, Filter)):
        return
    batched = op.is_batched_op()
    names = ("process",) if isinstance(op, Mapper) else ("compute_stats", "process")
    for attr in names:
        raw = getattr(op, f"{attr}_batched" if batched else f"{attr}_single", None)
        if raw is None:
            continue
        inner = _noting_errors(raw, sink, index)
        if batched:
            wrapped = catch_map_batches_exception(inner, skip_op_error=True, op_name=op._name)
        else:
            keep = not (isinstance(op, Filter) and attr == "process")
            wrapped = catch_map_single_exception(inner, return_sample=keep, skip_op_error=True, op_name=op._name)
        setattr(op, attr, wrapped)


def counting_dataset_class() -> type:
    """A RayDataset whose ops count their rows into ``self.count_sink`` (set by the runner)."""
    from data_juicer.core.data.ray_dataset import RayDataset

    class CountingRayDataset(RayDataset):
        count_sink: str | None = None
        op_names: list[tuple[str, str]]

        def _run_single_op(self, op: Any, cached_columns: Any = None, tracer: Any = None, stats_only: bool = False):
            sink = self.count_sink
            if sink is None:
                return super()._run_single_op(op, cached_columns, tracer=tracer, stats_only=stats_only)
            index = len(self.op_names)
            self.op_names.append((op._name, _kind(op)))
            count_op_errors(op, sink, index)
            columns = super()._run_single_op(op, cached_columns, tracer=tracer, stats_only=stats_only)
            counter = functools.partial(_count_block, sink=sink, index=index)
            self.data = self.data.map_batches(counter, batch_format="pyarrow", zero_copy_batch=True, batch_size=None)
            return columns

    return CountingRayDataset


def _kind(op: Any) -> str:
    from data_juicer.ops.base_op import Filter, Mapper

    return "Filter" if isinstance(op, Filter) else "Mapper" if isinstance(op, Mapper) else type(op).__mro__[1].__name__


def new_sink() -> str:
    """A node-local folder for one attempt's count lines."""
    return tempfile.mkdtemp(prefix="dje-ops-")


def collect(sink: str, op_names: list[tuple[str, str]], rows_in: int, attempt_dir: Path) -> dict:
    """Sum the count lines into ``<attempt>/ops.json`` and drop the sink; returns the record."""
    out: dict[int, int] = {}
    err: dict[int, int] = {}
    for name in os.listdir(sink):
        with open(os.path.join(sink, name), encoding="ascii") as f:
            for line in f:
                kind, index, rows = line.split()
                target = out if kind == "out" else err
                target[int(index)] = target.get(int(index), 0) + int(rows)
    shutil.rmtree(sink, ignore_errors=True)
    ops, rows = [], rows_in
    for i, (name, kind) in enumerate(op_names):
        rows_out = out.get(i, 0)
        ops.append({"op": name, "kind": kind, "rows_in": rows, "rows_out": rows_out, "error_rows": err.get(i, 0)})
        rows = rows_out
    record = {"rows_in": rows_in, "rows_out": rows, "error_rows": sum(err.values()), "ops": ops}
    atomic_write(attempt_dir / OPS_NAME, dumps_json(record))
    return record
