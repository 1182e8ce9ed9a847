"""What the activation hook changes in Data-Juicer 1.6, module by module.

* ``data_juicer.config.config``: ``executor_type`` accepts every registered
  executor; the ``elastic_shard.*`` keys exist (typed); an ``elastic_shard``
  recipe is validated and snapshotted right after parsing and custom-operator
  loading, before Data-Juicer writes anything.
* ``data_juicer.core.executor.factory``: ``ExecutorFactory.create_executor``
  falls back to the entry-point registry for names it does not know.
* ``data_juicer.tools.process_data``: ``dj-process`` runs registered
  executors, and reports this package's errors as one message with exit
  code 2 instead of a logged traceback.

Built-in executor types go through the original code unchanged. The
internals touched here are specific to Data-Juicer 1.6.x; on another version
nothing is patched and a recipe asking for ``elastic_shard`` is stopped with
a message that says so.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from types import ModuleType
from typing import Any

from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.plugin import registry
from data_juicer_elastic.plugin.schema import NAME

SUPPORTED_PREFIX = "1.6."

# the parser built most recently by build_base_parser (its defaults feed the snapshot)
_last_parser: list[Any] = [None]


def data_juicer_version() -> str:
    module = sys.modules.get("data_juicer")
    return str(getattr(module, "__version__", "unknown"))


def supported() -> bool:
    return data_juicer_version().startswith(SUPPORTED_PREFIX)


def _asks_for_elastic(argv: list[str]) -> bool:
    """Cheap guess whether this process wants elastic_shard (argv or the --config file mention it)."""
    if any(NAME in a for a in argv):
        return True
    for i, arg in enumerate(argv[:-1]):
        if arg == "--config":
            try:
                with open(argv[i + 1], encoding="utf-8", errors="replace") as f:
                    return NAME in f.read()
            except OSError:
                return False
    return False


def _refuse_unsupported() -> None:
    if _asks_for_elastic(sys.argv[1:]):
        sys.stderr.write(
            f"data-juicer-elastic: executor_type {NAME} needs Data-Juicer {SUPPORTED_PREFIX}x, "
            f"found {data_juicer_version()}; install py-data-juicer>=1.6,<1.7 "
            "(or set DJ_ELASTIC_DISABLE=1 to run without the plugin)\n"
        )
        raise SystemExit(2)


# data_juicer.config.config ----------------------------------------------------------------
def extend_parser(parser: Any) -> Any:
    """Registered executor types become valid choices; the elastic_shard keys are added."""
    from data_juicer_elastic.plugin.schema import add_arguments

    for action in parser._actions:
        if getattr(action, "dest", None) == "executor_type" and action.choices is not None:
            extra = [n for n in registry.names() if n not in action.choices]
            action.choices = list(action.choices) + extra
            if extra:
                action.help = f"{action.help} Registered by plugins: {', '.join(extra)}."
    add_arguments(parser)
    _last_parser[0] = parser
    return parser


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


def patch_config(module: ModuleType) -> bool:
    if not supported():
        _refuse_unsupported()
        return False
    build_base_parser = module.build_base_parser
    init_setup_from_cfg = module.init_setup_from_cfg

    @functools.wraps(build_base_parser)
    def build_base_parser_extended(*args: Any, **kwargs: Any) -> Any:
        return extend_parser(build_base_parser(*args, **kwargs))

    @functools.wraps(init_setup_from_cfg)
    def init_setup_from_cfg_checked(cfg: Any, *args: Any, **kwargs: Any) -> Any:
        # before the original creates the work dir, logs and backups
        on_parsed(cfg, getattr(module, "_normalize_partition_size_config", None))
        if cfg.get("executor_type") == NAME and not cfg.get("work_dir"):
            # Data-Juicer would make a timestamped folder beside export_path on every run
            from data_juicer_elastic.job.layout import DJ_WORK
            from data_juicer_elastic.plugin.schema import settings_from_cfg

            cfg.work_dir = os.path.join(os.path.abspath(settings_from_cfg(cfg).job_dir), DJ_WORK)
        result = init_setup_from_cfg(cfg, *args, **kwargs)
        if cfg.get("executor_type") == NAME:  # after Data-Juicer set its logger up, before the config table
            from data_juicer_elastic.plugin.console import install_story_console
            from data_juicer_elastic.plugin.schema import settings_from_cfg

            install_story_console(settings_from_cfg(cfg).console)
        return result

    display_config = getattr(module, "display_config", None)

    @functools.wraps(display_config)
    def display_config_quiet(cfg: Any) -> Any:
        from data_juicer_elastic.plugin.console import story_on

        if cfg.get("executor_type") == NAME and story_on():
            return None  # the resolved recipe is in the job dir (recipe.yaml) and DJ's work dir backup
        return display_config(cfg)

    module.build_base_parser = build_base_parser_extended
    module.init_setup_from_cfg = init_setup_from_cfg_checked
    if display_config is not None:
        module.display_config = display_config_quiet
    return True


# data_juicer.core.executor.factory --------------------------------------------------------
def patch_factory(module: ModuleType) -> bool:
    if not supported():
        return False
    factory = module.ExecutorFactory
    create_executor = factory.create_executor

    @functools.wraps(create_executor)
    def create_executor_extended(executor_type: str) -> Any:
        if executor_type not in registry.BUILTIN:
            cls = registry.load(executor_type)
            if cls is not None:
                return cls
        return create_executor(executor_type)

    factory.create_executor = staticmethod(create_executor_extended)
    return True


# data_juicer.tools.process_data -----------------------------------------------------------
class _Handoff(BaseException):
    """Carries a parsed config for a registered executor out of the original main.

    A BaseException so the original main's ``logger.catch`` lets it through silently.
    """

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)  # in args, so a copy (pickle) carries it too
        self.cfg = cfg

    def __str__(self) -> str:
        return "handoff"


class _UserFailure(BaseException):
    """Carries an ElasticError out of the original main without a logged traceback."""

    def __init__(self, error: ElasticError) -> None:
        super().__init__(error)
        self.error = error

    def __str__(self) -> str:
        return str(self.error)


def report(error: ElasticError) -> int:
    """The one-line error, after every queued log line (Data-Juicer's loguru sinks write from a thread)."""
    from loguru import logger

    logger.complete()
    sys.stderr.write(f"dj-process: error: {error}\n")
    sys.stderr.flush()
    return error.exit_code


def run_registered(module: ModuleType, cfg: Any, started: float) -> int:
    """Construct and run a registered executor the way dj-process runs built-in ones."""
    from loguru import logger

    logger.info(f"Loading configuration took {time.time() - started:.2f} seconds")

    @logger.catch(reraise=True, exclude=ElasticError)
    def run() -> Any:
        with module.timing_context("Initializing executor"):
            executor = registry.load(cfg.executor_type)(cfg)
        with module.timing_context("Running executor"):
            return executor.run()

    try:
        result = run()
    except ElasticError as exc:
        return report(exc)
    except Exception:  # already logged with its traceback by logger.catch
        return 2
    return result if isinstance(result, int) else 0


def patch_process_data(module: ModuleType) -> bool:
    if not supported():
        return False
    original_main = module.main
    init_configs = module.init_configs

    @functools.wraps(init_configs)
    def init_configs_dispatching(*args: Any, **kwargs: Any) -> Any:
        try:
            cfg = init_configs(*args, **kwargs)
        except ElasticError as exc:
            raise _UserFailure(exc) from None
        if cfg.get("executor_type") not in registry.BUILTIN and registry.is_registered(cfg.get("executor_type")):
            raise _Handoff(cfg)
        return cfg

    @functools.wraps(original_main)
    def main() -> Any:
        started = time.time()
        try:
            return original_main()
        except _UserFailure as failure:
            return report(failure.error)
        except _Handoff as handoff:
            return run_registered(module, handoff.cfg, started)

    module.init_configs = init_configs_dispatching
    module.main = main
    return True
