"""Every change this package makes to Data-Juicer 1.6's internals (``py-data-juicer>=1.6,<1.7``).

At parse time (applied by the activation hook, plugin/hook.py, as each module is imported):

* ``config.build_base_parser``: registered executor types become ``executor_type``
  choices and the typed ``elastic_shard.*`` keys are added (the parser's actions);
* ``config.init_setup_from_cfg``: an ``elastic_shard`` recipe is validated and
  snapshotted before Data-Juicer writes anything, its work dir goes into the job
  dir and the story console is set up; another executor's config loses the
  unused ``elastic_shard`` block, so Data-Juicer sees it as shipped;
* ``config.display_config``: no config table on the story console;
* ``ExecutorFactory.create_executor``: names it does not know are looked up in
  the ``data_juicer.executors`` entry points;
* ``process_data.init_configs``: ``dj-process`` runs a registered executor and
  exits with its code (``SystemExit``, which ``main``'s ``logger.catch`` lets
  through untouched), so ``main`` itself is left as shipped.

Per shard, in the Ray shard runner (ray_runner/), checked once when it starts:

* ``RayExecutor.datasetbuilder``: replaced on each executor by the shard loader
  (the shard read once, into Ray's object store);
* ``RayDataset._run_single_op``: overridden in a subclass that lets each op count
  its rows;
* ``Mapper.process``, ``Filter.compute_stats`` / ``process`` of each op instance:
  wrapped to count rows, inside Data-Juicer's own ``catch_map_*_exception``.

What the patches call is handed to them by the layer that owns it, never imported
from it: the activation hook (plugin/hook.py) passes plugin/front_door.py's
functions as a :class:`FrontDoor` to the parse-time patches, and the shard
runner passes ray_runner/op_counts/hooks.py's counters as an :class:`OpCounting`
to the per-shard ones. So this module imports nothing above it (tests/test_layers.py).

Built-in executor types go through Data-Juicer's code unchanged. On another
Data-Juicer version nothing is patched (``strict``) and a recipe asking for
``elastic_shard`` is stopped with a message that says so. docs/UPSTREAM.md
describes the two extension points that would replace most of these.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from data_juicer_elastic.errors import ElasticError
from data_juicer_elastic.patches import apply, declare

HOST = "py-data-juicer"
VERSIONS = ">=1.6,<1.7"
SUPPORTED_PREFIX = "1.6."


def _declare(target: str, purpose: str, without: str) -> str:
    return declare(HOST, target, VERSIONS, purpose, without, strict=True)


PARSER = _declare(
    "data_juicer.config.config.build_base_parser",
    "executor_type choices from the entry points; the typed elastic_shard keys",
    "executor_type elastic_shard is refused by the parser",
)
SETUP = _declare(
    "data_juicer.config.config.init_setup_from_cfg",
    "parse-time validation and snapshot of an elastic_shard recipe; its work dir; the story console from "
    "Data-Juicer's setup_logger on",
    "an elastic_shard recipe cannot run",
)
TABLE = _declare(
    "data_juicer.config.config.display_config",
    "no config table on the story console",
    "the config table is printed",
)
FACTORY = _declare(
    "data_juicer.core.executor.factory.ExecutorFactory.create_executor",
    "registered executor types for ExecutorFactory",
    "ExecutorFactory knows only the built-in types",
)
DISPATCH = _declare(
    "data_juicer.tools.process_data.init_configs",
    "dj-process runs registered executor types",
    "dj-process refuses registered executor types",
)
LOADER = _declare(
    "data_juicer.core.executor.ray_executor.RayExecutor.datasetbuilder",
    "each shard is read once, into Ray's object store, while the previous one runs",
    "Data-Juicer reads each shard itself (three reads)",
)
PLANNING = _declare(
    "data_juicer.core.data.ray_dataset.RayDataset._run_single_op",
    "each op's Ray stages count its rows (ops.json)",
    "no per-op row counts",
)
OP_CALLS = _declare(
    "data_juicer.ops.base_op.Mapper.process / Filter.compute_stats / Filter.process",
    "the op's own batch calls count rows in, out and removed by errors",
    "no per-op row counts",
)


@dataclass(frozen=True)
class FrontDoor:
    """What the parse-time patches call, passed in by the activation hook (plugin/front_door.py owns it)."""

    name: str  # the executor type this package registers (elastic_shard)
    extend_parser: Callable[[Any], Any]  # (parser) -> parser with the registered types and the typed keys
    before_setup: Callable[[Any, Any], None]  # (cfg, normalize) before Data-Juicer's setup
    after_setup: Callable[[Any], None]  # (cfg) after it
    shows_config_table: Callable[[Any], bool]  # (cfg)
    registered_executor: Callable[[str], Any]  # (executor_type) -> a registered executor class, None for the rest
    is_registered_type: Callable[[Any], bool]  # (cfg)
    run_registered: Callable[[Any, Any, float], int]  # (timing_context, cfg, started) -> exit code
    report: Callable[[ElasticError], int]  # (error) -> exit code, after writing it


@dataclass(frozen=True)
class OpCounting:
    """How an op counts its rows, passed in by the shard runner (ray_runner/op_counts/hooks.py owns it).

    The patches below know where in Data-Juicer an op's rows go by; these say what is counted and where to.
    """

    target: Callable[[str | None, int], Any]  # (sink, op index) -> where that op's counts go
    planning: Callable[[Any], AbstractContextManager[None]]  # (target or None) around planning an op's stages
    counting: Callable[[Callable, Any, Callable], Callable]  # (method, target, measure) -> the method, counting
    noting_errors: Callable[[Callable, bool, Any], Callable]  # (method, batched, target) -> counting a raise
    mapped: Callable  # the measures: a Mapper's process,
    entered: Callable  # a Filter's compute_stats,
    kept: Callable  # a batched Filter's process,
    kept_one: Callable  # a per-sample Filter's process


def data_juicer_version() -> str:
    module = sys.modules.get("data_juicer")
    return str(getattr(module, "__version__", "unknown"))


def supported() -> bool:
    return data_juicer_version().startswith(SUPPORTED_PREFIX)


def _replace(owner: Any, name: str, new: Callable, stored: Any = None) -> bool:
    """Set ``owner.name`` (AttributeError if the host has none); True if the host now holds ``new``."""
    getattr(owner, name)
    setattr(owner, name, new if stored is None else stored)
    return getattr(owner, name) is new


def _asks_for_elastic(argv: list[str], name: str) -> bool:
    """Cheap guess whether this process wants executor type ``name`` (argv or the --config file mention it)."""
    if any(name in a for a in argv):
        return True
    for i, arg in enumerate(argv[:-1]):
        if arg == "--config":
            try:
                with open(argv[i + 1], encoding="utf-8", errors="replace") as f:
                    return name in f.read()
            except OSError:
                return False
    return False


def _refuse_unsupported(name: str) -> None:
    if _asks_for_elastic(sys.argv[1:], name):
        sys.stderr.write(
            f"data-juicer-elastic: executor_type {name} needs Data-Juicer {SUPPORTED_PREFIX}x, "
            f"found {data_juicer_version()}; install py-data-juicer>=1.6,<1.7 "
            "(or set DJ_ELASTIC_DISABLE=1 to run without the plugin)\n"
        )
        raise SystemExit(2)


# data_juicer.config.config ----------------------------------------------------------------
def patch_config(module: ModuleType, front_door: FrontDoor) -> bool:
    if not supported():
        _refuse_unsupported(front_door.name)
    version = data_juicer_version()
    build_base_parser = module.build_base_parser
    init_setup_from_cfg = module.init_setup_from_cfg
    display_config = getattr(module, "display_config", None)

    @functools.wraps(build_base_parser)
    def build_base_parser_extended(*args: Any, **kwargs: Any) -> Any:
        return front_door.extend_parser(build_base_parser(*args, **kwargs))

    @functools.wraps(init_setup_from_cfg)
    def init_setup_from_cfg_checked(cfg: Any, *args: Any, **kwargs: Any) -> Any:
        front_door.before_setup(cfg, getattr(module, "_normalize_partition_size_config", None))
        after = _once(lambda: front_door.after_setup(cfg))
        with _after_call(module, "setup_logger", after):  # its next lines (dataset_path ...) miss the console
            result = init_setup_from_cfg(cfg, *args, **kwargs)
        after()
        return result

    @functools.wraps(display_config)
    def display_config_quiet(cfg: Any) -> Any:
        return display_config(cfg) if front_door.shows_config_table(cfg) else None

    ok = apply(PARSER, version, lambda: _replace(module, "build_base_parser", build_base_parser_extended))
    ok = apply(SETUP, version, lambda: _replace(module, "init_setup_from_cfg", init_setup_from_cfg_checked)) and ok
    apply(TABLE, version, lambda: _replace(module, "display_config", display_config_quiet))
    return ok


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    done: list[bool] = []

    def call() -> None:
        if not done:
            done.append(True)
            fn()

    return call


class _after_call:
    """``module.name`` calls ``then()`` after itself while the block runs (nothing if it has no ``name``)."""

    def __init__(self, module: ModuleType, name: str, then: Callable[[], None]) -> None:
        self.module, self.name, self.then = module, name, then
        self.original = getattr(module, name, None)

    def __enter__(self) -> None:
        if callable(self.original):
            original, then = self.original, self.then

            @functools.wraps(original)
            def call_then(*args: Any, **kwargs: Any) -> Any:
                result = original(*args, **kwargs)
                then()
                return result

            setattr(self.module, self.name, call_then)

    def __exit__(self, *exc: object) -> None:
        if callable(self.original):
            setattr(self.module, self.name, self.original)


# data_juicer.core.executor.factory --------------------------------------------------------
def patch_factory(module: ModuleType, front_door: FrontDoor) -> bool:
    factory = module.ExecutorFactory
    create_executor = factory.create_executor

    @functools.wraps(create_executor)
    def create_executor_extended(executor_type: str) -> Any:
        cls = front_door.registered_executor(executor_type)
        return cls if cls is not None else create_executor(executor_type)

    def install() -> bool:
        return _replace(factory, "create_executor", create_executor_extended, staticmethod(create_executor_extended))

    return apply(FACTORY, data_juicer_version(), install)


# data_juicer.tools.process_data -----------------------------------------------------------
def patch_process_data(module: ModuleType, front_door: FrontDoor) -> bool:
    """``main`` stays as shipped: a registered executor runs from inside its ``init_configs`` call and
    ends the process with ``SystemExit`` (a BaseException: ``main``'s ``logger.catch`` ignores it)."""
    init_configs = module.init_configs
    timing_context = module.timing_context

    @functools.wraps(init_configs)
    def init_configs_dispatching(*args: Any, **kwargs: Any) -> Any:
        started = time.time()
        try:
            cfg = init_configs(*args, **kwargs)
        except ElasticError as exc:
            raise SystemExit(front_door.report(exc)) from None
        if front_door.is_registered_type(cfg):
            raise SystemExit(front_door.run_registered(timing_context, cfg, started))
        return cfg

    return apply(DISPATCH, data_juicer_version(), lambda: _replace(module, "init_configs", init_configs_dispatching))


# the Ray shard runner ---------------------------------------------------------------------
def check_runner_patches() -> None:
    """Check once, when a runner starts, that the per-shard patches still fit Data-Juicer."""
    version = data_juicer_version()

    def loader_fits() -> bool:
        from data_juicer.core.executor.ray_executor import RayExecutor

        try:
            source = inspect.getsource(RayExecutor.run)
        except OSError:  # no source shipped: trust the version range
            return True
        return "self.datasetbuilder.load_dataset(" in source

    def planning_fits() -> bool:
        from data_juicer.core.data.ray_dataset import RayDataset

        params = inspect.signature(RayDataset._run_single_op).parameters
        return {"op", "cached_columns", "tracer", "stats_only"} <= set(params)

    def op_calls_fit() -> bool:
        from data_juicer.ops.base_op import Filter, Mapper, catch_map_batches_exception, catch_map_single_exception

        names = ("process_batched", "process_single", "compute_stats_batched", "compute_stats_single")
        return all(callable(x) for x in (catch_map_batches_exception, catch_map_single_exception)) and all(
            hasattr(Mapper if n.startswith("process") else Filter, n) for n in names
        )

    apply(LOADER, version, loader_fits)
    apply(PLANNING, version, planning_fits)
    apply(OP_CALLS, version, op_calls_fit)


def use_shard_loader(executor: Any, loader: Any) -> bool:
    """Give a RayExecutor the shard loader instead of its DatasetBuilder; False: leave its own."""
    from data_juicer_elastic.patches import get

    if not get(LOADER).applied:
        return False
    executor.datasetbuilder = loader
    return True


def counting_ops() -> bool:
    """Whether ops can count their rows on this Data-Juicer."""
    from data_juicer_elastic.patches import get

    return bool(get(PLANNING).applied and get(OP_CALLS).applied)


@functools.cache
def counting_dataset_class(counts: OpCounting) -> type:
    """A RayDataset whose Mappers and Filters count their rows into the folder given to ``count_into``."""
    from data_juicer.core.data.ray_dataset import RayDataset
    from data_juicer.ops.base_op import Filter, Mapper

    class CountingRayDataset(RayDataset):
        count_sink: str | None = None
        op_names: list[tuple[str, str]]  # (name, kind) per op index

        def count_into(self, sink: str | None) -> None:
            self.count_sink, self.op_names, self._targets = sink, [], {}

        def _run_single_op(self, op: Any, cached_columns: Any = None, tracer: Any = None, stats_only: bool = False):
            if self.count_sink is None:
                return super()._run_single_op(op, cached_columns, tracer=tracer, stats_only=stats_only)
            target = self._targets.get(id(op))  # Data-Juicer plans an op again without its runtime_env
            if target is None:
                target = self._targets[id(op)] = counts.target(self.count_sink, len(self.op_names))
                self.op_names.append((op._name, op_kind(op)))
                count_batch_calls(op, target, counts)
            with counts.planning(target if isinstance(op, (Mapper, Filter)) else None):
                return super()._run_single_op(op, cached_columns, tracer=tracer, stats_only=stats_only)

    return CountingRayDataset


def op_kind(op: Any) -> str:
    from data_juicer.ops.base_op import Filter, Mapper

    return "Filter" if isinstance(op, Filter) else "Mapper" if isinstance(op, Mapper) else type(op).__mro__[1].__name__


def count_batch_calls(op: Any, target: Any, counts: OpCounting) -> None:
    """Make ``op``'s batch calls count into ``target`` (read at call time: a warm actor re-aims it per batch)."""
    from data_juicer.ops.base_op import Filter, Mapper

    if isinstance(op, Mapper):
        op.process = counts.counting(_catching(op, "process", target, counts), target, counts.mapped)
    elif isinstance(op, Filter):
        op.compute_stats = counts.counting(_catching(op, "compute_stats", target, counts), target, counts.entered)
        kept = counts.kept if op.is_batched_op() else counts.kept_one
        op.process = counts.counting(_catching(op, "process", target, counts), target, kept)


def _catching(op: Any, attr: str, target: Any, counts: OpCounting) -> Callable:
    """``op``'s ``attr`` as Data-Juicer wraps it, with the rows of a batch that raised counted inside."""
    from data_juicer.ops.base_op import Filter, catch_map_batches_exception, catch_map_single_exception

    if not getattr(op, "skip_op_error", False):
        return getattr(op, attr)  # an error fails the attempt: nothing to count
    batched = op.is_batched_op()
    raw = getattr(op, f"{attr}_batched" if batched else f"{attr}_single")
    noted = counts.noting_errors(raw, batched, target)
    if batched:
        return catch_map_batches_exception(noted, skip_op_error=True, op_name=op._name)
    keep = not (isinstance(op, Filter) and attr == "process")
    return catch_map_single_exception(noted, return_sample=keep, skip_op_error=True, op_name=op._name)
