"""Keep a lease alive from a background thread, and notice when it is no longer ours.

A lease here is any key whose age others read as a heartbeat: a shard's
claim, an election ballot. Each tick renews it through the job dir's store
(``Store.renew`` with the version the last write handed out: the store stamps
the beat on its own clock, POSIX by rewriting a byte in place, S3 by an
``If-Match`` PUT). Two kinds of failure are told apart:

* the lease is lost: ``renew`` found the key gone, released or holding
  another lease (its bytes or ETag moved), or the owner's own check
  (``still_ours``) says a later claim superseded it. Renewing further would
  be wrong, so the thread stops and sets ``lost``;
* a transient error (any OSError: a flaky mount, a full disk): the lease
  only ages meanwhile, so the next tick tries again with the same version.
  It is logged once per stretch of failures, not on every tick.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from data_juicer_elastic.storage.lapse import lapse_clock
from data_juicer_elastic.storage.store import Store, Ver


def _quiet(_: str) -> None:
    pass


class LeaseRefresher:
    """A context manager that renews ``key`` every ``interval`` seconds until it exits or the lease is lost.

    ``ver`` is the version the lease's create (or replace) returned; while the refresher runs it owns the
    version (``ver``: the one its last renewal handed back), so nobody else renews the same lease meanwhile.
    """

    def __init__(
        self,
        store: Store,
        key: str,
        ver: Ver | None,
        interval: float,
        *,
        still_ours: Callable[[], bool] = lambda: True,
        log: Callable[[str], None] = _quiet,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.key = key
        self.ver = ver  # None: the lease was gone before the refresher began (lost at the first tick)
        self.interval = interval
        self.still_ours = still_ours
        self.log = log
        self.on_lost = on_lost  # called once, from the refresher's thread, when the lease is lost
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._renewed = lapse_clock()  # when the last successful renewal was sent (the lease's creation, at first)
        self._longest = 0.0  # the longest stretch between two renewals so far
        name = key.rpartition("/")[2]
        self._thread = threading.Thread(target=self._run, name=f"lease-{name}", daemon=True)

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self.interval):
            sent = lapse_clock()  # the store stamps the beat after this: the lease is live until sent + lock timeout
            try:
                new = self._renew()
            except self.store.errors as exc:  # a flaky mount, a full disk, an endpoint down: the lease only ages
                if not failing:
                    self.log(f"{self._where()}: cannot renew the lease ({exc}); retrying every {self.interval:g}s")
                failing = True
                continue
            if new is None:
                self._lose("superseded, replaced, released or removed")
                return
            self.ver = new
            self._renewed_now(sent)
            failing = False

    def _renew(self) -> Ver | None:
        """The lease's next version; None when it is lost (the owner's check first: nothing written once superseded)."""
        if self.ver is None or not self.still_ours():
            return None
        return self.store.renew(self.key, self.ver)

    def _renewed_now(self, sent: float) -> None:
        self._longest = max(self._longest, sent - self._renewed)
        self._renewed = sent

    @property
    def renewed_at(self) -> float:
        """``lapse_clock`` when the last successful renewal was sent: no store stamp of the lease is older."""
        return self._renewed

    def longest_gap(self) -> float:
        """Seconds of the longest stretch without a renewal since the lease was taken, up to now."""
        return max(self._longest, lapse_clock() - self._renewed)

    def _where(self) -> str:
        return f"{self.key} in {self.store.describe()}"

    def _lose(self, why: str) -> None:
        self.log(f"{self._where()}: lease lost ({why}); no longer renewing it")
        self.lost.set()
        if self.on_lost is not None:
            self.on_lost()

    def __enter__(self) -> LeaseRefresher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
