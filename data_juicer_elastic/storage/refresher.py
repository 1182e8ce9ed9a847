"""Keep a lease file alive from a background thread, and notice when it is no longer ours.

A lease here is any file whose mtime others read as a heartbeat: a shard's
claim, an election ballot. Each tick rewrites a byte of it (``touch``: the
file server stamps the write). Two kinds of failure are told apart:

* the lease is lost: the file is gone, another file was put in its place, or
  the owner's own check (``still_ours``) says a later claim superseded it.
  Renewing further would be wrong, so the thread stops and sets ``lost``;
* a transient error (any other OSError: a flaky mount, a full disk): the
  lease only ages meanwhile, so the next tick tries again. It is logged once
  per stretch of failures, not on every tick.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from data_juicer_elastic.storage.files import touch


def _quiet(_: str) -> None:
    pass


class LeaseRefresher:
    """A context manager that renews ``path`` every ``interval`` seconds until it exits or the lease is lost."""

    def __init__(
        self,
        path: Path,
        interval: float,
        *,
        still_ours: Callable[[], bool] = lambda: True,
        log: Callable[[str], None] = _quiet,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.path = path
        self.interval = interval
        self.still_ours = still_ours
        self.log = log
        self.on_lost = on_lost  # called once, from the refresher's thread, when the lease is lost
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._content = _content(path)
        self._renewed = time.monotonic()  # the last successful renewal (the lease's creation, at first)
        self._longest = 0.0  # the longest stretch between two renewals so far
        self._thread = threading.Thread(target=self._run, name=f"lease-{path.name}", daemon=True)

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self.interval):
            try:
                if not self.still_ours() or not self._same_file():
                    self._lose("superseded, replaced or removed")
                    return
                touch(self.path)
                self._renewed_now()
            except FileNotFoundError:
                self._lose("removed")
                return
            except OSError as exc:
                if not failing:
                    self.log(f"{self.path}: cannot renew the lease ({exc}); retrying every {self.interval:g}s")
                failing = True
                continue
            failing = False

    def _renewed_now(self) -> None:
        now = time.monotonic()
        self._longest = max(self._longest, now - self._renewed)
        self._renewed = now

    def longest_gap(self) -> float:
        """Seconds of the longest stretch without a renewal since the lease was taken, up to now."""
        return max(self._longest, time.monotonic() - self._renewed)

    def _same_file(self) -> bool:
        """False once another file stands at ``path`` (its bytes differ from the lease's own)."""
        return not self._content or _content(self.path) == self._content

    def _lose(self, why: str) -> None:
        self.log(f"{self.path}: lease lost ({why}); no longer renewing it")
        self.lost.set()
        if self.on_lost is not None:
            self.on_lost()

    def __enter__(self) -> LeaseRefresher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _content(path: Path) -> bytes:
    """The lease file's bytes (leases are small; ``touch`` rewrites them unchanged); b"" if missing.

    Content, not the inode, tells a replaced lease: FUSE mounts such as sshfs
    may number the same file differently over time.
    """
    try:
        with open(path, "rb") as f:
            return f.read(1 << 16)
    except FileNotFoundError:
        return b""
