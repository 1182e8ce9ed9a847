"""Stop a losing attempt's runner: the heartbeat thread signals the main thread, which raises ``Fenced``.

An attempt beaten to the done record by its backup, or by the original it
backs up, can never publish, so finishing its runner only wastes the node.
The heartbeat notices from its own thread. Python runs signal handlers in
the main thread, and a signal wakes a blocking call there (a sleep, Ray's
wait), so the heartbeat sends ``FENCE_SIGNAL`` to the main thread and the
handler raises ``Fenced`` there, but only while the runner is running
(``armed``). Outside the main thread (a worker run from a test thread)
nothing is installed and the runner simply runs to its end.
"""

from __future__ import annotations

import signal
import threading

FENCE_SIGNAL = signal.SIGUSR2


class Fenced(BaseException):
    """Raised in the main thread while the runner runs for an attempt that can no longer publish.

    A BaseException, so a runner's ``except Exception`` does not turn it into a failed attempt.
    """


class RunnerStopper:
    """Installed around the claim loop; ``arm(attempt)``/``disarm()`` around each runner call; ``fire(attempt)``
    from that attempt's heartbeat.

    Armed for one attempt at a time: a fire meant for an attempt that is no longer the one running (the
    main thread finished it and armed the next meanwhile) is dropped, both when sent and when it lands.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # fire() against arm()/disarm(); never taken in the handler
        self._owner: object | None = None  # the attempt whose runner runs now
        self._target: object | None = None  # the attempt a fire was sent for
        self._main: int | None = None
        self._old: object = None

    def __enter__(self) -> RunnerStopper:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(FENCE_SIGNAL, self._handle)
            self._main = threading.get_ident()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._main is not None:
            signal.signal(FENCE_SIGNAL, self._old if self._old is not None else signal.SIG_DFL)
            self._main = None

    def arm(self, owner: object) -> None:
        with self._lock:
            self._owner, self._target = owner, None

    def disarm(self) -> None:
        with self._lock:
            self._owner = self._target = None

    def fire(self, owner: object) -> None:
        with self._lock:
            if self._main is None or owner is None or self._owner is not owner:
                return
            self._target = owner
            signal.pthread_kill(self._main, FENCE_SIGNAL)

    def _handle(self, signum: int, frame: object) -> None:
        target = self._target
        if target is not None and target is self._owner:
            self._owner = self._target = None
            raise Fenced()
