"""Where the messages of a job go: the story on the console, the details in each attempt's log.

Every shard runs Data-Juicer's RayExecutor, which logs about 200 lines per
shard (op events, resource plans, Ray execution plans). Those belong to the
attempt, so :func:`attempt_log` writes every message of an attempt to its
``process.log``. The console, once :func:`install_story_console` ran, shows
this project's own lines (elections, one line per shard, takeovers, progress)
and the warnings and errors of Data-Juicer and Ray, each distinct one once per
process, except those that mislead here (:data:`NOT_FOR_THE_STORY`; they stay
in the attempt's log). Libraries' loggers (:data:`LIBRARY_LOGGERS`: botocore says
"Found credentials" on every client) log warnings and up; a line any library
logs through the root logger's console handler (which Data-Juicer's ops set up
with ``logging.basicConfig``) goes to the process's log files, not the console,
unless it is a story line. ``elastic_shard.console: full`` or
``DJ_ELASTIC_CONSOLE=full`` keeps Data-Juicer's, Ray's and the libraries'
console output as they ship it.

This module imports neither Ray nor Data-Juicer (loguru only inside
functions): the loguru and Ray internals it needs are reached through
patches/loguru.py and patches/ray.py.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import warnings
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

CONSOLE_ENV = "DJ_ELASTIC_CONSOLE"
MODES = ("story", "full")
OURS = "data_juicer_elastic"
# Per-attempt details: in process.log only (the worker's own done/failed line says the same in one line).
DETAIL_MODULES = ("data_juicer_elastic.ray_runner.runner",)
# Warnings of Ray or Data-Juicer that are untrue or useless on this console (each stays in the attempt's log):
NOT_FOR_THE_STORY = (
    # Ray Data, when every CPU is held by actors: the warm pools hold theirs on purpose and leave one free
    "does not have any available CPUs",
    # Ray Data's Dataset.filter(fn=...), which Data-Juicer's RayDataset calls for every Filter
    "Use 'expr' instead of 'fn'",
    # Data-Juicer's RayExecutor, once per op and shard: the ops run on the resources Ray gives them
    "Neither the required memory nor cpu of Op[",
    # Data-Juicer's resumption check, on every run: elastic_shard never resumes a Data-Juicer job
    "No config file found in work directory",
    # Ray's local start: the default of this Ray, nothing to act on for a job
    "Token authentication is enabled for this Ray cluster",
    # Ray, with several nodes' Ray instances on one machine (tests, a laptop): each connects to its own
    "Found multiple active Ray instances",
    # Ray Data, once per process: a knob of Ray's, not of a recipe
    "Progress bars disabled",
)
# Loggers of the storage and HTTP libraries: at WARNING in story mode, unless something set a level on them
LIBRARY_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3", "aiobotocore", "s3fs", "fsspec", "moto", "filelock")
STORY_FORMAT = "<green>{time:YYYY-MM-DD HH:mm:ss}</green> | <level>{level: <7}</level> | {message}"

_seen: set[str] = set()
_seen_lock = threading.Lock()
_installed = {"loguru": False, "warnings": False}
_attempt_logs: list[Path] = []  # the log of the attempt running now (Ray's worker output goes there)
# The attempts that ran in this process, most recent last: (log, when it started).
_attempt_times: deque[tuple[Path, datetime]] = deque(maxlen=16)
_last_ended: list[Path] = []  # the log of the attempt that ended last
# loguru's default format, which Data-Juicer's ops use inside Ray workers too: a line starting so says when
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)")


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
    if levelno < logging.WARNING or any(noise in message for noise in NOT_FOR_THE_STORY):
        return False
    return first_time(message)


def _loguru_filter(record: dict) -> bool:
    message = record["message"]
    if record["name"] == "py.warnings":  # one line per distinct warning, wherever it was raised
        message = message.rsplit(" (", 1)[0]
    return story_record(record["name"] or "", record["level"].no, message)


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

    from data_juicer_elastic.patches.loguru import file_sinks_fit, replace_console_sinks

    def add(level: int) -> None:
        logger.add(sys.__stderr__, level=level, format=STORY_FORMAT, filter=_loguru_filter, colorize=None)

    if not _installed["loguru"]:
        if not replace_console_sinks(_is_console, add):  # another loguru: leave its output alone
            return False
        _installed["loguru"] = True
    quiet_libraries(mode)
    file_sinks_fit()  # named in the start-up line if not (plugin/executor.py moves Data-Juicer's log files)
    _route_python_warnings()
    quiet_ray_console()
    return True


def _route_python_warnings() -> None:
    """Python warnings (Ray's, numpy's) as one log line each: in the attempt's log, on the console once.

    ``warnings.showwarning`` is the hook the standard library offers for this.
    """
    if _installed["warnings"]:
        return
    _installed["warnings"] = True

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        from loguru import logger

        text = f"{category.__name__}: {message}"
        logger.patch(lambda r: r.update(name="py.warnings")).warning(f"{text} ({filename}:{lineno})")

    warnings.showwarning = show


class _RayConsoleFilter(logging.Filter):
    """Ray's console handlers keep the story's records; the others, outside an attempt (whose log has
    them from its own handler), go to the process's log (Data-Juicer's loguru log files)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if story_record(record.name, record.levelno, message):
            return True
        if not _attempt_logs:
            from loguru import logger

            logger.patch(lambda r: r.update(name=record.name)).log(record.levelname, message)
        return False


_RAY_FILTER = _RayConsoleFilter()


class _RootConsoleFilter(logging.Filter):
    """The root logger's console handlers keep the story's records; the others go to loguru's file sinks
    (the process's log files, the running attempt's log), never to the console."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if story_record(record.name, record.levelno, message):
            return True
        if not record.name.startswith("ray"):  # Ray's own handlers put its records where they belong
            from loguru import logger

            logger.patch(lambda r: r.update(name=record.name)).log(record.levelname, message)
        return False


_ROOT_FILTER = _RootConsoleFilter()


def quiet_libraries(mode: str | None = None) -> bool:
    """Library loggers at WARNING and the root console handlers on the story (True), unless the console is
    ``full``; a logger someone gave a level keeps it, so a user who asks a library for more gets it."""
    if console_mode(mode) == "full":
        return False
    for name in LIBRARY_LOGGERS:
        lg = logging.getLogger(name)
        if lg.level == logging.NOTSET:
            lg.setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:
        stream = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
        if stream and _is_console(handler.stream) and _ROOT_FILTER not in handler.filters:
            handler.addFilter(_ROOT_FILTER)
    return True


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
    """Ray's worker output (the ops' own prints and errors) goes to the attempt logs, not the console."""
    if not story_on():
        return
    from data_juicer_elastic.patches.ray import route_worker_output

    route_worker_output(_worker_lines_to_attempt_log)


def _attempt_log_for(line: str) -> Path | None:
    """The log a line of Ray worker output belongs in.

    Ray forwards worker output from the workers' log files, a second or more
    late, and its record names the worker's pid, task or actor name, job and
    node, but not the attempt: the same worker processes (and warm actors)
    serve every attempt of this process, and nothing in the record says when
    a line was written. A line that carries its own time (loguru's format,
    which Data-Juicer's ops log with inside Ray workers too) goes to the
    attempt that had started last by then (attempts process one at a time in
    a worker); any other line goes to the attempt running now, or
    to the one that ended last when none runs (the one it most likely belongs
    to), never nowhere.
    """
    m = _STAMP.match(line)
    if m is not None:
        try:
            when = datetime.fromisoformat(m.group(1))
        except ValueError:
            when = None
        if when is not None:  # the attempt that ran then, or that ran last before it
            for path, start in reversed(_attempt_times):
                if start <= when:
                    return path
    if _attempt_logs:
        return _attempt_logs[-1]
    return _last_ended[0] if _last_ended else None


def _worker_lines_to_attempt_log(data: dict) -> None:
    who = f"({data.get('task_name') or data.get('actor_name') or 'ray worker'} pid={data.get('pid')})"
    by_log: dict[Path, list[str]] = {}
    for line in data.get("lines", []):
        path = _attempt_log_for(line)
        if path is not None:
            by_log.setdefault(path, []).append(f"{who} {line}\n")
    for path, lines in by_log.items():
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.writelines(lines)
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
    _attempt_times.append((path, datetime.now()))
    try:
        yield
    finally:
        _attempt_logs.remove(path)
        _last_ended[:] = [path]
        for lg in ray_loggers:
            lg.removeHandler(handler)
        handler.close()
        logger.remove(sink)
