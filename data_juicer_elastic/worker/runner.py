"""The runner protocol: how the worker hands a shard to whatever processes it."""

from __future__ import annotations

import importlib
from typing import Protocol

from data_juicer_elastic.errors import UserError


class Runner(Protocol):
    """Writes the output JSONL of ``shard_path`` to ``output_path``, inside the attempt's folder; raises to fail."""

    def __call__(self, shard_path: str, output_path: str, job_dir: str) -> None: ...


def load_runner(spec: str) -> Runner:
    """``MODULE:ATTR``; ATTR is the runner, or a factory marked ``runner_factory = True``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UserError(f"--runner {spec!r}: expected MODULE:ATTR, e.g. mypkg.runners:copy_runner")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"--runner {spec!r}: cannot load it ({exc}); check the module is importable") from exc
    return obj() if getattr(obj, "runner_factory", False) else obj


def close_runner(runner: object) -> None:
    """Call the runner's ``close()``, if it has one (a runner that started Ray stops it)."""
    close = getattr(runner, "close", None)
    if callable(close):
        close()
