"""Stands in for ``orjson`` when this folder is first on PYTHONPATH, to hold a process inside its imports.

The import leaves ``<DJE_TEST_IMPORT_GATE>.entered`` and waits until the file DJE_TEST_IMPORT_GATE
names exists, then loads the real orjson in its place (tests/test_worker_protocol.py signals the process
while it waits).
"""

import os
import sys
import time

_gate = os.environ["DJE_TEST_IMPORT_GATE"]
with open(_gate + ".entered", "w"):
    pass
while not os.path.exists(_gate):
    time.sleep(0.01)
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
del sys.modules["orjson"]
import orjson as _real  # noqa: E402  (the real one, now that this folder is off the path)

sys.modules["orjson"] = _real
