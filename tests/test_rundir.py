"""A run's coordination folder through the job dir's store (coordination.rundir): what a planted file means."""

from __future__ import annotations

import os

from data_juicer_elastic.coordination.rundir import EXIT_FAILED, RunDir, run_key
from data_juicer_elastic.storage.files import dumps_json
from data_juicer_elastic.storage.posix import PosixStore


def test_a_link_planted_at_an_outcome_or_a_ballot_is_not_followed(tmp_path):
    """Outcomes and ballots are keys of the store, read without following a link (as leases and done records
    are): a file outside the job dir is no abort, and names no winner."""
    job = tmp_path / "job"
    run = RunDir.open(PosixStore(job), run_key("r1"), "r1", "n1")
    path = job / run.prefix  # the run's folder: links are planted by path
    outside = tmp_path / "outside.json"
    outside.write_bytes(dumps_json({"exit_code": EXIT_FAILED, "message": "planted", "host": "x", "pid": 1}))
    os.symlink(outside, path / "abort.json")
    assert run.aborted() is None
    os.makedirs(path / "hosts")
    os.symlink(outside, path / "hosts/n1.json")
    assert run.elect("hosts/n1.json", replace_gone=True) == (False, {})
