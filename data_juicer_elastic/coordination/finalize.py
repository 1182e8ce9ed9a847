"""The finalize election of one generation, keyed by what is to be merged rather than by the run id.

Processes of different runs (or started by hand, with no run id in common)
that finish the same generation compute the same key from the shared state:
the done records (shard, attempt, sha256), the export path and the merge
record as it stands. So they stand in one election and the output is merged
once. A new merge record (a merge happened) or a changed done record (a
retry) gives a new key, so a later rerun can merge again when it must; a
round whose coordinator failed is followed by a fresh round.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from data_juicer_elastic.coordination.rundir import EXIT_OK, RunDir, read_outcome
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.storage.files import read_record

RESULT = "finalize.result.json"


def finalize_key(job: JobDir, export_path: str) -> str:
    """sha256 of the done records, the export path and the current merge record."""
    digest = hashlib.sha256(os.path.abspath(export_path).encode())
    for sid in sorted(job.done_ids()):
        rec = read_record(job.done_path(sid))
        digest.update(f"\n{sid} {rec.get('attempt')} {rec.get('sha256')}".encode())
    try:
        digest.update(b"\nmerge " + hashlib.sha256(job.merge_record_path.read_bytes()).digest())
    except FileNotFoundError:
        digest.update(b"\nno merge yet")
    return digest.hexdigest()[:24]


def finalize_round(job: JobDir, export_path: str, run_id: str, host: str) -> RunDir:
    """The election folder to stand in: the first round of this key without a failed result."""
    key = finalize_key(job, export_path)
    n = 1
    while True:
        root: Path = job.finalize_dir / f"{key}-{n}"
        result = read_outcome(root / RESULT)
        if result is None or result.exit_code == EXIT_OK:
            return RunDir.open(root, run_id, host, subdirs=())
        n += 1
