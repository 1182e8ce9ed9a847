"""The retry lock, ``state/retry.lock``: one ``dj-elastic retry`` at a time per generation.

``requeue`` deletes the done and failed records it archived. Those records are
create-once, so between its read of one and its delete only another retry can
change the key (delete it, after which a new attempt may create a new record);
with one retry at a time the record deleted is the record read, whether the
store honours ``If-Match`` on DELETE (AWS, moto) or not (Ceph RGW 16), and on
POSIX, where a delete on a version is a check, then an unlink.

The lock is created once (host, pid, the process's start time and boot id, a
token, its start) before the retry writes anything and deleted at its end. A
second retry meanwhile is refused (exit 2) naming the holder. A lock whose
holder is gone is taken over, saying so: on this host, its process provably
no longer runs (``host.holder_gone``), or, from anywhere, it was not renewed
for ``STALE_SECS`` on the store's clock. The holder renews it (a replace on
the version it holds) before each shard and right before each delete, and
deletes only within ``DELETE_WINDOW_SECS`` of sending that renewal on a clock
that counts suspend (``lapse_clock``): a takeover needs the lock unrenewed for
``STALE_SECS`` > ``DELETE_WINDOW_SECS``, so it never lands between a renewal
and the delete that it guards; the holder that lost it finds out at its next
renewal and stops.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.storage.files import dumps_json, json_object
from data_juicer_elastic.storage.host import holder_gone, hostname, identity
from data_juicer_elastic.storage.lapse import lapse_clock

LOCK_NAME = "retry.lock"  # in the generation's state folder
STALE_SECS = 900.0  # unrenewed this long on the store's clock: its retry is taken for dead (a renewal is seconds)
DELETE_WINDOW_SECS = 60.0  # a record is deleted only this soon after the renewal sent before it


class RetryLock:
    """This process's hold on ``state/retry.lock`` (``take``), renewed by ``renew``, given up by ``release``."""

    def __init__(self, job: JobDir, body: dict, ver: Any, took_from: dict | None = None) -> None:
        self.job, self.body, self.ver = job, body, ver
        self.took_from = took_from or {}  # the body of the killed retry's lock this one took over
        self.key = job.key(job.state_dir / LOCK_NAME)
        self.renewed_at = lapse_clock()
        self.lost: dict | None = None  # the holder that took the lock over, once a renewal found it

    def renew(self) -> None:
        """Renew the lock on the version held; UserError when another retry took it over meanwhile."""
        sent = lapse_clock()
        self.body = {**self.body, "beat": self.body.get("beat", 0) + 1}
        ver = self.job.store.replace(self.key, dumps_json(self.body), if_ver=self.ver)
        if ver is None:
            got = self.job.store.read(self.key)
            self.lost = json_object(got[0]) if got else {}
            raise UserError(
                f"retry: {_where(self.job)} was taken over by {_holder(self.lost)} while this retry ran "
                f"(it had not been renewed for {STALE_SECS:.0f}s: this process was stopped or suspended); this "
                "retry stopped before deleting anything more. Check `dj-elastic status`, then run it again if "
                "the shards still need it"
            )
        self.ver, self.renewed_at = ver, sent

    def delete_ok(self) -> None:
        """Raise UserError unless a delete sent now lands inside the window of the last renewal."""
        late = lapse_clock() - self.renewed_at
        if late > DELETE_WINDOW_SECS:
            raise UserError(
                f"retry: {late:.0f}s passed between renewing {_where(self.job)} and a delete it guards (at most "
                f"{DELETE_WINDOW_SECS:.0f}s): this process was stopped or suspended, so another retry may hold "
                "the shard now; nothing more was deleted. Run `dj-elastic retry` again"
            )

    def release(self) -> None:
        """Delete the lock if it is still this retry's: renewed on its version first, as before a record's
        delete (a lock taken over is left to its new holder)."""
        if self.lost is not None:
            return
        try:
            self.renew()
            self.delete_ok()
        except UserError:
            return  # taken over, or too late to be sure it was not: the lock is its holder's, or ages out
        self.job.store.delete(self.key)


def take(job: JobDir, stamp: str, log: Callable[[str], None]) -> RetryLock:
    """Create the lock, or take over one whose holder is gone; UserError (exit 2) naming a live holder."""
    key = job.key(job.state_dir / LOCK_NAME)
    body = {"host": hostname(), **identity(), "token": uuid.uuid4().hex, "started_at": time.time(), "stamp": stamp}
    data = dumps_json(body)
    for _ in range(3):  # each turn: the key was gone, or another retry took it over first
        made = job.store.create(key, data)
        if made is not None:
            return RetryLock(job, body, made.ver)
        got = job.store.read(key)
        if got is None:
            continue  # released between our create and our read
        holder, meta = json_object(got[0]), got[1]
        why = _gone(holder, meta.age)
        if why is None:
            raise UserError(
                f"retry: another `dj-elastic retry` of this generation is running: {_where(job)} is held by "
                f"{_holder(holder)}, renewed {meta.age:.0f}s ago. Let it finish (its shards are requeued by it), "
                f"then run this one again; a lock whose retry was killed is taken over once its process is gone "
                f"(on its own host) or it is {STALE_SECS:.0f}s old"
            )
        ver = job.store.replace(key, data, if_ver=meta.ver)
        if ver is not None:
            log(f"retry: took over {_where(job)} from {_holder(holder)}: {why}")
            return RetryLock(job, body, ver, holder)
    raise UserError(f"retry: {_where(job)} keeps changing hands; check `dj-elastic status`, then run it again")


def _gone(holder: dict, age: float) -> str | None:
    """Why the lock's holder is taken for dead, or None while it may still run."""
    if holder_gone(holder, hostname()):
        return f"its process {holder.get('pid')} no longer runs on this host"
    if age >= STALE_SECS + 1:  # the store's stamps have whole seconds: an age reads up to 1 s too large
        return f"it was not renewed for {age:.0f}s (a running retry renews it before every shard)"
    return None


def _holder(holder: dict) -> str:
    return f"host={holder.get('host')} pid={holder.get('pid')} (since {_when(holder.get('started_at'))})"


def _when(at: Any) -> str:
    if not isinstance(at, int | float) or isinstance(at, bool):
        return "an unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def _where(job: JobDir) -> str:
    return str(job.state_dir / LOCK_NAME)
