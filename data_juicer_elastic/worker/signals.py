"""Stop signals (SIGTERM, SIGINT, SIGHUP) become one ``Interrupted`` exception in the main thread.

Schedulers stop jobs with SIGTERM (Kubernetes, PAI-DLC, Slurm), terminals
with SIGINT or SIGHUP. Whatever the phase, the process must release what it
holds and exit ``128 + N``. Libraries running in this process install their
own handlers at any time: Ray's ``ray.init`` sets a SIGTERM handler that
calls ``sys.exit(15)`` on every call, and Data-Juicer's RayExecutor calls
``ray.init`` again for every shard, so a handler restored once after Ray
started is gone by the first shard. While ``signals_raise_interrupted`` is
active, ``signal.signal`` for these three signals is therefore only
recorded, never applied: the guard's handler stays in place until the
outermost guard exits and puts back what was there before.

The first signal raises ``Interrupted``; repeats (a second Ctrl-C, a
scheduler's re-send) are ignored so the release they interrupt can finish.
``received()`` tells code that caught a library's wrapping of the exception
that a stop was asked for.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any, ClassVar

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_apply = signal.signal  # the real one; ``signal.signal`` is replaced while a guard is active


class Interrupted(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT/SIGHUP so the current work stops at once."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    def __reduce__(self) -> tuple:
        return type(self), (self.signum,)


class _State:
    depth = 0
    received: int | None = None
    saved: ClassVar[dict[int, Any]] = {}
    deferred: ClassVar[dict[int, Any]] = {}  # what libraries asked for while the guard held the signal


def received() -> int | None:
    """The stop signal this process got inside the current (or last) guard, if any."""
    return _State.received


def reassert() -> None:
    """Put the guard's handlers back at the C level, where native code may have replaced them.

    Ray's core worker installs a native failure handler for SIGTERM with
    ``sigaction`` (past ``signal.signal``): it logs a stack, passes the signal
    on, and aborts the process three seconds later, cutting any release
    short. Call this after starting such a library.
    """
    if _State.depth and threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            _apply(sig, _on_signal)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _State.received is None:
        _State.received = signum
        raise Interrupted(signum)


def _recorded_signal(signum: Any, handler: Any) -> Any:
    """``signal.signal`` while guarded: the stop signals keep the guard's handler."""
    if _State.depth and signum in SIGNALS and threading.current_thread() is threading.main_thread():
        previous = _State.deferred.get(signum, _on_signal)
        _State.deferred[signum] = handler
        return previous
    return _apply(signum, handler)


class signals_raise_interrupted:
    """Turn SIGTERM/SIGINT/SIGHUP into ``Interrupted`` (reentrant; no-op outside the main thread).

    ``suppress=True`` swallows the ``Interrupted`` that reaches the guard's
    end, for callers that read ``received()`` afterwards.
    """

    def __init__(self, suppress: bool = False) -> None:
        self.suppress = suppress
        self._active = False

    def __enter__(self) -> signals_raise_interrupted:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._active = True
        if _State.depth == 0:
            _State.received = None
            _State.deferred.clear()
            _State.saved.clear()
            _State.saved.update({sig: _apply(sig, _on_signal) for sig in SIGNALS})
            signal.signal = _recorded_signal
        _State.depth += 1
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if not self._active:
            return False
        _State.depth -= 1
        if _State.depth == 0:
            signal.signal = _apply
            for sig, handler in _State.saved.items():
                if handler is not None:  # None: set outside Python, nothing to put back
                    _apply(sig, handler)
        return self.suppress and exc_type is not None and issubclass(exc_type, Interrupted)
