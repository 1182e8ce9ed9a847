"""A synthetic job dir for the view benchmarks: a sealed manifest of one-row shards and an empty generation.

Built directly (no prepare, no worker) so that 100,000 shards take seconds; ``bench_views`` and
``bench_status`` add the records a run would have left.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path

from data_juicer_elastic.job.layout import JobDir, generation_id, shard_id
from data_juicer_elastic.job.manifest import InputFile, Manifest, Policy, ShardSource, ShardSpec, ShardTable
from data_juicer_elastic.storage.files import dumps_json

RECIPE = b"process:\n  - text_length_filter: {min_len: 1}\n"
ROW = b'{"text":"x"}\n'  # every shard's one row
ROW_SHA = hashlib.sha256(ROW).hexdigest()


def synthetic_job(root: Path, n: int) -> tuple[JobDir, tuple[ShardSpec, ...]]:
    """``root`` made into a prepared job of ``n`` one-row shards with its generation's folders (no records)."""
    row, sha = ROW, ROW_SHA
    shards = tuple(
        ShardSpec(
            shard_id(i, n),
            f"shards/{shard_id(i, n)}.jsonl",
            1,
            len(row),
            sha,
            i,
            (ShardSource("data.jsonl", i * 13, i * 13 + 13, i + 1, sha),),
        )
        for i in range(n)
    )
    recipe_sha = hashlib.sha256(RECIPE).hexdigest()
    policy = Policy(num_shards=n, lock_timeout_secs=600.0)
    manifest = Manifest(
        dataset_path="/data/in.jsonl",
        input_kind="file",
        files=(InputFile("data.jsonl", n * 13, 0, n),),
        recipe_sha256=recipe_sha,
        versions={"data_juicer": "1.6.1", "data_juicer_elastic": "0.1.0"},
        policy=policy,
        media_keys=(),
        index_keys=(),
        shards=ShardTable.of(shards),
        total_rows=n,
        total_bytes=n * 13,
        created_at=time.time(),
    ).seal()
    root.mkdir(parents=True)
    (root / "shards").mkdir()
    manifest.write(root)
    gen = generation_id(recipe_sha)
    gdir = root / "generations" / gen
    for sub in ("attempts", "finalize", *(f"state/{s}" for s in JobDir.STATE_SUBDIRS)):
        (gdir / sub).mkdir(parents=True)
    (gdir / "recipe.yaml").write_bytes(RECIPE)
    (gdir / "policy.json").write_bytes(dumps_json(dataclasses.asdict(policy)))
    (gdir / "generation.json").write_bytes(
        dumps_json({"generation": gen, "recipe_sha256": recipe_sha, "created_at": 0})
    )
    (root / "current.json").write_bytes(dumps_json({"generation": gen, "at": 0}))
    job = JobDir(root)
    return job, shards
