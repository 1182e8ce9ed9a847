"""One shard through Data-Juicer's RayExecutor on this node's own Ray runtime.

A worker process handles many shards, so everything that does not depend on
the shard is done once and reused: Ray is started (or connected to) once,
custom operators are imported once, and the job's recipe snapshot is parsed
once by Data-Juicer's own ``init_configs`` (as ``executor_type: ray``, so the
op settings are exactly those of a plain Ray run). Each attempt then runs on
a copy of that config whose input is the shard and whose export path, work
dir and logs all lie inside the attempt directory.

Ray writes a folder of part files, one per write task. With
``preserve_order`` on, write tasks take blocks in input order, so joining
the parts by task index gives the rows in shard order; the joined file is
checked against the dataset's row count and the parts are then removed.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.plugin import opcounts
from data_juicer_elastic.plugin.console import attempt_log, quiet_ray_console, route_ray_worker_logs
from data_juicer_elastic.plugin.shard_errors import arrow_read_options, classify, read_options_for
from data_juicer_elastic.storage.blocks import Digester, blocks
from data_juicer_elastic.worker.signals import reassert

RECIPE_NAME = "recipe.yaml"
LOG_NAME = "process.log"
EXPORT_NAME = "export.jsonl"  # Ray's folder of part files inside the attempt dir
WORK_NAME = "work"  # Data-Juicer's work dir inside the attempt dir
LOCAL = "local"
BUDGET_ENV = "DJ_ELASTIC_RAY_BUDGET_BACKPRESSURE"
_PART_RE = re.compile(r"^(?P<prefix>.+)_(?P<task>\d{6,})\.json$")
_DERIVED_DIRS = {
    "event_log_dir": "logs",
    "checkpoint_dir": "checkpoints",
    "partition_dir": "partitions",
    "metadata_dir": "metadata",
    "results_dir": "results",
}
_DERIVED_FILES = {"event_log_file": "events.jsonl", "job_summary_file": "job_summary.json"}


# --------------------------------------------------------------------------- Ray runtime
_ray_lock = threading.Lock()
_loaded_operator_paths: set[str] = set()


def start_ray(address: str, py_modules: list[str] | None = None) -> bool:
    """Start (``local``) or join the node-local Ray runtime once; True if this call started it.

    Workers get ``RAY_JOB=1`` (Data-Juicer's Ray mode) and the custom operator
    paths, as Data-Juicer's own ``initialize_ray`` would give them. Ray's
    SIGTERM handler does not replace the worker's while the worker's guard is
    active (see ``interrupts``).
    """
    import ray
    from data_juicer.utils.constant import RAY_JOB_ENV_VAR
    from data_juicer.utils.mm_utils import SPECIAL_TOKEN_ENV_PREFIX

    os.environ[RAY_JOB_ENV_VAR] = "1"
    quiet_ray_console()
    with _ray_lock:
        if ray.is_initialized():
            return False
        env_vars = {RAY_JOB_ENV_VAR: "1"}
        env_vars.update({k: v for k, v in os.environ.items() if k.startswith(SPECIAL_TOKEN_ENV_PREFIX)})
        runtime_env: dict[str, Any] = {"env_vars": env_vars}
        if py_modules:
            runtime_env["py_modules"] = list(py_modules)
        kwargs: dict[str, Any] = {"runtime_env": runtime_env}
        if address in ("", LOCAL):
            address, kwargs["include_dashboard"] = LOCAL, False
        ray.init(address=address, **kwargs)
        reassert()  # Ray's native SIGTERM handler would abort the process 3 s after a stop signal
        route_ray_worker_logs()
        return True


def configure_ray_data() -> None:
    """Keep block order (the merged output is in input order) and drop progress bars from logs.

    Ray Data's resource-budget backpressure holds back the first tasks of every
    execution until the autoscaling coordinator has granted the execution its
    resources, about a second each time. RayExecutor runs four executions per
    shard (probe, count, process, write), so on a long-lived worker this is the
    largest fixed cost per shard; the concurrency-cap and downstream-capacity
    policies stay on. ``DJ_ELASTIC_RAY_BUDGET_BACKPRESSURE=1`` keeps Ray's default.
    """
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    if os.environ.get(BUDGET_ENV, "") in ("", "0"):
        _drop_budget_backpressure(ctx)


def _drop_budget_backpressure(ctx: Any) -> None:
    try:
        from ray.data._internal.execution import backpressure_policy as bp
    except ImportError:  # another Ray: leave its defaults alone
        return
    policies = ctx.get_config(bp.ENABLED_BACKPRESSURE_POLICIES_CONFIG_KEY, bp.ENABLED_BACKPRESSURE_POLICIES)
    kept = [p for p in policies if p.__name__ != "ResourceBudgetBackpressurePolicy"]
    ctx.set_config(bp.ENABLED_BACKPRESSURE_POLICIES_CONFIG_KEY, kept)


def load_custom_operators_once(paths: list[str] | None) -> None:
    """Import custom operator files/packages unless this process already did (dj-process has)."""
    import sys

    from data_juicer.config.config import load_custom_operators

    for path in paths or []:
        path = os.path.abspath(path)
        if path in _loaded_operator_paths:
            continue
        name = os.path.splitext(os.path.basename(path))[0]
        loaded = sys.modules.get(name)
        origin = getattr(loaded, "__loaded_from__", None) or getattr(loaded, "__file__", None)
        if origin is None or os.path.abspath(origin) not in (path, os.path.join(path, "__init__.py")):
            load_custom_operators([path])
        _loaded_operator_paths.add(path)


# --------------------------------------------------------------------------- configs
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
    work = os.path.join(attempt_dir, WORK_NAME)
    cfg.dataset_path = shard_path
    cfg.export_path = os.path.join(attempt_dir, EXPORT_NAME)
    cfg.export_type = "jsonl"
    cfg.work_dir = work
    for key, name in _DERIVED_DIRS.items():
        setattr(cfg, key, os.path.join(work, name))
    for key, name in _DERIVED_FILES.items():
        setattr(cfg, key, os.path.join(work, name))
    cfg.backed_up_config_path = os.path.join(work, RECIPE_NAME)
    for op in cfg.process or []:
        for args in op.values():
            if isinstance(args, dict) and args.get("work_dir") == base.work_dir:
                args["work_dir"] = work  # what Data-Juicer injects into every op
    return cfg


# --------------------------------------------------------------------------- input
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

    def __init__(self, cfg: Any, count_sink: str | None = None) -> None:
        self.cfg = cfg
        self.count_sink = count_sink  # see opcounts: per-op row counts land there
        self.dataset: Any = None
        self.rows_in = 0

    def load_dataset(self, **_: Any) -> Any:
        from data_juicer.core.data.ray_dataset import RayDataset

        from data_juicer_elastic.plugin.opcounts import counting_dataset_class

        read_kwargs: dict[str, Any] = {"override_num_blocks": getattr(self.cfg, "override_num_blocks", None)}
        options = read_options_for(self.cfg.dataset_path, getattr(self.cfg, "read_options", None))
        if options:
            read_kwargs["read_options"] = options
        data = RayDataset.read("json", self.cfg.dataset_path, **read_kwargs).materialize()
        self.rows_in = data.count()  # metadata of a materialised dataset: no pass over the rows
        self.dataset = counting_dataset_class()(data, dataset_path=self.cfg.dataset_path, cfg=self.cfg)
        self.dataset.count_sink, self.dataset.op_names = self.count_sink, []
        return self.dataset


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


# --------------------------------------------------------------------------- runner
@dataclass
class _Job:
    cfg: Any  # the parsed recipe, shared by all attempts of this job
    recipe_sha256: str


class RayShardRunner:
    """Runner (see CONTRACTS.md): ``runner(shard_path, output_path, job_dir)``.

    ``ray_address`` is ``"local"`` (start a Ray runtime for this process) or
    the address of a Ray runtime on this node. One instance serves every
    shard a worker process claims; ``close()`` stops a runtime it started.
    """

    runner_factory = True  # `dj-elastic worker --runner data_juicer_elastic.plugin.runner:RayShardRunner`

    def __init__(self, ray_address: str = LOCAL, *, log_level: str = "INFO") -> None:
        self.ray_address = ray_address or LOCAL
        self.log_level = log_level
        self._jobs: dict[str, _Job] = {}
        self._started_ray = False
        self.timings: list[dict[str, float]] = []  # per attempt: setup / run / join seconds

    def __call__(self, shard_path: str, output_path: str, job_dir: str) -> None:
        self.run(shard_path, output_path, job_dir)

    def prepare_job(self, job_dir: str) -> Any:
        """Everything shard-independent, once per job: versions, Ray, custom ops, the parsed recipe."""
        key = os.path.abspath(job_dir)
        job = self._jobs.get(key)
        if job is not None:
            return job.cfg
        import data_juicer  # noqa: F401  (patches.supported() reads its version)

        from data_juicer_elastic.plugin.patches import SUPPORTED_PREFIX, data_juicer_version, supported

        if not supported():
            raise UserError(f"RayShardRunner needs Data-Juicer {SUPPORTED_PREFIX}x, found {data_juicer_version()}")
        recipe, sha = read_recipe(key)
        job = JobDir(key)
        if job.exists() and job.manifest().recipe_sha256 != sha:
            raise IntegrityError(
                f"{job.recipe_path}: sha256 {sha[:12]}… differs from the manifest's "
                f"{job.manifest().recipe_sha256[:12]}…; the recipe snapshot was changed after prepare"
            )
        operator_paths = [os.path.abspath(p) for p in recipe.get("custom_operator_paths") or []]
        for path in operator_paths:
            if os.path.realpath(path).startswith(os.path.realpath(job.root) + os.sep):
                raise UserError(f"custom_operator_paths entry {path} lies inside the job directory; refusing to run it")
        self._started_ray |= start_ray(self.ray_address, operator_paths)
        load_custom_operators_once(operator_paths)
        cfg = parse_recipe(recipe, str(Path(key, RECIPE_NAME)))
        cfg.custom_operator_paths = operator_paths or None
        self._jobs[key] = _Job(cfg, sha)
        return cfg

    def run(self, shard_path: str, output_path: str, job_dir: str) -> None:
        t0 = time.perf_counter()
        base = self.prepare_job(job_dir)
        attempt_dir = Path(output_path).parent
        with attempt_log(attempt_dir / LOG_NAME, self.log_level):
            from loguru import logger

            try:
                rows, t1, t2 = self._run_attempt(base, shard_path, output_path)
            except Exception as exc:
                logger.error(f"shard {Path(shard_path).name} failed: {type(exc).__name__}: {exc}")
                error = classify(exc, shard_path, job_dir, arrow_read_options(base, shard_path))
                if error is exc:
                    raise
                logger.error(f"{error} (the same error would recur on every attempt: the shard fails now)")
                raise error from exc
            t3 = time.perf_counter()
            self.timings.append({"setup": t1 - t0, "run": t2 - t1, "join": t3 - t2, "rows": rows})
            logger.info(
                f"shard {Path(shard_path).name}: {rows} rows in {t3 - t0:.2f}s "
                f"(setup {t1 - t0:.2f}s, Data-Juicer {t2 - t1:.2f}s, join {t3 - t2:.2f}s)"
            )

    def _run_attempt(self, base: Any, shard_path: str, output_path: str) -> tuple[int, float, float]:
        """RayExecutor on the attempt's config, then the ordered join; returns rows and two timestamps."""
        from data_juicer.core.executor.ray_executor import RayExecutor

        attempt_dir = Path(output_path).parent
        export_path = attempt_dir / EXPORT_NAME
        configure_ray_data()
        cfg = attempt_config(base, os.path.abspath(shard_path), str(attempt_dir))
        t1 = time.perf_counter()
        executor = RayExecutor(cfg)
        sink = opcounts.new_sink() if opcounts.enabled() else None
        try:
            executor.datasetbuilder = loader = ShardLoader(executor.cfg, sink)
            dataset = executor.run()
            if sink:
                opcounts.collect(sink, loader.dataset.op_names, loader.rows_in, attempt_dir)
        finally:
            if sink:
                shutil.rmtree(sink, ignore_errors=True)
        t2 = time.perf_counter()
        expected = dataset.data.count() if dataset is not None else None
        rows = join_parts(export_path, Path(output_path))
        if expected is not None and rows != expected:
            raise IntegrityError(f"{output_path}: joined {rows} rows from {export_path} but Ray reported {expected}")
        remove(export_path)
        return rows, t1, t2

    def close(self) -> None:
        """Shut down the Ray runtime if this runner started it."""
        if self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False
