"""``dj-elastic prepare --config`` and ``dj-elastic run --config``: a recipe, parsed as dj-process parses it.

Both go through Data-Juicer's own ``init_configs`` with this package's hook
active, so a recipe gets exactly the parse-time checks, defaults and snapshot
it gets under ``dj-process``; command-line settings become the parser's own
``--elastic_shard.*`` / ``--dataset_path`` overrides, which jsonargparse
type-checks like the YAML. Imports Data-Juicer.
"""

from __future__ import annotations

from typing import Any

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.plugin.schema import NAME

# dj-elastic prepare options that override elastic_shard keys of the same name
PREPARE_SETTINGS = (
    "job_dir",
    "num_shards",
    "lock_timeout_secs",
    "heartbeat_secs",
    "max_retries",
    "poll_interval_secs",
    "ray_address",
)


def override_args(options: Any) -> list[str]:
    """``--key value`` pairs for every prepare option that was given."""
    keys = {"dataset_path": "dataset_path", **{name: f"{NAME}.{name}" for name in PREPARE_SETTINGS}}
    args: list[str] = []
    for option, key in keys.items():
        value = getattr(options, option, None)
        if value is not None:
            args += [f"--{key}", str(value)]
    return args


def executor_for(config: str, extra: list[str], *, load_configs_only: bool) -> Any:
    """The ElasticShardExecutor of a recipe parsed and validated as dj-process parses it."""
    from data_juicer.config import init_configs

    from data_juicer_elastic.plugin import hook
    from data_juicer_elastic.plugin.executor import ElasticShardExecutor

    if hook.disabled():
        raise UserError("DJ_ELASTIC_DISABLE is set: unset it to run elastic_shard recipes")
    cfg = init_configs(["--config", config, "--executor_type", NAME, *extra], load_configs_only=load_configs_only)
    return ElasticShardExecutor(cfg)


def prepare_from_recipe(config: str, cli_overrides: Any = None) -> None:
    """Validate the recipe and prepare its job directory (a no-op if it already holds this request)."""
    from loguru import logger

    from data_juicer_elastic.prepare.driver import prepare
    from data_juicer_elastic.storage.probe import probe_once
    from data_juicer_elastic.storage.store import store_for

    executor = executor_for(config, override_args(cli_overrides), load_configs_only=True)
    probe_once(store_for(executor.spec.job_dir), logger.info)  # before prepare writes: a store without create-once
    prepare(executor.spec.make_prepare_request())


def run_from_recipe(config: str) -> int:
    """This process's part of the whole job, exactly as ``dj-process --config`` runs it; the exit code."""
    executor_for(config, [], load_configs_only=False).run()  # raises JobFailed with the job's exit code
    return 0
