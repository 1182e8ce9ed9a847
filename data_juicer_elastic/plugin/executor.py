"""``executor_type: elastic_shard``: the whole broadcast job behind ``dj-process``.

``dj-process --config recipe.yaml`` starts the same process on every node;
each one runs :meth:`ElasticShardExecutor.run`, a thin call into
``coordination.run_job``. This module only translates the parsed recipe into
the coordination's :class:`JobSpec`: how to build the prepare request (the
recipe snapshot taken at parse time, the policy, the media and index keys)
and how to build this host's runner (the Ray shard runner, imported only when
a runner is built: the front door does not load ray_runner/).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from data_juicer.core.executor.base import ExecutorBase
from jsonargparse import Namespace
from loguru import logger

from data_juicer_elastic.coordination.session import JobSpec, run_job
from data_juicer_elastic.errors import JobFailed, UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.job.versions import current_versions
from data_juicer_elastic.plugin.recipe import snapshot_of
from data_juicer_elastic.plugin.schema import NAME, ElasticShardSettings, settings_from_cfg
from data_juicer_elastic.plugin.validation import recipe_keys
from data_juicer_elastic.prepare.driver import PrepareRequest
from data_juicer_elastic.prepare.existing import prepared_shard_count
from data_juicer_elastic.prepare.inputs import dataset_root, discover
from data_juicer_elastic.s3_export import location
from data_juicer_elastic.storage.mounts import job_dir_location
from data_juicer_elastic.watch import ProgressTicker

AUTO_SHARD_BYTES = 256 << 20  # num_shards "auto": at most about this much input per shard
AUTO_SHARDS_PER_NODE = 4  # ... and at least this many shards per expected node, so a slow node is not the tail
AUTO_SHARDS_NODES_UNSET = 8  # ... or this many when the recipe does not say how many nodes take part
AUTO_MIN_SHARD_BYTES = 64 << 10  # ... but no shard below this size for those extra shards


def input_bytes(dataset_path: str, job_dir: str | None = None) -> int:
    """Size of the input files exactly as prepare will find them (``prepare.inputs.discover``).

    The same discovery, so links, the staging folders and a job dir inside the
    dataset count here as they do in prepare.
    """
    exclude = (job_dir,) if job_dir else ()
    return sum(spec.seen.size for spec in discover(dataset_path, exclude=exclude).inputs)


def parquet_row_groups(dataset_path: str, job_dir: str | None = None) -> int | None:
    """Row groups of a Parquet input (a shard holds whole row groups, so at most this many shards); None: JSONL."""
    exclude = (job_dir,) if job_dir else ()
    dataset = discover(dataset_path, exclude=exclude)
    if not dataset.parquet:
        return None
    import pyarrow.parquet as pq

    try:
        return sum(pq.read_metadata(spec.path).num_row_groups for spec in dataset.inputs)
    except Exception:  # an unreadable file: prepare names it
        return None


def auto_num_shards(dataset_path: str, nodes: int | None = None, job_dir: str | None = None) -> int:
    """Several shards per node, so nodes that finish early take over the remaining work.

    One shard per AUTO_SHARD_BYTES at least; at least AUTO_SHARDS_PER_NODE per expected node (or
    AUTO_SHARDS_NODES_UNSET without ``nodes``) as long as each keeps AUTO_MIN_SHARD_BYTES; never fewer
    than one per node, and a multiple of ``nodes``. The reasoning is logged in one line."""
    size = input_bytes(dataset_path, job_dir)
    by_size = max(1, math.ceil(size / AUTO_SHARD_BYTES))
    floor = AUTO_SHARDS_PER_NODE * nodes if nodes else AUTO_SHARDS_NODES_UNSET
    room = max(1, size // AUTO_MIN_SHARD_BYTES)
    shards = max(by_size, min(floor, room))
    if nodes:
        shards = math.ceil(max(shards, nodes) / nodes) * nodes
    logger.info(
        f"num_shards auto: {shards} for {size / (1 << 20):.1f} MiB of input "
        f"(one per {AUTO_SHARD_BYTES >> 20} MiB: {by_size}; "
        + (f"{AUTO_SHARDS_PER_NODE} per node for nodes={nodes}" if nodes else "nodes unset")
        + f": at least {floor}, each at least {AUTO_MIN_SHARD_BYTES >> 10} KiB: at most {room}"
        + (f"; a multiple of nodes={nodes}" if nodes else "")
        + ")"
    )
    groups = parquet_row_groups(dataset_path, job_dir)
    if groups is not None and 0 < groups < shards:
        logger.info(f"num_shards auto: {groups}, the input's Parquet row groups (a row group is never split)")
        shards = groups
    return shards


def policy_from(settings: ElasticShardSettings, dataset_path: str) -> Policy:
    n = settings.num_shards
    num_shards = (
        int(n)
        if n != "auto"
        else prepared_shard_count(settings.job_dir) or auto_num_shards(dataset_path, settings.nodes, settings.job_dir)
    )
    return Policy(
        num_shards=num_shards,
        lock_timeout_secs=float(settings.lock_timeout_secs),
        heartbeat_secs=float(settings.heartbeat_secs),
        max_retries=int(settings.max_retries),
        poll_interval_secs=float(settings.poll_interval_secs),
        ray_address=settings.ray_address,
    )


def prepare_request(cfg: Any, recipe_text: str) -> PrepareRequest:
    """The prepare request of a parsed, validated elastic_shard config."""
    settings = settings_from_cfg(cfg)
    dataset_path = dataset_root(cfg.dataset_path)
    keys = recipe_keys(cfg)
    return PrepareRequest(
        dataset_path=dataset_path,
        job_dir=job_dir_location(settings.job_dir),
        recipe_text=recipe_text.encode("utf-8"),
        policy=policy_from(settings, dataset_path),
        media_keys=keys.media_keys,
        index_keys=keys.index_keys,
        versions=current_versions(),
    )


def make_runner(job_dir: str) -> Any:
    """This host's RayShardRunner for one generation's folder, started now (Ray, custom operators, recipe)
    to fail fast."""
    from data_juicer_elastic.ray_runner.runner import RayShardRunner

    runner = RayShardRunner(ray_address=JobDir(job_dir).manifest().policy.ray_address)
    runner.prepare_job(job_dir)
    return runner


def job_spec(cfg: Any, recipe_text: str) -> JobSpec:
    """What this process is asked to do; the recipe's ``elastic_shard.storage`` becomes the process's S3
    settings first (the environment, which prepare's children and a local Ray inherit)."""
    settings = settings_from_cfg(cfg)
    settings.storage.apply()
    job_dir = job_dir_location(settings.job_dir)
    return JobSpec(
        job_dir=job_dir,
        export_path=location(cfg.export_path),
        make_prepare_request=lambda: prepare_request(cfg, recipe_text),
        make_runner=make_runner,
        run_id=settings.run_id,
        nodes=settings.nodes,
        require_all_nodes=settings.require_all_nodes,
        max_shards=settings.max_shards,
        prefetch_shards=settings.prefetch_shards,
        wait_timeout_secs=settings.wait_timeout_secs,
        poll_interval_secs=settings.poll_interval_secs,
        allow_version_mismatch=settings.allow_version_mismatch,
        overwrite_output=settings.overwrite_output,
        speculation=settings.speculation_policy(),
    )


def own_log_files(cfg: Any) -> bool:
    """Data-Juicer's log files of this process move into its own log folder (``event_log_dir``, under its
    work dir's job id).

    Data-Juicer names them ``export_<export path relative to the work dir>_time_<second>...``: with the
    export path outside the job dir that name climbs out of the log folder, so every node of a run started
    in the same second writes one shared file, and at exit the first node compresses and removes it while
    the others print a FileNotFoundError traceback. False where the sinks could not be moved.
    """
    from data_juicer_elastic import patches
    from data_juicer_elastic.patches.loguru import rehome_file_sinks

    folder, export = cfg.get("event_log_dir"), cfg.get("export_path")
    if not folder or not export:
        return True
    folder = os.path.abspath(folder)
    ours = re.compile(rf"(export_)?{re.escape(os.path.basename(export))}_time_\d+")

    def rename(path: str) -> str:
        name = os.path.basename(path)
        if os.path.dirname(path) == folder or not ours.match(name):
            return path
        return os.path.join(folder, name if name.startswith("export_") else f"export_{name}")

    moved = rehome_file_sinks(rename)
    patches.report(logger.warning)
    return moved


class ElasticShardExecutor(ExecutorBase):
    """Shards the input over every node sharing ``elastic_shard.job_dir``; see DESIGN.md."""

    def __init__(self, cfg: Namespace | None = None) -> None:
        super().__init__(cfg)
        self.executor_type = NAME
        if self.cfg.get("executor_type") != NAME:
            raise UserError(f"ElasticShardExecutor needs executor_type {NAME}, got {self.cfg.get('executor_type')!r}")
        text = snapshot_of(self.cfg)
        if text is None:
            raise UserError(
                "this config was not parsed with data-juicer-elastic active (no recipe snapshot); "
                "build it with data_juicer.config.init_configs / dj-process, and check DJ_ELASTIC_DISABLE is unset"
            )
        self.recipe_text = text
        own_log_files(self.cfg)
        self.spec = job_spec(self.cfg, text)

    def run(self, load_data_np: int | None = None, skip_return: bool = False) -> None:
        """This process's part of the job; raises JobFailed (with the shared exit code) unless it passed."""
        interval = settings_from_cfg(self.cfg).progress_interval_secs
        with ProgressTicker(self.spec.job_dir, interval, logger.info) as ticker:
            code = run_job(self.spec, log=ticker.story(logger.info))
        scratch = node_local_work_dir(self.cfg, self.spec.job_dir)
        if code != 0:
            kept = f"; this node's Data-Juicer logs are kept in {scratch}" if scratch else ""
            error = JobFailed(
                f"elastic_shard job {self.spec.job_dir} ended with exit code {code} (see the FAIL line above); "
                f"`dj-elastic status --job-dir {self.spec.job_dir}` shows each shard{kept}"
            )
            error.exit_code = code
            raise error
        if scratch:
            remove_work_dir(scratch)


def node_local_work_dir(cfg: Any, job_dir: str) -> str | None:
    """Data-Juicer's work dir when this package put it in node-local scratch (an object-store job dir):
    ``$TMPDIR/dje-<hash>/dj-work`` (``front_door.dj_work_dir``; told by its place, as naming it again would
    reach the store), which Data-Juicer may have given a job id folder."""
    import tempfile

    from data_juicer_elastic.job.layout import DJ_WORK
    from data_juicer_elastic.storage.urls import is_s3

    work_dir = os.path.abspath(cfg.get("work_dir") or "/")
    if os.path.basename(os.path.dirname(work_dir)) == DJ_WORK:  # Data-Juicer's job id folder in it
        work_dir = os.path.dirname(work_dir)
    parent = os.path.dirname(work_dir)
    ours = os.path.basename(work_dir) == DJ_WORK and os.path.basename(parent).startswith("dje-")
    if not (is_s3(job_dir) and ours and os.path.dirname(parent) == os.path.abspath(tempfile.gettempdir())):
        return None
    return work_dir


def remove_work_dir(work_dir: str) -> None:
    """A clean run's node-local work dir, and its ``dje-<hash>`` folder once empty; Data-Juicer's log files
    there are closed first (at exit they would fail to compress)."""
    import shutil

    from data_juicer_elastic.patches.loguru import drop_file_sinks_under

    if not drop_file_sinks_under(work_dir):
        return  # a sink may still write there: kept
    shutil.rmtree(work_dir, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(work_dir))
    except OSError:
        pass  # another run of this job on this node, or an attempt's scratch, still uses it
