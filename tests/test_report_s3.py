"""The job report of a job dir on an object store (docs/OBJECT_STORE.md, issue 36), on the moto server.

The report is read through the job's store and written as the key ``report.html`` of the same folder (one
PUT, nothing on the local disk). One job is prepared on disk, mirrored onto a fresh prefix
(``test_jobdir_s3.mirror``) and run both there and on disk by the same worker with the ``story`` runner
(the copy runner's rows through one pretend Filter, with an ``ops.json``; one shard fails its first attempt
and is retried), so both reports must show the same shards, attempts, rows and ops: only the job dir's
name and the times differ.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.report import REPORT_NAME, write_report
from data_juicer_elastic.storage.store import store_for
from data_juicer_elastic.worker.loop import run_worker

from .chaos.conftest import s3_url  # noqa: F401 (s3_url: a fresh prefix, the env set)
from .chaos.test_faults_s3 import _nothing_local
from .cluster import Cluster, finish
from .jobs import REPO, env_with, make_job
from .runners import story
from .test_jobdir_s3 import mirror
from .test_report import Bars, browse, chromium, expected_outcomes
from .test_store_contract import BUCKET, moto_env  # noqa: F401 (moto_env: the server, one per module)

TIMED = {"hosts": (5, 6), "shards": (8,)}  # the tables' columns of seconds (busy, idle; a shard's time)


class Content(HTMLParser):
    """What a report says, times left out: its state, cards, class-named tables (cell texts) and bars."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.cards: dict[str, str] = {}
        self.state = ""
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._card: list[str] | None = None
        self.feed(html)
        bars = Bars()
        bars.feed(html)
        self.bars = bars.bars

    def handle_starttag(self, tag: str, attrs: list) -> None:
        cls = dict(attrs).get("class") or ""
        if tag == "table" and cls:
            self._table = cls
            self.tables[cls] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = []
        elif tag == "div" and cls == "card":
            self._card = []
        elif tag == "span" and cls.startswith("state "):
            self._cell = []

    def handle_data(self, data: str) -> None:
        for part in (self._cell, self._card):
            if part is not None:
                part.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._table and self._cell is not None:
            self.tables[self._table][-1].append("".join(self._cell))
            self._cell = None
        elif tag == "span" and self._cell is not None and self._table is None:
            self.state, self._cell = "".join(self._cell), None
        elif tag == "table":
            self._table = None
        elif tag == "b" and self._card is not None:
            label, value = "".join(self._card[:-1]), self._card[-1]
            self.cards[label], self._card = value, None

    def untimed(self) -> dict:
        tables = {
            name: [[c for i, c in enumerate(row) if i not in TIMED.get(name, ())] for row in rows]
            for name, rows in self.tables.items()
        }
        cards = {k: v for k, v in self.cards.items() if k != "wall time"}
        return {"state": self.state, "cards": cards, "tables": tables, "bars": self.bars}


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory, moto_env: dict[str, str]) -> Iterator[tuple[JobDir, str]]:  # noqa: F811
    """The job on disk and its URL, each run to the end by one worker of this process (same host, same pid)."""
    with pytest.MonkeyPatch.context() as mp:
        local = make_job(tmp_path_factory.mktemp("report-s3"), rows=60, shards=6)
        url, _ = mirror(local, mp, moto_env)
        mp.setenv("DJE_TEST_UNIT", "0")
        mp.setenv("DJE_TEST_FAIL_ONCE", local.manifest().shards[1].id)
        for job in (JobDir(url), local):
            result = run_worker(job, story, host="node-a", log=lambda *_: None)
            assert result.exit_code == 0 and result.job_complete, result
        yield local, url


def _key(local: JobDir) -> str:
    return f"generations/{local.generation}/{REPORT_NAME}"


def _read(url: str, key: str) -> str:
    got = store_for(url).read(key)
    assert got is not None, f"no {key} under {url}"
    return got[0].decode()


def test_the_report_on_s3_says_what_the_same_job_on_disk_says(ran):
    local, url = ran
    job = JobDir(url)
    job.store.delete(_key(local))
    where = write_report(job.gen_dir)  # what a finalize hands it: the generation's folder
    assert str(where) == f"{url}/{_key(local)}"
    html = _read(url, _key(local))
    disk = write_report(local.gen_dir).read_text()
    ours, theirs = Content(html), Content(disk)
    assert ours.untimed() == theirs.untimed()
    assert url in html and str(local.root) not in html and str(local.root) in disk
    # what the comparison rests on: a finished job, a retried shard, the Filter's rows, the shard table
    assert ours.state == "finished" and ours.cards["shards done"] == "6 / 6" and ours.cards["rows in"] == "60"
    assert sorted(set(ours.bars.values())) == ["done", "failed"] and len(ours.bars) == 7
    assert ours.tables["ops"][1][:4] == ["1", "every_other_row_filter", "Filter", "60"]
    assert len(ours.tables["failures"]) == 2 and len(ours.tables["shards"]) == 8  # header, rows, total
    assert not Path(url.replace("s3://", "/", 1)).exists(), "the report wrote the job dir's name on local disk"
    head = job.store.client.head_object(Bucket=job.store.bucket, Key=f"{job.store.prefix}/{_key(local)}")
    assert head["ContentType"] == "text/html; charset=utf-8", head  # shown, not downloaded, from a presigned URL


def test_dj_elastic_report_on_s3_exits_0_and_says_where_the_report_is(ran, tmp_path):
    local, url = ran
    store = store_for(url)
    store.delete(_key(local))

    def report(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "data_juicer_elastic.cli", "report", *args]
        return subprocess.run(cmd, cwd=REPO, env=env_with(), capture_output=True, text=True, timeout=300)

    out = report("--job-dir", url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"report written to {url}/{_key(local)}"
    assert Content(_read(url, _key(local))).state == "finished"
    elsewhere = f"s3://{BUCKET}/reports/{tmp_path.name}/r.html"  # --output: any key of the endpoint
    out = report("--job-dir", url, "--output", elsewhere)
    assert out.returncode == 0 and out.stdout.strip() == f"report written to {elsewhere}", out.stderr
    assert Content(_read(elsewhere.rpartition("/")[0], "r.html")).cards["shards done"] == "6 / 6"
    out = report("--job-dir", f"{url}-none")
    assert out.returncode == 2, out.stderr
    assert f"{url}-none/generations/.none-yet: no job under this prefix" in out.stderr, out.stderr


def test_the_report_on_s3_in_chromium(ran, tmp_path):
    """The page written to the store, fetched and opened as test_report opens a page on disk."""
    chromium()
    local, url = ran
    write_report(JobDir(url).gen_dir)
    page = tmp_path / REPORT_NAME
    page.write_text(_read(url, _key(local)))
    dom, console = browse(page, tmp_path, "--dump-dom")
    assert console == [], f"the page raised console messages: {console}"
    assert Content(dom).bars == expected_outcomes(local, killed_host="-")  # the attempts, read from disk
    assert "every_other_row_filter" in dom
    assert f"injected first-attempt failure for {local.manifest().shards[1].id}" in dom


@pytest.mark.slow  # a coordinated node: prepare, work and finalize on the store
def test_a_finalize_on_s3_writes_the_report_into_the_generation(tmp_path: Path, s3_url: str):  # noqa: F811
    c = Cluster(tmp_path, rows=40, shards=4, job_dir=s3_url)
    node = c.start_one("node-0")
    assert finish([node]) == [0], node.output
    key = f"generations/{c.job.generation}/{REPORT_NAME}"
    assert re.search(rf"job report: {re.escape(f'{s3_url}/{key}')}$", node.output, re.M), node.output
    report = Content(_read(s3_url, key))
    assert report.state == "finished" and report.cards["shards done"] == "4 / 4", report.cards
    _nothing_local(c, s3_url)
