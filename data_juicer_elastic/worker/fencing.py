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
    """Installed around the claim loop; ``arm``/``disarm`` around each runner call; ``fire`` from the heartbeat."""

    def __init__(self) -> None:
        self._armed = threading.Event()
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

    def arm(self) -> None:
        self._armed.set()

    def disarm(self) -> None:
        self._armed.clear()

    def fire(self) -> None:
        if self._main is not None and self._armed.is_set():
            signal.pthread_kill(self._main, FENCE_SIGNAL)

    def _handle(self, signum: int, frame: object) -> None:
        if self._armed.is_set():
            self._armed.clear()
            raise Fenced()
