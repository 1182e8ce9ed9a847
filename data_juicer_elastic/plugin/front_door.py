"""What the Data-Juicer patches (patches/data_juicer.py) do once they are in place.

The patches decide where this package steps into Data-Juicer; this module
decides what happens there: the parser gains the registered executor types
and the ``elastic_shard`` keys, an ``elastic_shard`` recipe is validated and
snapshotted before Data-Juicer writes anything, and ``dj-process`` runs a
registered executor the way it runs its own. A recipe for any other executor
goes through Data-Juicer exactly as shipped.

The patches do not import this module: the activation hook (plugin/hook.py)
hands them :func:`door`, these functions as a ``patches.data_juicer.FrontDoor``.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from data_juicer_elastic.errors import ElasticError, UserError, store_error
from data_juicer_elastic.patches.data_juicer import FrontDoor
from data_juicer_elastic.plugin import registry
from data_juicer_elastic.plugin.schema import KEY, NAME

# the parser built most recently by build_base_parser (its defaults feed the snapshot)
_last_parser: list[Any] = [None]


def extend_parser(parser: Any) -> Any:
    """Registered executor types become valid choices; the elastic_shard keys are added."""
    from data_juicer_elastic.plugin.schema import add_arguments, suggest_keys

    for action in parser._actions:
        if getattr(action, "dest", None) == "executor_type" and action.choices is not None:
            extra = [n for n in registry.names() if n not in action.choices]
            action.choices = list(action.choices) + extra
            if extra:
                action.help = f"{action.help} Registered by plugins: {', '.join(extra)}."
    add_arguments(parser)
    suggest_keys(parser)
    _last_parser[0] = parser
    return parser


@contextmanager
def store_errors_as_one_line() -> Iterator[None]:
    """A store or network failure (botocore's, an OSError) leaves as a UserError, so ``dj-process`` prints
    one line naming the URL and what to check and exits 2, as ``dj-elastic`` does, instead of a traceback."""
    try:
        yield
    except ElasticError:
        raise
    except Exception as exc:
        line = store_error(exc, "elastic_shard.storage.endpoint_url, AWS_ENDPOINT_URL")
        if line is None:
            raise
        raise UserError(line) from exc


def on_parsed(cfg: Any, normalize: Any = None) -> None:
    """For elastic_shard: validate the recipe and take its snapshot (raises UserError).

    ``normalize`` is applied to the parser defaults as Data-Juicer already
    applied it to ``cfg``, so its rewrites do not count as recipe settings.
    """
    if cfg.get("executor_type") != NAME:
        return
    from data_juicer.ops.base_op import OPERATORS

    from data_juicer_elastic.plugin.recipe import effective_process, effective_recipe, remember, to_yaml
    from data_juicer_elastic.plugin.validation import validate

    parser = _last_parser[0]
    defaults = parser.get_defaults() if parser is not None else {}
    if normalize is not None and defaults:
        normalize(defaults)
    process = effective_process(cfg, defaults)
    config = cfg.get("config")
    validate(cfg, process, source=os.path.abspath(str(config[0])) if config else None)
    remember(cfg, to_yaml(effective_recipe(cfg, defaults, frozenset(OPERATORS.modules))))


def before_setup(cfg: Any, normalize: Any = None) -> None:
    """Before Data-Juicer's setup creates its work dir, logs and backups.

    Another executor's config loses the (unused, default) ``elastic_shard``
    block the extended parser gave it, so Data-Juicer's config table, backup
    and executor see the config as shipped.
    """
    if cfg.get("executor_type") != NAME:
        if KEY in cfg:
            del cfg[KEY]
        return
    from data_juicer_elastic.console import quiet_libraries
    from data_juicer_elastic.plugin.schema import settings_from_cfg

    block = cfg.get(KEY)
    quiet_libraries(block.get("console") if hasattr(block, "get") else None)  # before validation opens the store
    with store_errors_as_one_line():
        on_parsed(cfg, normalize)
    if not cfg.get("work_dir"):
        # Data-Juicer would make a timestamped folder beside export_path on every run
        cfg.work_dir = dj_work_dir(settings_from_cfg(cfg).job_dir)


def dj_work_dir(job_dir: str) -> str:
    """Data-Juicer's work dir (its logs, its config backup): ``<job_dir>/dj-work`` on a POSIX job dir; on an
    object store, where nothing is a local file, the node-local ``$TMPDIR/dje-<hash of the store>/dj-work``
    (the naming of worker/placement.py's scratch, with no generation: one folder per job dir and node)."""
    from data_juicer_elastic.job.layout import DJ_WORK, JobDir
    from data_juicer_elastic.storage.urls import is_s3

    if not is_s3(job_dir):
        return os.path.join(os.path.abspath(job_dir), DJ_WORK)
    from data_juicer_elastic.worker.placement import scratch_base

    return str(scratch_base(JobDir(job_dir, generation="")) / DJ_WORK)


def after_setup(cfg: Any) -> None:
    """After Data-Juicer set its logger up, before the config table: the story console, then one line
    naming any patch that did not apply."""
    if cfg.get("executor_type") != NAME:
        return
    from loguru import logger

    from data_juicer_elastic import patches
    from data_juicer_elastic.console import install_story_console
    from data_juicer_elastic.plugin.schema import settings_from_cfg

    install_story_console(settings_from_cfg(cfg).console)
    patches.report(logger.warning)


def shows_config_table(cfg: Any) -> bool:
    """The resolved recipe of an elastic job is in the job dir (recipe.yaml) and Data-Juicer's work dir backup."""
    from data_juicer_elastic.console import story_on

    return not (cfg.get("executor_type") == NAME and story_on())


def registered_executor(executor_type: str) -> Any:
    """The executor class registered for ``executor_type``; None for built-in and unknown types."""
    return None if executor_type in registry.BUILTIN else registry.load(executor_type)


def is_registered_type(cfg: Any) -> bool:
    executor_type = cfg.get("executor_type")
    return executor_type not in registry.BUILTIN and registry.is_registered(executor_type)


def report(error: ElasticError) -> int:
    """The one-line error, after every queued log line (Data-Juicer's loguru sinks write from a thread)."""
    from loguru import logger

    logger.complete()
    sys.stderr.write(f"dj-process: error: {error}\n")
    sys.stderr.flush()
    return error.exit_code


def run_registered(timing_context: Any, cfg: Any, started: float) -> int:
    """Construct and run a registered executor the way dj-process runs built-in ones; the exit code."""
    from loguru import logger

    logger.info(f"Loading configuration took {time.time() - started:.2f} seconds")

    @logger.catch(reraise=True, exclude=ElasticError)
    def run() -> Any:
        with store_errors_as_one_line():
            with timing_context("Initializing executor"):
                executor = registry.load(cfg.executor_type)(cfg)
            with timing_context("Running executor"):
                return executor.run()

    try:
        result = run()
    except ElasticError as exc:
        return report(exc)
    except Exception:  # already logged with its traceback by logger.catch
        return 2
    return result if isinstance(result, int) else 0


@functools.cache
def door() -> FrontDoor:
    """This module's functions, as the Data-Juicer patches take them (the activation hook passes them in)."""
    return FrontDoor(
        name=NAME,
        extend_parser=extend_parser,
        before_setup=before_setup,
        after_setup=after_setup,
        shows_config_table=shows_config_table,
        registered_executor=registered_executor,
        is_registered_type=is_registered_type,
        run_registered=run_registered,
        report=report,
    )
