"""S3 requests per shard, by operation and call site: prepare, W workers, merge (docs/OBJECT_STORE.md section 5).

    python tests/benchmarks/bench_s3_requests.py [--shards 1000,4000] [--workers 4] [--rows-per-shard 1]
        [--latency-ms 0] [--sites 14] [--wall 200] [--json FILE] [--report FILE,FILE] [--server moto|rgw]

Every figure is COUNTED, never timed: each process that talks to the store (this one for prepare and
merge, one per worker) wraps botocore's ``Session.create_client`` so that every S3 client it makes, the
``S3Store``'s included, carries a ``before-send`` hook: one count per HTTP request sent (botocore's own
retries included), keyed by operation and by the call site, the first frame of the package outside
``storage/s3*.py``. ``after-call`` counts the answers by operation and status (a HEAD of a missing key is a
404, a lost create a 412). Each size runs on a fresh prefix of one moto server (tests/s3server.py, single
threaded, so the workers' requests queue there): ``prepare`` of ``--rows-per-shard`` rows per shard onto
``s3://bucket/...``, ``--workers`` worker processes (``run_worker`` with ``tests.runners:copy``, each
attempt in node-local scratch) until the job is complete, then ``merge`` to a local file, checked against
the input. The policy is the default one but for a 1 s poll (as B10's). ``--server rgw``: the same on a
one-node Ceph RGW (tests/rgw.py, started for the run; ``--latency-ms`` is moto's only).

Printed per phase and operation: requests, requests per shard, and the ratio of per-shard figures between
the largest and the smallest size (target: flat within 1.2x), then the request price of a 100,000-shard job
at the prices in ``PRICES`` from the largest size's per-shard figures.

``--wall N``: also time prepare + one worker + merge of an N-shard job on a local job dir and on the
store (the server pausing ``--latency-ms`` before each request, e.g. 20), wall seconds only.

``--report A.json,B.json``: no run, the report of sizes measured apart (each file a ``--json`` of one run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PACKAGE = str(REPO / "data_juicer_elastic") + os.sep
STORE_FILES = str(REPO / "data_juicer_elastic" / "storage" / "s3")  # s3.py, s3_upload.py, s3_replies.py
BUCKET = "dje-bench"
POLICY = {"poll_interval_secs": 1.0}  # B10's poll; heartbeats, leases and retries at their defaults
# AWS S3 Standard list prices (us-east-1), dollars per 1,000 requests, as assumed in docs/OBJECT_STORE.md s. 5
TIER1 = 0.005  # PUT, COPY, POST, LIST (and the multipart calls)
TIER2 = 0.0004  # GET, HEAD and the rest
FREE = {"DeleteObject", "DeleteObjects", "AbortMultipartUpload"}
TIER1_OPS = {
    "PutObject",
    "CopyObject",
    "ListObjectsV2",
    "ListObjects",
    "CreateMultipartUpload",
    "UploadPart",
    "UploadPartCopy",
    "CompleteMultipartUpload",
    "ListMultipartUploads",
    "ListParts",
    "CreateBucket",
}
PRICED_SHARDS = 100_000


# --- counting ------------------------------------------------------------------------------------


class Counts:
    """Requests by operation and by (operation, call site), answers by (operation, status); thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: Counter[str] = Counter()
        self.sites: Counter[str] = Counter()
        self.status: Counter[str] = Counter()

    def on_send(self, event_name: str, **_: Any) -> None:
        """``before-send.s3.<Operation>``: returns None, so the request is sent."""
        op = event_name.rsplit(".", 1)[-1]
        site = call_site()
        with self.lock:
            self.ops[op] += 1
            self.sites[f"{op} {site}"] += 1

    def on_call(self, http_response: Any, model: Any, **_: Any) -> None:
        with self.lock:
            self.status[f"{model.name} {http_response.status_code}"] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return {"ops": dict(self.ops), "sites": dict(self.sites), "status": dict(self.status)}


def call_site() -> str:
    """The first two frames of the package outside storage/s3*.py (``module:function <- module:function``)
    and the store method they called."""
    frame = sys._getframe(2)
    store_call, found = "", []
    while frame is not None and len(found) < 2:
        name = frame.f_code.co_filename
        if name.startswith(STORE_FILES):
            store_call = frame.f_code.co_name
        elif name.startswith(PACKAGE):
            found.append(f"{name[len(PACKAGE) :].removesuffix('.py')}:{frame.f_code.co_name}")
        frame = frame.f_back
    return " <- ".join(found or ["(outside the package)"]) + (f" ({store_call})" if store_call else "")


def install(counts: Counts) -> None:
    """Hook every S3 client this process makes from now on (``storage/s3.py`` ``_client`` makes its own
    session, so the hook goes on botocore's ``create_client``, not on one session's events)."""
    import botocore.session

    made = botocore.session.Session.create_client

    def create_client(self: Any, *args: Any, **kwargs: Any) -> Any:
        client = made(self, *args, **kwargs)
        if client.meta.service_model.service_name == "s3":
            client.meta.events.register("before-send.s3", counts.on_send)
            client.meta.events.register("after-call.s3", counts.on_call)
        return client

    botocore.session.Session.create_client = create_client  # type: ignore[method-assign]


def diff(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {k: {n: v - before[k].get(n, 0) for n, v in after[k].items() if v - before[k].get(n, 0)} for k in after}


def add(into: dict[str, dict[str, int]], more: dict[str, dict[str, int]]) -> None:
    for kind, table in more.items():
        bucket = into.setdefault(kind, {})
        for name, n in table.items():
            bucket[name] = bucket.get(name, 0) + n


# --- one worker process --------------------------------------------------------------------------


def worker_main(url: str, host: str, out: str) -> None:
    """A worker process: hook, run the job to its end, write what it sent."""
    counts = Counts()
    install(counts)
    from data_juicer_elastic.job.layout import JobDir
    from data_juicer_elastic.worker.loop import run_worker
    from tests.runners import copy

    started = time.monotonic()
    result = run_worker(JobDir(url), copy, host=host, log=lambda *_: None)
    Path(out).write_bytes(
        json.dumps(
            {
                **counts.snapshot(),
                "completed": len(result.completed),
                "exit": result.exit_code,
                "secs": time.monotonic() - started,
            }
        ).encode()
    )


# --- one size ------------------------------------------------------------------------------------


def prepare_job(tmp: Path, job_dir: str, shards: int, rows_per_shard: int) -> bytes:
    """Prepare ``shards`` shards of ``rows_per_shard`` rows at ``job_dir`` (tests.jobs ``make_job``, with the
    default policy but ``POLICY``); what merging it must give back: the input's rows."""
    from tests.jobs import input_bytes, make_job

    defaults = {"lock_timeout_secs": 300.0, "heartbeat_secs": 30.0, "max_retries": 2}
    folder = tmp / f"in-{uuid.uuid4().hex[:8]}"
    job = make_job(folder, rows=shards * rows_per_shard, shards=shards, job_dir=job_dir, **defaults, **POLICY)
    assert len(job.manifest().shards) == shards, (len(job.manifest().shards), shards)
    return input_bytes(job)


def run_workers(job_dir: str, workers: int, tmp: Path, env: dict[str, str]) -> tuple[dict, float]:
    """``workers`` worker processes until the job is complete: their requests summed, and the wall seconds."""
    started = time.monotonic()
    outs = [tmp / f"w{i}-{uuid.uuid4().hex[:6]}.json" for i in range(workers)]
    procs = [
        subprocess.Popen([sys.executable, __file__, "--worker", job_dir, f"w{i}", str(out)], cwd=REPO, env=env)
        for i, out in enumerate(outs)
    ]
    codes = [p.wait() for p in procs]
    secs = time.monotonic() - started
    if any(codes):
        raise SystemExit(f"a worker failed: exit codes {codes}")
    total: dict[str, Any] = {"completed": 0}
    for out in outs:
        got = json.loads(out.read_bytes())
        total["completed"] += got.pop("completed")
        got.pop("exit"), got.pop("secs")
        add(total, got)
    return total, secs


def measure(shards: int, args: argparse.Namespace, counts: Counts, tmp: Path, env: dict[str, str]) -> dict:
    """prepare, workers, merge of one ``shards``-shard job on a fresh prefix: requests per phase."""
    from data_juicer_elastic.job.layout import JobDir
    from data_juicer_elastic.merge import merge

    url = f"s3://{BUCKET}/bench/{shards}-{uuid.uuid4().hex[:8]}"
    phases: dict[str, Any] = {}
    t0, before = time.monotonic(), counts.snapshot()
    want = prepare_job(tmp, url, shards, args.rows_per_shard)
    phases["prepare"] = diff(counts.snapshot(), before)
    t1 = time.monotonic()
    phases["workers"], worker_secs = run_workers(url, args.workers, tmp, env)
    assert phases["workers"].pop("completed") == shards
    before = counts.snapshot()
    out = tmp / f"merged-{shards}.jsonl"
    merge(JobDir(url), str(out), log=lambda *_: None)
    phases["merge"] = diff(counts.snapshot(), before)
    assert out.read_bytes() == want, "the merged output differs from the input"
    print(
        f"{shards} shards: prepare {t1 - t0:.1f} s, {args.workers} workers {worker_secs:.1f} s, "
        f"merge {time.monotonic() - t1 - worker_secs:.1f} s",
        flush=True,
    )
    return phases


# --- report --------------------------------------------------------------------------------------


def ops_of(phase: dict) -> dict[str, int]:
    return phase.get("ops", {})


def report(results: dict[int, dict], sites: int) -> None:
    sizes = sorted(results)
    small, large = sizes[0], sizes[-1]
    header = f"{'phase':<8} {'operation':<28}" + "".join(f" {f'{n} req':>10} {'/shard':>7}" for n in sizes)
    print("\n" + header + f" {'ratio':>6}")
    for phase in ("prepare", "workers", "merge", "total"):
        per = {n: total_ops(results[n]) if phase == "total" else ops_of(results[n][phase]) for n in sizes}
        names = sorted(set().union(*per.values()), key=lambda op: -per[large].get(op, 0))
        for op in [*names, "all"]:
            line = f"{phase:<8} {op:<28}"
            for n in sizes:
                got = sum(per[n].values()) if op == "all" else per[n].get(op, 0)
                line += f" {got:>10} {got / n:>7.3f}"
            a = (sum(per[small].values()) if op == "all" else per[small].get(op, 0)) / small
            b = (sum(per[large].values()) if op == "all" else per[large].get(op, 0)) / large
            print(line + (f" {b / a:>6.2f}" if a else f" {'-':>6}"))
    for phase in ("workers", "prepare", "merge"):
        print(f"\n{phase}: top call sites at {large} shards (requests per shard)")
        table = results[large][phase].get("sites", {})
        for site, n in sorted(table.items(), key=lambda kv: -kv[1])[:sites]:
            print(f"  {n / large:>8.3f}  {site}")
    print(f"\nanswers at {large} shards, not 2xx (per shard):")
    status: dict[str, int] = {}
    for phase in ("prepare", "workers", "merge"):
        for k, v in results[large][phase].get("status", {}).items():
            status[k] = status.get(k, 0) + v
    for k, v in sorted(status.items(), key=lambda kv: -kv[1]):
        if not k.split()[-1].startswith("2"):
            print(f"  {v / large:>8.3f}  {k}")
    price(results[large], large)


def total_ops(phases: dict) -> dict[str, int]:
    out: Counter[str] = Counter()
    for phase in ("prepare", "workers", "merge"):
        out.update(ops_of(phases[phase]))
    return dict(out)


def price(phases: dict, shards: int) -> None:
    scale = PRICED_SHARDS / shards
    print(
        f"\nrequest price of a {PRICED_SHARDS:,}-shard job from the {shards}-shard per-shard figures "
        f"(${TIER1} per 1,000 PUT/COPY/POST/LIST, ${TIER2} per 1,000 GET/HEAD, DELETE free):"
    )
    grand = 0.0
    for phase in ("prepare", "workers", "merge"):
        ops = ops_of(phases[phase])
        t1 = sum(n for op, n in ops.items() if op in TIER1_OPS) * scale
        t2 = sum(n for op, n in ops.items() if op not in TIER1_OPS and op not in FREE) * scale
        cost = t1 / 1000 * TIER1 + t2 / 1000 * TIER2
        grand += cost
        print(f"  {phase:<8} {t1 / 1e6:>7.3f} M PUT-class  {t2 / 1e6:>7.3f} M GET-class  ${cost:>8.2f}")
    print(f"  total    ${grand:.2f} (${grand / PRICED_SHARDS:.6f} per shard)")


# --- wall time ---------------------------------------------------------------------------------


def wall(shards: int, args: argparse.Namespace, tmp: Path, job_dir: str, env: dict[str, str]) -> float:
    """prepare + one worker process + merge of ``shards`` shards at ``job_dir``: wall seconds."""
    from data_juicer_elastic.job.layout import JobDir
    from data_juicer_elastic.merge import merge

    started = time.monotonic()
    want = prepare_job(tmp, job_dir, shards, args.rows_per_shard)
    run_workers(job_dir, 1, tmp, env)
    out = tmp / f"wall-{uuid.uuid4().hex[:6]}.jsonl"
    merge(JobDir(job_dir), str(out), log=lambda *_: None)
    assert out.read_bytes() == want
    return time.monotonic() - started


# --- main --------------------------------------------------------------------------------------


def server_env(env: dict[str, str]) -> dict[str, str]:
    """This process's environment pointed at the server only (as tests/s3server.py ``use_env``)."""
    out = {k: v for k, v in os.environ.items() if k not in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN")}
    out.update(env, AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return out


def serving(args: argparse.Namespace) -> contextlib.AbstractContextManager[dict[str, str]]:
    """The server the run counts on: moto (tests/s3server.py), or Ceph RGW (tests/rgw.py), bucket ``BUCKET``."""
    from tests.benchmarks.servers import serving as start

    return start(args.server, BUCKET, args.latency_ms)


def main(argv: list[str] | None = None) -> int:
    from tests.benchmarks.servers import KINDS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="1000,4000", help="comma-separated sizes")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rows-per-shard", type=int, default=1)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="the server's pause before each request")
    parser.add_argument("--sites", type=int, default=14, help="call sites listed per phase")
    parser.add_argument("--wall", type=int, default=0, help="also time an N-shard job: local vs the store")
    parser.add_argument("--json", help="also write each size's counts here, as soon as it is measured")
    parser.add_argument("--report", help="comma-separated --json files: report them together, run nothing")
    parser.add_argument("--server", choices=KINDS, default="moto", help="rgw: Ceph RGW (tests/rgw.py)")
    parser.add_argument("--worker", nargs=3, metavar=("URL", "HOST", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(*args.worker)
        return 0
    if args.report:
        saved = [json.loads(Path(name).read_bytes()) for name in args.report.split(",")]
        report({int(n): phases for got in saved for n, phases in got.items()}, args.sites)
        return 0
    counts = Counts()
    results: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="dje-s3req-") as tmp, serving(args) as env:
        full = server_env(env)
        os.environ.clear()
        os.environ.update(full)
        install(counts)
        for shards in [int(s) for s in args.shards.split(",") if s]:
            results[shards] = measure(shards, args, counts, Path(tmp), full)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=True))
        if results:
            report(results, args.sites)
        if args.wall:
            local = wall(args.wall, args, Path(tmp), str(Path(tmp) / "local-job"), full)
            remote = wall(args.wall, args, Path(tmp), f"s3://{BUCKET}/wall/{uuid.uuid4().hex[:8]}", full)
            print(
                f"\nwall, {args.wall} shards, prepare + 1 worker + merge: local job dir {local:.1f} s, "
                f"s3:// (server latency {args.latency_ms:g} ms) {remote:.1f} s, ratio {remote / local:.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
