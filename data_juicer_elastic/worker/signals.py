"""SIGTERM/SIGINT as an exception, so a running shard (or a coordinator) stops at once and says so."""

from __future__ import annotations

import signal
import threading


class Interrupted(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT so a running shard stops at once."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    def __reduce__(self) -> tuple:
        return type(self), (self.signum,)


class signals_raise_interrupted:
    """SIGTERM/SIGINT raise ``Interrupted`` in the main thread (no-op in other threads)."""

    def __enter__(self) -> None:
        self._old: dict[int, object] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, _raise_interrupted)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)
