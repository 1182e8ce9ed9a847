"""A dedup recipe end to end (docs/DEDUP.md): two ``dj-process`` nodes run whitespace normalisation, an exact
dedup, a length filter and a MinHash dedup over a planted corpus (exact, case-only, near and chained copies spread
over every shard), and the merged export equals Data-Juicer's default executor (np 1) on the whole input, row for
row, in input order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.nodes import RUN_ID, Node, start_node
from tests.reference import DJ_PROCESS, dj_process, meanwhile, read_rows, write_jsonl
from tests.test_dedup_core import MINHASH, planted_corpus

pytestmark = pytest.mark.slow

SHARDS = 4
PROCESS = [
    {"whitespace_normalization_mapper": None},
    {"document_deduplicator": {"lowercase": True, "ignore_non_character": False}},
    {"text_length_filter": {"min_len": 40}},
    MINHASH,
]
INTERNAL = ("__dj__stats__",)  # the default executor moves stats to a side file (DESIGN.md invariant 6)


def corpus() -> list[dict]:
    """The core test's planted corpus, with ids; every third row's spaces partly replaced by other whitespace
    (no-break, ideographic) that the first op normalises, and a copy of every seventh row with those spaces
    inserted right after it: exact copies only once normalised."""
    rows, _ = planted_corpus()
    odd = ["\u00a0", "\u3000", "\u2003"]
    out: list[dict] = []
    for i, row in enumerate(rows):
        text = row["text"]
        if i % 3 == 0:
            text = text.replace(" ", odd[i % len(odd)], 2)
        out.append({"id": len(out), "text": text})
        if i % 7 == 0:
            out.append({"id": len(out), "text": row["text"].replace(" ", odd[(i + 1) % len(odd)], 3)})
    return out


def recipe(tmp: Path, dataset: Path, **extra: object) -> dict:
    return {
        "project_name": "dedup-job",
        "dataset_path": str(dataset),
        "np": 1,
        "process": PROCESS,
        **extra,
    }


def reference(tmp: Path, dataset: Path) -> list[dict]:
    """Data-Juicer's default executor on the whole input, this package switched off."""
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "reference.yaml"
    export = tmp / "ref" / "reference.jsonl"
    config.write_text(yaml.safe_dump(recipe(tmp, dataset, export_path=str(export)), sort_keys=False))
    out = dj_process("--config", str(config), cwd=tmp, env={"DJ_ELASTIC_DISABLE": "1"})
    assert out.returncode == 0, out.stderr[-5000:]
    return read_rows(export)


def elastic_config(tmp: Path, dataset: Path) -> Path:
    settings = {
        "job_dir": str(tmp / "job"),
        "num_shards": SHARDS,
        "max_retries": 2,
        "heartbeat_secs": 0.5,
        "lock_timeout_secs": 6.0,
        "poll_interval_secs": 0.2,
        "wait_timeout_secs": 600.0,
    }
    export = tmp / "out" / "merged.jsonl"
    body = recipe(tmp, dataset, export_path=str(export), executor_type="elastic_shard", elastic_shard=settings)
    config = tmp / "recipe.yaml"
    config.write_text(yaml.safe_dump(body, sort_keys=False))
    return config


def start(tmp: Path, config: Path, host: str, n: int, **env: str) -> Node:
    log = tmp / f"node-{n}-{host}.log"
    return start_node([DJ_PROCESS, "--config", str(config)], host, log, cwd=tmp, DJ_ELASTIC_RUN_ID=RUN_ID, **env)


def comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in INTERNAL} for r in rows]


def check(tmp: Path, rows: list[dict], want: list[dict]) -> None:
    got = comparable(read_rows(tmp / "out" / "merged.jsonl"))
    want = comparable(want)
    assert len(rows) > len(want) > 0
    assert [r["id"] for r in got] == [r["id"] for r in want]
    assert got == want


@pytest.fixture
def job(tmp_path: Path) -> tuple[Path, list[dict], Path]:
    rows = corpus()
    dataset = tmp_path / "data" / "corpus.jsonl"
    write_jsonl(dataset, rows)
    return dataset, rows, elastic_config(tmp_path, dataset)


def test_two_nodes_equal_the_default_executor(tmp_path, job):
    dataset, rows, config = job
    with meanwhile(lambda: reference(tmp_path / "reference", dataset)) as ref:
        nodes = [start(tmp_path, config, host, n) for n, host in enumerate(["node-a", "node-b"])]
        try:
            for node in nodes:
                assert node.wait(600) == 0, node.tail()
        finally:
            for node in nodes:
                node.kill()
    want = ref.result()
    check(tmp_path, rows, want)
    stage_done = tmp_path / "job" / "generations"
    hosts = {json.loads(p.read_bytes())["host"] for p in stage_done.glob("*/state/stage-done/*.json")}
    assert hosts, "no dedup stage unit was published"
    words = check_status(tmp_path / "job", len(rows), len(want))
    for node in nodes:
        assert words in node.result(), node.result()


def check_status(job: Path, rows: int, kept: int) -> str:
    """``dj-elastic status --json`` on the finished job: every stage of both dedups done; MinHash removed what
    its hash units' rows (after the filter) less the rows kept (the default executor's) say; the two dedups
    and the filter removed every row not kept. The PASS line's dedup words."""
    out = subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", "status", "--job-dir", str(job), "--json"],
        capture_output=True,
    )
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    exact, minhash = json.loads(out.stdout)["dedup"]
    assert (exact["op"], minhash["op"]) == ("document_deduplicator", "document_minhash_deduplicator")
    for d in (exact, minhash):
        assert d["failed"] == [] and d["stages"] == {"hash": [4, 4], "bucket": [4, 4], "join": [1, 1]}, d
    hashed = sum(json.loads(p.read_bytes())["rows"] for p in job.glob("generations/*/state/stage-done/d1-hash-*"))
    assert minhash["removed"] == hashed - kept > 0
    assert 0 < exact["removed"] <= rows - hashed
    return f"dedup: d0 exact removed {exact['removed']} rows, d1 minhash removed {minhash['removed']} rows"
