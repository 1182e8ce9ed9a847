"""One shard through Data-Juicer's RayExecutor on this node's own Ray runtime.

A worker process handles many shards, so everything that does not depend on
the shard is done once per job and reused (runtime.py: Ray and custom
operators; configs.py: the parsed recipe). Each attempt then runs in three
stages: ``load`` reads the shard into Ray's object store, ``process`` runs
RayExecutor on it, ``finish`` joins Ray's part files into the attempt's output.

Ray writes a folder of part files, one per write task. With
``preserve_order`` on, write tasks take blocks in input order, so joining
the parts by task index gives the rows in shard order; the joined file is
checked against the dataset's row count and the parts are then removed.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from data_juicer_elastic.console import attempt_log
from data_juicer_elastic.dedup.driver import final_rows, layout_of
from data_juicer_elastic.dedup.layout import DedupLayout
from data_juicer_elastic.dedup.plan import Plan
from data_juicer_elastic.dedup.units import Ops
from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.job.attempt_files import AttemptDir
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.parquet_out import wants_parquet, write_shard_parquet
from data_juicer_elastic.patches import data_juicer as dj_patches
from data_juicer_elastic.ray_runner.arrow_schema import recorded_columns
from data_juicer_elastic.ray_runner.configs import attempt_config, parse_recipe, read_recipe, recipe_source
from data_juicer_elastic.ray_runner.dedup_ops import last_segment, recipe_plan, stage_ops
from data_juicer_elastic.ray_runner.op_counts import collect as op_counts
from data_juicer_elastic.ray_runner.runtime import (
    LOCAL,
    configure_ray_data,
    load_custom_operators_once,
    report_patches,
    start_ray,
    stop_ray,
)
from data_juicer_elastic.ray_runner.shard_errors import arrow_read_options, classify
from data_juicer_elastic.ray_runner.shard_io import ShardLoader, join_parts, read_shard, remove
from data_juicer_elastic.ray_runner.warm_ops import WarmOps, install_warm_ops
from data_juicer_elastic.s3_export import location


def dedup_input(cfg: Any, job: JobDir, found: Plan, layout: DedupLayout, shard: str, adir: Path) -> None:
    """The final pass of a dedup job: the shard's rows as the last dedup leaves them, through the ops after it."""
    path = adir / "dedup-input.jsonl"
    with open(path, "wb") as f:
        for row in final_rows(job, layout, shard):
            f.write(orjson.dumps(row) + b"\n")
    cfg.dataset_path = str(path)
    cfg.process = last_segment(cfg, found)


def recurring(exc: Exception, shard: str, job: _Job) -> Exception:
    """``exc`` if a retry may heal it, else the PermanentError that fails the shard at once (shard_errors)."""
    return classify(exc, shard, job.dir, arrow_read_options(job.cfg, shard, job.dir))


@dataclass
class _Job:
    dir: JobDir  # the job it names: its manifest, recipe and recorded schema are read through its store
    cfg: Any  # the parsed recipe, shared by all attempts of this job
    recipe_sha256: str
    warm: WarmOps  # the actors of its actor-mode ops, kept from shard to shard
    dedup: Any = None  # (plan, layout) where the recipe has deduplicators, else None (dedup/driver.py)


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
    tables: list | None = None  # the processed rows as Arrow tables, in order, where the export is Parquet
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return self.output.parent

    @property
    def files(self) -> AttemptDir:
        return AttemptDir(self.dir)


class RayShardRunner:
    """Runner (see CONTRACTS.md): ``runner(shard_path, output_path, job_dir)``.

    ``ray_address`` is ``"local"`` (start a Ray runtime for this process) or
    the address of a Ray runtime on this node. One instance serves every
    shard a worker process claims; ``close()`` stops a runtime it started.
    """

    runner_factory = True  # `dj-elastic worker --runner data_juicer_elastic.ray_runner.runner:RayShardRunner`

    def __init__(self, ray_address: str = LOCAL, *, log_level: str = "INFO") -> None:
        self.ray_address = ray_address or LOCAL
        self.log_level = log_level
        self._jobs: dict[str, _Job] = {}
        self._started_ray = False
        self._failed_here = False  # an attempt failed in this process: Ray's logs are kept at the stop
        self.timings: list[dict[str, float]] = []  # per attempt: setup / load / run / join seconds, start / end

    def __call__(self, shard_path: str, output_path: str, job_dir: str) -> None:
        self.run(shard_path, output_path, job_dir)

    def prepare_job(self, job_dir: str) -> Any:
        """Everything shard-independent, once per job: versions, Ray, custom ops, the parsed recipe."""
        key = location(job_dir)
        known = self._jobs.get(key)
        if known is not None:
            return known.cfg
        import data_juicer  # noqa: F401  (dj_patches.supported() reads its version)

        if not dj_patches.supported():
            found = dj_patches.data_juicer_version()
            raise UserError(f"RayShardRunner needs Data-Juicer {dj_patches.SUPPORTED_PREFIX}x, found {found}")
        dj_patches.check_runner_patches()
        job = JobDir(key)
        recipe, sha = read_recipe(job, key)
        if job.exists() and job.manifest().recipe_sha256 != sha:
            raise IntegrityError(
                f"{job.recipe_path}: sha256 {sha[:12]}… differs from the manifest's "
                f"{job.manifest().recipe_sha256[:12]}…; the recipe snapshot was changed after prepare"
            )
        operator_paths = [os.path.abspath(p) for p in recipe.get("custom_operator_paths") or []]
        for path in operator_paths if not job.on_object_store else ():  # a local file is never in a store
            if os.path.realpath(path).startswith(os.path.realpath(job.root) + os.sep):
                raise UserError(f"custom_operator_paths entry {path} lies inside the job directory; refusing to run it")
        self._started_ray |= start_ray(self.ray_address, operator_paths)
        configure_ray_data()
        install_warm_ops()  # inert until a shard's plan is built
        report_patches()  # one line naming the Data-Juicer and Ray patches that did not apply
        load_custom_operators_once(operator_paths)
        cfg = parse_recipe(recipe, recipe_source(job, key))
        cfg.custom_operator_paths = operator_paths or None
        found = recipe_plan(cfg)
        dedup = (found, layout_of(job, found)) if found.dedups else None
        self._jobs[key] = _Job(job, cfg, sha, WarmOps(), dedup)  # key: the generation's folder as named (path or URL)
        return cfg

    def dedup_stages(self, job_dir: str) -> tuple[DedupLayout, Ops] | None:
        """The dedup layout and the recipe's code for its stages (dedup/driver.py); None without a deduplicator."""
        key = location(job_dir)
        self.prepare_job(key)
        job = self._jobs[key]
        if job.dedup is None:
            return None
        found, layout = job.dedup
        return layout, stage_ops(job.cfg, found)

    def run(self, shard_path: str, output_path: str, job_dir: str) -> None:
        """The whole attempt in this thread: load, process, finish."""
        self.finish(self.process(self.load(shard_path, output_path, job_dir)))

    # The three stages of an attempt; the worker may overlap one attempt's load and
    # finish with another's process (worker/prefetch.py). Only ``process`` plans
    # and runs Data-Juicer's ops; ``load`` and ``finish`` are safe in another thread.
    def load(self, shard_path: str, output_path: str, job_dir: str) -> ShardAttempt:
        """Parse the job once, then read the shard into Ray's object store."""
        t0 = time.perf_counter()
        key = location(job_dir)
        base = self.prepare_job(key)
        configure_ray_data()
        cfg = attempt_config(base, os.path.abspath(shard_path), str(Path(output_path).parent))
        job = self._jobs[key]
        if job.dedup is not None:
            dedup_input(cfg, job.dir, *job.dedup, Path(shard_path).stem, Path(output_path).parent)
        t1 = time.perf_counter()
        try:
            data = read_shard(cfg, job.dir)
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
        with attempt_log(attempt.files.log, self.log_level):
            from loguru import logger

            attempt.started = time.perf_counter()
            try:
                attempt.expected = self._execute(attempt)
            except Exception as exc:
                self._failed_here = True
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
        sink = op_counts.new_sink() if op_counts.enabled() else None
        try:
            loader = ShardLoader(executor.cfg, sink, attempt.data, attempt.job.dir)
            if not dj_patches.use_shard_loader(executor, loader):
                loader = None  # Data-Juicer reads the shard itself; nothing counted
            with attempt.job.warm.active(attempt.cfg.work_dir):
                dataset = executor.run()
            rows = dataset.data.count() if dataset is not None else None
            cfg = attempt.job.cfg
            if wants_parquet(cfg.get("export_path"), cfg.get("export_type")):
                import ray

                attempt.tables = ray.get(dataset.data.to_arrow_refs()) if dataset is not None else []
            if sink and loader is not None:
                op_counts.collect(sink, loader.dataset.op_names, loader.rows_in, rows, attempt.dir)
        finally:
            if sink:
                shutil.rmtree(sink, ignore_errors=True)
        return rows

    def finish(self, attempt: ShardAttempt) -> None:
        """Join Ray's part files, in order, into the attempt's output; check the row count."""
        t2 = time.perf_counter()
        export_path = attempt.files.ray_export
        rows = join_parts(export_path, attempt.output)
        if attempt.expected is not None and rows != attempt.expected:
            raise IntegrityError(
                f"{attempt.output}: joined {rows} rows from {export_path} but Ray reported {attempt.expected}"
            )
        remove(export_path)
        if attempt.tables is not None:
            self._write_parquet(attempt, rows)
        attempt.seconds.update(run=attempt.ended - attempt.started, join=time.perf_counter() - t2)
        self.timings.append({**attempt.seconds, "rows": rows, "start": attempt.started, "end": attempt.ended})
        with open(attempt.files.log, "a", encoding="utf-8") as log:
            log.write(
                f"shard {Path(attempt.cfg.dataset_path).name}: {rows} rows (load {attempt.seconds['load']:.2f}s, "
                f"Data-Juicer {attempt.seconds['run']:.2f}s, join {attempt.seconds['join']:.2f}s)\n"
            )

    def _write_parquet(self, attempt: ShardAttempt, rows: int) -> None:
        """The same rows as ``processed.parquet``, from Ray's Arrow blocks (values as a Parquet export has them)."""
        import pyarrow as pa

        from data_juicer_elastic.parquet_out import arrow_schema

        columns = recorded_columns(attempt.job.dir)
        tables = [t for t in attempt.tables or [] if t.num_rows]
        attempt.tables = None
        if tables:
            table = pa.concat_tables(tables, promote_options="permissive")
        else:
            table = arrow_schema(columns or []).empty_table()
        if table.num_rows != rows:
            raise IntegrityError(f"{attempt.output}: {rows} rows joined but {table.num_rows} rows in Ray's blocks")
        write_shard_parquet(table, attempt.dir, columns)

    def close(self) -> None:
        """Release the warm actors of every job, and shut down the Ray runtime if this runner started it."""
        for job in self._jobs.values():
            job.warm.close()
        if self._started_ray:
            stop_ray(keep_logs=self._failed_here)
            self._started_ray = False
