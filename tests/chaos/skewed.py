"""``dj-elastic`` under libfaketime: ``faketime -f +1h python -m tests.chaos.skewed worker ...``.

libfaketime 0.9.10 cannot fake CLOCK_MONOTONIC without hanging Python's timed
lock waits (the deadline is computed on the faked clock, the kernel waits on
the real one), and with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` its clock_nanosleep
wrapper makes ``time.sleep`` fail with EINVAL. So the skewed process runs with
``FAKETIME_DONT_FAKE_MONOTONIC=1`` and this wrapper sleeps with ``select``
instead; everything else (the wall clock, and utime(NULL), which libfaketime
turns into an explicit faked timestamp) is skewed as on a badly set node.
"""

from __future__ import annotations

import select
import sys
import time


def _sleep(seconds: float) -> None:
    select.select([], [], [], seconds)


time.sleep = _sleep

if __name__ == "__main__":
    from data_juicer_elastic.cli import main

    sys.exit(main(sys.argv[1:]))
