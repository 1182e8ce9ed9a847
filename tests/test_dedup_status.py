"""``dj-elastic status`` (text and ``--json``), ``--watch``'s line and the PASS line's words for a job with
deduplicators (dedup/progress.py), on a job dir whose stage units run in-process (dedup/units.py) with hashers
that need no Data-Juicer: each dedup's stages, units done / total, failed units, and the rows its join removed.
A job without deduplicators reads as it always did."""

from __future__ import annotations

import orjson
import pytest

from data_juicer_elastic import watch
from data_juicer_elastic.cli import format_status
from data_juicer_elastic.coordination.work import dedup_note
from data_juicer_elastic.dedup import progress, units
from data_juicer_elastic.dedup.layout import Unit
from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.claims import claim_store
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.failed import failure_message
from data_juicer_elastic.job.records.retry import requeue, retry_base
from data_juicer_elastic.status import job_status
from data_juicer_elastic.watch import ProgressReader, progress_line
from data_juicer_elastic.worker.budget import fail_terminally

from .jobs import jsonl_only, make_job

ROWS, SHARDS = 40, 4
RECIPE = b"""project_name: dedup-status
process:
  - whitespace_normalization_mapper: {}
  - document_deduplicator: {lowercase: true}
  - text_length_filter: {min_len: 1}
  - document_minhash_deduplicator: {num_bands: 2, num_rows_per_band: 4}
"""
# d0 keys rows by id % 8: ids 0..7 stay, 32 rows removed; d1 by id % 3 over those 8: {0,3,6} {1,4,7} {2,5} are
# components, each keeping its first: 5 removed.
REMOVED = (32, 5)
pytestmark = jsonl_only("dedup stages read JSONL shards")


def hasher(modulo: int) -> units.Hasher:
    return units.Hasher(lambda rows: [[(r["id"] % modulo).to_bytes(8, "little")] for r in rows], 8)


OPS = units.Ops([hasher(8), hasher(3)], [None, None, None])


def run(job: JobDir, stage: str, dedup: int) -> None:
    layout = progress.dedup_layout(job)[1]
    for unit in layout.units(stage, dedup):  # type: ignore[arg-type]
        assert units.publish(job.store, layout, unit, units.run_unit(job.store, layout, unit, 1, OPS))


@pytest.fixture
def job(tmp_path) -> JobDir:
    return make_job(tmp_path, rows=ROWS, shards=SHARDS, recipe=RECIPE)


def stages(st) -> list[dict]:
    return [{"removed": p["removed"], "failed": p["failed"], **p["stages"]} for p in st.to_dict()["dedup"]]


def test_status_shows_each_dedup_s_stages_and_the_rows_its_join_removed(job):
    st = job_status(job, per_shard=False)
    assert [(p.op, p.kind) for p in st.dedup] == [
        ("document_deduplicator", "exact"),
        ("document_minhash_deduplicator", "minhash"),
    ]
    assert stages(st)[0] == {"removed": None, "failed": [], "hash": [0, 4], "bucket": [0, 4], "join": [0, 1]}
    run(job, "hash", 0)
    run(job, "bucket", 0)
    st = job_status(job, per_shard=False)
    assert stages(st)[0] == {"removed": None, "failed": [], "hash": [4, 4], "bucket": [4, 4], "join": [0, 1]}
    assert "dedup: d0 exact join 0/1, d1 minhash hash 0/4" in progress_line(st)
    run(job, "join", 0)
    for stage in ("hash", "bucket", "join"):
        run(job, stage, 1)
    for per_shard in (False, True):
        st = job_status(job, per_shard=per_shard)
        got = stages(st)
        assert [g["removed"] for g in got] == list(REMOVED)
        assert all(g[s] == [g[s][1], g[s][1]] for g in got for s in ("hash", "bucket", "join"))
        assert progress.brief(st.dedup) == "dedup: d0 exact removed 32 rows, d1 minhash removed 5 rows"
    text = format_status(st, show_all=False)
    assert "dedup d0 document_deduplicator (exact): hash 4/4, bucket 4/4, join 1/1; removed 32 rows" in text
    assert "dedup d1 document_minhash_deduplicator (minhash): hash 4/4, bucket 4/4, join 1/1; removed 5" in text


def test_a_join_record_without_its_count_is_read_from_the_removed_file(job):
    for stage in ("hash", "bucket", "join"):
        run(job, stage, 0)
    layout = progress.dedup_layout(job)[1]
    path = job.root / layout.done_key(Unit("join", 0))
    raw = orjson.loads(path.read_bytes())
    del raw["removed"]  # as a join published before the count was kept
    path.write_bytes(orjson.dumps(raw))
    assert units.load_done(job.store, layout, Unit("join", 0)).removed == -1
    assert progress.dedup_progress(job)[0].removed == REMOVED[0]


def test_a_unit_failed_past_its_budget_shows_and_makes_the_job_failed(job):
    run(job, "hash", 0)
    unit = Unit("bucket", 0, "00002")
    fail_terminally(job, unit.id, 1, "node-a", "RuntimeError: planted")
    st = job_status(job, per_shard=False)
    assert st.failed and not st.complete
    assert stages(st)[0]["failed"] == [unit.id]
    assert f"failed past the retry budget: {unit.id}" in format_status(st, show_all=False)


def test_status_reads_per_stage_not_per_unit(job, monkeypatch):
    """Once the layout is known: two listings, then one read per done join (its done record), whatever the
    shard and bucket counts; a join already counted is not read again (a watcher's cache)."""
    for stage in ("hash", "bucket", "join"):
        run(job, stage, 0)
    found = progress.dedup_layout(job)
    calls: list[tuple[str, str]] = []
    store = job.store
    for name in ("read", "head", "open_range", "names", "list"):
        real = getattr(store, name)
        monkeypatch.setattr(
            store, name, lambda key, *a, _n=name, _r=real, **k: [calls.append((_n, key)), _r(key, *a, **k)][1]
        )
    known: dict[int, int] = {}
    assert progress.progress_of(job, *found, known)[0].removed == REMOVED[0]
    assert sorted(n for n, _ in calls) == ["names", "names", "read"], calls
    assert calls[-1][1].endswith("state/stage-done/d0-join.json")
    calls.clear()
    assert progress.progress_of(job, *found, known)[0].removed == REMOVED[0]
    assert sorted(n for n, _ in calls) == ["names", "names"], calls


def test_a_job_without_dedups_reads_as_before(tmp_path):
    job = make_job(tmp_path, rows=20, shards=2)
    st = job_status(job, per_shard=False)
    assert st.dedup == [] and "dedup" not in st.to_dict()
    assert not [line for line in format_status(st, show_all=True).splitlines() if line.startswith("dedup")]
    assert "; dedup:" not in progress_line(st)
    assert progress.brief(st.dedup) == ""


def test_the_console_line_and_the_pass_words_name_the_stages(job, monkeypatch):
    reader = ProgressReader(str(job.root))
    assert reader.line().endswith("; dedup: d0 exact hash 0/4, d1 minhash hash 0/4")
    for dedup in (0, 1):
        for stage in ("hash", "bucket", "join"):
            run(job, stage, dedup)
    words = "dedup: d0 exact removed 32 rows, d1 minhash removed 5 rows"
    assert reader.line().endswith(f"; {words}")
    monkeypatch.setattr(watch, "progress_of", None)  # every join done: the words are kept, nothing listed
    assert reader.line().endswith(f"; {words}")
    assert dedup_note(job) == f"; {words}"


def test_a_job_without_dedups_has_the_lines_it_had(tmp_path):
    job = make_job(tmp_path, rows=20, shards=2)
    assert "dedup" not in ProgressReader(str(job.root)).line()
    assert dedup_note(job) == ""


def test_retry_requeues_a_failed_unit_and_refuses_a_done_one(job):
    """``dj-elastic retry`` on a unit past its budget: its failed record archived, its budget reset (its failure
    count starts after the retry), by name or with ``--all-failed``; a done unit is refused, naming why."""
    run(job, "hash", 0)
    unit = Unit("bucket", 0, "00002")
    claims = claim_store(job, "node-a")
    for attempt, name in ((1, unit.id), (2, None)):
        lease = claims.try_claim(unit.id, claims.latest_attempt(unit.id))
        assert lease.attempt == attempt
        fail_terminally(job, unit.id, attempt, "node-a", "RuntimeError: planted")
        assert "dedup unit d0-bucket-00002 failed terminally" in failure_message(job, unit.id)
        assert requeue(job, [unit.id] if name else None, all_failed=name is None, log=lambda _: None) == [unit.id]
        assert unit.id not in job.failed_ids() and retry_base(job, unit.id) == attempt
        assert not job_status(job, per_shard=False).failed
    done = Unit("hash", 0, progress.dedup_layout(job)[1].shards[0])
    with pytest.raises(UserError, match=f"dedup unit {done.id} is done and later stages read what it wrote"):
        requeue(job, [done.id], log=lambda _: None)
    assert units.is_done(job.store, progress.dedup_layout(job)[1], done)
