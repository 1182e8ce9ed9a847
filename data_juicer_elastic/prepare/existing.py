"""Prepare against an existing job dir: reuse its shards (and start the recipe's generation), or refuse.

The shards depend on the input, the shard count and the row rules; a request
that keeps those reuses them whatever its recipe and run-time policy. The
input check is a stat; an input whose size is the same but whose mtime moved
(a copy, a restore) is re-hashed against the range digests prepare recorded.
An s3:// object is checked by its size and ETag (its listing or a HEAD).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Manifest
from data_juicer_elastic.prepare.generation import ensure_generation, same_content
from data_juicer_elastic.prepare.inputs import Dataset, InputSpec, dataset_root, discover
from data_juicer_elastic.prepare.request import PrepareRequest
from data_juicer_elastic.storage.store import store_for
from data_juicer_elastic.storage.urls import is_s3


def confirm_existing(job: JobDir, req: PrepareRequest, recipe_sha: str, log: Callable[[str], Any]) -> Manifest:
    """The manifest (of the request's generation) when the shards can be reused; UserError naming what differs."""
    m = job.manifest() if job.legacy() else job._raw_manifest()
    dataset = discover(req.dataset_path, exclude=(str(job.root),))
    diffs = differences(m, req, dataset)
    if job.legacy():
        diffs += _legacy_differences(m, req, recipe_sha)
    if diffs:
        listing = "\n  - ".join(diffs)
        raise UserError(
            f"{job.root}: its shards were prepared from a different input, shard count or row rules:\n  - {listing}\n"
            "the shards depend on these (a recipe or policy change alone reuses them); use a new job dir "
            "for this request, or restore what changed"
        )
    new = False
    if not job.legacy():
        generation, new = ensure_generation(job, req.recipe_text, recipe_sha, req.policy, log)
        m = generation.manifest()
    log(
        f"{job.root}: already prepared from this input ({m.total_rows:,} rows, {len(m.shards)} shards); "
        + ("the shards are reused" if new else "nothing to do")
    )
    return m


_SHARD_FILE = re.compile(r"^part-\d+-of-(\d+)\.jsonl$")


def prepared_shard_count(job_dir: str) -> int | None:
    """The shard count a published prepare chose (None: not prepared), without walking the input.

    ``num_shards: auto`` is a function of the input's size; a process that follows the
    prepare coordinator takes the count it published instead of sizing the input again.
    Every shard's name carries the count, so one directory entry tells it (the manifest
    check that follows compares the request with the manifest in full). An object store
    lists no "first entry" cheaply, so there the manifest's policy tells it (one GET).
    """
    if is_s3(job_dir):
        got = store_for(job_dir).read("manifest.json")
        return None if got is None else int(orjson.loads(got[0])["policy"]["num_shards"])
    if not os.path.exists(os.path.join(job_dir, "manifest.json")):
        return None
    try:
        with os.scandir(os.path.join(job_dir, "shards")) as entries:
            for entry in entries:
                m = _SHARD_FILE.match(entry.name)
                if m:
                    return int(m.group(1))
    except FileNotFoundError:
        return None
    return None


def _legacy_differences(m: Manifest, req: PrepareRequest, recipe_sha: str) -> list[str]:
    """A schema-3 job dir has no generations: its recipe and policy cannot change."""
    why = "(this job dir was prepared by an older data-juicer-elastic, schema 3, which keeps one recipe per job dir)"
    diffs = []
    if m.recipe_sha256 != recipe_sha:
        diffs.append(f"recipe: sha256 {m.recipe_sha256[:12]}… in job dir, {recipe_sha[:12]}… requested {why}")
    old_policy, new_policy = dataclasses.asdict(m.policy), dataclasses.asdict(req.policy)
    diffs += [
        f"{k}: {old_policy[k]!r} in job dir, {new_policy[k]!r} requested {why}"
        for k in old_policy
        if k != "num_shards" and old_policy[k] != new_policy[k]
    ]
    return diffs


def differences(m: Manifest, req: PrepareRequest, dataset: Dataset | None) -> list[str]:
    """What the shards depend on that differs between a manifest and a request.

    Inputs are compared by stat; one whose size is the same but whose mtime
    or inode moved is re-hashed against its range digests. ``dataset`` None
    skips the inputs (a process that follows a prepare coordinator).
    """
    diffs = []
    if m.dataset_path != dataset_root(req.dataset_path):
        diffs.append(f"dataset_path: {m.dataset_path} in job dir, {dataset_root(req.dataset_path)} requested")
    if m.policy.num_shards != req.policy.num_shards:
        diffs.append(f"num_shards: {m.policy.num_shards} in job dir, {req.policy.num_shards} requested")
    for key in ("media_keys", "index_keys"):
        if tuple(getattr(m, key)) != tuple(getattr(req, key)):
            diffs.append(f"{key}: {list(getattr(m, key))} in job dir, {list(getattr(req, key))} requested")
    if dataset is not None:
        diffs.extend(_file_differences(m, dataset.inputs))
    return diffs


def _file_differences(m: Manifest, new: Iterable[InputSpec]) -> list[str]:
    before = {f.path: f for f in m.files}
    now = {s.rel: s for s in new}
    out = [f"input {p}: gone since prepare" for p in before if p not in now]
    out += [f"input {p}: new since prepare" for p in now if p not in before]
    for p in sorted(before.keys() & now.keys()):
        (s0, t0, etag0), spec = (before[p].size, before[p].mtime_ns, before[p].etag), now[p]
        if s0 != spec.seen.size:
            out.append(f"input {p}: changed since prepare (size {s0} -> {spec.seen.size})")
        elif etag0 != spec.seen.etag:
            out.append(f"input {p}: changed since prepare (ETag {etag0} -> {spec.seen.etag})")
        elif t0 != spec.seen.mtime_ns and not same_content(
            spec, [src for s in m.shards for src in s.sources if src.file == p]
        ):
            out.append(
                f"input {p}: changed since prepare (same size, but its content no longer hashes to "
                "the digests recorded at prepare)"
            )
    return sorted(out)[:10] + ([f"... and {len(out) - 10} more input changes"] if len(out) > 10 else [])
