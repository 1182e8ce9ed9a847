"""What an ``S3Store`` remembers of the leases it renews: the last body and ETag, and the beats in flight.

Each beat body carries a fresh ``beat_token``. A renew whose PUT landed
while the client saw an error (a timeout, a reset, a proxy's 503 on the
resend) leaves the key at an ETag this process never learned, and the next
beat's ``If-Match`` fails. The tokens sent since the last answered beat tell
that case apart from a foreign write: a key whose body carries one of them
(and is not released) holds our own beat, so its ETag is adopted and the
lease lives on; any other body is somebody else's, and the lease is lost.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from data_juicer_elastic.storage.keys import Ver

BEATS_KEPT = 1024  # lease bodies remembered for renew (one per lease renewed; a release forgets its own)
SENT_KEPT = 16  # tokens of unanswered beats kept per lease: one per failed renew since the last answered one


@dataclass(frozen=True)
class Beat:
    """A lease as this process last wrote or read it: renew's next body without a GET per beat."""

    ver: Ver
    body: dict[str, Any]
    released: bool
    store_time: float  # the response's Date ...
    mono: float  # ... and this process's monotonic clock when it arrived: the writer's estimate of the store clock


def next_body(beat: Beat) -> dict[str, Any]:
    """The lease's next beat: its count up by one, a fresh token, and the writer's estimate of the store
    clock (diagnostics only: nobody ages by it)."""
    writer_time = beat.store_time + (time.monotonic() - beat.mono)
    count = beat.body.get("beat")
    return {
        **beat.body,
        "beat": (count if type(count) is int else 0) + 1,
        "writer_time": round(writer_time, 3),
        "beat_token": uuid.uuid4().hex,
    }


class BeatBook:
    """Per full key: the last beat (``Beat``) and the tokens of beats sent since it was answered."""

    def __init__(self) -> None:
        self._beats: dict[str, Beat] = {}  # renew threads of one process share the store
        self._sent: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def get(self, full: str) -> Beat | None:
        with self._lock:
            return self._beats.get(full)

    def sending(self, full: str, token: str) -> None:
        """Note a beat about to be sent: if it lands unanswered, the next renew finds its token there."""
        with self._lock:
            sent = self._sent.setdefault(full, [])
            sent.append(token)
            del sent[:-SENT_KEPT]

    def ours(self, full: str, body: Any) -> bool:
        """Does ``body`` (a key's current one) carry a beat this process sent?"""
        token = body.get("beat_token") if isinstance(body, dict) else None
        with self._lock:
            return token is not None and token in self._sent.get(full, ())

    def remember(self, full: str, beat: Beat) -> None:
        """The beat answered: it is the lease's version now, and nothing is in flight."""
        with self._lock:
            self._beats.pop(full, None)
            self._beats[full] = beat  # newest last, so the oldest is dropped first
            self._sent.pop(full, None)
            while len(self._beats) > BEATS_KEPT:
                oldest = next(iter(self._beats))
                del self._beats[oldest]
                self._sent.pop(oldest, None)

    def forget(self, full: str) -> None:
        with self._lock:
            self._beats.pop(full, None)
            self._sent.pop(full, None)
