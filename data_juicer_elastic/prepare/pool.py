"""A small pool for prepare's CPU-bound tasks: a thread of this process plus child interpreters.

Why not multiprocessing: ``fork`` is unsafe once the caller runs threads (the
coordinator's heartbeat, Ray's), and ``spawn``/``forkserver`` re-run the
caller's ``__main__``, which breaks scripts without a main guard and drags
Data-Juicer into every worker. The children here run ``python -m
data_juicer_elastic.prepare.pool`` and import only what a task needs.

Protocol, length-prefixed pickles over the child's stdin/stdout: the child
first says ``("ready", None)``; then parent -> child ``(fn, args)`` (EOF to
exit), child -> parent ``("progress", nbytes)``..., then ``("ok", result)``
or ``("err", [exception, the exception it was raised from, ...])``: every
exception of the package pickles, and the chain travels with it, so the
parent sees what the child saw (a full disk under a prepare error included).
"""

from __future__ import annotations

import itertools
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import CancelledError, Executor, Future
from typing import Any, BinaryIO

from data_juicer_elastic.prepare import shards as prep_shards

_LEN = struct.Struct("<Q")
PROGRESS_EVERY = 8 << 20


class Counter:
    """Bytes processed so far, added to from several threads."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


def make_pool(jobs: int, counter: Counter) -> Executor:
    """``jobs`` workers: a thread of this process plus ``jobs - 1`` child processes (0 or 1: the thread alone)."""
    return ChildPool(max(jobs - 1, 0), counter)


class ChildPool(Executor):
    """A thread of this process and ``children`` child processes take tasks from one queue.

    This process starts on the tasks at once; each child joins once it has
    started and imported (about 0.07 s), so start-up is hidden behind work,
    and small inputs start no child at all.
    A child that cannot start just takes no tasks: slower, still correct
    (e.g. an embedded interpreter with no usable ``sys.executable``). On a
    cancelling shutdown children are terminated and a shard task running in
    this process stops at its next block (through the progress hook).
    """

    def __init__(self, children: int, counter: Counter, *, work_here: bool = True) -> None:
        self.counter = counter
        self._tasks: queue.Queue = queue.Queue()
        self._children: list[subprocess.Popen] = []
        self._cancelled = False
        for _ in range(children):
            try:
                self._children.append(_start_child())
            except OSError:
                break
        here = [threading.Thread(target=self._work_here, name="dje-prep-local", daemon=True)] if work_here else []
        self._threads = here + [
            threading.Thread(target=self._feed, args=(child,), name=f"dje-prep-{i}", daemon=True)
            for i, child in enumerate(self._children)
        ]
        if not self._threads:
            raise OSError("no prepare worker process could start")
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:  # type: ignore[override]
        if kwargs:
            raise TypeError("ChildPool tasks take positional arguments only")
        fut: Future = Future()
        self._tasks.put((fut, fn, args))
        return fut

    def _next(self) -> tuple[Future, Callable, tuple] | None:
        """The next task not cancelled, or None once the pool shuts down."""
        while (item := self._tasks.get()) is not None:
            if item[0].set_running_or_notify_cancel():
                return item
        return None

    def _serve(self, run: Callable[[Callable, tuple], Any]) -> None:
        """Run tasks with ``run(fn, args)`` until the pool shuts down; each outcome goes to its future."""
        while (item := self._next()) is not None:
            fut, fn, args = item
            try:
                fut.set_result(run(fn, args))
            except BaseException as exc:
                fut.set_exception(exc)

    def _work_here(self) -> None:
        prep_shards.set_progress_hook(self._progress_here)  # this is the only thread here that runs tasks
        self._serve(lambda fn, args: fn(*args))
        prep_shards.set_progress_hook(None)

    def _progress_here(self, nbytes: int) -> None:
        """Called per block by a task running in this process: where it stops once the pool is cancelled."""
        if self._cancelled:
            raise CancelledError("prepare stopped")
        self.counter.add(nbytes)

    def _feed(self, child: subprocess.Popen) -> None:
        try:
            if _recv(child.stdout) != ("ready", None):
                raise EOFError("unexpected greeting")
        except (EOFError, OSError):
            return  # it never started: the others take its share
        self._serve(lambda fn, args: self._run(child, fn, args))

    def _run(self, child: subprocess.Popen, fn: Callable, args: tuple) -> Any:
        try:
            _send(child.stdin, (fn, args))
            kind, value = _recv(child.stdout)
            while kind == "progress":
                self.counter.add(value)
                kind, value = _recv(child.stdout)
        except (EOFError, OSError) as exc:
            try:
                code = child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            raise RuntimeError(f"a prepare worker process died (exit code {code}); see its output above") from exc
        if kind == "err":
            raise _relinked(value)
        return value

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.shutdown(wait=True, cancel_futures=exc_type is not None)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            self._cancelled = True  # a task running here stops at its next block; children are terminated
            self._cancel_pending()
        for _ in self._threads:
            self._tasks.put(None)
        if cancel_futures:
            for child in self._children:  # a task may still be running: stop it, its output is discarded
                child.terminate()
        for t in self._threads:
            t.join()
        for child in self._children:  # all told first, so they exit side by side
            _close_pipes(child)
        for child in self._children:
            _reap(child)

    def _cancel_pending(self) -> None:
        while True:
            try:
                item = self._tasks.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[0].cancel()


def _start_child() -> subprocess.Popen:
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [sys.executable, "-m", "data_juicer_elastic.prepare.pool"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        bufsize=0,
    )


def _close_pipes(child: subprocess.Popen) -> None:
    """EOF on its stdin tells a child to exit."""
    for stream in (child.stdin, child.stdout):
        try:
            stream.close()  # type: ignore[union-attr]
        except OSError:
            pass


def _reap(child: subprocess.Popen) -> None:
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _send(stream: BinaryIO | None, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LEN.pack(len(data)) + data)  # type: ignore[union-attr]
    stream.flush()  # type: ignore[union-attr]


def _recv(stream: BinaryIO | None) -> Any:
    head = _read_exactly(stream, _LEN.size)
    return pickle.loads(_read_exactly(stream, _LEN.unpack(head)[0]))


def _read_exactly(stream: BinaryIO | None, n: int) -> bytes:
    parts, left = [], n
    while left:
        chunk = stream.read(left)  # type: ignore[union-attr]
        if not chunk:
            raise EOFError("pipe closed")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


# the child side ----------------------------------------------------------------
def _child_main() -> None:
    """Serve tasks until told to stop; stdout is kept for the protocol, prints go to stderr."""
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    proto_in = sys.stdin.buffer
    pending = [0]

    def progress(n: int) -> None:
        pending[0] += n
        if pending[0] >= PROGRESS_EVERY:
            _send(proto_out, ("progress", pending[0]))
            pending[0] = 0

    prep_shards.set_progress_hook(progress)
    _send(proto_out, ("ready", None))
    while True:
        try:
            task = _recv(proto_in)
        except EOFError:
            return
        if task is None:
            return
        fn, args = task
        try:
            reply = ("ok", fn(*args))
        except BaseException as exc:
            reply = ("err", _portable(exc))
        if pending[0]:
            _send(proto_out, ("progress", pending[0]))
            pending[0] = 0
        _send(proto_out, reply)


def _portable(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from (pickling drops ``__cause__``), each one picklable."""
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and all(cur is not seen for seen in chain) and len(chain) < 16:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    return [_picklable(e) for e in chain]


def _relinked(chain: list[BaseException]) -> BaseException:
    for outer, inner in itertools.pairwise(chain):
        outer.__cause__ = inner
    return chain[0]


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError("".join(traceback.format_exception(exc)))


if __name__ == "__main__":
    _child_main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # nothing left to clean up; interpreter teardown took 15-30 ms the parent waited for
