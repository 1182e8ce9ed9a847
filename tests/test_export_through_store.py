"""The exports read the attempts' files through the job's store (docs/OBJECT_STORE.md step 9).

A job worked through node-local scratch (forced on POSIX, as tests/test_scratch_attempts.py does) exports the
same bytes as one worked in its job dir: as a JSONL folder, a Parquet folder and one Parquet file, so the
scratch upload carries the Parquet files the runner writes beside its output. And a job whose store is no
POSIX folder (the job's PosixStore behind a class that is none, as an S3 store is to the export) gets its
folder export copied through the store, checked as it goes, never linked.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.json as pj
import pytest

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.folder_export import SUCCESS, export_folder, export_parquet_folder, verify_folder
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.done import load_done
from data_juicer_elastic.merge import merge
from data_juicer_elastic.parquet_out import OUTPUT, SIDECAR, write_shard_parquet
from data_juicer_elastic.worker.loop import run_worker

from . import runners
from .jobs import RECIPE, make_job

PARQUET_RECIPE = RECIPE + b"export_type: parquet\n"


def parquet_copy(shard_path: str, output_path: str, job_dir: str) -> None:
    """Identity, with the Parquet output and sidecar a Parquet-exporting runner writes beside the JSONL."""
    runners.copy(shard_path, output_path, job_dir)
    write_shard_parquet(pj.read_json(output_path), Path(output_path).parent, None)


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _exports(job: JobDir, out: Path) -> dict[str, dict[str, bytes] | bytes]:
    """The job exported every way: a JSONL folder, a Parquet folder (the recipe's export), one Parquet file."""
    merge(job, str(out / "one.parquet"), log=lambda *_: None)
    merge(job, f"{out / 'parquet-parts'}/", log=lambda *_: None)
    job.recipe_path.write_bytes(RECIPE)  # the same outputs, exported as JSONL parts
    merge(job, f"{out / 'jsonl-parts'}/", log=lambda *_: None)
    return {"one": (out / "one.parquet").read_bytes()} | {n: _tree(out / n) for n in ("parquet-parts", "jsonl-parts")}


def test_a_job_worked_in_scratch_exports_what_the_direct_job_exports(tmp_path: Path) -> None:
    direct, scratched = (make_job(tmp_path / n, rows=60, shards=4, recipe=PARQUET_RECIPE) for n in ("d", "s"))
    assert run_worker(direct.root, parquet_copy, log=lambda *_: None).exit_code == 0
    scratch = tmp_path / "node-scratch"
    assert run_worker(scratched.root, parquet_copy, scratch=scratch, log=lambda *_: None).exit_code == 0
    for spec in scratched.manifest().shards:
        assert {OUTPUT, SIDECAR} <= set(os.listdir(scratched.attempt_dir(spec.id, 1))), "not uploaded"
    got, want = _exports(scratched, tmp_path / "s-out"), _exports(direct, tmp_path / "d-out")
    assert got == want
    assert sorted(got["parquet-parts"]) == [SUCCESS] + [f"{s.id}.parquet" for s in direct.manifest().shards]


class NotPosix:
    """The job's own PosixStore behind a class that is none: to the export, a store with no files to link
    (as S3 is). Every key read whole or in part is noted."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.opened: list[str] = []

    def open_read(self, key: str):
        self.opened.append(key)
        return self.inner.open_read(key)

    def open_range(self, key: str, start: int, end: int):
        self.opened.append(key)
        return self.inner.open_range(key, start, end)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


@pytest.fixture
def remote(tmp_path: Path) -> tuple[JobDir, NotPosix, list]:
    job = make_job(tmp_path, rows=60, shards=4)
    assert run_worker(job.root, parquet_copy, log=lambda *_: None).exit_code == 0
    store = NotPosix(job.store)
    job._store = store  # the job's store is where its outputs are read
    records = [(r, r.output_path(job)) for r in (load_done(job, s) for s in job.manifest().shards.ids())]
    return job, store, records


def test_a_folder_export_from_a_store_that_is_not_posix_copies_through_it(tmp_path: Path, remote) -> None:
    job, store, records = remote
    folder = tmp_path / "parts"
    done = export_folder(records, folder, overwrite=False, log=lambda *_: None, job=job)
    assert (done.linked, done.copied, done.kept) == (0, 4, 0)
    assert store.opened == [job.key(path) for _, path in records]
    for record, path in records:
        part = folder / f"{record.shard}.jsonl"
        assert part.read_bytes() == path.read_bytes() and os.stat(part).st_nlink == 1  # a copy, not a link
    assert verify_folder(folder) == []

    store.opened.clear()
    done = export_parquet_folder(records, tmp_path / "pq", overwrite=False, log=lambda *_: None, job=job)
    assert (done.linked, done.copied) == (0, 4)
    sides = [job.key(p.with_name(SIDECAR)) for _, p in records]
    parquet = [job.key(p.with_name(OUTPUT)) for _, p in records]
    assert store.opened == sides + parquet + parquet  # sidecars, footers, then each part whole
    assert verify_folder(tmp_path / "pq") == []


def test_an_output_changed_in_a_store_that_is_not_posix_is_refused_as_it_is_copied(tmp_path: Path, remote) -> None:
    job, _, records = remote
    record, path = records[2]
    data = path.read_bytes()
    path.write_bytes(data[:-2] + b"!\n")  # same size: only the copy's hash can tell
    with pytest.raises(IntegrityError, match=record.shard):
        export_folder(records, tmp_path / "parts", overwrite=False, log=lambda *_: None, job=job)
    assert SUCCESS not in os.listdir(tmp_path / "parts")
