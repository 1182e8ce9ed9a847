"""Every change this package makes to Ray's internals (written for ``ray>=2.60,<2.61``, the Ray the suite runs).

* ``ray.data.Dataset.map_batches``: routed, process-wide, through a function that
  is inert outside a shard's planning; inside it, actor-mode Data-Juicer ops run
  on the job's warm actors (ray_runner/warm_ops.py) or count their rows;
* Ray Data's backpressure policies: ``ResourceBudgetBackpressurePolicy`` dropped
  from the list (``ray.data._internal.execution.backpressure_policy``);
* the driver's worker-output dispatcher (``ray._private.worker
  .global_worker_stdstream_dispatcher``): the ``ray_print_logs`` handler that prints
  Ray workers' output on the console is replaced by one that writes it to the
  attempt's log (data_juicer_elastic/console.py);
* ``idle_worker_killing_time_threshold_ms`` in ``ray.init``'s private ``_system_config``;
* Ray Data's executor threads, found by their name (``StreamingExecutor-``), are
  waited for before ``ray.shutdown``.

Ray's SIGTERM handler is taken back by the worker (worker/signals.py, ``reassert``):
that one is not listed here, the worker owns it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from data_juicer_elastic.patches import apply, declare

HOST = "ray"
VERSIONS = ">=2.60,<2.61"


def _declare(target: str, purpose: str, without: str) -> str:
    return declare(HOST, target, VERSIONS, purpose, without)


MAP_BATCHES = _declare(
    "ray.data.Dataset.map_batches",
    "actor-mode ops on warm actors kept for the whole job; their rows counted",
    "actors start (and load their models) on every shard; actor-mode ops are not counted",
)
BACKPRESSURE = _declare(
    "ray.data._internal.execution.backpressure_policy.ResourceBudgetBackpressurePolicy",
    "no wait of about a second for the resource budget at each of a shard's executions",
    "Ray's default backpressure (slower shards)",
)
WORKER_OUTPUT = _declare(
    "ray._private.worker.global_worker_stdstream_dispatcher.ray_print_logs",
    "Ray workers' output goes to the attempt's process.log",
    "Ray workers' output is printed on the console",
)
IDLE_WORKERS = _declare(
    "ray.init(_system_config=idle_worker_killing_time_threshold_ms)",
    "idle Ray workers are kept a minute, so a shard's tasks do not start new processes",
    "Ray's default (idle workers killed after a second)",
)
EXECUTOR_THREADS = _declare(
    "ray.data StreamingExecutor-* threads",
    "a failed execution's thread ends before ray.shutdown",
    "ray.shutdown may end the process (exit 1) while such a thread still dispatches",
)

IDLE_WORKER_KEEP_MS = 60_000
_original_map_batches: list[Callable | None] = [None]


def ray_version() -> str:
    import ray

    return str(getattr(ray, "__version__", "unknown"))


def route_map_batches(replacement: Callable) -> bool:
    """``Dataset.map_batches`` calls ``replacement(self, fn, *args, **kw)`` (once per process)."""

    def install() -> bool:
        import ray.data

        if _original_map_batches[0] is None:
            _original_map_batches[0] = ray.data.Dataset.map_batches
        ray.data.Dataset.map_batches = replacement
        return ray.data.Dataset.map_batches is replacement

    return apply(MAP_BATCHES, ray_version(), install)


def original_map_batches(dataset: Any, fn: Any, *args: Any, **kw: Any) -> Any:
    return _original_map_batches[0](dataset, fn, *args, **kw)


def drop_budget_backpressure(ctx: Any) -> bool:
    """Ray Data's resource-budget backpressure off in ``ctx`` (a DataContext); the other policies stay."""

    def install() -> bool:
        from ray.data._internal.execution import backpressure_policy as bp

        key = bp.ENABLED_BACKPRESSURE_POLICIES_CONFIG_KEY
        policies = ctx.get_config(key, bp.ENABLED_BACKPRESSURE_POLICIES)
        names = [p.__name__ for p in policies]
        if "ResourceBudgetBackpressurePolicy" not in names and not hasattr(bp, "ResourceBudgetBackpressurePolicy"):
            raise AttributeError("no ResourceBudgetBackpressurePolicy in this Ray")
        ctx.set_config(key, [p for p in policies if p.__name__ != "ResourceBudgetBackpressurePolicy"])
        return all(p.__name__ != "ResourceBudgetBackpressurePolicy" for p in ctx.get_config(key, policies))

    return _reapply(BACKPRESSURE, install)


def _reapply(target: str, install: Callable[[], bool]) -> bool:
    """A patch made again on every call (a new DataContext each time): checked on each."""
    from data_juicer_elastic.patches import get

    patch = get(target)
    if patch.applied:
        try:
            return install()
        except (AttributeError, ImportError, KeyError, TypeError):
            return False
    return apply(target, ray_version(), install)


def route_worker_output(handler: Callable[[dict], None]) -> bool:
    """Ray workers' output, forwarded to the driver, goes to ``handler`` instead of the console."""

    def install() -> bool:
        from ray._private import worker

        dispatcher = worker.global_worker_stdstream_dispatcher
        dispatcher.remove_handler("ray_print_logs")
        dispatcher.add_handler("ray_print_logs", handler)
        return ("ray_print_logs", handler) in list(dispatcher.handlers)

    return apply(WORKER_OUTPUT, ray_version(), install)


def local_system_config() -> dict[str, Any]:
    """The private ``_system_config`` a local ``ray.init`` gets (an unknown key would fail Ray's start)."""
    return {"idle_worker_killing_time_threshold_ms": IDLE_WORKER_KEEP_MS}


def check_local_system_config() -> bool:
    """After a local ``ray.init``: did the runtime take :func:`local_system_config`?"""

    def took() -> bool:
        from ray._private import worker

        config = worker._global_node._config
        return all(config.get(k) == v for k, v in local_system_config().items())

    return apply(IDLE_WORKERS, ray_version(), took)


def session_dir() -> str | None:
    """The session folder of the local runtime this process started (None when Ray no longer says)."""
    try:
        from ray._private import worker

        return str(worker._global_node.get_session_dir_path())
    except AttributeError:
        return None


def let_executors_end(timeout: float = 10.0) -> None:
    """A failed execution waits only 2 s for its executor thread; one still dispatching when ``ray.shutdown``
    runs makes Ray's core worker end the process (exit 1 instead of the worker's own code and FAIL line)."""
    apply(EXECUTOR_THREADS, ray_version(), _executor_threads_named)
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name.startswith("StreamingExecutor-") and thread is not threading.current_thread():
            thread.join(max(deadline - time.monotonic(), 0.0))


def _executor_threads_named() -> bool:
    """Ray Data still names its executor threads ``StreamingExecutor-<dataset>``."""
    import inspect

    from ray.data._internal.execution import streaming_executor

    try:
        return "StreamingExecutor-" in inspect.getsource(streaming_executor)
    except OSError:  # no source shipped: trust the version range
        return True
