"""The clock a lease's lapse is measured on: one that counts a suspended VM's sleep.

CLOCK_MONOTONIC stops while the machine is suspended, so a node resumed after
minutes would think its lease fresh while others already judged it stale (the
store's clock ran on). CLOCK_BOOTTIME runs through suspend (Linux); elsewhere
the monotonic clock is the best there is.
"""

from __future__ import annotations

import time

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def lapse_clock() -> float:
    """Seconds on a clock that counts suspend, for lease lapses and publish deadlines."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()
