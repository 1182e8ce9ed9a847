"""Every change this package makes to loguru's internals (written for ``loguru>=0.7,<0.8``).

* the console sinks Data-Juicer added (found through ``logger._core.handlers``,
  each handler's ``_sink._stream`` and ``_levelno``: loguru has no public way
  to list sinks) are removed, so the story console replaces them.
"""

from __future__ import annotations

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
