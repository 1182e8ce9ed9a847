"""``dj-elastic prepare --config`` and ``dj-elastic run --config``: a recipe, parsed as dj-process parses it.

Both go through Data-Juicer's own ``init_configs`` with this package's hook
active, so a recipe gets exactly the parse-time checks, defaults and snapshot
it gets under ``dj-process``; command-line settings become the parser's own
``--elastic_shard.*`` / ``--dataset_path`` overrides, which jsonargparse
type-checks like the YAML. Imports Data-Juicer.
"""

from __future__ import annotations

from typing import Any

from .errors import UserError
from .plugin.recipe import snapshot_of
from .plugin.schema import NAME

# dj-elastic prepare option -> the Data-Juicer parser key it overrides
PREPARE_OVERRIDES: dict[str, str] = {
    "dataset_path": "dataset_path",
    "job_dir": f"{NAME}.job_dir",
    "num_shards": f"{NAME}.num_shards",
    "lock_timeout_secs": f"{NAME}.lock_timeout_secs",
    "heartbeat_secs": f"{NAME}.heartbeat_secs",
    "max_retries": f"{NAME}.max_retries",
    "poll_interval_secs": f"{NAME}.poll_interval_secs",
    "ray_address": f"{NAME}.ray_address",
}


def override_args(options: Any) -> list[str]:
    """``--key value`` pairs for every prepare option that was given."""
    args: list[str] = []
    for option, key in PREPARE_OVERRIDES.items():
        value = getattr(options, option, None)
        if value is not None:
            args += [f"--{key}", str(value)]
    return args


def parse_recipe(config: str, extra: list[str], *, load_configs_only: bool) -> tuple[Any, str]:
    """The parsed, validated elastic_shard config and its snapshot (UserError if the plugin is off)."""
    from data_juicer.config import init_configs

    from .plugin import hook

    if hook.disabled():
        raise UserError("DJ_ELASTIC_DISABLE is set: unset it to run elastic_shard recipes")
    cfg = init_configs(["--config", config, "--executor_type", NAME, *extra], load_configs_only=load_configs_only)
    text = snapshot_of(cfg)
    if text is None:  # the hook did not patch this Data-Juicer
        raise UserError(f"{config}: data-juicer-elastic is not active in this interpreter; reinstall the package")
    return cfg, text


def prepare_from_recipe(config: str, cli_overrides: Any = None) -> None:
    """Validate the recipe and prepare its job directory (a no-op if it already holds this request)."""
    from .executor import prepare_request
    from .prepare import prepare

    cfg, text = parse_recipe(config, override_args(cli_overrides), load_configs_only=True)
    prepare(prepare_request(cfg, text))


def run_from_recipe(config: str) -> int:
    """This process's part of the whole job, exactly as ``dj-process --config`` runs it; the exit code."""
    from .executor import ElasticShardExecutor

    cfg, _text = parse_recipe(config, [], load_configs_only=False)
    ElasticShardExecutor(cfg).run()  # raises JobFailed with the job's exit code
    return 0
