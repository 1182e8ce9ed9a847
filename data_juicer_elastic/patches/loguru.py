"""Every change this package makes to loguru's internals (written for ``loguru>=0.7,<0.8``).

* the console sinks Data-Juicer added (found through ``logger._core.handlers``,
  each handler's ``_sink._stream`` and ``_levelno``: loguru has no public way
  to list sinks) are removed, so the story console replaces them;
* Data-Juicer's log files (its ``FileSink`` handlers: their path, level, filter,
  serialization and compression read from the handler and the sink) are moved
  into the process's own log folder, and the file left behind is not compressed
  at exit (plugin/executor.py, ``own_log_files``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from data_juicer_elastic.patches import apply, declare

HOST = "loguru"
VERSIONS = ">=0.7,<0.8"

CONSOLE_SINKS = declare(
    HOST,
    "loguru.logger._core.handlers",
    VERSIONS,
    "Data-Juicer's console sinks give way to the story console",
    "the console shows Data-Juicer's full output (as with console: full)",
)


def loguru_version() -> str:
    import loguru

    return str(getattr(loguru, "__version__", "unknown"))


def replace_console_sinks(is_console: Callable[[Any], bool], add: Callable[[int], object]) -> bool:
    """Remove every loguru sink writing to a stream ``is_console`` accepts; ``add(level)`` adds the new one
    at the lowest level the removed ones had (INFO if none). False, and nothing changed, where loguru's
    internals are not as expected."""
    from loguru import logger

    def install() -> bool:
        handlers = logger._core.handlers
        level = 20  # INFO
        console = []
        for hid, handler in list(handlers.items()):
            if is_console(getattr(getattr(handler, "_sink", None), "_stream", None)):
                level = min(level, handler._levelno)
                console.append(hid)
        for hid in console:
            logger.remove(hid)
        add(level)
        return not any(hid in logger._core.handlers for hid in console)

    return apply(CONSOLE_SINKS, loguru_version(), install)


FILE_SINKS = declare(
    HOST,
    "loguru.logger._core.handlers (FileSink._file_path, FileSink._compression_function)",
    VERSIONS,
    "Data-Juicer's log files of each dj-process go to that process's own log folder, so the nodes of one run "
    "never write, compress and remove one shared file",
    "nodes started in the same second may share Data-Juicer's log files (named after the export path and "
    "the second); at exit one compresses and removes them and the others print a FileNotFoundError",
)
# Data-Juicer's setup_logger format (a local variable there)
DJ_FILE_FORMAT = (
    "<green>{time:YYYY-MM-DD HH:mm:ss.SSS}</green> | "
    "<level>{level: <8}</level> | "
    "<cyan>{name}</cyan>:<cyan>{line}</cyan> - <level>{message}</level>"
)


def file_sinks_fit() -> bool:
    """Does this loguru's file sink keep its path and compression where :func:`rehome_file_sinks` reads them?
    (Checked once per process, at start-up with the story console, so a loguru that moved them is named in
    the start-up line.)"""

    def fits() -> bool:
        import inspect

        from loguru._file_sink import FileSink

        source = inspect.getsource(FileSink)
        return all(f"self.{name} =" in source for name in ("_file_path", "_compression_function"))

    return apply(FILE_SINKS, loguru_version(), fits)


def rehome_file_sinks(rename: Callable[[str], str]) -> bool:
    """Every loguru file sink writes to ``rename(its path)`` instead (same level, filter, serialization,
    compression), after what the old file holds; a sink whose path ``rename`` keeps stays as it is. The old
    file is not compressed at exit (that removes it, while other processes may still write it) but removed
    now. False, and nothing changed, where loguru's internals are not as expected."""
    if not file_sinks_fit():
        return False
    try:
        return _rehome(rename)
    except (AttributeError, ImportError, KeyError, TypeError):
        return False


def _rehome(rename: Callable[[str], str]) -> bool:
    import os
    import shutil

    from loguru import logger
    from loguru._file_sink import FileSink

    moved = []  # every internal read before anything changes
    for hid, handler in list(logger._core.handlers.items()):
        sink = handler._sink
        if not isinstance(sink, FileSink) or rename(sink._file_path) == sink._file_path:
            continue
        settings = {
            "level": handler._levelno,
            "filter": handler._filter,
            "serialize": handler._serialize,
            "enqueue": handler._enqueue,
            "compression": sink._compression_function,
        }
        moved.append((hid, sink, sink._file_path, settings))
    added = []
    for hid, sink, old, settings in moved:
        new = rename(old)
        sink._compression_function = None
        logger.remove(hid)  # its queued lines written first
        try:  # what it holds (the start-up's lines) goes first in the new file
            os.makedirs(os.path.dirname(new), exist_ok=True)
            with open(old, "rb") as src, open(new, "ab") as dst:
                shutil.copyfileobj(src, dst)
            os.remove(old)
        except OSError:
            pass
        added.append(logger.add(new, format=DJ_FILE_FORMAT, **settings))
    return all(hid in logger._core.handlers for hid in added)


def drop_file_sinks_under(folder: str) -> bool:
    """Stop every loguru file sink writing under ``folder``, uncompressed (the folder is about to go), so
    that removing it leaves no sink to fail at exit. False, and nothing changed, where loguru's internals
    are not as expected."""
    if not file_sinks_fit():
        return False
    from loguru import logger
    from loguru._file_sink import FileSink

    try:
        under = [
            (hid, handler._sink)
            for hid, handler in list(logger._core.handlers.items())
            if isinstance(handler._sink, FileSink)
            and os.path.abspath(handler._sink._file_path).startswith(os.path.abspath(folder) + os.sep)
        ]
    except (AttributeError, TypeError):
        return False
    for hid, sink in under:
        sink._compression_function = None
        logger.remove(hid)
    return True
