"""Parse-time checks of a recipe for ``executor_type: elastic_shard``.

Runs after custom operators are loaded and before Data-Juicer writes
anything (work dir, logs, config backup). Every problem is collected and
reported in one :class:`~data_juicer_elastic.errors.UserError` (exit 2).

Only shard-independent operators may run: each shard is processed on its
own, so an op whose result depends on rows outside its shard (dedup,
selection, grouping, aggregation, whole-dataset pipelines) would silently
give a different answer than one run over the whole input.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.plugin.schema import KEY, settings_from_cfg
from data_juicer_elastic.prepare.inputs import SUFFIXES
from data_juicer_elastic.prepare.source import split_s3_url
from data_juicer_elastic.s3_export import location
from data_juicer_elastic.storage.mounts import is_url, job_dir_problem
from data_juicer_elastic.storage.urls import is_s3

INPUT_SUFFIXES = tuple(SUFFIXES)  # what prepare reads
MEDIA_KEY_OPTIONS = ("image_key", "audio_key", "video_key")
# recipe keys whose op lists are themselves ops (fused ops)
_NESTED_LISTS = {"fused_op_list": "op", "op_specs": "spec"}


@dataclass(frozen=True)
class RecipeKeys:
    """Row keys prepare must normalise: media paths made absolute, index keys numbered globally."""

    media_keys: tuple[str, ...]
    index_keys: tuple[str, ...]


@dataclass(frozen=True)
class OpEntry:
    where: str  # e.g. "process[2] general_fused_op > fused_op_list[0]"
    name: str
    args: dict[str, Any]


def _args_of(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    return dict(vars(raw))  # a jsonargparse Namespace


def iter_ops(process: list[Any] | None, prefix: str = "process") -> Iterator[OpEntry]:
    """Every op of a process list, fused ops' inner ops included (depth first)."""
    for i, item in enumerate(process or []):
        if isinstance(item, str):
            name, args = item, {}
        elif isinstance(item, dict) and len(item) == 1:
            name, raw = next(iter(item.items()))
            args = _args_of(raw)
        elif isinstance(item, dict) and ("class_name" in item or "name" in item):  # op_specs entry
            name, args = item.get("class_name") or item.get("name"), _args_of(item.get("kwargs"))
        else:
            yield OpEntry(f"{prefix}[{i}]", repr(item), {})
            continue
        where = f"{prefix}[{i}] {name}"
        yield OpEntry(where, name, args)
        for key in _NESTED_LISTS:
            if isinstance(args.get(key), list):
                yield from iter_ops(args[key], f"{where} > {key}")


def dedup_problem(entry: OpEntry) -> str | None:
    """Why a deduplicator of ``process`` (dedup/plan.py) cannot run in stages, or None if it can."""
    from data_juicer_elastic.dedup.plan import KINDS, REFUSED, TWINS

    runs = ", ".join(sorted(KINDS))
    if entry.name in REFUSED:
        return f"{REFUSED[entry.name]}; the deduplicators that run here: {runs}"
    if " > " in entry.where:
        return f"a deduplicator runs in stages only as an op of process itself, not inside a fused op ({runs})"
    if TWINS.get(entry.name, entry.name) == "document_minhash_deduplicator":
        missing = [k for k in ("num_bands", "num_rows_per_band") if entry.args.get(k) is None]
        if missing:
            return (
                f"give both num_bands and num_rows_per_band (missing: {', '.join(missing)}); without them "
                "Data-Juicer computes them with scipy, which it would install at run time"
            )
    return None


def op_problem(entry: OpEntry) -> str | None:
    """Why this op cannot run shard by shard, or None if it can."""
    from data_juicer_elastic.dedup.plan import KINDS, REFUSED

    if entry.name in KINDS or entry.name in REFUSED:
        return dedup_problem(entry)
    from data_juicer.ops.base_op import (
        OPERATORS,
        Aggregator,
        Deduplicator,
        Filter,
        Grouper,
        Mapper,
        Pipeline,
        Selector,
    )

    cls = OPERATORS.modules.get(entry.name)
    if cls is None:
        return UNKNOWN_OP
    global_kinds = (
        (Deduplicator, "a Deduplicator compares rows across the whole dataset"),
        (Selector, "a Selector picks rows from the whole dataset"),
        (Grouper, "a Grouper merges rows from the whole dataset"),
        (Aggregator, "an Aggregator combines rows from the whole dataset"),
        (Pipeline, "a Pipeline op runs over the whole dataset"),
    )
    for base, why in global_kinds:
        if issubclass(cls, base):
            return f"{why} ({cls.__name__}); shards are processed independently"
    if not issubclass(cls, (Mapper, Filter)):
        return f"{cls.__name__} is neither a Mapper nor a Filter; only per-row ops can run shard by shard"
    if getattr(cls, "_prepare_for_ray_map_batches", None) is not None or entry.name.endswith("_deduplicator"):
        return (
            f"{cls.__name__} keeps global state across Ray workers to drop duplicates; "
            "duplicates in different shards would survive"
        )
    if "ray" not in getattr(cls, "_supported_exec_modes", ("ray",)):
        return f"{cls.__name__} does not support Ray mode (supports {list(cls._supported_exec_modes)})"
    if entry.args.get("stats_export_path"):
        return "stats_export_path writes one global stats file; remove it (stats stay in the rows)"
    return None


def argument_problems(entry: OpEntry) -> list[str]:
    """The op's arguments checked as RayExecutor checks them before it builds the ops.

    Data-Juicer's own pre-instantiation check (``strict_preflight``): each key
    must be a parameter of the op class or one of its bases (with a "did you
    mean" suggestion otherwise) and plain types must match. At run time the
    values have been through jsonargparse's typing first (0.75 becomes a
    ``ClosedUnitInterval``), so a value its annotated class accepts is
    converted the same way here. Nothing is instantiated: no model is loaded.
    """
    from data_juicer.core.preflight import PipelineConfigError, _get_valid_params, pre_instantiation_check
    from data_juicer.ops.base_op import OPERATORS

    args = {k: v for k, v in entry.args.items() if k not in _NESTED_LISTS}  # inner ops are checked on their own
    params = _get_valid_params(OPERATORS.modules[entry.name])
    for key, value in args.items():
        kind = params.get(key)
        if isinstance(kind, type) and kind not in (bool, str) and value is not None and not isinstance(value, kind):
            try:
                args[key] = kind(value)
            except (TypeError, ValueError):
                pass  # left as it is: the check below names it
    try:
        pre_instantiation_check([{entry.name: args}])
    except PipelineConfigError as exc:
        return [str(e).removeprefix(f"[{entry.name}] ") for e in exc.errors]
    return []


def path_problems(cfg: Any) -> list[str]:
    """What is wrong with the job dir, the input, the output and the lease timings."""
    settings = settings_from_cfg(cfg)
    problems = [*_job_dir_problems(settings.job_dir), *_dataset_problems(cfg), *_export_problems(cfg)]
    problems += settings.storage.problems(f"{KEY}.storage.")
    if settings.heartbeat_secs >= settings.lock_timeout_secs:
        problems.append(
            f"{KEY}.heartbeat_secs ({settings.heartbeat_secs}) must be below {KEY}.lock_timeout_secs "
            f"({settings.lock_timeout_secs}), or live leases look stale"
        )
    return problems


def _job_dir_problems(job_dir: str | None) -> list[str]:
    if not job_dir:
        return [
            f"{KEY}.job_dir is not set; give a directory on the filesystem all nodes share, "
            f"e.g. {KEY}: {{job_dir: /mnt/shared/jobs/my-job-001}}"
        ]
    problem = job_dir_problem(job_dir, f"{KEY}.job_dir")
    return [problem] if problem else []


def _dataset_problems(cfg: Any) -> list[str]:
    dataset_path = cfg.get("dataset_path") or ""
    if not dataset_path:
        if cfg.get("dataset") or cfg.get("generated_dataset_config"):
            return [
                "dataset / generated_dataset_config are not supported by elastic_shard; "
                "set dataset_path to a local JSONL file or a directory of JSONL files"
            ]
        return ["dataset_path is not set; set it to a local JSONL file or a directory of JSONL files"]
    if is_s3(dataset_path):
        try:
            split_s3_url(dataset_path)
        except UserError as exc:
            return [f"dataset_path: {exc}"]
        return []  # whether it exists is asked of the store by prepare (exit 2 naming the URL)
    if is_url(dataset_path):
        return [
            f"dataset_path {dataset_path!r} is remote; elastic_shard reads a local JSONL file or folder, "
            "or JSONL on S3 (s3://bucket/data.jsonl, s3://bucket/prefix/)"
        ]
    if not os.path.exists(dataset_path):
        hint = " (weighted mixtures '<w1> <path1> ...' are not supported)" if " " in dataset_path.strip() else ""
        return [f"dataset_path {dataset_path!r} does not exist{hint}"]
    if os.path.isfile(dataset_path) and not dataset_path.endswith(INPUT_SUFFIXES):
        return [
            f"dataset_path {dataset_path!r} is not JSONL (nor Parquet); elastic_shard reads files named "
            f"{', '.join('*' + s for s in INPUT_SUFFIXES)} (or a folder of them)"
        ]
    return []


def _export_problems(cfg: Any) -> list[str]:
    problems = []
    export_path = cfg.get("export_path") or ""
    export_type = cfg.get("export_type")
    suffix = os.path.splitext(export_path.rstrip("/"))[1]
    if is_url(export_path) and not is_s3(export_path):
        problems.append(
            f"export_path {export_path!r} is remote; elastic_shard writes a local file or folder, or an "
            "S3 object or prefix (s3://bucket/out/result.jsonl, s3://bucket/out/result/)"
        )
    elif is_s3(export_path) and (problem := _s3_problem(export_path)):
        problems.append(f"export_path {export_path!r}: {problem}")
    elif suffix and (suffix not in (".jsonl", ".parquet") or export_path.endswith("/")):
        problems.append(
            f"export_path {export_path!r} must be a file ending in .jsonl or .parquet, "
            "or a folder (no suffix: out/result/) to get one part file per shard"
        )
    elif suffix and export_type is not None and export_type != suffix[1:]:
        problems.append(
            f"export_type {export_type!r} disagrees with export_path {export_path!r}; drop export_type "
            "(the suffix says the format) or make them agree"
        )
    if export_type not in (None, "jsonl", "parquet"):
        problems.append(f"export_type {export_type!r} is not supported; elastic_shard writes jsonl or parquet")
    if cfg.get("export_shard_size"):
        problems.append("export_shard_size is not supported; elastic_shard merges everything into export_path")
    if cfg.get("encrypt_before_export"):
        problems.append("encrypt_before_export is not supported by elastic_shard (the merge reads the outputs)")
    return problems


def _s3_problem(url: str) -> str | None:
    try:
        location(url)
    except UserError as exc:
        return str(exc).removeprefix(f"{url}: ")
    return None


UNKNOWN_OP = "unknown operator; check the name, or list the module defining it in custom_operator_paths"
# after the problems, where an op was refused for what it is (not for a typo in its name or arguments)
GLOBAL_OPS_HINT = (
    "Only shard-independent Mapper/Filter ops run shard by shard, and these deduplicators in stages: "
    "document_deduplicator, document_minhash_deduplicator, ray_bts_minhash_cpp_deduplicator, "
    "ray_bts_minhash_deduplicator, ray_document_deduplicator (run other global ops: selection, grouping, "
    "aggregation, other dedups, in a separate executor_type ray job)."
)


def _problems(cfg: Any, process: list[Any] | None) -> tuple[list[str], bool]:
    """Every problem, and whether an op was refused for its kind (one that cannot run shard by shard)."""
    problems = path_problems(cfg)
    ops = list(iter_ops(cfg.get("process") if process is None else process))
    if not ops:
        problems.append("the process list is empty; nothing to run")
    strict = cfg.get("strict_preflight", True) is not False  # Data-Juicer's switch for the same check at run time
    kind_refused = False
    for entry in ops:
        why = op_problem(entry)
        if why:
            problems.append(f"{entry.where}: {why}")
            kind_refused = kind_refused or why != UNKNOWN_OP
        elif strict:
            problems.extend(f"{entry.where}: {p}" for p in argument_problems(entry))
    return problems, kind_refused


def recipe_problems(cfg: Any, process: list[Any] | None = None) -> list[str]:
    """Everything wrong with ``cfg`` for elastic_shard (``process`` overrides cfg.process)."""
    return _problems(cfg, process)[0]


def validate(cfg: Any, process: list[Any] | None = None, source: str | None = None) -> None:
    """Raise one UserError naming every problem (and the recipe file) if there is any. "Cannot run with
    elastic_shard" and the line on shard-independent ops head it only where an op was refused for its kind:
    a typo or a bad path is the user's to fix in place, not a reason to change executors."""
    problems, kind_refused = _problems(cfg, process)
    if not problems:
        return
    where = f"{source}: " if source else ""
    if kind_refused:
        headline = f"{where}this recipe cannot run with executor_type elastic_shard:"
    elif len(problems) == 1:
        raise UserError(f"{where}{problems[0]}")
    else:
        headline = f"{where}{len(problems)} problems:"
    raise UserError(
        headline + "".join(f"\n  - {p}" for p in problems) + (f"\n{GLOBAL_OPS_HINT}" if kind_refused else "")
    )


def recipe_keys(cfg: Any, process: list[Any] | None = None) -> RecipeKeys:
    """Media keys (image/audio/video) and the index keys that ops declare."""
    media: list[str] = []
    for option in MEDIA_KEY_OPTIONS:
        key = cfg.get(option)
        if key and key not in media:
            media.append(key)
    index: list[str] = []
    for entry in iter_ops(cfg.get("process") if process is None else process):
        key = entry.args.get("index_key")
        if isinstance(key, str) and key and key not in index:
            index.append(key)
    return RecipeKeys(tuple(media), tuple(index))
