"""Throughput of prepare and merge against plain read+sha256 of the same file.

    python benchmarks/bench_prepare_merge.py --mb 400 --shards 16 --reps 3 [--media] [--dir /tmp/dje-bench]

Generates a JSONL file of Data-Juicer-like rows, then per repetition times
(interleaved, on the same warm page cache): read+sha256 of the input, prepare
into a fresh job dir, and merge of identity outputs. Prints wall MB/s, CPU
seconds (this process plus its worker children) and their ratios to the
baseline. CPU ratios matter where the machine is shared: wall times there
depend on what else runs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_juicer_elastic.jobdir import JobDir, Policy  # noqa: E402
from data_juicer_elastic.merge import merge  # noqa: E402
from data_juicer_elastic.prepare import PrepareRequest, prepare  # noqa: E402
from data_juicer_elastic.storage import dumps_json, publish_once  # noqa: E402


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


def cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def timed(fn) -> tuple[float, float]:
    c0, t0 = cpu(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, cpu() - c0


def read_sha256(path: Path) -> None:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(16 << 20):
            h.update(block)


def identity_done(job: JobDir) -> None:
    for spec in job.manifest().shards:
        out = job.attempt_output(spec.id, 1)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.link(job.shard_file(spec.id), out)
        record = {
            "shard": spec.id,
            "attempt": 1,
            "host": "bench",
            "pid": os.getpid(),
            "rows": spec.rows,
            "bytes": spec.bytes,
            "sha256": spec.sha256,
            "output": f"attempts/{spec.id}/0001/processed.jsonl",
            "started_at": time.time(),
            "finished_at": time.time(),
        }
        publish_once(job.done_path(spec.id), dumps_json(record))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=400)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--media", action="store_true", help="every 7th row has a relative image path to rewrite")
    ap.add_argument("--dir", default="/tmp/dje-bench")
    a = ap.parse_args()
    work = Path(a.dir)
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"input-{a.mb}mb{'-media' if a.media else ''}.jsonl"
    if not src.exists():
        generate(src, a.mb, a.media)
    size = src.stat().st_size
    read_sha256(src)  # warm the page cache
    rows = []
    for rep in range(a.reps):
        job_dir, out = work / "job", work / "merged.jsonl"
        shutil.rmtree(job_dir, ignore_errors=True)
        out.unlink(missing_ok=True)
        os.sync()
        base = timed(lambda: read_sha256(src))
        prep = timed(
            lambda: prepare(
                PrepareRequest(str(src), str(job_dir), b"bench: 1\n", Policy(num_shards=a.shards)),
                log=lambda m: None,
                jobs=a.jobs,
            )
        )
        identity_done(JobDir(job_dir))
        mrg = timed(lambda: merge(JobDir(job_dir), str(out), log=lambda m: None))
        rows.append((base, prep, mrg))
        mbs = [size / w / 1e6 for w, _ in (base, prep, mrg)]
        print(
            f"rep {rep}: read+sha256 {mbs[0]:.0f} MB/s ({base[1]:.2f} cpu-s) | prepare {mbs[1]:.0f} MB/s "
            f"({prep[1]:.2f} cpu-s) wall ratio {base[0] / prep[0]:.2f} cpu ratio {base[1] / prep[1]:.2f} | "
            f"merge {mbs[2]:.0f} MB/s wall ratio {base[0] / mrg[0]:.2f}",
            flush=True,
        )
    med = statistics.median
    print(
        f"median: prepare wall ratio {med(b[0] / p[0] for b, p, _ in rows):.2f}, "
        f"cpu ratio {med(b[1] / p[1] for b, p, _ in rows):.2f}; merge wall ratio {med(b[0] / m[0] for b, _, m in rows):.2f}"
    )
    shutil.rmtree(work / "job", ignore_errors=True)
    (work / "merged.jsonl").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
