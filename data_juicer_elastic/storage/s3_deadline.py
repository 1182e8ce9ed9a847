"""A publish bounded by its lease: no send of it can land after its deadline.

botocore resends a PUT up to its ``max_attempts``, each send waiting up to
``connect_timeout`` to connect and ``read_timeout`` per socket operation
(with backoff, more than the default policy's margin). Within
``bounded_sends`` a hook on every send (``before-send``, emitted for each
resend too) gives the send connect and read timeouts from the time left
(never above the client's own; cached per value) and sends it itself, so a
lease of a few seconds still publishes; a send whose timeouts would be below
``MIN_TIMEOUT`` is refused (``DeadlineMissed``, a TimeoutError).

Why no send lands after the deadline: a server applies a PUT after its body
arrived and before its reply begins; the body (a few KB, whole in the socket's
buffer; no ``Expect: 100-continue`` wait) is out once connected, and a reply
not begun ``read_timeout`` later is given up on; connect + 2 x read fits
before the deadline when the send starts. What no client can bound: a server
or proxy that holds a request past the client's timeout and applies it later.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from data_juicer_elastic.storage.lapse import lapse_clock

MIN_TIMEOUT = 0.25  # seconds: a send needs at least 3 x this left (connect, write, reply)
STEPS = 4  # timeouts are 2 ** (k / STEPS) seconds: a few cached transports per client, each within 19% of best
_local = threading.local()
_hooking = threading.Lock()


class DeadlineMissed(TimeoutError):
    """A send of a bounded write could not end before its deadline: not sent. An OSError, so one of every
    store's errors (as POSIX's), which botocore does not retry; importing it needs no botocore."""


def send_bound(connect: float, read: float) -> float:
    """The longest one send may take before it lands or is given up on: connect, write (one buffered
    write), and wait for the reply's start."""
    return connect + 2 * read


def timeouts_for(left: float, connect: float, read: float) -> tuple[float, float] | None:
    """(connect, read) timeouts for a send with ``left`` seconds to go: the client's own where they fit,
    else one step of 2 ** (1 / STEPS) below a third of ``left``; None when below ``MIN_TIMEOUT``."""
    if left >= send_bound(connect, read):
        return connect, read
    if left < 3 * MIN_TIMEOUT:
        return None
    t = 2 ** (math.floor(STEPS * math.log2(left / 3)) / STEPS)
    return min(connect, t), min(read, t)


@contextmanager
def bounded_sends(client: Any, deadline: float | None) -> Iterator[None]:
    """Within it, in this thread, every PutObject of ``client`` is sent only so that it cannot land after
    ``deadline`` (``lapse_clock``); None: sent as ever."""
    if deadline is None:
        yield
        return
    _transports(client)  # the hook, once per client
    _local.deadline = deadline
    try:
        yield
    finally:
        _local.deadline = None


class _Transports:
    """One client's HTTP transports by (connect, read) timeouts, made on first use: a client built alike but
    for its timeouts (same endpoint, TLS, proxies), of which only the transport is used."""

    def __init__(self, client: Any) -> None:
        self.client = client
        config = client.meta.config
        self.connect, self.read = float(config.connect_timeout), float(config.read_timeout)
        self._lock = threading.Lock()
        self._made: dict[tuple[float, float], Any] = {}

    def get(self, connect: float, read: float) -> Any:
        with self._lock:
            if (connect, read) not in self._made:
                self._made[(connect, read)] = self._make(connect, read)
            return self._made[(connect, read)]

    def _make(self, connect: float, read: float) -> Any:
        import boto3
        from botocore.config import Config

        meta = self.client.meta
        config = meta.config.merge(Config(connect_timeout=connect, read_timeout=read))
        twin = boto3.session.Session().client(
            "s3", endpoint_url=meta.endpoint_url, region_name=meta.region_name, config=config
        )
        return twin._endpoint.http_session  # botocore's transport, built as for any client with these timeouts

    def send(self, request: Any, **kwargs: Any) -> Any:
        """The ``before-send`` hook: None (botocore sends) outside ``bounded_sends``; else the response of
        this send, made with timeouts that fit before the deadline, or ``DeadlineMissed``."""
        deadline = getattr(_local, "deadline", None)
        if deadline is None:
            return None
        left = deadline - lapse_clock()
        fit = timeouts_for(left, self.connect, self.read)
        if fit is None:
            what, need = str(request.url).split("?")[0], send_bound(MIN_TIMEOUT, MIN_TIMEOUT)
            raise DeadlineMissed(f"{what}: not sent, its deadline is {left:.2f}s away, a send needs {need:.2f}s")
        if "Expect" in request.headers:  # unsigned; its wait for a 100 Continue would add up to 1 s
            del request.headers["Expect"]
        return None if fit == (self.connect, self.read) else self.get(*fit).send(request)


def _transports(client: Any) -> _Transports:
    """The client's transports, its hook registered last among PutObject's own (a test's redirect runs first)."""
    with _hooking:
        found = getattr(client.meta, "_dje_transports", None)
        if found is None:
            found = _Transports(client)
            client.meta.events.register_last("before-send.s3.PutObject", found.send)
            client.meta._dje_transports = found
        return found
