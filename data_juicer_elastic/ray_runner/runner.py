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
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.plugin import opcounts
from data_juicer_elastic.plugin.console import attempt_log, quiet_ray_console, route_ray_worker_logs
from data_juicer_elastic.plugin.shard_errors import arrow_read_options, classify
from data_juicer_elastic.plugin.shard_io import ShardLoader, join_parts, read_shard, remove
from data_juicer_elastic.plugin.warm_ops import WarmOps
from data_juicer_elastic.worker.signals import reassert

RECIPE_NAME = "recipe.yaml"
LOG_NAME = "process.log"
EXPORT_NAME = "export.jsonl"  # Ray's folder of part files inside the attempt dir
WORK_NAME = "work"  # Data-Juicer's work dir inside the attempt dir
LOCAL = "local"
BUDGET_ENV = "DJ_ELASTIC_RAY_BUDGET_BACKPRESSURE"
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
_ray_env: dict[str, tuple[str | None, str | None]] = {}  # key -> (before start_ray, as starting Ray left it)


# Ray kills an idle worker process above its soft limit (one per CPU) after 1 s. Between two shards each
# shard's read, forward and write tasks then start new worker processes (about 1-2 s each on a busy node),
# which was most of a warm shard's time; a local runtime keeps them for a minute instead.
IDLE_WORKER_KEEP_MS = 60_000


def start_ray(address: str, py_modules: list[str] | None = None) -> bool:
    """Start (``local``) or join the node-local Ray runtime once; True if this call started it.

    Workers get ``RAY_JOB=1`` (Data-Juicer's Ray mode) and the custom operator
    paths, as Data-Juicer's own ``initialize_ray`` would give them. Ray's
    SIGTERM handler does not replace the worker's while the worker's guard is
    active (see ``interrupts``). What starting it sets in ``os.environ`` is
    recorded for :func:`stop_ray` to undo.
    """
    import ray
    from data_juicer.utils.constant import RAY_JOB_ENV_VAR
    from data_juicer.utils.mm_utils import SPECIAL_TOKEN_ENV_PREFIX

    before = dict(os.environ)
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
            kwargs["_system_config"] = {"idle_worker_killing_time_threshold_ms": IDLE_WORKER_KEEP_MS}
        ray.init(address=address, **kwargs)
        for key in before.keys() | os.environ.keys():
            if before.get(key) != os.environ.get(key):
                _ray_env[key] = (before.get(key), os.environ.get(key))
        reassert()  # Ray's native SIGTERM handler would abort the process 3 s after a stop signal
        route_ray_worker_logs()
        return True


def stop_ray() -> None:
    """Shut down the runtime :func:`start_ray` started and put back the ``os.environ`` it changed.

    A local ``ray.init`` exports its runtime's settings, ``RAY_AUTH_MODE=token``
    among them, and ``ray.shutdown`` leaves them. Every process started later
    would inherit them: a worker joining a Ray cluster without token auth
    then rejects the streamed results of its Ray Data tasks
    (``InvalidAuthToken``) and waits on its first shard forever. A key changed
    again since is left as it is.
    """
    import ray

    _let_ray_data_executors_end()
    ray.shutdown()
    with _ray_lock:
        for key, (old, set_by_ray) in _ray_env.items():
            if os.environ.get(key) != set_by_ray:
                continue
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        _ray_env.clear()


def _let_ray_data_executors_end(timeout: float = 10.0) -> None:
    """A failed execution waits only 2 s for its executor thread; one still dispatching when ``ray.shutdown``
    runs makes Ray's core worker end the process (exit 1 instead of the worker's own code and FAIL line)."""
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name.startswith("StreamingExecutor-") and thread is not threading.current_thread():
            thread.join(max(deadline - time.monotonic(), 0.0))


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


# --------------------------------------------------------------------------- runner
def recurring(exc: Exception, shard: str, job: _Job) -> Exception:
    """``exc`` if a retry may heal it, else the PermanentError that fails the shard at once (shard_errors)."""
    return classify(exc, shard, job.root, arrow_read_options(job.cfg, shard))


@dataclass
class _Job:
    root: str  # the job (generation) directory
    cfg: Any  # the parsed recipe, shared by all attempts of this job
    recipe_sha256: str
    warm: WarmOps  # the actors of its actor-mode ops, kept from shard to shard


@dataclass
class ShardAttempt:
    """One attempt between its stages."""

    job: _Job
    cfg: Any  # the attempt's copy of the recipe
    output: Path
    data: Any  # the shard in Ray's object store, until processed
    expected: int | None = None  # rows Ray reported
    started: float = 0.0  # perf_counter at the start and end of processing
    ended: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return self.output.parent


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
        self.timings: list[dict[str, float]] = []  # per attempt: setup / load / run / join seconds, start / end

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
        self._jobs[key] = _Job(key, cfg, sha, WarmOps())
        return cfg

    def run(self, shard_path: str, output_path: str, job_dir: str) -> None:
        """The whole attempt in this thread: load, process, finish."""
        self.finish(self.process(self.load(shard_path, output_path, job_dir)))

    # The three stages of an attempt; the worker may overlap one attempt's load and
    # finish with another's process (worker/prefetch.py). Only ``process`` plans
    # and runs Data-Juicer's ops; ``load`` and ``finish`` are safe in another thread.
    def load(self, shard_path: str, output_path: str, job_dir: str) -> ShardAttempt:
        """Parse the job once, then read the shard into Ray's object store."""
        t0 = time.perf_counter()
        key = os.path.abspath(job_dir)
        base = self.prepare_job(key)
        configure_ray_data()
        cfg = attempt_config(base, os.path.abspath(shard_path), str(Path(output_path).parent))
        t1 = time.perf_counter()
        job = self._jobs[key]
        try:
            data = read_shard(cfg)
        except Exception as exc:  # a row Arrow refuses: the same on every attempt
            error = recurring(exc, cfg.dataset_path, job)
            if error is exc:
                raise
            raise error from exc
        attempt = ShardAttempt(job, cfg, Path(output_path), data)
        attempt.seconds.update(setup=t1 - t0, load=time.perf_counter() - t1)
        return attempt

    def process(self, attempt: ShardAttempt) -> ShardAttempt:
        """Data-Juicer's RayExecutor on the loaded shard, actor-mode ops on the job's warm actors."""
        with attempt_log(attempt.dir / LOG_NAME, self.log_level):
            from loguru import logger

            attempt.started = time.perf_counter()
            try:
                attempt.expected = self._execute(attempt)
            except Exception as exc:
                logger.error(f"shard {Path(attempt.cfg.dataset_path).name} failed: {type(exc).__name__}: {exc}")
                error = recurring(exc, attempt.cfg.dataset_path, attempt.job)
                if error is exc:
                    raise
                logger.error(f"{error} (the same error would recur on every attempt: the shard fails now)")
                raise error from exc
            finally:
                attempt.data = None  # the object store may drop the shard now
                attempt.ended = time.perf_counter()
        return attempt

    def _execute(self, attempt: ShardAttempt) -> int | None:
        """RayExecutor.run on the attempt's config; the rows Ray reports."""
        from data_juicer.core.executor.ray_executor import RayExecutor

        executor = RayExecutor(attempt.cfg)
        sink = opcounts.new_sink() if opcounts.enabled() else None
        try:
            executor.datasetbuilder = loader = ShardLoader(executor.cfg, sink, attempt.data)
            with attempt.job.warm.active(attempt.cfg.work_dir):
                dataset = executor.run()
            rows = dataset.data.count() if dataset is not None else None
            if sink:
                opcounts.collect(sink, loader.dataset.op_names, loader.rows_in, rows, attempt.dir)
        finally:
            if sink:
                shutil.rmtree(sink, ignore_errors=True)
        return rows

    def finish(self, attempt: ShardAttempt) -> None:
        """Join Ray's part files, in order, into the attempt's output; check the row count."""
        t2 = time.perf_counter()
        export_path = attempt.dir / EXPORT_NAME
        rows = join_parts(export_path, attempt.output)
        if attempt.expected is not None and rows != attempt.expected:
            raise IntegrityError(
                f"{attempt.output}: joined {rows} rows from {export_path} but Ray reported {attempt.expected}"
            )
        remove(export_path)
        attempt.seconds.update(run=attempt.ended - attempt.started, join=time.perf_counter() - t2)
        self.timings.append({**attempt.seconds, "rows": rows, "start": attempt.started, "end": attempt.ended})
        with open(attempt.dir / LOG_NAME, "a", encoding="utf-8") as log:
            log.write(
                f"shard {Path(attempt.cfg.dataset_path).name}: {rows} rows (load {attempt.seconds['load']:.2f}s, "
                f"Data-Juicer {attempt.seconds['run']:.2f}s, join {attempt.seconds['join']:.2f}s)\n"
            )

    def close(self) -> None:
        """Release the warm actors of every job, and shut down the Ray runtime if this runner started it."""
        for job in self._jobs.values():
            job.warm.close()
        if self._started_ray:
            stop_ray()
            self._started_ray = False
