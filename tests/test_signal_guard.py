"""The signal guard in this process: a stop Python would swallow is raised again where code can catch it.

Python runs signal handlers inside ``__del__`` methods and at-fork hooks,
where it prints an exception and drops it ("Exception ignored in"). Ray forks
its processes while it starts, so a stop signal sent then was lost
(tests/test_signals.py saw dj-process run on after SIGHUP) and, raised inside
logging's or loguru's after-fork hook, left their locks held.
"""

from __future__ import annotations

import _thread
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from data_juicer_elastic.worker.signals import Interrupted, received, signals_raise_interrupted


def _idle(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)


def _fork_then_idle() -> None:
    """Fork a child that exits at once, then idle: the main thread is where an owed stop must be raised."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    _idle(5)


def _lock_free_for_others(lock: threading.RLock) -> bool:
    got: list[bool] = []

    def take() -> None:
        got.append(lock.acquire(timeout=2))
        if got[-1]:
            lock.release()

    t = threading.Thread(target=take)
    t.start()
    t.join()
    return got == [True]


def test_a_stop_raised_inside_del_is_raised_again():
    class Victim:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGHUP)  # the handler runs here, where Python ignores what it raises

    with pytest.raises(Interrupted), signals_raise_interrupted():
        Victim()
        _idle(5)
    assert received() == signal.SIGHUP


def test_a_stop_that_lands_while_forking_is_raised_after_the_fork_and_logging_stays_usable():
    # A one-shot "before" hook made of C calls only (no bytecode runs in it): it marks SIGINT as arrived, so
    # the handler runs at the first Python hook after it, logging's, which takes logging's lock for the fork.
    os.register_at_fork(before=functools.partial(next, map(_thread.interrupt_main, [signal.SIGINT]), None))
    with pytest.raises(Interrupted), signals_raise_interrupted():
        _fork_then_idle()
    assert received() == signal.SIGINT
    assert _lock_free_for_others(logging._lock)


LOCKING_LIBRARY = """
import os
import threading

lock = threading.Lock()  # not reentrant, as loguru's


def acquire():
    lock.acquire()


def release():
    lock.release()


os.register_at_fork(before=acquire, after_in_parent=release, after_in_child=release)
"""


def test_a_stop_that_lands_in_the_fork_hook_of_a_library_imported_later_is_deferred(tmp_path, monkeypatch):
    (tmp_path / "dje_locking_library.py").write_text(LOCKING_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))
    # "after" hooks run oldest first: this one-shot C hook marks SIGHUP as arrived just before the library's runs
    os.register_at_fork(after_in_parent=functools.partial(next, map(_thread.interrupt_main, [signal.SIGHUP]), None))
    import dje_locking_library  # imported after the signals module, as Ray is (its hooks are newer than ours)

    with pytest.raises(Interrupted), signals_raise_interrupted():
        _fork_then_idle()
    assert received() == signal.SIGHUP
    assert dje_locking_library.lock.acquire(timeout=2), "the library's lock was left held"
    dje_locking_library.lock.release()


START_STOP = """
import os, signal, sys, time
sys.argv[0] = "dj-elastic"
import data_juicer_elastic.cli  # installs the start-up handler, as the console script does

class Stopped:
    def __del__(self):  # Python only prints what a __del__ raises: a SystemExit raised here is lost
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            time.sleep(0.001)

obj = Stopped()
del obj
print("still running after SIGTERM", flush=True)
"""


def test_a_stop_while_starting_exits_143_even_inside_a_callback_python_only_prints():
    """``dj-elastic`` stopped before a command's handling is in place exits 128+N at once: an import lock's
    weakref callback swallowed the SystemExit the start-up handler raised, and a worker ran on (exit 0)."""
    done = subprocess.run([sys.executable, "-c", START_STOP], capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + signal.SIGTERM, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "still running" not in done.stdout
