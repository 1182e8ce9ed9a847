"""The ``data_juicer.executors`` entry-point group: executors from any package.

Data-Juicer 1.6 knows its executors by a closed if/elif. Any installed
distribution may declare more::

    [options.entry_points]
    data_juicer.executors =
        my_type = my_pkg.module:MyExecutor   # an ExecutorBase subclass

The names become valid ``executor_type`` values and ``dj-process`` /
``ExecutorFactory.create_executor`` construct them. Built-in names always
keep their built-in meaning. Listing names reads package metadata only;
a class is imported when it is asked for.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points

GROUP = "data_juicer.executors"

# executor_type values Data-Juicer 1.6 handles itself; never overridden
BUILTIN = ("default", "local", "ray", "ray_partitioned")


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=GROUP):
        if ep.name not in BUILTIN:
            found.setdefault(ep.name, ep)  # first distribution on sys.path wins, like imports
    return found


def names() -> list[str]:
    """Registered executor types (built-ins excluded), sorted."""
    return sorted(_entry_points())


def is_registered(name: str) -> bool:
    return name in _entry_points()


def load(name: str) -> type | None:
    """The executor class registered as ``name``, or None if there is none.

    Raises TypeError when the entry point does not name an ExecutorBase subclass.
    """
    ep = _entry_points().get(name)
    if ep is None:
        return None
    cls = ep.load()
    from data_juicer.core.executor.base import ExecutorBase

    if not (isinstance(cls, type) and issubclass(cls, ExecutorBase)):
        raise TypeError(f"entry point {GROUP}:{name} = {ep.value} is not an ExecutorBase subclass")
    return cls


def refresh() -> None:
    """Forget the cached entry points (after installing a package at run time, in tests)."""
    _entry_points.cache_clear()
