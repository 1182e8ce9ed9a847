"""The node-local Ray runtime of a worker process: started (or joined) once, configured, stopped.

A worker handles many shards, so Ray is started once per process and custom
operators are imported once; what starting Ray changes in ``os.environ`` is
put back when the worker stops it.
"""

from __future__ import annotations

import os
import shutil
import threading
from typing import Any

from data_juicer_elastic.console import quiet_ray_console, route_ray_worker_logs
from data_juicer_elastic.patches import ray as ray_patches
from data_juicer_elastic.patches import report
from data_juicer_elastic.ray_runner.fate import Watchdog
from data_juicer_elastic.worker.signals import reassert

LOCAL = "local"
BUDGET_ENV = "DJ_ELASTIC_RAY_BUDGET_BACKPRESSURE"

_ray_lock = threading.Lock()
_loaded_operator_paths: set[str] = set()
_ray_env: dict[str, tuple[str | None, str | None]] = {}  # key -> (before start_ray, as starting Ray left it)
_local: list[tuple[Watchdog, str | None]] = []  # the local runtime this process started: its watchdog, session dir


def start_ray(address: str, py_modules: list[str] | None = None) -> bool:
    """Start (``local``) or join the node-local Ray runtime once; True if this call started it.

    Workers get ``RAY_JOB=1`` (Data-Juicer's Ray mode) and the custom operator
    paths, as Data-Juicer's own ``initialize_ray`` would give them. Ray's
    SIGTERM handler does not replace the worker's while the worker's guard is
    active (see ``interrupts``). What starting it sets in ``os.environ`` is
    recorded for :func:`stop_ray` to undo. A local runtime keeps idle worker
    processes for a minute (Ray kills an idle worker above one per CPU after a
    second, and each shard's read, forward and write tasks would then start new
    ones, 1-2 s each on a busy node). A local runtime dies with this process
    however it dies (``fate``).
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
        local = address in ("", LOCAL)
        if local:
            address, kwargs["include_dashboard"] = LOCAL, False
            kwargs["_system_config"] = ray_patches.local_system_config()
            _local.append((Watchdog.start(), None))
        try:
            ray.init(address=address, **kwargs)
        except BaseException:
            if local:
                _local.pop()[0].release()
            raise
        if local:
            _local[-1] = (_local[-1][0], ray_patches.session_dir())
            _local[-1][0].name_session(_local[-1][1] or "")
        for key in before.keys() | os.environ.keys():
            if before.get(key) != os.environ.get(key):
                _ray_env[key] = (before.get(key), os.environ.get(key))
        reassert()  # Ray's native SIGTERM handler would abort the process 3 s after a stop signal
        if local:
            ray_patches.check_local_system_config()
        route_ray_worker_logs()
        return True


def stop_ray(keep_logs: bool = False) -> str | None:
    """Shut down the runtime :func:`start_ray` started and put back the ``os.environ`` it changed.

    A local runtime's session folder goes once its watchdog found none of its
    processes left; with ``keep_logs`` (an attempt failed here) its logs
    folder stays, named in a warning and returned.

    A local ``ray.init`` exports its runtime's settings, ``RAY_AUTH_MODE=token``
    among them, and ``ray.shutdown`` leaves them. Every process started later
    would inherit them: a worker joining a Ray cluster without token auth
    then rejects the streamed results of its Ray Data tasks
    (``InvalidAuthToken``) and waits on its first shard forever. A key changed
    again since is left as it is.
    """
    import ray

    ray_patches.let_executors_end()
    ray.shutdown()
    kept = None
    while _local:
        watchdog, session = _local.pop()
        swept = watchdog.release()
        if swept and session and not keep_logs:
            remove_session(session)
        elif session:
            kept = keep_only_logs(session)
            why = "an attempt failed here" if keep_logs else "some of its processes outlived the stop"
            from loguru import logger

            logger.warning(f"this node's Ray logs are kept in {kept} ({why})")
    with _ray_lock:
        for key, (old, set_by_ray) in _ray_env.items():
            if os.environ.get(key) != set_by_ray:
                continue
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        _ray_env.clear()
    return kept


def keep_only_logs(session: str) -> str:
    """Of a session folder kept for diagnosis, its ``logs`` folder (returned); the rest (sockets, runtime
    resources, spilled objects) tells nothing."""
    for entry in os.scandir(session) if os.path.isdir(session) else ():
        if entry.name == "logs":
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass
    return os.path.join(session, "logs")


def remove_session(session: str) -> None:
    """Ray's session folder, its ``session_latest`` link when that names it, and Ray's temp folder once empty."""
    shutil.rmtree(session, ignore_errors=True)
    temp = os.path.dirname(session)
    latest = os.path.join(temp, "session_latest")
    if os.path.islink(latest) and os.path.realpath(latest) == os.path.realpath(session):
        try:
            os.unlink(latest)
        except OSError:
            pass
    try:
        os.rmdir(temp)  # another Ray's session keeps it
    except OSError:
        pass


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
        ray_patches.drop_budget_backpressure(ctx)


def report_patches() -> None:
    """One line in this process's log naming the patches that did not apply (none: nothing)."""
    from loguru import logger

    report(logger.warning)


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
