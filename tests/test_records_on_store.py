"""The job's small records read and written through its store (docs/OBJECT_STORE.md section 6, steps 3 and 5).

The worker records, the retry records' reader, the lane hints and tails, the done and failed listings and
the claims listing go through ``Store`` calls (``names``, ``read``, ``replace``), so they serve an S3 job
dir once it has one. A listing of a missing folder has no names there, as S3 has no folders: ``done_ids``,
``failed_ids`` and ``latest_attempts`` used to raise FileNotFoundError.
"""

from __future__ import annotations

import ast
import os

from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.retry import read_requeued, retry_base
from data_juicer_elastic.job.records.workers import WorkerLedger, WorkerRecord, read_workers, write_worker
from data_juicer_elastic.storage.posix import PosixStore
from tests.jobs import make_job
from tests.test_layers import PATH_READS, module_sources

PACKAGE = "data_juicer_elastic"

# module -> the functions that read or write their records through the store only
ON_STORE = {
    f"{PACKAGE}.job.records.workers": {"write_worker", "load_worker", "read_workers"},
    f"{PACKAGE}.job.records.retry": {"read_requeued", "retry_base", "_archived_so_far"},
    f"{PACKAGE}.job.layout": {"done_ids", "failed_ids", "_record_ids", "generation_ids"},
    f"{PACKAGE}.job.claims": {"latest_attempts"},
    f"{PACKAGE}.worker.lanes": {"_read_index", "_write_index"},
}
# by path: the reads test_layers names, and the path helpers these functions used before
BY_PATH = PATH_READS | {"read_small", "replace_small", "load_object", "mkdir", "open", "rename", "replace_file"}


def calls_in(source: str, functions: set[str]) -> list[tuple[str, str]]:
    """(function, call) for each call made inside one of ``functions`` (methods included) in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name in functions:
            found.extend((node.name, ast.unparse(c.func)) for c in ast.walk(node) if isinstance(c, ast.Call))
    return found


def test_the_records_go_through_the_store_not_a_path():
    sources = module_sources()
    by_path = []
    for module, functions in ON_STORE.items():
        calls = calls_in(sources[module][0].read_text(encoding="utf-8"), functions)
        assert {f for f, _ in calls} == functions, f"{module}: a function was renamed or lost"
        by_path += [(module, f, c) for f, c in calls if c.rpartition(".")[2] in BY_PATH]
    assert by_path == []


def test_the_check_sees_a_listing_by_path():
    source = "import os\ndef done_ids(self):\n    return os.listdir(self.done_dir)\ndef other():\n    os.lstat('x')\n"
    assert calls_in(source, {"done_ids"}) == [("done_ids", "os.listdir")]


def test_listings_of_missing_folders_have_no_names(tmp_path):
    job = make_job(tmp_path / "job", rows=4, shards=2)
    for folder in (job.done_dir, job.failed_dir, job.claims_dir, job.retry_dir, job.workers_dir):
        if folder.exists():
            os.rmdir(folder)
    assert job.done_ids() == set() and job.failed_ids() == set()
    assert ClaimStore(job, lock_timeout=3.0, host="t").latest_attempts() == {}
    assert read_requeued(job) == ([], {})
    assert read_workers(job.store, job.key(job.workers_dir)) == ([], 0)
    assert JobDir(tmp_path / "nothing").generation_ids() == []


def test_a_worker_record_is_written_whole_into_a_folder_made_on_demand(tmp_path):
    job = make_job(tmp_path / "job", rows=4, shards=2)
    folder = job.workers_dir / "late"  # as in a job dir made before worker records: no folder yet
    ledger = WorkerLedger(job.store, job.key(folder), "node-a", 41, "abcd")
    ledger.hold("part-00000-of-00002", 1)
    ledger.published("part-00000-of-00002", 1, 2, 2, 0, 10, 1.0, 2.0)
    ledger.flush()
    records, unreadable = read_workers(job.store, job.key(folder))
    assert unreadable == 0 and [(r.worker, r.pairs, r.published, r.output_rows) for r in records] == [
        (ledger.worker, [], 1, 2)
    ]
    assert sorted(os.listdir(folder)) == [f"{ledger.worker}.json"]  # no temp name left


def test_what_is_not_a_worker_record_counts_as_unreadable(tmp_path):
    """A link (not followed, even to a good record), a folder and a cut record at a record's name are listed
    but read as none; hidden names (temps) are not listed."""
    store, folder = PosixStore(tmp_path), tmp_path / "workers"
    write_worker(store, "workers", WorkerRecord(worker="good", host="h", pid=1, published=3))
    os.symlink(folder / "good.json", folder / "link.json")
    os.mkdir(folder / "folder.json")
    (folder / "cut.json").write_bytes(b'{"worker": "cu')
    (folder / ".temp.json").write_bytes(b"")
    records, unreadable = read_workers(store, "workers")
    assert [r.worker for r in records] == ["good"] and unreadable == 3


def test_a_retry_record_that_is_not_one_is_read_as_before(tmp_path):
    """An unreadable retry record (a link, not followed) is a requeue after attempt 0, as ``read_small`` had it;
    a record that is not JSON is skipped."""
    job = make_job(tmp_path / "job", rows=4, shards=2)
    job.retry_dir.mkdir(parents=True, exist_ok=True)
    (job.retry_dir / "part-00000-of-00002.json").write_bytes(
        b'{"after_attempt": 2, "archived": [{"attempt": 1, "worker": "w", "rows": 2}]}'
    )
    os.symlink(job.retry_dir / "part-00000-of-00002.json", job.retry_dir / "part-00001-of-00002.json")
    (job.retry_dir / "bad.json").write_bytes(b"{")
    archived, requeued = read_requeued(job)
    assert requeued == {"part-00000-of-00002": 2, "part-00001-of-00002": 0}
    assert [(a.shard, a.attempt, a.worker, a.rows) for a in archived] == [("part-00000-of-00002", 1, "w", 2)]


def test_a_link_at_a_retry_record_is_no_record(tmp_path):
    """The failure count's base: a link planted at the record's name is not followed (it read its target)."""
    job = make_job(tmp_path / "job", rows=4, shards=2)
    sid = "part-00000-of-00002"
    job.retry_dir.mkdir(parents=True, exist_ok=True)
    target = tmp_path / "elsewhere.json"
    target.write_bytes(b'{"after_attempt": 5}')
    os.symlink(target, job.retry_path(sid))
    assert retry_base(job, sid) == 0
    os.unlink(job.retry_path(sid))
    job.retry_path(sid).write_bytes(b'{"after_attempt": 5}')
    assert retry_base(job, sid) == 5
