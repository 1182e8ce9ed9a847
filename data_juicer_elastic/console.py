"""Where the messages of a job go: the story on the console, the details in each attempt's log.

Every shard runs Data-Juicer's RayExecutor, which logs about 200 lines per
shard (op events, resource plans, Ray execution plans). Those belong to the
attempt, so :func:`attempt_log` writes every message of an attempt to its
``process.log``. The console, once :func:`install_story_console` ran, shows
this project's own lines (elections, one line per shard, takeovers, progress)
and the warnings and errors of Data-Juicer and Ray, each distinct one once per
process. ``elastic_shard.console: full`` or ``DJ_ELASTIC_CONSOLE=full`` keeps
Data-Juicer's and Ray's console output as they ship it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CONSOLE_ENV = "DJ_ELASTIC_CONSOLE"
MODES = ("story", "full")
OURS = "data_juicer_elastic"
# Per-attempt details: in process.log only (the worker's own done/failed line says the same in one line).
DETAIL_MODULES = ("data_juicer_elastic.plugin.runner",)
STORY_FORMAT = "<green>{time:YYYY-MM-DD HH:mm:ss}</green> | <level>{level: <7}</level> | {message}"

_seen: set[str] = set()
_seen_lock = threading.Lock()
_installed = {"loguru": False}
_attempt_logs: list[Path] = []  # the log of the attempt running now (Ray's worker output goes there)
# Ray forwards worker output from its log files a second or more late: a line that arrives when no attempt
# runs goes to the log of the attempt that ended last (the one it most likely belongs to), not nowhere.
_ended_log: list[Path] = []


def console_mode(configured: str | None = None) -> str:
    """The environment variable wins over the recipe key, so an operator can turn the full output on."""
    mode = (os.environ.get(CONSOLE_ENV) or configured or "story").strip().lower()
    return mode if mode in MODES else "story"


def first_time(text: str) -> bool:
    """True the first time this process sees ``text`` (repeated warnings are shown once)."""
    key = text.strip()[:300]
    with _seen_lock:
        if key in _seen:
            return False
        _seen.add(key)
        return True


def story_record(name: str, levelno: int, message: str) -> bool:
    """Does a message belong on the story console?"""
    if name.startswith(OURS):
        return not name.startswith(DETAIL_MODULES)
    return levelno >= logging.WARNING and first_time(message)


def _loguru_filter(record: dict) -> bool:
    return story_record(record["name"] or "", record["level"].no, record["message"])


def _is_console(stream: Any) -> bool:
    try:
        return stream.fileno() in (1, 2)
    except (AttributeError, OSError, ValueError):
        return False


def install_story_console(mode: str | None = None) -> bool:
    """Replace loguru's console sinks by one that shows the story; True if the story console is on."""
    if console_mode(mode) == "full":
        return False
    from loguru import logger

    handlers = getattr(getattr(logger, "_core", None), "handlers", None)
    if handlers is None:  # another loguru: leave its output alone
        return False
    if not _installed["loguru"]:
        level = logging.INFO
        for hid, handler in list(handlers.items()):
            if _is_console(getattr(getattr(handler, "_sink", None), "_stream", None)):
                level = min(level, getattr(handler, "_levelno", level))
                logger.remove(hid)
        logger.add(sys.__stderr__, level=level, format=STORY_FORMAT, filter=_loguru_filter, colorize=None)
        _installed["loguru"] = True
    quiet_ray_console()
    return True


class _RayConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return story_record(record.name, record.levelno, record.getMessage())


_RAY_FILTER = _RayConsoleFilter()


def quiet_ray_console() -> None:
    """Ray's (and Ray Data's) console handlers keep only warnings and errors, each once."""
    if not story_on():
        return
    names = [n for n in list(logging.Logger.manager.loggerDict) if n == "ray" or n.startswith("ray.")]
    for name in names:
        for handler in getattr(logging.getLogger(name), "handlers", []):
            stream = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            if stream and _RAY_FILTER not in handler.filters:
                handler.addFilter(_RAY_FILTER)


def story_on() -> bool:
    return _installed["loguru"]


def route_ray_worker_logs() -> None:
    """Ray's worker output (the ops' own prints and errors) goes to the running attempt's log, not the console."""
    if not story_on():
        return
    try:
        from ray._private import worker
    except ImportError:
        return
    dispatcher = getattr(worker, "global_worker_stdstream_dispatcher", None)
    if dispatcher is None or not hasattr(dispatcher, "remove_handler"):
        return
    dispatcher.remove_handler("ray_print_logs")
    dispatcher.add_handler("ray_print_logs", _worker_lines_to_attempt_log)


def _worker_lines_to_attempt_log(data: dict) -> None:
    logs = _attempt_logs or _ended_log
    if not logs:
        return
    who = f"({data.get('task_name') or data.get('actor_name') or 'ray worker'} pid={data.get('pid')})"
    try:
        with open(logs[-1], "a", encoding="utf-8") as f:
            f.writelines(f"{who} {line}\n" for line in data.get("lines", []))
    except OSError:
        pass  # its folder is gone (an attempt given back) or unwritable: the line is Ray's session log only


@contextmanager
def attempt_log(path: Path, level: str = "INFO") -> Iterator[None]:
    """Data-Juicer's (loguru) and Ray's (logging) messages of this attempt go to ``path``."""
    from loguru import logger

    quiet_ray_console()  # Ray Data sets its handlers up on first use
    sink = logger.add(str(path), level=level, backtrace=False, diagnose=False, enqueue=False)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    ray_loggers = [logging.getLogger("ray"), logging.getLogger("ray.data")]
    for lg in ray_loggers:
        lg.addHandler(handler)
    _attempt_logs.append(path)
    try:
        yield
    finally:
        _attempt_logs.remove(path)
        _ended_log[:] = [path]
        for lg in ray_loggers:
            lg.removeHandler(handler)
        handler.close()
        logger.remove(sink)
