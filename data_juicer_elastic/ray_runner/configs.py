"""The job's recipe as Data-Juicer parses it, and each attempt's copy of it.

The job's recipe snapshot is parsed once per job by Data-Juicer's own
``init_configs`` (as ``executor_type: ray``, so the op settings are exactly
those of a plain Ray run). Each attempt then runs on a copy whose input is the
shard and whose export path, work dir and logs all lie inside the attempt
directory.
"""

from __future__ import annotations

import copy
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.job.attempt_files import AttemptDir
from data_juicer_elastic.job.layout import JobDir

RECIPE_NAME = "recipe.yaml"
_DERIVED_DIRS = {
    "event_log_dir": "logs",
    "checkpoint_dir": "checkpoints",
    "partition_dir": "partitions",
    "metadata_dir": "metadata",
    "results_dir": "results",
}
_DERIVED_FILES = {"event_log_file": "events.jsonl", "job_summary_file": "job_summary.json"}


def recipe_source(job: JobDir, folder: str) -> str:
    """Where the recipe snapshot of the generation folder ``folder`` of ``job`` lies, for messages."""
    return str(job.recipe_path) if job.on_object_store else str(Path(folder, RECIPE_NAME))


def read_recipe(job: JobDir, folder: str) -> tuple[dict[str, Any], str]:
    """The recipe snapshot (safe YAML only) of the generation folder ``folder`` of ``job``, and its sha256.

    A local folder needs no manifest (a runner called by hand); on an object store it is read through the
    job's store."""
    where = recipe_source(job, folder)
    if job.on_object_store:
        got = job.store.read(job.key(job.recipe_path))
        data = got[0] if got is not None else None
    else:
        try:
            data = Path(where).read_bytes()
        except FileNotFoundError:
            data = None
    if data is None:
        raise UserError(f"{where}: missing; prepare the job first (dj-process or dj-elastic prepare)")
    recipe = yaml.safe_load(data)
    if not isinstance(recipe, dict):
        raise IntegrityError(f"{where}: not a YAML mapping; prepare the job again")
    return recipe, hashlib.sha256(data).hexdigest()


def parse_recipe(recipe: dict[str, Any], source: str) -> Any:
    """Data-Juicer's own parse of the snapshot as a Ray recipe (custom operators must be loaded)."""
    from data_juicer.config import init_configs

    recipe = {k: v for k, v in recipe.items() if k != "custom_operator_paths"}  # already imported
    recipe["executor_type"] = "ray"
    with tempfile.TemporaryDirectory(prefix="dje-recipe-") as tmp:
        path = os.path.join(tmp, RECIPE_NAME)
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(recipe, f, sort_keys=False, allow_unicode=True)
        cfg = init_configs(["--config", path], load_configs_only=True)
    cfg.config = [source]
    return cfg


def attempt_config(base: Any, shard_path: str, attempt_dir: str) -> Any:
    """A copy of the parsed recipe that reads the shard and writes only inside the attempt dir."""
    cfg = copy.deepcopy(base)
    files = AttemptDir.of(attempt_dir)
    work = str(files.work)
    cfg.dataset_path = shard_path
    cfg.export_path = str(files.ray_export)
    cfg.export_type = "jsonl"
    cfg.work_dir = work
    for key, name in _DERIVED_DIRS.items():
        setattr(cfg, key, os.path.join(work, name))
    for key, name in _DERIVED_FILES.items():
        setattr(cfg, key, os.path.join(work, name))
    cfg.backed_up_config_path = os.path.join(work, files.RECIPE)
    for op in cfg.process or []:
        for args in op.values():
            if isinstance(args, dict) and args.get("work_dir") == base.work_dir:
                args["work_dir"] = work  # what Data-Juicer injects into every op
    return cfg
