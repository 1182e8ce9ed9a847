"""A one-line terminal progress bar for long byte-counted phases (prepare, merge).

It draws on stderr only when that is a terminal (or when forced), waits a
moment before the first draw so short runs stay quiet, and redraws at most a
few times a second.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    WIDTH = 30

    def __init__(
        self,
        total: int,
        label: str,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        delay: float = 1.0,
        interval: float = 0.2,
    ) -> None:
        self.stream = stream or sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self.total = max(total, 1)
        self.label = label
        self.start = time.monotonic()
        self.delay, self.interval = delay, interval
        self._last = 0.0
        self._drawn = False

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.start < self.delay or now - self._last < self.interval:
            return
        self._last = now
        self._draw(done, now)

    def _draw(self, done: int, now: float) -> None:
        frac = min(max(done / self.total, 0.0), 1.0)
        filled = int(frac * self.WIDTH)
        rate = done / max(now - self.start, 1e-9) / 1e6
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(
            f"\r{self.label} [{bar}] {frac:6.1%} {done / 1e6:,.0f}/{self.total / 1e6:,.0f} MB {rate:,.0f} MB/s"
        )
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Finish the line if anything was drawn, so the summary starts on a clean line."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
