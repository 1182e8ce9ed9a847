"""Reading a shard into Ray's object store, and joining Ray's part files into the attempt's output."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from data_juicer_elastic.errors import IntegrityError

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

    def __init__(self, cfg: Any, data: Any = None) -> None:
        self.cfg = cfg
        self.data = data  # the shard already read (``read_shard``), e.g. while the previous shard ran

    def load_dataset(self, **_: Any) -> Any:
        from data_juicer.core.data.ray_dataset import RayDataset

        data = self.data if self.data is not None else read_shard(self.cfg)
        return RayDataset(data, dataset_path=self.cfg.dataset_path, cfg=self.cfg)


def read_shard(cfg: Any) -> Any:
    """The shard of an attempt's config, read and materialised in Ray's object store (thread-safe)."""
    from data_juicer.core.data.ray_dataset import RayDataset

    read_kwargs: dict[str, Any] = {"override_num_blocks": getattr(cfg, "override_num_blocks", None)}
    if getattr(cfg, "read_options", None):
        read_kwargs["read_options"] = cfg.read_options
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
    """Concatenate the part files into ``output_path``; returns the number of rows written."""
    rows = 0
    with open(output_path, "wb") as out:
        if export_path.is_dir():
            for part in part_files(export_path):
                last = b"\n"
                with open(part, "rb") as src:
                    while chunk := src.read(16 << 20):
                        out.write(chunk)
                        rows += chunk.count(b"\n")
                        last = chunk[-1:]
                if last != b"\n":
                    out.write(b"\n")
                    rows += 1
        elif export_path.exists() and export_path.stat().st_size:  # Data-Juicer's empty-dataset file
            raise IntegrityError(f"{export_path}: expected Ray's export folder or an empty file")
        out.flush()
        os.fsync(out.fileno())
    return rows


def remove(path: Path) -> None:
    """Drop Ray's part files once joined (the attempt would otherwise hold the output twice)."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
