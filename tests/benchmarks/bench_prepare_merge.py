"""Prepare and merge against plain file work on the same bytes (B2, B3) and their peak memory (B4).

    python tests/benchmarks/bench_prepare_merge.py [--mb 400] [--rss-mb 40 400] [--shards 16] [--rounds 3]
        [--jobs N] [--media] [--dir /tmp/dje-bench]

Not a pytest module (bench_*.py is outside pytest's test_*.py pattern). One run prints:

B2  prepare's data-proportional time, prepare(big) - prepare(tiny), against read+sha256
    (hashlib) of the big file; ratio = baseline_s / prepare_data_s, target >= 0.5.
B3  merge's data-proportional time, merge(big job) - merge(tiny job), against read + sha256 +
    write (+ fsync, as merge does) of the same bytes; ratio likewise, target >= 0.5.
B13 prepare's time per shard at 100,000 one-row shards against 1,000 (--b13-shards), target <= 1.5.
B4  peak RSS of prepare and of merge, each in a fresh child process, at 10x the input vs 1x:
    the child's own VmHWM plus the sum of its prep_pool workers' VmHWM (polled every 20 ms from
    /proc while it runs). ru_maxrss is not used: after fork+exec it starts from the spawning
    process's peak. ratio = 10x / 1x, target <= 1.2. An import-only child's peak is printed
    too: it is in every figure.

"tiny" is one row per shard (--shards rows), the smallest input prepare accepts at that shard
count, so the subtraction removes per-run and per-shard fixed costs. Commands alternate within
each round (their order flips every round) on a warm page cache; medians are over rounds.
Wall times depend on what else runs on the machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from data_juicer_elastic.job.layout import JobDir, Policy  # noqa: E402
from data_juicer_elastic.job.records.done import DoneRecord, expected_output, publish_done  # noqa: E402
from data_juicer_elastic.merge import merge  # noqa: E402
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare  # noqa: E402

med = statistics.median


def generate(path: Path, mb: int, media: bool) -> None:
    rnd = random.Random(0)
    words = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(2, 10))) for _ in range(5000)]
    target, written, i = mb * 1_000_000, 0, 0
    with open(path, "wb") as f:
        while written < target:
            row = {
                "text": " ".join(rnd.choices(words, k=rnd.randint(20, 400))),
                "id": i,
                "meta": {"src": "web", "score": rnd.random(), "lang": "en"},
            }
            if media and i % 7 == 0:
                row["images"] = [f"img/{i}.jpg"]
            line = orjson.dumps(row) + b"\n"
            f.write(line)
            written += len(line)
            i += 1


def head(src: Path, dst: Path, *, mb: int | None = None, rows: int | None = None) -> None:
    """The leading whole rows of ``src``: up to ``mb`` MB, or exactly ``rows`` rows."""
    if dst.exists():
        return
    written, n = 0, 0
    with open(src, "rb") as f, open(dst, "wb") as g:
        for line in f:
            if (mb is not None and written >= mb * 1_000_000) or (rows is not None and n >= rows):
                break
            g.write(line)
            written += len(line)
            n += 1


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def read_sha256(path: Path) -> None:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(16 << 20):
            h.update(block)


def read_sha256_write(path: Path, out: Path) -> None:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f, open(out, "wb", buffering=0) as g:
        while block := f.read(16 << 20):
            h.update(block)
            g.write(block)
        os.fsync(g.fileno())
    out.unlink()


def identity_done(job: JobDir) -> None:
    for spec in job.manifest().shards:
        out = job.attempt_output(spec.id, 1)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.link(job.shard_file(spec.id), out)
        record = DoneRecord(
            shard=spec.id,
            attempt=1,
            host="bench",
            pid=os.getpid(),
            rows=spec.rows,
            bytes=spec.bytes,
            sha256=spec.sha256,
            output=expected_output(job, spec.id, 1),
            started_at=time.time(),
            finished_at=time.time(),
        )
        publish_done(job, record)


def fresh(*paths: Path) -> None:
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


def do_prepare(src: Path, job_dir: Path, shards: int, jobs: int | None) -> None:
    prepare(
        PrepareRequest(str(src), str(job_dir), b"bench: 1\n", Policy(num_shards=shards)), log=lambda m: None, jobs=jobs
    )


def do_merge(job_dir: Path, out: Path) -> None:
    merge(JobDir(job_dir), str(out), log=lambda m: None)


def b13(work: Path, counts: list[int], rounds: int, jobs: int | None) -> tuple[str, str, str, float, str, bool]:
    """Prepare's time per shard at many shards vs few: one ~60-byte row per shard, so per-shard costs dominate."""
    small, large = counts
    src = work / f"rows-{large}.jsonl"
    if not src.exists():
        src.write_bytes(b"".join(orjson.dumps({"text": f"row {i}", "id": i}) + b"\n" for i in range(large)))
    inputs = {small: work / f"rows-{small}.jsonl", large: src}
    head(src, inputs[small], rows=small)
    per: dict[int, list[float]] = {small: [], large: []}
    for rnd in range(rounds):
        for n in (small, large) if rnd % 2 == 0 else (large, small):
            job = work / f"job-b13-{n}"
            fresh(job)
            per[n].append(timed(lambda n=n, job=job: do_prepare(inputs[n], job, n, jobs)) / n)
            fresh(job)
        print(
            f"round {rnd}: prepare {small:,} shards {per[small][-1] * 1e3:.2f} ms/shard, {large:,} shards "
            f"{per[large][-1] * 1e3:.2f} ms/shard; ratio {per[large][-1] / per[small][-1]:.2f}",
            flush=True,
        )
    ratio = med(per[large]) / med(per[small])
    return (
        "B13",
        f"prepare time per shard, {large:,} vs {small:,} one-row shards",
        f"{med(per[large]) * 1e3:.2f} vs {med(per[small]) * 1e3:.2f} ms/shard",
        ratio,
        "<= 1.5",
        ratio <= 1.5,
    )


CHILD = """
import json, os, sys, threading
sys.path.insert(0, {root!r})
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.merge import merge
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare

def hwm(pid):  # VmHWM in KiB; unlike ru_maxrss it does not inherit the spawning process's peak
    try:
        with open(f"/proc/{{pid}}/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))
    except (OSError, StopIteration):
        return 0

workers, stop = {{}}, threading.Event()

def watch():  # prep_pool workers: the last VmHWM seen of each child process
    while not stop.is_set():
        for task in os.listdir("/proc/self/task"):
            try:
                kids = open(f"/proc/self/task/{{task}}/children").read().split()
            except OSError:
                continue
            for pid in kids:
                workers[pid] = max(workers.get(pid, 0), hwm(pid))
        stop.wait(0.02)

t = threading.Thread(target=watch, daemon=True)
t.start()
a = json.loads(sys.argv[1])
if a["op"] == "prepare":
    prepare(PrepareRequest(a["src"], a["job"], b"bench: 1\\n", Policy(num_shards=a["shards"])), log=lambda m: None, jobs=a["jobs"])
elif a["op"] == "merge":
    merge(JobDir(a["job"]), a["out"], log=lambda m: None)
stop.set()
t.join()
print(json.dumps([hwm("self"), sum(workers.values()), len(workers)]))
"""


def child_rss(**args) -> tuple[float, float]:
    """(own peak MB, summed prep_pool worker peaks MB) of one prepare or merge in a fresh interpreter."""
    cmd = [sys.executable, "-c", CHILD.format(root=str(ROOT)), json.dumps(args)]
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    own, workers, _ = json.loads(res.stdout.strip().splitlines()[-1])
    return own / 1024, workers / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=400, help="big input for B2/B3")
    ap.add_argument("--rss-mb", type=int, nargs=2, default=[40, 400], metavar=("MB_1X", "MB_10X"), help="inputs for B4")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--rounds", "--reps", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=None, help="prepare worker processes (default: prepare's own choice)")
    ap.add_argument("--media", action="store_true", help="every 7th row has a relative image path to rewrite")
    ap.add_argument("--skip", nargs="*", default=[], choices=["B2", "B3", "B4", "B13"])
    ap.add_argument(
        "--b13-shards", type=int, nargs=2, default=[1_000, 100_000], metavar=("SMALL", "LARGE"), help="B13 shard counts"
    )
    ap.add_argument("--dir", default="/tmp/dje-bench")
    a = ap.parse_args()
    started = time.perf_counter()
    work = Path(a.dir)
    work.mkdir(parents=True, exist_ok=True)
    tag = "-media" if a.media else ""
    biggest = max(a.mb, *a.rss_mb)
    full = work / f"input-{biggest}mb{tag}.jsonl"
    if not full.exists():
        print(f"generating {full} ...", flush=True)
        generate(full, biggest, a.media)

    def sized(mb: int) -> Path:
        p = work / f"input-{mb}mb{tag}.jsonl"
        head(full, p, mb=mb)
        return p

    src = sized(a.mb)
    tiny = work / f"input-{a.shards}rows{tag}.jsonl"
    head(full, tiny, rows=a.shards)
    size = src.stat().st_size
    read_sha256(src)  # warm the page cache
    table: list[tuple[str, str, str, float, str, bool]] = []

    if not {"B2", "B3"} <= set(a.skip):
        jb, jt, ob, ot, tmp = (
            work / "job-big",
            work / "job-tiny",
            work / "merged-big.jsonl",
            work / "merged-tiny.jsonl",
            work / "rw.tmp",
        )
        r: dict[str, list[float]] = {k: [] for k in ("sha", "pbig", "ptiny", "rw", "mbig", "mtiny")}
        for rnd in range(a.rounds):
            fresh(jb, jt, ob, ot, tmp)
            os.sync()
            steps = [
                ("sha", lambda: read_sha256(src)),
                ("pbig", lambda: do_prepare(src, jb, a.shards, a.jobs)),
                ("ptiny", lambda: do_prepare(tiny, jt, a.shards, a.jobs)),
            ]
            for k, fn in steps if rnd % 2 == 0 else steps[::-1]:
                r[k].append(timed(fn))
            identity_done(JobDir(jb))
            identity_done(JobDir(jt))
            os.sync()
            steps = [
                ("rw", lambda: read_sha256_write(src, tmp)),
                ("mbig", lambda: do_merge(jb, ob)),
                ("mtiny", lambda: do_merge(jt, ot)),
            ]
            for k, fn in steps if rnd % 2 == 0 else steps[::-1]:
                r[k].append(timed(fn))
            pd, md = r["pbig"][-1] - r["ptiny"][-1], r["mbig"][-1] - r["mtiny"][-1]
            print(
                f"round {rnd}: read+sha256 {r['sha'][-1]:.2f}s | prepare big {r['pbig'][-1]:.2f}s tiny {r['ptiny'][-1]:.3f}s "
                f"data {pd:.2f}s ratio {r['sha'][-1] / pd:.2f} | read+sha256+write {r['rw'][-1]:.2f}s | merge big "
                f"{r['mbig'][-1]:.2f}s tiny {r['mtiny'][-1]:.3f}s data {md:.2f}s ratio {r['rw'][-1] / md:.2f}",
                flush=True,
            )
        fresh(jb, jt, ob, ot, tmp)
        m = {k: med(v) for k, v in r.items()}
        p_data = med(b - t for b, t in zip(r["pbig"], r["ptiny"], strict=True))
        m_data = med(b - t for b, t in zip(r["mbig"], r["mtiny"], strict=True))
        p_ratio = med(s / (b - t) for s, b, t in zip(r["sha"], r["pbig"], r["ptiny"], strict=True))
        m_ratio = med(s / (b - t) for s, b, t in zip(r["rw"], r["mbig"], r["mtiny"], strict=True))
        mb = size / 1e6
        print(
            f"median ({mb:.0f} MB): read+sha256 {m['sha']:.2f}s ({mb / m['sha']:.0f} MB/s); prepare big {m['pbig']:.2f}s, "
            f"tiny {m['ptiny']:.3f}s, data {p_data:.2f}s ({mb / p_data:.0f} MB/s); ratio {p_ratio:.2f}"
        )
        print(
            f"median ({mb:.0f} MB): read+sha256+write {m['rw']:.2f}s ({mb / m['rw']:.0f} MB/s); merge big {m['mbig']:.2f}s, "
            f"tiny {m['mtiny']:.3f}s, data {m_data:.2f}s ({mb / m_data:.0f} MB/s); ratio {m_ratio:.2f}"
        )
        table.append(
            (
                "B2",
                f"prepare data time vs read+sha256, {mb:.0f} MB",
                f"base {m['sha']:.2f}s; prepare {m['pbig']:.2f}s - {m['ptiny']:.3f}s = {p_data:.2f}s",
                p_ratio,
                ">= 0.5",
                p_ratio >= 0.5,
            )
        )
        table.append(
            (
                "B3",
                f"merge data time vs read+sha256+write+fsync, {mb:.0f} MB",
                f"base {m['rw']:.2f}s; merge {m['mbig']:.2f}s - {m['mtiny']:.3f}s = {m_data:.2f}s",
                m_ratio,
                ">= 0.5",
                m_ratio >= 0.5,
            )
        )

    if "B4" not in a.skip:
        ins = [sized(mb) for mb in a.rss_mb]
        rss: dict[tuple[str, int], list[tuple[float, float]]] = {
            (op, i): [] for op in ("prepare", "merge") for i in (0, 1)
        }
        floor = child_rss(op="import")[0]
        print(f"an import-only child peaks at {floor:.0f} MB (interpreter + package; part of every figure below)")
        for rnd in range(a.rounds):
            for i in (0, 1) if rnd % 2 == 0 else (1, 0):
                job, out = work / f"job-rss{i}", work / f"merged-rss{i}.jsonl"
                fresh(job, out)
                rss[("prepare", i)].append(
                    child_rss(op="prepare", src=str(ins[i]), job=str(job), shards=a.shards, jobs=a.jobs)
                )
                identity_done(JobDir(job))
                rss[("merge", i)].append(child_rss(op="merge", job=str(job), out=str(out)))
                fresh(job, out)
            print(
                f"round {rnd}: peak MB (own+workers) "
                + ", ".join(
                    f"{op} {a.rss_mb[i]}MB {sum(rss[(op, i)][-1]):.0f}" for op in ("prepare", "merge") for i in (0, 1)
                ),
                flush=True,
            )
        for n, op in (("B4a", "prepare"), ("B4b", "merge")):
            own = [med(x[0] for x in rss[(op, i)]) for i in (0, 1)]
            wk = [med(x[1] for x in rss[(op, i)]) for i in (0, 1)]
            tot = [med(sum(x) for x in rss[(op, i)]) for i in (0, 1)]
            ratio = tot[1] / tot[0]
            print(
                f"median {op}: {a.rss_mb[0]} MB -> own {own[0]:.0f} + workers {wk[0]:.0f} MB; "
                f"{a.rss_mb[1]} MB -> own {own[1]:.0f} + workers {wk[1]:.0f} MB; ratio {ratio:.2f}"
            )
            table.append(
                (
                    n,
                    f"peak RSS of {op} (own + workers), {a.rss_mb[1]} MB vs {a.rss_mb[0]} MB",
                    f"{tot[0]:.0f} MB ({own[0]:.0f}+{wk[0]:.0f}) -> {tot[1]:.0f} MB ({own[1]:.0f}+{wk[1]:.0f}); import-only {floor:.0f} MB",
                    ratio,
                    "<= 1.2",
                    ratio <= 1.2,
                )
            )

    if "B13" not in a.skip:
        table.append(b13(work, a.b13_shards, a.rounds, a.jobs))

    print(f"\n{a.rounds} rounds, {time.perf_counter() - started:.0f} s\n")
    print("| id | measures | median figures | ratio | target |")
    print("|---|---|---|---|---|")
    for n, what, figs, ratio, target, ok in table:
        print(f"| {n} | {what} | {figs} | {ratio:.2f} | {target} {'met' if ok else 'MISSED'} |")
    missed = [n for n, *_, ok in table if not ok]
    if missed:
        sys.exit(f"target missed: {', '.join(missed)}")


if __name__ == "__main__":
    main()
