"""Device check: elastic_shard vs plain ray with a real CUDA model op (warm actor pools).

    python3 tests/device/check.py --work DIR --out OUT [--rows 64000] [--shards 16] [--runs A,B,A2] [--cpu-test]

Started by tests/device/check.sh on the GPU machine (see tests/device/README.md). Generates ``--rows``
rows, then runs ``dj-process`` with the recipe [cuda_model_mapper (tests/device/cuda_model_ops.py,
``num_proc`` actors of ``num_gpus`` each), text_length_filter] three times: A with
``executor_type: elastic_shard`` (``--shards`` shards), B with plain ``executor_type: ray``, A2 like A.
Reports per run: wall time, nvidia-smi peaks, every model load (pid, GPU), output rows, the warm-pool
line and ``dj-elastic status``; then A and A2 against B row by row (same ids, equal fields, the score
within 1e-4) and the wall ratios A/B, A2/B.

Writes every result line to OUT/results.txt as it comes (and prints it), ending with a verdict line.
Exits 1 if a run failed, an elastic run (A, A2) loaded the model other than ``--num-proc`` times, or
an output differs from B's; the wall ratios are reported, not judged (one run each).
--cpu-test: no GPU here; the op runs on CPU in actor mode (no num_gpus), to test the logic.
Not a pytest module: pytest neither collects nor imports it.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _reference():
    """tests/reference.py (the offline environment, the row reader), loaded by path: the repository is not on
    sys.path here, so that the installed wheel is the code measured."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dje_tests_reference", HERE.parent / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REF = _reference()
RESULTS: Path


def say(*parts) -> None:
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    with open(RESULTS, "a") as f:
        f.write(line + "\n")


def exe(name: str) -> str:
    for cand in (Path(sys.executable).parent / name, shutil.which(name)):
        if cand and Path(cand).exists():
            return str(cand)
    raise SystemExit(f"{name} not found")


def generate(path: Path, rows: int) -> None:
    rnd = random.Random(0)
    words = ["".join(rnd.choice("etaoinshrdlucmfwypvbgkjqxz") for _ in range(rnd.randint(1, 10))) for _ in range(5000)]
    with open(path, "w") as f:
        for i in range(rows):
            n = rnd.choice([rnd.randint(1, 8), rnd.randint(5, 40), rnd.randint(20, 120)])
            text = " ".join(rnd.choice(words) for _ in range(n))
            if i % 97 == 0:
                text = "  Ünïcödé ✓ " + text + " 中文"
            f.write(json.dumps({"id": i, "text": text, "meta": {"src": f"s{i % 7}"}}, ensure_ascii=False) + "\n")


def recipe(kind: str, a, run: Path, data: Path) -> Path:
    import yaml

    op = {
        "loads_file": str(run / "loads.jsonl"),
        "d_model": a.d_model,
        "layers": a.layers,
        "max_bytes": a.max_bytes,
        "batch_size": a.batch_size,
        "num_proc": a.num_proc,
    }
    if a.cpu_test:
        op["ray_execution_mode"] = "actor"
    else:
        op["num_gpus"] = a.num_gpus
    r = {
        "project_name": f"gpu-check-{kind}",
        "dataset_path": str(data),
        "export_path": str(run / "out.jsonl"),
        "custom_operator_paths": [str(HERE / "cuda_model_ops.py")],
        "process": [{"cuda_model_mapper": op}, {"text_length_filter": {"min_len": 30, "max_len": 100000}}],
    }
    if kind.startswith("A"):
        r.update(executor_type="elastic_shard", elastic_shard={"job_dir": str(run / "job"), "num_shards": a.shards})
    else:
        r.update(executor_type="ray", ray_address="local")
    path = run / "recipe.yaml"
    path.write_text(yaml.safe_dump(r, sort_keys=False))
    return path


class GpuSampler(threading.Thread):
    """nvidia-smi every second: peak utilisation, peak memory, most compute processes seen at once."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.util = self.mem = self.procs = 0
        self.pids: set[str] = set()

    def run(self):
        while not self.stop.is_set():
            try:
                util, mem = _smi("--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits")[0].split(
                    ","
                )
                self.util, self.mem = max(self.util, int(util)), max(self.mem, int(mem))
                apps = _smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader")
                self.procs = max(self.procs, len(apps))
                self.pids.update(x.split(",")[0] for x in apps)
            except Exception:
                pass
            self.stop.wait(1.0)


def _smi(*query: str) -> list[str]:
    """nvidia-smi's answer to a query, one line per GPU or process."""
    return (
        subprocess.run(["nvidia-smi", *query], capture_output=True, text=True, timeout=10).stdout.strip().splitlines()
    )


def dj_process(kind: str, config: Path, run: Path, gpu: bool) -> float:
    env = REF.env_with(repo_on_path=False)
    sampler = GpuSampler() if gpu else None
    if sampler:
        sampler.start()
    t0 = time.perf_counter()
    with open(run / "log.txt", "w") as out:
        code = subprocess.run(
            [exe("dj-process"), "--config", str(config)], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    wall = time.perf_counter() - t0
    if sampler:
        sampler.stop.set()
        sampler.join(5)
    say(f"[{kind}] dj-process --config {config} -> exit {code.returncode}, wall {wall:.1f}s")
    if sampler:
        say(
            f"[{kind}] nvidia-smi during run: peak util {sampler.util}%, peak memory.used {sampler.mem} MiB, "
            f"most compute processes at once {sampler.procs}, pids seen {sorted(sampler.pids)}"
        )
    if code.returncode != 0:
        say(f"[{kind}] log tail:\n" + "".join((run / "log.txt").read_text().splitlines(True)[-60:]))
    return wall if code.returncode == 0 else float("nan")


def read_rows(path: Path) -> list[dict]:
    """The run's output (a file, or Ray's folder of part files); none if the run wrote nothing."""
    return REF.read_rows(path) if path.exists() else []


def loads(run: Path) -> list[dict]:
    f = run / "loads.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def compare(a_rows: list[dict], b_rows: list[dict], score_key: str, tag: str) -> bool:
    """Row-by-row comparison by id; True when the ids match, the other fields are equal and the scores within 1e-4."""
    ids_a = [r["id"] for r in a_rows]
    say(f"[{tag}] rows: A {len(a_rows)}, B {len(b_rows)}; A in input order: {ids_a == sorted(ids_a)}")
    A = {r["id"]: r for r in a_rows}
    B = {r["id"]: r for r in b_rows}
    say(f"[{tag}] same id set: {set(A) == set(B)} (only A {len(set(A) - set(B))}, only B {len(set(B) - set(A))})")
    other_diff, max_diff, exact, round3 = [], 0.0, 0, 0
    for i in sorted(set(A) & set(B)):
        ra, rb = dict(A[i]), dict(B[i])
        sa, sb = ra.pop(score_key, None), rb.pop(score_key, None)
        keys = set(ra) | set(rb)
        if any(ra.get(k) != rb.get(k) for k in keys):
            other_diff.append(i)
        if isinstance(sa, float) and isinstance(sb, float):
            d = abs(sa - sb)
            max_diff = max(max_diff, d)
            exact += sa == sb
            round3 += round(sa, 3) == round(sb, 3)
        else:
            other_diff.append(i)
    n = len(set(A) & set(B))
    equal = bool(a_rows) and set(A) == set(B) and not other_diff and max_diff <= 1e-4
    say(
        f"[{tag}] fields other than {score_key} equal in {n - len(other_diff)}/{n} rows"
        + (f" (first differing ids {other_diff[:5]}: A={A[other_diff[0]]} B={B[other_diff[0]]})" if other_diff else "")
    )
    say(
        f"[{tag}] {score_key}: bit-identical in {exact}/{n}, equal after round(,3) in {round3}/{n}, "
        f"max |A-B| {max_diff:.3g} -> {'EQUAL within 1e-4' if equal else 'DIFFERENT'}"
    )
    if a_rows:
        s = [r[score_key] for r in a_rows]
        say(f"[{tag}] score range {min(s):.4f}..{max(s):.4f}, first rows {[round(x, 4) for x in s[:4]]}")
    return equal


def main() -> int:
    global RESULTS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rows", type=int, default=64000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--runs", default="A,B,A2")
    p.add_argument("--num-gpus", type=float, default=0.25)
    p.add_argument("--num-proc", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--max-bytes", type=int, default=128)
    p.add_argument("--cpu-test", action="store_true")
    p.add_argument("--deadline", type=float, default=0, help="skip a run that would start after this many seconds")
    a = p.parse_args()
    start = time.monotonic()
    work, out = Path(a.work), Path(a.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    RESULTS = out / "results.txt"
    say(f"check.py args {vars(a)}")
    import data_juicer
    import ray
    import torch

    import data_juicer_elastic

    say(
        f"versions: python {sys.version.split()[0]}, torch {torch.__version__} (cuda {torch.version.cuda}, "
        f"available {torch.cuda.is_available()}), ray {ray.__version__}, data_juicer {data_juicer.__version__}, "
        f"data_juicer_elastic {data_juicer_elastic.__version__} at {data_juicer_elastic.__file__}"
    )
    data = work / "input.jsonl"
    t0 = time.perf_counter()
    generate(data, a.rows)
    say(f"input: {a.rows} rows, {data.stat().st_size / 1e6:.1f} MB, generated in {time.perf_counter() - t0:.1f}s")
    walls: dict[str, float] = {}
    problems: list[str] = []
    for kind in a.runs.split(","):
        if a.deadline and time.monotonic() - start > a.deadline:
            say(f"[{kind}] skipped: past the deadline of {a.deadline}s")
            continue
        run = work / kind
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir()
        config = recipe(kind, a, run, data)
        say(f"[{kind}] recipe:\n" + config.read_text())
        walls[kind] = dj_process(kind, config, run, gpu=not a.cpu_test)
        got = loads(run)
        say(f"[{kind}] model loads: {len(got)} in {len({x['pid'] for x in got})} pid(s)")
        if walls[kind] != walls[kind]:
            problems.append(f"{kind}: dj-process failed")
        elif kind.startswith("A") and len(got) != a.num_proc:
            problems.append(f"{kind}: {len(got)} model loads, expected num_proc = {a.num_proc}")
        for x in got:
            say(f"[{kind}]   load {json.dumps(x)}")
        rows = read_rows(run / "out.jsonl")
        say(f"[{kind}] output rows {len(rows)} ({'file' if (run / 'out.jsonl').is_file() else 'folder'})")
        if kind.startswith("A"):
            job = run / "job"
            hits = subprocess.run(["grep", "-rh", "warm actor", str(job)], capture_output=True, text=True).stdout
            say(f"[{kind}] warm-pool lines under job_dir ({len(hits.splitlines())}):")
            for line in sorted(set(hits.splitlines()))[:10]:
                say(f"[{kind}]   {line.strip()[:400]}")
            st = subprocess.run(
                [exe("dj-elastic"), "status", "--job-dir", str(job)],
                capture_output=True,
                text=True,
                env=REF.env_with(repo_on_path=False),
            )
            say(f"[{kind}] dj-elastic status --job-dir {job} -> exit {st.returncode}:\n{st.stdout}{st.stderr}")
            tail = [x for x in (run / "log.txt").read_text().splitlines() if "PASS" in x or "prepared" in x]
            for line in tail:
                say(f"[{kind}]   console: {line.strip()[:400]}")
        # compare with the other side as soon as both exist
        for ka, kb in (("A", "B"), ("A2", "B")):
            if kind in (ka, kb) and ka in walls and kb in walls:
                a_rows, b_rows = read_rows(work / ka / "out.jsonl"), read_rows(work / kb / "out.jsonl")
                if not compare(a_rows, b_rows, "cuda_score", f"{ka} vs {kb}"):
                    problems.append(f"{ka} vs {kb}: outputs differ")
                if walls[kb] == walls[kb] and walls[ka] == walls[ka]:
                    ratio = walls[ka] / walls[kb]
                    say(f"[{ka} vs {kb}] wall {walls[ka]:.1f}s vs {walls[kb]:.1f}s, ratio {ka}/{kb} = {ratio:.3f}")
    say(f"walls: {json.dumps({k: round(v, 2) for k, v in walls.items()})}")
    # the wall ratios are reported, not judged: one run each on a shared machine
    say("verdict: " + (f"FAIL ({'; '.join(problems)})" if problems else "PASS (loads = num_proc, outputs equal)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
