"""Reading a shard into Ray's object store, and joining Ray's part files into the attempt's output."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.ray_runner.arrow_schema import parquet_schema, shard_facts
from data_juicer_elastic.ray_runner.shard_errors import read_options_for
from data_juicer_elastic.storage.blocks import Digester, blocks

_PART_RE = re.compile(r"^(?P<prefix>.+)_(?P<task>\d{6,})\.json$")


class ShardLoader:
    """Stands in for RayExecutor's DatasetBuilder: the shard is read once, into Ray's object store.

    For a shard (one local JSONL file; ``dataset:`` configs are refused at
    parse time, so there are no validators or mixtures) Data-Juicer's builder
    comes down to the same ``RayDataset.read`` and ``RayDataset(...)`` calls
    made here. Left lazy, that dataset is read three times per run (a
    one-row schema probe, the input row count, the processing) and the probe
    cancels its read task part-way, which makes Ray kill the worker process
    that ran it: the next task then waits 1-3 s for a fresh worker to import
    Data-Juicer. Read once and materialised, schema and count are metadata
    and no task is cancelled. The object store already holds the whole
    processed shard, since RayExecutor materialises it before export.
    """

    executor_type = "ray"  # read by RayExecutor.run

    def __init__(self, cfg: Any, count_sink: str | None = None, data: Any = None, job: JobDir | None = None) -> None:
        self.cfg = cfg
        self.job = job  # the shard's job (read_shard)
        self.count_sink = count_sink  # see opcounts: the folder the ops' row counters live in
        self.data = data  # the shard already read (``read_shard``), e.g. while the previous shard ran
        self.dataset: Any = None
        self.rows_in = 0

    def load_dataset(self, **_: Any) -> Any:
        from data_juicer_elastic.patches.data_juicer import counting_dataset_class
        from data_juicer_elastic.ray_runner.op_counts.hooks import COUNTING

        data = self.data if self.data is not None else read_shard(self.cfg, self.job)
        self.rows_in = data.count()  # metadata of a materialised dataset: no pass over the rows
        self.dataset = counting_dataset_class(COUNTING)(data, dataset_path=self.cfg.dataset_path, cfg=self.cfg)
        self.dataset.count_into(self.count_sink)
        return self.dataset


def read_shard(cfg: Any, job: JobDir | None = None) -> Any:
    """The shard of an attempt's config, read with the whole input's schema and materialised (any thread).

    ``job``: the shard's job (None: the one whose ``shards/`` holds the shard file)."""
    from data_juicer.core.data.ray_dataset import RayDataset
    from loguru import logger

    schema = parquet_schema(cfg.dataset_path, job)
    if schema is not None:  # a Parquet input: the shard names row groups, read in place (prepare.parquet)
        import ray

        from data_juicer_elastic.prepare.parquet import read_descriptor

        tables = [t for t in read_descriptor(cfg.dataset_path, schema) if t.num_rows] or [schema.empty_table()]
        return ray.data.from_arrow(tables).materialize()
    read_kwargs: dict[str, Any] = {"override_num_blocks": getattr(cfg, "override_num_blocks", None)}
    options = read_options_for(cfg.dataset_path, getattr(cfg, "read_options", None), job)
    if options:
        read_kwargs["read_options"] = options
    facts = shard_facts(cfg.dataset_path, logger.warning, job)
    if facts is not None and facts.parse_options is not None:
        read_kwargs["parse_options"] = facts.parse_options
    return RayDataset.read("json", cfg.dataset_path, **read_kwargs).materialize()


# --------------------------------------------------------------------------- output
def part_files(export_dir: Path) -> list[Path]:
    """Ray's part files in write-task order; refuses names it does not recognise."""
    parts: list[tuple[int, Path]] = []
    prefixes = set()
    for entry in export_dir.iterdir():
        if entry.name.startswith("."):
            continue
        m = _PART_RE.match(entry.name)
        if not m or not entry.is_file():
            raise IntegrityError(f"{entry}: unexpected file in Ray's export folder; cannot order the output")
        prefixes.add(m.group("prefix"))
        parts.append((int(m.group("task")), entry))
    if len(prefixes) > 1:
        raise IntegrityError(f"{export_dir}: part files of {len(prefixes)} different writes; cannot order them")
    return [p for _, p in sorted(parts)]


def join_parts(export_path: Path, output_path: Path) -> int:
    """Concatenate the part files into ``output_path``; returns the number of rows written.

    Fails closed: an export that is missing, or neither a folder nor Data-Juicer's
    empty-dataset file, fails the attempt rather than publishing an empty output.
    """
    if not export_path.is_dir() and (not export_path.is_file() or export_path.stat().st_size):
        what = "is missing" if not export_path.exists() else "is neither Ray's export folder nor an empty file"
        raise IntegrityError(f"{export_path}: the attempt's export {what}; the shard's output cannot be trusted")
    rows = 0
    with open(output_path, "wb") as out:
        for part in part_files(export_path) if export_path.is_dir() else ():
            counted = Digester(sha256=False)
            for block in blocks(part):
                out.write(block)
                counted.update(block)
            rows += counted.rows
            if not counted.result().ends_with_newline:
                out.write(b"\n")
                rows += 1
        out.flush()
        os.fsync(out.fileno())
    return rows


def remove(path: Path) -> None:
    """Drop Ray's part files once joined (the attempt would otherwise hold the output twice)."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
