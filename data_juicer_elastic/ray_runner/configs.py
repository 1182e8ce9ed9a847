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

RECIPE_NAME = "recipe.yaml"
_DERIVED_DIRS = {
    "event_log_dir": "logs",
    "checkpoint_dir": "checkpoints",
    "partition_dir": "partitions",
    "metadata_dir": "metadata",
    "results_dir": "results",
}
_DERIVED_FILES = {"event_log_file": "events.jsonl", "job_summary_file": "job_summary.json"}


def read_recipe(job_dir: str) -> tuple[dict[str, Any], str]:
    """The job's recipe snapshot (safe YAML only) and its sha256."""
    path = Path(job_dir, RECIPE_NAME)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: missing; prepare the job first (dj-process or dj-elastic prepare)") from None
    recipe = yaml.safe_load(data)
    if not isinstance(recipe, dict):
        raise IntegrityError(f"{path}: not a YAML mapping; prepare the job again")
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
