"""A runner's three stages, and the two ways the worker loop runs a stage.

A runner opts in to look-ahead with three methods, ``load(shard, output,
job_dir)`` (any thread), ``process(loaded)`` (the main thread, where SIGTERM
lands) and ``finish(processed)`` (any thread); a plain runner callable is run
whole in the process stage, so its shard time is its processing time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any


@dataclass
class Stages:
    """A runner's three stages (a plain runner: everything in ``process``)."""

    load: Callable[[str, str, str], Any]
    process: Callable[[Any], Any]
    finish: Callable[[Any], None]

    @classmethod
    def of(cls, runner: Any) -> Stages:
        if all(callable(getattr(runner, n, None)) for n in ("load", "process", "finish")):
            return cls(runner.load, runner.process, runner.finish)
        return cls(lambda *args: args, lambda args: runner(*args), lambda _: None)


def in_thread(fn: Callable[..., Any], *args: Any) -> Future:
    """``fn(*args)`` in a daemon thread (a stopping worker never waits for it to exit)."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # handed to whoever waits on the future
            future.set_exception(exc)

    threading.Thread(target=run, name=f"dje-{getattr(fn, '__name__', 'stage')}", daemon=True).start()
    return future


def at_once(fn: Callable[..., Any], *args: Any) -> Future:
    """``fn(*args)`` in this thread, as a finished future (its error re-raised by ``result()``).

    Only ``Exception``: a signal's ``Interrupted`` or a fence's ``Fenced`` goes straight to the loop.
    """
    future: Future = Future()
    try:
        future.set_result(fn(*args))
    except Exception as exc:
        future.set_exception(exc)
    return future
