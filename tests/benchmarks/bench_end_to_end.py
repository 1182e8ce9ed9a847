"""B1: end-to-end wall time of ``dj-process`` with elastic_shard against plain executor_type ray.

    python tests/benchmarks/bench_end_to_end.py [--rounds 3] [--rows 200000] [--shards 16] [--dir DIR] [--keep]
        [--parquet | --s3 [--server moto,rgw] [--count]]

Generates deterministic JSONL (``{"text": ...}`` rows of short English-ish
text) and two recipes with the same process list
(whitespace_normalization_mapper, text_length_filter 10..10000):

  (a) executor_type: elastic_shard, elastic_shard.job_dir fresh per round, num_shards 16;
  (b) executor_type: ray, ray_address: local.

Each round runs ``dj-process --config a.yaml`` and ``dj-process --config b.yaml``
(alternating which goes first), each as a fresh subprocess with its own Ray,
offline, and times its wall seconds. Every run must exit 0 and the elastic
merged output must hold the same rows with the same values as the Ray output,
in input order (compared row by row, by each row's ``id``, with
tests/reference.py's rules). Prints per-round times, medians, the ratio
elastic/ray (target <= 1.15) and a markdown table row, and exits 1 when the
target is missed. Child CPU seconds are printed too: on a shared machine wall
times depend on what else runs.

With ``--parquet`` the same rows are written as a folder of Parquet files
(``PARQUET_FILES`` files of several row groups each, at least two per shard) and
both recipes read that folder: elastic_shard's shards are runs of its row groups
(read in place), Ray's loader reads it with ``ray.data.read_parquet`` (Data-Juicer's
RayLocalJsonDataLoadStrategy picks the reader from the folder's first file's
suffix). The exports stay JSONL and are compared as above.

With ``--s3`` (B1s) the same elastic recipe runs instead, once a round on each
server of ``--server`` and once on local disk, one run after another, the order
turning by one each round: (a) with ``dataset_path``, ``elastic_shard.job_dir``
and ``export_path`` on the server (``moto``: tests/s3server.py; ``rgw``: a
one-node Ceph RGW, tests/rgw.py; both started by tests/benchmarks/servers.py,
one of each for the whole benchmark, the input uploaded untimed to a fresh
prefix each round, the prefix deleted after the round so that moto's
whole-bucket listings stay the same size), the endpoint and credentials in the
environment as in tests/test_dj_process_s3.py; (b) with all three on local
disk. Each server's export is downloaded and compared with the local one as
above; the ratios are server/local (target <= 1.3). ``--server moto,rgw`` puts
the three columns side by side. Each run's line also says the CPU seconds each
server spent during it and where the run's time went, from its log: prepare,
Ray's start-up, the shards (first claim to last done, and their own seconds
summed), merge. ``--count`` adds, for each server run, its S3 requests by
operation and the call sites that spent longest in them (bench_s3_requests'
counter, loaded into the ``dj-process`` driver by a sitecustomize; it slows
the run a little, so time without it).

Not collected by pytest (file name does not match test_*.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.reference
from tests.benchmarks.servers import KINDS, server_cpu, serving
from tests.reference import assert_matches_reference, env_with, read_rows

TARGET = 1.15
S3_TARGET = 1.3
BUCKET = "dje-b1"
DJ_PROCESS = str(Path(sys.executable).parent / "dj-process")
PROCESS = [{"whitespace_normalization_mapper": None}, {"text_length_filter": {"min_len": 10, "max_len": 10000}}]


PARQUET_FILES = 2
SECONDS = re.compile(r" in ([0-9.]+) ?s\b")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \| \w+\s*\| (.*)$")  # dj-process's log lines


def generate(path: Path, rows: int) -> None:
    with open(path, "w") as f:
        for row in generate_rows(rows):
            f.write(json.dumps(row) + "\n")


def generate_parquet(folder: Path, rows: int, shards: int) -> None:
    """The rows of ``generate`` as ``PARQUET_FILES`` Parquet files in ``folder``, in id order by file name, with
    row groups small enough that every shard gets at least two."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    all_rows = list(generate_rows(rows))
    group = max(1, rows // (2 * max(shards, PARQUET_FILES)))
    per_file = -(-rows // PARQUET_FILES)
    for k in range(PARQUET_FILES):
        chunk = all_rows[k * per_file : (k + 1) * per_file]
        if chunk:
            table = pa.Table.from_pylist(chunk, schema=pa.schema([("id", pa.int64()), ("text", pa.string())]))
            pq.write_table(table, folder / f"part-{k:05d}.parquet", row_group_size=group)


def generate_rows(rows: int):
    rnd = random.Random(0)
    words = [
        "".join(rnd.choice("etaoinshrdlucmfwypvbgkjqxz"[: rnd.randint(8, 26)]) for _ in range(rnd.randint(1, 9)))
        for _ in range(3000)
    ]
    for i in range(rows):
        n = rnd.randint(1, 40)  # some rows fall under min_len 10 and are filtered
        sentence = " ".join(rnd.choice(words) for _ in range(n))
        if i % 7 == 0:
            sentence = "  " + sentence.replace(" ", "\u00a0 ", 3) + " \t"  # something for whitespace normalization
        yield {"id": i, "text": sentence.capitalize() + "."}


def count_rows(path: Path) -> int:
    """Lines of a JSONL file, or of all files in Ray's output folder."""
    files = (
        [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    )
    n = 0
    for f in files:
        with open(f, "rb") as fh:
            n += sum(1 for line in fh if line.strip())
    return n


def run(config: Path, cwd: Path, timeout: int, extra_env: dict[str, str] | None = None) -> tuple[float, float, str]:
    env = env_with(**(extra_env or {}))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(
        [DJ_PROCESS, "--config", str(config)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    log = out.stdout + out.stderr
    if out.returncode != 0:
        sys.exit(f"{config.name}: dj-process exited {out.returncode}\n{log[-5000:]}")
    return wall, cpu, log


def b1_parser(doc: str | None, *, rounds: bool = True) -> argparse.ArgumentParser:
    """The arguments every B1-shaped benchmark takes: B1's rows, shards and prepare processes."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if rounds:
        ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--np", type=int, default=2)
    return ap


def write_recipe(path: Path, project: str, base: dict, export: str, **executor: object) -> Path:
    path.write_text(
        yaml.safe_dump({"project_name": project, **base, "export_path": export, **executor}, sort_keys=False)
    )
    return path


def elastic(job_dir: str, shards: int) -> dict:
    return {"executor_type": "elastic_shard", "elastic_shard": {"job_dir": job_dir, "num_shards": shards}}


def check_same(r: int, outputs: dict[str, Path], rows: int) -> int:
    """The first output holds the second's rows with the same values, in input order; its row count."""
    (left, a), (right, b) = outputs.items()
    n_a, n_b = count_rows(a), count_rows(b)
    if n_a != n_b or n_b == 0:
        sys.exit(f"round {r}: {left} wrote {n_a} rows, {right} wrote {n_b}")
    try:
        assert_matches_reference(read_rows(a), read_rows(b), list(range(rows)))
    except AssertionError as exc:
        sys.exit(f"round {r}: the {left} output differs from the {right} output: {exc}")
    return n_b


def timed(name: str, cfg: Path, rd: Path, args: argparse.Namespace, got: dict, env: dict | None = None) -> None:
    served = {kind: server_cpu(kind) for kind in args.servers}
    wall, cpu, log = run(cfg, rd, args.timeout, env)
    (rd / f"{name}.log").write_text(log)
    if args.s3:
        cpus = ", ".join(f"{kind} server cpu {server_cpu(kind) - t:.1f}s" for kind, t in served.items())
        print(f"  {name}: {wall:.1f}s, {cpus}: {phases(log, wall)}", flush=True)
        if (rd / f"counts-{name}").is_dir():
            print_counts(rd / f"counts-{name}")
    got["times"][name].append(wall)
    got["cpus"][name].append(cpu)


def b1_rounds(args: argparse.Namespace, work: Path, data: Path, got: dict) -> None:
    """B1 and B1p: elastic_shard against executor_type ray."""
    base = {"dataset_path": str(data), "np": args.np, "process": PROCESS}
    for r in range(1, args.rounds + 1):
        rd = work / f"round{r}"
        rd.mkdir()
        export = {name: rd / name / "out.jsonl" for name in ("elastic", "ray")}
        a = write_recipe(
            rd / "a.yaml", f"b1-elastic-{r}", base, str(export["elastic"]), **elastic(str(rd / "job"), args.shards)
        )
        b = write_recipe(
            rd / "b.yaml", f"b1-ray-{r}", base, str(export["ray"]), executor_type="ray", ray_address="local"
        )
        order = [("elastic", a), ("ray", b)] if r % 2 else [("ray", b), ("elastic", a)]
        for name, cfg in order:
            timed(name, cfg, rd, args, got)
        report_round(r, order[0][0], got, check_same(r, export, args.rows))


def s3_rounds(args: argparse.Namespace, work: Path, data: Path, got: dict) -> None:
    """B1s: the elastic recipe with input, job dir and export on each server of ``--server`` (moto, Ceph RGW)
    against all on local disk, the runs of a round one after another, the order turning by one each round."""
    import boto3

    with contextlib.ExitStack() as stack:
        envs, clients = {}, {}
        for kind in args.servers:
            server = stack.enter_context(serving(kind, BUCKET))
            envs[kind] = {**server, "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
            clients[kind] = boto3.session.Session(
                aws_access_key_id=server["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=server["AWS_SECRET_ACCESS_KEY"],
                region_name=server["AWS_DEFAULT_REGION"],
            ).client("s3", endpoint_url=server["AWS_ENDPOINT_URL"])
            print(f"{kind} server at {server['AWS_ENDPOINT_URL']}", flush=True)
        base = {"np": args.np, "process": PROCESS}
        for r in range(1, args.rounds + 1):
            rd = work / f"round{r}"
            rd.mkdir()
            export = {name: rd / name / "out.jsonl" for name in (*args.servers, "local")}
            configs, prefixes = {}, {}
            for kind, client in clients.items():
                prefixes[kind] = prefix = f"b1s-{r}-{uuid.uuid4().hex[:8]}"
                client.upload_file(str(data), BUCKET, f"{prefix}/in/data.jsonl")
                url = f"s3://{BUCKET}/{prefix}"
                configs[kind] = write_recipe(
                    rd / f"{kind}.yaml",
                    f"b1s-{kind}-{r}",
                    {"dataset_path": f"{url}/in/data.jsonl", **base},
                    f"{url}/out/out.jsonl",
                    **elastic(f"{url}/job", args.shards),
                )
            configs["local"] = write_recipe(
                rd / "local.yaml",
                f"b1s-local-{r}",
                {"dataset_path": str(data), **base},
                str(export["local"]),
                **elastic(str(rd / "job"), args.shards),
            )
            names = list(configs)
            order = names[(r - 1) % len(names) :] + names[: (r - 1) % len(names)]
            for name in order:
                env = envs.get(name, {})
                timed(name, configs[name], rd, args, got, {**env, **count_env(rd, name)} if env and args.count else env)
            rows_out = 0
            for kind, client in clients.items():
                export[kind].parent.mkdir(parents=True)
                client.download_file(BUCKET, f"{prefixes[kind]}/out/out.jsonl", str(export[kind]))
                rows_out = check_same(r, {kind: export[kind], "local": export["local"]}, args.rows)
                delete_prefix(client, prefixes[kind])
            report_round(r, order[0], got, rows_out)


def delete_prefix(client: Any, prefix: str) -> None:
    """Every key under ``prefix/`` (and any upload left open there), so the next round lists a bucket as small."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/"):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys})
    for up in client.list_multipart_uploads(Bucket=BUCKET, Prefix=f"{prefix}/").get("Uploads", []):
        client.abort_multipart_upload(Bucket=BUCKET, Key=up["Key"], UploadId=up["UploadId"])


def phases(log: str, wall: float) -> str:
    """Where an elastic run's time went, from its log (stamps to the second; prepare, shards and merge time
    themselves): outside the log (start-up to its first line, its last line to exit), config load, prepare,
    prepare's end to the first claim (Ray's start-up), first claim to last done, the shards' own seconds
    summed, merge, merge's end to PASS (the job report)."""
    lines = [(datetime.fromisoformat(m[1]).timestamp(), m[2]) for m in map(STAMP.match, log.splitlines()) if m]
    if not lines:
        return "no stamped log lines"

    def at(start: str, last: bool = False) -> float:
        found = [t for t, msg in lines if msg.startswith(start)]
        return (found[-1] if last else found[0]) if found else float("nan")

    def took(start: str) -> float:
        return sum(float(m[1]) for _, msg in lines if msg.startswith(start) and (m := SECONDS.search(msg)))

    config = re.search(r"Loading configuration took ([0-9.]+) seconds", log)
    shards = [msg for _, msg in lines if msg.startswith("done ")]
    return (
        f"outside the log {wall - (lines[-1][0] - lines[0][0]):.0f}s, "
        f"config {float(config[1]) if config else float('nan'):.1f}s, prepare {took('prepared '):.1f}s, "
        f"to first claim {at('claimed ') - at('prepared '):.0f}s, shards {at('done ', True) - at('claimed '):.0f}s "
        f"(own {took('done '):.1f}s over {len(shards)}), merge {took('merged '):.1f}s, "
        f"to PASS {at('PASS') - at('merged '):.0f}s"
    )


# ``--count``: a sitecustomize on the s3 run's PYTHONPATH hooks the dj-process driver (where every store request
# is sent) with bench_s3_requests' counter, times each request by call site, and writes both at exit.
COUNT_HOOK = """
import sys
if sys.argv and sys.argv[0].endswith("dj-process"):
    import atexit, json, os, threading, time
    import botocore.session
    sys.path.insert(0, {bench!r})
    from bench_s3_requests import Counts, call_site, install
    counts, secs, local = Counts(), {{}}, threading.local()
    install(counts)
    made = botocore.session.Session.create_client
    def start(**_):
        local.t = time.perf_counter()
    def end(model, **_):
        key = model.name + " " + call_site()
        with counts.lock:
            secs[key] = secs.get(key, 0.0) + time.perf_counter() - local.t
    def create_client(self, *args, **kwargs):
        client = made(self, *args, **kwargs)
        client.meta.events.register("before-call.s3", start)
        client.meta.events.register("after-call.s3", end)
        return client
    botocore.session.Session.create_client = create_client
    def dump():
        with open(os.path.join({out!r}, f"counts-{{os.getpid()}}.json"), "w") as f:
            json.dump({{**counts.snapshot(), "secs": secs}}, f)
    atexit.register(dump)
"""


def count_env(rd: Path, name: str) -> dict[str, str]:
    """PYTHONPATH with the hook first; its counts land in ``rd/counts-NAME``."""
    hook = rd / f"counts-{name}"
    hook.mkdir()
    bench = str(Path(__file__).resolve().parent)
    (hook / "sitecustomize.py").write_text(COUNT_HOOK.format(bench=bench, out=str(hook)))
    path = [str(hook), str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in path if p)}


def print_counts(hook: Path, sites: int = 12) -> None:
    """Requests and their summed seconds by operation, then the call sites that took longest."""
    found = [json.loads(f.read_text()) for f in sorted(hook.glob("counts-*.json"))]
    if not found:
        print("  counts: none written (the driver did not exit through atexit)")
        return
    ops: dict[str, int] = {}
    secs: dict[str, float] = {}
    calls: dict[str, int] = {}
    for got in found:
        for op, n in got["ops"].items():
            ops[op] = ops.get(op, 0) + n
        for site, t in got["secs"].items():
            secs[site] = secs.get(site, 0.0) + t
        for site, n in got["sites"].items():
            calls[site] = calls.get(site, 0) + n
    by_op: dict[str, float] = {}
    for site, t in secs.items():
        by_op[site.split()[0]] = by_op.get(site.split()[0], 0.0) + t
    total = sum(ops.values())
    print(
        f"  requests {total}, {sum(secs.values()):.1f}s in calls: "
        + ", ".join(f"{op} {n} ({by_op.get(op, 0.0):.1f}s)" for op, n in sorted(ops.items(), key=lambda kv: -kv[1]))
    )
    for site, t in sorted(secs.items(), key=lambda kv: -kv[1])[:sites]:
        print(f"    {t:6.2f}s {calls.get(site, 0):5d}  {site}")


def report_round(r: int, first: str, got: dict, rows_out: int) -> None:
    """Each run's wall and child CPU seconds, then the ratio of each to the last (elastic/ray, server/local)."""
    times, cpus = got["times"], got["cpus"]
    base = list(times)[-1]
    runs = "  ".join(f"{name} {t[-1]:.1f}s (cpu {cpus[name][-1]:.1f}s)" for name, t in times.items())
    ratios = "  ".join(
        f"ratio {name}/{base} {t[-1] / times[base][-1]:.3f}" for name, t in times.items() if name != base
    )
    print(f"round {r} ({first} first): {runs}  {ratios}  rows out {rows_out}", flush=True)


def main() -> None:
    ap = b1_parser(__doc__)
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a fresh temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (job dirs, outputs, logs)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per dj-process run")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--parquet", action="store_true", help="both recipes read the rows as a folder of Parquet files")
    mode.add_argument("--s3", action="store_true", help="B1s: the elastic recipe on an S3 server vs on local disk")
    ap.add_argument(
        "--server",
        default="moto",
        help=f"with --s3: the servers, comma-separated, each run beside local disk in every round ({', '.join(KINDS)})",
    )
    ap.add_argument("--count", action="store_true", help="with --s3: count and time the s3 runs' requests (slower)")
    args = ap.parse_args()
    if args.count and not args.s3:
        ap.error("--count needs --s3")
    args.servers = [kind for kind in args.server.split(",") if kind] if args.s3 else []
    if args.s3 and (not args.servers or set(args.servers) - set(KINDS) or len(set(args.servers)) < len(args.servers)):
        ap.error(f"--server: one or more of {', '.join(KINDS)}, each once")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")

    work = args.dir or Path(tempfile.mkdtemp(prefix="dje-b1-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / ("parquet" if args.parquet else "data.jsonl")
    t0 = time.perf_counter()
    if args.parquet:
        generate_parquet(data, args.rows, args.shards)
    else:
        generate(data, args.rows)
    size = sum(p.stat().st_size for p in data.iterdir()) if data.is_dir() else data.stat().st_size
    print(f"generated {args.rows} rows ({size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f}s at {data}", flush=True)

    names = (*args.servers, "local") if args.s3 else ("elastic", "ray")
    got: dict = {"times": {n: [] for n in names}, "cpus": {n: [] for n in names}}
    try:
        (s3_rounds if args.s3 else b1_rounds)(args, work, data, got)
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    times, cpus, base = got["times"], got["cpus"], names[-1]
    wall = {n: statistics.median(times[n]) for n in names}
    cpu = {n: statistics.median(cpus[n]) for n in names}
    target = S3_TARGET if args.s3 else TARGET
    ratios = {n: wall[n] / wall[base] for n in names[:-1]}
    print("median wall: " + "  ".join(f"{n} {wall[n]:.1f}s" for n in names), end="")
    print("".join(f"  ratio {n}/{base} {q:.3f}" for n, q in ratios.items()) + f" (target <= {target})")
    print("median child cpu: " + "  ".join(f"{n} {cpu[n]:.1f}s" for n in names), end="")
    print("".join(f"  ratio {n}/{base} {cpu[n] / cpu[base]:.3f}" for n in names[:-1]))
    row_id = "B1s" if args.s3 else "B1 Parquet" if args.parquet else "B1"
    print(
        f"| {row_id} | {args.rows} rows, {args.shards} shards, np {args.np}, {args.rounds} rounds | "
        + " / ".join(f"{n} {wall[n]:.1f}s" for n in names)
        + " | "
        + ", ".join(f"{q:.2f}" for q in ratios.values())
        + f" | <= {target} |"
    )
    missed = [f"{n}/{base} {q:.3f}" for n, q in ratios.items() if q > target]
    if missed:
        sys.exit(f"{row_id} target missed: {', '.join(missed)} > {target}")


if __name__ == "__main__":
    main()
