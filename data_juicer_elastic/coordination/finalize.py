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
All of it goes through the job dir's store (``list``, ``read``), as the
elections themselves do (``RunDir``).
"""

from __future__ import annotations

import hashlib

from data_juicer_elastic.coordination.rundir import EXIT_OK, RunDir, read_outcome
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.s3_export import location

RESULT = "finalize.result.json"


def finalize_key(job: JobDir, export_path: str) -> str:
    """sha256 of the export path, the retry records and the current merge record."""
    digest = hashlib.sha256(location(export_path).encode())
    store = job.store
    retry = job.key(job.retry_dir)
    for entry in store.list(retry):  # in key order: the same on every process
        folder, _, name = entry.key.rpartition("/")
        if folder != retry or not name.endswith(".json"):
            continue
        got = store.read(entry.key)  # None: replaced by a newer retry this moment: the listing's next look has it
        body = b"gone" if got is None else got[0]
        digest.update(f"\nretry {name} ".encode() + hashlib.sha256(body).digest())
    merged = store.read(job.key(job.merge_record_path))
    digest.update(b"\nno merge yet" if merged is None else b"\nmerge " + hashlib.sha256(merged[0]).digest())
    return digest.hexdigest()[:24]


def finalize_round(job: JobDir, export_path: str, run_id: str, host: str) -> RunDir:
    """The election folder to stand in: the first round of this key without a failed result."""
    key = finalize_key(job, export_path)
    base = job.key(job.finalize_dir)
    n = 1
    while True:
        prefix = f"{base}/{key}-{n}"
        result = read_outcome(job.store, f"{prefix}/{RESULT}")
        if result is None or result.exit_code == EXIT_OK:
            return RunDir.open(job.store, prefix, run_id, host)
        n += 1
