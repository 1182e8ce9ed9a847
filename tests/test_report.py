"""The job report as a person sees it: a real multi-process job, opened in headless Chromium.

Chromium is the Debian package (``.ci/run`` installs it). Where it is absent
the browser test skips, unless ``CI`` is set: there it fails.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import orjson
import pytest

from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.report import REPORT_NAME, write_report
from tests.require import require

from .jobs import REPO, env_with, make_job, spawn_worker, wait_for, write_corpus

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
]
CONSOLE_RE = re.compile(r":CONSOLE[:(]\d*\)?\]? (.*)")


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    require(bool(found), "chromium (apt-get install chromium)")
    return found


def browse(page: Path, tmp: Path, *extra: str) -> tuple[str, list[str]]:
    """Run headless Chromium on ``page`` with a fresh profile: (stdout, console messages)."""
    profile = tmp / f"profile-{time.monotonic_ns()}"
    cmd = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    shutil.rmtree(profile, ignore_errors=True)
    assert out.returncode == 0, f"chromium exited {out.returncode}: {out.stderr[-2000:]}"
    return out.stdout, [m.group(1) for m in CONSOLE_RE.finditer(out.stderr)]


class Bars(HTMLParser):
    """The timeline's bars as the browser laid the DOM out: (shard, attempt) -> outcome."""

    def __init__(self) -> None:
        super().__init__()
        self.bars: dict[tuple[str, int], str] = {}

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "rect" and "bar" in (a.get("class") or "").split():
            key = (a["data-shard"], int(a["data-attempt"]))
            assert key not in self.bars, f"two bars for {key}"
            self.bars[key] = a["data-outcome"]


def expected_outcomes(job: JobDir, killed_host: str) -> dict[tuple[str, int], str]:
    """What each attempt ended as, from the job dir itself (the killed node's attempts are lost)."""
    want = {}
    for shard_dir in sorted(job.attempts_dir.iterdir()):
        winner = orjson.loads(job.done_path(shard_dir.name).read_bytes())["attempt"]
        for adir in sorted(shard_dir.iterdir()):
            info = orjson.loads((adir / "attempt.json").read_bytes())
            n = int(adir.name)
            if info["host"] == killed_host:
                assert info["outcome"] == "running", info
                want[shard_dir.name, n] = "lost"
            else:
                want[shard_dir.name, n] = "done" if n == winner else info["outcome"]
    return want


def renewed_for(job: JobDir, secs: float) -> bool:
    """A lease was renewed ``secs`` after its attempt started (its worker lived that long in the shard)."""
    for lease in job.claims_dir.iterdir() if job.claims_dir.is_dir() else ():
        sid, _, n = lease.name.partition("@")
        try:
            started = orjson.loads((job.attempt_dir(sid, int(n)) / "attempt.json").read_bytes())["started_at"]
            if lease.stat().st_mtime - started >= secs:
                return True
        except (OSError, ValueError, KeyError):
            continue
    return False


def run_nodes(tmp: Path, hold: float = 0.0) -> tuple[JobDir, list[str], list[subprocess.Popen]]:
    """Three nodes of one run: node-c hangs in its first shard (its lease renewed ``hold`` seconds in it) and is
    killed; node-a and node-b finish, failing the first attempt of two shards (returned)."""
    dataset = write_corpus(tmp / "input" / "data.jsonl", 480)
    job = JobDir(tmp / "job")

    def node(host: str, **env: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "tests.coord_node", "--job-dir", str(job.root), "--export", str(tmp / "out.jsonl")]
        cmd += ["--dataset", str(dataset), "--shards", "12", "--runner", "story", "--wait-timeout", "60"]
        cmd += ["--lock-timeout", "10"]  # node-c's lease is waited out: 10 s, not the 60 s default
        full = env_with(DJ_ELASTIC_HOSTNAME=host, DJ_ELASTIC_RUN_ID="report-run", **env)
        with open(tmp / f"{host}.log", "wb") as log:
            return subprocess.Popen(
                cmd, cwd=REPO, env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    hung = node("node-c", DJE_TEST_HANG="1")
    wait_for(lambda: any(job.attempts_dir.glob("*/*/started")) and renewed_for(job, hold), timeout=120)
    os.killpg(hung.pid, signal.SIGKILL)
    hung.wait()
    # node-c scans from an offset of its own and may have held any shard (a prefetch too): the injected
    # failures go to two shards whose first attempt node-a or node-b will make.
    held = {d.name for d in job.attempts_dir.iterdir()}
    free = [s.id for s in job.manifest().shards if s.id not in held]
    fail_once = [free[1], free[-2]]
    env = {"DJE_TEST_FAIL_ONCE": ",".join(fail_once), "DJE_TEST_UNIT": "0.3"}
    return job, fail_once, [node(h, **env) for h in ("node-a", "node-b")]


def wait_nodes(nodes: list) -> list[int]:
    """The exit codes of ``nodes`` (4 minutes at most each); any still running after that is killed whole."""
    try:
        return [n.wait(timeout=240) for n in nodes]
    finally:
        for n in nodes:
            if n.poll() is None:
                os.killpg(n.pid, signal.SIGKILL)


@pytest.mark.slow  # three nodes and a lease waited out
def test_report_of_a_real_job_in_chromium(tmp_path):
    chromium()
    job, fail_once, nodes = run_nodes(tmp_path)
    codes = wait_nodes(nodes)
    logs = [(tmp_path / f"{h}.log").read_text() for h in ("node-a", "node-b")]
    assert codes == [0, 0], logs
    story = "".join(logs)  # the console tells the takeover and the retries
    assert "(taking over attempt 0001 of host=node-c" in story and "(retry after a failure)" in story, story
    page = job.gen_dir / REPORT_NAME  # one report per generation
    assert page.exists(), "the finalize coordinator wrote no report into the generation's folder"
    html = page.read_text()
    assert "<script" not in html and not re.search(r"""(src|href)=["']?https?:""", html), (
        "the page must be self-contained"
    )

    shot = Path(os.environ.get("DJE_REPORT_SCREENSHOT") or tmp_path / "report.png")
    # one Chromium start: the DOM as laid out, the console, and the screenshot
    dom, console = browse(page, tmp_path, "--dump-dom", f"--screenshot={shot}", "--window-size=1280,1500")
    assert console == [], f"the page raised console messages: {console}"
    parser = Bars()
    parser.feed(dom)
    want = expected_outcomes(job, "node-c")
    assert parser.bars == want
    assert sorted(set(want.values())) == ["done", "failed", "lost"], want  # a killed node and retried shards
    assert len(fail_once) == 2 and {k[0] for k, v in want.items() if v == "failed"} == set(fail_once), want
    for shard in fail_once:
        assert f"injected first-attempt failure for {shard}" in dom
    assert "every_other_row_filter" in dom  # the op table, from each shard's ops.json

    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000, "no real screenshot was taken"


def test_console_check_sees_a_page_error(tmp_path):
    """The console capture above would see an error: a page that logs one is caught."""
    page = tmp_path / "control.html"
    page.write_text('<!DOCTYPE html><html><body><script>console.error("control error")</script></body></html>')
    _, console = browse(page, tmp_path, "--dump-dom")
    assert any("control error" in m for m in console), console


def test_report_of_a_half_written_job_dir_skips_what_is_broken(tmp_path):
    job = make_job(tmp_path, rows=60, shards=6)
    worker = spawn_worker(job, "copy", "--max-shards", "3")
    assert worker.wait(timeout=120) == 0
    attempts = sorted(job.attempts_dir.glob("*/0001/attempt.json"))
    assert len(attempts) == 3
    attempts[0].write_text("{not json")  # a crash mid-write, a disk error
    (attempts[1].parent / "ops.json").write_text("[1, 2")
    untouched = next(s.id for s in job.manifest().shards if not (job.attempts_dir / s.id).exists())
    os.makedirs(job.attempts_dir / untouched / "0001")  # a claim killed before its attempt.json
    html = write_report(job.root).read_text()
    # a done shard's one attempt is drawn from its done record, whatever its attempt.json says
    assert html.count('class="bar ') == 3 and f'data-shard="{attempts[0].parent.parent.name}"' in html
    assert f"attempts/{untouched}/0001/attempt.json missing or unreadable" in html  # the killed claim: skipped
    assert ">running<" in html  # the job is not finished

    job.manifest_path.write_text("{")  # even the manifest: every shard is read from its attempt folders
    html = write_report(job.root, tmp_path / "r.html").read_text()
    assert "manifest.json unreadable" in html and html.count('class="bar ') == 2
    assert f"attempts/{attempts[0].parent.parent.name}/0001/attempt.json missing or unreadable" in html


WATCH = ["--watch", "--interval", "0.1"]


def test_status_watch_follows_a_job_until_it_ends(tmp_path):
    job = make_job(tmp_path, rows=40, shards=4)
    watch = subprocess.Popen(
        [sys.executable, "-m", "data_juicer_elastic.cli", "status", "--job-dir", str(job.root), *WATCH],
        cwd=REPO,
        env=env_with(),
        stdout=subprocess.PIPE,
        text=True,
    )
    first = watch.stdout.readline()  # the watch is up before the job moves
    worker = spawn_worker(job, "weighted", DJE_TEST_UNIT="1.0")
    try:
        assert worker.wait(timeout=120) == 0
        out, _ = watch.communicate(timeout=60)
        out = first + out
    finally:
        for p in (worker, watch):
            if p.poll() is None:
                p.kill()
    assert watch.returncode == 0, out
    lines = out.splitlines()
    assert "0/4 shards done" in lines[0] and "4/4 shards done" in lines[-1], out
    assert any("1 running" in line and "1 host(s) active" in line for line in lines), out
    assert len(lines) == len(set(line.split(" ", 1)[1] for line in lines)), "a line per change, not per poll"


# records written directly: a backup race, a prefetching worker, a job too big for one bar per attempt -----------
def _attempt(job: JobDir, sid: str, n: int, host: str, pid: int, start: float, end: float, outcome: str) -> None:
    from data_juicer_elastic.job.records.attempt import AttemptRecord, write_attempt

    adir = job.attempt_dir(sid, n)
    adir.mkdir(parents=True, exist_ok=True)
    record = AttemptRecord(sid, n, host, pid, "t", start, start, None, False, backup=n > 1)
    record.outcome, record.finished_at = outcome, end
    write_attempt(job, record)
    (job.claims_dir / f"{sid}@{n:04d}").write_bytes(b"{}")


def test_a_lost_backup_race_and_queued_time_are_shown_as_such(tmp_path):
    from data_juicer_elastic.job.records.done import DoneRecord, publish_done
    from data_juicer_elastic.report.collect import collect
    from data_juicer_elastic.report.page import render

    job = make_job(tmp_path, rows=30, shards=3)
    a, b, c = (s.id for s in job.manifest().shards)
    t = time.time() - 100
    _attempt(job, a, 1, "node-a", 11, t, t + 50, "lost-race")  # the original: its backup published first
    _attempt(job, a, 2, "node-b", 22, t + 20, t + 40, "done")
    _attempt(job, b, 1, "node-b", 22, t + 40, t + 60, "done")  # node-b pid 22 prefetched c while b ran
    _attempt(job, c, 1, "node-b", 22, t + 45, t + 70, "done")
    for sid, n, start, end in ((a, 2, t + 20, t + 40), (b, 1, t + 40, t + 60), (c, 1, t + 45, t + 70)):
        out = job.attempt_output(sid, n)
        out.write_bytes(b'{"x": 1}\n')
        rec = DoneRecord(sid, n, "node-b", 1, 9, hashlib.sha256(b'{"x": 1}\n').hexdigest(), job.relative(out))
        publish_done(job, dataclasses.replace(rec, pid=22, started_at=start, finished_at=end))
    report = collect(job.root)
    got = {(x.shard, x.attempt): (x.outcome, round(x.queued, 3)) for x in report.attempts}
    assert got == {(a, 1): ("lost-race", 0), (a, 2): ("done", 0), (b, 1): ("done", 0), (c, 1): ("done", 15.0)}
    html = render(report)
    parser = Bars()
    parser.feed(html)
    assert parser.bars[a, 1] == "lost-race" and "running" not in parser.bars.values()
    assert html.count('class="queued"') == 1 and f'data-shard="{c}"' in html.split('class="queued"')[1][:60]
    assert "15.0s of it queued" in html


def test_report_of_a_job_with_more_attempts_than_pixels_in_chromium(tmp_path):
    """2,500 shards: the timeline becomes time buckets per lane; the page stays small and loads clean."""
    chromium()
    sys.path.insert(0, str(REPO / "tests" / "benchmarks"))
    from bench_views import build_job

    job = build_job(tmp_path / "big", 2500, running=3)
    page = write_report(job.root, tmp_path / "big.html")
    html = page.read_text()
    assert 'class="bar ' not in html and html.count('class="bucket"') > 100
    assert len(html) < 1_500_000, len(html)
    # past 1,000 shards the shard table lists those not done by one attempt (retried, running), then a count
    listed = re.search(r"<td>([\d,]+) more shards</td><td>not listed</td>", html)
    assert listed and 2400 < int(listed.group(1).replace(",", "")) < 2500, listed
    dom, console = browse(page, tmp_path, "--dump-dom")
    assert console == [], console
    lanes = set(re.findall(r'class="bucket" data-lane="([^"]+)"', dom))
    assert len(lanes) == 16, lanes  # one lane per worker of the 16 hosts
    assert 'class="mark outcome-failed"' in dom and 'class="mark outcome-running"' in dom
    shot = Path(os.environ.get("DJE_REPORT_SCREENSHOT_BIG") or tmp_path / "big.png")
    browse(page, tmp_path, f"--screenshot={shot}", "--window-size=1280,1200")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_attempt_killed_mid_shard_and_taken_over_is_drawn_and_counted_as_lost(tmp_path):
    """kill -9 leaves attempt.json saying ``running`` and a lease a restarted node took over at once (still
    fresh): once another attempt finished the shard, the page says lost, never running."""
    from data_juicer_elastic.job.records.done import DoneRecord, publish_done
    from data_juicer_elastic.report.collect import collect
    from data_juicer_elastic.report.page import render

    job = make_job(tmp_path, rows=30, shards=3, lock_timeout_secs=60.0)
    a, b, c = (s.id for s in job.manifest().shards)
    t = time.time() - 100
    _attempt(job, a, 1, "node-a", 11, t, t + 5, "running")  # killed -9: its record still says running
    record = orjson.loads((job.attempt_dir(a, 1) / "attempt.json").read_bytes())
    for key in ("finished_at", "error", "backup", "backup_of"):
        record.pop(key, None)
    (job.attempt_dir(a, 1) / "attempt.json").write_bytes(orjson.dumps(record))
    os.utime(job.claims_dir / f"{a}@0001", (t + 5, t + 5))  # its lease: last renewed just before the kill
    _attempt(job, a, 2, "node-a", 33, t + 6, t + 30, "done")  # the restarted node, at once
    _attempt(job, b, 1, "node-b", 22, t + 1, t + 20, "done")
    _attempt(job, c, 1, "node-b", 22, t + 20, t + 40, "done")
    for path in job.claims_dir.iterdir():  # not a backup: the restarted node's own claim
        if path.name != f"{a}@0001":
            os.utime(path, (t + 40, t + 40))
    for x in (job.attempt_dir(a, 2), job.attempt_dir(b, 1), job.attempt_dir(c, 1)):
        info = orjson.loads((x / "attempt.json").read_bytes())
        info["backup"] = False
        (x / "attempt.json").write_bytes(orjson.dumps(info))
    for sid, n, host, pid, start, end in ((a, 2, "node-a", 33, t + 6, t + 30), (b, 1, "node-b", 22, t + 1, t + 20)):
        out = job.attempt_output(sid, n)
        out.write_bytes(b'{"x": 1}\n')
        rec = DoneRecord(sid, n, host, 1, 9, hashlib.sha256(b'{"x": 1}\n').hexdigest(), job.relative(out))
        publish_done(job, dataclasses.replace(rec, pid=pid, started_at=start, finished_at=end))
    out = job.attempt_output(c, 1)
    out.write_bytes(b'{"x": 1}\n')
    rec = DoneRecord(c, 1, "node-b", 1, 9, hashlib.sha256(b'{"x": 1}\n').hexdigest(), job.relative(out))
    publish_done(job, dataclasses.replace(rec, pid=22, started_at=t + 20, finished_at=t + 40))

    report = collect(job.root, now=t + 41)  # within the lease timeout of attempt 1's last renewal
    assert report.state == "finished"
    got = {(x.shard, x.attempt): x.outcome for x in report.attempts}
    assert got == {(a, 1): "lost", (a, 2): "done", (b, 1): "done", (c, 1): "done"}, got
    lost = next(x for x in report.attempts if x.outcome == "lost")
    assert lost.end <= t + 6, "a lost attempt's bar ends when it was taken over, not at the report's time"
    html = render(report)
    parser = Bars()
    parser.feed(html)
    assert parser.bars[a, 1] == "lost" and "running" not in parser.bars.values()
    assert "<h2>Failures (1)</h2>" in html
    assert re.search(r'<div class="card">failed or lost<b>1</b></div>', html), html
    hosts = re.search(r'<table class="hosts">.*?</table>', html, re.S).group(0)
    assert re.search(r"<td>node-a</td>(<td[^>]*>[^<]*</td>){6}<td class=\"n\">1</td>", hosts), hosts
