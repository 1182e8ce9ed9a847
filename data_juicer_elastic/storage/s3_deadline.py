"""A publish bounded by its lease: no send of it starts that could land after the deadline.

botocore resends a PUT up to its ``max_attempts``, each send waiting up to
``connect_timeout`` to connect and ``read_timeout`` per socket operation
(about 151 s in all with backoff, more than the default policy's 135 s
between the lapse check and the lock timeout). Here a hook on each send
(``before-send``, which botocore emits for every resend) lets a send start
only while the whole of it fits before the deadline: connecting, writing the
small body (one socket write), and waiting for the reply. A server applies a
PUT before it answers, and one it has not answered in ``read_timeout`` is
given up on; so a send either lands before the deadline or is abandoned by
then. What no client can bound: a server that holds a request past the
client's timeout and applies it later.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from botocore.exceptions import BotoCoreError

from data_juicer_elastic.storage.lapse import lapse_clock

_local = threading.local()
_HOOKED = "_dje_deadline_hooked"


class DeadlineMissed(BotoCoreError):
    """A send of a bounded write would not have ended before its deadline: not sent (one of the store's errors)."""

    fmt = "not sent: {what} could not end before its deadline ({left:.1f}s left, a send may take {bound:.0f}s)"


def send_bound(client: Any) -> float:
    """The longest one send may take: connect, write the body, wait for the reply."""
    config = client.meta.config
    return float(config.connect_timeout) + 2 * float(config.read_timeout)


@contextmanager
def bounded_sends(client: Any, deadline: float | None) -> Iterator[None]:
    """Within it, in this thread, every PutObject send starts only if it can end before ``deadline``."""
    if deadline is None:
        yield
        return
    if not getattr(client.meta, _HOOKED, False):
        client.meta.events.register("before-send.s3.PutObject", _check)
        setattr(client.meta, _HOOKED, True)
    _local.deadline, _local.bound = deadline, send_bound(client)
    try:
        yield
    finally:
        _local.deadline = None


def _check(request: Any, **kwargs: Any) -> None:
    deadline = getattr(_local, "deadline", None)
    if deadline is None:
        return
    left = deadline - lapse_clock()
    if left < _local.bound:
        raise DeadlineMissed(what=str(request.url).split("?")[0], left=left, bound=_local.bound)
