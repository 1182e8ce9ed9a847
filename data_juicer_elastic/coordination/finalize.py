"""The finalize election of one generation, keyed by what is to be merged rather than by the run id.

Processes of different runs (or started by hand, with no run id in common)
that finish the same generation compute the same key from the shared state:
the export path, the retry records and the merge record as they stand. So
they stand in one election and the output is merged once. A new merge
record (a merge happened) or a new retry record (``dj-elastic retry``, the
only thing that takes a done record away; a done record is otherwise
written once) gives a new key, so a later rerun can merge again when it
must; a round whose coordinator failed is followed by a fresh round.

The key costs each process one listing of ``state/retry`` and a read of each
record in it (the shards ever retried), not a read of every done record: at
100,000 shards and 256 processes that was 25.6 million opens at the end of a job.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from data_juicer_elastic.coordination.rundir import EXIT_OK, RunDir, read_outcome
from data_juicer_elastic.job.layout import JobDir

RESULT = "finalize.result.json"


def finalize_key(job: JobDir, export_path: str) -> str:
    """sha256 of the export path, the retry records and the current merge record."""
    digest = hashlib.sha256(os.path.abspath(export_path).encode())
    try:
        retried = sorted(n for n in os.listdir(job.retry_dir) if n.endswith(".json") and not n.startswith("."))
    except FileNotFoundError:
        retried = []
    for name in retried:
        try:
            body = (job.retry_dir / name).read_bytes()
        except FileNotFoundError:  # replaced by a newer retry this moment: the listing's next look has it
            body = b"gone"
        digest.update(f"\nretry {name} ".encode() + hashlib.sha256(body).digest())
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
