"""An op that fails for real a set number of times: for tests of a unit's retry budget (tests/test_dedup_retry.py).

``flaky_mapper`` is the identity, except in a process whose environment names a folder in ``DJE_TEST_FLAKY``:
there it raises on the row whose ``id`` is ``row_id`` while the folder holds fewer than ``times`` files, leaving one
more file each time it raises (so the failures are counted across processes and nodes, and each retry sees them).
"""

from __future__ import annotations

import os
from pathlib import Path

from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("flaky_mapper")
class FlakyMapper(Mapper):
    def __init__(self, row_id: int = 0, times: int = 1, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.row_id = row_id
        self.times = times

    def process_single(self, sample):
        folder = os.environ.get("DJE_TEST_FLAKY")
        if folder and sample.get("id") == self.row_id:
            raised = len(os.listdir(folder))
            if raised < self.times:
                Path(folder, f"raised-{raised + 1}-{os.getpid()}").touch()
                raise RuntimeError(f"planted failure {raised + 1} of {self.times} on row {self.row_id}")
        return sample
