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

Python runs a signal handler between any two bytecodes of the main thread,
also inside callbacks whose exceptions it only prints ("Exception ignored
in"): ``__del__`` methods and the ``os.register_at_fork`` hooks run around
every fork (Ray forks its processes while it starts). An ``Interrupted``
raised there is lost, and the stop with it, since repeats are ignored;
raised in logging's or loguru's after-fork hook it also leaves their locks
held, and the next log call blocks for good (loguru's locks are not
reentrant: the main thread's own too). So while a fork is under way the
first signal is deferred, and an ``Interrupted`` that Python swallowed is
owed again: either way a helper thread sends the signal to the main thread
again until an ``Interrupted`` is raised where code can catch it.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
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
    owed = False  # the first signal's Interrupted has not yet been raised where code can catch it
    unraisablehook: Any = None  # sys.unraisablehook before the outermost guard
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
        _enclose_fork_hooks()
        for sig in SIGNALS:
            _apply(sig, _on_signal)


_forks: list[None] = []  # an entry per fork under way and pair of our at-fork hooks
_resending = threading.Lock()  # held by the one helper thread that sends the owed signal again
RESEND_SECS = 0.05


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _State.received is None:
        _State.received, _State.owed = signum, True
    if not _State.owed:
        return  # a repeat
    if _forks or _inside(frame, _NO_RAISE):  # Python would swallow it here: raised when the helper sends it again
        _resend()
        return
    _State.owed = False
    raise Interrupted(_State.received)


def _inside(frame: FrameType | None, codes: frozenset) -> bool:
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def _resend() -> None:
    """Start the helper that sends the owed signal to the main thread until it was raised, unless it runs."""
    if _State.depth and _resending.acquire(blocking=False):
        threading.Thread(target=_resend_while_owed, name="dje-signal-resend", daemon=True).start()


def _resend_while_owed() -> None:
    main = threading.main_thread().ident or 0
    while True:
        time.sleep(RESEND_SECS)  # the main thread leaves the callback that deferred or swallowed it
        signum = _State.received
        if _State.owed and _State.depth and signum is not None:
            signal.pthread_kill(main, signum)
            continue
        _resending.release()  # then go on only if it is owed again and no new helper took over
        if not (_State.owed and _State.depth and _resending.acquire(blocking=False)):
            return


def _unraisable(unraisable: Any) -> None:
    """``sys.unraisablehook`` while guarded: an ``Interrupted`` Python swallowed is owed again."""
    if _State.depth and isinstance(unraisable.exc_value, Interrupted):
        _State.owed = True
        _resend()
        return
    (_State.unraisablehook or sys.__unraisablehook__)(unraisable)


def _fork_ended() -> None:
    """After a fork, in the parent: a signal deferred while it forked is sent again."""
    if _forks:
        _forks.pop()
    if _State.owed:
        _resend()


def _fork_ended_in_child() -> None:
    global _resending
    _forks.clear()
    _State.owed = False  # the stop was the parent's
    _resending = threading.Lock()


_NO_RAISE = frozenset({_on_signal.__code__, _unraisable.__code__, _fork_ended.__code__})
_modules_enclosed = 0  # len(sys.modules) when the fork window's hooks were last registered


def _enclose_fork_hooks() -> None:
    """Register the fork window's hooks again if modules were imported since (they register theirs on import).

    "before" hooks run newest first and "after" hooks newest last, so the
    newest pair encloses every hook registered before it: logging's and
    loguru's, which take and release their locks, and those of what Ray
    imports (``ray.init`` calls ``signal.signal`` before it forks).
    """
    global _modules_enclosed
    if len(sys.modules) != _modules_enclosed:
        _modules_enclosed = len(sys.modules)
        os.register_at_fork(
            before=functools.partial(_forks.append, None),  # C code: no handler runs inside it
            after_in_parent=_fork_ended,
            after_in_child=_fork_ended_in_child,
        )


def _recorded_signal(signum: Any, handler: Any) -> Any:
    """``signal.signal`` while guarded: the stop signals keep the guard's handler."""
    if _State.depth and threading.current_thread() is threading.main_thread():
        _enclose_fork_hooks()  # a library starting up (Ray) may fork next
        if signum in SIGNALS:
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
            _State.received, _State.owed = None, False
            _State.deferred.clear()
            _State.saved.clear()
            _State.saved.update({sig: _apply(sig, _on_signal) for sig in SIGNALS})
            signal.signal = _recorded_signal
            _State.unraisablehook, sys.unraisablehook = sys.unraisablehook, _unraisable
            _enclose_fork_hooks()
        _State.depth += 1
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if not self._active:
            return False
        _State.depth -= 1
        if _State.depth == 0:
            signal.signal = _apply
            if sys.unraisablehook is _unraisable:
                sys.unraisablehook = _State.unraisablehook
            _State.owed = False
            for sig, handler in _State.saved.items():
                if handler is not None:  # None: set outside Python, nothing to put back
                    _apply(sig, handler)
        return self.suppress and exc_type is not None and issubclass(exc_type, Interrupted)
