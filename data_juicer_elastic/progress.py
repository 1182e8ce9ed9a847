"""The progress bar of long byte-counted phases (prepare, merge): tqdm, told absolute byte counts.

tqdm comes with Data-Juicer and draws rate and ETA. It draws on stderr only
when that is a terminal (or when forced), waits a moment before the first
draw so short runs stay quiet, and redraws at most a few times a second.
"""

from __future__ import annotations

import sys
from typing import TextIO


class ProgressBar:
    def __init__(
        self,
        total: int,
        label: str,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        delay: float = 1.0,
        interval: float = 0.2,
    ) -> None:
        stream = stream or sys.stderr
        if enabled is None:
            enabled = bool(getattr(stream, "isatty", lambda: False)())
        self._bar = None
        if not enabled:
            return
        from tqdm import tqdm  # only for a bar that draws: the import costs tens of ms

        self._bar = tqdm(
            total=max(total, 1),
            desc=label,
            unit="B",
            unit_scale=True,
            file=stream,
            delay=delay,
            mininterval=interval,
            miniters=1,
            dynamic_ncols=True,
        )

    def update(self, done: int) -> None:
        """Bytes done so far (not since the last call)."""
        if self._bar is not None:
            self._bar.update(done - self._bar.n)

    def close(self) -> None:
        """Finish the line if anything was drawn, so the summary starts on a clean line."""
        if self._bar is not None:
            self._bar.close()
